//! [`JobStore`]: delayed and retried jobs with a visibility timeout (SPEC Part 3).
//!
//! A ready set scored by due time, a processing set scored by claim expiry, a dead set. Claiming moves due
//! jobs from ready to processing atomically and hands out a claim token; ack and nack check it, so a worker
//! whose claim was reaped cannot finish a job someone else now owns. The reaper returns expired claims with
//! backoff, counting them as failed attempts. Transitions and backoff are `rankgate_core::job`'s.
//!
//! A **group** of jobs (ids `<group>:…`, [`job_group`]) can be paused: its ready jobs are parked at once,
//! and from then on an enqueued job of it, or a claimed one that fails or expires, is parked too, so no
//! worker claims any of them until the group is resumed. The pause is kept in the store beside the jobs:
//! every instance sharing the store sees it, and it outlives restarts. Webhooks pause a webhook's group on
//! a receiver's `410 Gone`.

use async_trait::async_trait;
pub use rankgate_core::job::job_group;
use rankgate_core::job::RetryPolicy;

use super::StoreError;

/// A job to enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    /// Unique within the job queue; enqueueing an existing id is a no-op (idempotent producers).
    pub id: String,
    /// Opaque payload.
    pub payload: Vec<u8>,
    /// Milliseconds from now until the job is due (0 = now).
    pub delay_ms: i64,
    /// Retry policy.
    pub policy: RetryPolicy,
}

/// A job handed to a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedJob {
    /// The job id.
    pub id: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Which attempt this is (1-based).
    pub attempt: u32,
    /// Present this to ack or nack.
    pub claim_token: u128,
    /// When the reaper takes it back (store clock, ms).
    pub claim_expires_at_ms: i64,
}

/// A job in the dead set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadJob {
    /// The job id.
    pub id: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// When it died.
    pub died_at_ms: i64,
    /// Why its last attempt failed.
    pub reason: String,
}

/// Result of [`JobStore::nack`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NackOutcome {
    /// Will be retried at this time.
    RetryAt(i64),
    /// Out of attempts: moved to the dead set.
    Dead,
    /// The job's group is paused: parked until it is resumed.
    Parked,
    /// The claim token is not current (reaped meanwhile): nothing changed.
    StaleClaim,
}

/// Result of [`JobStore::ack`] and [`JobStore::replay_dead`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobAckOutcome {
    /// Done.
    Done,
    /// The claim is stale, or the job is not in the expected state: nothing changed.
    Stale,
}

/// Sizes of a job queue's sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JobCounts {
    /// Waiting to be due or claimed.
    pub ready: u64,
    /// Claimed by workers.
    pub processing: u64,
    /// Out of attempts.
    pub dead: u64,
    /// Held while their group is paused.
    pub parked: u64,
}

/// A paused group of a job queue ([`JobStore::pause_group`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PausedGroup {
    /// The group (`<group>` of its jobs' ids `<group>:…`).
    pub group: String,
    /// When it was paused (store clock, ms).
    pub since_ms: i64,
    /// Why, as the pauser said.
    pub reason: String,
}

/// Delayed/retry jobs. Every method is one atomic step on the store, with the store's clock.
#[async_trait]
pub trait JobStore: Send + Sync + 'static {
    /// Adds a job; `false` if the id already exists.
    async fn enqueue(&self, queue: &str, job: NewJob) -> Result<bool, StoreError>;
    /// Claims up to `limit` due jobs for `lease_ms`, oldest due first.
    async fn claim_due(
        &self,
        queue: &str,
        limit: usize,
        lease_ms: i64,
    ) -> Result<Vec<ClaimedJob>, StoreError>;
    /// The job succeeded.
    async fn ack(&self, queue: &str, id: &str, claim_token: u128) -> Result<JobAckOutcome, StoreError>;
    /// The job failed: retry with capped exponential backoff and jitter, or dead after the last attempt
    /// (parked instead, whatever its attempts, while its group is paused).
    async fn nack(
        &self,
        queue: &str,
        id: &str,
        claim_token: u128,
        reason: &str,
    ) -> Result<NackOutcome, StoreError> {
        self.nack_with_min_delay(queue, id, claim_token, reason, 0).await
    }
    /// [`JobStore::nack`], retried no sooner than `min_delay_ms` from now (what the job's target asked
    /// for, e.g. a `Retry-After`) but never later than the policy's longest delay
    /// (`rankgate_core::job::retry_delay_ms`).
    async fn nack_with_min_delay(
        &self,
        queue: &str,
        id: &str,
        claim_token: u128,
        reason: &str,
        min_delay_ms: u64,
    ) -> Result<NackOutcome, StoreError>;
    /// Returns expired claims to the ready set (or the dead set); how many.
    async fn reap_expired(&self, queue: &str) -> Result<u64, StoreError>;
    /// Up to `limit` dead jobs, oldest first.
    async fn dead_jobs(&self, queue: &str, limit: usize) -> Result<Vec<DeadJob>, StoreError>;
    /// Puts a dead job back in the ready set, due now, with fresh attempts.
    async fn replay_dead(&self, queue: &str, id: &str) -> Result<JobAckOutcome, StoreError>;
    /// Set sizes.
    async fn counts(&self, queue: &str) -> Result<JobCounts, StoreError>;
    /// Pauses `group`, parking its ready jobs; `false` (and the first pause kept) if it was paused
    /// already. Jobs claimed meanwhile finish as they do, and are parked if they fail.
    async fn pause_group(&self, queue: &str, group: &str, reason: &str) -> Result<bool, StoreError>;
    /// Resumes `group`: its parked jobs are due now, with fresh attempts. `false` if it was not paused.
    async fn resume_group(&self, queue: &str, group: &str) -> Result<bool, StoreError>;
    /// The paused groups, by group name.
    async fn paused_groups(&self, queue: &str) -> Result<Vec<PausedGroup>, StoreError>;
}
