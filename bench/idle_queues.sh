#!/usr/bin/env bash
# What 1,000 queues cost when nobody waits in them but each holds one READY member (issue 30, item 8):
# their tokens expire in a day, so nothing is due, and the server should do (almost) nothing.
#
#   bench/idle_queues.sh [BIN ...]      (default target/release/rankgate)
#
# For each binary, and for each backend (embedded; Redis at $REDIS, default redis://127.0.0.1:6379, under a
# key prefix of its own, deleted afterwards): starts `rankgate serve` on a fresh data dir, creates $QUEUES
# queues (PUT, tokenTtlSeconds 86400), enters one member in each, waits until every member is READY
# (admitted by the server's own scheduler), lets it settle for $SETTLE s, then reads the server's CPU time
# (utime + stime, /proc/<pid>/stat) over $SECS s and prints it as a share of one core. Environment:
# QUEUES (1000), SECS (60), SETTLE (10), PORT (18190), BACKENDS ("embedded redis"), REDIS.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
QUEUES=${QUEUES:-1000}
SECS=${SECS:-60}
SETTLE=${SETTLE:-10}
PORT=${PORT:-18190}
BACKENDS=${BACKENDS:-embedded redis}
REDIS=${REDIS:-redis://127.0.0.1:6379}
if [ $# -eq 0 ]; then set -- target/release/rankgate; fi
for tool in curl python3; do
  command -v "$tool" >/dev/null || { echo "idle_queues: $tool is not installed" >&2; exit 2; }
done
TICKS=$(getconf CLK_TCK)
WORK=$(mktemp -d)
SERVER=""
PREFIX=""
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  if [ -n "$PREFIX" ] && command -v redis-cli >/dev/null; then
    redis-cli -u "$REDIS" --scan --pattern "${PREFIX}*" | xargs -r -n 500 redis-cli -u "$REDIS" DEL >/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

run() {
  local bin=$1 backend=$2 data="$WORK/data-$RANDOM" base="http://127.0.0.1:$PORT"
  local extra=() config="$WORK/config-$RANDOM.toml"
  cp "$HERE/configs/budget-off.toml" "$config"
  if [ "$backend" = redis ]; then
    PREFIX="rgbench:idle:$$:$RANDOM:"
    # A top-level key: before the file's first table.
    { echo "redis_prefix = \"$PREFIX\""; cat "$HERE/configs/budget-off.toml"; } >"$config"
    extra=(--redis "$REDIS"
      --token-secret "$(head -c 32 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')")
  fi
  "$bin" serve --listen "127.0.0.1:$PORT" --data-dir "$data" --config "$config" \
    "${extra[@]}" >"$WORK/serve.log" 2>&1 &
  SERVER=$!
  until curl -fs "$base/readyz" >/dev/null 2>&1; do
    kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/serve.log" >&2; exit 1; }
    sleep 0.2
  done
  # One keep-alive connection: the set-up should not be what is measured (it is not: it ends first).
  python3 - "$PORT" "$QUEUES" <<'PY'
import http.client, json, sys, time
port, queues = int(sys.argv[1]), int(sys.argv[2])
c = http.client.HTTPConnection("127.0.0.1", port)
def call(method, path, body=None):
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"content-type": "application/json"})
    r = c.getresponse(); data = r.read()
    assert r.status < 300, (method, path, r.status, data)
    return json.loads(data) if data else None
for i in range(queues):
    call("PUT", f"/v1/admin/queues/idle-{i:04d}", {"tokenTtlSeconds": 86400, "claimTtlSeconds": 600})
    call("POST", f"/v1/queues/idle-{i:04d}/entries", {"memberId": "m"})
deadline = time.time() + 120
for i in range(queues):
    while True:
        stats = call("GET", f"/v1/admin/queues/idle-{i:04d}")
        if stats["ready"] == 1 and stats["waiting"] == 0:
            break
        assert time.time() < deadline, f"idle-{i:04d} was not admitted: {stats}"
        time.sleep(0.2)
PY
  sleep "$SETTLE"
  local before after
  before=$(cpu_ticks "$SERVER")
  sleep "$SECS"
  after=$(cpu_ticks "$SERVER")
  awk -v b="$before" -v a="$after" -v t="$TICKS" -v s="$SECS" -v bin="$bin" -v be="$backend" -v q="$QUEUES" \
    'BEGIN { printf "%-45s %-9s %5d queues, 1 READY each, nobody waiting: %5.2f%% of a core (%d ticks in %d s)\n", bin, be, q, 100 * (a - b) / t / s, a - b, s }'
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=""
  if [ -n "$PREFIX" ]; then
    redis-cli -u "$REDIS" --scan --pattern "${PREFIX}*" | xargs -r -n 500 redis-cli -u "$REDIS" DEL >/dev/null
    PREFIX=""
  fi
}

for bin in "$@"; do
  for backend in $BACKENDS; do
    run "$(readlink -f "$bin")" "$backend"
  done
done
