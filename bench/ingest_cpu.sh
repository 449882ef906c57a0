#!/usr/bin/env bash
# User and system CPU per event of durable HTTP ingest (issue 13, target 1), beside the rate: the
# server's utime and stime from /proc/<pid>/stat before and after, which separate our code from the
# kernel's share (WAL writes, fsyncs, loopback TCP), and the bytes it wrote (`wchar` of /proc/<pid>/io:
# WAL, checkpoints, responses). Alternate two builds to compare them:
#
#   bench/ingest_cpu.sh BIN_DIR [BIN_DIR…]    (each: rankgate, gen-workload, http-ingest)
#
# The workload is issue13.sh's (the seed lesson with every 20th event repeated ~1,000 later), one
# connection, 2,000-event batches, `rankgate serve` on core 1 with a fresh data dir and the client on
# core 0. Environment: ROUNDS (3: each BIN_DIR once per round, in turn), PORT (18150).
set -euo pipefail
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-18150}
[ $# -ge 1 ] || { echo "usage: bench/ingest_cpu.sh BIN_DIR [BIN_DIR…]" >&2; exit 2; }
WORK=$(mktemp -d)
SERVER=""
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
"$(readlink -f "$1")/gen-workload" seed-lesson --out "$WORK/seed.ndjson" >/dev/null 2>&1
awk '{ print; if (NR % 20 == 0) held[NR] = $0; if ((NR - 1000) in held) { print held[NR - 1000]; delete held[NR - 1000] } }' \
  "$WORK/seed.ndjson" >"$WORK/mixed.ndjson"
events=$(wc -l <"$WORK/mixed.ndjson")
echo "| build | events/s | user µs/event | system µs/event | bytes written per event |"
echo "|---|---|---|---|---|"
for _ in $(seq 1 "$ROUNDS"); do
  for dir in "$@"; do
    bin=$(readlink -f "$dir")
    rm -rf "$WORK/data"
    taskset -c 1 "$bin/rankgate" serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" >"$WORK/serve.log" 2>&1 &
    SERVER=$!
    until curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; do
      kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/serve.log" >&2; exit 1; }
      sleep 0.05
    done
    read -r u0 s0 < <(sed 's/^.*) //' "/proc/$SERVER/stat" | awk '{print $12, $13}')
    w0=$(awk "/^wchar/{print \$2}" "/proc/$SERVER/io")
    line=$(taskset -c 0 "$bin/http-ingest" "$WORK/mixed.ndjson" --url "http://127.0.0.1:$PORT" --connections 1 --batch 2000)
    read -r u1 s1 < <(sed 's/^.*) //' "/proc/$SERVER/stat" | awk '{print $12, $13}')
    w1=$(awk "/^wchar/{print \$2}" "/proc/$SERVER/io")
    kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=""
    rate=$(sed -E 's/.* = ([0-9.]+) events\/s.*/\1/' <<<"$line")
    tick=$(getconf CLK_TCK)
    awk -v b="$dir" -v r="$rate" -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v n="$events" -v t="$tick" -v w=$((w1 - w0)) \
      'BEGIN { printf "| %s | %s | %.2f | %.2f | %.0f |\n", b, r, u * 1e6 / t / n, s * 1e6 / t / n, w / n }'
  done
done
