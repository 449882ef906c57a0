//! The embedded [`JobStore`]: ready, processing and dead sorted sets per job queue, persisted in the same
//! group-commit log as the waiting room.

use async_trait::async_trait;
use hashbrown::HashMap;
use parking_lot::Mutex;
use rand::Rng as _;
use rankgate_core::job::{JobRecord, JobState};
use rankgate_zset::{ScoreBound, SortedSet};
use rusqlite::Connection;

use super::persist::{committed, Write};
use super::EmbeddedStore;
use crate::queue::jobs::{ClaimedJob, DeadJob, JobAckOutcome, JobCounts, JobStore, NackOutcome, NewJob};
use crate::queue::StoreError;

#[derive(Default)]
struct JobQueue {
    records: HashMap<String, (JobRecord, Vec<u8>)>,
    /// id → due time.
    ready: SortedSet,
    /// id → claim expiry.
    processing: SortedSet,
    /// id → time of death.
    dead: SortedSet,
}

impl JobQueue {
    /// Puts `id` in the set its state belongs to (and out of the others).
    fn place(&mut self, id: &str, record: JobRecord, payload: Vec<u8>) {
        self.ready.zrem(id.as_bytes());
        self.processing.zrem(id.as_bytes());
        self.dead.zrem(id.as_bytes());
        let _ = match &record.state {
            JobState::Ready { due_at_ms } => self.ready.insert(id.as_bytes(), *due_at_ms as f64),
            JobState::Processing { expires_at_ms, .. } => {
                self.processing.insert(id.as_bytes(), *expires_at_ms as f64)
            }
            JobState::Dead { died_at_ms, .. } => self.dead.insert(id.as_bytes(), *died_at_ms as f64),
        };
        self.records.insert(id.to_string(), (record, payload));
    }

    fn remove(&mut self, id: &str) {
        self.ready.zrem(id.as_bytes());
        self.processing.zrem(id.as_bytes());
        self.dead.zrem(id.as_bytes());
        self.records.remove(id);
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
                if let Ok(record) = serde_json::from_str::<JobRecord>(&record) {
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
            let record = JobRecord::new(now + job.delay_ms.max(0), job.policy);
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

    async fn nack(
        &self,
        queue: &str,
        id: &str,
        claim_token: u128,
        reason: &str,
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
            let Ok((next, dead)) = record.nack(claim_token, now, rand::rng().random::<f64>(), reason) else {
                return Ok(NackOutcome::StaleClaim);
            };
            let outcome = match next.state {
                JobState::Ready { due_at_ms } if !dead => NackOutcome::RetryAt(due_at_ms),
                _ => NackOutcome::Dead,
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
                if let Some((next, _)) = record.reap(now, rand::rng().random::<f64>()) {
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
            let Ok(next) = record.replay(now) else {
                return Ok(JobAckOutcome::Stale);
            };
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
            }))
    }
}
