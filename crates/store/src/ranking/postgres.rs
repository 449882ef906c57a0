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
//! - **Batched writes**: one micro-batch is one transaction of a constant number of statements, each a
//!   multi-row `INSERT … SELECT FROM unnest($arrays) ON CONFLICT …`, never one statement per event.
//! - **The database arbitrates duplicates** ([`SourceOfTruth::commit_deduped`]). An id is counted once,
//!   ever, whatever its event time, but a unique index on a time-partitioned table must include the
//!   partition key, so `(hour, id)` alone cannot catch the same id at two different hours. Each commit
//!   therefore takes a per-schema transaction-level advisory lock, looks the batch's ids up in every
//!   retained partition (index on `id`), and inserts only the unseen ones with
//!   `ON CONFLICT DO NOTHING RETURNING id`; metric deltas and raw log rows are applied only for the
//!   returned ids, in the same transaction. Commits from several instances are serialized by the lock,
//!   which is what makes the lookup-then-insert exact; within one instance there is one writer anyway.
//! - **Time partitions**: `processed` and `event_log` are `PARTITION BY RANGE (hour)`, one partition per
//!   UTC day, created on demand (inside the commit, under the lock) by `ensure_day_partitions`. Retention
//!   ([`SourceOfTruth::evict`]) drops whole day partitions, never deletes log rows; a day straddling the
//!   cut is kept until all of it is older (retention is a floor). Metric rows are deleted by range.
//! - **Restarts**: a failed commit returns an error (nothing acknowledged). On a connection error the
//!   client reconnects once and retries the whole transaction. Each commit call writes a random token
//!   with its ids, so a retry whose first attempt did commit (reply lost) recognizes its own rows and
//!   reports the same outcome instead of counting anything twice.
//! - The raw log is scanned hour by hour and, within an hour, in commit order (`seq` from one sequence,
//!   assigned in batch order), as the trait asks.
//! - Ids and products are `text COLLATE "C"` so ordering is bytewise, as in SQLite; the catalogue and
//!   policy weights are stored as JSON text so they round-trip exactly.

use std::collections::{HashMap, HashSet};

use ::postgres::fallible_iterator::FallibleIterator;
use ::postgres::types::ToSql;
use ::postgres::{Client, NoTls, Transaction};

use rankgate_core::ids::{Category, EventId, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::Hour;
use rankgate_core::ranker::{Policy, PopularWeights, RankerName};

use super::source::{Changes, CommitBatch, LoadedState, RankerPolicies, SourceError, SourceOfTruth};

/// Advisory lock class ("RG") for writes to one schema's partitioned tables; the key is the schema's hash.
const WRITE_LOCK_CLASS: i32 = 0x5247;
/// Advisory lock class for migrations of one schema.
const MIGRATE_LOCK_CLASS: i32 = 0x5248;
/// Hours per partition of `processed` and `event_log`.
const PARTITION_HOURS: i64 = 24;
/// Rows per statement when a bulk write is not bounded by a micro-batch (`replace_metrics`).
const BULK_ROWS: usize = 10_000;

/// Versioned migrations; `{s}` is replaced by the quoted schema name. Never edit one that shipped: add one.
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        r#"
CREATE TABLE {s}.metrics_hourly (
    hour    bigint NOT NULL,
    product text COLLATE "C" NOT NULL,
    views   bigint NOT NULL,
    likes   bigint NOT NULL,
    units   bigint NOT NULL,
    sales   bigint NOT NULL,
    PRIMARY KEY (hour, product)
);
CREATE TABLE {s}.processed (
    hour  bigint NOT NULL,
    id    text COLLATE "C" NOT NULL,
    batch bigint NOT NULL,
    PRIMARY KEY (hour, id)
) PARTITION BY RANGE (hour);
CREATE INDEX processed_id ON {s}.processed (id);
CREATE SEQUENCE {s}.event_log_seq;
CREATE TABLE {s}.event_log (
    hour bigint NOT NULL,
    id   text COLLATE "C" NOT NULL,
    seq  bigint NOT NULL DEFAULT nextval('event_log_seq'),
    body bytea NOT NULL,
    PRIMARY KEY (hour, id)
) PARTITION BY RANGE (hour);
CREATE INDEX event_log_order ON {s}.event_log (hour, seq);
CREATE TABLE {s}.product_categories (
    product  text COLLATE "C" NOT NULL,
    category text COLLATE "C" NOT NULL,
    PRIMARY KEY (product, category)
);
CREATE TABLE {s}.policies (
    ranker  text NOT NULL,
    version bigint NOT NULL,
    weights text NOT NULL,
    PRIMARY KEY (ranker, version)
);
CREATE TABLE {s}.ranker_state (
    ranker           text PRIMARY KEY,
    active_version   bigint NOT NULL,
    previous_version bigint,
    latest_version   bigint NOT NULL
);
CREATE TABLE {s}.catalog (
    product text COLLATE "C" PRIMARY KEY,
    body    text NOT NULL
);
CREATE TABLE {s}.meta (
    key   text PRIMARY KEY,
    value bigint NOT NULL
);
CREATE FUNCTION {s}.ensure_day_partitions(days bigint[]) RETURNS void
LANGUAGE plpgsql SET search_path = {s} AS $$
DECLARE
    d bigint;
    t text;
BEGIN
    FOREACH d IN ARRAY days LOOP
        FOREACH t IN ARRAY ARRAY['processed', 'event_log'] LOOP
            IF to_regclass(format('%I', t || '_d' || d)) IS NULL THEN
                EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%s) TO (%s)',
                               t || '_d' || d, t, d * 24, d * 24 + 24);
            END IF;
        END LOOP;
    END LOOP;
END
$$;
"#,
    ),
    (
        2,
        // A change feed for other instances: every metric or membership row written gets the next value of
        // `change_seq`. Commits hold the per-schema write lock while they draw values, so values become
        // visible in commit order and a follower's cursor never skips a row.
        r#"
CREATE SEQUENCE {s}.change_seq;
ALTER TABLE {s}.metrics_hourly ADD COLUMN change_seq bigint NOT NULL DEFAULT nextval('{s}.change_seq');
CREATE INDEX metrics_hourly_change ON {s}.metrics_hourly (change_seq);
ALTER TABLE {s}.product_categories ADD COLUMN change_seq bigint NOT NULL DEFAULT nextval('{s}.change_seq');
CREATE INDEX product_categories_change ON {s}.product_categories (change_seq);
"#,
    ),
];

/// The PostgreSQL source of truth: one connection, one schema.
pub struct PostgresSource {
    url: String,
    schema: String,
    client: Client,
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
        };
        source.migrate()?;
        Ok(source)
    }

    /// Applies every migration not yet recorded in `schema_migrations`, in one transaction, under an
    /// advisory lock so that concurrent callers apply each migration once. Idempotent. Returns the
    /// versions applied by this call.
    pub fn migrate(&mut self) -> Result<Vec<i32>, SourceError> {
        let schema = self.schema.clone();
        self.with_reconnect(true, |client| {
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
        self.with_reconnect(true, |client| {
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
        self.with_reconnect(true, |client| {
            Ok(client.query_one("SELECT pg_backend_pid()", &[])?.get(0))
        })
    }

    /// Drops this source's whole schema and everything in it (tests, decommissioning). Irreversible.
    pub fn drop_schema(mut self) -> Result<(), SourceError> {
        let schema = self.schema.clone();
        self.with_reconnect(true, |client| {
            client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))?;
            Ok(())
        })
    }

    fn reconnect(&mut self) -> Result<(), SourceError> {
        self.client = open_client(&self.url, &self.schema)?;
        Ok(())
    }

    /// Runs `op`; a connection known dead is replaced first, and with `retry`, a connection error
    /// reconnects once and runs `op` again from the start (it must be one whole transaction).
    fn with_reconnect<T>(
        &mut self,
        retry: bool,
        mut op: impl FnMut(&mut Client) -> Result<T, SourceError>,
    ) -> Result<T, SourceError> {
        if self.client.is_closed() {
            self.reconnect()?;
        }
        match op(&mut self.client) {
            Err(error) if retry && is_connection_error(&error, &self.client) => {
                tracing::warn!(%error, schema = %self.schema, "postgres connection lost; reconnecting and retrying once");
                self.reconnect()?;
                op(&mut self.client)
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

fn upsert_metrics(
    transaction: &mut Transaction<'_>,
    rows: &[(Hour, ProductId, Metrics)],
    accumulate: bool,
) -> Result<(), SourceError> {
    for chunk in rows.chunks(BULK_ROWS) {
        let hours: Vec<i64> = chunk.iter().map(|r| r.0 .0).collect();
        let products: Vec<&str> = chunk.iter().map(|r| r.1.as_str()).collect();
        let views: Vec<i64> = chunk.iter().map(|r| r.2.views).collect();
        let likes: Vec<i64> = chunk.iter().map(|r| r.2.likes).collect();
        let units: Vec<i64> = chunk.iter().map(|r| r.2.units).collect();
        let sales: Vec<i64> = chunk.iter().map(|r| r.2.sales).collect();
        let conflict = if accumulate {
            "ON CONFLICT (hour, product) DO UPDATE SET
               views = metrics_hourly.views + excluded.views, likes = metrics_hourly.likes + excluded.likes,
               units = metrics_hourly.units + excluded.units, sales = metrics_hourly.sales + excluded.sales,
               change_seq = nextval('change_seq')"
        } else {
            ""
        };
        transaction.execute(
            &format!(
                "INSERT INTO metrics_hourly (hour, product, views, likes, units, sales)
                 SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[])
                 {conflict}"
            ),
            &[&hours, &products, &views, &likes, &units, &sales],
        )?;
    }
    Ok(())
}

/// One commit attempt: the whole transaction. Returns per event whether this call counted it.
fn commit_once(
    client: &mut Client,
    lock: &str,
    batch: &CommitBatch,
    token: i64,
) -> Result<Vec<bool>, SourceError> {
    let mut transaction = client.transaction()?;
    transaction.batch_execute(lock)?;
    let mut counted = vec![false; batch.events.len()];
    let mut counted_deltas: Option<Vec<(Hour, ProductId, Metrics)>> = None;
    if !batch.events.is_empty() {
        let mut days: Vec<i64> = batch.events.iter().map(|(hour, _, _)| day_of(*hour)).collect();
        days.sort_unstable();
        days.dedup();
        transaction.execute("SELECT ensure_day_partitions($1::bigint[])", &[&days])?;

        let ids: Vec<&str> = batch.events.iter().map(|(_, id, _)| id.as_str()).collect();
        let mut seen: HashMap<String, i64> = HashMap::new();
        for row in transaction.query(
            "SELECT id::text, batch FROM processed WHERE id = ANY($1::text[])",
            &[&ids],
        )? {
            seen.insert(row.get(0), row.get(1));
        }
        if seen.values().any(|&batch_token| batch_token == token) {
            // An earlier attempt of this very call committed (its reply was lost): report its outcome.
            let mut reported = HashSet::new();
            for (flag, id) in counted.iter_mut().zip(&ids) {
                *flag = seen.get(*id) == Some(&token) && reported.insert(*id);
            }
            return Ok(counted);
        }
        // Candidates: not processed before, first occurrence within the batch.
        let mut candidates = HashSet::new();
        let candidate_index: Vec<usize> = (0..ids.len())
            .filter(|&i| !seen.contains_key(ids[i]) && candidates.insert(ids[i]))
            .collect();
        let hours: Vec<i64> = candidate_index.iter().map(|&i| batch.events[i].0 .0).collect();
        let candidate_ids: Vec<&str> = candidate_index.iter().map(|&i| ids[i]).collect();
        let inserted: HashSet<String> = transaction
            .query(
                "INSERT INTO processed (hour, id, batch)
                 SELECT h, i, $3 FROM unnest($1::bigint[], $2::text[]) AS t(h, i)
                 ON CONFLICT DO NOTHING RETURNING id::text",
                &[&hours, &candidate_ids, &token],
            )?
            .iter()
            .map(|row| row.get(0))
            .collect();
        for &i in &candidate_index {
            counted[i] = inserted.contains(ids[i]);
        }
        let new_index: Vec<usize> = candidate_index.into_iter().filter(|&i| counted[i]).collect();
        let log_hours: Vec<i64> = new_index.iter().map(|&i| batch.events[i].0 .0).collect();
        let log_ids: Vec<&str> = new_index.iter().map(|&i| ids[i]).collect();
        let log_bodies: Vec<&[u8]> = new_index.iter().map(|&i| batch.events[i].2.as_slice()).collect();
        transaction.execute(
            "INSERT INTO event_log (hour, id, body)
             SELECT h, i, b FROM unnest($1::bigint[], $2::text[], $3::bytea[]) WITH ORDINALITY AS t(h, i, b, n)
             ORDER BY n",
            &[&log_hours, &log_ids, &log_bodies],
        )?;
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
    upsert_metrics(
        &mut transaction,
        counted_deltas.as_deref().unwrap_or(&batch.metric_deltas),
        true,
    )?;
    if !batch.new_memberships.is_empty() {
        let products: Vec<&str> = batch.new_memberships.iter().map(|(p, _)| p.as_str()).collect();
        let categories: Vec<&str> = batch.new_memberships.iter().map(|(_, c)| c.as_str()).collect();
        transaction.execute(
            "INSERT INTO product_categories (product, category) SELECT * FROM unnest($1::text[], $2::text[])
             ON CONFLICT DO NOTHING",
            &[&products, &categories],
        )?;
    }
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
    if !keys.is_empty() {
        transaction.execute(
            "INSERT INTO meta (key, value) SELECT * FROM unnest($1::text[], $2::bigint[])
             ON CONFLICT (key) DO UPDATE SET value = GREATEST(meta.value, excluded.value)",
            &[&keys, &values],
        )?;
    }
    transaction.commit()?;
    Ok(counted)
}

fn parse_product(value: &str, what: &str) -> Result<ProductId, SourceError> {
    ProductId::parse(value).map_err(|e| corrupt(what, e))
}

fn version_u32(value: i64, what: &str) -> Result<u32, SourceError> {
    u32::try_from(value).map_err(|e| corrupt(what, e))
}

impl SourceOfTruth for PostgresSource {
    fn commit(&mut self, batch: &CommitBatch) -> Result<(), SourceError> {
        // The database dedupes anyway; a caller that deduped itself sees every event counted.
        self.commit_deduped(batch).map(|_| ())
    }

    fn commit_deduped(&mut self, batch: &CommitBatch) -> Result<Vec<bool>, SourceError> {
        let token: i64 = rand::random();
        let lock = self.write_lock();
        self.with_reconnect(true, |client| commit_once(client, &lock, batch, token))
    }

    fn load(&mut self) -> Result<LoadedState, SourceError> {
        self.with_reconnect(true, |client| {
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
            let mut rows = transaction.query_raw("SELECT id::text FROM processed", std::iter::empty::<&dyn ToSql>())?;
            while let Some(row) = rows.next()? {
                let id: &str = row.get(0);
                state.processed_ids.push(EventId::parse(id).map_err(|e| corrupt("processed.id", e))?);
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
            state.change_cursor = transaction
                .query_one(
                    "SELECT GREATEST((SELECT COALESCE(MAX(change_seq), 0) FROM metrics_hourly),
                                     (SELECT COALESCE(MAX(change_seq), 0) FROM product_categories))",
                    &[],
                )?
                .get(0);
            transaction.commit()?;
            Ok(state)
        })
    }

    fn changes_since(&mut self, cursor: i64) -> Result<Option<Changes>, SourceError> {
        self.with_reconnect(true, |client| {
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
            transaction.commit()?;
            Ok(Some(changes))
        })
    }

    fn scan_event_log(&mut self, visit: &mut dyn FnMut(Hour, &[u8])) -> Result<(), SourceError> {
        // No retry: `visit` may already have seen rows when a connection drops.
        self.with_reconnect(false, |client| {
            let mut transaction = client.build_transaction().read_only(true).start()?;
            let mut rows = transaction.query_raw(
                "SELECT hour, body FROM event_log ORDER BY hour, seq",
                std::iter::empty::<&dyn ToSql>(),
            )?;
            while let Some(row) = rows.next()? {
                visit(Hour(row.get(0)), row.get::<_, &[u8]>(1));
            }
            drop(rows);
            transaction.commit()?;
            Ok(())
        })
    }

    fn replace_metrics(&mut self, rows: &[(Hour, ProductId, Metrics)]) -> Result<(), SourceError> {
        let lock = self.write_lock();
        self.with_reconnect(true, |client| {
            let mut transaction = client.transaction()?;
            transaction.batch_execute(&lock)?;
            transaction.execute("DELETE FROM metrics_hourly", &[])?;
            upsert_metrics(&mut transaction, rows, false)?;
            transaction.commit()?;
            Ok(())
        })
    }

    fn evict(&mut self, events_before: Hour, metrics_before: Hour) -> Result<Vec<EventId>, SourceError> {
        let lock = self.write_lock();
        self.with_reconnect(true, |client| {
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
                    forgotten.push(EventId::parse(id).map_err(|e| corrupt("processed.id", e))?);
                }
                transaction.batch_execute(&format!("DROP TABLE \"{name}\""))?;
            }
            for (day, name) in partitions(&mut transaction, "event_log")? {
                if expired(day) {
                    transaction.batch_execute(&format!("DROP TABLE \"{name}\""))?;
                }
            }
            transaction.execute("DELETE FROM metrics_hourly WHERE hour < $1", &[&metrics_before.0])?;
            transaction.commit()?;
            Ok(forgotten)
        })
    }

    fn load_policies(&mut self, ranker: RankerName) -> Result<Option<RankerPolicies>, SourceError> {
        self.with_reconnect(true, |client| {
            let mut transaction = client.build_transaction().read_only(true).start()?;
            let Some(state) = transaction.query_opt(
                "SELECT active_version, previous_version, latest_version FROM ranker_state WHERE ranker = $1",
                &[&ranker.as_str()],
            )?
            else {
                return Ok(None);
            };
            let mut load_version = |version: i64| -> Result<Policy, SourceError> {
                let row = transaction.query_one(
                    "SELECT weights FROM policies WHERE ranker = $1 AND version = $2",
                    &[&ranker.as_str(), &version],
                )?;
                let weights: PopularWeights =
                    serde_json::from_str(row.get(0)).map_err(|e| corrupt("policies.weights", e))?;
                Ok(Policy {
                    version: version_u32(version, "policies.version")?,
                    weights,
                })
            };
            let active = load_version(state.get(0))?;
            let previous = state
                .get::<_, Option<i64>>(1)
                .map(&mut load_version)
                .transpose()?;
            let latest_version = version_u32(state.get(2), "ranker_state.latest_version")?;
            transaction.commit()?;
            Ok(Some(RankerPolicies {
                ranker,
                active,
                previous,
                latest_version,
            }))
        })
    }

    fn save_policies(&mut self, policies: &RankerPolicies) -> Result<(), SourceError> {
        self.with_reconnect(true, |client| {
            let mut transaction = client.transaction()?;
            for policy in std::iter::once(&policies.active).chain(policies.previous.iter()) {
                let weights =
                    serde_json::to_string(&policy.weights).map_err(|e| corrupt("policy weights", e))?;
                transaction.execute(
                    "INSERT INTO policies (ranker, version, weights) VALUES ($1, $2, $3)
                     ON CONFLICT (ranker, version) DO UPDATE SET weights = excluded.weights",
                    &[&policies.ranker.as_str(), &i64::from(policy.version), &weights],
                )?;
            }
            transaction.execute(
                "INSERT INTO ranker_state (ranker, active_version, previous_version, latest_version)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (ranker) DO UPDATE SET active_version = excluded.active_version,
                   previous_version = excluded.previous_version, latest_version = excluded.latest_version",
                &[
                    &policies.ranker.as_str(),
                    &i64::from(policies.active.version),
                    &policies.previous.map(|p| i64::from(p.version)),
                    &i64::from(policies.latest_version),
                ],
            )?;
            transaction.commit()?;
            Ok(())
        })
    }

    fn put_catalog(&mut self, entries: &[(ProductId, serde_json::Value)]) -> Result<(), SourceError> {
        // The last entry for a product wins, as with sequential upserts.
        let mut last: HashMap<&str, String> = HashMap::new();
        for (product, body) in entries {
            last.insert(product.as_str(), body.to_string());
        }
        let (products, bodies): (Vec<&str>, Vec<String>) = last.into_iter().unzip();
        self.with_reconnect(true, |client| {
            let mut transaction = client.transaction()?;
            transaction.execute(
                "INSERT INTO catalog (product, body) SELECT * FROM unnest($1::text[], $2::text[])
                 ON CONFLICT (product) DO UPDATE SET body = excluded.body",
                &[&products, &bodies],
            )?;
            transaction.commit()?;
            Ok(())
        })
    }

    fn load_catalog(&mut self) -> Result<Vec<(ProductId, serde_json::Value)>, SourceError> {
        self.with_reconnect(true, |client| {
            let mut entries = Vec::new();
            for row in client.query("SELECT product::text, body FROM catalog ORDER BY product", &[])? {
                let product: &str = row.get(0);
                let body: &str = row.get(1);
                entries.push((
                    parse_product(product, "catalog.product")?,
                    serde_json::from_str(body).map_err(|e| corrupt("catalog.body", e))?,
                ));
            }
            Ok(entries)
        })
    }
}
