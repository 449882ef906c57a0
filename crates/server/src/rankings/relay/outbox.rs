//! The shop's outbox table, on PostgreSQL or MySQL/MariaDB: claim the oldest unpublished rows with
//! `FOR UPDATE SKIP LOCKED`, mark them published, delete old published rows, measure the backlog.
//!
//! A batch is one transaction: the claim locks its rows (other relays skip them), the caller publishes
//! them, and only then are they marked and the transaction committed. A crash before the commit releases
//! the locks and leaves the rows unpublished, so they are sent again; never lost.

use std::time::Duration;

use anyhow::{bail, Context};
use mysql_async::prelude::Queryable;

/// Identifiers of the outbox table and its columns, validated so they can be spliced into SQL.
#[derive(Debug, Clone)]
pub struct OutboxTable {
    /// `table` or `schema.table`, each part already checked by [`sql_identifier`].
    pub table: String,
    /// Unique row id (the tie-break of the oldest-first order).
    pub id: String,
    /// Creation time: the oldest-first order and the oldest unpublished age.
    pub created: String,
    /// One event's JSON (SPEC 1.1).
    pub payload: String,
    /// NULL until published; set to the database's `now()` when the sink acknowledged the row.
    pub published: String,
}

/// Checks a SQL identifier: ASCII letter or `_`, then letters, digits or `_`, at most 63 bytes (the
/// PostgreSQL limit; MySQL allows 64). Names are quoted when used, so reserved words are fine, and
/// nothing else can reach the SQL text.
pub fn sql_identifier(flag: &str, value: &str) -> anyhow::Result<String> {
    let mut chars = value.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || value.len() > 63 || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        bail!(
            "{flag}: must be a SQL identifier (a letter or _, then letters, digits or _, at most 63 bytes), got {value:?}"
        );
    }
    Ok(value.to_owned())
}

/// Checks `--table`: `name` or `schema.name`.
pub fn table_name(value: &str) -> anyhow::Result<String> {
    let parts: Vec<&str> = value.split('.').collect();
    if parts.is_empty() || parts.len() > 2 {
        bail!("--table: must be `name` or `schema.name`, got {value:?}");
    }
    for part in &parts {
        sql_identifier("--table", part)?;
    }
    Ok(value.to_owned())
}

/// One claimed row: how to find it again inside the claiming transaction, and its payload.
#[derive(Debug)]
pub struct ClaimedRow {
    /// PostgreSQL: the row's `ctid` (stable while we hold its lock); MySQL: its id.
    pub locator: RowLocator,
    /// The payload as stored (one event's JSON, unless the shop wrote something else); empty when
    /// it was over `--max-payload-bytes`.
    pub payload: Vec<u8>,
    /// `Some(bytes)` when the payload was over `--max-payload-bytes`: it was not even read (memory stays
    /// bounded), is not sent, and is marked published like any invalid event, so it cannot block the
    /// outbox. No valid event comes near the limit (SPEC 1.1 caps every field).
    pub oversize: Option<i64>,
}

/// See [`ClaimedRow::locator`].
#[derive(Debug)]
pub enum RowLocator {
    /// A PostgreSQL tuple id as text, `(page,item)`.
    Ctid(String),
    /// A MySQL id value of whatever type the id column has.
    Id(mysql_async::Value),
}

/// Backlog figures for `/metrics` and the progress line.
#[derive(Debug, Clone, Copy, Default)]
pub struct Backlog {
    /// Unpublished rows.
    pub rows: i64,
    /// Age of the oldest unpublished row in seconds (0 when there is none).
    pub oldest_seconds: f64,
}

/// A connection to the outbox's database.
pub enum Outbox {
    /// PostgreSQL through tokio-postgres.
    Postgres {
        /// The client; its connection task runs on the runtime.
        client: tokio_postgres::Client,
        /// The SQL, built once from the validated names.
        sql: PostgresSql,
    },
    /// MySQL or MariaDB through mysql_async.
    MySql {
        /// One connection (a relay is one sequential loop).
        conn: mysql_async::Conn,
        /// The SQL, built once from the validated names.
        sql: MySqlSql,
    },
}

/// PostgreSQL statements of one outbox table.
pub struct PostgresSql {
    claim: String,
    mark: String,
    delete: String,
    backlog: String,
}

/// MySQL statements of one outbox table (the mark statement depends on the batch's length).
pub struct MySqlSql {
    claim: String,
    mark_prefix: String,
    delete: String,
    backlog: String,
}

fn pg_quote(table: &str) -> String {
    table
        .split('.')
        .map(|part| format!("\"{part}\""))
        .collect::<Vec<_>>()
        .join(".")
}

fn my_quote(table: &str) -> String {
    table
        .split('.')
        .map(|part| format!("`{part}`"))
        .collect::<Vec<_>>()
        .join(".")
}

impl PostgresSql {
    fn new(t: &OutboxTable) -> PostgresSql {
        let table = pg_quote(&t.table);
        let (id, created, payload, published) = (
            pg_quote(&t.id),
            pg_quote(&t.created),
            pg_quote(&t.payload),
            pg_quote(&t.published),
        );
        PostgresSql {
            // `::text` reads json, jsonb, text and varchar payload columns alike.
            claim: format!(
                "SELECT ctid::text, CASE WHEN octet_length({payload}::text) <= $2 THEN {payload}::text END, \
                 octet_length({payload}::text)::int8 FROM {table} WHERE {published} IS NULL \
                 ORDER BY {created}, {id} LIMIT $1 FOR UPDATE SKIP LOCKED"
            ),
            // By ctid: a TID scan, and no assumption about the id column's type. The ctid cannot
            // change under us: we hold the row's lock until the commit.
            mark: format!("UPDATE {table} SET {published} = now() WHERE ctid = ANY($1::text[]::tid[])"),
            delete: format!(
                "DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} \
                 WHERE {published} < now() - make_interval(secs => $1) LIMIT $2 FOR UPDATE SKIP LOCKED))"
            ),
            backlog: format!(
                "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min({created}))::float8, 0) \
                 FROM {table} WHERE {published} IS NULL"
            ),
        }
    }
}

impl MySqlSql {
    fn new(t: &OutboxTable) -> MySqlSql {
        let table = my_quote(&t.table);
        let (id, created, payload, published) = (
            my_quote(&t.id),
            my_quote(&t.created),
            my_quote(&t.payload),
            my_quote(&t.published),
        );
        MySqlSql {
            claim: format!(
                "SELECT {id}, IF(LENGTH({payload}) <= ?, {payload}, NULL), CAST(LENGTH({payload}) AS SIGNED) \
                 FROM {table} WHERE {published} IS NULL \
                 ORDER BY {created}, {id} LIMIT ? FOR UPDATE SKIP LOCKED"
            ),
            mark_prefix: format!("UPDATE {table} SET {published} = NOW(6) WHERE {id} IN ("),
            delete: format!("DELETE FROM {table} WHERE {published} < NOW(6) - INTERVAL ? SECOND LIMIT ?"),
            backlog: format!(
                "SELECT COUNT(*), COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN({created}), NOW(6)), 0) \
                 FROM {table} WHERE {published} IS NULL"
            ),
        }
    }
}

/// Which database a `--outbox` URL names.
pub fn is_postgres_url(url: &str) -> anyhow::Result<bool> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(true)
    } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        Ok(false)
    } else {
        // Never echo the URL: it may hold a password.
        bail!("--outbox: must start with postgres://, postgresql://, mysql:// or mariadb://")
    }
}

impl Outbox {
    /// Connects (bounded by `timeout`) and prepares the statements.
    pub async fn connect(url: &str, table: &OutboxTable, timeout: Duration) -> anyhow::Result<Outbox> {
        let connecting = async {
            if is_postgres_url(url)? {
                let config: tokio_postgres::Config = url
                    .parse()
                    .map_err(|_| anyhow::anyhow!("--outbox: not a valid PostgreSQL URL"))?;
                let (client, connection) = config
                    .connect(tokio_postgres::NoTls)
                    .await
                    .context("--outbox: connecting to PostgreSQL")?;
                tokio::spawn(async move {
                    if let Err(error) = connection.await {
                        tracing::warn!(%error, "outbox connection closed");
                    }
                });
                // A statement that hangs (a stuck server, a lock we should never wait for) fails the
                // batch after --timeout instead of stalling the relay; the batch is then retried.
                // synchronous_commit off, for this session only: a mark lost to a database crash just
                // after COMMIT leaves its rows unpublished, so they are sent again and absorbed by
                // event-id idempotency — the same outcome as a relay crash before COMMIT. Not waiting
                // for the WAL flush of every batch's mark roughly halves a batch's time.
                client
                    .batch_execute(&format!(
                        "SET statement_timeout = {}; SET synchronous_commit = off",
                        timeout.as_millis()
                    ))
                    .await
                    .context("--outbox: setting statement_timeout and synchronous_commit")?;
                Ok(Outbox::Postgres {
                    client,
                    sql: PostgresSql::new(table),
                })
            } else {
                let url = match url.strip_prefix("mariadb://") {
                    Some(rest) => format!("mysql://{rest}"),
                    None => url.to_owned(),
                };
                let opts = mysql_async::Opts::from_url(&url)
                    .map_err(|_| anyhow::anyhow!("--outbox: not a valid MySQL URL"))?;
                let mut conn = mysql_async::Conn::new(opts)
                    .await
                    .context("--outbox: connecting to MySQL/MariaDB")?;
                // Bound every statement by --timeout, as on PostgreSQL: MariaDB's
                // max_statement_time (seconds) or MySQL's max_execution_time (ms, SELECTs); each
                // server refuses the other's variable, which is fine. Lock waits too, though SKIP
                // LOCKED claims never wait.
                let seconds = timeout.as_secs().max(1);
                let _ = conn
                    .query_drop(format!("SET SESSION max_statement_time = {seconds}"))
                    .await;
                let _ = conn
                    .query_drop(format!("SET SESSION max_execution_time = {}", seconds * 1000))
                    .await;
                conn.query_drop(format!("SET SESSION innodb_lock_wait_timeout = {seconds}"))
                    .await
                    .context("--outbox: setting innodb_lock_wait_timeout")?;
                Ok(Outbox::MySql {
                    conn,
                    sql: MySqlSql::new(table),
                })
            }
        };
        tokio::time::timeout(timeout, connecting)
            .await
            .map_err(|_| anyhow::anyhow!("--outbox: no connection within --timeout ({timeout:?})"))?
    }

    /// Claims up to `limit` of the oldest unpublished rows, hands them to `publish`, and marks and
    /// commits them only if `publish` succeeded; otherwise rolls back so they are claimed again.
    /// Returns how many rows were relayed.
    pub async fn relay_batch<F, Fut>(
        &mut self,
        limit: usize,
        max_payload: usize,
        publish: F,
    ) -> anyhow::Result<usize>
    where
        F: FnOnce(Vec<ClaimedRow>) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<Vec<ClaimedRow>>>,
    {
        match self {
            Outbox::Postgres { client, sql } => {
                let started = std::time::Instant::now();
                let transaction = client.transaction().await.context("outbox: BEGIN")?;
                let rows = transaction
                    .query(&sql.claim, &[&(limit as i64), &(max_payload as i32)])
                    .await
                    .context("outbox: claiming rows")?;
                if rows.is_empty() {
                    transaction.commit().await?;
                    return Ok(0);
                }
                let mut claimed = Vec::with_capacity(rows.len());
                for row in rows {
                    let ctid: String = row.try_get(0)?;
                    let payload: Option<String> = row.try_get(1)?;
                    let length: Option<i64> = row.try_get(2)?;
                    claimed.push(ClaimedRow {
                        locator: RowLocator::Ctid(ctid),
                        oversize: length.filter(|&n| n as usize > max_payload),
                        payload: payload.unwrap_or_default().into_bytes(),
                    });
                }
                let claimed_at = started.elapsed();
                let published = publish(claimed).await?;
                let published_at = started.elapsed();
                let ctids: Vec<&str> = published
                    .iter()
                    .filter_map(|row| match &row.locator {
                        RowLocator::Ctid(ctid) => Some(ctid.as_str()),
                        RowLocator::Id(_) => None,
                    })
                    .collect();
                let marked = transaction
                    .execute(&sql.mark, &[&ctids])
                    .await
                    .context("outbox: marking rows published")?;
                if marked as usize != ctids.len() {
                    // Rolled back by the drop: better resend than mark what we did not publish.
                    bail!("outbox: marked {marked} rows of {} published", ctids.len());
                }
                transaction.commit().await.context("outbox: COMMIT")?;
                tracing::debug!(
                    rows = ctids.len(),
                    claim = ?claimed_at,
                    publish = ?(published_at - claimed_at),
                    mark_and_commit = ?(started.elapsed() - published_at),
                    "batch relayed"
                );
                Ok(ctids.len())
            }
            Outbox::MySql { conn, sql } => {
                let mut transaction = conn
                    .start_transaction(mysql_async::TxOpts::default())
                    .await
                    .context("outbox: BEGIN")?;
                let rows: Vec<(mysql_async::Value, Option<Vec<u8>>, Option<i64>)> = transaction
                    .exec(&sql.claim, (max_payload as u64, limit as u64))
                    .await
                    .context("outbox: claiming rows")?;
                if rows.is_empty() {
                    transaction.commit().await?;
                    return Ok(0);
                }
                let claimed = rows
                    .into_iter()
                    .map(|(id, payload, length)| ClaimedRow {
                        locator: RowLocator::Id(id),
                        oversize: length.filter(|&n| n as usize > max_payload),
                        payload: payload.unwrap_or_default(),
                    })
                    .collect();
                let published = publish(claimed).await?;
                let ids: Vec<mysql_async::Value> = published
                    .into_iter()
                    .filter_map(|row| match row.locator {
                        RowLocator::Id(id) => Some(id),
                        RowLocator::Ctid(_) => None,
                    })
                    .collect();
                let mut mark = sql.mark_prefix.clone();
                for i in 0..ids.len() {
                    mark.push_str(if i == 0 { "?" } else { ",?" });
                }
                mark.push(')');
                let count = ids.len();
                transaction
                    .exec_drop(mark, mysql_async::Params::Positional(ids))
                    .await
                    .context("outbox: marking rows published")?;
                let marked = transaction.affected_rows();
                if marked as usize != count {
                    bail!("outbox: marked {marked} rows of {count} published");
                }
                transaction.commit().await.context("outbox: COMMIT")?;
                Ok(count)
            }
        }
    }

    /// Deletes up to `limit` published rows older than `retention`; returns how many it deleted.
    pub async fn delete_published(&mut self, retention: Duration, limit: usize) -> anyhow::Result<u64> {
        match self {
            Outbox::Postgres { client, sql } => client
                .execute(&sql.delete, &[&retention.as_secs_f64(), &(limit as i64)])
                .await
                .context("outbox: deleting published rows past --retention"),
            Outbox::MySql { conn, sql } => {
                conn.exec_drop(&sql.delete, (retention.as_secs(), limit as u64))
                    .await
                    .context("outbox: deleting published rows past --retention")?;
                Ok(conn.affected_rows())
            }
        }
    }

    /// Unpublished rows and the oldest one's age.
    pub async fn backlog(&mut self) -> anyhow::Result<Backlog> {
        match self {
            Outbox::Postgres { client, sql } => {
                let row = client
                    .query_one(&sql.backlog, &[])
                    .await
                    .context("outbox: measuring the backlog")?;
                Ok(Backlog {
                    rows: row.try_get(0)?,
                    oldest_seconds: row.try_get::<_, f64>(1)?.max(0.0),
                })
            }
            Outbox::MySql { conn, sql } => {
                let row: Option<(i64, i64)> = conn
                    .query_first(&sql.backlog)
                    .await
                    .context("outbox: measuring the backlog")?;
                let (rows, micros) = row.unwrap_or_default();
                Ok(Backlog {
                    rows,
                    oldest_seconds: (micros as f64 / 1e6).max(0.0),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_refuse_anything_that_could_change_the_sql() {
        for bad in [
            "",
            "1abc",
            "a b",
            "a;drop",
            "a\"b",
            "a`b",
            "a.b",
            "é",
            &"x".repeat(64),
        ] {
            assert!(sql_identifier("--id-column", bad).is_err(), "{bad:?}");
        }
        for good in ["id", "_x", "Published_At9", &"x".repeat(63)] {
            assert!(sql_identifier("--id-column", good).is_ok(), "{good:?}");
        }
        let error = sql_identifier("--payload-column", "x;y").unwrap_err().to_string();
        assert!(error.contains("--payload-column"), "{error}");
        assert!(table_name("shop.outbox").is_ok());
        assert!(table_name("a.b.c").is_err());
        assert!(table_name("shop.").is_err());
    }

    #[test]
    fn outbox_urls_are_recognised_and_never_echoed() {
        assert!(is_postgres_url("postgres://u:secret@h/db").unwrap());
        assert!(!is_postgres_url("mariadb://u:secret@h/db").unwrap());
        let error = is_postgres_url("redis://u:secret@h").unwrap_err().to_string();
        assert!(!error.contains("secret"), "{error}");
    }
}
