//! The embedded backend: waiting room, jobs and rate limiter in process, durable in SQLite.
//!
//! State is served from memory (sorted sets from `rankgate-zset`), one `parking_lot` mutex per queue, so
//! an operation is a few O(log n) steps under one lock: that critical section is the embedded equivalent of
//! a Lua script, and it is what makes each trait method atomic. Mutations are persisted through the
//! group-commit writer in [`persist`] and a mutating call returns only after its batch committed, so a
//! restart (see [`EmbeddedStore::open`]) restores entries, sequences, token hashes, claims, settings and jobs.
//! Rate-limiter state is deliberately not persisted: it describes the last few seconds only.
//!
//! Locks are `parking_lot` (not tokio) mutexes because no critical section awaits; each is held for
//! microseconds, well inside the "never block the runtime for more than ~500 µs" rule, and the one
//! operation that can touch many members (expiry) is capped per step.

mod draw;
mod jobs;
mod limiter;
pub(crate) mod persist;
mod report;
mod waiting;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use hashbrown::HashMap;
use parking_lot::{Mutex, RwLock};
use rankgate_core::ids::MemberId;
use rankgate_core::limiter::RateDecision;
use rankgate_core::queue::{
    Claim, Digest, IssuedToken, MemberState, QueueName, QueueSettings, SettingsError, SettingsPatch,
};
use rusqlite::Connection;

use self::persist::{committed, MemberRow, Writer};
use self::waiting::QueueState;
use crate::clock::Clock;
use crate::queue::draw::DrawStore;
use crate::queue::limiter::RateLimiter;
use crate::queue::waiting::{
    poll_limit_decision, AdmissionPreview, AdmitOutcome, ClaimOutcome, ConsumeOutcome, EnterOutcome,
    ExpiryOutcome, LeaveOutcome, MemberView, QueueStats, QueueStore, ReleaseOutcome, TokenCandidate,
};
use crate::queue::StoreError;
use crate::synchronous::Synchronous;

/// File name of the queue database inside the data directory.
pub const DATABASE_FILE: &str = "queue.sqlite3";

/// Options of the embedded store.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// Settings a queue gets when it is created by its first entry.
    pub default_settings: QueueSettings,
    /// How long a consumed member is reported with `lastOutcome: CONSUMED` (ms).
    pub consumed_memory_ms: i64,
    /// The database's `synchronous` level: `Full` (default) fsyncs every commit, so a consumed token stays
    /// consumed after a power loss; `Normal` survives a process crash or restart and fsyncs at checkpoints.
    pub synchronous: Synchronous,
    /// Most queues a first entry may create (an admin PUT may create more).
    pub max_queues: usize,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            default_settings: QueueSettings::default(),
            consumed_memory_ms: 3_600_000,
            synchronous: Synchronous::default(),
            max_queues: crate::queue::DEFAULT_MAX_QUEUES,
        }
    }
}

/// The embedded store: implements [`QueueStore`], [`JobStore`](crate::queue::JobStore) and
/// [`RateLimiter`](crate::queue::RateLimiter).
pub struct EmbeddedStore {
    clock: Arc<dyn Clock>,
    options: EmbeddedOptions,
    // RwLock over the map: lookups (every request) share it; only creating a queue takes it exclusively.
    queues: RwLock<HashMap<QueueName, Arc<Mutex<QueueState>>>>,
    jobs: jobs::EmbeddedJobs,
    limiter: limiter::EmbeddedLimiter,
    writer: Writer,
    /// The `synchronous` level SQLite reported for the writer's connection when it was opened.
    synchronous: Synchronous,
    /// Test and drill hook: when set, every operation fails as if the store were unreachable.
    unreachable: AtomicBool,
    /// The sale reports, on a connection of their own (see `report`).
    reports: report::EmbeddedReports,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("queues", &self.queues.read().len())
            .finish_non_exhaustive()
    }
}

impl EmbeddedStore {
    /// [`QueueStore::position`], synchronously: one critical section on the queue.
    fn position_now(&self, queue: &QueueName, member: &MemberId) -> Result<MemberView, StoreError> {
        self.check()?;
        let now = self.clock.now_millis();
        let Some(state) = self.existing(queue) else {
            return Ok(MemberView {
                status: rankgate_core::queue::MemberStatus::NotEntered,
                rank: None,
                waiting_count: 0,
                token: None,
                last_outcome: None,
                estimated_wait_seconds: None,
                estimated_wait_p90_seconds: None,
                now_ms: now,
                placement: None,
            });
        };
        let mut q = state.lock();
        let current = q.state_of(member.as_str());
        let now_ms = q.read_now(now, &current);
        if matches!(current, MemberState::Waiting { .. }) {
            // A poll (or a stream's read) is a sign of life: the abandonment deadline moves.
            q.touch_waiting(member.as_str(), now_ms);
        }
        Ok(q.view(member.as_str(), now_ms))
    }

    /// Opens `<data_dir>/queue.sqlite3` (creating it), restores every queue and job, and starts the writer.
    pub fn open(
        data_dir: &Path,
        clock: Arc<dyn Clock>,
        options: EmbeddedOptions,
    ) -> Result<Arc<EmbeddedStore>, StoreError> {
        std::fs::create_dir_all(data_dir)
            .map_err(|e| StoreError::Unavailable(format!("create {}: {e}", data_dir.display())))?;
        let (connection, synchronous) =
            persist::open_database(&data_dir.join(DATABASE_FILE), options.synchronous)?;
        // Migrated already by the line above, so this second open only sets its pragmas.
        let (report_connection, _) =
            persist::open_database(&data_dir.join(DATABASE_FILE), options.synchronous)?;
        let now_ms = clock.now_millis();
        let queues =
            load_queues(&connection, now_ms, &options).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let jobs = jobs::EmbeddedJobs::load(&connection).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let writer = Writer::start(connection);
        Ok(Arc::new(EmbeddedStore {
            clock,
            options,
            queues: RwLock::new(queues),
            jobs,
            limiter: limiter::EmbeddedLimiter::default(),
            writer,
            synchronous,
            unreachable: AtomicBool::new(false),
            reports: report::EmbeddedReports::new(report_connection),
        }))
    }

    /// The `synchronous` level in force on the database (read back from SQLite at open).
    #[must_use]
    pub fn synchronous(&self) -> Synchronous {
        self.synchronous
    }

    /// Simulates losing the store (a network partition from Redis, a dead disk): while `true`, every
    /// operation answers [`StoreError::Unavailable`]. Used by fail-closed tests and drills.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.unreachable.store(unreachable, Ordering::SeqCst);
    }

    /// Simulates the process dying in the middle of its next commit: that batch never reaches the disk and
    /// the store refuses everything afterwards. Reopen the directory to "restart".
    pub fn crash_during_next_commit(&self) {
        self.writer.fail_next_commit();
    }

    /// Commits what is pending and stops the writer (also done on drop).
    pub fn close(&self) {
        self.writer.shutdown();
    }

    /// Heap bytes of the waiting members of `queue` (for the memory benchmark): the waiting set, the
    /// arrival checkpoints and the deadline set, where every waiting member has its abandonment deadline
    /// (the few READY / CLAIMED members' deadlines are there too).
    pub fn waiting_heap_bytes(&self, queue: &QueueName) -> usize {
        self.queues.read().get(queue).map_or(0, |q| {
            let q = q.lock();
            q.waiting.heap_bytes() + q.arrivals.len() * 16 + q.deadlines.heap_bytes()
        })
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.unreachable.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("queue store unreachable".into()));
        }
        self.writer.check()
    }

    fn existing(&self, queue: &QueueName) -> Option<Arc<Mutex<QueueState>>> {
        self.queues.read().get(queue).cloned()
    }

    /// The queue's state, created with the default settings if it does not exist. A first entry may not
    /// create more than `max_queues` queues (defect 4); an admin PUT may.
    fn existing_or_create(
        &self,
        queue: &QueueName,
        creation: Creation,
    ) -> Result<Arc<Mutex<QueueState>>, StoreError> {
        if let Some(existing) = self.existing(queue) {
            return Ok(existing);
        }
        let mut queues = self.queues.write();
        if let Some(existing) = queues.get(queue) {
            return Ok(Arc::clone(existing));
        }
        if creation == Creation::ByEntry && queues.len() >= self.options.max_queues {
            return Err(StoreError::TooManyQueues {
                max_queues: self.options.max_queues,
            });
        }
        let now_ms = self.clock.now_millis();
        let state = Arc::new(Mutex::new(QueueState::new(
            queue.clone(),
            self.options.default_settings.clone(),
            now_ms,
            self.options.consumed_memory_ms,
        )));
        queues.insert(queue.clone(), Arc::clone(&state));
        Ok(state)
    }

    /// Removes `queue` from the map when `condition` holds for its state (checked under both locks, so no
    /// operation slips in between), marks the state deleted and persists the deletion. `false` if the queue
    /// does not exist or the condition refused.
    async fn remove_queue_if(
        &self,
        queue: &QueueName,
        condition: impl FnOnce(&mut QueueState, &mut Vec<persist::Write>) -> bool,
    ) -> Result<bool, StoreError> {
        let (removed, pending) = {
            let mut queues = self.queues.write();
            let Some(state) = queues.get(queue).cloned() else {
                return Ok(false);
            };
            let mut q = state.lock();
            let mut writes = Vec::new();
            let removed = condition(&mut q, &mut writes);
            if removed {
                queues.remove(queue);
                q.deleted = true;
                writes.push(persist::Write::DeleteQueue {
                    name: queue.as_str().to_string(),
                });
            } else if writes.is_empty() {
                return Ok(false);
            }
            (removed, self.writer.submit(writes))
        };
        committed(pending).await?;
        Ok(removed)
    }
}

/// Who is creating a queue: a first entry is held to `max_queues`, an admin PUT is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Creation {
    ByEntry,
    ByAdmin,
}

fn load_queues(
    connection: &Connection,
    now_ms: i64,
    options: &EmbeddedOptions,
) -> rusqlite::Result<HashMap<QueueName, Arc<Mutex<QueueState>>>> {
    let mut queues = HashMap::new();
    let mut statement = connection.prepare(
        "SELECT name, settings, next_seq, budget, estimator, managed, abandoned, epoch FROM queues",
    )?;
    let rows = statement.query_map([], |row| {
        Ok((
            row.get::<_, String>(0)?,
            row.get::<_, String>(1)?,
            row.get::<_, i64>(2)?,
            row.get::<_, String>(3)?,
            row.get::<_, String>(4)?,
            row.get::<_, bool>(5)?,
            row.get::<_, i64>(6)?,
            row.get::<_, i64>(7)?,
        ))
    })?;
    let mut states: HashMap<String, QueueState> = HashMap::new();
    for row in rows {
        let (name, settings, next_seq, budget, estimator, managed, abandoned, epoch) = row?;
        let Ok(queue_name) = QueueName::parse(&name) else {
            continue;
        };
        let settings: QueueSettings =
            serde_json::from_str(&settings).unwrap_or_else(|_| options.default_settings.clone());
        let mut state = QueueState::new(queue_name, settings, now_ms, options.consumed_memory_ms);
        state.next_seq = next_seq.max(0) as u64;
        state.managed = managed;
        state.abandoned = abandoned.max(0) as u64;
        state.epoch = epoch.max(0) as u64;
        if let Ok(budget) = serde_json::from_str(&budget) {
            state.budget = budget;
        }
        if let Ok(estimator) = serde_json::from_str(&estimator) {
            state.estimator = estimator;
        }
        state.last_now_ms = state.last_now_ms.max(state.budget.refilled_at_ms);
        states.insert(name, state);
    }
    let mut statement = connection.prepare(
        "SELECT queue, member, kind, seq, at_ms, digest, nonce, expires_ms, claim_digest, claim_expires_ms
         FROM members ORDER BY queue, kind, seq",
    )?;
    let rows = statement.query_map([], |row| {
        Ok((
            row.get::<_, String>(0)?,
            row.get::<_, String>(1)?,
            MemberRow {
                kind: row.get(2)?,
                seq: row.get(3)?,
                at_ms: row.get(4)?,
                digest: row.get(5)?,
                nonce: row.get(6)?,
                expires_ms: row.get(7)?,
                claim_digest: row.get(8)?,
                claim_expires_ms: row.get(9)?,
            },
        ))
    })?;
    for row in rows {
        let (queue, member, row) = row?;
        let Some(state) = states.get_mut(&queue) else {
            continue;
        };
        if row.kind == 0 && state.arrivals.back().is_none_or(|(_, ms)| *ms != row.at_ms) {
            // Rows come in sequence order, so checkpoints are rebuilt exactly as they were made.
            state.arrivals.push_back((row.seq as u64, row.at_ms));
        }
        if let Err(error) = state.restore_member(&member, &row) {
            tracing::warn!(queue, error, "skipping an unreadable member row");
        }
    }
    let mut statement = connection.prepare("SELECT queue, record FROM queue_draws")?;
    let rows = statement.query_map([], |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)))?;
    for row in rows {
        let (queue, record) = row?;
        if let (Some(state), Ok(record)) = (states.get_mut(&queue), serde_json::from_str(&record)) {
            state.draw = Some(record);
        }
    }
    let mut statement =
        connection.prepare("SELECT queue, member FROM queue_drawn_members ORDER BY queue, position")?;
    let rows = statement.query_map([], |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)))?;
    for row in rows {
        let (queue, member) = row?;
        if let Some(state) = states.get_mut(&queue) {
            state.drawn.push(member.into_boxed_str());
        }
    }
    let mut statement =
        connection.prepare("SELECT queue, member FROM queue_draw_entrants ORDER BY queue, position")?;
    let rows = statement.query_map([], |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)))?;
    for row in rows {
        let (queue, member) = row?;
        if let Some(state) = states.get_mut(&queue) {
            state.entrants.push(member.into_boxed_str());
        }
    }
    for (_, state) in states {
        queues.insert(state.name.clone(), Arc::new(Mutex::new(state)));
    }
    Ok(queues)
}

#[async_trait]
impl crate::queue::report::ReportStore for EmbeddedStore {
    async fn add_to_report(
        &self,
        queue: &QueueName,
        delta: &crate::queue::report::ReportDelta,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.check()?;
        self.reports.add(queue, delta, now_ms).await
    }

    async fn read_report(
        &self,
        queue: &QueueName,
    ) -> Result<Option<crate::queue::report::StoredReport>, StoreError> {
        self.check()?;
        self.reports.read(queue).await
    }

    async fn delete_report(&self, queue: &QueueName) -> Result<(), StoreError> {
        self.check()?;
        self.reports.delete(queue).await
    }

    async fn drop_reports_beyond(&self, max_reports: usize) -> Result<Vec<QueueName>, StoreError> {
        self.check()?;
        self.reports.drop_beyond(max_reports).await
    }
}

#[async_trait]
impl QueueStore for EmbeddedStore {
    async fn enter(&self, queue: &QueueName, member: &MemberId) -> Result<EnterOutcome, StoreError> {
        self.check()?;
        let (outcome, pending) = loop {
            let state = self.existing_or_create(queue, Creation::ByEntry)?;
            let mut q = state.lock();
            if q.deleted {
                // Deleted between the lookup and the lock: enter the queue that exists now, if any.
                continue;
            }
            let current = q.state_of(member.as_str());
            // A member already waiting is only read (their position); anybody else's entry is a step.
            let now_ms = match current {
                MemberState::Waiting { .. } => q.read_now(self.clock.now_millis(), &current),
                _ => q.observe_now(self.clock.now_millis()),
            };
            let mut writes = Vec::new();
            if !matches!(current, MemberState::Waiting { .. }) && q.close_pre_queue_if_due(now_ms) {
                // This entry comes at or after opensAt: the pre-queue closes first, so it queues behind.
                writes.push(q.queue_write());
                writes.push(q.draw_write());
            }
            let (next, used_seq) = current.enter(q.next_seq);
            if matches!(current, MemberState::Waiting { .. }) {
                // Entering again is a visit: the member was seen.
                q.touch_waiting(member.as_str(), now_ms);
            }
            if used_seq {
                q.next_seq += 1;
                q.set_state(member.as_str(), &current, next, now_ms, &mut writes);
                writes.push(q.queue_write());
            }
            let mut view = q.view(member.as_str(), now_ms);
            view.placement = q.placement_of(member.as_str());
            let outcome = if used_seq {
                EnterOutcome::Entered(view)
            } else {
                EnterOutcome::AlreadyPresent(view)
            };
            // Even a no-op entry waits for the batch in flight: a concurrent first entry that created this
            // position may not have committed yet, and "entered" must mean durable for both callers.
            break (outcome, self.writer.submit(writes));
        };
        committed(pending).await?;
        Ok(outcome)
    }

    async fn position(&self, queue: &QueueName, member: &MemberId) -> Result<MemberView, StoreError> {
        self.position_now(queue, member)
    }

    /// The default's two steps, with the position read inline rather than through a second boxed
    /// future (a poll is the waiting room's hottest request).
    async fn poll(
        &self,
        queue: &QueueName,
        member: &MemberId,
        burst: u32,
        limiter: &dyn RateLimiter,
    ) -> Result<(MemberView, RateDecision), StoreError> {
        let view = self.position_now(queue, member)?;
        let decision = poll_limit_decision(queue, member, burst, &view, limiter).await?;
        Ok((view, decision))
    }

    async fn leave(&self, queue: &QueueName, member: &MemberId) -> Result<LeaveOutcome, StoreError> {
        self.check()?;
        let Some(state) = self.existing(queue) else {
            return Ok(LeaveOutcome::NotPresent);
        };
        let (outcome, pending) = {
            let mut q = state.lock();
            if q.deleted {
                return Ok(LeaveOutcome::NotPresent);
            }
            let now_ms = q.observe_now(self.clock.now_millis());
            let current = q.state_of(member.as_str());
            match current {
                MemberState::NotEntered | MemberState::Consumed { .. } => {
                    return Ok(LeaveOutcome::NotPresent)
                }
                _ => {}
            }
            match current.leave() {
                Err(rejection) => return Ok(LeaveOutcome::Rejected(rejection)),
                Ok(next) => {
                    let mut writes = Vec::new();
                    let status = current.status();
                    q.set_state(member.as_str(), &current, next, now_ms, &mut writes);
                    (LeaveOutcome::Left(status), self.writer.submit(writes))
                }
            }
        };
        committed(pending).await?;
        Ok(outcome)
    }

    async fn admit(
        &self,
        queue: &QueueName,
        tokens: Vec<TokenCandidate>,
    ) -> Result<AdmitOutcome, StoreError> {
        self.check()?;
        let Some(state) = self.existing(queue) else {
            return Ok(AdmitOutcome::default());
        };
        let (outcome, pending) = {
            let mut q = state.lock();
            if q.deleted {
                return Ok(AdmitOutcome::default());
            }
            let now_ms = q.observe_now(self.clock.now_millis());
            let mut writes = Vec::new();
            let expired = q.expire_due(now_ms, &mut writes);
            let waiting_before = q.waiting.len() as u64;
            let outstanding = q.ready + q.claimed;
            let settings = q.settings.clone();
            let plan = q.budget.plan(&settings, now_ms, waiting_before, outstanding);
            // Before and during a scheduled opening's draw nobody is admitted (the pre-queue).
            let count = if q.draw_holds_admission() {
                0
            } else {
                (plan.admit as usize).min(tokens.len())
            };
            let popped = q.waiting.pop_min(count);
            let mut admitted = Vec::with_capacity(popped.len());
            let mut waits_ms = Vec::with_capacity(popped.len());
            for ((member_bytes, seq), prepared) in popped.into_iter().zip(tokens) {
                let waited = q.waited_ms(seq, now_ms);
                let member = String::from_utf8(member_bytes).unwrap_or_default();
                let token = IssuedToken {
                    digest: prepared.digest,
                    nonce: prepared.nonce,
                    issued_at_ms: now_ms,
                    expires_at_ms: now_ms + settings.token_ttl_millis(),
                };
                // Already removed from the waiting set by the pop; the state we leave is WAITING.
                let was = MemberState::Waiting { seq: seq as u64 };
                let next = was.admit(token).unwrap_or(MemberState::NotEntered);
                q.set_state_after_pop(&member, next, now_ms, &mut writes);
                if let Some(id) = waiting::member_id_of(&member) {
                    admitted.push(id);
                    waits_ms.push(waited);
                }
            }
            q.budget.spend(admitted.len() as u64);
            let waiting_after = q.waiting.len() as u64;
            q.estimator.record_admission_step(
                now_ms,
                admitted.len() as u64,
                waiting_before,
                waiting_after,
                &settings,
            );
            writes.push(q.queue_write());
            let outcome = AdmitOutcome {
                admitted,
                waits_ms,
                abandoned: expired.abandoned,
                tokens_expired: expired.tokens_expired,
                claims_expired: expired.claims_expired,
                waiting: q.waiting.len() as u64,
                outstanding: q.ready + q.claimed,
                next_deadline_ms: q.next_deadline_ms(),
            };
            (outcome, self.writer.submit(writes))
        };
        committed(pending).await?;
        Ok(outcome)
    }

    async fn expire_due(&self, queue: &QueueName) -> Result<ExpiryOutcome, StoreError> {
        self.check()?;
        let Some(state) = self.existing(queue) else {
            return Ok(ExpiryOutcome::default());
        };
        let mut total = ExpiryOutcome::default();
        // Bounded steps, each under the lock anew, so ten thousand due members never hold the queue's lock
        // (and every entry and poll behind it) for one long stretch.
        loop {
            let (step, pending) = {
                let mut q = state.lock();
                if q.deleted {
                    return Ok(total);
                }
                let now_ms = q.observe_now(self.clock.now_millis());
                let mut writes = Vec::new();
                let step = q.expire_due(now_ms, &mut writes);
                total.next_deadline_ms = q.next_deadline_ms();
                if writes.is_empty() {
                    return Ok(total);
                }
                (step, self.writer.submit(writes))
            };
            committed(pending).await?;
            total.tokens_expired += step.tokens_expired;
            total.claims_expired += step.claims_expired;
            total.abandoned += step.abandoned;
            if !step.more_due {
                return Ok(total);
            }
        }
    }

    async fn claim(
        &self,
        queue: &QueueName,
        member: &MemberId,
        token: &Digest,
        claim: &Digest,
    ) -> Result<ClaimOutcome, StoreError> {
        self.check()?;
        let Some(state) = self.existing(queue) else {
            return Ok(ClaimOutcome::Rejected(
                rankgate_core::queue::ClaimRejection::NoToken,
            ));
        };
        let (outcome, pending) = {
            let mut q = state.lock();
            if q.deleted {
                return Ok(ClaimOutcome::Rejected(
                    rankgate_core::queue::ClaimRejection::NoToken,
                ));
            }
            let now_ms = q.observe_now(self.clock.now_millis());
            let current = q.state_of(member.as_str());
            let expires_at_ms = now_ms + q.settings.claim_ttl_millis();
            match current.claim(
                token,
                Claim {
                    digest: *claim,
                    expires_at_ms,
                },
                now_ms,
            ) {
                Err(rejection) => return Ok(ClaimOutcome::Rejected(rejection)),
                Ok(next) => {
                    let mut writes = Vec::new();
                    q.set_state(member.as_str(), &current, next, now_ms, &mut writes);
                    (
                        ClaimOutcome::Claimed { expires_at_ms },
                        self.writer.submit(writes),
                    )
                }
            }
        };
        committed(pending).await?;
        Ok(outcome)
    }

    async fn consume(
        &self,
        queue: &QueueName,
        member: &MemberId,
        claim: &Digest,
    ) -> Result<ConsumeOutcome, StoreError> {
        self.check()?;
        let Some(state) = self.existing(queue) else {
            return Ok(ConsumeOutcome::Rejected(
                rankgate_core::queue::ConsumeRejection::UnknownClaim,
            ));
        };
        let (outcome, pending) = {
            let mut q = state.lock();
            if q.deleted {
                return Ok(ConsumeOutcome::Rejected(
                    rankgate_core::queue::ConsumeRejection::UnknownClaim,
                ));
            }
            let now_ms = q.observe_now(self.clock.now_millis());
            let current = q.state_of(member.as_str());
            match current.consume(claim, now_ms) {
                Err(rejection) => return Ok(ConsumeOutcome::Rejected(rejection)),
                Ok((_, false)) => (ConsumeOutcome::AlreadyConsumed, self.writer.submit(Vec::new())),
                Ok((next, true)) => {
                    let mut writes = Vec::new();
                    q.set_state(member.as_str(), &current, next, now_ms, &mut writes);
                    q.estimator.record_consumed(1);
                    (ConsumeOutcome::Consumed, self.writer.submit(writes))
                }
            }
        };
        committed(pending).await?;
        Ok(outcome)
    }

    async fn release(
        &self,
        queue: &QueueName,
        member: &MemberId,
        claim: &Digest,
    ) -> Result<ReleaseOutcome, StoreError> {
        self.check()?;
        let Some(state) = self.existing(queue) else {
            return Ok(ReleaseOutcome::Rejected(
                rankgate_core::queue::ReleaseRejection::UnknownClaim,
            ));
        };
        let (outcome, pending) = {
            let mut q = state.lock();
            if q.deleted {
                return Ok(ReleaseOutcome::Rejected(
                    rankgate_core::queue::ReleaseRejection::UnknownClaim,
                ));
            }
            let now_ms = q.observe_now(self.clock.now_millis());
            let current = q.state_of(member.as_str());
            match current.release(claim, now_ms) {
                Err(rejection) => return Ok(ReleaseOutcome::Rejected(rejection)),
                Ok((next, to)) => {
                    let mut writes = Vec::new();
                    if next != current {
                        q.set_state(member.as_str(), &current, next, now_ms, &mut writes);
                    }
                    (ReleaseOutcome::Released(to), self.writer.submit(writes))
                }
            }
        };
        committed(pending).await?;
        Ok(outcome)
    }

    async fn settings(&self, queue: &QueueName) -> Result<Option<QueueSettings>, StoreError> {
        self.check()?;
        Ok(self.existing(queue).map(|q| q.lock().settings.clone()))
    }

    async fn update_settings(
        &self,
        queue: &QueueName,
        patch: &SettingsPatch,
    ) -> Result<Result<QueueSettings, SettingsError>, StoreError> {
        self.check()?;
        // Validate before creating, so a bad PUT does not create a queue.
        let mut probe = self.existing(queue).map_or_else(
            || self.options.default_settings.clone(),
            |q| q.lock().settings.clone(),
        );
        if let Err(error) = probe.apply(patch) {
            return Ok(Err(error));
        }
        let state = self.existing_or_create(queue, Creation::ByAdmin)?;
        let (settings, pending) = {
            let mut q = state.lock();
            if q.deleted {
                return Err(StoreError::Unavailable(
                    "the queue was deleted during this update; try again".into(),
                ));
            }
            let now_ms = q.observe_now(self.clock.now_millis());
            let mut settings = q.settings.clone();
            if let Err(error) = settings.apply(patch) {
                return Ok(Err(error));
            }
            // Settle the budget at the old rate up to now, then cap it to the new tick's capacity.
            let old = q.settings.clone();
            q.budget.refill(&old, now_ms);
            q.budget.credit_micro = q
                .budget
                .credit_micro
                .min(rankgate_core::queue::AdmissionBudget::capacity_micro(&settings));
            q.settings = settings.clone();
            q.managed = true;
            let writes = vec![q.queue_write()];
            (settings, self.writer.submit(writes))
        };
        committed(pending).await?;
        Ok(Ok(settings))
    }

    async fn stats(&self, queue: &QueueName) -> Result<Option<QueueStats>, StoreError> {
        self.check()?;
        let Some(state) = self.existing(queue) else {
            return Ok(None);
        };
        let mut q = state.lock();
        let now_ms = q.observe_now(self.clock.now_millis());
        let oldest_wait_ms = q.oldest_wait_ms(now_ms);
        Ok(Some(QueueStats {
            settings: q.settings.clone(),
            waiting: q.waiting.len() as u64,
            ready: q.ready,
            claimed: q.claimed,
            admitted_last_minute: q.estimator.admitted_last_minute(now_ms),
            oldest_wait_seconds: (oldest_wait_ms / 1000) as u64,
            measured_rate: q.estimator.effective_rate(&q.settings),
            abandoned: q.abandoned,
            epoch: q.epoch,
        }))
    }

    async fn queues(&self) -> Result<Vec<QueueName>, StoreError> {
        self.check()?;
        let mut names: Vec<QueueName> = self.queues.read().keys().cloned().collect();
        names.sort();
        Ok(names)
    }

    async fn active_queues(&self) -> Result<Vec<QueueName>, StoreError> {
        self.check()?;
        // In process, asking each queue is a lock and a load; a queue whose lock is held right now may have
        // been entered, so it is listed without waiting for it.
        let queues = self.queues.read();
        let mut active: Vec<QueueName> = queues
            .iter()
            .filter(|(_, state)| state.try_lock().is_none_or(|q| q.has_waiting()))
            .map(|(name, _)| name.clone())
            .collect();
        active.sort();
        Ok(active)
    }

    async fn admission_preview(&self, queue: &QueueName) -> Result<Option<AdmissionPreview>, StoreError> {
        self.check()?;
        Ok(self.existing(queue).map(|state| {
            let q = state.lock();
            AdmissionPreview {
                settings: q.settings.clone(),
                waiting: q.waiting.len() as u64,
                outstanding: q.ready + q.claimed,
            }
        }))
    }

    async fn delete_queue(&self, queue: &QueueName) -> Result<bool, StoreError> {
        self.check()?;
        self.remove_queue_if(queue, |_, _| true).await
    }

    async fn forget_if_idle(&self, queue: &QueueName, idle_ms: i64) -> Result<bool, StoreError> {
        self.check()?;
        let clock_ms = self.clock.now_millis();
        self.remove_queue_if(queue, |q, writes| {
            if q.managed || q.is_active() {
                return false;
            }
            // The last operation's time is the last activity; this look is not one, so it does not
            // record the clock. Consumed members are remembered for a while: forget the due ones first.
            let last_activity_ms = q.last_now_ms;
            let now_ms = clock_ms.max(last_activity_ms);
            q.expire_due(now_ms, writes);
            q.holders.is_empty() && now_ms - last_activity_ms >= idle_ms
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.check()
    }

    fn draws(&self) -> &dyn DrawStore {
        self
    }

    fn reports(&self) -> Option<&dyn crate::queue::report::ReportStore> {
        Some(self)
    }
}

impl QueueState {
    /// Like `set_state` for a member the caller already popped from the waiting set.
    fn set_state_after_pop(
        &mut self,
        member: &str,
        next: MemberState,
        now_ms: i64,
        writes: &mut Vec<persist::Write>,
    ) {
        self.set_state(member, &MemberState::NotEntered, next, now_ms, writes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::queue::token::{digest_of, new_claim_id, TokenSecret};
    use rankgate_core::queue::MemberStatus;

    fn open(dir: &Path, clock: &ManualClock) -> Arc<EmbeddedStore> {
        EmbeddedStore::open(dir, Arc::new(clock.clone()), EmbeddedOptions::default()).unwrap()
    }

    #[tokio::test]
    async fn the_abandoned_count_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_000_000);
        let q = QueueName::parse("abandon-restart").unwrap();
        let stay = MemberId::parse("stays").unwrap();
        {
            let store = open(dir.path(), &clock);
            let settings = SettingsPatch {
                paused: Some(true),
                abandon_after_seconds: Some(5),
                ..SettingsPatch::default()
            };
            store.update_settings(&q, &settings).await.unwrap().unwrap();
            for i in 0..3 {
                store
                    .enter(&q, &MemberId::parse(&format!("gone-{i}")).unwrap())
                    .await
                    .unwrap();
            }
            // Past the 5 s and its slack for the three; `stays` enters afterwards and stays fresh.
            clock.advance(6_000);
            store.enter(&q, &stay).await.unwrap();
            store.expire_due(&q).await.unwrap();
            let stats = store.stats(&q).await.unwrap().unwrap();
            assert_eq!((stats.abandoned, stats.waiting), (3, 1));
            store.close();
        }
        let store = open(dir.path(), &clock);
        let stats = store.stats(&q).await.unwrap().unwrap();
        assert_eq!(
            (stats.abandoned, stats.waiting),
            (3, 1),
            "read from the queue's row"
        );
        // And it keeps counting from there.
        clock.advance(6_000);
        store.expire_due(&q).await.unwrap();
        let stats = store.stats(&q).await.unwrap().unwrap();
        assert_eq!((stats.abandoned, stats.waiting), (4, 0));
    }

    #[tokio::test]
    async fn a_database_from_before_the_stored_abandoned_count_opens_and_starts_counting() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_000_000);
        {
            // The queues table as builds before `managed` and `abandoned` wrote it.
            let old = rusqlite::Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
            old.execute_batch(
                "CREATE TABLE queues (name TEXT PRIMARY KEY, settings TEXT NOT NULL, next_seq INTEGER NOT NULL,
                     budget TEXT NOT NULL, estimator TEXT NOT NULL);
                 INSERT INTO queues VALUES ('old', '{}', 7, '{}', '{}');",
            )
            .unwrap();
        }
        let q = QueueName::parse("old").unwrap();
        {
            let store = open(dir.path(), &clock);
            assert_eq!(store.stats(&q).await.unwrap().unwrap().abandoned, 0);
            store
                .enter(&q, &MemberId::parse("silent").unwrap())
                .await
                .unwrap();
            // Past the default 300 s and its 15 s slack.
            clock.advance(316_000);
            store.expire_due(&q).await.unwrap();
            assert_eq!(store.stats(&q).await.unwrap().unwrap().abandoned, 1);
            store.close();
        }
        let store = open(dir.path(), &clock);
        assert_eq!(store.stats(&q).await.unwrap().unwrap().abandoned, 1);
    }

    #[tokio::test]
    async fn state_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_000_000);
        let secret = TokenSecret::generate().unwrap();
        let q = QueueName::parse("restart").unwrap();
        let m = |i: usize| MemberId::parse(&format!("m-{i}")).unwrap();
        let (token, claim) = {
            let store = open(dir.path(), &clock);
            for i in 0..10 {
                store.enter(&q, &m(i)).await.unwrap();
            }
            store
                .update_settings(
                    &q,
                    &SettingsPatch {
                        admit_per_second: Some(3.0),
                        ..SettingsPatch::default()
                    },
                )
                .await
                .unwrap()
                .unwrap();
            store
                .admit(&q, (0..3).map(|_| secret.prepare().unwrap()).collect())
                .await
                .unwrap();
            let (nonce, _) = store.position(&q, &m(0)).await.unwrap().token.unwrap();
            let token = secret.token_for(&nonce);
            let (_, claim) = new_claim_id().unwrap();
            store.claim(&q, &m(0), &digest_of(&token), &claim).await.unwrap();
            store.close();
            (token, claim)
        };
        let store = open(dir.path(), &clock);
        assert_eq!(store.settings(&q).await.unwrap().unwrap().admit_per_second, 3.0);
        assert_eq!(
            store.position(&q, &m(0)).await.unwrap().status,
            MemberStatus::Claimed
        );
        assert_eq!(
            store.position(&q, &m(1)).await.unwrap().status,
            MemberStatus::Ready
        );
        assert_eq!(store.position(&q, &m(3)).await.unwrap().rank, Some(0));
        assert_eq!(store.position(&q, &m(9)).await.unwrap().rank, Some(6));
        assert_eq!(
            store.consume(&q, &m(0), &claim).await.unwrap(),
            ConsumeOutcome::Consumed
        );
        let _ = token;
        // The sequence continues after the restored members: a new arrival goes to the back.
        store.enter(&q, &MemberId::parse("new").unwrap()).await.unwrap();
        assert_eq!(
            store
                .position(&q, &MemberId::parse("new").unwrap())
                .await
                .unwrap()
                .rank,
            Some(7)
        );
    }

    /// Limitation 2 at the store level: the process dies while the admission step is being committed.
    /// The seed popped (one write) and then stored tokens (another), so a death between them lost members.
    /// Here pop and issue are one unit of one transaction: after the "restart" every member is WAITING or
    /// READY and none is lost.
    #[tokio::test]
    async fn a_crash_during_admission_loses_nobody() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_000_000);
        let secret = TokenSecret::generate().unwrap();
        let q = QueueName::parse("crash").unwrap();
        let members: Vec<MemberId> = (0..100)
            .map(|i| MemberId::parse(&format!("m-{i}")).unwrap())
            .collect();
        {
            let store = open(dir.path(), &clock);
            for m in &members {
                store.enter(&q, m).await.unwrap();
            }
            store
                .admit(&q, (0..50).map(|_| secret.prepare().unwrap()).collect())
                .await
                .unwrap();
            clock.advance(1_000);
            store.crash_during_next_commit();
            assert!(store
                .admit(&q, (0..50).map(|_| secret.prepare().unwrap()).collect())
                .await
                .is_err());
            assert!(
                store.position(&q, &members[0]).await.is_err(),
                "a poisoned store refuses service"
            );
        }
        let store = open(dir.path(), &clock);
        let mut counts = std::collections::HashMap::new();
        for m in &members {
            *counts
                .entry(store.position(&q, m).await.unwrap().status)
                .or_insert(0) += 1;
        }
        assert_eq!(
            counts.get(&MemberStatus::NotEntered),
            None,
            "nobody lost: {counts:?}"
        );
        assert_eq!(counts[&MemberStatus::Ready] + counts[&MemberStatus::Waiting], 100);
        assert_eq!(
            counts[&MemberStatus::Ready],
            50,
            "the committed tick survived, the crashed one vanished whole"
        );
    }
}

/// State-machine property test of the whole embedded store: random sequences of enter, poll, admit,
/// claim, consume, release, expire and leave never reach an invalid state and never hold more than
/// `max_active` outstanding tokens.
#[cfg(test)]
mod state_machine_properties {
    use super::*;
    use crate::clock::ManualClock;
    use crate::queue::token::{digest_of, new_claim_id, TokenSecret};
    use proptest::prelude::*;
    use rankgate_core::queue::MemberStatus;

    const MEMBERS: usize = 8;
    const MAX_ACTIVE: u64 = 3;

    #[derive(Debug, Clone)]
    enum Op {
        Enter(usize),
        Poll(usize),
        Admit,
        Claim(usize, bool),
        Consume(usize),
        Release(usize),
        Expire(i64),
        Leave(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..MEMBERS).prop_map(Op::Enter),
            1 => (0..MEMBERS).prop_map(Op::Poll),
            2 => Just(Op::Admit),
            2 => (0..MEMBERS, any::<bool>()).prop_map(|(m, right)| Op::Claim(m, right)),
            1 => (0..MEMBERS).prop_map(Op::Consume),
            1 => (0..MEMBERS).prop_map(Op::Release),
            1 => (1..20_000i64).prop_map(Op::Expire),
            1 => (0..MEMBERS).prop_map(Op::Leave),
        ]
    }

    async fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_000_000);
        let store =
            EmbeddedStore::open(dir.path(), Arc::new(clock.clone()), EmbeddedOptions::default()).unwrap();
        let secret = TokenSecret::generate().unwrap();
        let q = QueueName::parse("prop").unwrap();
        let members: Vec<MemberId> = (0..MEMBERS)
            .map(|i| MemberId::parse(&format!("m-{i}")).unwrap())
            .collect();
        let patch = SettingsPatch {
            max_active: Some(Some(MAX_ACTIVE)),
            token_ttl_seconds: Some(20),
            claim_ttl_seconds: Some(5),
            ..SettingsPatch::default()
        };
        store.update_settings(&q, &patch).await.unwrap().unwrap();
        let mut claims: Vec<Option<Digest>> = vec![None; MEMBERS];
        for op in ops {
            match op {
                Op::Enter(m) => {
                    store.enter(&q, &members[m]).await.unwrap();
                }
                Op::Poll(m) => {
                    store.position(&q, &members[m]).await.unwrap();
                }
                Op::Admit => {
                    clock.advance(1_000);
                    store
                        .admit(&q, (0..50).map(|_| secret.prepare().unwrap()).collect())
                        .await
                        .unwrap();
                }
                Op::Claim(m, right) => {
                    let view = store.position(&q, &members[m]).await.unwrap();
                    let token = match (right, view.token) {
                        (true, Some((nonce, _))) => secret.token_for(&nonce),
                        _ => "wrong".to_string(),
                    };
                    let (_, claim) = new_claim_id().unwrap();
                    if let ClaimOutcome::Claimed { .. } = store
                        .claim(&q, &members[m], &digest_of(&token), &claim)
                        .await
                        .unwrap()
                    {
                        prop_assert!(right, "a wrong token was accepted");
                        claims[m] = Some(claim);
                    }
                }
                Op::Consume(m) => {
                    if let Some(claim) = claims[m] {
                        store.consume(&q, &members[m], &claim).await.unwrap();
                    }
                }
                Op::Release(m) => {
                    if let Some(claim) = claims[m] {
                        store.release(&q, &members[m], &claim).await.unwrap();
                    }
                }
                Op::Expire(ms) => {
                    clock.advance(ms);
                    store.expire_due(&q).await.unwrap();
                }
                Op::Leave(m) => {
                    store.leave(&q, &members[m]).await.unwrap();
                }
            }
            store.expire_due(&q).await.unwrap();
            let stats = store.stats(&q).await.unwrap().unwrap();
            prop_assert!(
                stats.ready + stats.claimed <= MAX_ACTIVE,
                "outstanding {} > max_active",
                stats.ready + stats.claimed
            );
            let mut ranks = Vec::new();
            let (mut ready, mut claimed) = (0, 0);
            for member in &members {
                let view = store.position(&q, member).await.unwrap();
                match view.status {
                    MemberStatus::Waiting => ranks.push(view.rank.expect("a waiting member has a rank")),
                    MemberStatus::Ready => {
                        ready += 1;
                        prop_assert!(view.token.is_some() && view.rank.is_none());
                    }
                    MemberStatus::Claimed => claimed += 1,
                    MemberStatus::NotEntered => prop_assert!(view.token.is_none() && view.rank.is_none()),
                }
            }
            ranks.sort_unstable();
            prop_assert_eq!(
                ranks,
                (0..stats.waiting).collect::<Vec<_>>(),
                "ranks are 0..waiting, each once"
            );
            prop_assert_eq!(
                (ready, claimed),
                (stats.ready, stats.claimed),
                "counters match member states"
            );
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn random_operations_keep_the_store_consistent(ops in proptest::collection::vec(op(), 1..80)) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(run(ops))?;
        }
    }
}
