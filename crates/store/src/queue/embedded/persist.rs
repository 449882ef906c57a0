//! Durability for the embedded queue store: a group-commit writer on SQLite (`queue.sqlite3`, WAL).
//!
//! # Why group commit
//! Queue operations are answered from memory in microseconds, but "entered" must mean "survives a restart".
//! One SQLite transaction per request would cap entries at the disk's commit rate (a few thousand a
//! second). Instead every mutating operation hands its row changes, as one *unit*, to a single writer
//! thread, and waits for the unit's batch to commit. The writer takes everything queued since its last
//! commit (up to [`MAX_UNITS_PER_BATCH`]) into one transaction, so under load one commit carries thousands
//! of requests and throughput is bounded by memory and CPU, not by commits; when idle, a lone request
//! commits at once, with no batching delay.
//!
//! Units are sent while the operation still holds its queue's lock, so the log order equals the in-memory
//! order, and a unit is never split across transactions: an admission (pop + token issue) is either wholly
//! on disk or not at all, which is what makes a crash between "pop" and "issue" impossible (limitation 2).
//!
//! The schema is numbered migrations in `migrations/*.sql`, applied on open and versioned by
//! `PRAGMA user_version` ([`crate::sqlite_migration`]).
//!
//! If a commit fails the store is *poisoned*: memory may be ahead of disk, so every later operation answers
//! [`StoreError::Unavailable`] until the process restarts and reloads from disk (the gate fails closed).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use rusqlite::{params, Connection};

use rankgate_core::queue::{AdmissionBudget, QueueSettings, ThroughputEstimator};

use crate::queue::StoreError;
use crate::sqlite_migration::{self, LegacyProbe, Migration};
use crate::synchronous::Synchronous;

/// The most units one transaction carries; bounds commit latency under a flood.
pub const MAX_UNITS_PER_BATCH: usize = 16_384;

/// How long the writer lets units gather before a commit while it is busy (its previous batch carried more
/// than one unit). Each commit costs an fsync and its block-device round trips, which on this VM were
/// most of an entry's system time; without the wait, the writer (which shares the runtime's core under
/// `taskset`) woke for each new unit and committed batches of two or three. Measured with
/// `bench/queue-enter.lua` at `-c 50` (2026-12-02): 0 µs 32–36k entries/s at 24–26 µs CPU each, 300 µs
/// 36–38k at 21–22 µs, 600 µs and more fewer entries (the wait becomes the latency). A lone request (the
/// previous batch had one unit) commits at once, as before.
const GATHER_WHEN_BUSY: std::time::Duration = std::time::Duration::from_micros(300);

/// A queue's stored row: its settings, sequence, admission budget and estimator, whether an admin
/// configured it (such a queue is never forgotten when idle), and how many waiting members it dropped
/// as abandoned.
#[derive(Debug, Clone)]
pub(crate) struct QueueRow {
    pub settings: QueueSettings,
    pub next_seq: i64,
    pub budget: AdmissionBudget,
    pub estimator: ThroughputEstimator,
    pub managed: bool,
    pub abandoned: u64,
    pub epoch: u64,
}

/// One row change.
#[derive(Debug, Clone)]
pub(crate) enum Write {
    /// Upsert a queue's row. Every entry writes one (its sequence), and a batch stores only the last
    /// of each queue, so the row travels as values and is serialized by the writer thread, once per
    /// batch: serializing its JSON on every entry, under the queue's lock, was ~12,800 instructions of
    /// an entry's ~76,000 (callgrind, `bench/results/issue13-queue-row.md`).
    Queue { name: String, row: Box<QueueRow> },
    /// Delete a queue's row and every member row of it (admin delete, or an idle queue forgotten).
    DeleteQueue { name: String },
    /// Upsert a member's row.
    Member {
        queue: String,
        member: String,
        row: MemberRow,
    },
    /// Delete a member's row (NOT_ENTERED).
    DeleteMember { queue: String, member: String },
    /// Upsert a job.
    Job {
        queue: String,
        id: String,
        record: String,
        payload: Vec<u8>,
    },
    /// Delete a job (acked).
    DeleteJob { queue: String, id: String },
    /// Upsert (`Some`, JSON of `DrawRecord`) or delete (`None`, with its lists) a queue's draw.
    Draw { queue: String, record: Option<String> },
    /// Empty a queue's drawn list (a new draw pass starts).
    ClearDrawnMembers { queue: String },
    /// Append to a queue's drawn list at positions `first_index..`.
    DrawnMembers {
        queue: String,
        first_index: i64,
        members: Vec<String>,
    },
    /// Empty a queue's entrant list (a new close pass starts, or the draw is done).
    ClearDrawEntrants { queue: String },
    /// Append to a queue's entrant list at positions `first_index..`.
    DrawEntrants {
        queue: String,
        first_index: i64,
        members: Vec<String>,
    },
}

/// A member's persisted state, in columns (see `rankgate_core::queue::MemberState`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MemberRow {
    /// 0 waiting, 1 ready, 2 claimed, 3 consumed.
    pub kind: i64,
    /// Waiting: sequence. Others: 0.
    pub seq: i64,
    /// Waiting: entry time. Consumed: consume time. Ready/claimed: token issue time.
    pub at_ms: i64,
    /// Ready/claimed: token digest. Consumed: consuming claim digest.
    pub digest: Option<Vec<u8>>,
    /// Ready/claimed: token nonce.
    pub nonce: Option<Vec<u8>>,
    /// Ready/claimed: token expiry.
    pub expires_ms: i64,
    /// Claimed: claim digest. Ready: the auto-released claim's digest, if any.
    pub claim_digest: Option<Vec<u8>>,
    /// Claimed: claim expiry.
    pub claim_expires_ms: i64,
}

struct Unit {
    writes: Vec<Write>,
    done: Option<tokio::sync::oneshot::Sender<Result<(), StoreError>>>,
}

/// Handle to the writer thread.
pub(crate) struct Writer {
    sender: parking_lot::Mutex<Option<mpsc::Sender<Unit>>>,
    /// Set when a commit failed (or a crash is simulated): memory is ahead of disk.
    poisoned: Arc<AtomicBool>,
    /// Test hook: the next batch is rolled back as if the process died mid-commit.
    fail_next_commit: Arc<AtomicBool>,
    thread: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The schema as numbered files under `migrations/`, versioned by `PRAGMA user_version`
/// ([`crate::sqlite_migration`] says why, and how databases from before versioning are dated). Each
/// probe is the one the inline schema of older builds used to decide whether to apply the change.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sql: include_str!("migrations/0001_initial.sql"),
        legacy_probe: Some(LegacyProbe::Tables(&["queues", "members", "jobs"])),
    },
    Migration {
        version: 2,
        sql: include_str!("migrations/0002_managed_queues.sql"),
        legacy_probe: Some(LegacyProbe::Column {
            table: "queues",
            column: "managed",
        }),
    },
    Migration {
        version: 3,
        sql: include_str!("migrations/0003_draws.sql"),
        legacy_probe: Some(LegacyProbe::Tables(&["queue_draws", "queue_drawn_members"])),
    },
    Migration {
        version: 4,
        sql: include_str!("migrations/0004_abandoned_count.sql"),
        legacy_probe: Some(LegacyProbe::Column {
            table: "queues",
            column: "abandoned",
        }),
    },
    Migration {
        version: 5,
        sql: include_str!("migrations/0005_queue_epoch.sql"),
        legacy_probe: None,
    },
    Migration {
        version: 6,
        sql: include_str!("migrations/0006_draw_entrants.sql"),
        legacy_probe: None,
    },
    Migration {
        version: 7,
        sql: include_str!("migrations/0007_sale_reports.sql"),
        legacy_probe: None,
    },
];

/// Opens (creating) the database, sets its pragmas and brings its schema to the current version; answers
/// the `synchronous` level SQLite reports once it is set.
pub(crate) fn open_database(
    path: &Path,
    synchronous: Synchronous,
) -> Result<(Connection, Synchronous), StoreError> {
    let mut connection = Connection::open(path)
        .map_err(|e| StoreError::Unavailable(format!("open {}: {e}", path.display())))?;
    let prepare = |e: rusqlite::Error| StoreError::Unavailable(format!("prepare {}: {e}", path.display()));
    connection
        .execute_batch("PRAGMA journal_mode=WAL; PRAGMA busy_timeout=5000;")
        .map_err(prepare)?;
    let applied = synchronous.apply(&connection).map_err(prepare)?;
    sqlite_migration::migrate(&mut connection, MIGRATIONS)
        .map_err(|e| StoreError::Unavailable(format!("migrate {}: {e}", path.display())))?;
    Ok((connection, applied))
}

fn apply_batch(connection: &mut Connection, units: &[Unit]) -> rusqlite::Result<()> {
    let transaction = connection.transaction()?;
    {
        let mut upsert_queue = transaction.prepare_cached(
            "INSERT INTO queues (name, settings, next_seq, budget, estimator, managed, abandoned, epoch)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
             ON CONFLICT(name) DO UPDATE SET settings = excluded.settings, next_seq = excluded.next_seq,
             budget = excluded.budget, estimator = excluded.estimator, managed = excluded.managed,
             abandoned = excluded.abandoned, epoch = excluded.epoch",
        )?;
        let mut delete_queue = transaction.prepare_cached("DELETE FROM queues WHERE name = ?1")?;
        let mut delete_queue_members = transaction.prepare_cached("DELETE FROM members WHERE queue = ?1")?;
        let mut upsert_member = transaction.prepare_cached(
            "INSERT OR REPLACE INTO members (queue, member, kind, seq, at_ms, digest, nonce, expires_ms, claim_digest, claim_expires_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        )?;
        let mut delete_member =
            transaction.prepare_cached("DELETE FROM members WHERE queue = ?1 AND member = ?2")?;
        let mut upsert_job = transaction.prepare_cached(
            "INSERT OR REPLACE INTO jobs (queue, id, record, payload) VALUES (?1, ?2, ?3, ?4)",
        )?;
        let mut delete_job = transaction.prepare_cached("DELETE FROM jobs WHERE queue = ?1 AND id = ?2")?;
        let mut upsert_draw = transaction
            .prepare_cached("INSERT OR REPLACE INTO queue_draws (queue, record) VALUES (?1, ?2)")?;
        let mut delete_draw = transaction.prepare_cached("DELETE FROM queue_draws WHERE queue = ?1")?;
        let mut clear_drawn =
            transaction.prepare_cached("DELETE FROM queue_drawn_members WHERE queue = ?1")?;
        let mut insert_drawn = transaction.prepare_cached(
            "INSERT OR REPLACE INTO queue_drawn_members (queue, position, member) VALUES (?1, ?2, ?3)",
        )?;
        let mut clear_entrants =
            transaction.prepare_cached("DELETE FROM queue_draw_entrants WHERE queue = ?1")?;
        let mut insert_entrant = transaction.prepare_cached(
            "INSERT OR REPLACE INTO queue_draw_entrants (queue, position, member) VALUES (?1, ?2, ?3)",
        )?;
        // A queue row is rewritten by every entry (its sequence); within one batch only the last matters.
        let mut last_queue_write = std::collections::HashMap::new();
        for (unit_index, unit) in units.iter().enumerate() {
            for (write_index, write) in unit.writes.iter().enumerate() {
                if let Write::Queue { name, .. } = write {
                    last_queue_write.insert(name.as_str(), (unit_index, write_index));
                }
            }
        }
        for (unit_index, unit) in units.iter().enumerate() {
            for (write_index, write) in unit.writes.iter().enumerate() {
                match write {
                    Write::Queue { name, row } => {
                        if last_queue_write.get(name.as_str()) == Some(&(unit_index, write_index)) {
                            upsert_queue.execute(params![
                                name,
                                serde_json::to_string(&row.settings).unwrap_or_default(),
                                row.next_seq,
                                serde_json::to_string(&row.budget).unwrap_or_default(),
                                serde_json::to_string(&row.estimator).unwrap_or_default(),
                                row.managed,
                                i64::try_from(row.abandoned).unwrap_or(i64::MAX),
                                i64::try_from(row.epoch).unwrap_or(i64::MAX)
                            ])?;
                        }
                    }
                    Write::DeleteQueue { name } => {
                        delete_queue_members.execute(params![name])?;
                        delete_queue.execute(params![name])?;
                        delete_draw.execute(params![name])?;
                        clear_drawn.execute(params![name])?;
                        clear_entrants.execute(params![name])?;
                    }
                    Write::Member { queue, member, row } => {
                        upsert_member.execute(params![
                            queue,
                            member,
                            row.kind,
                            row.seq,
                            row.at_ms,
                            row.digest,
                            row.nonce,
                            row.expires_ms,
                            row.claim_digest,
                            row.claim_expires_ms
                        ])?;
                    }
                    Write::DeleteMember { queue, member } => {
                        delete_member.execute(params![queue, member])?;
                    }
                    Write::Job {
                        queue,
                        id,
                        record,
                        payload,
                    } => {
                        upsert_job.execute(params![queue, id, record, payload])?;
                    }
                    Write::DeleteJob { queue, id } => {
                        delete_job.execute(params![queue, id])?;
                    }
                    Write::Draw {
                        queue,
                        record: Some(record),
                    } => {
                        upsert_draw.execute(params![queue, record])?;
                    }
                    Write::Draw { queue, record: None } => {
                        delete_draw.execute(params![queue])?;
                        clear_drawn.execute(params![queue])?;
                        clear_entrants.execute(params![queue])?;
                    }
                    Write::ClearDrawEntrants { queue } => {
                        clear_entrants.execute(params![queue])?;
                    }
                    Write::DrawEntrants {
                        queue,
                        first_index,
                        members,
                    } => {
                        for (offset, member) in members.iter().enumerate() {
                            insert_entrant.execute(params![queue, first_index + offset as i64, member])?;
                        }
                    }
                    Write::ClearDrawnMembers { queue } => {
                        clear_drawn.execute(params![queue])?;
                    }
                    Write::DrawnMembers {
                        queue,
                        first_index,
                        members,
                    } => {
                        for (offset, member) in members.iter().enumerate() {
                            insert_drawn.execute(params![queue, first_index + offset as i64, member])?;
                        }
                    }
                }
            }
        }
    }
    transaction.commit()
}

impl Writer {
    /// Starts the writer thread on `connection`.
    pub(crate) fn start(mut connection: Connection) -> Writer {
        let (sender, receiver) = mpsc::channel::<Unit>();
        let poisoned = Arc::new(AtomicBool::new(false));
        let fail_next_commit = Arc::new(AtomicBool::new(false));
        let thread_poisoned = Arc::clone(&poisoned);
        let thread_fail = Arc::clone(&fail_next_commit);
        let thread = std::thread::Builder::new()
            .name("queue-group-commit".into())
            .spawn(move || {
                let mut busy = false;
                while let Ok(first) = receiver.recv() {
                    if busy {
                        std::thread::sleep(GATHER_WHEN_BUSY);
                    }
                    let mut batch = vec![first];
                    while batch.len() < MAX_UNITS_PER_BATCH {
                        match receiver.try_recv() {
                            Ok(unit) => batch.push(unit),
                            Err(_) => break,
                        }
                    }
                    busy = batch.len() > 1;
                    let result = if thread_poisoned.load(Ordering::SeqCst) {
                        Err(StoreError::Unavailable("queue store stopped after a failed commit".into()))
                    } else if thread_fail.swap(false, Ordering::SeqCst) {
                        // Simulated crash: nothing of this batch reaches the disk.
                        thread_poisoned.store(true, Ordering::SeqCst);
                        Err(StoreError::Unavailable("simulated crash during commit".into()))
                    } else {
                        apply_batch(&mut connection, &batch).map_err(|e| {
                            thread_poisoned.store(true, Ordering::SeqCst);
                            tracing::error!(error = %e, "queue store commit failed; refusing further operations");
                            StoreError::Unavailable(format!("commit failed: {e}"))
                        })
                    };
                    for unit in batch {
                        if let Some(done) = unit.done {
                            let _ = done.send(result.clone());
                        }
                    }
                }
            })
            .expect("spawning the queue writer thread");
        Writer {
            sender: parking_lot::Mutex::new(Some(sender)),
            poisoned,
            fail_next_commit,
            thread: parking_lot::Mutex::new(Some(thread)),
        }
    }

    /// Fails when the store is poisoned.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable(
                "queue store stopped after a failed commit; restart to recover".into(),
            ));
        }
        Ok(())
    }

    /// Queues a unit; the returned receiver resolves when its batch committed. Call with the queue's lock
    /// held so the log order is the memory order.
    pub(crate) fn submit(
        &self,
        writes: Vec<Write>,
    ) -> tokio::sync::oneshot::Receiver<Result<(), StoreError>> {
        let (done, receiver) = tokio::sync::oneshot::channel();
        let unit = Unit {
            writes,
            done: Some(done),
        };
        if let Some(sender) = self.sender.lock().as_ref() {
            if let Err(mpsc::SendError(unit)) = sender.send(unit) {
                if let Some(done) = unit.done {
                    let _ = done.send(Err(StoreError::Unavailable("queue writer stopped".into())));
                }
            }
        }
        receiver
    }

    /// Test hook: the next batch is lost as if the process died mid-commit, and the store is poisoned.
    pub(crate) fn fail_next_commit(&self) {
        self.fail_next_commit.store(true, Ordering::SeqCst);
    }

    /// Stops accepting units, lets the thread drain and commit, and joins it.
    pub(crate) fn shutdown(&self) {
        self.sender.lock().take();
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }
}

/// Waits for a unit's commit.
pub(crate) async fn committed(
    receiver: tokio::sync::oneshot::Receiver<Result<(), StoreError>>,
) -> Result<(), StoreError> {
    receiver
        .await
        .map_err(|_| StoreError::Unavailable("queue writer stopped".into()))?
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.shutdown();
    }
}
