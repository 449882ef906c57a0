#!/usr/bin/env bash
# The project's test command (README): every crate's unit, property, conformance and HTTP tests.
# Needs Redis at 127.0.0.1:6379 and PostgreSQL at 127.0.0.1:5432 (.ci/run starts them).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked "$@"
