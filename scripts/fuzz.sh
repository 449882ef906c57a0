#!/usr/bin/env bash
# Fuzzes rankgate's parsers with cargo-fuzz (libFuzzer): the ingest body (event_body), the read API's
# parameters through the real router (read_params), period keys (period_key), identifiers (ids) and the
# config file (config_file), the entry guards' client address and challenge check (entry_guard). See fuzz/fuzz_targets/*.rs for what each asserts.
#
#   scripts/fuzz.sh            # CI: ~10 s per target
#   scripts/fuzz.sh 600        # a longer run: 10 minutes per target
#   scripts/fuzz.sh 60 ids     # one target (or several) for a minute
#
# Needs cargo-fuzz and, preferably, the nightly toolchain (`rustup toolchain install nightly --profile minimal`,
# `cargo install cargo-fuzz --locked`; .ci/run installs both when missing). Each target starts from its
# committed seeds in fuzz/corpus/<target>/ and grows a scratch corpus in fuzz/target/corpus/<target>/
# (kept between runs, never committed). A crash stops the run: the input is saved in
# fuzz/artifacts/<target>/ and `cargo +nightly fuzz run <target> <that file>` replays it. A crash found
# becomes a regression test in the crate that owns the code.
#
# The build goes to $RANKGATE_FUZZ_TARGET_DIR (default /var/tmp/rankgate-fuzz-target), outside the work
# tree, so every clone on a machine (CI's included) shares one nightly build instead of starting cold.
#
# Built without a sanitizer (`-s none`): the project forbids `unsafe`, so what the fuzzer hunts is panics
# (overflow checks and debug assertions are on) and broken properties, and the build is several times
# faster than with AddressSanitizer.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds="${1:-10}"
shift || true
targets=("$@")
target_dir="${RANKGATE_FUZZ_TARGET_DIR:-/var/tmp/rankgate-fuzz-target}"
if [ ${#targets[@]} -eq 0 ]; then
  targets=(event_body read_params period_key ids config_file entry_guard)
fi

# cargo fuzz passes nightly-only flags to rustc. Use the nightly toolchain when the machine has one; else the
# stable one with RUSTC_BOOTSTRAP=1 (accepted by stable rustc for exactly this), since a fresh machine that
# reaches only the package registries cannot download a toolchain.
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  toolchain=+nightly
else
  toolchain=+stable
  export RUSTC_BOOTSTRAP=1
  target_dir="$target_dir-stable"
fi

echo "== cargo fuzz build (${targets[*]}) with ${toolchain#+}"
cargo "$toolchain" fuzz build -s none --target-dir "$target_dir"

for target in "${targets[@]}"; do
  scratch="target/corpus/$target"
  mkdir -p "$scratch" "artifacts/$target"
  echo "== fuzz $target for ${seconds}s"
  # The scratch corpus comes first: libFuzzer writes new inputs into the first directory only, so the
  # committed seeds stay as they are. -timeout: one input taking 30 s is a hang, reported as a crash.
  # -rss_limit_mb: one process over 2 GB is a leak or an unbounded cache, also a crash.
  log="target/fuzz-$target.log"
  if ! cargo "$toolchain" fuzz run -s none --target-dir "$target_dir" "$target" "$scratch" "corpus/$target" -- \
    -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz target $target FAILED; the input is in fuzz/artifacts/$target/ (full log: fuzz/$log)" >&2
    exit 1
  fi
  # The summary: executions, coverage and corpus size at the end.
  grep -E '^(#[0-9]+\s+DONE|Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" || tail -n 3 "$log"
done
echo "fuzz: ${#targets[@]} targets ran ${seconds}s each without a crash"
