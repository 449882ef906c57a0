//! Waiting-room storage (SPEC Part 2) and the two toolkit pieces it runs on (SPEC Part 3): the traits, the
//! embedded backend, and the conformance suite every backend must pass.
//!
//! # Design rules every backend follows
//! - **One operation, one atomic step.** Each trait method is atomic on the store: on Redis a Lua script
//!   touching one hash-tagged slot (`{rg:q:<queue>}`), in the embedded store one critical section plus one
//!   SQLite transaction. An entry may take two scripts (`enter_fast.lua` declines, untouched, what only
//!   the full `enter.lua` can do: a queue's first entry, a token holder), but no step is a read in one
//!   call and a write in another, which is what broke the seed's entry (ZSCORE then ZADD) and admission
//!   (ZPOPMIN then SET).
//! - **The store's clock.** Time comes from the store (Redis `TIME`; the embedded store's [`Clock`]) through
//!   a monotonic guard, never from the calling instance, so several instances agree on expiry and order.
//! - **Outcome enums, not booleans.** Callers map outcomes to HTTP statuses without guessing.
//! - **Pure rules from `rankgate-core`.** State transitions, the admission budget, the estimator, backoff and
//!   limiter maths are `rankgate-core`'s functions in the embedded store; the Redis store re-states them in
//!   Lua (one atomic script per step), and `tests/queue_equivalence.rs` runs random operation sequences on
//!   both, embedded against Redis standalone and Cluster, comparing every answer.
//!
//! # Layout
//! - [`waiting`]: [`QueueStore`]: entries, the server-side sequence, tokens, claims, the admission budget.
//! - [`draw`]: [`DrawStore`]: scheduled openings, the pre-queue draw's records and steps (reached through
//!   [`QueueStore::draws`]), and its one driver, [`draw::run_draw`].
//! - [`jobs`]: [`JobStore`]: delayed/retry jobs with claims, a reaper, backoff and a dead set.
//! - [`limiter`]: [`RateLimiter`]: sliding log and sliding-window counter.
//! - [`report`]: [`ReportStore`], the sale's report: counts per queue and minute, summed across
//!   instances, kept until the queue is deleted (SPEC 2.5).
//! - [`token`]: how entry tokens and claim ids are made and hashed.
//! - [`upstream`]: [`UpstreamObservationStore`], gate measurements summed across instances per control
//!   interval, for adaptive admission (issue 12).
//! - [`embedded`]: the in-process backend (sorted sets from `rankgate-zset`, SQLite group commit).
//! - [`redis`]: the Redis backend, standalone or Cluster (one Lua script per step, one slot per queue).
//! - `conformance` and `draw_conformance`: the shared test suites, run against every backend (test code,
//!   behind the `testsuite` feature).
//!
//! [`Clock`]: crate::clock::Clock

#[cfg(any(test, feature = "testsuite"))]
pub mod conformance;
pub mod draw;
#[cfg(any(test, feature = "testsuite"))]
pub mod draw_conformance;
pub mod embedded;
pub mod jobs;
pub mod kept_settings;
pub mod limiter;
pub mod redis;
pub mod report;
pub mod token;
pub mod upstream;
pub mod waiting;

pub use draw::DrawStore;
pub use jobs::{ClaimedJob, DeadJob, JobCounts, JobStore, NackOutcome, NewJob, PausedGroup};
pub use limiter::{RateLimiter, RateLimiterKind};
pub use report::{ReportStore, StoredReport};
pub use upstream::{InMemoryUpstreamObservations, UpstreamObservationStore};
pub use waiting::{
    poll_limit_key, poll_window_seconds, AdmissionPreview, AdmitOutcome, ClaimOutcome, Coalescing,
    ConsumeOutcome, EnterOutcome, ExpiryOutcome, LastOutcome, LeaveOutcome, MemberView, Placement,
    QueueStats, QueueStore, ReleaseOutcome, TokenCandidate,
};

/// Why a store operation failed. Business outcomes (wrong token, already claimed…) are not errors; they are
/// the `Ok` outcome enums. These are the failures the gate turns into 503 (fail-closed).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached or cannot persist right now.
    #[error("queue store unavailable: {0}")]
    Unavailable(String),
    /// Stored data is not what this version expects.
    #[error("queue store data is corrupt: {0}")]
    Corrupt(String),
    /// A first entry would create a queue beyond the store's `max_queues` (defect 4). Not a failure of
    /// the store: the HTTP layer answers 429 naming the limit.
    #[error("max_queues: {max_queues} queues exist already")]
    TooManyQueues {
        /// The configured limit.
        max_queues: usize,
    },
}

/// The default of `max_queues` (SPEC 2.1).
pub const DEFAULT_MAX_QUEUES: usize = 1_000;
