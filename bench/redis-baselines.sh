#!/usr/bin/env bash
# Redis baselines for rankgate's performance targets (issues 2 and 3), measured with redis-benchmark on
# this machine. Prints one line per command: `name requests_per_sec` (details go to stderr).
#
#   ZREVRANGE_0_49_WITHSCORES  top-50 read on a ZSET pre-filled with $MEMBERS members (the /top target)
#   ZREVRANK                   rank of a random existing member (the /rank target)
#   ZADD_NX_QUEUE              ZADD q NX __rand_int__ m:__rand_int__ with -r 1000000 (waiting-room join)
#   ZPOPMIN_QUEUE              ZPOPMIN on that queue (waiting-room admit)
#   ZINCRBY                    ZINCRBY of a random existing member
#   ZINCRBY_P16                the same with -P 16 pipelining (for reference only; not the naive design)
#
# Environment: REDIS_HOST (127.0.0.1), REDIS_PORT (6379), CLIENTS (50), REQUESTS (200000), MEMBERS (20000).
# Uses dedicated keys rgbaseline:<pid>:* and deletes them on exit, even on failure or Ctrl-C.
set -euo pipefail

HOST=${REDIS_HOST:-127.0.0.1}
PORT=${REDIS_PORT:-6379}
CLIENTS=${CLIENTS:-50}
REQUESTS=${REQUESTS:-200000}
MEMBERS=${MEMBERS:-20000}
PREFIX="rgbaseline:$$"
RANK="$PREFIX:rank"
QUEUE="$PREFIX:q"

for tool in redis-cli redis-benchmark awk; do
  command -v "$tool" >/dev/null || { echo "redis-baselines: $tool is not installed" >&2; exit 1; }
done

cli() { redis-cli -h "$HOST" -p "$PORT" "$@"; }

cleanup() { cli DEL "$RANK" "$QUEUE" >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(cli PING 2>/dev/null)" = "PONG" ] || { echo "redis-baselines: no Redis at $HOST:$PORT" >&2; exit 1; }
echo "# redis $(cli INFO server | tr -d '\r' | awk -F: '/^redis_version:/ {print $2}') at $HOST:$PORT," \
  "-c $CLIENTS -n $REQUESTS, $(nproc) cores, $(date -u +%Y-%m-%dT%H:%M:%SZ)" >&2
cleanup

# Pre-fill the ranking key with $MEMBERS members m:000000000000 … (redis-benchmark's __rand_int__ format,
# 12 digits) with random scores, in the Redis protocol through redis-cli --pipe.
prefill=$(awk -v key="$RANK" -v n="$MEMBERS" 'BEGIN {
    srand(1)
    for (i = 0; i < n; i++) {
      m = sprintf("m:%012d", i); s = sprintf("%.4f", rand() * 1000)
      printf "*4\r\n$4\r\nZADD\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", length(key), key, length(s), s, length(m), m
    }
  }' | cli --pipe 2>&1)
case "$prefill" in
  *"errors: 0"*) ;;
  *) echo "redis-baselines: prefill failed: $prefill" >&2; exit 1 ;;
esac
card=$(cli ZCARD "$RANK")
[ "$card" -eq "$MEMBERS" ] || { echo "redis-baselines: prefilled $card members, wanted $MEMBERS" >&2; exit 1; }

# bench NAME [redis-benchmark options and command…]: prints "NAME requests_per_sec".
bench() {
  local name=$1 line rps
  shift
  line=$(redis-benchmark -h "$HOST" -p "$PORT" -c "$CLIENTS" -q "$@" 2>&1 | tr '\r' '\n' \
    | grep 'requests per second' | tail -n 1 || true)
  rps=$(awk '{ for (i = 2; i <= NF; i++) if ($i == "requests") { print $(i - 1); exit } }' <<<"$line")
  if [ -z "$rps" ]; then
    echo "redis-baselines: $name produced no result" >&2
    exit 1
  fi
  echo "#   $name: $line" >&2
  echo "$name $rps"
}

bench ZREVRANGE_0_49_WITHSCORES -n "$REQUESTS" ZREVRANGE "$RANK" 0 49 WITHSCORES
bench ZREVRANK -n "$REQUESTS" -r "$MEMBERS" ZREVRANK "$RANK" 'm:__rand_int__'
bench ZADD_NX_QUEUE -n "$REQUESTS" -r 1000000 ZADD "$QUEUE" NX __rand_int__ 'm:__rand_int__'
queued=$(cli ZCARD "$QUEUE")
bench ZPOPMIN_QUEUE -n "$(( queued < REQUESTS ? queued : REQUESTS ))" ZPOPMIN "$QUEUE"
bench ZINCRBY -n "$REQUESTS" -r "$MEMBERS" ZINCRBY "$RANK" 1 'm:__rand_int__'
bench ZINCRBY_P16 -n "$REQUESTS" -r "$MEMBERS" -P 16 ZINCRBY "$RANK" 1 'm:__rand_int__'
