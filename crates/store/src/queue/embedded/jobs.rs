//! The embedded [`JobStore`]: ready, processing, dead and parked sorted sets per job queue, persisted in
//! the same group-commit log as the waiting room.
//!
//! A paused group is a row of the `jobs` table too, under the queue name `<queue>#paused` with the group
//! as its id and its [`PauseRow`] as the record: the pause then lives, commits and reloads exactly as the
//! jobs it holds back, without a schema change (a build from before reads the row as a job record it
//! cannot parse, and skips it, as it skips any such row).

use async_trait::async_trait;
use hashbrown::HashMap;
use parking_lot::Mutex;
use rand::Rng as _;
use rankgate_core::job::{job_group, JobRecord, JobState};
use rankgate_zset::{ScoreBound, SortedSet};
use rusqlite::Connection;

use super::persist::{committed, Write};
use super::EmbeddedStore;
use crate::queue::jobs::{
    ClaimedJob, DeadJob, JobAckOutcome, JobCounts, JobStore, NackOutcome, NewJob, PausedGroup,
};
use crate::queue::StoreError;

/// The `jobs` table's queue name for `queue`'s paused groups (see the module doc).
const PAUSED_SUFFIX: &str = "#paused";

/// A paused group as its row stores it.
#[derive(serde::Serialize, serde::Deserialize)]
struct PauseRow {
    since_ms: i64,
    reason: String,
}

#[derive(Default)]
struct JobQueue {
    records: HashMap<String, (JobRecord, Vec<u8>)>,
    /// id → due time.
    ready: SortedSet,
    /// id → claim expiry.
    processing: SortedSet,
    /// id → time of death.
    dead: SortedSet,
    /// id → when it was parked.
    parked: SortedSet,
    /// Paused groups → (since, reason).
    paused: std::collections::BTreeMap<String, (i64, String)>,
}

impl JobQueue {
    /// Puts `id` in the set its state belongs to (and out of the others).
    fn place(&mut self, id: &str, record: JobRecord, payload: Vec<u8>) {
        self.unlist(id);
        let _ = match &record.state {
            JobState::Ready { due_at_ms } => self.ready.insert(id.as_bytes(), *due_at_ms as f64),
            JobState::Processing { expires_at_ms, .. } => {
                self.processing.insert(id.as_bytes(), *expires_at_ms as f64)
            }
            JobState::Dead { died_at_ms, .. } => self.dead.insert(id.as_bytes(), *died_at_ms as f64),
            JobState::Parked { parked_at_ms } => self.parked.insert(id.as_bytes(), *parked_at_ms as f64),
        };
        self.records.insert(id.to_string(), (record, payload));
    }

    fn unlist(&mut self, id: &str) {
        self.ready.zrem(id.as_bytes());
        self.processing.zrem(id.as_bytes());
        self.dead.zrem(id.as_bytes());
        self.parked.zrem(id.as_bytes());
    }

    fn remove(&mut self, id: &str) {
        self.unlist(id);
        self.records.remove(id);
    }

    /// Whether `id`'s group is paused.
    fn is_held(&self, id: &str) -> bool {
        job_group(id).is_some_and(|group| self.paused.contains_key(group))
    }

    /// The ids of `group` in `set`.
    fn ids_of_group(set: &SortedSet, group: &str) -> Vec<String> {
        set.range_by_rank(0, -1, false)
            .into_iter()
            .map(|(id, _)| String::from_utf8_lossy(id).into_owned())
            .filter(|id| job_group(id) == Some(group))
            .collect()
    }
}

/// Every job queue, behind one lock: job traffic is a few operations a second, not a hot path.
#[derive(Default)]
pub(crate) struct EmbeddedJobs {
    /// Each job queue's monotonic clock guard (the last time one of its steps used), beside the queues.
    /// Per job queue and recorded by every step, acks included, exactly as each Redis job queue keeps
    /// `last_ms` in its meta hash; a guard shared by all job queues, or one an ack did not move, put a
    /// job's due time on a different clock than Redis after the clock stepped back.
    queues: Mutex<(HashMap<String, i64>, HashMap<String, JobQueue>)>,
}

impl EmbeddedJobs {
    pub(crate) fn load(connection: &Connection) -> rusqlite::Result<EmbeddedJobs> {
        let jobs = EmbeddedJobs::default();
        {
            let mut guard = jobs.queues.lock();
            let mut statement = connection.prepare("SELECT queue, id, record, payload FROM jobs")?;
            let rows = statement.query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, Vec<u8>>(3)?,
                ))
            })?;
            for row in rows {
                let (queue, id, record, payload) = row?;
                if let Some(queue) = queue.strip_suffix(PAUSED_SUFFIX) {
                    if let Ok(pause) = serde_json::from_str::<PauseRow>(&record) {
                        let jobs = guard.1.entry(queue.to_string()).or_default();
                        jobs.paused.insert(id, (pause.since_ms, pause.reason));
                    }
                } else if let Ok(record) = serde_json::from_str::<JobRecord>(&record) {
                    guard.1.entry(queue).or_default().place(&id, record, payload);
                }
            }
        }
        Ok(jobs)
    }
}

fn job_write(queue: &str, id: &str, record: &JobRecord, payload: &[u8]) -> Write {
    Write::Job {
        queue: queue.to_string(),
        id: id.to_string(),
        record: serde_json::to_string(record).unwrap_or_default(),
        payload: payload.to_vec(),
    }
}

fn pause_write(queue: &str, group: &str, pause: Option<&PauseRow>) -> Write {
    let queue = format!("{queue}{PAUSED_SUFFIX}");
    match pause {
        Some(pause) => Write::Job {
            queue,
            id: group.to_string(),
            record: serde_json::to_string(pause).unwrap_or_default(),
            payload: Vec::new(),
        },
        None => Write::DeleteJob {
            queue,
            id: group.to_string(),
        },
    }
}

impl EmbeddedStore {
    /// The store clock through `queue`'s guard, recorded.
    fn job_now(&self, guards: &mut HashMap<String, i64>, queue: &str) -> i64 {
        let clock = self.clock.now_millis();
        let last = guards.entry_ref(queue).or_insert(clock);
        *last = (*last).max(clock);
        *last
    }
}

#[async_trait]
impl JobStore for EmbeddedStore {
    async fn enqueue(&self, queue: &str, job: NewJob) -> Result<bool, StoreError> {
        self.check()?;
        let pending = {
            let mut guard = self.jobs.queues.lock();
            let (guards, queues) = &mut *guard;
            let now = self.job_now(guards, queue);
            let jobs = queues.entry(queue.to_string()).or_default();
            if jobs.records.contains_key(&job.id) {
                return Ok(false);
            }
            let mut record = JobRecord::new(now + job.delay_ms.max(0), job.policy);
            if jobs.is_held(&job.id) {
                record = record.park(now).unwrap_or(record);
            }
            let write = job_write(queue, &job.id, &record, &job.payload);
            jobs.place(&job.id, record, job.payload);
            self.writer.submit(vec![write])
        };
        committed(pending).await?;
        Ok(true)
    }

    async fn claim_due(
        &self,
        queue: &str,
        limit: usize,
        lease_ms: i64,
    ) -> Result<Vec<ClaimedJob>, StoreError> {
        self.check()?;
        let (claimed, pending) = {
            let mut guard = self.jobs.queues.lock();
            let (guards, queues) = &mut *guard;
            let now = self.job_now(guards, queue);
            let Some(jobs) = queues.get_mut(queue) else {
                return Ok(Vec::new());
            };
            let due: Vec<String> = jobs
                .ready
                .range_by_score(
                    ScoreBound::Inclusive(f64::NEG_INFINITY),
                    ScoreBound::Inclusive(now as f64),
                    false,
                    Some((0, limit as i64)),
                )
                .into_iter()
                .map(|(id, _)| String::from_utf8_lossy(id).into_owned())
                .collect();
            let mut claimed = Vec::with_capacity(due.len());
            let mut writes = Vec::with_capacity(due.len());
            for id in due {
                let Some((record, payload)) = jobs.records.get(&id).cloned() else {
                    continue;
                };
                let claim_token: u128 = rand::rng().random();
                let Ok(next) = record.claim(claim_token, now, lease_ms) else {
                    continue;
                };
                writes.push(job_write(queue, &id, &next, &payload));
                claimed.push(ClaimedJob {
                    id: id.clone(),
                    payload: payload.clone(),
                    attempt: next.attempts,
                    claim_token,
                    claim_expires_at_ms: now + lease_ms,
                });
                jobs.place(&id, next, payload);
            }
            if writes.is_empty() {
                return Ok(claimed);
            }
            (claimed, self.writer.submit(writes))
        };
        committed(pending).await?;
        Ok(claimed)
    }

    async fn ack(&self, queue: &str, id: &str, claim_token: u128) -> Result<JobAckOutcome, StoreError> {
        self.check()?;
        let pending = {
            let mut guard = self.jobs.queues.lock();
            let (guards, queues) = &mut *guard;
            // An ack is a step of the job queue: it records the clock, as every other step does.
            self.job_now(guards, queue);
            let Some(jobs) = queues.get_mut(queue) else {
                return Ok(JobAckOutcome::Stale);
            };
            let Some((record, _)) = jobs.records.get(id) else {
                return Ok(JobAckOutcome::Stale);
            };
            if record.ack(claim_token).is_err() {
                return Ok(JobAckOutcome::Stale);
            }
            jobs.remove(id);
            self.writer.submit(vec![Write::DeleteJob {
                queue: queue.to_string(),
                id: id.to_string(),
            }])
        };
        committed(pending).await?;
        Ok(JobAckOutcome::Done)
    }

    async fn nack_with_min_delay(
        &self,
        queue: &str,
        id: &str,
        claim_token: u128,
        reason: &str,
        min_delay_ms: u64,
    ) -> Result<NackOutcome, StoreError> {
        self.check()?;
        let (outcome, pending) = {
            let mut guard = self.jobs.queues.lock();
            let (guards, queues) = &mut *guard;
            let now = self.job_now(guards, queue);
            let Some(jobs) = queues.get_mut(queue) else {
                return Ok(NackOutcome::StaleClaim);
            };
            let Some((record, payload)) = jobs.records.get(id).cloned() else {
                return Ok(NackOutcome::StaleClaim);
            };
            let (next, outcome) = if jobs.is_held(id) {
                let Ok(next) = record.park_claimed(claim_token, now) else {
                    return Ok(NackOutcome::StaleClaim);
                };
                (next, NackOutcome::Parked)
            } else {
                let jitter = rand::rng().random::<f64>();
                let Ok((next, dead)) = record.nack(claim_token, now, jitter, min_delay_ms, reason) else {
                    return Ok(NackOutcome::StaleClaim);
                };
                let outcome = match next.state {
                    JobState::Ready { due_at_ms } if !dead => NackOutcome::RetryAt(due_at_ms),
                    _ => NackOutcome::Dead,
                };
                (next, outcome)
            };
            let write = job_write(queue, id, &next, &payload);
            jobs.place(id, next, payload);
            (outcome, self.writer.submit(vec![write]))
        };
        committed(pending).await?;
        Ok(outcome)
    }

    async fn reap_expired(&self, queue: &str) -> Result<u64, StoreError> {
        self.check()?;
        let (count, pending) = {
            let mut guard = self.jobs.queues.lock();
            let (guards, queues) = &mut *guard;
            let now = self.job_now(guards, queue);
            let Some(jobs) = queues.get_mut(queue) else {
                return Ok(0);
            };
            let expired: Vec<String> = jobs
                .processing
                .range_by_score(
                    ScoreBound::Inclusive(f64::NEG_INFINITY),
                    ScoreBound::Inclusive(now as f64),
                    false,
                    None,
                )
                .into_iter()
                .map(|(id, _)| String::from_utf8_lossy(id).into_owned())
                .collect();
            let mut writes = Vec::new();
            for id in &expired {
                let Some((record, payload)) = jobs.records.get(id).cloned() else {
                    continue;
                };
                let next = if jobs.is_held(id) {
                    record.park(now).ok()
                } else {
                    record
                        .reap(now, rand::rng().random::<f64>())
                        .map(|(next, _)| next)
                };
                if let Some(next) = next {
                    writes.push(job_write(queue, id, &next, &payload));
                    jobs.place(id, next, payload);
                }
            }
            if writes.is_empty() {
                return Ok(0);
            }
            (writes.len() as u64, self.writer.submit(writes))
        };
        committed(pending).await?;
        Ok(count)
    }

    async fn dead_jobs(&self, queue: &str, limit: usize) -> Result<Vec<DeadJob>, StoreError> {
        self.check()?;
        let guard = self.jobs.queues.lock();
        let Some(jobs) = guard.1.get(queue) else {
            return Ok(Vec::new());
        };
        Ok(jobs
            .dead
            .range_by_rank(0, limit as i64 - 1, false)
            .into_iter()
            .filter_map(|(id, _)| {
                let id = String::from_utf8_lossy(id).into_owned();
                let (record, payload) = jobs.records.get(&id)?;
                match &record.state {
                    JobState::Dead { died_at_ms, reason } => Some(DeadJob {
                        id,
                        payload: payload.clone(),
                        died_at_ms: *died_at_ms,
                        reason: reason.clone(),
                    }),
                    _ => None,
                }
            })
            .collect())
    }

    async fn replay_dead(&self, queue: &str, id: &str) -> Result<JobAckOutcome, StoreError> {
        self.check()?;
        let pending = {
            let mut guard = self.jobs.queues.lock();
            let (guards, queues) = &mut *guard;
            let now = self.job_now(guards, queue);
            let Some(jobs) = queues.get_mut(queue) else {
                return Ok(JobAckOutcome::Stale);
            };
            let Some((record, payload)) = jobs.records.get(id).cloned() else {
                return Ok(JobAckOutcome::Stale);
            };
            let Ok(mut next) = record.replay(now) else {
                return Ok(JobAckOutcome::Stale);
            };
            if jobs.is_held(id) {
                next = next.park(now).unwrap_or(next);
            }
            let write = job_write(queue, id, &next, &payload);
            jobs.place(id, next, payload);
            self.writer.submit(vec![write])
        };
        committed(pending).await?;
        Ok(JobAckOutcome::Done)
    }

    async fn counts(&self, queue: &str) -> Result<JobCounts, StoreError> {
        self.check()?;
        let guard = self.jobs.queues.lock();
        Ok(guard
            .1
            .get(queue)
            .map_or_else(JobCounts::default, |jobs| JobCounts {
                ready: jobs.ready.len() as u64,
                processing: jobs.processing.len() as u64,
                dead: jobs.dead.len() as u64,
                parked: jobs.parked.len() as u64,
            }))
    }

    async fn pause_group(&self, queue: &str, group: &str, reason: &str) -> Result<bool, StoreError> {
        self.check()?;
        let pending = {
            let mut guard = self.jobs.queues.lock();
            let (guards, queues) = &mut *guard;
            let now = self.job_now(guards, queue);
            let jobs = queues.entry(queue.to_string()).or_default();
            if jobs.paused.contains_key(group) {
                return Ok(false);
            }
            let pause = PauseRow {
                since_ms: now,
                reason: reason.to_string(),
            };
            let mut writes = vec![pause_write(queue, group, Some(&pause))];
            jobs.paused.insert(group.to_string(), (now, reason.to_string()));
            for id in JobQueue::ids_of_group(&jobs.ready, group) {
                let Some((record, payload)) = jobs.records.get(&id).cloned() else {
                    continue;
                };
                if let Ok(next) = record.park(now) {
                    writes.push(job_write(queue, &id, &next, &payload));
                    jobs.place(&id, next, payload);
                }
            }
            self.writer.submit(writes)
        };
        committed(pending).await?;
        Ok(true)
    }

    async fn resume_group(&self, queue: &str, group: &str) -> Result<bool, StoreError> {
        self.check()?;
        let pending = {
            let mut guard = self.jobs.queues.lock();
            let (guards, queues) = &mut *guard;
            let now = self.job_now(guards, queue);
            let Some(jobs) = queues.get_mut(queue) else {
                return Ok(false);
            };
            if jobs.paused.remove(group).is_none() {
                return Ok(false);
            }
            let mut writes = vec![pause_write(queue, group, None)];
            for id in JobQueue::ids_of_group(&jobs.parked, group) {
                let Some((record, payload)) = jobs.records.get(&id).cloned() else {
                    continue;
                };
                if let Ok(next) = record.unpark(now) {
                    writes.push(job_write(queue, &id, &next, &payload));
                    jobs.place(&id, next, payload);
                }
            }
            self.writer.submit(writes)
        };
        committed(pending).await?;
        Ok(true)
    }

    async fn paused_groups(&self, queue: &str) -> Result<Vec<PausedGroup>, StoreError> {
        self.check()?;
        let guard = self.jobs.queues.lock();
        Ok(guard.1.get(queue).map_or_else(Vec::new, |jobs| {
            jobs.paused
                .iter()
                .map(|(group, (since_ms, reason))| PausedGroup {
                    group: group.clone(),
                    since_ms: *since_ms,
                    reason: reason.clone(),
                })
                .collect()
        }))
    }
}
