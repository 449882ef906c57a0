#!/usr/bin/env bash
# `POST /v1/rankings/sort` with 100 random product ids (issue 14) from rankgate's embedded engine, beside
# a private `redis-server` answering `ZMSCORE` of 100 random members on a sorted set of the same size, in
# one run. Servers run on core 1 (`taskset -c 1`), load generators on core 0.
#
#   bench/sort.sh [BIN_DIR]      (default: target/release, built if missing)
#
# BIN_DIR must hold `rankgate` and `gen-workload` release binaries. Steps: the seed-lesson workload
# (200,000 sales, 20,000 products, ending now) is ingested into a fresh data dir; `rankgate serve` starts
# on core 1 and the span is warmed; wrk -t1 -c$CONNECTIONS -d$DURATION on core 0 posts sorts
# (bench/sort-random.lua); then redis-server on core 1, pre-filled with as many members as the ranking
# has, and redis-benchmark -c$CONNECTIONS on core 0 runs ZMSCORE with 100 random members.
# Reports requests/s, p99 and CPU per request (utime+stime of the server from /proc/<pid>/stat).
# Environment: PORT (18120), REDIS_PORT (16391), DURATION (10s), CONNECTIONS (50), REQUESTS (200000), IDS (100).
set -euo pipefail
PORT=${PORT:-18120}
REDIS_PORT=${REDIS_PORT:-16391}
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-50}
REQUESTS=${REQUESTS:-200000}
IDS=${IDS:-100}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${1:-target/release}
if [ "$BIN" = target/release ]; then
  [ -x target/release/rankgate ] && [ -x target/release/gen-workload ] \
    || cargo build --release -p rankgate -p rankgate-bench --bin rankgate --bin gen-workload
fi
for tool in wrk redis-server redis-benchmark redis-cli taskset curl awk; do
  command -v "$tool" >/dev/null || { echo "sort: $tool is not installed" >&2; exit 1; }
done
WORK=$(mktemp -d)
SERVER=""
REDIS=""
cleanup() {
  [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null || true
  [ -n "$REDIS" ] && kill "$REDIS" 2>/dev/null && wait "$REDIS" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

CLK_TCK=$(getconf CLK_TCK)
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
wrk_row() {
  local name=$1 pid=$2 url=$3 before after out rate total p99
  shift 3
  before=$(cpu_ticks "$pid")
  out=$(taskset -c 0 wrk -t1 -c"$CONNECTIONS" -d"$DURATION" --latency "$@" "$url")
  after=$(cpu_ticks "$pid")
  grep -q "Non-2xx" <<<"$out" && { echo "sort: $name got non-2xx answers" >&2; echo "$out" >&2; exit 1; }
  rate=$(awk '/Requests\/sec/ { print $2 }' <<<"$out")
  total=$(awk '/requests in/ { print $1 }' <<<"$out")
  p99=$(awk '$1 == "99%" { v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v);
    print (u == "us" ? v / 1000 : (u == "s" ? v * 1000 : v)) }' <<<"$out")
  echo "| $name | $rate | $p99 | $(awk -v t=$((after - before)) -v n="$total" -v hz="$CLK_TCK" 'BEGIN { printf "%.1f", t / hz * 1e6 / n }') |"
}
bench_row() {
  local name=$1 pid=$2 before after line
  shift 2
  before=$(cpu_ticks "$pid")
  line=$(taskset -c 0 redis-benchmark -p "$REDIS_PORT" -c "$CONNECTIONS" -n "$REQUESTS" --csv "$@" | tail -1 | tr -d '"')
  after=$(cpu_ticks "$pid")
  awk -F, -v name="$name" -v t=$((after - before)) -v n="$REQUESTS" -v hz="$CLK_TCK" \
    '{ printf "| %s | %s | %s | %.1f |\n", name, $2, $7, t / hz * 1e6 / n }' <<<"$line"
}

echo "# sort $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)," \
  "wrk/redis-benchmark -c$CONNECTIONS, $DURATION per wrk run, $REQUESTS per redis-benchmark run, $IDS ids"
"$BIN/gen-workload" seed-lesson --out "$WORK/seed.ndjson" >/dev/null
"$BIN/rankgate" ingest "$WORK/seed.ndjson" --data-dir "$WORK/data" >/dev/null 2>&1
taskset -c 1 "$BIN/rankgate" serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" >"$WORK/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 300); do curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fs "http://127.0.0.1:$PORT/v1/products/p1/rank?category=all&window=7d" >"$WORK/rank.json" \
  || { cat "$WORK/serve.log"; exit 1; }
TOTAL=$(sed -E 's/.*"total":([0-9]+).*/\1/' "$WORK/rank.json")
echo "## $BIN: ranking all/7d has $TOTAL products"
echo "| read | requests/s | p99 ms | CPU µs/request |"
echo "|---|---|---|---|"
PRODUCTS=20000 IDS="$IDS" wrk_row "rankgate POST /v1/rankings/sort ($IDS random ids)" "$SERVER" \
  "http://127.0.0.1:$PORT" -s "$HERE/sort-random.lua"
kill "$SERVER" && wait "$SERVER" 2>/dev/null || true
SERVER=""

taskset -c 1 redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$WORK" >"$WORK/redis.log" 2>&1 &
REDIS=$!
for _ in $(seq 1 100); do [ "$(redis-cli -p "$REDIS_PORT" PING 2>/dev/null)" = "PONG" ] && break; sleep 0.1; done
awk -v n="$TOTAL" 'BEGIN { srand(1); for (i = 0; i < n; i++) {
    m = sprintf("p:%012d", i); s = sprintf("%.4f", rand() * 1000)
    printf "*4\r\n$4\r\nZADD\r\n$4\r\nrank\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", length(s), s, length(m), m } }' \
  | redis-cli -p "$REDIS_PORT" --pipe >/dev/null
echo "## redis-server $(redis-server --version | awk '{ print $3 }'), sorted set of $(redis-cli -p "$REDIS_PORT" ZCARD rank) members"
echo "| read | requests/s | p99 ms | CPU µs/request |"
echo "|---|---|---|---|"
members=()
for _ in $(seq 1 "$IDS"); do members+=('p:__rand_int__'); done
bench_row "redis ZMSCORE ($IDS random members)" "$REDIS" -r 20000 ZMSCORE rank "${members[@]}"
