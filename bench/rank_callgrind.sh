#!/usr/bin/env bash
# Instructions per rank read (GET /v1/products/{productId}/rank?category=all&window=7d: the fast lane and a
# warm span of the embedded engine) or per top-50 page (GET /v1/categories/all/top?window=7d&limit=50:
# hyper, the router and the response cache), counted by valgrind's callgrind, which repeats exactly
# whatever else the machine does (issue 26: the reshape must keep each within 2% of main's count).
#
#   bench/rank_callgrind.sh [BIN_DIR]            (default target/release: rankgate, gen-workload, http-ingest): rank reads
#   WHAT=top bench/rank_callgrind.sh [BIN_DIR]   top-50 pages
#
# The workload is the seed lesson (seed 42: 892,000 events with 200,000 sales over 14 days, 20,000 products),
# generated to end at 2026-01-01T00:00Z, then moved by whole hours to end at the start of the current UTC
# hour, so that the 7d window holds the same events at the same offsets in every run. `rankgate serve` runs under callgrind with
# instrumentation off on a fresh data dir; the events are ingested over HTTP uncounted (http-ingest, one
# connection, 2,000-event batches) and one read builds the span. Then wrk (bench/rank-cycle.lua, -t1 -c10)
# reads $WARMUP times uncounted and $COUNT times counted, products p0, p1, … in order each time (WHAT=top:
# the same page every time, from the response cache after the first). Prints instructions per read (the
# total over wrk's answers; the up to 9 requests in flight when wrk stops are answered uncounted, so it reads
# at most 9/COUNT high) and the inclusive share of a few stages (a stage the compiler inlined away prints
# 0). Fails if the UTC hour turns during the run (the window moves and its span is built again): run again.
# Environment: WHAT (rank), COUNT (20000), WARMUP (2000), PORT (18190), KEEP (keep the profile).
set -euo pipefail
BIN=$(readlink -f "${1:-target/release}")
HERE=$(cd "$(dirname "$0")" && pwd)
WHAT=${WHAT:-rank}
case "$WHAT" in rank | top) ;; *) echo "rank_callgrind: WHAT is rank or top" >&2; exit 2 ;; esac
COUNT=${COUNT:-20000}
WARMUP=${WARMUP:-2000}
PORT=${PORT:-18190}
for tool in valgrind callgrind_control callgrind_annotate wrk curl; do
  command -v "$tool" >/dev/null || { echo "rank_callgrind: $tool is not installed" >&2; exit 2; }
done
WORK=$(mktemp -d)
SERVER=""
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  if [ -n "${KEEP:-}" ]; then echo "# work dir kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
BASE="http://127.0.0.1:$PORT"
export PRODUCTS=20000 RANK_QUERY="category=all&window=7d"
if [ "$WHAT" = top ]; then export READ_PATH="/v1/categories/all/top?window=7d&limit=50"; fi

# The workload, moved to end at the start of this hour (ts is epoch milliseconds; awk's doubles hold it exactly).
HOUR=$(($(date -u +%s) / 3600))
"$BIN/gen-workload" seed-lesson --out "$WORK/fixed.ndjson" --end-millis 1767225600000 >/dev/null 2>&1
awk -v shift=$((HOUR * 3600000 - 1767225600000)) '
  match($0, /"ts":[0-9]+/) {
    $0 = substr($0, 1, RSTART + 4) sprintf("%.0f", substr($0, RSTART + 5, RLENGTH - 5) + shift) substr($0, RSTART + RLENGTH)
  }
  { print }' "$WORK/fixed.ndjson" >"$WORK/seed.ndjson"

valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$WORK/callgrind.out" \
  "$BIN/rankgate" serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" >"$WORK/serve.log" 2>&1 &
SERVER=$!
until curl -fs "$BASE/readyz" >/dev/null 2>&1; do
  kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/serve.log" >&2; exit 1; }
  sleep 0.2
done
line=$("$BIN/http-ingest" "$WORK/seed.ndjson" --url "$BASE" --connections 1 --batch 2000 --max-secs 1800)
first=${READ_PATH:-/v1/products/p0/rank?$RANK_QUERY}
curl -fs --max-time 600 "$BASE$first" >"$WORK/first.json"
STOP=$WARMUP wrk -t1 -c10 -d600s --timeout 60s -s "$HERE/rank-cycle.lua" "$BASE" >/dev/null
callgrind_control -i on "$SERVER" >/dev/null 2>&1
out=$(STOP=$COUNT wrk -t1 -c10 -d1800s --timeout 60s -s "$HERE/rank-cycle.lua" "$BASE")
callgrind_control -i off "$SERVER" >/dev/null 2>&1
if [ "$(($(date -u +%s) / 3600))" != "$HOUR" ]; then
  echo "rank_callgrind: the UTC hour turned during the run, so the 7d window moved; run it again" >&2
  exit 3
fi
grep -qE "Non-2xx|Socket errors" <<<"$out" && { echo "rank_callgrind: wrk saw errors" >&2; echo "$out" >&2; exit 1; }
reads=$(awk '/requests in/ {print $1}' <<<"$out")
[ "$reads" -ge "$COUNT" ] || { echo "rank_callgrind: wrk stopped after $reads of $COUNT reads" >&2; exit 1; }
kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=""
callgrind_annotate --inclusive=yes "$WORK/callgrind.out" >"$WORK/inclusive.txt" 2>/dev/null
total=$(awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }' "$WORK/inclusive.txt")
echo "# ingest: $line"
echo "# $(sed -E 's/.*"total":([0-9]+).*/ranking all\/7d: \1 products/' "$WORK/first.json")"
echo "total: $total instructions = $((total / reads)) per $WHAT read ($reads reads)"
# stage NAME PATTERN: the largest inclusive count among the functions matching PATTERN (an inlined
# function is listed once per source file it was inlined from; the largest is the whole), per read.
stage() {
  awk -v name="$1" -v pat="$2" -v n="$reads" -v t="$total" '
    /Auto-annotated source/ { exit }
    $0 ~ pat { v = $1; gsub(",", "", v); if (v + 0 > best) best = v + 0 }
    END { printf "  %-46s %7.0f per read (%4.1f%%)\n", name, best / n, (t > 0 ? best * 100 / t : 0) }' \
    "$WORK/inclusive.txt"
}
if [ "$WHAT" = rank ]; then
  stage "connection task (the fast path)" "rankgate::(http::)?edge::spawn_connection::"
  stage "  head parsing (httparse)" "rankgate::(fast_lane|http::fast_path)::parse_head"
  stage "  the read (rank_reply)" "rankgate::(routes::rankings|rankings::routes::reads)::rank_reply"
  stage "    query parsing (window, category)" "rankgate::(routes::rankings|rankings::routes::reads)::parse_query"
  stage "    engine lookup (EngineServing::rank_with)" "EngineServing::rank_with"
  stage "    JSON body (rank_body)" "RankingsReader::rank_body"
  stage "    entity tag (Served::of)" "rankgate::rankings::reader::Served::of"
  stage "  answer bytes (write_reply)" "rankgate::(fast_lane|http::fast_path)::write_reply"
else
  stage "HTTP: hyper connection task" "hyper::server::conn::http1::Connection<I,S> as core::future::future::Future>::poll"
  stage "  head parsing (hyper)" "hyper::proto::h1::conn::Conn<I,B,T>::poll_read_head"
  stage "  router (axum Router::call_with_state)" "axum::routing::Router<S>::call_with_state"
  stage "  query parsing (window, limit)" "rankgate::(routes::rankings|rankings::routes::reads)::parse_query"
  stage "  top page (RankingsReader::top_served)" "RankingsReader::top_served"
  stage "    response cache lookup" "rankgate::rankings::reader::ResponseCache::get"
  stage "  answer head (hyper write_head)" "hyper::proto::h1::conn::Conn<I,B,T>::write_head"
fi
stage "runtime parking, epoll, wake-ups" "tokio::runtime::scheduler::multi_thread::worker::Context::park_internal"
