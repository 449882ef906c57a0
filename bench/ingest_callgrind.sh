#!/usr/bin/env bash
# Instructions per event of durable HTTP ingest (issue 13, target 1), counted by valgrind's callgrind, which
# repeats exactly whatever else the machine does.
#
#   bench/ingest_callgrind.sh [BIN_DIR]     (default target/release: rankgate, gen-workload, http-ingest)
#
# The workload is issue13.sh's: the seed lesson (3% of events up to an hour late) with every 20th event
# sent again ~1,000 events later. `rankgate serve` runs under callgrind with instrumentation off; the first
# $WARMUP events are ingested uncounted (products and hours appear, statements get prepared), then the
# next $EVENTS are counted, one connection, 2,000-event JSON batches. Prints the total instructions per
# event and the inclusive share of each stage (a function's cost including what it calls; indented stages
# are inside the one above): parse + validation (on the blocking pool), the writer thread (dedupe,
# lateness, coalescing, the SQLite commit, the engine apply of every cached span) and the rest (hyper,
# body read, response, task wake-ups).
# Environment: EVENTS (40000), WARMUP (20000), PORT (18131), KEEP (set: keep the work dir and profile).
set -euo pipefail
BIN=$(readlink -f "${1:-target/release}")
EVENTS=${EVENTS:-40000}
WARMUP=${WARMUP:-20000}
PORT=${PORT:-18131}
for tool in valgrind callgrind_control callgrind_annotate curl; do
  command -v "$tool" >/dev/null || { echo "ingest_callgrind: $tool is not installed" >&2; exit 2; }
done
WORK=$(mktemp -d)
SERVER=""
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  if [ -n "${KEEP:-}" ]; then echo "# work dir kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
BASE="http://127.0.0.1:$PORT"

"$BIN/gen-workload" seed-lesson --out "$WORK/seed.ndjson" >/dev/null 2>&1
awk '{ print; if (NR % 20 == 0) held[NR] = $0; if ((NR - 1000) in held) { print held[NR - 1000]; delete held[NR - 1000] } }' \
  "$WORK/seed.ndjson" >"$WORK/mixed.ndjson"
awk -v w="$WARMUP" -v n="$EVENTS" -v warm="$WORK/warmup.ndjson" -v counted="$WORK/counted.ndjson" \
  'NR <= w { print > warm; next } NR <= w + n { print > counted }' "$WORK/mixed.ndjson"

valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$WORK/callgrind.out" \
  "$BIN/rankgate" serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" >"$WORK/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 1200); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/readyz" || true)" = 200 ] && break
  sleep 0.1
done
"$BIN/http-ingest" "$WORK/warmup.ndjson" --url "$BASE" --connections 1 --batch 2000 --max-secs 600 >/dev/null
callgrind_control -i on "$SERVER" >/dev/null
line=$("$BIN/http-ingest" "$WORK/counted.ndjson" --url "$BASE" --connections 1 --batch 2000 --max-secs 1200)
callgrind_control -i off "$SERVER" >/dev/null
kill "$SERVER"
wait "$SERVER" 2>/dev/null || true
SERVER=""
echo "# $line"

callgrind_annotate --inclusive=yes "$WORK/callgrind.out" >"$WORK/inclusive.txt" 2>/dev/null
total=$(awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }' "$WORK/inclusive.txt")
echo "total: $total instructions = $(awk -v t="$total" -v n="$EVENTS" 'BEGIN { printf "%.0f", t / n }') per event ($EVENTS events)"
# stage PATTERN NAME: the largest inclusive count among functions matching PATTERN, per event.
stage() {
  awk -v pat="$1" -v name="$2" -v n="$EVENTS" -v t="$total" '
    $0 ~ pat { v = $1; gsub(",", "", v); if (v + 0 > best) best = v + 0 }
    END { printf "  %-44s %8.0f per event (%4.1f%%)\n", name, best / n, (t > 0 ? best * 100 / t : 0) }' \
    "$WORK/inclusive.txt"
}
stage 'rankgate::routes::events::parse_batch' "parse + validate (blocking pool)"
stage 'rankgate_core::event::split_body_at_most' "  split + serde_json::Value per event"
stage 'rankgate_core::event::parse_body_at_most' "  split + typed parse (plain events)"
stage 'rankgate_core::event::RawItem::to_event' "  validation of Values (Value -> Event)"
stage 'rankgate::rankings::writer::run_writer' "writer thread (the rest of the ingest)"
stage 'rankgate_store::ranking::ingest::Ingestor::ingest' "  Ingestor::ingest: dedupe, lateness, coalescing"
stage 'SqliteSource as rankgate_store::ranking::source::SourceOfTruth>::commit' "    SQLite commit (one transaction)"
# Since the engine became a folder, `apply` is `engine::hours::<impl …::engine::RankingEngine>::apply`; the
# pattern matches that and the older `engine::RankingEngine::apply`, not `apply_absolute`.
stage 'rankgate_store::ranking::engine::RankingEngine>?::apply( |$)' "    engine apply (every cached span)"
stage 'rankgate_core::event::Event::write_json' "    raw-log body per event"
parse=$(awk '/rankgate::routes::events::parse_batch/ { v = $1; gsub(",", "", v); if (v + 0 > b) b = v + 0 } END { print b + 0 }' "$WORK/inclusive.txt")
writer=$(awk '/rankgate::rankings::writer::run_writer/ { v = $1; gsub(",", "", v); if (v + 0 > b) b = v + 0 } END { print b + 0 }' "$WORK/inclusive.txt")
awk -v t="$total" -v p="$parse" -v w="$writer" -v n="$EVENTS" 'BEGIN {
  printf "  %-44s %8.0f per event (%4.1f%%)\n", "HTTP: hyper, body read, response, wake-ups", (t - p - w) / n, (t - p - w) * 100 / t }'
echo "# top functions by inclusive count:"
sed -n '/^Ir/,$p' "$WORK/inclusive.txt" | sed -n '3,40p'
