#!/usr/bin/env bash
# Proof-of-work solve times in Chromium (issue 28, BENCHMARKS.md "Entry challenges"): a release
# `rankgate serve` on core 1, headless Chromium on core 0 running the waiting page's own Web Worker on
# fresh challenges at difficulties 12–22; each solution is then entered, so the server checks every one.
# Prints `difficulty solves median_ms p90_ms mean_hashes accepted`.
#
# Needs: a release build (cargo build --release), chromium, node with crates/server/tests/browser's
# node_modules (npm ci there). Usage: bench/pow_browser.sh [bin_dir]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${1:-$ROOT/target/release}"
PORT=$((20000 + RANDOM % 20000))
WORK="$(mktemp -d)"
trap 'kill "${SERVER:-}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
cat >"$WORK/rankgate.toml" <<TOML
[waiting_room]
# Every solution comes from 127.0.0.1: the per-address budget would stop the run, not the work.
entries_per_address_per_minute = 0
TOML
taskset -c 1 "$BIN/rankgate" serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" --config "$WORK/rankgate.toml" \
  >"$WORK/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
echo "# rankgate $(git -C "$ROOT" rev-parse --short HEAD); $(/usr/bin/chromium --version 2>/dev/null | head -1); server on core 1, Chromium on core 0"
echo "# difficulty solves median_ms p90_ms mean_hashes accepted"
cd "$ROOT/crates/server/tests/browser"
taskset -c 0 node pow_solve_times.mjs "http://127.0.0.1:$PORT" bench \
  "12,14,16,18,20,22" "${SOLVES:-40,40,40,30,20,12}"
