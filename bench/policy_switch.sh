#!/usr/bin/env bash
# The cost of a `popular` policy switch with 30 days retained, on two instances sharing one PostgreSQL
# schema (SPEC 1.3, "Policy versions are shared state"):
#   - switch_ms_a / switch_ms_b: from the PUT through instance A until each instance serves the new
#     `policyVersion` (polled every 20 ms on a cold-on-arrival 30-day window and a daily period);
#   - build_ms_a / build_ms_b: the build of the new version on each instance, as it logs it
#     ("built popular policy version", on the blocking pool; single-threaded, so ~CPU time);
#   - cpu_ms_a / cpu_ms_b: the process CPU (user + system) each instance spent from the PUT until it
#     serves the new version (the build, plus serving the probes);
#   - slowest_probe_ms_a / _b: the slowest probe read meanwhile (a read waits while the build holds the
#     engine's shared lock and a writer, e.g. the refresher, queues behind it).
# Both instances first answer a fixed set of spans (every day of the 30, the four windows, for `all` and
# ten categories), so the build re-scores a realistic cache, not an empty one.
#
# Usage: bench/policy_switch.sh BIN_DIR [SCALE (1.0)] [POSTGRES_URL]
#   BIN_DIR holds `rankgate` and `gen-workload` (target/release). Servers run on CPU 1, this script on 0.
set -euo pipefail
BIN=$1 SCALE=${2:-1.0} PG=${3:-postgres://postgres@127.0.0.1:5432/test}
SCHEMA=bench_policy_$$
WORK=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  psql "$PG" -q -c "SET client_min_messages = warning; DROP SCHEMA IF EXISTS $SCHEMA CASCADE" || true
  rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/rankgate.toml" <<EOF
database = "$PG"
database_schema = "$SCHEMA"
freshness_millis = 1000
EOF

taskset -c 0 "$BIN/gen-workload" seed-lesson --days 30 --scale "$SCALE" --out "$WORK/events.ndjson" >/dev/null
echo "events $(wc -l <"$WORK/events.ndjson")"
start=$(date +%s%N)
taskset -c 1 "$BIN/rankgate" ingest "$WORK/events.ndjson" --config "$WORK/rankgate.toml" \
  --data-dir "$WORK/ingest" >/dev/null 2>&1
echo "ingest_ms $(( ($(date +%s%N) - start) / 1000000 ))"

serve() { # NAME PORT
  taskset -c 1 "$BIN/rankgate" serve --listen "127.0.0.1:$2" --config "$WORK/rankgate.toml" \
    --data-dir "$WORK/$1" >"$WORK/$1.out" 2>"$WORK/$1.log" &
  pids+=($!)
  for _ in $(seq 1 12000); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$2/readyz" || true)" = 200 ] && return 0
    sleep 0.01
  done
  echo "instance $1 not ready" >&2; exit 1
}
serve a 18191; PID_A=${pids[0]}
serve b 18192; PID_B=${pids[1]}

# Warm both caches with the spans a dashboard would read.
categories=$(seq 0 9 | sed 's/^/cat/')
spans=()
for day in $(seq 0 29); do
  spans+=("period=daily&at=$(date -u -d "-$day days" +%Y%m%d)")
done
spans+=("window=1h" "window=1d" "window=7d" "window=30d")
for port in 18191 18192; do
  for category in all $categories; do
    for span in "${spans[@]}"; do
      curl -s -o /dev/null "http://127.0.0.1:$port/v1/categories/$category/top?$span&limit=20"
    done
  done
done

cpu_ms() { # PID: user + system CPU in ms
  awk -v hz="$(getconf CLK_TCK)" '{ print int(($14 + $15) * 1000 / hz) }' "/proc/$1/stat"
}
version_of() { # PORT
  curl -s "http://127.0.0.1:$1/v1/categories/all/top?window=30d&limit=1" | sed -n 's/.*"policyVersion":\([0-9]*\).*/\1/p'
}
poll() { # PORT PID CPU0 OUT: until the port serves version 2, then "ms_since_put cpu_ms max_probe_ms"
  local max=0 t0 t1
  for _ in $(seq 1 30000); do
    t0=$(date +%s%N)
    v=$(version_of "$1")
    t1=$(date +%s%N)
    (( (t1 - t0) / 1000000 > max )) && max=$(( (t1 - t0) / 1000000 ))
    if [ "$v" = 2 ]; then
      echo "$(( (t1 - start) / 1000000 )) $(( $(cpu_ms "$2") - $3 )) $max" >"$4"; return 0
    fi
    sleep 0.02
  done
}
cpu_a0=$(cpu_ms "$PID_A"); cpu_b0=$(cpu_ms "$PID_B")
start=$(date +%s%N)
# Each instance polled on its own, so a probe one instance holds up never delays the other's.
poll 18191 "$PID_A" "$cpu_a0" "$WORK/a.done" & poll_a=$!
poll 18192 "$PID_B" "$cpu_b0" "$WORK/b.done" & poll_b=$!
curl -s -X PUT -H 'content-type: application/json' -d '{"weights":{"view":0.5}}' \
  "http://127.0.0.1:18191/v1/admin/rankers/popular" >/dev/null
wait "$poll_a" "$poll_b"
[ -s "$WORK/a.done" ] && [ -s "$WORK/b.done" ] || { echo "the switch never reached both instances" >&2; exit 1; }
read -r done_a cpu_a max_a <"$WORK/a.done"
read -r done_b cpu_b max_b <"$WORK/b.done"
build() { # NAME: the logged build time of version 2
  sed 's/\x1b\[[0-9;]*m//g' "$WORK/$1.log" | grep 'built popular policy version' | grep -o 'elapsed_ms=[0-9]*' | tail -1 | cut -d= -f2
}
echo "switch_ms_a $done_a"
echo "switch_ms_b $done_b"
echo "build_ms_a $(build a)"
echo "build_ms_b $(build b)"
echo "cpu_ms_a $cpu_a"
echo "cpu_ms_b $cpu_b"
echo "slowest_probe_ms_a $max_a"
echo "slowest_probe_ms_b $max_b"
echo "cached_spans_per_instance $(( (1 + $(echo "$categories" | wc -w)) * ${#spans[@]} ))"
