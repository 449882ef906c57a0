#!/usr/bin/env bash
# Time `rankgate serve` on an existing data dir from process start to the first `GET /readyz` 200, that is
# the rebuild of serving state from the source of truth (SQLite). Prints "restart_ms <n>" and stops the
# server. Usage: bench/restart.sh RANKGATE_BIN DATA_DIR [PORT (18090)]
set -euo pipefail
BIN=$1 DIR=$2 PORT=${3:-18090}
[ -d "$DIR" ] || { echo "restart.sh: no data dir $DIR" >&2; exit 1; }
start=$(date +%s%N)
"$BIN" serve --listen "127.0.0.1:$PORT" --data-dir "$DIR" >/dev/null 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 6000); do   # at most ~60 s
  if [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/readyz" || true)" = 200 ]; then
    echo "restart_ms $(( ($(date +%s%N) - start) / 1000000 ))"
    exit 0
  fi
  kill -0 "$pid" 2>/dev/null || { echo "restart.sh: server exited" >&2; exit 1; }
  sleep 0.01
done
echo "restart.sh: not ready after 60 s" >&2
exit 1
