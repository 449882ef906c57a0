#!/usr/bin/env bash
# Reads with Redis serving (issue 3): `GET /top?window=7d&limit=50` from `rankgate serve --redis` vs
# `redis-benchmark ZREVRANGE <the very key rankgate serves> 0 49 WITHSCORES`, in the same run.
#
# 1. writes the seed lesson's workload ending now, ingests it into a fresh data dir;
# 2. serves it with --redis (key prefix servingreads:<pid>:), waits until the 7d window of cat0 is
#    served from Redis (`stale: false`);
# 3. wrk -t1 -c50 on /top (each instance's response cache is refreshed per publication), then
#    redis-benchmark -c50 ZREVRANGE on the served key itself (same members, same scores).
# Environment: PORT (18090), DURATION (10s), REQUESTS (200000). Needs release binaries (cargo build --release).
set -euo pipefail
PORT=${PORT:-18090}
DURATION=${DURATION:-10s}
REQUESTS=${REQUESTS:-200000}
BIN=target/release
WORK=$(mktemp -d)
PREFIX="servingreads:$$:"
cleanup() {
  [ -n "${SERVER:-}" ] && kill "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null || true
  redis-cli --scan --pattern "${PREFIX}*" | xargs -r -n 500 redis-cli UNLINK >/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
"$BIN/gen-workload" seed-lesson --out "$WORK/seed.ndjson" >/dev/null
"$BIN/rankgate" ingest "$WORK/seed.ndjson" --data-dir "$WORK/data" >/dev/null 2>&1
cat > "$WORK/rankgate.toml" <<TOML
redis_prefix = "$PREFIX"
TOML
# --redis needs a token secret kept outside Redis and the data dir (32 random bytes, URL-safe base64).
head -c 32 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n' > "$WORK/token-secret"
"$BIN/rankgate" serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" --config "$WORK/rankgate.toml" \
  --token-secret-file "$WORK/token-secret" --redis redis://127.0.0.1:6379 >"$WORK/serve.log" 2>&1 &
SERVER=$!
URL="http://127.0.0.1:$PORT/v1/categories/cat0/top?window=7d&limit=50"
for _ in $(seq 1 600); do
  if curl -fs "$URL" 2>/dev/null | grep -q '"stale":false'; then break; fi
  sleep 0.1
done
curl -fs "$URL" | grep -q '"stale":false' || { echo "not served from redis"; cat "$WORK/serve.log"; exit 1; }
KEY=$(redis-cli --scan --pattern "${PREFIX}{rk:cat0}:popular:7d:*" | head -1)
echo "# served key $KEY with $(redis-cli ZCARD "$KEY") members; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "## rankgate /top (Redis serving)"
wrk -t1 -c50 -d"$DURATION" --latency "$URL" | grep -E "Requests/sec|50%|99%"
echo "## redis-benchmark ZRANGE on the served key"
redis-benchmark -c 50 -n "$REQUESTS" -q ZRANGE "$KEY" 0 49 WITHSCORES | tr '\r' '\n' | tail -1
