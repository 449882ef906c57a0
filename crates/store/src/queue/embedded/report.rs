//! [`ReportStore`] in the embedded store: the `queue_report` table of `queue.sqlite3` (migration 6),
//! written on a connection of its own, not through the group-commit writer. A report is written about
//! once a second per instance, never on a member's request, so it need not share the members' batches;
//! its own short transaction waits on the writer's through SQLite's busy timeout. Reads and writes run
//! on a blocking thread.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use rankgate_core::queue::QueueName;
use rusqlite::{params, Connection};

use crate::queue::report::{ReportCounts, ReportDelta, ReportField, StoredReport, REPORT_MINUTES_KEPT};
use crate::queue::StoreError;

/// The minute that holds a report's totals.
const TOTALS_MINUTE: i64 = -1;

/// The report table's connection.
pub(crate) struct EmbeddedReports {
    /// A `parking_lot` mutex: only blocking threads take it, each for one short transaction.
    connection: Arc<Mutex<Connection>>,
}

fn unavailable(error: rusqlite::Error) -> StoreError {
    StoreError::Unavailable(format!("sale report: {error}"))
}

impl EmbeddedReports {
    pub(crate) fn new(connection: Connection) -> EmbeddedReports {
        EmbeddedReports {
            connection: Arc::new(Mutex::new(connection)),
        }
    }

    /// Runs `work` on the connection on a blocking thread.
    async fn with_connection<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let connection = Arc::clone(&self.connection);
        tokio::task::spawn_blocking(move || work(&mut connection.lock()))
            .await
            .map_err(|e| StoreError::Unavailable(format!("sale report: {e}")))?
            .map_err(unavailable)
    }

    pub(crate) async fn add(
        &self,
        queue: &QueueName,
        delta: &ReportDelta,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        if delta.is_empty() {
            return Ok(());
        }
        let queue = queue.as_str().to_owned();
        let delta = delta.clone();
        self.with_connection(move |connection| {
            let transaction = connection.transaction()?;
            {
                let mut add = transaction.prepare_cached(
                    "INSERT INTO queue_report (queue, minute, field, value) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (queue, minute, field) DO UPDATE SET value = value + excluded.value",
                )?;
                for (minute, counts) in &delta.minutes {
                    for (field, count) in &counts.fields {
                        add.execute(params![queue, minute, field.code(), *count as i64])?;
                    }
                }
                for (field, count) in &delta.totals().fields {
                    add.execute(params![queue, TOTALS_MINUTE, field.code(), *count as i64])?;
                }
                let newest: Option<i64> = transaction.query_row(
                    "SELECT MAX(minute) FROM queue_report WHERE queue = ?1",
                    params![queue],
                    |row| row.get(0),
                )?;
                if let Some(newest) = newest {
                    transaction.execute(
                        "DELETE FROM queue_report WHERE queue = ?1 AND minute >= 0 AND minute <= ?2",
                        params![queue, newest - REPORT_MINUTES_KEPT],
                    )?;
                }
                transaction.execute(
                    "INSERT INTO queue_report_written (queue, written_ms) VALUES (?1, ?2)
                     ON CONFLICT (queue) DO UPDATE SET written_ms = excluded.written_ms",
                    params![queue, now_ms],
                )?;
            }
            transaction.commit()
        })
        .await
    }

    pub(crate) async fn read(&self, queue: &QueueName) -> Result<Option<StoredReport>, StoreError> {
        let queue = queue.as_str().to_owned();
        self.with_connection(move |connection| {
            let mut statement = connection
                .prepare_cached("SELECT minute, field, value FROM queue_report WHERE queue = ?1")?;
            let rows = statement.query_map(params![queue], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, i64>(2)?,
                ))
            })?;
            let mut report = StoredReport {
                minutes: BTreeMap::new(),
                totals: ReportCounts::default(),
            };
            let mut any = false;
            for row in rows {
                let (minute, code, value) = row?;
                any = true;
                // A field of a later version is skipped: the report stays readable.
                let Some(field) = ReportField::parse(&code) else {
                    continue;
                };
                let counts = if minute == TOTALS_MINUTE {
                    &mut report.totals
                } else {
                    report.minutes.entry(minute).or_default()
                };
                counts.add(field, value.max(0) as u64);
            }
            Ok(any.then_some(report))
        })
        .await
    }

    pub(crate) async fn delete(&self, queue: &QueueName) -> Result<(), StoreError> {
        let queue = queue.as_str().to_owned();
        self.with_connection(move |connection| {
            let transaction = connection.transaction()?;
            transaction.execute("DELETE FROM queue_report WHERE queue = ?1", params![queue])?;
            transaction.execute(
                "DELETE FROM queue_report_written WHERE queue = ?1",
                params![queue],
            )?;
            transaction.commit()
        })
        .await
    }

    pub(crate) async fn drop_beyond(&self, max_reports: usize) -> Result<Vec<QueueName>, StoreError> {
        self.with_connection(move |connection| {
            let transaction = connection.transaction()?;
            let oldest: Vec<String> = {
                let mut statement = transaction.prepare(
                    "SELECT queue FROM queue_report_written ORDER BY written_ms DESC, queue LIMIT -1 OFFSET ?1",
                )?;
                let rows = statement.query_map(params![max_reports as i64], |row| row.get(0))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            for queue in &oldest {
                transaction.execute("DELETE FROM queue_report WHERE queue = ?1", params![queue])?;
                transaction.execute("DELETE FROM queue_report_written WHERE queue = ?1", params![queue])?;
            }
            transaction.commit()?;
            Ok(oldest
                .into_iter()
                .filter_map(|name| QueueName::parse(&name).ok())
                .collect())
        })
        .await
    }
}
