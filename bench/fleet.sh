#!/usr/bin/env bash
# The fleet's scaling curve (issue 27): 1, 2 and 3 `rankgate serve` instances sharing one PostgreSQL source
# of truth and one Redis serving store, ingesting the seed lesson written as real producers write it (30%
# of ts as RFC 3339, 10% of events without categories, multi-category products), moved so that it ends now
# (every current period and window hot). The file is cut into 2,000-event batches dealt round-robin over
# the instances, one `http-ingest` per instance, all at once; the clock stops when every instance serves
# the same `all` daily top list twice in a row, 300 ms apart, not stale. Meanwhile a reader (core 0) asks
# every instance in turn, once a second, for the top 20 of `all` and of every category, daily and over 7
# days: a shop whose home and category pages are all being read (READ_SPANS="" reads nothing).
#
#   bench/fleet.sh [BIN_DIR]   (default target/release; needs rankgate, gen-workload, http-ingest)
#
# Instances (and the private redis-server) run on core 1, the load on core 0. PostgreSQL is the machine's
# service (POSTGRES), not pinned; its CPU is the sum over every `postgres` process, so run nothing else.
# Per fleet size it prints events/s and CPU µs per fleet event of each instance, of Redis and of
# PostgreSQL (utime + stime from /proc/<pid>/stat over the whole run, convergence included), then the
# naive per-event Lua design's rate measured in the same run, two ways: bench/naive-event.lua under
# redis-benchmark -c 50 (random ids), and naive-redis replaying the same events over 8 connections.
#
# Environment: FLEETS ("1 2 3"), SCALE (0.27: about 240,000 events), DEPTH (unset: full serving; N for
# Top-N-only), PORT (18140), REDIS_PORT (16392), POSTGRES (postgres://postgres@127.0.0.1:5432/test),
# NAIVE (1: also run the naive baseline), KEEP (keep the work dir), EXTRA_CONFIG (a TOML appended to the
# instances' config), DEAL_DETAIL (set: also print each span group's measured cost and holder).
# After each fleet it prints each publisher's span groups and its share of their measured cost.
set -euo pipefail
BIN=$(readlink -f "${1:-target/release}")
FLEETS=${FLEETS:-1 2 3}
SCALE=${SCALE:-0.27}
PORT=${PORT:-18140}
REDIS_PORT=${REDIS_PORT:-16392}
POSTGRES=${POSTGRES:-postgres://postgres@127.0.0.1:5432/test}
NAIVE=${NAIVE:-1}
READ_SPANS=${READ_SPANS-period=daily window=7d}
HERE=$(cd "$(dirname "$0")" && pwd)
for tool in rankgate gen-workload http-ingest; do
  [ -x "$BIN/$tool" ] || { echo "fleet: $BIN/$tool is missing (cargo build --release -p rankgate -p rankgate-bench)" >&2; exit 2; }
done
for tool in redis-server redis-cli redis-benchmark psql taskset curl python3; do
  command -v "$tool" >/dev/null || { echo "fleet: $tool is not installed" >&2; exit 2; }
done
WORK=$(mktemp -d)
PIDS=()
REDIS=""
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  [ -n "$REDIS" ] && { kill "$REDIS" 2>/dev/null || true; wait "$REDIS" 2>/dev/null || true; }
  for schema in $(cat "$WORK/schemas" 2>/dev/null); do psql -q "$POSTGRES" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true; done
  if [ -n "${KEEP:-}" ]; then echo "# work dir kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
HZ=$(getconf CLK_TCK)
cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }
per_unit() { awk -v t="$1" -v n="$2" -v hz="$HZ" 'BEGIN { printf "%.2f", (n > 0 ? t / hz * 1e6 / n : 0) }'; }
# Every postgres process's CPU (the server's backends live as long as the instances' pools).
postgres_ticks() {
  local total=0 pid
  for pid in $(pgrep -x postgres || true); do total=$((total + $(cpu_ticks "$pid" 2>/dev/null || echo 0))); done
  echo "$total"
}

taskset -c 1 redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 &
REDIS=$!
for _ in $(seq 1 100); do [ "$(redis-cli -p "$REDIS_PORT" PING 2>/dev/null)" = PONG ] && break; sleep 0.1; done

"$BIN/gen-workload" seed-lesson --scale "$SCALE" --rfc3339-share 0.3 --uncategorized-share 0.1 \
  --out "$WORK/events.ndjson" 2>"$WORK/gen.log"
EVENTS=$(wc -l <"$WORK/events.ndjson")
: >"$WORK/config.toml"
# EXTRA_CONFIG holds top-level keys, so it goes before the first table.
[ -n "${EXTRA_CONFIG:-}" ] && cat "$EXTRA_CONFIG" >>"$WORK/config.toml"
cat >>"$WORK/config.toml" <<'EOF'
[waiting_room]
entries_per_address_per_minute = 0
EOF
# The waiting room on Redis needs a secret shared by the instances (unused here, but required).
head -c 32 /dev/urandom | basenc --base64url >"$WORK/token-secret"

echo "# fleet run $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); rankgate $(git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "# $EVENTS events ($(cat "$WORK/gen.log")); serving ${DEPTH:+Top-$DEPTH-only}${DEPTH:-full}; instances and redis on core 1, load on core 0"
echo
echo "| instances | events/s | CPU µs per fleet event, by instance | busiest instance | Redis µs/event | PostgreSQL µs/event | converged after |"
echo "|---|---|---|---|---|---|---|"
for fleet in $FLEETS; do
  redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
  schema="fleet_$$_$fleet"
  echo "$schema" >>"$WORK/schemas"
  PIDS=()
  for i in $(seq 1 "$fleet"); do
    port=$((PORT + i))
    taskset -c 1 "$BIN/rankgate" serve --listen "127.0.0.1:$port" --data-dir "$WORK/data-$fleet-$i" \
      --config "$WORK/config.toml" --database "$POSTGRES" --database-schema "$schema" \
      --redis "redis://127.0.0.1:$REDIS_PORT" --token-secret-file "$WORK/token-secret" ${DEPTH:+--serving-depth "$DEPTH"} >"$WORK/server-$fleet-$i.log" 2>&1 &
    PIDS+=($!)
  done
  for i in $(seq 1 "$fleet"); do
    for _ in $(seq 1 3000); do
      [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((PORT + i))/readyz" || true)" = 200 ] && break
      kill -0 "${PIDS[$((i - 1))]}" 2>/dev/null || { echo "fleet: instance $i exited:" >&2; cat "$WORK/server-$fleet-$i.log" >&2; exit 1; }
      sleep 0.02
    done
  done
  # Deal 2,000-event batches round-robin.
  awk -v n="$fleet" -v dir="$WORK" '{ print > (dir "/part-" (int((NR - 1) / 2000) % n + 1) ".ndjson") }' "$WORK/events.ndjson"
  sleep 1
  before=()
  for pid in "${PIDS[@]}"; do before+=("$(cpu_ticks "$pid")"); done
  r0=$(cpu_ticks "$REDIS")
  p0=$(postgres_ticks)
  start=$(date +%s%N)
  loads=()
  for i in $(seq 1 "$fleet"); do
    taskset -c 0 "$BIN/http-ingest" "$WORK/part-$i.ndjson" --url "http://127.0.0.1:$((PORT + i))" \
      --connections 1 --batch 2000 --max-secs 600 >"$WORK/ingest-$fleet-$i.out" 2>&1 &
    loads+=($!)
  done
  reader=""
  if [ -n "$READ_SPANS" ]; then
    taskset -c 0 python3 - "$fleet" "$PORT" $READ_SPANS <<'EOF' >"$WORK/reader-$fleet.out" 2>&1 &
import sys, time, urllib.request
fleet, port, spans = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
categories = ["all"] + [f"cat{n}" for n in range(50)]
reads = 0
while True:
    started = time.time()
    for n, category in enumerate(categories):
        for span in spans:
            url = f"http://127.0.0.1:{port + 1 + (reads % fleet)}/v1/categories/{category}/top?{span}&limit=20"
            urllib.request.urlopen(url, timeout=10).read()
            reads += 1
    print(reads, flush=True)
    time.sleep(max(0.0, 1.0 - (time.time() - started)))
EOF
    reader=$!
  fi
  for pid in "${loads[@]}"; do wait "$pid" || { echo "fleet: http-ingest failed" >&2; cat "$WORK"/ingest-"$fleet"-*.out >&2; exit 1; }; done
  ingested=$(date +%s%N)
  [ -n "$reader" ] && { kill "$reader" 2>/dev/null || true; wait "$reader" 2>/dev/null || true; }
  urls=()
  for i in $(seq 1 "$fleet"); do urls+=("http://127.0.0.1:$((PORT + i))/v1/categories/all/top?period=daily&limit=20"); done
  converged=$(taskset -c 0 python3 - "${urls[@]}" <<'EOF'
import json, sys, time, urllib.request
urls = sys.argv[1:]
def body(url):
    with urllib.request.urlopen(url, timeout=10) as answer:
        page = json.load(answer)
    if page.get("stale"):
        return None
    return json.dumps(page.get("items"), sort_keys=True)
deadline = time.time() + 300
first = None
while time.time() < deadline:
    seen = [body(url) for url in urls]
    if all(seen) and len(set(seen)) == 1:
        if first is not None and first[1] == seen[0]:
            print(f"{first[0]:.6f}")
            sys.exit(0)
        first = (time.time(), seen[0])
        time.sleep(0.3)
    else:
        first = None
        time.sleep(0.02)
print("never", file=sys.stderr)
sys.exit(1)
EOF
) || { echo "fleet: the instances did not converge within 300 s" >&2; exit 1; }
  stop_ns=$(python3 -c "print(int($converged * 1e9))")
  elapsed=$(awk -v a="$start" -v b="$stop_ns" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')
  cpus=()
  busiest=0
  for i in $(seq 1 "$fleet"); do
    ticks=$(($(cpu_ticks "${PIDS[$((i - 1))]}") - ${before[$((i - 1))]}))
    cpus+=("$(per_unit "$ticks" "$EVENTS")")
    [ "$ticks" -gt "$busiest" ] && busiest=$ticks
  done
  r1=$(cpu_ticks "$REDIS")
  p1=$(postgres_ticks)
  accepted=$(cat "$WORK"/ingest-"$fleet"-*.out | sed -nE 's/.*accepted ([0-9]+).*/\1/p' | awk '{ s += $1 } END { print s }')
  [ "$accepted" = "$EVENTS" ] || { echo "fleet: accepted $accepted of $EVENTS events" >&2; cat "$WORK"/ingest-"$fleet"-*.out >&2; exit 1; }
  printf '| %s | %s | %s | %s | %s | %s | %s s after the last post |\n' "$fleet" \
    "$(awk -v n="$EVENTS" -v s="$elapsed" 'BEGIN { printf "%.0f", n / s }')" "$(IFS=/; echo "${cpus[*]}")" \
    "$(per_unit "$busiest" "$EVENTS")" "$(per_unit $((r1 - r0)) "$EVENTS")" "$(per_unit $((p1 - p0)) "$EVENTS")" \
    "$(awk -v a="$ingested" -v b="$stop_ns" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')"
  for i in $(seq 1 "$fleet"); do
    curl -s "http://127.0.0.1:$((PORT + i))/metrics" | awk -v i="$i" '/^rankgate_serving_(writes|calls|rebuilds)_total/ { printf "#   instance %s: %s %s\n", i, $1, $2 }' >>"$WORK/serving-$fleet.txt"
  done
  # How the span groups were dealt at the end: each publisher's groups and its share of their measured cost.
  deal=$(redis-cli -p "$REDIS_PORT" --scan --pattern '*{rk}:deal' | head -1)
  if [ -n "$deal" ]; then
    python3 - "$REDIS_PORT" "$deal" "${deal%deal}group-cost" >>"$WORK/serving-$fleet.txt" <<'EOF'
import subprocess, sys
port, deal, cost = sys.argv[1:]
def hash_of(key):
    out = subprocess.run(["redis-cli", "-p", port, "HGETALL", key], capture_output=True, text=True).stdout.split("\n")
    return dict(zip(out[0::2], out[1::2]))
owners, costs = hash_of(deal), hash_of(cost)
loads = {}
for field, owner in owners.items():
    if field.startswith("g") and field[1:].isdigit():
        groups, load = loads.get(owner, (0, 0))
        loads[owner] = (groups + 1, load + int(costs.get(field, 0)))
total = sum(load for _, load in loads.values()) or 1
for owner, (groups, load) in sorted(loads.items()):
    print(f"#   deal: {owner} holds {groups} groups, {100 * load / total:.1f}% of the measured cost")
if __import__("os").environ.get("DEAL_DETAIL"):
    print("#   groups: " + " ".join(f"g{g}={owners.get(f'g{g}', '-')[:4]}:{costs.get(f'g{g}', 0)}" for g in range(36)))
EOF
  fi
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  PIDS=()
  rm -f "$WORK"/part-*.ndjson
done

echo
echo "# Redis publication per instance (writes = sorted-set and detail entries written, calls = script calls):"
cat "$WORK"/serving-*.txt 2>/dev/null || true
if [ "$NAIVE" = 1 ]; then
  redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
  sha=$(redis-cli -p "$REDIS_PORT" SCRIPT LOAD "$(cat "$HERE/naive-event.lua")")
  r0=$(cpu_ticks "$REDIS")
  line=$(taskset -c 0 redis-benchmark -p "$REDIS_PORT" -c 50 -n 300000 --csv -r 1000000000 EVALSHA "$sha" 2 naive:seen naive: __rand_int__ | tail -1 | tr -d '"')
  r1=$(cpu_ticks "$REDIS")
  echo
  echo "naive per-event Lua (redis-benchmark -c 50 EVALSHA bench/naive-event.lua): $(cut -d, -f2 <<<"$line") events/s, redis $(per_unit $((r1 - r0)) 300000) µs/event"
  if [ -x "$BIN/naive-redis" ]; then
    # The same design replaying this run's events (the seed lesson at SCALE), 8 connections.
    redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
    r0=$(cpu_ticks "$REDIS")
    line=$(taskset -c 0 "$BIN/naive-redis" --redis "redis://127.0.0.1:$REDIS_PORT" --scale "$SCALE" --connections 8 --no-coalesced 2>&1 | grep "^naive connections=8")
    r1=$(cpu_ticks "$REDIS")
    echo "naive per-event Lua replaying these events (naive-redis, 8 connections): $(sed -E 's/.* = ([0-9.]+) events\/s.*/\1/' <<<"$line") events/s, redis $(per_unit $((r1 - r0)) "$EVENTS") µs/event"
  fi
fi
