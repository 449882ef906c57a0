#!/usr/bin/env bash
# Before/after throughput of two rankgate binaries in ONE run (issue 9: the hardening must not cost ingest
# or read throughput). For each repetition, each binary in turn (before, after, before, after, …):
#
#   1. a fresh data dir; `taskset -c $SERVER_CPU rankgate serve`; wait for /readyz;
#   2. (a) HTTP ingest: `taskset -c $LOAD_CPU http-ingest` of the seed-lesson workload (ending now), ONE
#      connection, 2,000-event batches: durable events/s;
#   3. (b) reads on what was just ingested, `taskset -c $LOAD_CPU wrk -t1 -c50 -d$DURATION`:
#      `GET /v1/categories/cat0/top?window=7d&limit=50` and `GET /v1/products/p<random>/rank?category=all&window=7d`
#      (bench/rank-random.lua): req/s;
#   4. for each of (a) and (b), the server's CPU time (utime + stime from /proc/<pid>/stat, before and after)
#      divided by the events or requests it served.
#
# Prints one line per measurement, then the medians of the repetitions and the after/before ratios.
#
# Usage: bench/hardening.sh BEFORE_BIN AFTER_BIN
#   e.g. git worktree add /tmp/before 806eeb6 && (cd /tmp/before && cargo build --release -p rankgate)
#        bench/hardening.sh /tmp/before/target/release/rankgate target/release/rankgate
# Environment:
#   REPS (3), DURATION (10s), SCALE (1.0: 200k sales over 14 days, ~892k events), PORT (18190),
#   SERVER_CPU (1), LOAD_CPU (0), TOOLS (target/release: gen-workload and http-ingest),
#   KEEP (unset: delete the work dir; set: keep it and print its path).
# Every RANKGATE_* variable exported by the caller reaches both servers (e.g. RANKGATE_SQLITE_SYNCHRONOUS=normal
# to compare at the old durability level; a binary that does not know a variable ignores it).
set -euo pipefail
[ $# -eq 2 ] || { sed -n '2,26p' "$0" >&2; exit 2; }
BEFORE=$(readlink -f "$1")
AFTER=$(readlink -f "$2")
REPS=${REPS:-3}
DURATION=${DURATION:-10s}
SCALE=${SCALE:-1.0}
PORT=${PORT:-18190}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
TOOLS=${TOOLS:-target/release}
HERE=$(cd "$(dirname "$0")" && pwd)
for tool in "$BEFORE" "$AFTER" "$TOOLS/gen-workload" "$TOOLS/http-ingest"; do
  [ -x "$tool" ] || { echo "hardening.sh: $tool is not an executable (cargo build --release -p rankgate -p rankgate-bench)" >&2; exit 2; }
done
command -v wrk >/dev/null || { echo "hardening.sh: needs wrk (apt-get install -y wrk)" >&2; exit 2; }
WORK=$(mktemp -d)
SERVER=""
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  if [ -n "${KEEP:-}" ]; then echo "# work dir kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
TICKS=$(getconf CLK_TCK)
BASE="http://127.0.0.1:$PORT"
TOP="$BASE/v1/categories/cat0/top?window=7d&limit=50"

# utime + stime of a process, in clock ticks (the fields after the parenthesised command name).
cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
# CPU microseconds per unit: cpu_us TICKS_BEFORE TICKS_AFTER UNITS
cpu_us() { awk -v a="$1" -v b="$2" -v n="$3" -v t="$TICKS" 'BEGIN { printf "%.2f", (n > 0 ? (b - a) * 1e6 / t / n : 0) }'; }

start_server() { # BIN DATA_DIR
  taskset -c "$SERVER_CPU" "$1" serve --listen "127.0.0.1:$PORT" --data-dir "$2" >"$2.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 3000); do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/readyz" || true)" = 200 ]; then return 0; fi
    kill -0 "$SERVER" 2>/dev/null || { echo "hardening.sh: $1 exited:" >&2; cat "$2.log" >&2; exit 1; }
    sleep 0.02
  done
  echo "hardening.sh: $1 not ready after 60 s" >&2
  exit 1
}

stop_server() {
  kill "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  SERVER=""
}

# wrk_run NAME URL [wrk args…]: prints "req/s requests"; fails on non-2xx answers or socket errors.
wrk_run() {
  local out
  out=$(taskset -c "$LOAD_CPU" wrk -t1 -c50 -d"$DURATION" "${@:2}" "$1")
  if grep -qE "Non-2xx|Socket errors" <<<"$out"; then
    echo "hardening.sh: wrk saw errors on $1:" >&2
    echo "$out" >&2
    exit 1
  fi
  local rps requests
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  requests=$(awk '/requests in/ {print $1}' <<<"$out")
  echo "$rps $requests"
}

"$TOOLS/gen-workload" seed-lesson --scale "$SCALE" --out "$WORK/seed.ndjson" >/dev/null 2>&1
EVENTS=$(wc -l <"$WORK/seed.ndjson")
echo "# hardening before/after: $EVENTS events (seed lesson, scale $SCALE), $REPS reps, wrk -t1 -c50 -d$DURATION"
echo "# before: $BEFORE"
echo "# after:  $AFTER"
echo "# server on cpu $SERVER_CPU, load generators on cpu $LOAD_CPU; $(nproc) cpus; load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-3s %12s %10s %12s %10s %12s %10s\n' side rep ingest_ev/s us/event top_req/s us/req rank_req/s us/req
RESULTS="$WORK/results"
: >"$RESULTS"
for rep in $(seq 1 "$REPS"); do
  for side in before after; do
    if [ "$side" = before ]; then bin=$BEFORE; else bin=$AFTER; fi
    dir="$WORK/data-$side-$rep"
    start_server "$bin" "$dir"
    # (a) ingest, one connection.
    c0=$(cpu_ticks "$SERVER")
    line=$(taskset -c "$LOAD_CPU" "$TOOLS/http-ingest" "$WORK/seed.ndjson" --url "$BASE" --connections 1 --batch 2000)
    c1=$(cpu_ticks "$SERVER")
    ingest=$(sed -E 's/.* = ([0-9.]+) events\/s.*/\1/' <<<"$line")
    ingest_us=$(cpu_us "$c0" "$c1" "$EVENTS")
    # (b) reads: one warm-up request each, so the first build of a span is not in the figure.
    curl -fs "$TOP" >/dev/null
    curl -fs "$BASE/v1/products/p1/rank?category=all&window=7d" >/dev/null
    c0=$(cpu_ticks "$SERVER")
    read -r top top_n <<<"$(wrk_run "$TOP")"
    c1=$(cpu_ticks "$SERVER")
    top_us=$(cpu_us "$c0" "$c1" "$top_n")
    c0=$(cpu_ticks "$SERVER")
    read -r rank rank_n <<<"$(wrk_run "$BASE" -s "$HERE/rank-random.lua")"
    c1=$(cpu_ticks "$SERVER")
    rank_us=$(cpu_us "$c0" "$c1" "$rank_n")
    stop_server
    rm -rf "$dir"
    printf '%-6s %-3s %12s %10s %12s %10s %12s %10s\n' "$side" "$rep" "$ingest" "$ingest_us" "$top" "$top_us" "$rank" "$rank_us"
    echo "$side $ingest $ingest_us $top $top_us $rank $rank_us" >>"$RESULTS"
  done
done

# Medians per side and column, then after/before.
median() { sort -g | awk '{v[NR] = $1} END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo
echo "## medians of $REPS (after/before: >1 is more throughput, or more CPU per unit)"
printf '%-24s %12s %12s %8s\n' measure before after ratio
col=2
for name in "ingest events/s" "ingest CPU us/event" "top req/s" "top CPU us/req" "rank req/s" "rank CPU us/req"; do
  b=$(awk -v c=$col '$1 == "before" {print $c}' "$RESULTS" | median)
  a=$(awk -v c=$col '$1 == "after" {print $c}' "$RESULTS" | median)
  ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }')
  printf '%-24s %12s %12s %7sx\n' "$name" "$b" "$a" "$ratio"
  col=$((col + 1))
done
