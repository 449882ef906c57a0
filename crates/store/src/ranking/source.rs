//! The rankings source of truth: what every ranking can be rebuilt from.
//!
//! A [`SourceOfTruth`] durably keeps hourly metric rows, the processed event ids, the raw event log,
//! category memberships, ranker policy states ([`PolicyState`]) and the catalogue ([`CatalogEntry`]: display
//! fields and the listing flag). One micro-batch is one [`CommitBatch`] and
//! one transaction: an ingest is acknowledged only after `commit` returns.
//!
//! The trait is synchronous on purpose. Commits run on one dedicated writer thread that group-commits
//! concurrent requests, so a backend's round trips are paid once per batch, not per event, and a
//! blocking client (SQLite, or the blocking `postgres` client) never stalls the async runtime.
//!
//! Who decides that an event id is new? With the embedded store one process holds the data-dir lock, so
//! the [`Ingestor`](super::ingest::Ingestor)'s in-memory set is the arbiter and [`SourceOfTruth::commit`]
//! trusts it. When several instances share one database, the database must arbitrate instead:
//! [`SourceOfTruth::commit_deduped`] records the ids, reports which of them were new, and applies metric
//! deltas and raw log rows only for those, in the same transaction. For that it needs each event's own
//! delta, hence [`CommitBatch::event_deltas`] beside the coalesced [`CommitBatch::metric_deltas`].

use rankgate_core::ids::{Category, EventId, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::Hour;
use rankgate_core::policy::{PolicyError, PolicyState};
use rankgate_core::ranker::RankerName;

use super::catalog::{CatalogEntry, CatalogUpdate};

/// Everything one micro-batch changes, committed in one transaction.
#[derive(Debug, Default)]
pub struct CommitBatch {
    /// Accepted events: (event hour, id, canonical JSON body). Their ids become processed ids.
    pub events: Vec<(Hour, EventId, Vec<u8>)>,
    /// Each event's own metric delta, parallel to `events` (same length, same order). Used by
    /// [`SourceOfTruth::commit_deduped`] to re-coalesce the deltas of only the events the database
    /// found new. May be left empty for [`SourceOfTruth::commit`], which applies `metric_deltas` as is.
    pub event_deltas: Vec<(ProductId, Metrics)>,
    /// Coalesced metric deltas, one per (hour, product): the sum of `event_deltas` by (hour, product).
    pub metric_deltas: Vec<(Hour, ProductId, Metrics)>,
    /// Category memberships seen for the first time. Memberships are idempotent facts and are stored
    /// whatever the dedupe outcome of the events that carried them.
    pub new_memberships: Vec<(ProductId, Category)>,
    /// The watermark (newest accepted event time) after this batch.
    pub watermark_millis: Option<i64>,
    /// When this batch was ingested: reads report it as `asOf`, also after a restart.
    pub ingested_at_millis: Option<i64>,
}

/// The state a fresh process loads to rebuild its serving state.
#[derive(Debug, Default)]
pub struct LoadedState {
    /// Every retained hourly metric row.
    pub metrics: Vec<(Hour, ProductId, Metrics)>,
    /// Every (product, category) membership.
    pub memberships: Vec<(ProductId, Category)>,
    /// Every processed event id still within retention.
    pub processed_ids: Vec<EventId>,
    /// The newest accepted event time.
    pub watermark_millis: Option<i64>,
    /// When the last batch was ingested.
    pub last_ingest_millis: Option<i64>,
    /// Every catalogue entry, read in the same snapshot as the rest (so the change feed's cursor covers
    /// it too): the listing flags rankings depend on, and the display fields.
    pub catalog: Vec<(ProductId, CatalogEntry)>,
    /// Position in the change feed this state includes (see [`SourceOfTruth::changes_since`]).
    pub change_cursor: i64,
}

/// Rows other instances wrote since a cursor: absolute hourly values, not deltas, so applying them is
/// idempotent and a follower converges whatever it had applied itself.
#[derive(Debug, Default)]
pub struct Changes {
    /// The cursor to ask from next time.
    pub cursor: i64,
    /// Current values of every hourly row written since the cursor.
    pub metrics: Vec<(Hour, ProductId, Metrics)>,
    /// Memberships written since the cursor.
    pub memberships: Vec<(ProductId, Category)>,
    /// The shared watermark now.
    pub watermark_millis: Option<i64>,
    /// The shared last-ingest time now.
    pub last_ingest_millis: Option<i64>,
    /// The stored policy state of every configured ranker, read in the same snapshot. Always the whole
    /// state (a row per ranker), not the transitions since the cursor: the reader keeps what is newer than
    /// what it has seen by [`PolicyState::seq`], so a missed or repeated read changes nothing.
    pub policies: Vec<(RankerName, PolicyState)>,
    /// Current catalogue entries written since the cursor (whole entries, so applying one twice changes
    /// nothing): a delisting through one instance hides the product on every instance.
    pub catalog: Vec<(ProductId, CatalogEntry)>,
}

/// Errors from a source of truth. Messages are lowercase and say what failed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The database rejected an operation.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL rejected an operation, or could not be reached (also after one reconnect).
    #[error("postgres: {0}")]
    Postgres(#[from] ::postgres::Error),
    /// The caller passed something the backend cannot use (a batch without the `event_deltas` it
    /// needs, a schema name that is not a plain identifier, ...).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// Stored data could not be decoded.
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// A policy transition the version rules refuse ([`PolicyState`]); nothing was stored.
    #[error("{0}")]
    Policy(#[from] PolicyError),
    /// Filesystem trouble (data dir, lock file).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Durable storage of metrics, processed ids, the raw event log, policies and the catalogue.
pub trait SourceOfTruth: Send {
    /// Commits one micro-batch atomically. When this returns `Ok`, every event in it is durable.
    ///
    /// The caller asserts that every event id in the batch is new (it deduped them itself).
    fn commit(&mut self, batch: &CommitBatch) -> Result<(), SourceError>;

    /// Commits one micro-batch atomically with the **database** as the dedupe arbiter, and returns, per
    /// event of `batch.events`, whether this call counted it (`true`) or its id had been processed
    /// before (`false`; also for a repeat of an id earlier in the same batch). Metric deltas and raw log
    /// rows are applied only for the counted events, in the same transaction as the ids. When an event
    /// was a duplicate, the metric deltas are re-coalesced from `batch.event_deltas`, which must then be
    /// parallel to `batch.events` ([`SourceError::Invalid`] otherwise).
    ///
    /// The default calls [`commit`](Self::commit) and reports every event as new: right for a backend
    /// owned by one process (SQLite behind the data-dir lock), where the caller's in-memory set is
    /// authoritative. Backends shared by several instances (PostgreSQL) override it.
    fn commit_deduped(&mut self, batch: &CommitBatch) -> Result<Vec<bool>, SourceError> {
        self.commit(batch)?;
        Ok(vec![true; batch.events.len()])
    }
    /// What other writers changed since `cursor`, for backends shared by several instances. `None` (the
    /// default) means this backend has a single writer (SQLite behind the data-dir lock): nothing to follow.
    fn changes_since(&mut self, cursor: i64) -> Result<Option<Changes>, SourceError> {
        let _ = cursor;
        Ok(None)
    }

    /// Loads everything needed to rebuild serving state.
    fn load(&mut self) -> Result<LoadedState, SourceError>;
    /// Visits the raw event log hour by hour, and within an hour in commit order: the input of `replay`
    /// and `verify` (which only sum, so any order inside an hour is equally correct).
    fn scan_event_log(&mut self, visit: &mut dyn FnMut(Hour, &[u8])) -> Result<(), SourceError>;
    /// Replaces every metric row with `rows` (used by `replay`), in one transaction.
    fn replace_metrics(&mut self, rows: &[(Hour, ProductId, Metrics)]) -> Result<(), SourceError>;
    /// Drops raw events (and their processed ids) older than `events_before`, and metric rows older than
    /// `metrics_before`. Returns the ids forgotten, so in-memory dedupe can forget them too.
    ///
    /// Retention is a floor: a backend that drops whole time partitions (PostgreSQL, one per UTC day)
    /// keeps the rows of a partition that straddles `events_before` until all of it is older, and returns
    /// only the ids it really forgot. Every event at or after `events_before` is always kept.
    fn evict(&mut self, events_before: Hour, metrics_before: Hour) -> Result<Vec<EventId>, SourceError>;
    /// Loads a ranker's policy state, or `None` if it was never configured.
    fn load_policies(&mut self, ranker: RankerName) -> Result<Option<PolicyState>, SourceError>;
    /// Runs one policy transition in one transaction: locks the ranker's stored state (creating
    /// [`PolicyState::initial`] if there is none), applies `transition` to it, stores the result (with the
    /// weights of every version it names) and returns it. A refused transition stores nothing and comes
    /// back as [`SourceError::Policy`]. On a shared database concurrent transitions through several
    /// instances run one after the other, each on the state the previous one stored.
    ///
    /// `transition` may run more than once (a retry after a lost connection), each time on a fresh state.
    fn transition_policies(
        &mut self,
        ranker: RankerName,
        transition: &mut dyn FnMut(&mut PolicyState) -> Result<(), PolicyError>,
    ) -> Result<PolicyState, SourceError>;
    /// Merges catalogue updates into the stored entries ([`CatalogEntry::merged`]; a product never written
    /// starts from [`CatalogEntry::default`]), in order, in one transaction, and returns each written
    /// product's entry as stored afterwards (once per product). On a shared database the read and the
    /// write happen under the write lock, so concurrent updates through several instances all land, and
    /// the rows enter the change feed in commit order.
    fn put_catalog(
        &mut self,
        updates: &[(ProductId, CatalogUpdate)],
    ) -> Result<Vec<(ProductId, CatalogEntry)>, SourceError>;
    /// Loads the whole catalogue.
    fn load_catalog(&mut self) -> Result<Vec<(ProductId, CatalogEntry)>, SourceError>;

    /// A cheap check for readiness (issue 30) that the store answers now: with `write` false a read
    /// (`SELECT 1`, plus, for a store on the local disk, the free space of its filesystem), with `write`
    /// true also a one-row write committed (`meta.readiness_probe`), which tells a store that took writes
    /// again after failing them (a disk freed, a database back) from one that only answers reads. The
    /// default answers Ok: a backend that cannot be probed is not reported down.
    fn probe(&mut self, write: bool) -> Result<(), SourceError> {
        let _ = write;
        Ok(())
    }
}
