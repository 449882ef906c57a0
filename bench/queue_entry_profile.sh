#!/usr/bin/env bash
# Where a durable embedded entry's time goes (issue 13, target 3): the group commit's cycle, seen from the
# kernel. `rankgate serve` on core 1, wrk (bench/queue-enter.lua, -c $CONNECTIONS) on core 0; during the
# middle $SECS s of the run it counts the writer's fsyncs (one per commit) with perf's syscall
# tracepoints and reads each thread's CPU from /proc/<pid>/task/*/stat; then it times the group-commit
# thread's syscalls for 2 s with `perf trace -s -t`. Prints entries per commit, the commit cycle, how
# busy the runtime and the group-commit thread were, and the mean fsync and gather sleep.
#
#   bench/queue_entry_profile.sh [BIN_DIR]      (default target/release; needs perf with tracepoints)
#
# The queue is paused, so every entry stays waiting and the waiting count counts them.
# Environment: SECS (5), CONNECTIONS (50), PORT (18175), SYNCHRONOUS (full; `normal` for the same run
# without an fsync per commit), KEEP (keep the work dir).
set -euo pipefail
BIN=$(readlink -f "${1:-target/release}")
HERE=$(cd "$(dirname "$0")" && pwd)
SECS=${SECS:-5}
CONNECTIONS=${CONNECTIONS:-50}
PORT=${PORT:-18175}
SYNCHRONOUS=${SYNCHRONOUS:-full}
for tool in perf wrk curl taskset awk; do
  command -v "$tool" >/dev/null || { echo "queue_entry_profile: $tool is not installed" >&2; exit 2; }
done
WORK=$(mktemp -d)
SERVER=""
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  if [ -n "${KEEP:-}" ]; then echo "# work dir kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
BASE="http://127.0.0.1:$PORT"
RANKGATE_SQLITE_SYNCHRONOUS=$SYNCHRONOUS taskset -c 1 "$BIN/rankgate" serve --listen "127.0.0.1:$PORT" \
  --data-dir "$WORK/data" --config "$HERE/configs/budget-off.toml" >"$WORK/serve.log" 2>&1 &
SERVER=$!
until curl -fs "$BASE/readyz" >/dev/null 2>&1; do
  kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/serve.log" >&2; exit 1; }
  sleep 0.2
done
curl -fs -X PUT "$BASE/v1/admin/queues/bench" -H 'content-type: application/json' -d '{"paused": true}' >/dev/null

# utime + stime of each thread, by name: "name ticks" lines.
thread_ticks() {
  for stat in /proc/"$SERVER"/task/*/stat; do
    awk '{ line = $0; sub(/^[0-9]+ \(/, "", line); name = substr(line, 1, index(line, ") ") - 1);
           n = split(substr(line, index(line, ") ") + 2), f, " "); print name, f[12] + f[13] }' "$stat" 2>/dev/null || true
  done | awk '{ ticks[$1] += $2 } END { for (name in ticks) print name, ticks[name] }' | sort
}

DURATION=$((SECS + 6))
QB_PREFIX=profile taskset -c 0 wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" -s "$HERE/queue-enter.lua" "$BASE" \
  >"$WORK/wrk.txt" &
WRK=$!
sleep 2
before=$(thread_ticks)
entries_before=$(curl -fs "$BASE/v1/admin/queues" | awk -F'"waiting":' 'NF > 1 { split($2, a, ","); print a[1]; exit }')
# Counting only (in-kernel counters, no per-event cost): commits are the writer's fsyncs.
perf stat -x, -e syscalls:sys_enter_fdatasync,syscalls:sys_enter_fsync -p "$SERVER" -o "$WORK/syncs.csv" \
  -- sleep "$SECS"
after=$(thread_ticks)
entries_after=$(curl -fs "$BASE/v1/admin/queues" | awk -F'"waiting":' 'NF > 1 { split($2, a, ","); print a[1]; exit }')
# Then the group-commit thread's syscalls, timed (tracing only that thread keeps the overhead off the
# runtime): how long an fsync takes, and the gather's sleep.
writer=$(grep -l '^queue-group-com' /proc/"$SERVER"/task/*/comm | head -1 | awk -F/ '{ print $5 }')
perf trace -s -t "$writer" -o "$WORK/trace.txt" -- sleep 2 >/dev/null 2>&1 || true
wait "$WRK"
hz=$(getconf CLK_TCK)
fdatasyncs=$(awk -F, '/sys_enter_f(data)?sync/ { n += $1 } END { print n + 0 }' "$WORK/syncs.csv")
entries=$((entries_after - entries_before))
echo "# queue entry profile $(date -u +%FT%TZ), synchronous=$SYNCHRONOUS, -c $CONNECTIONS, $SECS s counted"
awk -v e="$entries" -v f="$fdatasyncs" -v s="$SECS" 'BEGIN {
  printf "entries: %d (%.0f/s); commits (fsync/fdatasync): %d (%.0f/s); entries per commit: %.1f; commit cycle %.2f ms\n",
    e, e / s, f, f / s, (f > 0 ? e / f : 0), (f > 0 ? 1000 * s / f : 0) }'
join <(echo "$before") <(echo "$after") | awk -v hz="$hz" -v s="$SECS" '
  { busy = ($3 - $2) / hz / s; if (busy > 0.005) printf "thread %-22s busy %5.1f%% of the wall clock\n", $1, 100 * busy }'
echo "group-commit thread's syscalls over 2 s (perf trace -s -t; traced, so slower than the counted run):"
awk '/^ *[a-z_0-9]+ +[0-9]+ / { printf "  %-16s calls %8s  total %10s ms  mean %8s ms\n", $1, $2, $4, $6 }' "$WORK/trace.txt"
grep -E "Requests/sec|Non-2xx" "$WORK/wrk.txt" || true
