//! Test support shared by more than one crate's tests: private servers on spare ports for tests, and
//! cleanup for the shared ones, so a test never touches the shared servers' data beyond its own keys and
//! schemas.
//!
//! # Layout
//! - [`redis_servers`]: `redis-server` processes this test binary starts on spare ports (a 3-node Cluster
//!   among them), each under a watchdog that stops it however the binary ends; unique key prefixes on the
//!   shared standalone server, and their cleanup.
//! - [`postgres_schemas`]: one schema per test on the shared PostgreSQL, dropped when the test ends.
//! - [`mariadb`]: where the shared MariaDB is.
//!
//! The shared servers are the machine's on their default ports, unless `RANKGATE_TEST_REDIS`,
//! `RANKGATE_TEST_POSTGRES` or `RANKGATE_TEST_MARIADB` name others: `scripts/test.sh` starts private servers
//! on spare ports when the machine's are not running, and sets them.
//!
//! Support that only one crate's tests use stays in that crate's `tests/` (the server's `spawn_app()` is
//! in `crates/server/tests/support/`). This crate is a `[dev-dependency]` only: no library depends on it.
//!
//! ```no_run
//! use rankgate_testkit::redis_servers::{cluster, unique_prefix, KeyCleanup};
//!
//! let nodes = cluster().urls.clone(); // started once per test binary, on spare ports
//! let prefix = unique_prefix();
//! let _cleanup = KeyCleanup { nodes: nodes.clone(), prefix: prefix.clone() };
//! // … the test writes only keys under `prefix` …
//! ```

pub mod mariadb;
pub mod postgres_schemas;
pub mod redis_servers;
