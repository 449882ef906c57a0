//! Rankings storage: the source of truth, the ingest pipeline, the in-process engine that serves reads,
//! and the plain batch recompute that checks them.
//!
//! Data flow: event → [`ingest::Ingestor`] (dedupe, lateness, coalesce) → [`source::SourceOfTruth`]
//! commit → [`engine::RankingEngine::apply`] → flush on read → response. [`recompute`] rebuilds any
//! ranking from raw events alone, as the reference the incremental path is compared with.
//!
//! Two sources of truth implement one trait: [`sqlite`] (embedded, one process) and [`postgres`] (shared
//! by several instances); [`packed`] is how one SQLite raw-log row holds many events, and
//! [`metric_cells`] how SQLite keeps hourly metrics (a blob per batch, folded into a blob per hour).
//! `conformance` (test code, behind the `testsuite` feature) is the one suite both must pass.
//!
//! [`catalog`] is what a shop says about a product: display fields, and whether it is listed at all.
//!
//! Serving from Redis: [`publication`] turns the engine's per-span change logs into the writes
//! [`redis_serving`] applies, so Redis holds the hot rankings for every instance to read.
//! [`serving_store::ServingStore`] is the read both Redis and the engine answer.

pub mod catalog;
#[cfg(any(test, feature = "testsuite"))]
pub mod conformance;
pub mod engine;
pub mod ingest;
pub mod metric_cells;
pub mod packed;
pub mod postgres;
pub mod publication;
pub mod recompute;
pub mod redis_serving;
pub mod serving_store;
pub mod source;
pub mod sqlite;
