#!/usr/bin/env bash
# Kafka consumer throughput vs HTTP ingest, same run, same source of truth (SQLite, default settings), and
# a backlog of N records (default 1,000,000) drained with the lag going to 0 (issue 11).
#
# 1. gen-workload writes the seed lesson's events (scale chosen to give at least N), cut to N lines.
# 2. A private tansu broker (memory storage) on PORT_KAFKA; kafka-ingest produce writes the N events to
#    topic `events` (4 partitions), keyed by product_id, before any consumer runs: a backlog.
# 3. HTTP: a fresh `rankgate serve` takes the same N events through http-ingest (2 connections × 2,000).
# 4. Kafka: a fresh `rankgate serve --kafka` drains the backlog; kafka-ingest drain times it from the first
#    record handled (the group join is not counted) to records = N with lag 0.
# rankgate runs on core 1 (`taskset -c 1`), the broker and the load generators on core 0, so each side has
# a core of its own; rankgate's CPU time per event (user + system, /proc/<pid>/stat) is printed beside
# each rate, and the consumer's pause count from /metrics.
# Prints both rates and their ratio. Usage: bench/kafka-ingest.sh [N]
# Env: BIN_DIR (target/release), TANSU (tansu), PORT_KAFKA (19092), PORT_HTTP (18181), PORT_CONSUMER (18182),
# SERVER_CPU (1), CLIENT_CPU (0), KAFKA_CONFIG (a config file for the consumer's rankgate, e.g. kafka_batch).
set -euo pipefail
N=${1:-1000000}
BIN_DIR=${BIN_DIR:-target/release}
TANSU=${TANSU:-tansu}
PORT_KAFKA=${PORT_KAFKA:-19092} PORT_HTTP=${PORT_HTTP:-18181} PORT_CONSUMER=${PORT_CONSUMER:-18182}
SERVER_CPU=${SERVER_CPU:-1} CLIENT_CPU=${CLIENT_CPU:-0}
# Only in the background (`server … &`): the exec makes $! the server's own pid, for cpu_secs.
server() { exec taskset -c "$SERVER_CPU" "$@"; }
client() { taskset -c "$CLIENT_CPU" "$@"; }
# CPU seconds (user + system, all threads) a process has used so far.
cpu_secs() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }
per_event_us() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN { printf "%.2f", (b - a) * 1e6 / n }'; }
for bin in rankgate kafka-ingest http-ingest gen-workload; do
  [ -x "$BIN_DIR/$bin" ] || { echo "kafka-ingest.sh: build first: cargo build --release -p rankgate -p rankgate-bench" >&2; exit 1; }
done
work=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

wait_ready() {
  for _ in $(seq 1 3000); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/readyz" || true)" = 200 ] && return 0
    sleep 0.02
  done
  echo "kafka-ingest.sh: rankgate on port $1 not ready" >&2; exit 1
}

# The seed lesson has about 4.46 events per sale (views, likes, payments, refunds): scale for N with margin.
scale=$(awk -v n="$N" 'BEGIN { printf "%.3f", n / 200000 / 4.2 }')
client "$BIN_DIR/gen-workload" seed-lesson --scale "$scale" --out "$work/all.ndjson" >/dev/null
head -n "$N" "$work/all.ndjson" > "$work/events.ndjson"
lines=$(wc -l < "$work/events.ndjson")
[ "$lines" -eq "$N" ] || { echo "kafka-ingest.sh: the workload has only $lines events" >&2; exit 1; }
echo "workload: $N events (seed lesson, scale $scale); load: $(cut -d' ' -f1-3 /proc/loadavg)"

client "$TANSU" broker --listener-url "tcp://127.0.0.1:$PORT_KAFKA" --advertised-listener-url "tcp://127.0.0.1:$PORT_KAFKA" \
  --storage-engine memory://tansu/ >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 1 500); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT_KAFKA") 2>/dev/null && break; sleep 0.02; done
client "$BIN_DIR/kafka-ingest" produce "$work/events.ndjson" --kafka "127.0.0.1:$PORT_KAFKA" --topic events --partitions 4

RANKGATE_LOG=warn server "$BIN_DIR/rankgate" serve --listen "127.0.0.1:$PORT_HTTP" --data-dir "$work/http" >/dev/null 2>&1 &
http_pid=$!; pids+=($http_pid)
wait_ready "$PORT_HTTP"
cpu0=$(cpu_secs "$http_pid")
http_line=$(client "$BIN_DIR/http-ingest" "$work/events.ndjson" --url "http://127.0.0.1:$PORT_HTTP" --connections 2 --batch 2000 --max-secs 900)
echo "$http_line; rankgate CPU $(per_event_us "$cpu0" "$(cpu_secs "$http_pid")" "$N") us/event"
kill "$http_pid"; wait "$http_pid" 2>/dev/null || true

config_args=()
[ -n "${KAFKA_CONFIG:-}" ] && config_args=(--config "$KAFKA_CONFIG")
RANKGATE_LOG=warn server "$BIN_DIR/rankgate" serve --listen "127.0.0.1:$PORT_CONSUMER" --data-dir "$work/kafka" \
  --kafka "127.0.0.1:$PORT_KAFKA" --kafka-topic events --kafka-group rankgate-bench "${config_args[@]}" >/dev/null 2>&1 &
kafka_pid=$!; pids+=($kafka_pid)
wait_ready "$PORT_CONSUMER"
cpu0=$(cpu_secs "$kafka_pid")
kafka_line=$(client "$BIN_DIR/kafka-ingest" drain --url "http://127.0.0.1:$PORT_CONSUMER" --records "$N" --max-secs 1800)
pauses=$(curl -s "http://127.0.0.1:$PORT_CONSUMER/metrics" | awk '/^rankgate_kafka_pauses_total/ { print $2 }')
echo "$kafka_line; rankgate CPU $(per_event_us "$cpu0" "$(cpu_secs "$kafka_pid")" "$N") us/record (group join included), pauses ${pauses:-0}"
http_rate=$(sed -n 's/.* = \([0-9]*\) events\/s.*/\1/p' <<<"$http_line")
kafka_rate=$(sed -n 's/.* = \([0-9]*\) records\/s.*/\1/p' <<<"$kafka_line")
awk -v k="$kafka_rate" -v h="$http_rate" 'BEGIN { printf "kafka/http: %.2fx (target >= 0.8x)\n", k / h }'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
