//! [`QueueStore`]: the waiting room's state, one atomic operation per method.
//!
//! A member's state is one of `rankgate_core::queue::MemberState`; the store keeps waiting members in a
//! sorted set scored by a store-side sequence (strict FIFO, limitation 6), and READY/CLAIMED/CONSUMED
//! members in per-member records with their deadlines in a second sorted set, so expiry is a range pop.

use async_trait::async_trait;
use rankgate_core::ids::MemberId;
use rankgate_core::limiter::{RateDecision, RateLimit};
use rankgate_core::queue::{
    polling_tier_seconds, ClaimRejection, ConsumeRejection, Digest, LeaveRejection, MemberStatus, QueueName,
    QueueSettings, ReleaseRejection, ReleasedTo, SettingsError, SettingsPatch,
};

use super::draw::DrawStore;
use super::limiter::{RateLimiter, RateLimiterKind};
use super::report::ReportStore;
use super::token::PreparedToken;
use super::StoreError;

/// A token the caller prepared for one admission (see [`super::token`]).
pub type TokenCandidate = PreparedToken;

/// What a member sees when it polls: the store's half of SPEC 2.2's position.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberView {
    /// The reported status.
    pub status: MemberStatus,
    /// 0-based rank while WAITING.
    pub rank: Option<u64>,
    /// Members waiting in the queue.
    pub waiting_count: u64,
    /// The token's nonce and expiry while READY or CLAIMED (the caller derives the token).
    pub token: Option<([u8; 16], i64)>,
    /// Set while a consumed member is remembered.
    pub last_outcome: Option<LastOutcome>,
    /// Seconds until admission from measured throughput, while WAITING (`None` if paused).
    pub estimated_wait_seconds: Option<u64>,
    /// The wait admitted within nine times in ten, while WAITING (`None` if paused); ≥ the median.
    pub estimated_wait_p90_seconds: Option<u64>,
    /// The store's time when this was read (ms).
    pub now_ms: i64,
    /// Where the member stands in the queue's history, for its ticket: set by entries only
    /// ([`QueueStore::enter`], [`QueueStore::restore`]), `None` on every other read.
    pub placement: Option<Placement>,
}

/// A member's place in its queue's history (SPEC 2.2, "Places that survive the store"), written into its
/// ticket so that the member can claim the place back after the store lost the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The queue's epoch: it changes when the store lost the queue (or the queue was deleted and made
    /// again), so a ticket of another epoch tells the entry that the place it names was lost.
    pub epoch: u64,
    /// The member's arrival key while it waits (its score in the waiting set: arrival sequence, below
    /// zero for a restored place), or [`Placement::ADMITTED`] while it holds a token.
    pub place: i64,
}

impl Placement {
    /// The place of a member holding a token: it was at the front, and comes back there.
    pub const ADMITTED: i64 = i64::MIN;
    /// How far below the fresh arrivals of a new epoch a restored place goes: arrival sequences stay
    /// below 2^41, so every restored member waits ahead of every fresh one, and restored members keep
    /// their order among themselves. Scores stay integers well inside a double's 53 exact bits.
    pub const RESTORED_OFFSET: i64 = 1 << 41;

    /// The waiting-set score a member restored from this place gets in a later epoch: below every fresh
    /// arrival, in the original order; a member who had been admitted goes ahead of all of them.
    #[must_use]
    pub fn restored_score(self) -> i64 {
        if self.place == Placement::ADMITTED {
            -4 * Placement::RESTORED_OFFSET
        } else {
            self.place
                .clamp(-2 * Placement::RESTORED_OFFSET, Placement::RESTORED_OFFSET - 1)
                - Placement::RESTORED_OFFSET
        }
    }
}

/// A remembered final outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastOutcome {
    /// The member's token bought an order.
    Consumed,
}

/// Result of [`QueueStore::enter`].
#[derive(Debug, Clone, PartialEq)]
pub enum EnterOutcome {
    /// Newly queued at the back.
    Entered(MemberView),
    /// Already WAITING, READY or CLAIMED; nothing changed.
    AlreadyPresent(MemberView),
}

impl EnterOutcome {
    /// The position either way.
    #[must_use]
    pub fn view(&self) -> &MemberView {
        match self {
            EnterOutcome::Entered(view) | EnterOutcome::AlreadyPresent(view) => view,
        }
    }
}

/// Result of [`QueueStore::leave`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaveOutcome {
    /// Removed; it was in this status.
    Left(MemberStatus),
    /// Was not in the queue.
    NotPresent,
    /// Refused.
    Rejected(LeaveRejection),
}

/// Result of [`QueueStore::admit`], one admission step.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AdmitOutcome {
    /// Members popped and given tokens.
    pub admitted: Vec<MemberId>,
    /// How long each of `admitted` waited (ms, the step's time minus its arrival, from the queue's
    /// arrival checkpoints), in the same order; `None` for a member with no arrival time (a place
    /// restored from a ticket, or one a draw moved ahead).
    pub waits_ms: Vec<Option<u64>>,
    /// Waiting members dropped as abandoned in this step.
    pub abandoned: u64,
    /// Unused tokens that expired in this step (slots freed).
    pub tokens_expired: u64,
    /// Claims released automatically in this step.
    pub claims_expired: u64,
    /// Members still waiting after the step.
    pub waiting: u64,
    /// READY + CLAIMED after the step.
    pub outstanding: u64,
    /// The queue's earliest deadline after the step (store clock, ms): a token or claim expiry, a consumed
    /// member to forget, a waiting member's abandonment; `None` when it has none. A scheduler need not
    /// visit a queue nobody waits in before then.
    pub next_deadline_ms: Option<i64>,
}

/// Result of [`QueueStore::expire_due`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExpiryOutcome {
    /// Unused tokens expired (slots freed).
    pub tokens_expired: u64,
    /// Claims released automatically (back to READY, or freed if the token expired too).
    pub claims_expired: u64,
    /// Waiting members dropped as abandoned (unseen for `abandon_after_seconds`).
    pub abandoned: u64,
    /// The step stopped at its bound with more deadlines due: call again (defect 17, bounded steps).
    pub more_due: bool,
    /// The queue's earliest deadline left (store clock, ms; `None` when it has none), as
    /// [`AdmitOutcome::next_deadline_ms`].
    pub next_deadline_ms: Option<i64>,
}

/// Result of [`QueueStore::claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Claimed until `expires_at_ms`.
    Claimed {
        /// When the claim is released automatically (store clock, ms).
        expires_at_ms: i64,
    },
    /// Refused (maps to 401 or 409).
    Rejected(ClaimRejection),
}

/// Result of [`QueueStore::consume`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumeOutcome {
    /// The token is now consumed.
    Consumed,
    /// It already was, by this claim (idempotent repeat).
    AlreadyConsumed,
    /// Refused.
    Rejected(ConsumeRejection),
}

/// Result of [`QueueStore::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// Released.
    Released(ReleasedTo),
    /// Refused.
    Rejected(ReleaseRejection),
}

/// A queue's live counters (SPEC 2.1 `GET /v1/admin/queues/{queue}`).
#[derive(Debug, Clone, PartialEq)]
pub struct QueueStats {
    /// Current settings.
    pub settings: QueueSettings,
    /// Members waiting.
    pub waiting: u64,
    /// Members holding an unclaimed token.
    pub ready: u64,
    /// Members with an order in flight.
    pub claimed: u64,
    /// Members admitted in the last 60 s.
    pub admitted_last_minute: u64,
    /// How long the head of the line has waited, in whole seconds (0 when nobody waits).
    pub oldest_wait_seconds: u64,
    /// The measured throughput behind estimates (members/s), if any.
    pub measured_rate: Option<f64>,
    /// Waiting members dropped as abandoned (unseen for `abandon_after_seconds`) since the queue was made.
    pub abandoned: u64,
    /// The queue's epoch ([`Placement::epoch`]).
    pub epoch: u64,
}

/// What an admission step needs to know beforehand, to prepare no more tokens than it can use (defect 5:
/// a tick used to prepare `admit_per_second × tick` tokens whether or not anybody waited).
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionPreview {
    /// Current settings.
    pub settings: QueueSettings,
    /// Members waiting.
    pub waiting: u64,
    /// READY + CLAIMED.
    pub outstanding: u64,
}

impl AdmissionPreview {
    /// Tokens worth preparing for the next step: `min(per tick, waiting, room under max_active)`, or 0
    /// while paused. The store may still use fewer (the global budget decides).
    #[must_use]
    pub fn tokens_needed(&self) -> u64 {
        if self.settings.paused {
            return 0;
        }
        let per_tick = self
            .settings
            .members_per_tick()
            .min(QueueSettings::MAX_MEMBERS_PER_TICK);
        let room = self
            .settings
            .max_active
            .map_or(u64::MAX, |cap| cap.saturating_sub(self.outstanding));
        per_tick.min(self.waiting).min(room)
    }
}

/// The per-member poll limit's window (seconds) at `rank`: `burst` polls per `burst` polling intervals,
/// the interval being the tier of the rank just read (on average one poll per interval, as the member
/// was told). `poll.lua` states the same tiers.
#[must_use]
pub fn poll_window_seconds(rank: Option<u64>, burst: u32) -> u64 {
    polling_tier_seconds(rank) * u64::from(burst.max(1))
}

/// The limiter key of a member's poll limit (the default [`QueueStore::poll`]). Built by hand: `format!`
/// was ~2,100 of a poll's ~15,200 instructions (callgrind, `WHAT=position bench/queue_callgrind.sh`).
#[must_use]
pub fn poll_limit_key(queue: &QueueName, member: &MemberId) -> String {
    let (queue, member) = (queue.as_str(), member.as_str());
    let mut key = String::with_capacity("poll:".len() + queue.len() + 1 + member.len());
    key.push_str("poll:");
    key.push_str(queue);
    key.push(':');
    key.push_str(member);
    key
}

/// The poll limit's decision for a member whose position was just read as `view`: the second step of
/// the default [`QueueStore::poll`] (and of a store's own, when its position read is cheaper inline).
pub(crate) async fn poll_limit_decision(
    queue: &QueueName,
    member: &MemberId,
    burst: u32,
    view: &MemberView,
    limiter: &dyn RateLimiter,
) -> Result<RateDecision, StoreError> {
    let limit = RateLimit {
        limit: burst.max(1),
        window_ms: poll_window_seconds(view.rank, burst) as i64 * 1000,
    };
    limiter
        .try_acquire(&poll_limit_key(queue, member), limit, RateLimiterKind::SlidingLog)
        .await
}

/// How a store coalesced concurrent hot-path calls so far: calls made against requests answered, for
/// entries and for polls ([`QueueStore::coalescing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coalescing {
    /// Entry calls made (on Redis, `enter_fast.lua` calls).
    pub entry_calls: u64,
    /// Entries they answered.
    pub entries: u64,
    /// Poll calls made (on Redis, `poll.lua` calls).
    pub poll_calls: u64,
    /// Polls they answered.
    pub polls: u64,
}

/// The waiting room's storage. Every method is one atomic step on the store and uses the store's clock.
///
/// # Queue lifecycle (defect 4)
/// A queue exists from its first entry (up to the store's `max_queues`; a first entry beyond that fails
/// with [`StoreError::TooManyQueues`]) or an admin PUT. Only **active** queues ([`QueueStore::active_queues`]:
/// somebody waiting) need the admission scheduler every tick; a queue nobody waits in costs nothing per
/// tick, READY and CLAIMED members included: their expiries are deadlines, answered by
/// [`QueueStore::admit`] and [`QueueStore::expire_due`] (`next_deadline_ms`), and a scheduler visits the
/// queue when the earliest is due.
/// Auto-created queues that stay idle are forgotten ([`QueueStore::forget_if_idle`]); admins delete any
/// queue ([`QueueStore::delete_queue`]).
#[async_trait]
pub trait QueueStore: Send + Sync + 'static {
    /// Enters `member` (creating the queue with default settings if needed) and returns its position.
    /// Atomic and idempotent: concurrent first entries produce one position; READY/CLAIMED stay so.
    async fn enter(&self, queue: &QueueName, member: &MemberId) -> Result<EnterOutcome, StoreError>;

    /// The member's current position. Unknown queues answer NOT_ENTERED.
    async fn position(&self, queue: &QueueName, member: &MemberId) -> Result<MemberView, StoreError>;

    /// A member's poll: their position and one decision of the per-member poll limit, a sliding log of
    /// `burst` polls per [`poll_window_seconds`]; a refused poll is not recorded. This default takes two
    /// steps, [`QueueStore::position`] then `limiter`; a store that can answer both in one (Redis: one
    /// `poll.lua` call on the queue's slot, shared by concurrent polls) overrides it, with the same
    /// answers (`tests/queue_equivalence.rs`).
    async fn poll(
        &self,
        queue: &QueueName,
        member: &MemberId,
        burst: u32,
        limiter: &dyn RateLimiter,
    ) -> Result<(MemberView, RateDecision), StoreError> {
        let view = self.position(queue, member).await?;
        let decision = poll_limit_decision(queue, member, burst, &view, limiter).await?;
        Ok((view, decision))
    }

    /// An entry by a member whose ticket names `claimed`, a place of an earlier epoch (SPEC 2.2, "Places
    /// that survive the store"). When the store lost that epoch's queue (not when an admin deleted it or it
    /// was forgotten idle: those epochs are retired), the member is put back at
    /// [`Placement::restored_score`], ahead of every fresh arrival, once per member and lost epoch; a
    /// member waiting as a fresh arrival of the new epoch moves up there. Otherwise (same epoch, a retired
    /// one, already restored, or holding a token) it is [`QueueStore::enter`]. The default is `enter`: a
    /// store that never loses a queue (the embedded one) has no lost epoch, only retired ones.
    async fn restore(
        &self,
        queue: &QueueName,
        member: &MemberId,
        claimed: Placement,
    ) -> Result<EnterOutcome, StoreError> {
        let _ = claimed;
        self.enter(queue, member).await
    }

    /// Leaves the queue, or gives back an unclaimed token.
    async fn leave(&self, queue: &QueueName, member: &MemberId) -> Result<LeaveOutcome, StoreError>;

    /// One admission step: expire what is due, refill the global budget, pop up to what it allows (and
    /// `max_active` leaves room for, and `tokens.len()`), and give each popped member one of `tokens`, all
    /// atomically. Unused tokens are discarded.
    async fn admit(&self, queue: &QueueName, tokens: Vec<TokenCandidate>)
        -> Result<AdmitOutcome, StoreError>;

    /// Expires due tokens and claims without admitting.
    async fn expire_due(&self, queue: &QueueName) -> Result<ExpiryOutcome, StoreError>;

    /// Claims the member's token (presented as its digest) under a new claim id (as its digest).
    async fn claim(
        &self,
        queue: &QueueName,
        member: &MemberId,
        token: &Digest,
        claim: &Digest,
    ) -> Result<ClaimOutcome, StoreError>;

    /// The order committed: consume the claimed token. Idempotent.
    async fn consume(
        &self,
        queue: &QueueName,
        member: &MemberId,
        claim: &Digest,
    ) -> Result<ConsumeOutcome, StoreError>;

    /// The order failed: release the claim, back to READY if the token is still valid. Idempotent.
    async fn release(
        &self,
        queue: &QueueName,
        member: &MemberId,
        claim: &Digest,
    ) -> Result<ReleaseOutcome, StoreError>;

    /// The queue's settings; `None` for a queue that does not exist yet.
    async fn settings(&self, queue: &QueueName) -> Result<Option<QueueSettings>, StoreError>;

    /// Applies a partial update (creating the queue if needed); the inner `Err` is a validation failure and
    /// changes nothing.
    async fn update_settings(
        &self,
        queue: &QueueName,
        patch: &SettingsPatch,
    ) -> Result<Result<QueueSettings, SettingsError>, StoreError>;

    /// Live counters; `None` for a queue that does not exist.
    async fn stats(&self, queue: &QueueName) -> Result<Option<QueueStats>, StoreError>;

    /// Every queue that exists.
    async fn queues(&self) -> Result<Vec<QueueName>, StoreError>;

    /// The queues admission must visit: members waiting. One call, whatever the number of queues. May list
    /// a queue that just went idle (a visit is harmless); never misses one that has had somebody waiting
    /// for longer than a scheduler round. Queues holding only READY / CLAIMED members are not listed: their
    /// expiries are deadlines (`next_deadline_ms` of [`QueueStore::admit`] and [`QueueStore::expire_due`]).
    async fn active_queues(&self) -> Result<Vec<QueueName>, StoreError>;

    /// Settings and counts that size the next admission step; `None` for a queue that does not exist.
    async fn admission_preview(&self, queue: &QueueName) -> Result<Option<AdmissionPreview>, StoreError>;

    /// Deletes the queue with everyone in it (members, tokens, claims, settings). `false` if it did not exist.
    async fn delete_queue(&self, queue: &QueueName) -> Result<bool, StoreError>;

    /// Forgets `queue` if it was created by an entry (never configured by an admin PUT), nobody is in it
    /// (waiting, READY, CLAIMED, or a remembered consumed member) and nothing happened in it for `idle_ms`.
    /// Returns whether it was forgotten.
    async fn forget_if_idle(&self, queue: &QueueName, idle_ms: i64) -> Result<bool, StoreError>;

    /// Brings the settings this instance keeps of every queue up to date (see
    /// [`crate::queue::kept_settings`]): a store that can lose queues (Redis) reads every queue's settings
    /// and epoch; the default, for a store that never loses one, does nothing. Called every few seconds.
    async fn keep_settings(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Checks the store can be reached.
    async fn ping(&self) -> Result<(), StoreError>;

    /// The same store's scheduled openings and pre-queue draws ([`DrawStore`]). Every backend keeps a
    /// queue's pre-queue beside its waiting members (a draw step rescores them atomically with the
    /// queue's other state), so a queue store always has one, and one handle reaches both.
    fn draws(&self) -> &dyn DrawStore;

    /// How concurrent hot-path calls were coalesced so far (telemetry, benchmarks); `None` for a store
    /// that answers each call on its own.
    fn coalescing(&self) -> Option<Coalescing> {
        None
    }

    /// The same store's sale reports ([`ReportStore`]); `None` for a store that keeps none (every
    /// shipped backend does).
    fn reports(&self) -> Option<&dyn ReportStore> {
        None
    }
}
