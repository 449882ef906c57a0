//! The waiting room's pure rules (SPEC Part 2): queue names, settings, member states, the admission budget,
//! polling intervals and wait estimates.
//!
//! Nothing here reads a clock or touches storage. The embedded store runs these functions inside its
//! atomic steps; the Redis store re-states them in Lua, one script per step, and the backend-equivalence
//! property test (`crates/store/tests/queue_equivalence.rs`) proves the two answer alike. The property
//! tests in [`member`] cover the rules themselves.
//!
//! # Layout
//! - [`name`]: [`QueueName`], the parsed name of a queue.
//! - [`settings`]: [`QueueSettings`], the partial update [`SettingsPatch`] and their validation (SPEC 2.1).
//! - [`member`]: [`MemberState`] and its transitions: enter, admit, claim, consume, release, expire, leave.
//! - [`admission`]: [`AdmissionBudget`], the global per-queue budget that makes `admit_per_second` hold
//!   across instances (limitation 3).
//! - [`polling`]: the polling-interval rule with jitter (SPEC 2.2).
//! - [`estimate`]: [`ThroughputEstimator`], wait estimates from measured throughput (limitation 5).
//! - [`adaptive`]: [`AdmissionMode`], upstream samples and the AIMD controller of adaptive admission
//!   (issue 12).
//! - [`challenge`]: entry challenges' settings and the proof-of-work rule.
//! - [`draw`]: the verifiable pre-queue draw of a scheduled opening (`opensAt`): commitment, HMAC order.
//! - [`refusal`]: [`RefusalReason`], why an entry was refused before it made a member.
//! - [`report`]: the sale report's wait buckets and percentiles (SPEC 2.5).

pub mod adaptive;
pub mod admission;
pub mod challenge;
pub mod draw;
pub mod estimate;
pub mod member;
pub mod name;
pub mod polling;
pub mod refusal;
pub mod report;
pub mod settings;

pub use adaptive::{AdaptiveSettings, AdmissionMode, UpstreamOutcome, UpstreamSamples};
pub use admission::{AdmissionBudget, AdmissionPlan};
pub use challenge::{EntryChallenge, EntryChallengeSettings};
pub use draw::{DrawPhase, DrawSeed};
pub use estimate::ThroughputEstimator;
pub use member::{
    Claim, ClaimRejection, ConsumeRejection, Digest, IssuedToken, LeaveRejection, MemberState, MemberStatus,
    ReleaseRejection, ReleasedTo,
};
pub use name::{QueueName, QueueNameError};
pub use polling::{polling_interval_seconds, polling_tier_seconds};
pub use refusal::RefusalReason;
pub use settings::{FailMode, QueueSettings, SettingsError, SettingsPatch};
