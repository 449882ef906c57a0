#!/usr/bin/env bash
# Instructions per waiting-room entry (POST /v1/queues/bench/entries, durable, embedded store) or per
# position poll (GET /v1/queues/bench/entries/{member}), counted by valgrind's callgrind, which repeats
# exactly whatever else the machine does (issue 13, target 3).
#
#   bench/queue_callgrind.sh [BIN_DIR]                 (default target/release): entries
#   WHAT=position bench/queue_callgrind.sh [BIN_DIR]   position polls
#
# `rankgate serve` runs under callgrind with instrumentation off; wrk (bench/queue-enter.lua, distinct
# members, -c 10) enters for 3 s uncounted, then for $SECS s counted. With WHAT=position the second
# entry run is uncounted too (keeping each member's ticket), and wrk (bench/queue-position.lua, -c 10,
# each poll with its member's ticket) then polls the members of the
# second run, each once, for $SECS / 2 s counted (shorter than the entries took, so no poll finds an
# unknown member). Prints instructions per unit and the inclusive share of a few stages (a stage the
# compiler inlined away prints 0). Environment: WHAT (entry), SECS (10), PORT (18170), KEEP (keep the
# profile).
set -euo pipefail
BIN=$(readlink -f "${1:-target/release}")
HERE=$(cd "$(dirname "$0")" && pwd)
SECS=${SECS:-10}
WHAT=${WHAT:-entry}
case "$WHAT" in entry | position) ;; *) echo "queue_callgrind: WHAT is entry or position" >&2; exit 2 ;; esac
PORT=${PORT:-18170}
for tool in valgrind callgrind_control callgrind_annotate wrk curl; do
  command -v "$tool" >/dev/null || { echo "queue_callgrind: $tool is not installed" >&2; exit 2; }
done
WORK=$(mktemp -d)
SERVER=""
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  if [ -n "${KEEP:-}" ]; then echo "# work dir kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
BASE="http://127.0.0.1:$PORT"
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$WORK/callgrind.out" \
  "$BIN/rankgate" serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" --config "${CONFIG:-$HERE/configs/budget-off.toml}" \
  >"$WORK/serve.log" 2>&1 &
SERVER=$!
until curl -fs "$BASE/readyz" >/dev/null 2>&1; do
  kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/serve.log" >&2; exit 1; }
  sleep 0.2
done
curl -fs -X PUT "$BASE/v1/admin/queues/bench" -H 'content-type: application/json' -d '{}' >/dev/null
QB_PREFIX=warm wrk -t1 -c10 -d3s -s "$HERE/queue-enter.lua" "$BASE" >/dev/null
if [ "$WHAT" = entry ]; then
  callgrind_control -i on "$SERVER" >/dev/null 2>&1
  out=$(QB_PREFIX=counted wrk -t1 -c10 -d"${SECS}s" -s "$HERE/queue-enter.lua" "$BASE")
  callgrind_control -i off "$SERVER" >/dev/null 2>&1
else
  QB_PREFIX=polled TICKETS_OUT="$WORK/tickets" wrk -t1 -c10 -d"${SECS}s" -s "$HERE/queue-enter.lua" "$BASE" >/dev/null
  callgrind_control -i on "$SERVER" >/dev/null 2>&1
  out=$(QB_PREFIX=polled TICKETS_IN="$WORK/tickets" wrk -t1 -c10 -d"$((SECS / 2))s" -s "$HERE/queue-position.lua" "$BASE")
  callgrind_control -i off "$SERVER" >/dev/null 2>&1
fi
grep -q "Non-2xx" <<<"$out" && { echo "queue_callgrind: wrk saw errors" >&2; echo "$out" >&2; exit 1; }
entries=$(awk '/requests in/ {print $1}' <<<"$out")
kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=""
callgrind_annotate --inclusive=yes "$WORK/callgrind.out" >"$WORK/inclusive.txt" 2>/dev/null
total=$(awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }' "$WORK/inclusive.txt")
echo "total: $total instructions = $((total / entries)) per $WHAT ($entries ${WHAT}s)"
stage() {
  local ir
  ir=$( (grep -E "$2" "$WORK/inclusive.txt" || true) | head -1 | awk '{ gsub(",", "", $1); print $1 }')
  awk -v n="$1" -v ir="${ir:-0}" -v e="$entries" -v t="$total" \
    'BEGIN { printf "  %-46s %7d per unit (%4.1f%%)\n", n, ir / e, 100 * ir / t }'
}
stage "queue row serialized per entry (queue_write)" "QueueState::queue_write \["
stage "group-commit writer thread (SQLite)" "queue/embedded/persist.rs:std::sys::backtrace::__rust_begin_short_backtrace"
stage "HTTP: hyper connection task" "hyper::server::conn::http1::Connection<I,S> as core::future::future::Future>::poll \["
if [ "$WHAT" = position ]; then
  stage "fast path: head parsing, dispatch, writing" "fast_path::serve"
  stage "per-member poll limit (embedded limiter)" "EmbeddedLimiter::try_acquire"
  stage "position read (queue lock, rank)" "EmbeddedStore::position_now"
fi
