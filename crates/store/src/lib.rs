//! Storage for rankgate: one trait per capability, and the backends that implement them.
//!
//! # Layout
//! - [`clock`]: the `Clock` trait every time-dependent store and worker takes, so tests control time.
//! - [`queue`]: waiting-room state (entries, sequence, tokens, claims), the delayed/retry job queue and the
//!   rate limiter: traits and the embedded backend.
//! - [`ranking`]: the rankings sources of truth (SQLite, PostgreSQL), the in-process ranking engine and the
//!   Redis serving store.
//! - [`redact`]: credentials out of messages: `redact_url` for every connection string shown.
//! - [`synchronous`]: the durability level (`synchronous` pragma) of both embedded SQLite databases.
//! - [`watch_ledger`]: the webhook watches' lease and last reported snapshots (embedded, Redis).
//! - `redis_connection`: one connection type over standalone Redis, Redis Sentinel and Redis Cluster, shared
//!   by the Redis backends.
//! - [`redis_sentinel`]: `redis+sentinel://` URLs (checked here for the `redis` setting) and following the
//!   master the sentinels name.
//! - `sqlite_migration`: numbered `.sql` migrations for both embedded SQLite databases, versioned by
//!   `PRAGMA user_version`.

pub mod clock;
pub mod queue;
pub mod ranking;
pub mod redact;
mod redis_connection;
pub mod redis_sentinel;
mod sqlite_migration;
pub mod synchronous;
pub mod watch_ledger;
