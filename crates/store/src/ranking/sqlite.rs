//! The embedded source of truth: one SQLite database (bundled, WAL) in the data directory.
//!
//! Layout choices, measured on this kind of machine (BENCHMARKS.md, "Durable ingest" and "HTTP ingest"):
//! - The raw event log doubles as the processed-id set, and is written **one row per (batch, hour)**, not
//!   one per event: `event_log` is keyed by `(hour, seq)` and a row holds the ids and canonical bodies of
//!   every event of that batch in that hour, each length-prefixed ([`super::packed`]; rows written
//!   before, newline-joined, are marked `format` 0 and still read exactly). New rows append (hours and
//!   batch numbers only grow, apart from late events), and a 2,000-event batch costs a handful of B-tree
//!   inserts instead of 2,000. Dedupe lookups are answered from an in-memory set rebuilt from the `ids`
//!   column at start, never from disk.
//! - Retention drops whole hour ranges, which are contiguous key ranges in both big tables.
//! - WAL mode, with `synchronous` as configured ([`Synchronous`]): `FULL` (the default) fsyncs every commit,
//!   so an acknowledged batch survives a power loss; `NORMAL` survives a process crash (SIGKILL) only. One
//!   commit per ingest batch, so the fsync is paid per batch, not per event.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};

use rankgate_core::ids::{Category, EventId, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::Hour;
use rankgate_core::policy::{PolicyError, PolicyState};
use rankgate_core::ranker::{Policy, PopularWeights, RankerName};

use super::packed::{self, RowFormat};
use crate::synchronous::Synchronous;

use super::source::{CommitBatch, LoadedState, SourceError, SourceOfTruth};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS event_log (
    hour   INTEGER NOT NULL,
    seq    INTEGER NOT NULL,
    ids    TEXT    NOT NULL,
    bodies BLOB    NOT NULL,
    format INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS metrics_hourly (
    hour    INTEGER NOT NULL,
    product TEXT    NOT NULL,
    views   INTEGER NOT NULL,
    likes   INTEGER NOT NULL,
    units   INTEGER NOT NULL,
    sales   INTEGER NOT NULL,
    PRIMARY KEY (hour, product)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS product_categories (
    product  TEXT NOT NULL,
    category TEXT NOT NULL,
    PRIMARY KEY (product, category)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS policies (
    ranker  TEXT    NOT NULL,
    version INTEGER NOT NULL,
    weights TEXT    NOT NULL,
    PRIMARY KEY (ranker, version)
);
CREATE TABLE IF NOT EXISTS ranker_state (
    ranker           TEXT PRIMARY KEY,
    active_version   INTEGER NOT NULL,
    previous_version INTEGER,
    latest_version   INTEGER NOT NULL,
    building_version INTEGER,
    state_seq        INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS catalog (
    product TEXT PRIMARY KEY,
    body    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
";

/// The SQLite source of truth.
pub struct SqliteSource {
    connection: Connection,
    /// Batch number of the next `event_log` rows; one past the largest stored.
    next_seq: i64,
}

impl SqliteSource {
    /// Opens (creating if needed) `rankings.sqlite3` in `data_dir` and applies the schema, with the
    /// default [`Synchronous`] level.
    pub fn open(data_dir: &Path) -> Result<SqliteSource, SourceError> {
        SqliteSource::open_with(data_dir, Synchronous::default())
    }

    /// [`SqliteSource::open`] with an explicit `synchronous` level.
    pub fn open_with(data_dir: &Path, synchronous: Synchronous) -> Result<SqliteSource, SourceError> {
        std::fs::create_dir_all(data_dir)?;
        SqliteSource::open_file(&data_dir.join("rankings.sqlite3"), synchronous)
    }

    /// Opens a specific database file.
    pub fn open_file(path: &Path, synchronous: Synchronous) -> Result<SqliteSource, SourceError> {
        let connection = Connection::open(path)?;
        connection.pragma_update(None, "journal_mode", "WAL")?;
        synchronous.apply(&connection)?;
        connection.pragma_update(None, "cache_size", -65536)?; // 64 MiB
        connection.pragma_update(None, "temp_store", "MEMORY")?;
        connection.busy_timeout(std::time::Duration::from_secs(10))?;
        // Checkpoint the WAL in bigger steps: a page rewritten by many batches is copied back once.
        connection.pragma_update(None, "wal_autocheckpoint", 8192)?;
        connection.execute_batch(SCHEMA)?;
        add_event_log_format_column(&connection)?;
        add_policy_state_columns(&connection)?;
        let next_seq: i64 =
            connection.query_row("SELECT COALESCE(MAX(seq), 0) + 1 FROM event_log", [], |row| {
                row.get(0)
            })?;
        Ok(SqliteSource { connection, next_seq })
    }

    /// The `synchronous` level SQLite reports for this connection (what a commit really does).
    pub fn synchronous(&self) -> Result<Synchronous, SourceError> {
        let level: i64 = self
            .connection
            .pragma_query_value(None, "synchronous", |row| row.get(0))?;
        Synchronous::from_pragma_level(level)
            .ok_or_else(|| corrupt("PRAGMA synchronous", format!("unexpected level {level}")))
    }
}

impl SqliteSource {
    fn meta_millis(&self, key: &str) -> Result<Option<i64>, SourceError> {
        let value: Option<String> = self
            .connection
            .query_row("SELECT value FROM meta WHERE key = ?1", params![key], |row| {
                row.get(0)
            })
            .optional()?;
        value
            .map(|v| v.parse::<i64>().map_err(|e| corrupt(&format!("meta.{key}"), e)))
            .transpose()
    }
}

/// Gives a database created before packed rows were length-prefixed its `format` column. Its rows get
/// the default 0 ([`RowFormat::NewlineJoined`]), and so do rows an older binary inserts later, since it
/// names no `format`: whoever wrote a row, its marker is right.
fn add_event_log_format_column(connection: &Connection) -> Result<(), SourceError> {
    let has_format = connection
        .prepare("SELECT 1 FROM pragma_table_info('event_log') WHERE name = 'format'")?
        .exists([])?;
    if !has_format {
        connection.execute_batch("ALTER TABLE event_log ADD COLUMN format INTEGER NOT NULL DEFAULT 0")?;
    }
    Ok(())
}

/// Gives a database created before policy states were versioned (SPEC 1.3, fleet state) the columns of
/// the version being built and the state's sequence number: nothing building, sequence 0.
fn add_policy_state_columns(connection: &Connection) -> Result<(), SourceError> {
    let has_seq = connection
        .prepare("SELECT 1 FROM pragma_table_info('ranker_state') WHERE name = 'state_seq'")?
        .exists([])?;
    if !has_seq {
        connection.execute_batch(
            "ALTER TABLE ranker_state ADD COLUMN building_version INTEGER;
             ALTER TABLE ranker_state ADD COLUMN state_seq INTEGER NOT NULL DEFAULT 0;",
        )?;
    }
    Ok(())
}

/// A ranker's stored policy state with the weights of every version it names, or `None`.
fn read_policy_state(
    connection: &Connection,
    ranker: RankerName,
) -> Result<Option<PolicyState>, SourceError> {
    type Row = (u32, Option<u32>, u32, Option<u32>, i64);
    let state: Option<Row> = connection
        .query_row(
            "SELECT active_version, previous_version, latest_version, building_version, state_seq
             FROM ranker_state WHERE ranker = ?1",
            params![ranker.as_str()],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?)),
        )
        .optional()?;
    let Some((active, previous, latest_version, building, seq)) = state else {
        return Ok(None);
    };
    let load_version = |version: u32| -> Result<Policy, SourceError> {
        let weights: String = connection.query_row(
            "SELECT weights FROM policies WHERE ranker = ?1 AND version = ?2",
            params![ranker.as_str(), version],
            |row| row.get(0),
        )?;
        let weights: PopularWeights =
            serde_json::from_str(&weights).map_err(|e| corrupt("policies.weights", e))?;
        Ok(Policy { version, weights })
    };
    Ok(Some(PolicyState {
        active: load_version(active)?,
        previous: previous.map(load_version).transpose()?,
        building: building.map(load_version).transpose()?,
        latest_version,
        seq: u64::try_from(seq).map_err(|e| corrupt("ranker_state.state_seq", e))?,
    }))
}

/// The event ids of one `event_log` row (columns: `format`, `ids`, and `bodies` for old rows only).
///
/// An id of an old row that today's rules refuse is left out: no event can carry it any more, so it
/// needs no dedupe. In a row written today every id must parse.
fn read_row_ids(row: &rusqlite::Row<'_>, into: &mut Vec<EventId>) -> Result<(), SourceError> {
    let format = RowFormat::from_column(row.get(0)?).map_err(|e| corrupt("event_log.format", e))?;
    let ids = row
        .get_ref(1)?
        .as_bytes()
        .map_err(|e| corrupt("event_log.ids", e))?;
    let bodies = match row.get_ref(2)? {
        rusqlite::types::ValueRef::Null => None,
        value => Some(value.as_bytes().map_err(|e| corrupt("event_log.bodies", e))?),
    };
    for id in packed::ids(format, ids, bodies).map_err(|e| corrupt("event_log.ids", e))? {
        match EventId::parse(&id) {
            Ok(id) => into.push(id),
            Err(_) if format == RowFormat::NewlineJoined => {}
            Err(error) => return Err(corrupt("event_log.ids", error)),
        }
    }
    Ok(())
}

fn read_metrics(row: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<Metrics> {
    Ok(Metrics {
        views: row.get(first)?,
        likes: row.get(first + 1)?,
        units: row.get(first + 2)?,
        sales: row.get(first + 3)?,
    })
}

fn corrupt(what: &str, error: impl std::fmt::Display) -> SourceError {
    SourceError::Corrupt(format!("{what}: {error}"))
}

impl SourceOfTruth for SqliteSource {
    fn commit(&mut self, batch: &CommitBatch) -> Result<(), SourceError> {
        let transaction = self.connection.transaction()?;
        {
            let mut by_hour: std::collections::BTreeMap<Hour, (Vec<u8>, Vec<u8>)> = Default::default();
            for (hour, id, body) in &batch.events {
                let (ids, bodies) = by_hour.entry(*hour).or_default();
                packed::push_entry(ids, id.as_str().as_bytes());
                packed::push_entry(bodies, body);
            }
            let mut insert_events = transaction.prepare_cached(
                "INSERT INTO event_log (hour, seq, ids, bodies, format) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for (hour, (ids, bodies)) in &by_hour {
                insert_events.execute(params![
                    hour.0,
                    self.next_seq,
                    ids,
                    bodies,
                    RowFormat::LengthPrefixed.column()
                ])?;
            }
            let mut upsert_metrics = transaction.prepare_cached(
                "INSERT INTO metrics_hourly (hour, product, views, likes, units, sales)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (hour, product) DO UPDATE SET
                   views = views + excluded.views, likes = likes + excluded.likes,
                   units = units + excluded.units, sales = sales + excluded.sales",
            )?;
            for (hour, product, delta) in &batch.metric_deltas {
                upsert_metrics.execute(params![
                    hour.0,
                    product.as_str(),
                    delta.views,
                    delta.likes,
                    delta.units,
                    delta.sales
                ])?;
            }
            let mut insert_membership = transaction.prepare_cached(
                "INSERT OR IGNORE INTO product_categories (product, category) VALUES (?1, ?2)",
            )?;
            for (product, category) in &batch.new_memberships {
                insert_membership.execute(params![product.as_str(), category.as_str()])?;
            }
            let mut set_meta = transaction.prepare_cached(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            )?;
            if let Some(watermark) = batch.watermark_millis {
                set_meta.execute(params!["watermark_millis", watermark.to_string()])?;
            }
            if let Some(ingested_at) = batch.ingested_at_millis {
                set_meta.execute(params!["last_ingest_millis", ingested_at.to_string()])?;
            }
        }
        transaction.commit()?;
        self.next_seq += 1;
        Ok(())
    }

    fn load(&mut self) -> Result<LoadedState, SourceError> {
        let mut state = LoadedState::default();
        let mut statement = self
            .connection
            .prepare("SELECT hour, product, views, likes, units, sales FROM metrics_hourly ORDER BY hour")?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            let product: String = row.get(1)?;
            let product = ProductId::parse(&product).map_err(|e| corrupt("metrics_hourly.product", e))?;
            state
                .metrics
                .push((Hour(row.get(0)?), product, read_metrics(row, 2)?));
        }
        drop(rows);
        drop(statement);
        let mut statement = self
            .connection
            .prepare("SELECT product, category FROM product_categories")?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            let product: String = row.get(0)?;
            let category: String = row.get(1)?;
            state.memberships.push((
                ProductId::parse(&product).map_err(|e| corrupt("product_categories.product", e))?,
                Category::parse(&category).map_err(|e| corrupt("product_categories.category", e))?,
            ));
        }
        drop(rows);
        drop(statement);
        let mut statement = self
            .connection
            .prepare("SELECT format, ids, CASE WHEN format = 0 THEN bodies END FROM event_log")?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            read_row_ids(row, &mut state.processed_ids)?;
        }
        drop(rows);
        drop(statement);
        state.watermark_millis = self.meta_millis("watermark_millis")?;
        state.last_ingest_millis = self.meta_millis("last_ingest_millis")?;
        Ok(state)
    }

    fn scan_event_log(&mut self, visit: &mut dyn FnMut(Hour, &[u8])) -> Result<(), SourceError> {
        let mut statement = self
            .connection
            .prepare("SELECT hour, format, bodies FROM event_log ORDER BY hour, seq")?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            let hour = Hour(row.get(0)?);
            let format = RowFormat::from_column(row.get(1)?).map_err(|e| corrupt("event_log.format", e))?;
            let bodies = row
                .get_ref(2)?
                .as_bytes()
                .map_err(|e| corrupt("event_log.bodies", e))?;
            for body in packed::bodies(format, bodies).map_err(|e| corrupt("event_log.bodies", e))? {
                visit(hour, body);
            }
        }
        Ok(())
    }

    fn replace_metrics(&mut self, rows: &[(Hour, ProductId, Metrics)]) -> Result<(), SourceError> {
        let transaction = self.connection.transaction()?;
        transaction.execute("DELETE FROM metrics_hourly", [])?;
        {
            let mut insert = transaction.prepare_cached(
                "INSERT INTO metrics_hourly (hour, product, views, likes, units, sales) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for (hour, product, m) in rows {
                insert.execute(params![
                    hour.0,
                    product.as_str(),
                    m.views,
                    m.likes,
                    m.units,
                    m.sales
                ])?;
            }
        }
        transaction.commit()?;
        Ok(())
    }

    fn evict(&mut self, events_before: Hour, metrics_before: Hour) -> Result<Vec<EventId>, SourceError> {
        let transaction = self.connection.transaction()?;
        let mut forgotten = Vec::new();
        {
            let mut statement = transaction.prepare(
                "SELECT format, ids, CASE WHEN format = 0 THEN bodies END FROM event_log WHERE hour < ?1",
            )?;
            let mut rows = statement.query(params![events_before.0])?;
            while let Some(row) = rows.next()? {
                read_row_ids(row, &mut forgotten)?;
            }
        }
        transaction.execute("DELETE FROM event_log WHERE hour < ?1", params![events_before.0])?;
        transaction.execute(
            "DELETE FROM metrics_hourly WHERE hour < ?1",
            params![metrics_before.0],
        )?;
        transaction.commit()?;
        Ok(forgotten)
    }

    fn load_policies(&mut self, ranker: RankerName) -> Result<Option<PolicyState>, SourceError> {
        read_policy_state(&self.connection, ranker)
    }

    fn transition_policies(
        &mut self,
        ranker: RankerName,
        transition: &mut dyn FnMut(&mut PolicyState) -> Result<(), PolicyError>,
    ) -> Result<PolicyState, SourceError> {
        // IMMEDIATE: the write lock is taken before the read, as PostgreSQL's `FOR UPDATE` does.
        let transaction =
            rusqlite::Transaction::new(&mut self.connection, rusqlite::TransactionBehavior::Immediate)?;
        let stored = read_policy_state(&transaction, ranker)?;
        let mut state = stored.unwrap_or_else(|| PolicyState::initial_for(ranker));
        transition(&mut state)?;
        if stored != Some(state) {
            let versions = [Some(state.active), state.previous, state.building];
            for policy in versions.into_iter().flatten() {
                let weights =
                    serde_json::to_string(&policy.weights).map_err(|e| corrupt("policy weights", e))?;
                // A version's weights never change once created.
                transaction.execute(
                    "INSERT OR IGNORE INTO policies (ranker, version, weights) VALUES (?1, ?2, ?3)",
                    params![ranker.as_str(), policy.version, weights],
                )?;
            }
            transaction.execute(
                "INSERT OR REPLACE INTO ranker_state
                   (ranker, active_version, previous_version, latest_version, building_version, state_seq)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    ranker.as_str(),
                    state.active.version,
                    state.previous.map(|p| p.version),
                    state.latest_version,
                    state.building.map(|p| p.version),
                    i64::try_from(state.seq).map_err(|e| corrupt("policy state seq", e))?,
                ],
            )?;
        }
        transaction.commit()?;
        Ok(state)
    }

    fn put_catalog(&mut self, entries: &[(ProductId, serde_json::Value)]) -> Result<(), SourceError> {
        let transaction = self.connection.transaction()?;
        {
            let mut upsert = transaction
                .prepare_cached("INSERT OR REPLACE INTO catalog (product, body) VALUES (?1, ?2)")?;
            for (product, body) in entries {
                upsert.execute(params![product.as_str(), body.to_string()])?;
            }
        }
        transaction.commit()?;
        Ok(())
    }

    fn load_catalog(&mut self) -> Result<Vec<(ProductId, serde_json::Value)>, SourceError> {
        let mut statement = self.connection.prepare("SELECT product, body FROM catalog")?;
        let mut rows = statement.query([])?;
        let mut entries = Vec::new();
        while let Some(row) = rows.next()? {
            let product: String = row.get(0)?;
            let body: String = row.get(1)?;
            entries.push((
                ProductId::parse(&product).map_err(|e| corrupt("catalog.product", e))?,
                serde_json::from_str(&body).map_err(|e| corrupt("catalog.body", e))?,
            ));
        }
        Ok(entries)
    }
}
