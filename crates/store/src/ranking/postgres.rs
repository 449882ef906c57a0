//! The PostgreSQL source of truth, for deployments where several rankgate instances share one database.
//!
//! Why it is built this way:
//! - **Blocking client** (`postgres`, not `tokio-postgres`): [`SourceOfTruth`] runs on one dedicated writer
//!   thread that group-commits, so a synchronous client costs nothing in concurrency, keeps the trait
//!   identical for SQLite and PostgreSQL, and never blocks the async runtime. (The blocking client drives
//!   a private current-thread runtime: construct and use it off the async runtime, e.g. on the writer
//!   thread or in `spawn_blocking`.)
//! - **Own schema**: every table lives in one schema (created if missing), so tests and deployments
//!   isolate themselves in a shared database. Migrations are versioned in `schema_migrations`, run on
//!   [`PostgresSource::connect`] and by [`PostgresSource::migrate`]; concurrent instances serialize on an
//!   advisory lock, so starting several at once is safe.
//! - **Batched writes**: one micro-batch is one transaction of a constant number of round trips (seven,
//!   eight when it creates metric rows; see `commit_once`), never one statement per event: new ids go in
//!   with binary `COPY`, everything else as multi-row statements over `unnest($arrays)`. The commit's
//!   statements are prepared once per connection. A 2,000-event batch commits in ~20 ms on a 2-core
//!   machine (bench/results/2026-11-30-issues2-3-4.md, "PostgreSQL source of truth: commit throughput").
//! - **The database arbitrates duplicates** ([`SourceOfTruth::commit_deduped`]). An id is counted once,
//!   ever, whatever its event time, but a unique index on a time-partitioned table must include the
//!   partition key, so `(hour, id)` alone cannot catch the same id at two different hours, and probing
//!   every day partition's `id` index for every id of a batch costs 2,000 × 31 descents with 30 days
//!   retained. Instead each source keeps an exact in-memory set of every processed id (`Known`, loaded
//!   with [`SourceOfTruth::load`] or read inside its first commit) and a cursor in a commit feed: every
//!   commit takes a per-schema transaction-level advisory lock, draws one `processed_seq` value and
//!   stores it with each id it inserts (migration 3), and first reads every `processed` row with
//!   `seq > cursor` (one probe of each partition's `seq` index): what other instances committed since.
//!   Because every writer draws its `seq` under the lock and commits before releasing it, nothing below
//!   the newest value is still invisible, so the set is exact when the batch is decided against it;
//!   only unseen ids are inserted, and metric deltas and raw log rows are applied only for those, in the
//!   same transaction. The `(hour, id)` primary key stays as a safety net: a repeat it can see aborts
//!   the commit rather than double counting. Retention drops whole day partitions, and the set forgets
//!   the ids of every day whose partition is gone (whoever dropped it) at the next `evict`.
//! - **Raw log packed per (batch, hour)**, as in SQLite: one `event_log` row holds the bodies of every
//!   event of one batch in one hour, newline-separated (canonical JSON has no raw newline; a body with
//!   one is refused), keyed by the hour and the first of those ids. Unlike SQLite's old rows, ids are
//!   never joined: `processed` keeps one `text` row per id, so an id cannot move a boundary (and a NUL,
//!   which `text` cannot hold, is refused by `EventId` since SPEC 1.1). A batch thus writes a row per hour,
//!   not per event; `processed` keeps one row per id for the exact dedupe. Rows written one per event
//!   (before this layout) read back the same way, so no migration was needed.
//! - **Time partitions**: `processed` and `event_log` are `PARTITION BY RANGE (hour)`, one partition per
//!   UTC day, created on demand (inside the commit, under the lock) by `ensure_day_partitions`. Retention
//!   ([`SourceOfTruth::evict`]) drops whole day partitions, never deletes log rows; a day straddling the
//!   cut is kept until all of it is older (retention is a floor). Metric rows are deleted by range.
//! - **Restarts**: a failed commit returns an error (nothing acknowledged). On a connection error the
//!   client reconnects once and retries the whole transaction. Each commit call writes a random token
//!   with its ids, so a retry whose first attempt did commit (reply lost) recognizes its own rows in the
//!   commit feed (the cursor only moves past them once a commit's reply arrived) and reports the same
//!   outcome instead of counting anything twice.
//! - The raw log is scanned hour by hour and, within an hour, in commit order (`seq` from one sequence,
//!   assigned in batch order, then the order inside a packed row), as the trait asks.
//! - **Policy states** ([`PolicyState`]) live in `ranker_state` (active, previous, building, latest,
//!   `state_seq`; migration 4) and `policies` (one row of weights per version, never changed once
//!   written). [`SourceOfTruth::transition_policies`] locks the ranker's row with `SELECT … FOR UPDATE`,
//!   applies the pure transition and writes the row back in the same transaction, so concurrent PUTs
//!   and rollbacks through several instances apply one after the other. Every
//!   [`SourceOfTruth::changes_since`] returns every ranker's whole state in its snapshot; followers keep
//!   the newer ones by `state_seq`.
//! - Migrations are `.sql` files in `migrations/`, compiled in with `include_str!`.
//! - **Catalogue** rows (display fields as JSON text, and the `listed` flag; migration 5) are merged
//!   ([`CatalogEntry::merged`]) inside a transaction that holds the write lock, so concurrent writes
//!   through several instances all land, and each written row draws `change_seq`: the change feed carries
//!   a delisting to every instance like a metric row.
//! - Ids and products are `text COLLATE "C"` so ordering is bytewise, as in SQLite; the catalogue and
//!   policy weights are stored as JSON text so they round-trip exactly.

use std::collections::{HashMap, HashSet};

use ::postgres::binary_copy::BinaryCopyInWriter;
use ::postgres::fallible_iterator::FallibleIterator;
use ::postgres::types::{ToSql, Type};
use ::postgres::{Client, NoTls, Statement, Transaction};

use rankgate_core::ids::{Category, EventId, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::Hour;
use rankgate_core::policy::{PolicyError, PolicyState};
use rankgate_core::ranker::{Policy, PopularWeights, RankerName};

use super::catalog::{merge_updates, CatalogEntry, CatalogUpdate};
use super::source::{Changes, CommitBatch, LoadedState, SourceError, SourceOfTruth};

/// Advisory lock class ("RG") for writes to one schema's partitioned tables; the key is the schema's hash.
const WRITE_LOCK_CLASS: i32 = 0x5247;
/// Advisory lock class for migrations of one schema.
const MIGRATE_LOCK_CLASS: i32 = 0x5248;
/// Hours per partition of `processed` and `event_log`.
const PARTITION_HOURS: i64 = 24;
/// Rows per statement when a bulk write is not bounded by a micro-batch (`replace_metrics`).
const BULK_ROWS: usize = 10_000;

/// Versioned migrations, one `.sql` file each under `migrations/`; `{s}` is replaced by the quoted schema
/// name. Never edit one that shipped (existing databases have applied it): add one.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("migrations/0001_initial.sql")),
    (2, include_str!("migrations/0002_change_feed.sql")),
    (3, include_str!("migrations/0003_processed_seq.sql")),
    (4, include_str!("migrations/0004_policy_state.sql")),
    (5, include_str!("migrations/0005_catalog_listing.sql")),
];

/// The PostgreSQL source of truth: one connection, one schema.
pub struct PostgresSource {
    url: String,
    schema: String,
    client: Client,
    /// The commit path's statements, prepared once per connection (see [`Statements`]).
    statements: Statements,
    /// Every processed id of the schema as of `Known::cursor`, from [`SourceOfTruth::load`] or, failing
    /// that, read inside the first commit. `None` until then.
    known: Option<Known>,
}

/// The exact set of processed ids a source has seen, whoever committed them: the dedupe arbiter of
/// [`SourceOfTruth::commit_deduped`]. Kept exact by the commit feed (migration 3): under the write lock a
/// commit first reads every `processed` row with `seq > cursor`, i.e. what other writers committed since
/// (they drew their `seq` under the same lock, so every smaller value is already visible), then decides
/// against this set. Each id maps to its day partition, so retention can forget what was dropped.
#[derive(Default)]
struct Known {
    ids: hashbrown::HashMap<Box<str>, i64>,
    /// The largest `processed.seq` whose rows are all in `ids`.
    cursor: i64,
}

impl Known {
    fn learn(&mut self, id: &str, hour: i64, seq: i64) {
        if !self.ids.contains_key(id) {
            self.ids.insert(id.into(), hour.div_euclid(PARTITION_HOURS));
        }
        self.cursor = self.cursor.max(seq);
    }
}

/// Statements prepared once per connection and reused by every commit, so a micro-batch pays neither
/// a parse round trip nor re-planning per statement. Prepared statements belong to the server session:
/// the cache is emptied whenever the connection is replaced. (The server re-plans a cached statement by
/// itself when a partition it covers is created or dropped.)
#[derive(Default)]
struct Statements(HashMap<&'static str, Statement>);

impl Statements {
    fn get(
        &mut self,
        transaction: &mut Transaction<'_>,
        sql: &'static str,
    ) -> Result<Statement, SourceError> {
        if let Some(statement) = self.0.get(sql) {
            return Ok(statement.clone());
        }
        let statement = transaction.prepare(sql)?;
        self.0.insert(sql, statement.clone());
        Ok(statement)
    }
}

impl std::fmt::Debug for PostgresSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSource")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

fn check_schema_name(schema: &str) -> Result<(), SourceError> {
    let mut chars = schema.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if first_ok && rest_ok && schema.len() <= 63 {
        Ok(())
    } else {
        Err(SourceError::Invalid(format!(
            "schema name {schema:?} must be 1-63 characters of a-z, 0-9 and _, not starting with a digit"
        )))
    }
}

fn open_client(url: &str, schema: &str) -> Result<Client, ::postgres::Error> {
    let mut client = Client::connect(url, NoTls)?;
    client.batch_execute(&format!("SET search_path TO \"{schema}\""))?;
    Ok(client)
}

/// True when an error means the connection is gone (server restart, network), so a fresh connection
/// may succeed where this one failed.
fn is_connection_error(error: &SourceError, client: &Client) -> bool {
    let SourceError::Postgres(error) = error else {
        return false;
    };
    if error.is_closed() || client.is_closed() {
        return true;
    }
    match error.code() {
        // class 08: connection exceptions; 57P01-03: admin shutdown, crash shutdown, cannot connect now.
        Some(code) => code.code().starts_with("08") || ["57P01", "57P02", "57P03"].contains(&code.code()),
        // No SQLSTATE: an I/O or protocol failure rather than a rejected statement.
        None => error.as_db_error().is_none() && std::error::Error::source(error).is_some(),
    }
}

fn corrupt(what: &str, error: impl std::fmt::Display) -> SourceError {
    SourceError::Corrupt(format!("{what}: {error}"))
}

fn day_of(hour: Hour) -> i64 {
    hour.0.div_euclid(PARTITION_HOURS)
}

impl PostgresSource {
    /// Connects to `url` (a libpq-style URL or key=value string; TLS is not enabled), creates `schema`
    /// if missing and runs pending migrations. `schema` must be a plain lowercase identifier.
    pub fn connect(url: &str, schema: &str) -> Result<PostgresSource, SourceError> {
        check_schema_name(schema)?;
        let client = open_client(url, schema)?;
        let mut source = PostgresSource {
            url: url.to_owned(),
            schema: schema.to_owned(),
            client,
            statements: Statements::default(),
            known: None,
        };
        source.migrate()?;
        Ok(source)
    }

    /// Applies every migration not yet recorded in `schema_migrations`, in one transaction, under an
    /// advisory lock so that concurrent callers apply each migration once. Idempotent. Returns the
    /// versions applied by this call.
    pub fn migrate(&mut self) -> Result<Vec<i32>, SourceError> {
        let schema = self.schema.clone();
        self.with_reconnect(OnConnectionLoss::RetryOnce, |client, _| {
            let mut transaction = client.transaction()?;
            transaction.batch_execute(&format!(
                "SELECT pg_advisory_xact_lock({MIGRATE_LOCK_CLASS}, hashtext('{schema}'));
                 CREATE SCHEMA IF NOT EXISTS \"{schema}\";
                 CREATE TABLE IF NOT EXISTS \"{schema}\".schema_migrations (
                     version    integer PRIMARY KEY,
                     applied_at timestamptz NOT NULL DEFAULT now()
                 );"
            ))?;
            let applied: HashSet<i32> = transaction
                .query(
                    &format!("SELECT version FROM \"{schema}\".schema_migrations"),
                    &[],
                )?
                .iter()
                .map(|row| row.get(0))
                .collect();
            let mut newly = Vec::new();
            for (version, sql) in MIGRATIONS {
                if applied.contains(version) {
                    continue;
                }
                transaction.batch_execute(&sql.replace("{s}", &format!("\"{schema}\"")))?;
                transaction.execute(
                    &format!("INSERT INTO \"{schema}\".schema_migrations (version) VALUES ($1)"),
                    &[version],
                )?;
                newly.push(*version);
            }
            transaction.commit()?;
            Ok(newly)
        })
    }

    /// The schema this source lives in.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Days (UTC hour / 24) that currently have a raw event log partition, ascending.
    pub fn partition_days(&mut self) -> Result<Vec<i64>, SourceError> {
        self.with_reconnect(OnConnectionLoss::RetryOnce, |client, _| {
            let mut transaction = client.transaction()?;
            let mut days = partitions(&mut transaction, "event_log")?
                .into_iter()
                .map(|(day, _)| day)
                .collect::<Vec<_>>();
            days.sort_unstable();
            Ok(days)
        })
    }

    /// The server process id of the current connection (operations, and tests that kill it).
    pub fn backend_pid(&mut self) -> Result<i32, SourceError> {
        self.with_reconnect(OnConnectionLoss::RetryOnce, |client, _| {
            Ok(client.query_one("SELECT pg_backend_pid()", &[])?.get(0))
        })
    }

    /// Drops this source's whole schema and everything in it (tests, decommissioning). Irreversible.
    pub fn drop_schema(mut self) -> Result<(), SourceError> {
        let schema = self.schema.clone();
        self.with_reconnect(OnConnectionLoss::RetryOnce, |client, _| {
            client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))?;
            Ok(())
        })
    }

    fn reconnect(&mut self) -> Result<(), SourceError> {
        self.statements = Statements::default();
        self.client = open_client(&self.url, &self.schema)?;
        Ok(())
    }

    /// Runs `op`; a connection known dead is replaced first, and a connection error is handled as
    /// `on_loss` says.
    fn with_reconnect<T>(
        &mut self,
        on_loss: OnConnectionLoss,
        mut op: impl FnMut(&mut Client, &mut Statements) -> Result<T, SourceError>,
    ) -> Result<T, SourceError> {
        if self.client.is_closed() {
            self.reconnect()?;
        }
        match op(&mut self.client, &mut self.statements) {
            Err(error)
                if on_loss == OnConnectionLoss::RetryOnce && is_connection_error(&error, &self.client) =>
            {
                tracing::warn!(%error, schema = %self.schema, "postgres connection lost; reconnecting and retrying once");
                self.reconnect()?;
                op(&mut self.client, &mut self.statements)
            }
            result => result,
        }
    }

    fn write_lock(&self) -> String {
        format!(
            "SELECT pg_advisory_xact_lock({WRITE_LOCK_CLASS}, hashtext('{}'))",
            self.schema
        )
    }
}

/// What [`PostgresSource::with_reconnect`] does when its operation fails because the connection was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnConnectionLoss {
    /// Reconnect and run the operation once more from the start. Only for an operation that is one
    /// whole transaction: the lost attempt either committed nothing, or committed and is recognised
    /// (the per-call token of a commit), so running it again is safe.
    RetryOnce,
    /// Return the error (the next call reconnects). For an operation with effects outside the
    /// database: `scan_event_log`'s visitor may already have seen rows, which a rerun would repeat.
    Fail,
}

/// (day, table name) of each partition of `parent`.
fn partitions(transaction: &mut Transaction<'_>, parent: &str) -> Result<Vec<(i64, String)>, SourceError> {
    let rows = transaction.query(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = to_regclass($1)",
        &[&parent],
    )?;
    let prefix = format!("{parent}_d");
    let mut found = Vec::with_capacity(rows.len());
    for row in rows {
        let name: String = row.get(0);
        let day = name
            .strip_prefix(&prefix)
            .and_then(|day| day.parse::<i64>().ok())
            .ok_or_else(|| corrupt("partition name", &name))?;
        found.push((day, name));
    }
    Ok(found)
}

/// Inserts metric rows that do not exist yet, [`BULK_ROWS`] per statement.
fn insert_metrics(
    transaction: &mut Transaction<'_>,
    rows: &[(Hour, ProductId, Metrics)],
) -> Result<(), SourceError> {
    for chunk in rows.chunks(BULK_ROWS) {
        let hours: Vec<i64> = chunk.iter().map(|r| r.0 .0).collect();
        let products: Vec<&str> = chunk.iter().map(|r| r.1.as_str()).collect();
        let views: Vec<i64> = chunk.iter().map(|r| r.2.views).collect();
        let likes: Vec<i64> = chunk.iter().map(|r| r.2.likes).collect();
        let units: Vec<i64> = chunk.iter().map(|r| r.2.units).collect();
        let sales: Vec<i64> = chunk.iter().map(|r| r.2.sales).collect();
        transaction.execute(
            INSERT_METRICS_SQL,
            &[&hours, &products, &views, &likes, &units, &sales],
        )?;
    }
    Ok(())
}

/// The commit feed (migration 3): every `processed` row committed after `cursor`, by any writer. One
/// probe of each partition's `seq` index; commits set `enable_seqscan = off` locally, because a generic
/// plan for `seq > $1` would otherwise scan whole partitions.
const SINCE_SQL: &str = "SELECT id::text, hour, seq, batch FROM processed WHERE seq > $1";

/// Every stored id, read once by a source whose set was not loaded (`Known`).
const ALL_IDS_SQL: &str = "SELECT id::text, hour, seq, batch FROM processed";

/// The new ids go in with binary `COPY`: PostgreSQL then fills heap pages with multi-row inserts (one
/// WAL record per page instead of per row), each with this commit's `processed_seq` value. Nothing can
/// conflict: under the write lock the exact in-memory set already removed every id that is stored, and
/// in-batch repeats were removed before it, so a unique violation here would be a bug and fails the
/// whole commit (the primary key stays as that safety net; it catches a repeat within one hour only).
const COPY_PROCESSED_SQL: &str = "COPY processed (hour, id, batch, seq) FROM STDIN (FORMAT binary)";

/// Everything else a batch writes, in one statement (one round trip): packed raw log rows, new
/// memberships, the monotonic meta values, and the metric deltas of rows that already exist, as a plain
/// `UPDATE` joined on the primary key (each updated row draws `change_seq`). It returns the ordinal of
/// every delta it applied; the others are new rows for [`INSERT_METRICS_SQL`]. A plain `UPDATE` costs
/// less than `INSERT … ON CONFLICT DO UPDATE`, which writes a speculative insertion, a row lock and the
/// update for each row (and draws `change_seq` twice).
const APPLY_SQL: &str = r#"
WITH log AS (
    INSERT INTO event_log (hour, id, body)
    SELECT h, i, b FROM unnest($1::bigint[], $2::text[], $3::bytea[]) WITH ORDINALITY AS t(h, i, b, n)
    ORDER BY n
), memberships AS (
    INSERT INTO product_categories (product, category) SELECT * FROM unnest($10::text[], $11::text[])
    ON CONFLICT DO NOTHING
), meta AS (
    INSERT INTO meta (key, value) SELECT * FROM unnest($12::text[], $13::bigint[])
    ON CONFLICT (key) DO UPDATE SET value = GREATEST(meta.value, excluded.value)
)
UPDATE metrics_hourly m SET
    views = m.views + d.views, likes = m.likes + d.likes, units = m.units + d.units, sales = m.sales + d.sales,
    change_seq = nextval('change_seq')
FROM unnest($4::bigint[], $5::text[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[])
     WITH ORDINALITY AS d(hour, product, views, likes, units, sales, n)
WHERE m.hour = d.hour AND m.product = d.product COLLATE "C"
RETURNING d.n
"#;

/// Metric rows the batch creates. They cannot exist: every writer of `metrics_hourly` holds the write
/// lock, and [`APPLY_SQL`] just found no row for them.
const INSERT_METRICS_SQL: &str = "INSERT INTO metrics_hourly (hour, product, views, likes, units, sales)
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[])";

/// Raw log rows of one batch: one row per hour it touches, holding that hour's bodies in batch order,
/// newline-separated (canonical JSON never contains a raw newline), keyed by the hour and the row's first
/// event id. Returns (hours, first ids, packed bodies).
fn pack_log<'a>(batch: &'a CommitBatch, new_index: &[usize]) -> (Vec<i64>, Vec<&'a str>, Vec<Vec<u8>>) {
    let mut rows: std::collections::BTreeMap<i64, (&'a str, Vec<u8>)> = Default::default();
    for &i in new_index {
        let (hour, id, body) = &batch.events[i];
        let (_, packed) = rows.entry(hour.0).or_insert_with(|| (id.as_str(), Vec::new()));
        if !packed.is_empty() {
            packed.push(b'\n');
        }
        packed.extend_from_slice(body);
    }
    let mut hours = Vec::with_capacity(rows.len());
    let mut ids = Vec::with_capacity(rows.len());
    let mut bodies = Vec::with_capacity(rows.len());
    for (hour, (id, body)) in rows {
        hours.push(hour);
        ids.push(id);
        bodies.push(body);
    }
    (hours, ids, bodies)
}

/// One commit attempt: the whole transaction. Returns per event whether this call counted it.
///
/// Round trips: BEGIN; the write lock, day partitions and this commit's `processed_seq` value (one
/// simple-protocol batch); the commit feed since `known`'s cursor ([`SINCE_SQL`]); the `COPY` of new ids
/// (two); [`APPLY_SQL`] for everything else; [`INSERT_METRICS_SQL`] if the batch creates metric rows;
/// COMMIT. The first commit on a connection also prepares the statements, and the first commit of a
/// source that did not `load` reads every stored id ([`ALL_IDS_SQL`]).
///
/// `known` learns what other writers committed as soon as it is read (those rows are committed, whatever
/// happens to this transaction), and this batch's new ids only once COMMIT succeeded. A retry whose
/// first attempt committed (reply lost) finds its own rows, by `token`, in the feed after the cursor.
fn commit_once(
    client: &mut Client,
    statements: &mut Statements,
    known: &mut Option<Known>,
    lock: &str,
    batch: &CommitBatch,
    token: i64,
) -> Result<Vec<bool>, SourceError> {
    let mut transaction = client.transaction()?;
    let mut days: Vec<i64> = batch.events.iter().map(|(hour, _, _)| day_of(*hour)).collect();
    days.sort_unstable();
    days.dedup();
    let days = days.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let messages = transaction.simple_query(&format!(
        "SET LOCAL enable_seqscan = off; {lock}; SELECT ensure_day_partitions('{{{days}}}'::bigint[]);
         SELECT nextval('processed_seq')"
    ))?;
    let seq: i64 = messages
        .iter()
        .rev()
        .find_map(|message| match message {
            ::postgres::SimpleQueryMessage::Row(row) => row.get(0),
            _ => None,
        })
        .ok_or_else(|| corrupt("processed_seq", "nextval returned no row"))?
        .parse()
        .map_err(|e| corrupt("processed_seq", e))?;
    // What other writers committed since this source last looked; all of it on a source's first commit.
    let (rows, fresh) = match known.as_ref() {
        Some(set) => {
            let since = statements.get(&mut transaction, SINCE_SQL)?;
            (transaction.query(&since, &[&set.cursor])?, None)
        }
        None => {
            transaction.batch_execute("SET LOCAL enable_seqscan = on")?;
            let rows = transaction.query(ALL_IDS_SQL, &[])?;
            transaction.batch_execute("SET LOCAL enable_seqscan = off")?;
            (rows, Some(Known::default()))
        }
    };
    if let Some(fresh) = fresh {
        *known = Some(fresh);
    }
    let set = known.as_mut().expect("set above");
    let mut ours: HashSet<&str> = HashSet::new();
    for row in &rows {
        let id: &str = row.get(0);
        set.learn(id, row.get(1), row.get(2));
        if row.get::<_, i64>(3) == token {
            ours.insert(id);
        }
    }
    let mut counted = vec![false; batch.events.len()];
    if !ours.is_empty() {
        // An earlier attempt of this very call committed (its reply was lost): report its outcome.
        let mut reported = HashSet::new();
        for (flag, (_, id, _)) in counted.iter_mut().zip(&batch.events) {
            *flag = ours.contains(id.as_str()) && reported.insert(id.as_str());
        }
        return Ok(counted);
    }
    let mut counted_deltas: Option<Vec<(Hour, ProductId, Metrics)>> = None;
    let mut new_index: Vec<usize> = Vec::new();
    if !batch.events.is_empty() {
        let ids: Vec<&str> = batch.events.iter().map(|(_, id, _)| id.as_str()).collect();
        // First occurrence of each id within the batch and not processed before; later repeats never count.
        let mut first = HashSet::with_capacity(ids.len());
        let candidate_index: Vec<usize> = (0..ids.len())
            .filter(|&i| first.insert(ids[i]) && !set.ids.contains_key(ids[i]))
            .collect();
        for &i in &candidate_index {
            counted[i] = true;
        }
        // Index keys in order: (hour, id) for the primary key, and mostly ascending ids for the id index.
        let mut copy_order = candidate_index.clone();
        copy_order.sort_unstable_by(|&a, &b| (batch.events[a].0, ids[a]).cmp(&(batch.events[b].0, ids[b])));
        let copy = statements.get(&mut transaction, COPY_PROCESSED_SQL)?;
        let mut writer = BinaryCopyInWriter::new(
            transaction.copy_in(&copy)?,
            &[Type::INT8, Type::TEXT, Type::INT8, Type::INT8],
        );
        for &i in &copy_order {
            writer.write(&[&batch.events[i].0 .0, &ids[i], &token, &seq])?;
        }
        writer.finish()?;
        new_index = candidate_index;
        if new_index.len() < batch.events.len() {
            if batch.event_deltas.len() != batch.events.len() {
                return Err(SourceError::Invalid(
                    "some events were duplicates, and event_deltas is not parallel to events".into(),
                ));
            }
            // Same order and the same checked sums as the ingestor's re-coalescing.
            let mut sums: HashMap<(Hour, ProductId), Metrics> = HashMap::new();
            for &i in &new_index {
                let (product, delta) = &batch.event_deltas[i];
                let sum = sums.entry((batch.events[i].0, product.clone())).or_default();
                *sum = sum
                    .checked_add(delta)
                    .ok_or_else(|| SourceError::Invalid("a metric delta overflows 64 bits".into()))?;
            }
            let mut rows: Vec<_> = sums
                .into_iter()
                .map(|((hour, product), m)| (hour, product, m))
                .collect();
            rows.sort_unstable_by(|a, b| (a.0, a.1.as_str()).cmp(&(b.0, b.1.as_str())));
            counted_deltas = Some(rows);
        }
    }
    let (log_hours, log_ids, log_bodies) = pack_log(batch, &new_index);
    let deltas = counted_deltas.as_deref().unwrap_or(&batch.metric_deltas);
    let hours: Vec<i64> = deltas.iter().map(|r| r.0 .0).collect();
    let products: Vec<&str> = deltas.iter().map(|r| r.1.as_str()).collect();
    let views: Vec<i64> = deltas.iter().map(|r| r.2.views).collect();
    let likes: Vec<i64> = deltas.iter().map(|r| r.2.likes).collect();
    let units: Vec<i64> = deltas.iter().map(|r| r.2.units).collect();
    let sales: Vec<i64> = deltas.iter().map(|r| r.2.sales).collect();
    let member_products: Vec<&str> = batch.new_memberships.iter().map(|(p, _)| p.as_str()).collect();
    let member_categories: Vec<&str> = batch.new_memberships.iter().map(|(_, c)| c.as_str()).collect();
    // Monotonic across instances: the newest watermark and ingest time win.
    let mut keys: Vec<&str> = Vec::new();
    let mut values: Vec<i64> = Vec::new();
    if let Some(watermark) = batch.watermark_millis {
        keys.push("watermark_millis");
        values.push(watermark);
    }
    if let Some(ingested_at) = batch.ingested_at_millis {
        keys.push("last_ingest_millis");
        values.push(ingested_at);
    }
    let apply = statements.get(&mut transaction, APPLY_SQL)?;
    let mut updated = vec![false; deltas.len()];
    for row in transaction.query(
        &apply,
        &[
            &log_hours,
            &log_ids,
            &log_bodies,
            &hours,
            &products,
            &views,
            &likes,
            &units,
            &sales,
            &member_products,
            &member_categories,
            &keys,
            &values,
        ],
    )? {
        let ordinal: i64 = row.get(0);
        updated[usize::try_from(ordinal - 1).map_err(|e| corrupt("update ordinal", e))?] = true;
    }
    if updated.iter().any(|&done| !done) {
        let fresh = |column: &[i64]| -> Vec<i64> {
            column
                .iter()
                .zip(&updated)
                .filter(|(_, &done)| !done)
                .map(|(&v, _)| v)
                .collect()
        };
        let fresh_products: Vec<&str> = products
            .iter()
            .zip(&updated)
            .filter(|(_, &done)| !done)
            .map(|(&p, _)| p)
            .collect();
        let insert = statements.get(&mut transaction, INSERT_METRICS_SQL)?;
        transaction.execute(
            &insert,
            &[
                &fresh(&hours),
                &fresh_products,
                &fresh(&views),
                &fresh(&likes),
                &fresh(&units),
                &fresh(&sales),
            ],
        )?;
    }
    transaction.commit()?;
    // Durable: this batch's new ids join the set, and nothing below `seq` is unread (the lock was held).
    let set = known.as_mut().expect("set above");
    for &i in &new_index {
        let (hour, id, _) = &batch.events[i];
        set.learn(id.as_str(), hour.0, seq);
    }
    set.cursor = set.cursor.max(seq);
    Ok(counted)
}

/// A stored `processed.id`. One with a control character was accepted before SPEC 1.1 refused them;
/// no event can carry it again, so it needs no place in a caller's dedupe set (`None`) and must not
/// stop a start or a retention run. (Such ids are one row each here, so they never corrupted the log as
/// SQLite's newline-joined rows did; the raw log packs only bodies, which are canonical JSON and never
/// hold a raw newline.)
fn stored_event_id(id: &str) -> Result<Option<EventId>, SourceError> {
    match EventId::parse(id) {
        Ok(id) => Ok(Some(id)),
        Err(rankgate_core::ids::IdError::ControlCharacter) => Ok(None),
        Err(error) => Err(corrupt("processed.id", error)),
    }
}

fn parse_product(value: &str, what: &str) -> Result<ProductId, SourceError> {
    ProductId::parse(value).map_err(|e| corrupt(what, e))
}

/// The stored policy state of `ranker` (every ranker when `None`), with the weights of the versions it
/// names.
fn read_policy_states(
    transaction: &mut Transaction<'_>,
    ranker: Option<RankerName>,
) -> Result<Vec<(RankerName, PolicyState)>, SourceError> {
    let sql = "SELECT s.ranker, s.active_version, a.weights, s.previous_version, p.weights, s.latest_version,
                s.building_version, b.weights, s.state_seq
         FROM ranker_state s
         JOIN policies a ON a.ranker = s.ranker AND a.version = s.active_version
         LEFT JOIN policies p ON p.ranker = s.ranker AND p.version = s.previous_version
         LEFT JOIN policies b ON b.ranker = s.ranker AND b.version = s.building_version
         WHERE $1::text IS NULL OR s.ranker = $1";
    let name = ranker.map(RankerName::as_str);
    let policy =
        |row: &::postgres::Row, version: usize, weights: usize| -> Result<Option<Policy>, SourceError> {
            let Some(number) = row.get::<_, Option<i64>>(version) else {
                return Ok(None);
            };
            let weights: Option<&str> = row.get(weights);
            let weights =
                weights.ok_or_else(|| corrupt("policies", format!("version {number} has no weights")))?;
            Ok(Some(Policy {
                version: version_u32(number, "policies.version")?,
                weights: serde_json::from_str::<PopularWeights>(weights)
                    .map_err(|e| corrupt("policies.weights", e))?,
            }))
        };
    let mut states = Vec::new();
    for row in transaction.query(sql, &[&name])? {
        let ranker: &str = row.get(0);
        let ranker = RankerName::parse(ranker).map_err(|e| corrupt("ranker_state.ranker", e))?;
        states.push((
            ranker,
            PolicyState {
                active: policy(&row, 1, 2)?.expect("active_version is NOT NULL"),
                previous: policy(&row, 3, 4)?,
                building: policy(&row, 6, 7)?,
                latest_version: version_u32(row.get(5), "ranker_state.latest_version")?,
                seq: u64::try_from(row.get::<_, i64>(8)).map_err(|e| corrupt("ranker_state.state_seq", e))?,
            },
        ));
    }
    Ok(states)
}

/// Stores the weights of every version `state` names; a version's weights never change once created.
fn store_versions(
    transaction: &mut Transaction<'_>,
    ranker: RankerName,
    state: &PolicyState,
) -> Result<(), SourceError> {
    for policy in [Some(state.active), state.previous, state.building]
        .into_iter()
        .flatten()
    {
        let weights = serde_json::to_string(&policy.weights).map_err(|e| corrupt("policy weights", e))?;
        transaction.execute(
            "INSERT INTO policies (ranker, version, weights) VALUES ($1, $2, $3)
             ON CONFLICT (ranker, version) DO NOTHING",
            &[&ranker.as_str(), &i64::from(policy.version), &weights],
        )?;
    }
    Ok(())
}

/// One `catalog` row of `product, body, listed`.
fn catalog_row(row: &::postgres::Row) -> Result<(ProductId, CatalogEntry), SourceError> {
    let product: &str = row.get(0);
    let body: &str = row.get(1);
    Ok((
        parse_product(product, "catalog.product")?,
        CatalogEntry::from_stored(body, row.get(2)).map_err(|e| corrupt("catalog.body", e))?,
    ))
}

/// Every catalogue entry with its `change_seq`, or only those written after `since`.
fn read_catalog(
    transaction: &mut Transaction<'_>,
    since: Option<i64>,
) -> Result<Vec<(ProductId, CatalogEntry, i64)>, SourceError> {
    let rows = transaction.query(
        "SELECT product::text, body, listed, change_seq FROM catalog WHERE change_seq > $1 ORDER BY change_seq",
        &[&since.unwrap_or(i64::MIN)],
    )?;
    rows.iter()
        .map(|row| {
            let (product, entry) = catalog_row(row)?;
            Ok((product, entry, row.get(3)))
        })
        .collect()
}

fn version_u32(value: i64, what: &str) -> Result<u32, SourceError> {
    u32::try_from(value).map_err(|e| corrupt(what, e))
}

impl SourceOfTruth for PostgresSource {
    fn probe(&mut self, write: bool) -> Result<(), SourceError> {
        self.with_reconnect(OnConnectionLoss::RetryOnce, |client, _| {
            if write {
                let now_ms = jiff::Timestamp::now().as_millisecond();
                client.execute(
                    "INSERT INTO meta (key, value) VALUES ('readiness_probe', $1)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    &[&now_ms],
                )?;
            } else {
                client.batch_execute("SELECT 1")?;
            }
            Ok(())
        })
    }

    fn commit(&mut self, batch: &CommitBatch) -> Result<(), SourceError> {
        // The database dedupes anyway; a caller that deduped itself sees every event counted.
        self.commit_deduped(batch).map(|_| ())
    }

    fn commit_deduped(&mut self, batch: &CommitBatch) -> Result<Vec<bool>, SourceError> {
        if batch.events.iter().any(|(_, _, body)| body.contains(&b'\n')) {
            return Err(SourceError::Invalid(
                "an event body contains a raw newline; bodies are single-line canonical JSON".into(),
            ));
        }
        let token: i64 = rand::random();
        let lock = self.write_lock();
        let mut known = self.known.take();
        let result = self.with_reconnect(OnConnectionLoss::RetryOnce, |client, statements| {
            commit_once(client, statements, &mut known, &lock, batch, token)
        });
        self.known = known;
        result
    }

    fn load(&mut self) -> Result<LoadedState, SourceError> {
        let (state, known) = self.with_reconnect(OnConnectionLoss::RetryOnce, |client, _| {
            let mut transaction = client.build_transaction().read_only(true).isolation_level(::postgres::IsolationLevel::RepeatableRead).start()?;
            let mut state = LoadedState::default();
            for row in transaction.query(
                "SELECT hour, product::text, views, likes, units, sales FROM metrics_hourly ORDER BY hour, product",
                &[],
            )? {
                let product: &str = row.get(1);
                state.metrics.push((
                    Hour(row.get(0)),
                    parse_product(product, "metrics_hourly.product")?,
                    Metrics { views: row.get(2), likes: row.get(3), units: row.get(4), sales: row.get(5) },
                ));
            }
            for row in transaction.query("SELECT product::text, category::text FROM product_categories", &[])? {
                let product: &str = row.get(0);
                let category: &str = row.get(1);
                state.memberships.push((
                    parse_product(product, "product_categories.product")?,
                    Category::parse(category).map_err(|e| corrupt("product_categories.category", e))?,
                ));
            }
            // The same snapshot's ids become this source's dedupe set. Its cursor is the largest `seq`
            // seen: writers draw `seq` under the write lock and commit before releasing it, so every
            // smaller value this snapshot does not show was never committed.
            let mut known = Known::default();
            let mut rows = transaction.query_raw("SELECT id::text, hour, seq FROM processed", std::iter::empty::<&dyn ToSql>())?;
            while let Some(row) = rows.next()? {
                let id: &str = row.get(0);
                state.processed_ids.extend(stored_event_id(id)?);
                known.learn(id, row.get(1), row.get(2));
            }
            drop(rows);
            for row in transaction.query("SELECT key, value FROM meta", &[])? {
                let key: &str = row.get(0);
                match key {
                    "watermark_millis" => state.watermark_millis = Some(row.get(1)),
                    "last_ingest_millis" => state.last_ingest_millis = Some(row.get(1)),
                    _ => {}
                }
            }
            state.catalog = read_catalog(&mut transaction, None)?
                .into_iter()
                .map(|(product, entry, _)| (product, entry))
                .collect();
            state.change_cursor = transaction
                .query_one(
                    "SELECT GREATEST((SELECT COALESCE(MAX(change_seq), 0) FROM metrics_hourly),
                                     (SELECT COALESCE(MAX(change_seq), 0) FROM product_categories),
                                     (SELECT COALESCE(MAX(change_seq), 0) FROM catalog))",
                    &[],
                )?
                .get(0);
            transaction.commit()?;
            Ok((state, known))
        })?;
        self.known = Some(known);
        Ok(state)
    }

    fn changes_since(&mut self, cursor: i64) -> Result<Option<Changes>, SourceError> {
        self.with_reconnect(OnConnectionLoss::RetryOnce, |client, _| {
            // One snapshot for every query: commits draw change_seq values under the write lock, so
            // every value below the snapshot's maximum is already visible and the cursor skips nothing.
            let mut transaction = client
                .build_transaction()
                .read_only(true)
                .isolation_level(::postgres::IsolationLevel::RepeatableRead)
                .start()?;
            let mut changes = Changes { cursor, ..Changes::default() };
            for row in transaction.query(
                "SELECT hour, product::text, views, likes, units, sales, change_seq FROM metrics_hourly
                 WHERE change_seq > $1 ORDER BY change_seq",
                &[&cursor],
            )? {
                let product: &str = row.get(1);
                changes.metrics.push((
                    Hour(row.get(0)),
                    parse_product(product, "metrics_hourly.product")?,
                    Metrics { views: row.get(2), likes: row.get(3), units: row.get(4), sales: row.get(5) },
                ));
                changes.cursor = changes.cursor.max(row.get(6));
            }
            for row in transaction.query(
                "SELECT product::text, category::text, change_seq FROM product_categories WHERE change_seq > $1",
                &[&cursor],
            )? {
                let product: &str = row.get(0);
                let category: &str = row.get(1);
                changes.memberships.push((
                    parse_product(product, "product_categories.product")?,
                    Category::parse(category).map_err(|e| corrupt("product_categories.category", e))?,
                ));
                changes.cursor = changes.cursor.max(row.get(2));
            }
            for row in transaction.query("SELECT key, value FROM meta", &[])? {
                let key: &str = row.get(0);
                match key {
                    "watermark_millis" => changes.watermark_millis = Some(row.get(1)),
                    "last_ingest_millis" => changes.last_ingest_millis = Some(row.get(1)),
                    _ => {}
                }
            }
            for (product, entry, seq) in read_catalog(&mut transaction, Some(cursor))? {
                changes.catalog.push((product, entry));
                changes.cursor = changes.cursor.max(seq);
            }
            // Policy states travel whole (one small row per ranker): the follower keeps what is newer
            // than what it has seen by `state_seq`, so they need no cursor of their own.
            changes.policies = read_policy_states(&mut transaction, None)?;
            transaction.commit()?;
            Ok(Some(changes))
        })
    }

    fn scan_event_log(&mut self, visit: &mut dyn FnMut(Hour, &[u8])) -> Result<(), SourceError> {
        // No retry: `visit` may already have seen rows when a connection drops.
        self.with_reconnect(OnConnectionLoss::Fail, |client, _| {
            let mut transaction = client.build_transaction().read_only(true).start()?;
            let mut rows = transaction.query_raw(
                "SELECT hour, body FROM event_log ORDER BY hour, seq",
                std::iter::empty::<&dyn ToSql>(),
            )?;
            while let Some(row) = rows.next()? {
                // A row holds one event, or (packed) several newline-separated ones in commit order.
                let hour = Hour(row.get(0));
                for body in row.get::<_, &[u8]>(1).split(|&byte| byte == b'\n') {
                    visit(hour, body);
                }
            }
            drop(rows);
            transaction.commit()?;
            Ok(())
        })
    }

    fn replace_metrics(&mut self, rows: &[(Hour, ProductId, Metrics)]) -> Result<(), SourceError> {
        let lock = self.write_lock();
        self.with_reconnect(OnConnectionLoss::RetryOnce, |client, _| {
            let mut transaction = client.transaction()?;
            transaction.batch_execute(&lock)?;
            transaction.execute("DELETE FROM metrics_hourly", &[])?;
            insert_metrics(&mut transaction, rows)?;
            transaction.commit()?;
            Ok(())
        })
    }

    fn evict(&mut self, events_before: Hour, metrics_before: Hour) -> Result<Vec<EventId>, SourceError> {
        let lock = self.write_lock();
        let (mut forgotten, kept) = self.with_reconnect(OnConnectionLoss::RetryOnce, |client, _| {
            let mut transaction = client.transaction()?;
            transaction.batch_execute(&lock)?;
            let expired = |day: i64| (day + 1) * PARTITION_HOURS <= events_before.0;
            let mut forgotten = Vec::new();
            for (day, name) in partitions(&mut transaction, "processed")? {
                if !expired(day) {
                    continue;
                }
                for row in transaction.query(&format!("SELECT id::text FROM \"{name}\""), &[])? {
                    let id: &str = row.get(0);
                    forgotten.extend(stored_event_id(id)?);
                }
                transaction.batch_execute(&format!("DROP TABLE \"{name}\""))?;
            }
            for (day, name) in partitions(&mut transaction, "event_log")? {
                if expired(day) {
                    transaction.batch_execute(&format!("DROP TABLE \"{name}\""))?;
                }
            }
            transaction.execute("DELETE FROM metrics_hourly WHERE hour < $1", &[&metrics_before.0])?;
            let kept: HashSet<i64> = partitions(&mut transaction, "processed")?
                .into_iter()
                .map(|(day, _)| day)
                .collect();
            transaction.commit()?;
            Ok((forgotten, kept))
        })?;
        // The dedupe set forgets every id whose day partition is gone, also when another instance dropped
        // it; those ids are reported too, so the caller's own set forgets them as well.
        if let Some(known) = self.known.as_mut() {
            let reported: HashSet<&str> = forgotten.iter().map(EventId::as_str).collect();
            let mut gone = Vec::new();
            known.ids.retain(|id, day| {
                if !kept.contains(day) && !reported.contains(&**id) {
                    gone.push(id.clone());
                }
                kept.contains(day)
            });
            for id in gone {
                forgotten.extend(stored_event_id(&id)?);
            }
        }
        Ok(forgotten)
    }

    fn load_policies(&mut self, ranker: RankerName) -> Result<Option<PolicyState>, SourceError> {
        self.with_reconnect(OnConnectionLoss::RetryOnce, |client, _| {
            let mut transaction = client.build_transaction().read_only(true).start()?;
            let state = read_policy_states(&mut transaction, Some(ranker))?.pop();
            transaction.commit()?;
            Ok(state.map(|(_, state)| state))
        })
    }

    fn transition_policies(
        &mut self,
        ranker: RankerName,
        transition: &mut dyn FnMut(&mut PolicyState) -> Result<(), PolicyError>,
    ) -> Result<PolicyState, SourceError> {
        self.with_reconnect(OnConnectionLoss::RetryOnce, |client, _| {
            let mut transaction = client.transaction()?;
            // The row every transition of this ranker locks; created once, by whoever comes first.
            let initial = PolicyState::initial_for(ranker);
            store_versions(&mut transaction, ranker, &initial)?;
            transaction.execute(
                "INSERT INTO ranker_state (ranker, active_version, previous_version, latest_version, state_seq)
                 VALUES ($1, $2, NULL, $3, 0) ON CONFLICT (ranker) DO NOTHING",
                &[
                    &ranker.as_str(),
                    &i64::from(initial.active.version),
                    &i64::from(initial.latest_version),
                ],
            )?;
            // Locked until commit: a concurrent transition through another instance waits here and then
            // reads what this one stored, so transitions apply in one order. The lock is its own
            // statement: under READ COMMITTED the next one takes a fresh snapshot, which shows the
            // versions the previous holder inserted (a joined read in the locking statement would not).
            transaction.execute(
                "SELECT 1 FROM ranker_state WHERE ranker = $1 FOR UPDATE",
                &[&ranker.as_str()],
            )?;
            let (_, stored) = read_policy_states(&mut transaction, Some(ranker))?
                .pop()
                .ok_or_else(|| corrupt("ranker_state", "the row inserted above is missing"))?;
            let mut state = stored;
            transition(&mut state)?;
            if state != stored {
                store_versions(&mut transaction, ranker, &state)?;
                transaction.execute(
                    "UPDATE ranker_state SET active_version = $2, previous_version = $3, latest_version = $4,
                       building_version = $5, state_seq = $6
                     WHERE ranker = $1",
                    &[
                        &ranker.as_str(),
                        &i64::from(state.active.version),
                        &state.previous.map(|p| i64::from(p.version)),
                        &i64::from(state.latest_version),
                        &state.building.map(|p| i64::from(p.version)),
                        &i64::try_from(state.seq).map_err(|e| corrupt("policy state seq", e))?,
                    ],
                )?;
            }
            transaction.commit()?;
            Ok(state)
        })
    }

    fn put_catalog(
        &mut self,
        updates: &[(ProductId, CatalogUpdate)],
    ) -> Result<Vec<(ProductId, CatalogEntry)>, SourceError> {
        let lock = self.write_lock();
        self.with_reconnect(OnConnectionLoss::RetryOnce, |client, _| {
            let mut transaction = client.transaction()?;
            // Under the write lock: the merge reads what the last writer stored, and `change_seq` values
            // become visible in the order they were drawn (see `changes_since`).
            transaction.batch_execute(&lock)?;
            let products: Vec<&str> = updates.iter().map(|(product, _)| product.as_str()).collect();
            let mut stored: HashMap<ProductId, CatalogEntry> = HashMap::new();
            for row in transaction.query(
                "SELECT product::text, body, listed FROM catalog WHERE product = ANY($1::text[])",
                &[&products],
            )? {
                let (product, entry) = catalog_row(&row)?;
                stored.insert(product, entry);
            }
            let written = merge_updates(updates, |product| Ok::<_, SourceError>(stored.remove(product)))?;
            let products: Vec<&str> = written.iter().map(|(product, _)| product.as_str()).collect();
            let bodies: Vec<String> = written.iter().map(|(_, entry)| entry.fields_json()).collect();
            let listed: Vec<bool> = written.iter().map(|(_, entry)| entry.listed).collect();
            transaction.execute(
                "INSERT INTO catalog (product, body, listed)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::bool[])
                 ON CONFLICT (product) DO UPDATE
                 SET body = excluded.body, listed = excluded.listed, change_seq = nextval('change_seq')",
                &[&products, &bodies, &listed],
            )?;
            transaction.commit()?;
            Ok(written)
        })
    }

    fn load_catalog(&mut self) -> Result<Vec<(ProductId, CatalogEntry)>, SourceError> {
        self.with_reconnect(OnConnectionLoss::RetryOnce, |client, _| {
            let mut transaction = client.build_transaction().read_only(true).start()?;
            let entries = read_catalog(&mut transaction, None)?;
            transaction.commit()?;
            Ok(entries
                .into_iter()
                .map(|(product, entry, _)| (product, entry))
                .collect())
        })
    }
}
