#!/usr/bin/env bash
# Every table of issue 13 in one run: servers on core 1 (`taskset -c 1`: rankgate, a private redis-server),
# load generators on core 0 (`taskset -c 0`: http-ingest, wrk, redis-benchmark). Beside each rate it
# prints the CPU time per request (or event) of every server-side process, from utime + stime in
# /proc/<pid>/stat read before and after the run.
#
#   bench/issue13.sh [BIN_DIR]        (default target/release; needs rankgate, gen-workload, http-ingest,
#                                      serving-bench, redis-memory: cargo build --release -p rankgate -p rankgate-bench)
#
# Sections (SECTIONS, default "ingest fleet queue queue-redis memory reads"):
#   ingest       durable HTTP ingest, embedded: one connection, 2,000-event JSON batches of the seed-lesson
#                workload (3% late events, up to an hour) with every 20th event sent again ~1,000 events
#                later (duplicates), vs the naive design: one EVALSHA per event of bench/naive-event.lua
#                (SADD dedupe, HINCRBY, HMGET + score, 2× ZADD) from redis-benchmark -c 50, random ids.
#   fleet        PostgreSQL + Redis serving on the spread-out demo workload (serving-bench ingest, which
#                drives the production Ingestor and publisher): full serving and Top-N-only
#                (--serving-depth $SERVING_DEPTH); Redis commands per event and round trips per batch.
#                serving-bench (rankgate's side) runs on core 0 and the private redis-server on core 1;
#                PostgreSQL is the machine's service at 127.0.0.1:5432, not pinned, and its CPU is not
#                attributed (other users share it).
#   queue        waiting room, embedded: wrk bench/queue-enter.lua (distinct members), then
#                bench/queue-position.lua (one poll each), vs redis-benchmark `ZADD q NX` and `ZRANK`.
#   queue-redis  the same against `rankgate serve --redis` (the private redis-server): CPU of rankgate and
#                of Redis beside the rate.
#   memory       the sorted-set engine's bytes per member at 1M members (crates/zset/examples/memory.rs)
#                vs Redis `MEMORY USAGE` (redis-memory), and the rankgate process's RSS per cached
#                (product, span) with a 30-day demo workload and every span of the last 30 days read
#                once (30 daily periods, the weeks and months they touch, 4 windows; `all` + 50 categories).
#   reads        bench/rank_lookup.sh (top-50 and rank lookups vs ZREVRANGE / ZREVRANK), the kept targets.
#
# Environment: DURATION (10s), CONNECTIONS (50), REQUESTS (300000, per redis-benchmark run), SCALE (1.0,
# seed-lesson volume), FLEET_EVENTS (200000), SERVING_DEPTH (100), PORT (18130), REDIS_PORT (16391),
# POSTGRES (postgres://postgres@127.0.0.1:5432/test), SECTIONS, KEEP (set: keep the work dir).
# The numbers are only as quiet as the machine: run it with nothing else running. Instruction counts
# (valgrind --tool=callgrind) are the noise-free complement; see BENCHMARKS.md for how they were taken.
set -euo pipefail
BIN=$(readlink -f "${1:-target/release}")
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-50}
REQUESTS=${REQUESTS:-300000}
SCALE=${SCALE:-1.0}
FLEET_EVENTS=${FLEET_EVENTS:-200000}
SERVING_DEPTH=${SERVING_DEPTH:-100}
PORT=${PORT:-18130}
REDIS_PORT=${REDIS_PORT:-16391}
POSTGRES=${POSTGRES:-postgres://postgres@127.0.0.1:5432/test}
SECTIONS=${SECTIONS:-ingest fleet queue queue-redis memory reads}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)

for tool in rankgate gen-workload http-ingest serving-bench redis-memory; do
  [ -x "$BIN/$tool" ] || { echo "issue13: $BIN/$tool is missing (cargo build --release -p rankgate -p rankgate-bench)" >&2; exit 2; }
done
for tool in wrk redis-server redis-benchmark redis-cli taskset curl awk; do
  command -v "$tool" >/dev/null || { echo "issue13: $tool is not installed (wrk: apt-get install -y wrk)" >&2; exit 2; }
done
WORK=$(mktemp -d)
SERVER=""
REDIS=""
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  if [ -n "$REDIS" ]; then kill "$REDIS" 2>/dev/null || true; wait "$REDIS" 2>/dev/null || true; fi
  if [ -n "${KEEP:-}" ]; then echo "# work dir kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
BASE="http://127.0.0.1:$PORT"
HZ=$(getconf CLK_TCK)
SUMMARY="$WORK/summary"
: >"$SUMMARY"

# utime + stime of a process, in clock ticks (fields 14 and 15, counted after the parenthesised name).
cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }
# per_unit TICKS UNITS: CPU microseconds per unit.
per_unit() { awk -v t="$1" -v n="$2" -v hz="$HZ" 'BEGIN { printf "%.2f", (n > 0 ? t / hz * 1e6 / n : 0) }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
# row SECTION NAME RATE UNIT P99_MS CPU_US [MORE]: one result line, printed and kept for the summary.
row() { printf '| %s | %s | %s %s | %s | %s | %s |\n' "$@" | tee -a "$SUMMARY"; }

start_redis() {
  taskset -c 1 redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$WORK" >"$WORK/redis.log" 2>&1 &
  REDIS=$!
  for _ in $(seq 1 100); do [ "$(redis-cli -p "$REDIS_PORT" PING 2>/dev/null)" = PONG ] && return 0; sleep 0.1; done
  echo "issue13: redis-server did not start" >&2; cat "$WORK/redis.log" >&2; exit 1
}
rcli() { redis-cli -p "$REDIS_PORT" "$@"; }

# start_server DATA_DIR [flags…]: rankgate serve on core 1, waits for /readyz.
start_server() {
  local dir=$1
  shift
  taskset -c 1 "$BIN/rankgate" serve --listen "127.0.0.1:$PORT" --data-dir "$dir" --config "$ROOT/bench/configs/budget-off.toml" "$@" >"$dir.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 3000); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/readyz" || true)" = 200 ] && return 0
    kill -0 "$SERVER" 2>/dev/null || { echo "issue13: rankgate exited:" >&2; cat "$dir.log" >&2; exit 1; }
    sleep 0.02
  done
  echo "issue13: rankgate not ready after 60 s" >&2; exit 1
}
stop_server() { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; SERVER=""; }

# wrk_row SECTION NAME [wrk args…] URL: wrk on core 0 against rankgate ($SERVER; also $REDIS when the
# Redis backend serves), one row with rate, p99 and CPU µs per request of each server-side process.
wrk_row() {
  local section=$1 name=$2 out s0 s1 r0=0 r1=0 total rate p99 cpu
  shift 2
  s0=$(cpu_ticks "$SERVER"); [ -n "$REDIS" ] && r0=$(cpu_ticks "$REDIS")
  out=$(taskset -c 0 wrk -t1 -c"$CONNECTIONS" -d"$DURATION" --latency "$@")
  s1=$(cpu_ticks "$SERVER"); [ -n "$REDIS" ] && r1=$(cpu_ticks "$REDIS")
  if grep -qE "Non-2xx|Socket errors" <<<"$out"; then echo "issue13: wrk saw errors ($name):" >&2; echo "$out" >&2; exit 1; fi
  rate=$(awk '/Requests\/sec/ { print $2 }' <<<"$out")
  total=$(awk '/requests in/ { print $1 }' <<<"$out")
  p99=$(awk '$1 == "99%" { v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v);
    print (u == "us" ? v / 1000 : (u == "s" ? v * 1000 : v)) }' <<<"$out")
  cpu="rankgate $(per_unit $((s1 - s0)) "$total")"
  [ -n "$REDIS" ] && cpu="$cpu, redis $(per_unit $((r1 - r0)) "$total")"
  row "$section" "$name" "$rate" "req/s" "$p99" "$cpu" "$total requests"
}
# bench_row SECTION NAME [redis-benchmark args…]: redis-benchmark on core 0 against the private Redis.
bench_row() {
  local section=$1 name=$2 r0 r1 line
  shift 2
  r0=$(cpu_ticks "$REDIS")
  line=$(taskset -c 0 redis-benchmark -p "$REDIS_PORT" -c "$CONNECTIONS" -n "$REQUESTS" --csv "$@" | tail -1 | tr -d '"')
  r1=$(cpu_ticks "$REDIS")
  # "test,rps,avg,min,p50,p95,p99,max"
  row "$section" "$name" "$(cut -d, -f2 <<<"$line")" "req/s" "$(cut -d, -f7 <<<"$line")" \
    "redis $(per_unit $((r1 - r0)) "$REQUESTS")" "$REQUESTS requests"
}
# value SECTION NAME: the rate of a row printed earlier in this run.
value() { awk -F' \\| ' -v s="| $1" -v n="$2" '$1 == s && $2 == n { split($3, r, " "); print r[1] }' "$SUMMARY" | tail -1; }

echo "# issue 13 run $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); binaries $BIN"
echo "# rankgate $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'); $(redis-server --version | awk '{ print $1, $2, $3 }')"
echo "# wrk/redis-benchmark -c$CONNECTIONS, wrk $DURATION, redis-benchmark $REQUESTS requests; servers on core 1, load on core 0"
echo
echo "| section | measurement | rate | p99 ms | CPU µs per unit (server-side processes) | volume |"
echo "|---|---|---|---|---|---|"
start_redis

for section in $SECTIONS; do
  case $section in
  ingest)
    # Two shapes of the same events, each with every 20th event sent again ~1,000 events later
    # (duplicates): the seed lesson as written by gen-workload (epoch-millisecond ts, categories on every
    # event), and as real producers write it (issue 27): 30% of ts as RFC 3339 strings, 10% of events
    # without categories (the seed lesson's products are 20% two-category by sales).
    for shape in seed producers; do
      flags=()
      [ "$shape" = producers ] && flags=(--rfc3339-share 0.3 --uncategorized-share 0.1)
      "$BIN/gen-workload" seed-lesson --scale "$SCALE" "${flags[@]}" --out "$WORK/$shape.ndjson" >/dev/null 2>&1
      awk '{ print; if (NR % 20 == 0) held[NR] = $0; if ((NR - 1000) in held) { print held[NR - 1000]; delete held[NR - 1000] } }' \
        "$WORK/$shape.ndjson" >"$WORK/mixed-$shape.ndjson"
      events=$(wc -l <"$WORK/mixed-$shape.ndjson")
      start_server "$WORK/ingest-$shape"
      s0=$(cpu_ticks "$SERVER")
      line=$(taskset -c 0 "$BIN/http-ingest" "$WORK/mixed-$shape.ndjson" --url "$BASE" --connections 1 --batch 2000)
      s1=$(cpu_ticks "$SERVER")
      stop_server
      rate=$(sed -E 's/.* = ([0-9.]+) events\/s.*/\1/' <<<"$line")
      name="HTTP ingest, embedded, 1 connection, 2,000-event batches"
      [ "$shape" = producers ] && name="$name, producers' shape (30% RFC 3339 ts, 10% uncategorized)"
      row ingest "$name" "$rate" "events/s" "-" \
        "rankgate $(per_unit $((s1 - s0)) "$events")" "$(sed -E 's/.*\((accepted[^)]*)\).*/\1/' <<<"$line")"
    done
    sha=$(rcli SCRIPT LOAD "$(cat "$HERE/naive-event.lua")")
    bench_row ingest "naive: EVALSHA per event (SADD, HINCRBY, HMGET, 2x ZADD)" \
      -r 1000000000 EVALSHA "$sha" 2 "naive:seen" "naive:" __rand_int__
    rcli FLUSHALL >/dev/null
    naive=$(value ingest "naive: EVALSHA per event (SADD, HINCRBY, HMGET, 2x ZADD)")
    for shape in seed producers; do
      name="HTTP ingest, embedded, 1 connection, 2,000-event batches"
      [ "$shape" = producers ] && name="$name, producers' shape (30% RFC 3339 ts, 10% uncategorized)"
      echo "| ingest | **ratio** embedded HTTP ingest ($shape) / naive | $(ratio "$(value ingest "$name")" "$naive")× | | target ≥ 6× (27) | |" | tee -a "$SUMMARY"
    done
    ;;
  fleet)
    naive=$(value ingest "naive: EVALSHA per event (SADD, HINCRBY, HMGET, 2x ZADD)")
    for mode in full top-n; do
      depth=()
      [ "$mode" = top-n ] && depth=(--serving-depth "$SERVING_DEPTH")
      r0=$(cpu_ticks "$REDIS")
      start=$(date +%s%N)
      taskset -c 0 "$BIN/serving-bench" ingest --events "$FLEET_EVENTS" --redis "redis://127.0.0.1:$REDIS_PORT" \
        --postgres "$POSTGRES" "${depth[@]}" >"$WORK/fleet-$mode.out" 2>&1 &
      bench=$!
      # serving-bench's CPU is read from /proc until it exits (its zombie still shows the totals).
      b1=0
      while [ -e "/proc/$bench/stat" ]; do
        b1=$(cpu_ticks "$bench" 2>/dev/null || echo "$b1")
        [ "$(sed 's/^.*) //' "/proc/$bench/stat" 2>/dev/null | cut -d' ' -f1)" = Z ] && break
        sleep 0.05
      done
      wait "$bench" || { cat "$WORK/fleet-$mode.out" >&2; exit 1; }
      r1=$(cpu_ticks "$REDIS")
      rate=$(sed -nE 's/^PostgreSQL \+ Redis ingest: .* = ([0-9.]+) events\/s.*/\1/p' "$WORK/fleet-$mode.out")
      redis_line=$(sed -nE 's/^Redis: (.*)/\1/p' "$WORK/fleet-$mode.out")
      # serving-bench's own reading covers only the timed run; the whole-process figure also holds
      # building the 200,000-event workload in process.
      timed=$(sed -nE 's/^serving-bench CPU over the timed run: ([0-9.]+) .*/\1/p' "$WORK/fleet-$mode.out")
      row fleet "PostgreSQL + Redis ingest, $mode serving${depth[*]:+ (${depth[*]})}" "$rate" "events/s" "-" \
        "rankgate (serving-bench) ${timed:-?} over the timed run ($(per_unit "$b1" "$FLEET_EVENTS") whole process), redis $(per_unit $((r1 - r0)) "$FLEET_EVENTS")" \
        "$redis_line"
      echo "| fleet | **ratio** $mode / naive | $(ratio "$rate" "$naive")× | | target ≥ 2× in the default mode | |" | tee -a "$SUMMARY"
      rcli FLUSHALL >/dev/null
    done
    ;;
  queue | queue-redis)
    flags=()
    if [ "$section" = queue-redis ]; then
      head -c 32 /dev/urandom | base64 | tr '+/' '-_' >"$WORK/token.secret"
      flags=(--redis "redis://127.0.0.1:$REDIS_PORT" --token-secret-file "$WORK/token.secret")
      saved_redis=$REDIS
    else
      saved_redis=$REDIS
      REDIS="" # only rankgate serves the embedded rows
    fi
    start_server "$WORK/$section" "${flags[@]}"
    QB_PREFIX=e$section wrk_row "$section" "enter (POST /v1/queues/bench/entries, durable)" \
      -s "$HERE/queue-enter.lua" "$BASE"
    # Members to poll, entered uncounted with their tickets kept (every poll shows its member's ticket,
    # SPEC 2.2; keeping them costs wrk a body parse per answer, so the counted entry row above does not).
    # Polls run up to twice as fast as entries, so members are entered for four times as long as they are
    # polled (2 × DURATION against DURATION / 2).
    QB_PREFIX=p$section TICKETS_OUT="$WORK/tickets-$section" \
      taskset -c 0 wrk -t1 -c"$CONNECTIONS" -d"$(awk -v d="${DURATION%s}" 'BEGIN { printf "%ds", 2 * d }')" \
      -s "$HERE/queue-enter.lua" "$BASE" >/dev/null
    # Poll for less time than the entries took, so every poll finds a member polled for the first time.
    QB_PREFIX=p$section TICKETS_IN="$WORK/tickets-$section" \
      DURATION=$(awk -v d="${DURATION%s}" 'BEGIN { printf "%ds", (d > 2 ? d / 2 : 1) }') \
      wrk_row "$section" "position (GET /v1/queues/bench/entries/{m})" -s "$HERE/queue-position.lua" "$BASE"
    wrk_row "$section" "GET /healthz (the HTTP floor)" "$BASE/healthz"
    if [ "$section" = queue-redis ]; then
      # How far the hot path coalesced: requests per script call is the average batch.
      curl -fs "$BASE/metrics" | awk '
        /^rankgate_queue_redis_script_calls_total/ { match($0, /lane="[a-z]+"/); calls[substr($0, RSTART + 6, RLENGTH - 7)] = $NF }
        /^rankgate_queue_redis_requests_total/ { match($0, /lane="[a-z]+"/); reqs[substr($0, RSTART + 6, RLENGTH - 7)] = $NF }
        END { for (lane in calls) if (calls[lane] > 0) printf "# queue-redis: %s lane, %.0f requests in %.0f script calls = %.2f per call\n", lane, reqs[lane], calls[lane], reqs[lane] / calls[lane] }' |
        tee -a "$SUMMARY"
    fi
    stop_server
    REDIS=$saved_redis
    if [ "$section" = queue ]; then
      bench_row queue "redis ZADD q NX (random member)" -r 1000000 ZADD bq NX __rand_int__ 'm:__rand_int__'
      bench_row queue "redis ZRANK q (random member)" -r 1000000 ZRANK bq 'm:__rand_int__'
      rcli FLUSHALL >/dev/null
    fi
    zadd=$(value queue "redis ZADD q NX (random member)")
    zrank=$(value queue "redis ZRANK q (random member)")
    enter=$(value "$section" "enter (POST /v1/queues/bench/entries, durable)")
    position=$(value "$section" "position (GET /v1/queues/bench/entries/{m})")
    if [ "$section" = queue ]; then
      echo "| $section | **ratios** enter / ZADD NX, position / ZRANK | $(ratio "$enter" "$zadd")×, $(ratio "$position" "$zrank")× | | targets: 0.6× / 0.9× | |" | tee -a "$SUMMARY"
    else
      # Issue 13 sets both Redis targets against ZADD NX.
      echo "| $section | **ratios** enter / ZADD NX, position / ZADD NX | $(ratio "$enter" "$zadd")×, $(ratio "$position" "$zadd")× | | targets: 0.5× / 0.5× | |" | tee -a "$SUMMARY"
    fi
    ;;
  memory)
    if [ -x "$BIN/examples/memory" ]; then
      "$BIN/examples/memory" >"$WORK/zset-memory.out"
      row memory "engine heap per member, 1M sku-0000001…" "$(awk '/^heap_bytes/ { print $5 }' "$WORK/zset-memory.out")" \
        "B/member" "-" "-" "RSS delta $(awk '/^RSS delta/ { print $5 }' "$WORK/zset-memory.out") B/member; target ≤ 40"
    else
      echo "# memory: $BIN/examples/memory missing (cargo build --release -p rankgate-zset --example memory)" >&2
    fi
    "$BIN/redis-memory" --redis "redis://127.0.0.1:$REDIS_PORT" >"$WORK/redis-memory.out" 2>&1 || true
    row memory "Redis ZSET, same 1M members (MEMORY USAGE SAMPLES 0)" \
      "$(awk '/SAMPLES 0/ { sub(/.* = /, ""); print $1; exit }' "$WORK/redis-memory.out")" "B/member" "-" "-" \
      "used_memory delta $(awk '/used_memory delta/ { sub(/.* = /, ""); print $1; exit }' "$WORK/redis-memory.out") B/member"
    rcli FLUSHALL >/dev/null
    # The process: 30 days of the demo workload, every span of the last 30 days read once.
    "$BIN/gen-workload" seed-lesson --days 30 --out "$WORK/days30.ndjson" >/dev/null 2>&1
    "$BIN/rankgate" ingest "$WORK/days30.ndjson" --data-dir "$WORK/memory" >/dev/null 2>&1
    start_server "$WORK/memory"
    rss0=$(rss_kib "$SERVER")
    spans=("window=1h" "window=1d" "window=7d" "window=30d")
    for day in $(seq 0 29); do spans+=("period=daily&at=$(date -u -d "-$day days" +%Y%m%d)"); done
    for day in 0 7 14 21 28 29; do spans+=("period=weekly&at=$(date -u -d "-$day days" +%GW%V)"); done
    for day in 0 29; do spans+=("period=monthly&at=$(date -u -d "-$day days" +%Y%m)"); done
    categories="all $(seq -f 'cat%g' 0 49 | tr '\n' ' ')"
    pairs=0
    for category in $categories; do
      for span in $(printf '%s\n' "${spans[@]}" | sort -u); do
        total=$(curl -fs "$BASE/v1/categories/$category/top?$span&limit=1" | sed -nE 's/.*"total":([0-9]+).*/\1/p') \
          || { echo "issue13: GET /v1/categories/$category/top?$span failed" >&2; exit 1; }
        pairs=$((pairs + ${total:-0}))
      done
    done
    rss1=$(rss_kib "$SERVER")
    stop_server
    row memory "rankgate process, 30-day demo, every span of the last 30 days cached" \
      "$(awk -v b=$((rss1 * 1024)) -v n="$pairs" 'BEGIN { printf "%.1f", b / n }')" "B per (product, span)" "-" "-" \
      "RSS $((rss1 / 1024)) MiB (before reads $((rss0 / 1024)) MiB) / $pairs (product, span) pairs; cached part $(awk -v b=$(((rss1 - rss0) * 1024)) -v n="$pairs" 'BEGIN { printf "%.1f", b / n }') B/pair"
    ;;
  reads)
    kill "$REDIS" 2>/dev/null || true; wait "$REDIS" 2>/dev/null || true; REDIS=""
    DURATION=$DURATION CONNECTIONS=$CONNECTIONS REQUESTS=$REQUESTS REDIS_PORT=$REDIS_PORT PORT=$PORT \
      "$HERE/rank_lookup.sh" "$BIN" | tee "$WORK/reads.out"
    start_redis
    ;;
  *)
    echo "issue13: unknown section $section" >&2; exit 2
    ;;
  esac
done

echo
echo "## summary ($(date -u +%H:%M:%SZ), load $(cut -d' ' -f1-3 /proc/loadavg))"
cat "$SUMMARY"
