#!/usr/bin/env bash
# Entry rate of two builds in one run (issue 29: "entry with a ticket stays within 10% of today's rate on
# both backends"): for each backend (embedded, and Redis: a private redis-server), the two builds are
# started in turn (`taskset -c 1`, with the private redis-server on the same core), wrk enters distinct
# members for $DURATION (`taskset -c 0`, bench/queue-enter.lua, -c 10, after a 3 s warm-up), $ROUNDS
# rounds alternating A and B. Prints each run's rate and rankgate's CPU per entry (utime + stime from
# /proc/<pid>/stat), then the medians and B / A.
#
#   bench/entry_rate_pair.sh A_BIN_DIR[:CONFIG] B_BIN_DIR[:CONFIG]   (each holding a release `rankgate`)
#
# A config, when given, is passed as `--config` (issue 28: bench/configs/budget-off.toml and
# budget-on.toml compare an entry with and without the per-address budget in the same build). Without
# one, the per-address budget is off (bench/configs/budget-off.toml): wrk enters from one address.
# Environment: DURATION (10s), ROUNDS (3), PORT (18240), REDIS_PORT (16393), BACKENDS ("embedded redis"),
# XFF (set: each entry carries its own X-Forwarded-For address, see bench/queue-enter.lua).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
split() { # split BIN_DIR[:CONFIG] → "bin_dir config"
  local bin=${1%%:*} config=${1#*:}
  [ "$config" = "$1" ] && config="$HERE/configs/budget-off.toml"
  echo "$(readlink -f "$bin") $(readlink -f "$config")"
}
read -r A A_CONFIG <<<"$(split "$1")"
read -r B B_CONFIG <<<"$(split "$2")"
DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-18240}
REDIS_PORT=${REDIS_PORT:-16393}
BACKENDS=${BACKENDS:-embedded redis}
for tool in wrk redis-server redis-cli taskset curl awk; do
  command -v "$tool" >/dev/null || { echo "entry_rate_pair: $tool is not installed" >&2; exit 2; }
done
WORK=$(mktemp -d)
SERVER=""
REDIS=""
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  if [ -n "$REDIS" ]; then kill "$REDIS" 2>/dev/null || true; wait "$REDIS" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
HZ=$(getconf CLK_TCK)
cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }
BASE="http://127.0.0.1:$PORT"
head -c 32 /dev/urandom | base64 | tr '+/' '-_' >"$WORK/token.secret"

run() { # run BACKEND LABEL BIN ROUND CONFIG
  local backend=$1 label=$2 bin=$3 round=$4 config=$5
  local flags=(--config "$config") dir="$WORK/$1-$2-$4"
  if [ "$backend" = redis ]; then
    redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
    flags+=(--redis "redis://127.0.0.1:$REDIS_PORT" --token-secret-file "$WORK/token.secret")
  fi
  taskset -c 1 "$bin/rankgate" serve --listen "127.0.0.1:$PORT" --data-dir "$dir" "${flags[@]}" >"$dir.log" 2>&1 &
  SERVER=$!
  until curl -fs "$BASE/readyz" >/dev/null 2>&1; do
    kill -0 "$SERVER" 2>/dev/null || { cat "$dir.log" >&2; exit 1; }
    sleep 0.2
  done
  curl -fs -X PUT "$BASE/v1/admin/queues/bench" -H 'content-type: application/json' -d '{"paused":true}' >/dev/null
  QB_PREFIX=warm taskset -c 0 wrk -t1 -c10 -d3s -s "$HERE/queue-enter.lua" "$BASE" >/dev/null
  local before out after rate requests
  before=$(cpu_ticks "$SERVER")
  out=$(QB_PREFIX="r$round" taskset -c 0 wrk -t1 -c10 -d"$DURATION" -s "$HERE/queue-enter.lua" "$BASE")
  after=$(cpu_ticks "$SERVER")
  grep -q "Non-2xx" <<<"$out" && { echo "entry_rate_pair: wrk saw errors" >&2; echo "$out" >&2; exit 1; }
  rate=$(awk '/Requests\/sec/ { print $2 }' <<<"$out")
  requests=$(awk '/requests in/ { print $1 }' <<<"$out")
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=""
  awk -v b="$backend" -v l="$label" -v r="$rate" -v t=$((after - before)) -v n="$requests" -v hz="$HZ" \
    'BEGIN { printf "%s %s %.0f %.2f\n", b, l, r, t / hz * 1e6 / n }' | tee -a "$WORK/results"
}

for backend in $BACKENDS; do
  if [ "$backend" = redis ]; then
    taskset -c 1 redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
    REDIS=$!
    until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.1; done
  fi
  for round in $(seq 1 "$ROUNDS"); do
    run "$backend" A "$A" "$round" "$A_CONFIG"
    run "$backend" B "$B" "$round" "$B_CONFIG"
  done
  if [ -n "$REDIS" ]; then kill "$REDIS"; wait "$REDIS" 2>/dev/null || true; REDIS=""; fi
done
echo "# backend: median entries/s A, B (B/A); median rankgate CPU µs per entry A, B"
for backend in $BACKENDS; do
  awk -v b="$backend" '
    function median(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    $1 == b && $2 == "A" { ra[++na] = $3; ca[na] = $4 }
    $1 == b && $2 == "B" { rb[++nb] = $3; cb[nb] = $4 }
    END { x = median(ra, na); y = median(rb, nb); printf "%s: %.0f, %.0f (%.3fx); %.2f, %.2f us\n", b, x, y, y / x, median(ca, na), median(cb, nb) }' "$WORK/results"
done
