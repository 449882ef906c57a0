//! Delayed / retry jobs (SPEC Part 3): job states, their transitions, and capped exponential backoff.
//!
//! A job is READY (due at a time) → PROCESSING (claimed by one worker until the claim expires) → done
//! (acked, forgotten), or back to READY after a failure with a backoff delay, or DEAD after its last
//! attempt. Dead jobs wait for an operator's replay. A job whose group ([`job_group`]) is paused is
//! PARKED instead of READY: held, attempts and all, until the group is resumed. A claim carries a claim token, so a worker whose claim
//! expired (and was reaped and given to someone else) cannot ack or nack the job it no longer owns.
//!
//! Store backends keep a ready set scored by due time and a processing set scored by claim expiry, and
//! call these transitions inside their atomic steps.

use serde::{Deserialize, Serialize};

/// How a job is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Delay after the first failure (ms).
    pub base_delay_ms: u64,
    /// The longest delay, however many failures (ms).
    pub max_delay_ms: u64,
    /// Attempts before the job goes to the dead set (≥ 1).
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base_delay_ms: 1_000,
            max_delay_ms: 300_000,
            max_attempts: 8,
        }
    }
}

/// Capped exponential backoff with "equal jitter": after failure number `failures` (1-based) the delay is
/// `d = min(max, base × 2^(failures-1))`, then a uniform value in `[d/2, d)`. Half the delay is kept so a
/// job never retries immediately; the random half spreads a burst of failures apart.
/// `jitter_unit` is a value in `[0, 1)` from the caller's random source.
#[must_use]
pub fn backoff_delay_ms(policy: &RetryPolicy, failures: u32, jitter_unit: f64) -> u64 {
    let exponent = failures.saturating_sub(1).min(62);
    let uncapped = policy.base_delay_ms.saturating_mul(1u64 << exponent);
    let capped = uncapped.min(policy.max_delay_ms);
    let unit = if jitter_unit.is_finite() {
        jitter_unit.clamp(0.0, 0.999_999)
    } else {
        0.0
    };
    let half = capped / 2;
    half + ((capped - half) as f64 * unit) as u64
}

/// The delay after failure number `failures`, as [`backoff_delay_ms`], but not shorter than
/// `min_delay_ms` (what the failed job asked for, e.g. a webhook receiver's `Retry-After`) — a floor that
/// is itself capped at `max_delay_ms`, so no answer can push a retry past the policy's longest delay.
#[must_use]
pub fn retry_delay_ms(policy: &RetryPolicy, failures: u32, jitter_unit: f64, min_delay_ms: u64) -> u64 {
    backoff_delay_ms(policy, failures, jitter_unit).max(min_delay_ms.min(policy.max_delay_ms))
}

/// The group a job belongs to: its id up to the last `:` (`toys-top:42` → `toys-top`); `None` for an
/// id without one. A paused group's jobs are parked (webhooks: one group per webhook, paused on a 410).
#[must_use]
pub fn job_group(id: &str) -> Option<&str> {
    id.rsplit_once(':').map(|(group, _)| group)
}

/// A job's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    /// Waiting to be claimed at or after `due_at_ms`.
    Ready {
        /// When it becomes claimable.
        due_at_ms: i64,
    },
    /// Claimed by one worker.
    Processing {
        /// The claim token the worker must present to ack or nack.
        claim_token: u128,
        /// When the reaper takes it back.
        expires_at_ms: i64,
    },
    /// Out of attempts; waits for a replay.
    Dead {
        /// When it died.
        died_at_ms: i64,
        /// The last failure's reason.
        reason: String,
    },
    /// Held while its group is paused: never claimed; back to READY, due at once and with fresh
    /// attempts, when the group is resumed.
    Parked {
        /// When it was parked.
        parked_at_ms: i64,
    },
}

/// Why a job transition was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum JobTransitionError {
    /// The job is not claimable (not READY, or not yet due).
    #[error("the job is not ready")]
    NotReady,
    /// The claim token is not the current one: the claim expired and was reaped.
    #[error("the claim is stale")]
    StaleClaim,
    /// Only dead jobs can be replayed.
    #[error("the job is not dead")]
    NotDead,
    /// Only parked jobs can be unparked; dead ones are not parked.
    #[error("the job is not parked")]
    NotParked,
}

/// Where a failed attempt leaves a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterFailure {
    /// Retried at this time.
    Retry(JobState),
    /// Out of attempts.
    Dead(JobState),
}

impl AfterFailure {
    /// The state either way.
    #[must_use]
    pub fn into_state(self) -> JobState {
        match self {
            AfterFailure::Retry(state) | AfterFailure::Dead(state) => state,
        }
    }
}

/// A job's state and attempt count, the unit the transitions work on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Current state.
    pub state: JobState,
    /// Attempts started so far (claims).
    pub attempts: u32,
    /// Retry policy.
    pub policy: RetryPolicy,
}

impl JobRecord {
    /// A new job due at `due_at_ms`.
    #[must_use]
    pub fn new(due_at_ms: i64, policy: RetryPolicy) -> Self {
        JobRecord {
            state: JobState::Ready { due_at_ms },
            attempts: 0,
            policy,
        }
    }

    /// Claims a due READY job for `lease_ms`.
    pub fn claim(
        &self,
        claim_token: u128,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<JobRecord, JobTransitionError> {
        match self.state {
            JobState::Ready { due_at_ms } if due_at_ms <= now_ms => Ok(JobRecord {
                state: JobState::Processing {
                    claim_token,
                    expires_at_ms: now_ms + lease_ms,
                },
                attempts: self.attempts + 1,
                policy: self.policy,
            }),
            _ => Err(JobTransitionError::NotReady),
        }
    }

    fn check_claim(&self, claim_token: u128) -> Result<(), JobTransitionError> {
        match self.state {
            JobState::Processing {
                claim_token: current, ..
            } if current == claim_token => Ok(()),
            _ => Err(JobTransitionError::StaleClaim),
        }
    }

    /// The worker finished: the job is done (the store forgets it).
    pub fn ack(&self, claim_token: u128) -> Result<(), JobTransitionError> {
        self.check_claim(claim_token)
    }

    /// The worker failed: retry with backoff (not sooner than `min_delay_ms`, see [`retry_delay_ms`]),
    /// or dead after the last attempt.
    pub fn nack(
        &self,
        claim_token: u128,
        now_ms: i64,
        jitter_unit: f64,
        min_delay_ms: u64,
        reason: &str,
    ) -> Result<(JobRecord, bool), JobTransitionError> {
        self.check_claim(claim_token)?;
        let after = self.after_failure(now_ms, jitter_unit, min_delay_ms, reason);
        let dead = matches!(after, AfterFailure::Dead(_));
        Ok((
            JobRecord {
                state: after.into_state(),
                ..self.clone()
            },
            dead,
        ))
    }

    /// The reaper found the claim expired: counts as a failed attempt.
    #[must_use]
    pub fn reap(&self, now_ms: i64, jitter_unit: f64) -> Option<(JobRecord, bool)> {
        match self.state {
            JobState::Processing { expires_at_ms, .. } if expires_at_ms <= now_ms => {
                let after = self.after_failure(now_ms, jitter_unit, 0, "claim expired");
                let dead = matches!(after, AfterFailure::Dead(_));
                Some((
                    JobRecord {
                        state: after.into_state(),
                        ..self.clone()
                    },
                    dead,
                ))
            }
            _ => None,
        }
    }

    fn after_failure(&self, now_ms: i64, jitter_unit: f64, min_delay_ms: u64, reason: &str) -> AfterFailure {
        if self.attempts >= self.policy.max_attempts {
            return AfterFailure::Dead(JobState::Dead {
                died_at_ms: now_ms,
                reason: reason.to_string(),
            });
        }
        let delay = retry_delay_ms(&self.policy, self.attempts, jitter_unit, min_delay_ms) as i64;
        AfterFailure::Retry(JobState::Ready {
            due_at_ms: now_ms + delay,
        })
    }

    /// An operator replays a dead job: due now, with a fresh set of attempts.
    pub fn replay(&self, now_ms: i64) -> Result<JobRecord, JobTransitionError> {
        match self.state {
            JobState::Dead { .. } => Ok(JobRecord {
                state: JobState::Ready { due_at_ms: now_ms },
                attempts: 0,
                policy: self.policy,
            }),
            _ => Err(JobTransitionError::NotDead),
        }
    }

    /// Its group was paused: a READY job, or one whose claim expired, is parked as it is. Parking does
    /// not count an attempt, and a job out of attempts is parked rather than dead, because the pause
    /// (a receiver's `410 Gone`) says nothing about whether the next attempt would work.
    pub fn park(&self, now_ms: i64) -> Result<JobRecord, JobTransitionError> {
        match self.state {
            JobState::Ready { .. } => Ok(self.parked(now_ms)),
            JobState::Processing { expires_at_ms, .. } if expires_at_ms <= now_ms => Ok(self.parked(now_ms)),
            _ => Err(JobTransitionError::NotReady),
        }
    }

    /// The worker failed while its job's group is paused (or the failure paused it): parked, not
    /// retried, whatever attempts are left.
    pub fn park_claimed(&self, claim_token: u128, now_ms: i64) -> Result<JobRecord, JobTransitionError> {
        self.check_claim(claim_token)?;
        Ok(self.parked(now_ms))
    }

    fn parked(&self, now_ms: i64) -> JobRecord {
        JobRecord {
            state: JobState::Parked { parked_at_ms: now_ms },
            ..self.clone()
        }
    }

    /// Its group was resumed: due now, with a fresh set of attempts (as a replay).
    pub fn unpark(&self, now_ms: i64) -> Result<JobRecord, JobTransitionError> {
        match self.state {
            JobState::Parked { .. } => Ok(JobRecord {
                state: JobState::Ready { due_at_ms: now_ms },
                attempts: 0,
                policy: self.policy,
            }),
            _ => Err(JobTransitionError::NotParked),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn backoff_doubles_then_caps() {
        let policy = RetryPolicy {
            base_delay_ms: 100,
            max_delay_ms: 1_000,
            max_attempts: 5,
        };
        assert_eq!(backoff_delay_ms(&policy, 1, 0.0), 50);
        assert_eq!(backoff_delay_ms(&policy, 2, 0.0), 100);
        assert_eq!(backoff_delay_ms(&policy, 3, 0.999_999), 399);
        assert_eq!(backoff_delay_ms(&policy, 30, 0.0), 500);
        assert_eq!(backoff_delay_ms(&policy, u32::MAX, 0.5), 750);
    }

    #[test]
    fn a_stale_worker_cannot_ack_and_attempts_end_in_the_dead_set() {
        let policy = RetryPolicy {
            base_delay_ms: 10,
            max_delay_ms: 100,
            max_attempts: 2,
        };
        let job = JobRecord::new(0, policy);
        let first = job.claim(1, 0, 50).unwrap();
        let (reaped, dead) = first.reap(50, 0.0).unwrap();
        assert!(!dead);
        assert_eq!(reaped.state, JobState::Ready { due_at_ms: 55 });
        assert_eq!(first.ack(1), Ok(()));
        assert_eq!(reaped.ack(1), Err(JobTransitionError::StaleClaim));
        assert_eq!(reaped.claim(2, 54, 50), Err(JobTransitionError::NotReady));
        let second = reaped.claim(2, 55, 50).unwrap();
        let (dead_job, dead) = second.nack(2, 60, 0.0, 0, "boom").unwrap();
        assert!(dead);
        assert!(matches!(dead_job.state, JobState::Dead { .. }));
        let replayed = dead_job.replay(70).unwrap();
        assert_eq!(replayed.state, JobState::Ready { due_at_ms: 70 });
        assert_eq!(replayed.attempts, 0);
    }

    #[test]
    fn a_minimum_delay_is_a_floor_capped_at_the_longest_delay() {
        let policy = RetryPolicy {
            base_delay_ms: 100,
            max_delay_ms: 1_000,
            max_attempts: 5,
        };
        assert_eq!(retry_delay_ms(&policy, 1, 0.0, 0), 50, "no floor: the backoff");
        assert_eq!(
            retry_delay_ms(&policy, 1, 0.0, 700),
            700,
            "a floor above the backoff"
        );
        assert_eq!(retry_delay_ms(&policy, 4, 0.999_999, 10), 799, "a floor below it");
        assert_eq!(retry_delay_ms(&policy, 1, 0.0, u64::MAX), 1_000, "capped");
        let job = JobRecord::new(0, policy).claim(9, 0, 50).unwrap();
        let (next, dead) = job.nack(9, 10, 0.0, 600, "busy").unwrap();
        assert!(!dead);
        assert_eq!(next.state, JobState::Ready { due_at_ms: 610 });
    }

    #[test]
    fn parked_jobs_wait_whatever_their_attempts_and_come_back_with_fresh_ones() {
        assert_eq!(job_group("toys-top:42"), Some("toys-top"));
        assert_eq!(job_group("a:b:3"), Some("a:b"));
        assert_eq!(job_group("plain"), None);
        let policy = RetryPolicy {
            base_delay_ms: 10,
            max_delay_ms: 100,
            max_attempts: 1,
        };
        let claimed = JobRecord::new(0, policy).claim(7, 0, 50).unwrap();
        assert_eq!(claimed.park_claimed(8, 5), Err(JobTransitionError::StaleClaim));
        assert_eq!(
            claimed.park(5),
            Err(JobTransitionError::NotReady),
            "a live claim is not parked"
        );
        let parked = claimed.park_claimed(7, 5).unwrap();
        assert_eq!(parked.state, JobState::Parked { parked_at_ms: 5 });
        assert_eq!(parked.attempts, 1, "out of attempts, yet parked rather than dead");
        assert_eq!(parked.claim(1, 1_000, 50), Err(JobTransitionError::NotReady));
        let resumed = parked.unpark(2_000).unwrap();
        assert_eq!(resumed.state, JobState::Ready { due_at_ms: 2_000 });
        assert_eq!(resumed.attempts, 0);
        assert_eq!(resumed.unpark(2_001), Err(JobTransitionError::NotParked));
        let reaped = claimed.park(50).unwrap();
        assert!(
            matches!(reaped.state, JobState::Parked { .. }),
            "an expired claim is parked"
        );
    }

    proptest! {
        #[test]
        fn backoff_stays_within_half_and_full_capped_delay(base in 1u64..10_000, cap in 1u64..1_000_000, failures in 1u32..100, unit in 0.0f64..1.0) {
            let policy = RetryPolicy { base_delay_ms: base, max_delay_ms: cap, max_attempts: 3 };
            let full = base.saturating_mul(1u64 << (failures - 1).min(62)).min(cap);
            let delay = backoff_delay_ms(&policy, failures, unit);
            prop_assert!(delay >= full / 2 && delay <= full);
        }
    }
}
