#!/usr/bin/env bash
# Rank lookups and top-50 pages (issue 10): `GET /v1/products/p<random>/rank?category=all&window=7d` and
# `GET /v1/categories/all/top?window=7d&limit=50` from rankgate's embedded engine, against a private
# `redis-server` answering `ZREVRANK` (random member) and `ZREVRANGE 0 49 WITHSCORES` on a sorted set of
# the same size, all in one run. Servers run on core 1 (`taskset -c 1`), load generators on core 0.
#
#   bench/rank_lookup.sh [BIN_DIR ...]      (default: target/release, built if missing)
#
# Each BIN_DIR must hold `rankgate` and `gen-workload` release binaries: pass main's build and a branch's
# build to compare them in one run. Per binary:
#   1. one seed-lesson workload (200,000 sales, 20,000 products, ending now), shared by every binary, is
#      ingested into a fresh data dir;
#   2. `rankgate serve` starts on core 1; every span the reads touch is warmed;
#   3. wrk -t1 -c$CONNECTIONS -d$DURATION on core 0: random-product rank lookups (bench/rank-random.lua),
#      then top-50;
# then redis-server (port $REDIS_PORT, no persistence) on core 1, pre-filled with a sorted set of as many
# members as the ranking has, and redis-benchmark -c$CONNECTIONS on core 0 for both commands.
# Reports requests/s, p99 and CPU per request (utime+stime of the server from /proc/<pid>/stat).
# Environment: PORT (18110), REDIS_PORT (16390), DURATION (10s), CONNECTIONS (50), REQUESTS (600000).
set -euo pipefail
PORT=${PORT:-18110}
REDIS_PORT=${REDIS_PORT:-16390}
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-50}
REQUESTS=${REQUESTS:-600000}
HERE=$(cd "$(dirname "$0")" && pwd)
BINS=("$@")
if [ ${#BINS[@]} -eq 0 ]; then
  BINS=(target/release)
  [ -x target/release/rankgate ] && [ -x target/release/gen-workload ] \
    || cargo build --release -p rankgate -p rankgate-bench --bin rankgate --bin gen-workload
fi
for tool in wrk redis-server redis-benchmark redis-cli taskset curl awk; do
  command -v "$tool" >/dev/null || { echo "rank_lookup: $tool is not installed" >&2; exit 1; }
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
# cpu_ticks PID: utime + stime of PID, in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# wrk_row NAME PID URL [wrk args]: runs wrk on core 0, prints "NAME | rate | p99 ms | CPU µs/request".
wrk_row() {
  local name=$1 pid=$2 url=$3 before after out rate total p99
  shift 3
  before=$(cpu_ticks "$pid")
  out=$(taskset -c 0 wrk -t1 -c"$CONNECTIONS" -d"$DURATION" --latency "$@" "$url")
  after=$(cpu_ticks "$pid")
  grep -q "Non-2xx" <<<"$out" && { echo "rank_lookup: $name got non-2xx answers" >&2; echo "$out" >&2; exit 1; }
  rate=$(awk '/Requests\/sec/ { print $2 }' <<<"$out")
  total=$(awk '/requests in/ { print $1 }' <<<"$out")
  p99=$(awk '$1 == "99%" { v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v);
    print (u == "us" ? v / 1000 : (u == "s" ? v * 1000 : v)) }' <<<"$out")
  echo "| $name | $rate | $p99 | $(awk -v t=$((after - before)) -v n="$total" -v hz="$CLK_TCK" 'BEGIN { printf "%.1f", t / hz * 1e6 / n }') |"
}
# bench_row NAME PID [redis-benchmark args]: redis-benchmark on core 0, same columns.
bench_row() {
  local name=$1 pid=$2 before after line
  shift 2
  before=$(cpu_ticks "$pid")
  line=$(taskset -c 0 redis-benchmark -p "$REDIS_PORT" -c "$CONNECTIONS" -n "$REQUESTS" --csv "$@" | tail -1 | tr -d '"')
  after=$(cpu_ticks "$pid")
  # "test,rps,avg,min,p50,p95,p99,max"
  awk -F, -v name="$name" -v t=$((after - before)) -v n="$REQUESTS" -v hz="$CLK_TCK" \
    '{ printf "| %s | %s | %s | %.1f |\n", name, $2, $7, t / hz * 1e6 / n }' <<<"$line"
}

echo "# rank_lookup $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)," \
  "wrk/redis-benchmark -c$CONNECTIONS, $DURATION per wrk run, $REQUESTS per redis-benchmark run"
"${BINS[0]}/gen-workload" seed-lesson --out "$WORK/seed.ndjson" >/dev/null
RANK_QUERY="category=all&window=7d"
TOP_URL="http://127.0.0.1:$PORT/v1/categories/all/top?window=7d&limit=50"
TOTAL=""
n=0
for bin in "${BINS[@]}"; do
  n=$((n + 1))
  data="$WORK/data$n"
  "$bin/rankgate" ingest "$WORK/seed.ndjson" --data-dir "$data" >/dev/null 2>&1
  taskset -c 1 "$bin/rankgate" serve --listen "127.0.0.1:$PORT" --data-dir "$data" >"$WORK/serve$n.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 300); do curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -fs "$TOP_URL" >"$WORK/top$n.json" || { cat "$WORK/serve$n.log"; exit 1; }
  curl -fs "http://127.0.0.1:$PORT/v1/products/p1/rank?$RANK_QUERY" >"$WORK/rank$n.json"
  TOTAL=$(sed -E 's/.*"total":([0-9]+).*/\1/' "$WORK/rank$n.json")
  echo "## $bin: ranking all/7d has $TOTAL products"
  echo "| read | requests/s | p99 ms | CPU µs/request |"
  echo "|---|---|---|---|"
  PRODUCTS=20000 RANK_QUERY="$RANK_QUERY" wrk_row "rankgate GET …/rank (random product)" "$SERVER" \
    "http://127.0.0.1:$PORT" -s "$HERE/rank-random.lua"
  wrk_row "rankgate GET …/top?limit=50" "$SERVER" "$TOP_URL"
  kill "$SERVER" && wait "$SERVER" 2>/dev/null || true
  SERVER=""
done
if [ $n -gt 1 ]; then
  # The same data, the same requests: every binary must answer the same bodies (but `asOf`, the time of
  # each data dir's ingest).
  for i in $(seq 2 $n); do
    for read in top rank; do
      cmp -s <(sed -E 's/"asOf":"[^"]*"//' "$WORK/${read}1.json") <(sed -E 's/"asOf":"[^"]*"//' "$WORK/$read$i.json") \
        || echo "# note: $read bodies of binaries 1 and $i differ beyond asOf"
    done
  done
fi

taskset -c 1 redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$WORK" >"$WORK/redis.log" 2>&1 &
REDIS=$!
for _ in $(seq 1 100); do [ "$(redis-cli -p "$REDIS_PORT" PING 2>/dev/null)" = "PONG" ] && break; sleep 0.1; done
# Members p:000000000000 … (redis-benchmark's 12-digit __rand_int__), random scores, as many as rankgate ranks.
awk -v n="$TOTAL" 'BEGIN { srand(1); for (i = 0; i < n; i++) {
    m = sprintf("p:%012d", i); s = sprintf("%.4f", rand() * 1000)
    printf "*4\r\n$4\r\nZADD\r\n$4\r\nrank\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", length(s), s, length(m), m } }' \
  | redis-cli -p "$REDIS_PORT" --pipe >/dev/null
echo "## redis-server $(redis-server --version | awk '{ print $3 }'), sorted set of $(redis-cli -p "$REDIS_PORT" ZCARD rank) members"
echo "| read | requests/s | p99 ms | CPU µs/request |"
echo "|---|---|---|---|"
bench_row "redis ZREVRANK (random member)" "$REDIS" -r 20000 ZREVRANK rank 'p:__rand_int__'
bench_row "redis ZREVRANGE 0 49 WITHSCORES" "$REDIS" ZREVRANGE rank 0 49 WITHSCORES
