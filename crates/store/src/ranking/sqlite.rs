//! The embedded source of truth: one SQLite database (bundled, WAL) in the data directory.
//!
//! Layout choices, measured on this kind of machine (bench/results/2026-11-30-issues2-3-4.md, "Durable
//! ingest" and "HTTP ingest"):
//! - The raw event log doubles as the processed-id set, and is written **one row per (batch, hour)**, not
//!   one per event: `event_log` is keyed by `(hour, seq)` and a row holds the ids and canonical bodies of
//!   every event of that batch in that hour, each length-prefixed ([`super::packed`]; rows written
//!   before, newline-joined, are marked `format` 0 and still read exactly). New rows append (hours and
//!   batch numbers only grow, apart from late events), and a 2,000-event batch costs a handful of B-tree
//!   inserts instead of 2,000. Dedupe lookups are answered from an in-memory set rebuilt from the `ids`
//!   column at start, never from disk.
//! - Hourly metrics are **packed cells** ([`metric_cells`]), not a row per (hour, product): a batch
//!   appends its coalesced deltas as one `metric_deltas` blob, and a commit that finds enough cells
//!   pending folds them into one `metrics_packed` blob per hour, in the same transaction. With 20,000
//!   products a 2,000-event batch had ~1,900 (hour, product) upserts, ~5,000 instructions each; the
//!   blob costs a few dozen per cell (`bench/results/ingest-callgrind.md`). Rows of the old
//!   `metrics_hourly` table (an older version's database) are summed into hour blobs on open.
//! - Retention drops whole hour ranges, which are contiguous key ranges in the raw log and the hour
//!   blobs; a batch blob goes once its newest cell is below the cut (`meta.metrics_floor_hour` drops
//!   the older cells of one that straddles it).
//! - The schema is **numbered migrations** in `sqlite_migrations/*.sql`, applied on open in one
//!   transaction and versioned by `PRAGMA user_version` ([`crate::sqlite_migration`]); a database from
//!   before versioning is dated by the column probes that used to guard each change.
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

use super::catalog::{merge_updates, CatalogEntry, CatalogUpdate};
use super::metric_cells::{self, CellSums};
use super::packed::{self, RowFormat};
use crate::sqlite_migration::{self, LegacyProbe, Migration};
use crate::synchronous::Synchronous;

use super::source::{CommitBatch, LoadedState, SourceError, SourceOfTruth};

/// The schema as numbered files under `sqlite_migrations/`, versioned by `PRAGMA user_version`
/// ([`crate::sqlite_migration`] says why, and how databases from before versioning are dated). Each
/// probe is the one the inline schema of older builds used to decide whether to apply the change.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sql: include_str!("sqlite_migrations/0001_initial.sql"),
        legacy_probe: Some(LegacyProbe::Tables(&[
            "event_log",
            "metrics_hourly",
            "product_categories",
            "policies",
            "ranker_state",
            "catalog",
            "meta",
        ])),
    },
    Migration {
        version: 2,
        sql: include_str!("sqlite_migrations/0002_event_log_format.sql"),
        legacy_probe: Some(LegacyProbe::Column {
            table: "event_log",
            column: "format",
        }),
    },
    Migration {
        version: 3,
        sql: include_str!("sqlite_migrations/0003_policy_state.sql"),
        legacy_probe: Some(LegacyProbe::Column {
            table: "ranker_state",
            column: "state_seq",
        }),
    },
    Migration {
        version: 4,
        sql: include_str!("sqlite_migrations/0004_catalog_listing.sql"),
        legacy_probe: Some(LegacyProbe::Column {
            table: "catalog",
            column: "listed",
        }),
    },
    Migration {
        version: 5,
        sql: include_str!("sqlite_migrations/0005_packed_metrics.sql"),
        legacy_probe: Some(LegacyProbe::Tables(&["metric_deltas", "metrics_packed"])),
    },
];

/// Rows per multi-row `INSERT` of a commit, and the shapes it uses: a batch of n rows is written as
/// statements of the largest power of two rows that fits, so a commit needs at most
/// [`CHUNK_SHAPES`] prepared shapes per table, which stay in the statement cache.
///
/// Why multi-row: one statement per row paid SQLite's per-statement work (step, halt, cursor open and
/// close, reset) and rusqlite's parameter plumbing once per row (~1,450 of the ~9,300 instructions a
/// metric row cost in a standalone callgrind run, `bench/results/ingest-callgrind.md`). Memberships use
/// it; metrics are packed cells now. Sixty-four rows keep a statement's parameters far below SQLite's
/// limit.
const ROWS_PER_STATEMENT: usize = 64;
const CHUNK_SHAPES: usize = ROWS_PER_STATEMENT.trailing_zeros() as usize + 1;

/// `INSERT … VALUES (…), (…) …` texts for 1, 2, 4, … [`ROWS_PER_STATEMENT`] rows.
type ChunkStatements = [String; CHUNK_SHAPES];

fn chunk_statements(head: &str, columns: usize, tail: &str) -> ChunkStatements {
    std::array::from_fn(|shape| {
        let row = format!("({})", vec!["?"; columns].join(", "));
        format!("{head} VALUES {}{tail}", vec![row; 1 << shape].join(", "))
    })
}

/// Cells the batch blobs (`metric_deltas`) may hold before a commit folds them into the hour blobs
/// (`metrics_packed`), at least; and the share of the hour blobs' cells they may reach before it does,
/// at most. A compaction rewrites at most every hour blob once, so folding when the pending cells
/// reach a quarter of the stored ones bounds its amortized cost to ~5 cell rewrites per cell appended,
/// and a start reads at most 1.25× the stored cells (or this floor): 2^18 cells are ~7 MiB of blobs.
const COMPACT_AT_LEAST: u64 = 1 << 18;
const COMPACT_SHARE: u64 = 4;

/// The membership inserts (a membership already stored is left as it is).
fn membership_inserts() -> &'static ChunkStatements {
    static STATEMENTS: std::sync::OnceLock<ChunkStatements> = std::sync::OnceLock::new();
    STATEMENTS.get_or_init(|| {
        chunk_statements(
            "INSERT OR IGNORE INTO product_categories (product, category)",
            2,
            "",
        )
    })
}

/// Executes `statements` over `rows` in power-of-two chunks (see [`ROWS_PER_STATEMENT`]), in order;
/// `bind` binds one row's columns starting at the 1-based parameter index it is given.
fn execute_in_chunks<T>(
    transaction: &rusqlite::Transaction<'_>,
    rows: &[T],
    statements: &ChunkStatements,
    bind: impl Fn(&mut rusqlite::CachedStatement<'_>, usize, &T) -> rusqlite::Result<()>,
) -> Result<(), SourceError> {
    let mut rest = rows;
    while !rest.is_empty() {
        let shape = rest.len().min(ROWS_PER_STATEMENT).ilog2() as usize;
        let (chunk, later) = rest.split_at(1 << shape);
        let mut statement = transaction.prepare_cached(&statements[shape])?;
        let columns = statement.parameter_count() / chunk.len();
        for (i, row) in chunk.iter().enumerate() {
            bind(&mut statement, 1 + i * columns, row)?;
        }
        statement.raw_execute()?;
        rest = later;
    }
    Ok(())
}

/// The SQLite source of truth.
pub struct SqliteSource {
    connection: Connection,
    /// Batch number of the next `event_log` rows; one past the largest stored.
    next_seq: i64,
    /// What the metric tables hold (see [`MetricTables`]).
    metrics: MetricTables,
}

/// The cells of the two metric tables, counted so a commit can tell when to compact without a query,
/// and the retention floor of metrics (`meta.metrics_floor_hour`): a batch blob can straddle it, so
/// its cells below the floor are dropped when read.
#[derive(Copy, Clone, Debug)]
struct MetricTables {
    pending_cells: u64,
    packed_cells: u64,
    floor: Option<Hour>,
    /// [`COMPACT_AT_LEAST`], lowered by tests to compact often.
    compact_at_least: u64,
}

impl MetricTables {
    fn read(connection: &Connection) -> Result<MetricTables, SourceError> {
        let count = |sql: &str| -> Result<u64, SourceError> {
            let cells: i64 = connection.query_row(sql, [], |row| row.get(0))?;
            u64::try_from(cells).map_err(|e| corrupt("metric cell count", e))
        };
        let floor: Option<String> = connection
            .query_row(
                "SELECT value FROM meta WHERE key = 'metrics_floor_hour'",
                [],
                |row| row.get(0),
            )
            .optional()?;
        Ok(MetricTables {
            pending_cells: count("SELECT COALESCE(SUM(cells), 0) FROM metric_deltas")?,
            packed_cells: count("SELECT COALESCE(SUM(cells), 0) FROM metrics_packed")?,
            floor: floor
                .map(|v| {
                    v.parse::<i64>()
                        .map(Hour)
                        .map_err(|e| corrupt("meta.metrics_floor_hour", e))
                })
                .transpose()?,
            compact_at_least: COMPACT_AT_LEAST,
        })
    }

    fn should_compact(&self, pending_cells: u64) -> bool {
        pending_cells >= self.compact_at_least.max(self.packed_cells / COMPACT_SHARE)
    }
}

impl SqliteSource {
    /// Opens (creating if needed) `rankings.sqlite3` in `data_dir` and brings its schema to the current
    /// version, with the default [`Synchronous`] level.
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
        // Room for every statement shape a commit uses (see `ROWS_PER_STATEMENT`) and the rest.
        connection.set_prepared_statement_cache_capacity(64);
        let mut connection = connection;
        sqlite_migration::migrate(&mut connection, MIGRATIONS)?;
        pack_metric_rows(&mut connection)?;
        let metrics = MetricTables::read(&connection)?;
        // Past every batch number in use: retention can empty the raw log while a batch blob of
        // metrics (kept longer) still holds a later number.
        let next_seq: i64 = connection.query_row(
            "SELECT MAX((SELECT COALESCE(MAX(seq), 0) FROM event_log),
                        (SELECT COALESCE(MAX(seq), 0) FROM metric_deltas)) + 1",
            [],
            |row| row.get(0),
        )?;
        Ok(SqliteSource {
            connection,
            next_seq,
            metrics,
        })
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

/// Moves the rows of `metrics_hourly` (a row per (hour, product), how metrics were stored before the
/// packed cells of [`metric_cells`]) into hour blobs, summed with any blob of the same hour, in one
/// transaction. Sums, not copies: rows an older binary upserted into an emptied table hold only what
/// it added, so a downgrade and upgrade lose nothing that was written meanwhile.
fn pack_metric_rows(connection: &mut Connection) -> Result<(), SourceError> {
    if !connection
        .prepare("SELECT 1 FROM metrics_hourly LIMIT 1")?
        .exists([])?
    {
        return Ok(());
    }
    let transaction = connection.transaction()?;
    {
        let mut sums = CellSums::default();
        let mut statement =
            transaction.prepare("SELECT hour, product, views, likes, units, sales FROM metrics_hourly")?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            let product: String = row.get(1)?;
            sums.add(Hour(row.get(0)?), &product, &read_metrics(row, 2)?)
                .map_err(|e| corrupt("metrics_hourly", e))?;
        }
        drop(rows);
        fold_into_hour_blobs(&transaction, sums)?;
    }
    transaction.execute("DELETE FROM metrics_hourly", [])?;
    transaction.commit()?;
    Ok(())
}

/// Folds `sums` into `metrics_packed`, one hour blob per hour (each read, merged and written back).
/// Returns how many cells the hour blobs gained.
fn fold_into_hour_blobs(
    transaction: &rusqlite::Transaction<'_>,
    mut sums: CellSums,
) -> Result<i64, SourceError> {
    let mut read = transaction.prepare_cached("SELECT cells, blob FROM metrics_packed WHERE hour = ?1")?;
    let mut write = transaction
        .prepare_cached("INSERT OR REPLACE INTO metrics_packed (hour, cells, blob) VALUES (?1, ?2, ?3)")?;
    let mut gained = 0i64;
    for (hour, deltas) in sums.take_before(None) {
        let (stored_cells, stored): (i64, Vec<u8>) = read
            .query_row(params![hour.0], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?
            .unwrap_or_default();
        let (blob, cells) =
            metric_cells::merge_hour(hour, &stored, deltas).map_err(|e| corrupt("metrics_packed", e))?;
        let cells = i64::try_from(cells).map_err(|e| corrupt("metrics_packed.cells", e))?;
        write.execute(params![hour.0, cells, blob])?;
        gained += cells - stored_cells;
    }
    Ok(gained)
}

/// The sums of every batch blob, cells below `floor` dropped.
fn pending_sums(connection: &Connection, floor: Option<Hour>) -> Result<CellSums, SourceError> {
    let mut sums = CellSums::above(floor);
    let mut statement = connection.prepare_cached("SELECT blob FROM metric_deltas ORDER BY seq")?;
    let mut rows = statement.query([])?;
    while let Some(row) = rows.next()? {
        let blob = row
            .get_ref(0)?
            .as_blob()
            .map_err(|e| corrupt("metric_deltas.blob", e))?;
        sums.add_blob(blob)
            .map_err(|e| corrupt("metric_deltas.blob", e))?;
    }
    Ok(sums)
}

/// Reads catalogue rows (`product, body, listed`) from `statement`.
fn read_catalog_rows(
    statement: &mut rusqlite::CachedStatement<'_>,
    parameters: impl rusqlite::Params,
) -> Result<Vec<(ProductId, CatalogEntry)>, SourceError> {
    let mut rows = statement.query(parameters)?;
    let mut entries = Vec::new();
    while let Some(row) = rows.next()? {
        let product: String = row.get(0)?;
        let body: String = row.get(1)?;
        let listed: bool = row.get(2)?;
        entries.push((
            ProductId::parse(&product).map_err(|e| corrupt("catalog.product", e))?,
            CatalogEntry::from_stored(&body, listed).map_err(|e| corrupt("catalog.body", e))?,
        ));
    }
    Ok(entries)
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

/// Free space below which the filesystem of the SQLite database counts as full for readiness: a commit
/// of a few hundred events needs more, and SQLite may still fit a tiny probe into WAL pages it already
/// has, so a write probe alone could call a full disk writable.
pub const MIN_FREE_BYTES: u64 = 1 << 20;

impl SqliteSource {
    /// Fails with [`std::io::ErrorKind::StorageFull`] when the database's filesystem has less than
    /// [`MIN_FREE_BYTES`] free for this process.
    fn check_free_space(&self) -> Result<(), SourceError> {
        let Some(dir) = self
            .connection
            .path()
            .filter(|path| !path.is_empty())
            .and_then(|path| Path::new(path).parent().map(Path::to_path_buf))
        else {
            return Ok(());
        };
        let stat = rustix::fs::statvfs(&dir).map_err(std::io::Error::from)?;
        let free = stat.f_bavail.saturating_mul(stat.f_frsize);
        if free < MIN_FREE_BYTES {
            return Err(SourceError::Io(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!(
                    "disk full: {free} bytes free on {} (rankgate needs at least {MIN_FREE_BYTES})",
                    dir.display()
                ),
            )));
        }
        Ok(())
    }
}

impl SourceOfTruth for SqliteSource {
    fn probe(&mut self, write: bool) -> Result<(), SourceError> {
        self.connection.query_row("SELECT 1", [], |_| Ok(()))?;
        self.check_free_space()?;
        if write {
            let now_ms = jiff::Timestamp::now().as_millisecond();
            self.connection.execute(
                "INSERT INTO meta (key, value) VALUES ('readiness_probe', ?1)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                params![now_ms.to_string()],
            )?;
        }
        Ok(())
    }

    fn commit(&mut self, batch: &CommitBatch) -> Result<(), SourceError> {
        let transaction = self.connection.transaction()?;
        // Counted as written, kept only once the transaction commits.
        let mut metrics = self.metrics;
        {
            // Each hour's packed columns are sized first (a length prefix is at most 10 bytes), so they
            // are not regrown and copied event by event.
            let mut sizes: std::collections::BTreeMap<Hour, (usize, usize)> = Default::default();
            for (hour, id, body) in &batch.events {
                let (ids, bodies) = sizes.entry(*hour).or_default();
                *ids += id.as_str().len() + 10;
                *bodies += body.len() + 10;
            }
            let mut by_hour: std::collections::BTreeMap<Hour, (Vec<u8>, Vec<u8>)> = sizes
                .into_iter()
                .map(|(hour, (ids, bodies))| (hour, (Vec::with_capacity(ids), Vec::with_capacity(bodies))))
                .collect();
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
            // The batch's coalesced deltas: one blob, appended (see `metric_cells`).
            if !batch.metric_deltas.is_empty() {
                let mut blob = Vec::with_capacity(batch.metric_deltas.len() * 24);
                let (mut previous, mut max_hour) = (0, i64::MIN);
                for (hour, product, delta) in &batch.metric_deltas {
                    metric_cells::push_cell(&mut blob, &mut previous, *hour, product.as_str(), delta);
                    max_hour = max_hour.max(hour.0);
                }
                transaction
                    .prepare_cached(
                        "INSERT INTO metric_deltas (seq, max_hour, cells, blob) VALUES (?1, ?2, ?3, ?4)",
                    )?
                    .execute(params![
                        self.next_seq,
                        max_hour,
                        batch.metric_deltas.len() as i64,
                        blob
                    ])?;
                metrics.pending_cells += batch.metric_deltas.len() as u64;
            }
            // Enough cells pending: fold them into the hour blobs in this same transaction, so a failed
            // compaction fails the batch and nothing is acknowledged or lost.
            if metrics.should_compact(metrics.pending_cells) {
                let sums = pending_sums(&transaction, metrics.floor)?;
                let gained = fold_into_hour_blobs(&transaction, sums)?;
                transaction.execute("DELETE FROM metric_deltas", [])?;
                metrics.packed_cells = metrics.packed_cells.saturating_add_signed(gained);
                metrics.pending_cells = 0;
            }
            execute_in_chunks(
                &transaction,
                &batch.new_memberships,
                membership_inserts(),
                |statement, first, (product, category)| {
                    statement.raw_bind_parameter(first, product.as_str())?;
                    statement.raw_bind_parameter(first + 1, category.as_str())
                },
            )?;
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
        self.metrics = metrics;
        Ok(())
    }

    fn load(&mut self) -> Result<LoadedState, SourceError> {
        let mut state = LoadedState::default();
        // Hour blobs in hour order, each with its pending deltas folded in; hours only the batch blobs
        // hold come in between, so the rows stay in hour order.
        let floor = self.metrics.floor;
        let mut pending = pending_sums(&self.connection, floor)?;
        fn push_hour(
            rows: &mut Vec<(Hour, ProductId, Metrics)>,
            hour: Hour,
            cells: impl IntoIterator<Item = (ProductId, Metrics)>,
        ) {
            rows.extend(
                cells
                    .into_iter()
                    .map(|(product, metrics)| (hour, product, metrics)),
            );
        }
        let mut statement = self
            .connection
            .prepare("SELECT hour, blob FROM metrics_packed ORDER BY hour")?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            let hour = Hour(row.get(0)?);
            if floor.is_some_and(|floor| hour < floor) {
                continue;
            }
            for (earlier, sums) in pending.take_before(Some(hour)) {
                push_hour(&mut state.metrics, earlier, sums);
            }
            let blob = row
                .get_ref(1)?
                .as_blob()
                .map_err(|e| corrupt("metrics_packed.blob", e))?;
            let cells = metric_cells::folded_hour(hour, blob, pending.take_hour(hour))
                .map_err(|e| corrupt("metrics_packed.blob", e))?;
            push_hour(&mut state.metrics, hour, cells);
        }
        for (hour, sums) in pending.take_before(None) {
            push_hour(&mut state.metrics, hour, sums);
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
        state.catalog = self.load_catalog()?;
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
        transaction.execute_batch(
            "DELETE FROM metric_deltas; DELETE FROM metrics_packed; DELETE FROM metrics_hourly;",
        )?;
        let mut sums = CellSums::default();
        for (hour, product, metrics) in rows {
            sums.add(*hour, product.as_str(), metrics)
                .map_err(SourceError::Invalid)?;
        }
        let packed = fold_into_hour_blobs(&transaction, sums)?;
        transaction.commit()?;
        self.metrics.pending_cells = 0;
        self.metrics.packed_cells = u64::try_from(packed).map_err(|e| corrupt("metrics_packed.cells", e))?;
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
        // Hour blobs below the cut go; a batch blob only once its newest cell is below it (one can
        // straddle the cut: the floor drops its older cells whenever it is read).
        let floor = self
            .metrics
            .floor
            .map_or(metrics_before, |floor| floor.max(metrics_before));
        transaction.execute("DELETE FROM metrics_packed WHERE hour < ?1", params![floor.0])?;
        transaction.execute("DELETE FROM metric_deltas WHERE max_hour < ?1", params![floor.0])?;
        transaction.execute(
            "INSERT INTO meta (key, value) VALUES ('metrics_floor_hour', ?1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![floor.0.to_string()],
        )?;
        let metrics = MetricTables {
            compact_at_least: self.metrics.compact_at_least,
            ..MetricTables::read(&transaction)?
        };
        transaction.commit()?;
        self.metrics = metrics;
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

    fn put_catalog(
        &mut self,
        updates: &[(ProductId, CatalogUpdate)],
    ) -> Result<Vec<(ProductId, CatalogEntry)>, SourceError> {
        let transaction = self.connection.transaction()?;
        let written = {
            let mut read =
                transaction.prepare_cached("SELECT product, body, listed FROM catalog WHERE product = ?1")?;
            let written = merge_updates(updates, |product| {
                Ok::<_, SourceError>(
                    read_catalog_rows(&mut read, params![product.as_str()])?
                        .pop()
                        .map(|(_, entry)| entry),
                )
            })?;
            let mut upsert = transaction.prepare_cached(
                "INSERT OR REPLACE INTO catalog (product, body, listed) VALUES (?1, ?2, ?3)",
            )?;
            for (product, entry) in &written {
                upsert.execute(params![product.as_str(), entry.fields_json(), entry.listed])?;
            }
            written
        };
        transaction.commit()?;
        Ok(written)
    }

    fn load_catalog(&mut self) -> Result<Vec<(ProductId, CatalogEntry)>, SourceError> {
        let mut statement = self
            .connection
            .prepare_cached("SELECT product, body, listed FROM catalog ORDER BY product")?;
        read_catalog_rows(&mut statement, [])
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::ranking::conformance::{batch_of, DAY0};

    fn stored(source: &mut SqliteSource) -> Vec<(i64, String, Metrics)> {
        let metrics = source.load().expect("load").metrics;
        let hours: Vec<i64> = metrics.iter().map(|(hour, _, _)| hour.0).collect();
        assert!(hours.windows(2).all(|w| w[0] <= w[1]), "rows come in hour order");
        let mut rows: Vec<_> = metrics
            .into_iter()
            .map(|(hour, product, metrics)| (hour.0, product.as_str().to_string(), metrics))
            .collect();
        rows.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        rows
    }

    fn expected(naive: &BTreeMap<(i64, String), Metrics>, floor: Option<i64>) -> Vec<(i64, String, Metrics)> {
        naive
            .iter()
            .filter(|((hour, _), _)| floor.is_none_or(|floor| *hour >= floor))
            .map(|((hour, product), metrics)| (*hour, product.clone(), *metrics))
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Batch blobs, compactions at any threshold, a retention cut and a reopen: what loads is always
        /// the plain sum of every batch's deltas above the cut.
        #[test]
        fn packed_cells_load_the_sum_of_every_batch(
            batches in proptest::collection::vec(
                proptest::collection::vec((0i64..30, 0usize..6, -3i64..5), 1..12),
                1..25,
            ),
            compact_at in 1u64..40,
            evict_after in 0usize..30,
            cut in 0i64..30,
        ) {
            let dir = tempfile::tempdir().expect("temp dir");
            let mut source = SqliteSource::open(dir.path()).expect("open");
            source.metrics.compact_at_least = compact_at;
            let mut naive: BTreeMap<(i64, String), Metrics> = BTreeMap::new();
            let mut floor = None;
            for (i, cells) in batches.iter().enumerate() {
                let ids: Vec<String> = (0..cells.len()).map(|j| format!("e{i}-{j}")).collect();
                let products: Vec<String> = cells.iter().map(|(_, p, _)| format!("p{p}")).collect();
                let events: Vec<_> = cells
                    .iter()
                    .enumerate()
                    .map(|(j, &(hour, _, n))| {
                        let delta = Metrics { views: n.max(0), likes: n, ..Metrics::default() };
                        (DAY0 + hour, ids[j].as_str(), products[j].as_str(), delta)
                    })
                    .collect();
                source.commit(&batch_of(&events)).expect("commit");
                for &(hour, _, product, delta) in &events {
                    let sum = naive.entry((hour, product.to_string())).or_default();
                    *sum = sum.checked_add(&delta).unwrap();
                }
                if i == evict_after {
                    source.evict(Hour(DAY0 + cut), Hour(DAY0 + cut)).expect("evict");
                    floor = Some(DAY0 + cut);
                }
                prop_assert_eq!(stored(&mut source), expected(&naive, floor));
            }
            drop(source);
            let mut reopened = SqliteSource::open(dir.path()).expect("reopen");
            prop_assert_eq!(stored(&mut reopened), expected(&naive, floor));
        }
    }

    /// Retention can empty the raw log while a batch blob of metrics (kept longer) stays: the next
    /// batch after a reopen still gets a batch number of its own.
    #[test]
    fn a_batch_after_the_raw_log_expired_still_commits() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut source = SqliteSource::open(dir.path()).expect("open");
        let one = Metrics {
            views: 1,
            ..Metrics::default()
        };
        source.commit(&batch_of(&[(DAY0 + 5, "e1", "a", one)])).unwrap();
        source.evict(Hour(DAY0 + 100), Hour(DAY0)).unwrap();
        drop(source);
        let mut source = SqliteSource::open(dir.path()).expect("reopen");
        source
            .commit(&batch_of(&[(DAY0 + 6, "e2", "a", one)]))
            .expect("a new batch number");
        let hours: Vec<i64> = stored(&mut source).into_iter().map(|(hour, _, _)| hour).collect();
        assert_eq!(hours, [DAY0 + 5, DAY0 + 6]);
    }

    /// A database from before packed cells keeps every metric row: they move into hour blobs on open,
    /// and later batches add to them.
    #[test]
    fn metric_rows_from_before_packed_cells_are_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        drop(SqliteSource::open(dir.path()).expect("create"));
        let connection = Connection::open(dir.path().join("rankings.sqlite3")).unwrap();
        connection
            .execute_batch(&format!(
                "INSERT INTO metrics_hourly VALUES
                   ({h}, 'a', 3, 1, 0, 0), ({h}, 'b', 1, 0, 2, 500), ({g}, 'a', 7, 0, 0, 0);",
                h = DAY0 + 2,
                g = DAY0 + 1
            ))
            .unwrap();
        drop(connection);
        let mut source = SqliteSource::open(dir.path()).expect("open");
        let m = |views, likes, units, sales| Metrics {
            views,
            likes,
            units,
            sales,
        };
        assert_eq!(
            stored(&mut source),
            [
                (DAY0 + 1, "a".to_string(), m(7, 0, 0, 0)),
                (DAY0 + 2, "a".to_string(), m(3, 1, 0, 0)),
                (DAY0 + 2, "b".to_string(), m(1, 0, 2, 500)),
            ]
        );
        source
            .commit(&batch_of(&[(DAY0 + 2, "x", "a", m(1, 0, 0, 0))]))
            .unwrap();
        drop(source);
        let rows: i64 = Connection::open(dir.path().join("rankings.sqlite3"))
            .unwrap()
            .query_row("SELECT COUNT(*) FROM metrics_hourly", [], |row| row.get(0))
            .unwrap();
        assert_eq!(rows, 0, "the old rows moved");
        let mut source = SqliteSource::open(dir.path()).expect("reopen");
        assert_eq!(stored(&mut source)[1], (DAY0 + 2, "a".to_string(), m(4, 1, 0, 0)));
    }
}
