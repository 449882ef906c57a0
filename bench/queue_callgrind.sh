#!/usr/bin/env bash
# Instructions per waiting-room entry (POST /v1/queues/bench/entries, durable, embedded store), counted
# by valgrind's callgrind, which repeats exactly whatever else the machine does (issue 13, target 3).
#
#   bench/queue_callgrind.sh [BIN_DIR]      (default target/release)
#
# `rankgate serve` runs under callgrind with instrumentation off; wrk (bench/queue-enter.lua, distinct
# members, -c 10) enters for 3 s uncounted, then for $SECS s counted. Prints instructions per entry and
# the inclusive share of a few stages (a stage the compiler inlined away prints 0). Environment: SECS (10), PORT (18170), KEEP (keep the profile).
set -euo pipefail
BIN=$(readlink -f "${1:-target/release}")
HERE=$(cd "$(dirname "$0")" && pwd)
SECS=${SECS:-10}
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
  "$BIN/rankgate" serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" >"$WORK/serve.log" 2>&1 &
SERVER=$!
until curl -fs "$BASE/readyz" >/dev/null 2>&1; do
  kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/serve.log" >&2; exit 1; }
  sleep 0.2
done
curl -fs -X PUT "$BASE/v1/admin/queues/bench" -H 'content-type: application/json' -d '{}' >/dev/null
QB_PREFIX=warm wrk -t1 -c10 -d3s -s "$HERE/queue-enter.lua" "$BASE" >/dev/null
callgrind_control -i on "$SERVER" >/dev/null 2>&1
out=$(QB_PREFIX=counted wrk -t1 -c10 -d"${SECS}s" -s "$HERE/queue-enter.lua" "$BASE")
callgrind_control -i off "$SERVER" >/dev/null 2>&1
grep -q "Non-2xx" <<<"$out" && { echo "queue_callgrind: wrk saw errors" >&2; echo "$out" >&2; exit 1; }
entries=$(awk '/requests in/ {print $1}' <<<"$out")
kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=""
callgrind_annotate --inclusive=yes "$WORK/callgrind.out" >"$WORK/inclusive.txt" 2>/dev/null
total=$(awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }' "$WORK/inclusive.txt")
echo "total: $total instructions = $((total / entries)) per entry ($entries entries)"
stage() {
  local ir
  ir=$( (grep -E "$2" "$WORK/inclusive.txt" || true) | head -1 | awk '{ gsub(",", "", $1); print $1 }')
  awk -v n="$1" -v ir="${ir:-0}" -v e="$entries" -v t="$total" \
    'BEGIN { printf "  %-46s %7d per entry (%4.1f%%)\n", n, ir / e, 100 * ir / t }'
}
stage "queue row serialized per entry (queue_write)" "QueueState::queue_write \["
stage "group-commit writer thread (SQLite)" "queue/embedded/persist.rs:std::sys::backtrace::__rust_begin_short_backtrace"
stage "HTTP: hyper connection task" "hyper::server::conn::http1::Connection<I,S> as core::future::future::Future>::poll \["
