//! [`JobStore`] on Redis: each method is one script over the job queue's hash-tagged keys.
//!
//! Transitions follow `rankgate_core::job::JobRecord` (claim, ack, nack with capped exponential backoff and
//! jitter, reap, dead set, replay). Jitter is drawn in Rust and passed in, because a script's own random
//! numbers are not something to rely on. Claim tokens are 96 random bits from the caller plus the claim's
//! index in the batch, so every claim in a batch gets a distinct token that a stale worker cannot reuse.
//! Paused groups and their parked jobs are two more keys in the same slot, so pausing parks and resuming
//! unparks in the one script that flips the pause.

use async_trait::async_trait;
use rand::Rng as _;

use super::{RedisStore, Reply};
use crate::queue::jobs::{
    ClaimedJob, DeadJob, JobAckOutcome, JobCounts, JobStore, NackOutcome, NewJob, PausedGroup,
};
use crate::queue::StoreError;

/// Jitter units passed to one reap: expired jobs take them in turn.
const REAP_JITTER_UNITS: usize = 32;
/// Upper bound on one claim batch (a script should stay short).
const MAX_CLAIM_BATCH: usize = 10_000;

fn token_hex(token: u128) -> String {
    format!("{token:032x}")
}

impl RedisStore {
    /// [`JobStore::nack`] with the jitter unit given: the trait draws it at random, tests pin it to check
    /// the script's backoff against `rankgate_core::job::backoff_delay_ms`.
    async fn nack_with_jitter(
        &self,
        queue: &str,
        id: &str,
        claim_token: u128,
        reason: &str,
        jitter: f64,
        min_delay_ms: u64,
    ) -> Result<NackOutcome, StoreError> {
        self.check()?;
        let mut call = self.job_call(&self.scripts.job_nack, queue);
        call.arg(id)
            .arg(token_hex(claim_token))
            .arg(reason)
            .arg(format!("{jitter}"))
            .arg(min_delay_ms);
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        Ok(match reply.int()? {
            1 => NackOutcome::RetryAt(reply.int()?),
            2 => NackOutcome::Dead,
            3 => NackOutcome::Parked,
            _ => NackOutcome::StaleClaim,
        })
    }
}

#[async_trait]
impl JobStore for RedisStore {
    async fn enqueue(&self, queue: &str, job: NewJob) -> Result<bool, StoreError> {
        self.check()?;
        let mut call = self.job_call(&self.scripts.job_enqueue, queue);
        call.arg(&job.id)
            .arg(job.payload.as_slice())
            .arg(job.delay_ms)
            .arg(job.policy.base_delay_ms)
            .arg(job.policy.max_delay_ms)
            .arg(job.policy.max_attempts);
        let added: i64 = self.connection.invoke(&call).await?;
        Ok(added == 1)
    }

    async fn claim_due(
        &self,
        queue: &str,
        limit: usize,
        lease_ms: i64,
    ) -> Result<Vec<ClaimedJob>, StoreError> {
        self.check()?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let base: u128 = rand::rng().random();
        let base_hex = token_hex(base);
        let mut call = self.job_call(&self.scripts.job_claim, queue);
        call.arg(limit.min(MAX_CLAIM_BATCH))
            .arg(lease_ms)
            .arg(&base_hex[..24]);
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        let mut claimed = Vec::new();
        while !reply.is_empty() {
            let id = reply.string()?;
            let payload = reply.bytes()?;
            let attempt = reply.int()?.max(0) as u32;
            let token = reply.string()?;
            let claim_token = u128::from_str_radix(&token, 16)
                .map_err(|_| StoreError::Corrupt(format!("bad claim token {token:?}")))?;
            claimed.push(ClaimedJob {
                id,
                payload,
                attempt,
                claim_token,
                claim_expires_at_ms: reply.int()?,
            });
        }
        Ok(claimed)
    }

    async fn ack(&self, queue: &str, id: &str, claim_token: u128) -> Result<JobAckOutcome, StoreError> {
        self.check()?;
        let mut call = self.job_call(&self.scripts.job_ack, queue);
        call.arg(id).arg(token_hex(claim_token));
        let done: i64 = self.connection.invoke(&call).await?;
        Ok(if done == 1 {
            JobAckOutcome::Done
        } else {
            JobAckOutcome::Stale
        })
    }

    async fn nack_with_min_delay(
        &self,
        queue: &str,
        id: &str,
        claim_token: u128,
        reason: &str,
        min_delay_ms: u64,
    ) -> Result<NackOutcome, StoreError> {
        let jitter: f64 = rand::rng().random();
        self.nack_with_jitter(queue, id, claim_token, reason, jitter, min_delay_ms)
            .await
    }

    async fn reap_expired(&self, queue: &str) -> Result<u64, StoreError> {
        self.check()?;
        let mut call = self.job_call(&self.scripts.job_reap, queue);
        let units: Vec<String> = {
            let mut rng = rand::rng();
            (0..REAP_JITTER_UNITS)
                .map(|_| format!("{}", rng.random::<f64>()))
                .collect()
        };
        for unit in units {
            call.arg(unit);
        }
        let count: i64 = self.connection.invoke(&call).await?;
        Ok(count.max(0) as u64)
    }

    async fn dead_jobs(&self, queue: &str, limit: usize) -> Result<Vec<DeadJob>, StoreError> {
        self.check()?;
        let mut call = self.job_call(&self.scripts.job_dead, queue);
        call.arg(limit.min(i64::MAX as usize));
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        let mut dead = Vec::new();
        while !reply.is_empty() {
            dead.push(DeadJob {
                id: reply.string()?,
                payload: reply.bytes()?,
                died_at_ms: reply.int()?,
                reason: reply.string()?,
            });
        }
        Ok(dead)
    }

    async fn replay_dead(&self, queue: &str, id: &str) -> Result<JobAckOutcome, StoreError> {
        self.check()?;
        let mut call = self.job_call(&self.scripts.job_replay, queue);
        call.arg(id);
        let done: i64 = self.connection.invoke(&call).await?;
        Ok(if done == 1 {
            JobAckOutcome::Done
        } else {
            JobAckOutcome::Stale
        })
    }

    async fn counts(&self, queue: &str) -> Result<JobCounts, StoreError> {
        self.check()?;
        let call = self.job_call(&self.scripts.job_counts, queue);
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        Ok(JobCounts {
            ready: reply.int()?.max(0) as u64,
            processing: reply.int()?.max(0) as u64,
            dead: reply.int()?.max(0) as u64,
            parked: reply.int()?.max(0) as u64,
        })
    }

    async fn pause_group(&self, queue: &str, group: &str, reason: &str) -> Result<bool, StoreError> {
        self.check()?;
        let mut call = self.job_call(&self.scripts.job_pause, queue);
        call.arg(group).arg(reason);
        let paused: i64 = self.connection.invoke(&call).await?;
        Ok(paused == 1)
    }

    async fn resume_group(&self, queue: &str, group: &str) -> Result<bool, StoreError> {
        self.check()?;
        let mut call = self.job_call(&self.scripts.job_resume, queue);
        call.arg(group);
        let resumed: i64 = self.connection.invoke(&call).await?;
        Ok(resumed == 1)
    }

    async fn paused_groups(&self, queue: &str) -> Result<Vec<PausedGroup>, StoreError> {
        self.check()?;
        let call = self.job_call(&self.scripts.job_paused, queue);
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        let mut paused = Vec::new();
        while !reply.is_empty() {
            let group = reply.string()?;
            let value = reply.string()?;
            let (since, reason) = value
                .split_once('|')
                .ok_or_else(|| StoreError::Corrupt(format!("bad pause record {value:?}")))?;
            let since_ms = since
                .parse()
                .map_err(|_| StoreError::Corrupt(format!("bad pause time {since:?}")))?;
            paused.push(PausedGroup {
                group,
                since_ms,
                reason: reason.to_string(),
            });
        }
        paused.sort_by(|a, b| a.group.cmp(&b.group));
        Ok(paused)
    }
}

#[cfg(test)]
mod tests {
    //! The Lua re-statement of the backoff against `rankgate_core::job`, on the standalone Redis at
    //! 127.0.0.1:6379 (the conformance suite cannot pin the jitter; this does).
    use std::sync::Arc;

    use proptest::prelude::*;
    use rankgate_core::job::{backoff_delay_ms, RetryPolicy};

    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::queue::redis::{RedisOptions, RedisTime};

    async fn run(policy: RetryPolicy, units: Vec<f64>, case: u64) -> Result<(), TestCaseError> {
        let clock = ManualClock::new(1_700_000_000_000);
        let options = RedisOptions {
            prefix: format!("rgtest:backoff:{}:{case}:", std::process::id()),
            time: RedisTime::Injected(Arc::new(clock.clone()) as Arc<dyn Clock>),
            ..RedisOptions::default()
        };
        let store = RedisStore::connect(&[rankgate_testkit::redis_servers::standalone_url()], options)
            .await
            .expect("the shared Redis");
        let job = NewJob {
            id: "job".into(),
            payload: b"x".to_vec(),
            delay_ms: 0,
            policy,
        };
        assert!(store.enqueue("work", job).await.unwrap());
        for (failure, unit) in (1..).zip(units) {
            let claimed = store.claim_due("work", 1, 60_000).await.unwrap();
            prop_assert_eq!(claimed.len(), 1, "due again after its backoff");
            prop_assert_eq!(claimed[0].attempt, failure);
            let now = clock.now_millis();
            let outcome = store
                .nack_with_jitter("work", "job", claimed[0].claim_token, "boom", unit, 0)
                .await
                .unwrap();
            if failure >= policy.max_attempts {
                prop_assert_eq!(outcome, NackOutcome::Dead);
                break;
            }
            let expected = now + backoff_delay_ms(&policy, failure, unit) as i64;
            prop_assert_eq!(
                outcome,
                NackOutcome::RetryAt(expected),
                "failure {} unit {}",
                failure,
                unit
            );
            clock.set(expected);
        }
        store.purge_prefix().await.unwrap();
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        /// `job_nack.lua`'s capped exponential backoff with equal jitter is `backoff_delay_ms`, to the
        /// millisecond, for any policy, failure count and jitter unit (including 0, just under 1, and
        /// values outside [0, 1) that both clamp).
        #[test]
        fn the_scripts_backoff_is_cores(
            base in 0u64..20_000,
            max in 0u64..2_000_000,
            max_attempts in 1u32..10,
            units in proptest::collection::vec(
                prop_oneof![0.0f64..1.0, Just(0.0), Just(0.999_999_9), Just(1.5), Just(-0.5)], 10),
            case in any::<u64>(),
        ) {
            let policy = RetryPolicy { base_delay_ms: base, max_delay_ms: max, max_attempts };
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(run(policy, units, case))?;
        }
    }
}
