//! [`QueueStore`] on Redis: each method is one script from `lua/` over the queue's six hash-tagged keys.
//!
//! The scripts apply the same transitions as `rankgate_core::queue::MemberState` and the same budget and
//! estimator arithmetic as `AdmissionBudget` / `ThroughputEstimator`; what they return is turned back into
//! the store's outcome types here. Read-side derivations (the wait estimate, admissions in the last minute,
//! the measured rate) are computed in Rust by the core functions themselves from the raw values the script
//! read atomically, so they cannot drift from the embedded backend.

use async_trait::async_trait;
use futures_util::future::BoxFuture;
use rankgate_core::ids::MemberId;
use rankgate_core::limiter::RateDecision;
use rankgate_core::queue::{
    polling_tier_seconds, AdaptiveSettings, ClaimRejection, ConsumeRejection, Digest, EntryChallengeSettings,
    FailMode, LeaveRejection, MemberStatus, QueueName, QueueSettings, ReleaseRejection, ReleasedTo,
    SettingsError, SettingsPatch, ThroughputEstimator,
};

use super::{settings_args, unhex, RedisStore, Reply};
use crate::queue::draw::DrawStore;
use crate::queue::kept_settings::Observed;
use crate::queue::limiter::RateLimiter;
use crate::queue::waiting::{
    poll_window_seconds, AdmissionPreview, AdmitOutcome, ClaimOutcome, Coalescing, ConsumeOutcome,
    EnterOutcome, ExpiryOutcome, LastOutcome, LeaveOutcome, MemberView, Placement, QueueStats, QueueStore,
    ReleaseOutcome, TokenCandidate,
};
use crate::queue::StoreError;

/// How often the kept-settings sweep reads every queue even when the settings version did not move: the
/// bound on how long a change whose version bump was lost (its writer died between its write and the
/// bump) stays unseen. A full read costs one call per queue, so it is rare.
const KEPT_FULL_SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(300);

fn status_of(code: i64) -> Result<MemberStatus, StoreError> {
    Ok(match code {
        0 => MemberStatus::NotEntered,
        1 => MemberStatus::Waiting,
        2 => MemberStatus::Ready,
        3 => MemberStatus::Claimed,
        other => return Err(StoreError::Corrupt(format!("unknown member status {other}"))),
    })
}

/// Reads the nine stored setting fields.
fn read_settings(reply: &mut Reply) -> Result<QueueSettings, StoreError> {
    let corrupt = |field: &str| StoreError::Corrupt(format!("queue setting {field} is unreadable"));
    let admit_per_second: f64 = reply.string()?.parse().map_err(|_| corrupt("aps"))?;
    let _rate_milli = reply.string()?;
    let tick_millis = reply.string()?.parse().map_err(|_| corrupt("tick"))?;
    let token_ttl_seconds = reply.string()?.parse().map_err(|_| corrupt("token_ttl"))?;
    let claim_ttl_seconds = reply.string()?.parse().map_err(|_| corrupt("claim_ttl"))?;
    let max_active = match reply.string()?.as_str() {
        "" => None,
        raw => Some(raw.parse().map_err(|_| corrupt("max_active"))?),
    };
    let paused = reply.string()? == "1";
    let fail_mode = match reply.string()?.as_str() {
        "open" => FailMode::Open,
        _ => FailMode::Closed,
    };
    // Empty only in a direct read of a queue stored before the setting existed and not ticked since (a
    // script's `settings()` writes the default): the default then.
    let abandon_after_seconds = match reply.string()?.as_str() {
        "" => QueueSettings::default().abandon_after_seconds,
        raw => raw.parse().map_err(|_| corrupt("abandon"))?,
    };
    Ok(QueueSettings {
        abandon_after_seconds,
        admit_per_second,
        tick_millis,
        token_ttl_seconds,
        claim_ttl_seconds,
        max_active,
        paused,
        fail_mode,
        // Kept in their own meta field (`adaptive`, JSON); the caller reads it with [`read_json_settings`].
        adaptive: AdaptiveSettings::default(),
        entry: EntryChallengeSettings::default(),
    })
}

/// The settings kept as JSON in the `adaptive` meta field: the adaptive-admission fields (issue 12) and,
/// since issue 28, the entry challenge's, flattened into one object. The field keeps its first name so
/// queues stored before read as they were (absent keys read their defaults).
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct JsonKeptSettings {
    #[serde(flatten, default)]
    adaptive: AdaptiveSettings,
    #[serde(flatten, default)]
    entry: EntryChallengeSettings,
}

/// Reads the `adaptive` meta field (empty for a queue never given any) into `settings`.
fn read_json_settings(raw: &str, settings: &mut QueueSettings) -> Result<(), StoreError> {
    let kept = if raw.is_empty() {
        JsonKeptSettings::default()
    } else {
        serde_json::from_str(raw)
            .map_err(|_| StoreError::Corrupt("queue setting adaptive is unreadable".into()))?
    };
    settings.adaptive = kept.adaptive;
    settings.entry = kept.entry;
    Ok(())
}

/// Whether a patch changes any adaptive-admission field.
fn touches_adaptive(patch: &SettingsPatch) -> bool {
    patch.admission_mode.is_some()
        || patch.min_admit_per_second.is_some()
        || patch.max_admit_per_second.is_some()
        || patch.target_p95_millis.is_some()
        || patch.max_error_rate.is_some()
}

/// The `adaptive` argument of `update_settings.lua`: the validated JSON-kept settings when the patch
/// touches any of them, else empty (keep what is stored).
fn json_settings_arg(patch: &SettingsPatch, validated: &QueueSettings) -> Result<String, StoreError> {
    if !touches_adaptive(patch) && patch.entry_challenge.is_none() && patch.pow_difficulty.is_none() {
        return Ok(String::new());
    }
    serde_json::to_string(&JsonKeptSettings {
        adaptive: validated.adaptive,
        entry: validated.entry,
    })
    .map_err(|e| StoreError::Corrupt(format!("adaptive settings: {e}")))
}

/// What every member's view shares: the clock reading, the waiting count and the meta fields the wait
/// estimate reads (`batch_head` in `queue_base.lua`).
struct ViewHead {
    now_ms: i64,
    waiting_count: u64,
    admit_per_second: Option<f64>,
    max_active: String,
    paused: bool,
    estimator: ThroughputEstimator,
}

impl ViewHead {
    /// Reads the seven meta fields `aps, max_active, paused, ar, cr, mw, wv`.
    fn read(now_ms: i64, waiting_count: u64, reply: &mut Reply) -> Result<ViewHead, StoreError> {
        Ok(ViewHead {
            now_ms,
            waiting_count,
            admit_per_second: reply.opt_f64()?,
            max_active: reply.string()?,
            paused: reply.string()? == "1",
            estimator: ThroughputEstimator {
                admit_rate: reply.opt_f64()?,
                consume_rate: reply.opt_f64()?,
                measured_ms: reply.opt_f64()?.unwrap_or(0.0),
                window_variance: reply.opt_f64()?,
                ..ThroughputEstimator::default()
            },
        })
    }

    /// Reads `batch_head`: now, waiting count, then the meta fields.
    fn read_batch(reply: &mut Reply) -> Result<ViewHead, StoreError> {
        let now_ms = reply.int()?;
        let waiting_count = reply.int()?.max(0) as u64;
        ViewHead::read(now_ms, waiting_count, reply)
    }

    /// The view of a member in `status`; the rank counts only while waiting.
    fn view(
        &self,
        status: MemberStatus,
        rank: Option<u64>,
        token: Option<Token>,
        last_outcome: Option<LastOutcome>,
    ) -> MemberView {
        let rank = if status == MemberStatus::Waiting {
            rank
        } else {
            None
        };
        // Only the fields the estimate reads matter here.
        let settings = QueueSettings {
            admit_per_second: self.admit_per_second.unwrap_or(0.0),
            max_active: self.max_active.parse().ok(),
            paused: self.paused,
            ..QueueSettings::default()
        };
        let estimated_wait_seconds =
            rank.and_then(|rank| self.estimator.estimate_wait_seconds(rank, &settings));
        let estimated_wait_p90_seconds =
            rank.and_then(|rank| self.estimator.estimate_wait_p90_seconds(rank, &settings));
        MemberView {
            status,
            rank,
            waiting_count: self.waiting_count,
            token,
            last_outcome,
            estimated_wait_seconds,
            estimated_wait_p90_seconds,
            now_ms: self.now_ms,
            placement: None,
        }
    }
}

/// Reads the view that `view_of()` in `queue_base.lua` returns: status, rank, waiting count, nonce,
/// expiry, last outcome, now, then the meta fields.
fn read_view(mut reply: Reply) -> Result<MemberView, StoreError> {
    let status = status_of(reply.int()?)?;
    let rank = u64::try_from(reply.int()?).ok();
    let waiting_count = reply.int()?.max(0) as u64;
    let (token, last_outcome) = read_token(&mut reply)?;
    let now_ms = reply.int()?;
    let head = ViewHead::read(now_ms, waiting_count, &mut reply)?;
    Ok(head.view(status, rank, token, last_outcome))
}

/// A member's entry token as the store keeps it: its nonce and expiry (ms).
type Token = ([u8; 16], i64);

/// Reads `nonce, expires, last`: the member's token if any, and their last outcome.
fn read_token(reply: &mut Reply) -> Result<(Option<Token>, Option<LastOutcome>), StoreError> {
    let token = read_nonce_and_expiry(reply)?;
    let last_outcome = (reply.int()? == 1).then_some(LastOutcome::Consumed);
    Ok((token, last_outcome))
}

/// Reads `nonce, expires`: the member's token, if the nonce is not empty.
fn read_nonce_and_expiry(reply: &mut Reply) -> Result<Option<Token>, StoreError> {
    let nonce = reply.string()?;
    let expires = reply.int()?;
    if nonce.is_empty() {
        return Ok(None);
    }
    Ok(Some((unhex::<16>(&nonce)?, expires)))
}

/// Script arguments of a settings patch, in `SETTING_FIELDS` order (`''` / `keep` = unchanged).
fn patch_args(patch: &SettingsPatch, validated: &QueueSettings) -> Vec<String> {
    let full = settings_args(validated);
    let pick = |present: bool, i: usize| if present { full[i].clone() } else { String::new() };
    // Adaptive bounds may clamp the rate (`QueueSettings::apply`), so a patch of them writes the rate too.
    let rate = patch.admit_per_second.is_some() || touches_adaptive(patch);
    vec![
        pick(rate, 0),
        pick(rate, 1),
        pick(patch.tick_millis.is_some(), 2),
        pick(patch.token_ttl_seconds.is_some(), 3),
        pick(patch.claim_ttl_seconds.is_some(), 4),
        match patch.max_active {
            None => "keep".into(),
            Some(None) => "none".into(),
            Some(Some(n)) => n.to_string(),
        },
        pick(patch.paused.is_some(), 6),
        pick(patch.fail_mode.is_some(), 7),
        pick(patch.abandon_after_seconds.is_some(), 8),
    ]
}

/// One poll's answer: the member's view, the limiter window used (ms) and the decision.
pub(super) type PollAnswer = (MemberView, i64, RateDecision);

/// Reads one member's six fields of `poll.lua`'s reply (`burst` is their poll limit): their answer, or
/// (status -1) the error their poll raised in the script, which is theirs alone. The window is the
/// script's own rule, `burst` intervals of the tier of the rank just read, so it is not sent.
fn read_poll(
    head: &ViewHead,
    reply: &mut Reply,
    burst: u32,
) -> Result<Result<PollAnswer, StoreError>, StoreError> {
    let code = reply.int()?;
    if code == -1 {
        let _rank = reply.int()?;
        let error = reply.string()?;
        for _ in 0..3 {
            reply.int()?;
        }
        return Ok(Err(StoreError::Corrupt(format!("poll: {error}"))));
    }
    if !(0..8).contains(&code) {
        return Err(StoreError::Corrupt(format!("unknown poll code {code}")));
    }
    let (status, consumed) = (status_of(code % 4)?, code >= 4);
    let rank = u64::try_from(reply.int()?).ok();
    let token = read_nonce_and_expiry(reply)?;
    let last_outcome = consumed.then_some(LastOutcome::Consumed);
    let view = head.view(status, rank, token, last_outcome);
    let window_ms = (polling_tier_seconds(view.rank) * u64::from(burst) * 1000) as i64;
    let (decision, reset_ms) = (reply.int()?, reply.int()?);
    let decision = if decision >= 0 {
        RateDecision::Allowed {
            remaining: decision.min(i64::from(u32::MAX)) as u32,
            reset_ms,
        }
    } else {
        RateDecision::Limited {
            retry_after_ms: -decision,
        }
    };
    Ok(Ok((view, window_ms, decision)))
}

impl RedisStore {
    /// A member's poll in one script: their position and the per-member poll limit (a sliding log of
    /// `burst` polls per `burst` polling intervals, the interval being the tier of the rank just read, as
    /// `rankgate_core::queue::polling_tier_seconds` gives it). Returns the view, the window used (ms) and
    /// the decision; a refused poll is not recorded. Saves the second round trip (and second script) that
    /// [`QueueStore::position`] followed by [`RateLimiter::try_acquire`](crate::queue::RateLimiter) costs,
    /// and concurrent polls of one queue share the script call.
    pub async fn poll_in_one_script(
        &self,
        queue: &QueueName,
        member: &MemberId,
        burst: u32,
    ) -> Result<PollAnswer, StoreError> {
        self.check()?;
        self.polls
            .call(&self.me, queue, (member.clone(), burst.max(1)))
            .await
    }

    /// One `poll.lua` call for a round of polls on one queue, answers in order (the poll lane's batch).
    pub(super) fn poll_batch<'a>(
        &'a self,
        queue: &'a QueueName,
        polls: Vec<(MemberId, u32)>,
    ) -> BoxFuture<'a, Result<Vec<Result<PollAnswer, StoreError>>, StoreError>> {
        Box::pin(async move {
            let mut call = self.fast_call(&self.scripts.poll, queue);
            call.arg(super::limiter::IDLE_SLACK_MS);
            for (member, burst) in &polls {
                call.key(self.poll_key(queue, member.as_str()))
                    .arg(member.as_str())
                    .arg(*burst);
            }
            let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
            let head = ViewHead::read_batch(&mut reply)?;
            polls
                .iter()
                .map(|(_, burst)| read_poll(&head, &mut reply, *burst))
                .collect()
        })
    }

    /// A round of entries on one queue, answers in order (the entry lane's batch): `enter_fast.lua` takes
    /// members until one needs the full `enter.lua` (a queue's first entry, a token holder); that member
    /// gets it, and the fast script goes on with the members after them, so arrival order is kept. If a
    /// step fails, the members already decided keep their answers and the rest get the error.
    pub(super) fn enter_batch<'a>(
        &'a self,
        queue: &'a QueueName,
        members: Vec<MemberId>,
    ) -> BoxFuture<'a, Result<Vec<Result<EnterOutcome, StoreError>>, StoreError>> {
        Box::pin(async move {
            let mut outcomes: Vec<Result<EnterOutcome, StoreError>> = Vec::with_capacity(members.len());
            while outcomes.len() < members.len() {
                let rest = &members[outcomes.len()..];
                if let Err(error) = self.enter_some(queue, rest, &mut outcomes).await {
                    if outcomes.is_empty() {
                        return Err(error);
                    }
                    outcomes.resize(members.len(), Err(error));
                }
            }
            Ok(outcomes)
        })
    }

    /// One `enter_fast.lua` call for `members`, then the full entry for the member it stopped at, if any;
    /// pushes one outcome per member decided.
    async fn enter_some(
        &self,
        queue: &QueueName,
        members: &[MemberId],
        outcomes: &mut Vec<Result<EnterOutcome, StoreError>>,
    ) -> Result<(), StoreError> {
        let mut fast = self.fast_call(&self.scripts.enter_fast, queue);
        for member in members {
            fast.arg(member.as_str());
        }
        let mut reply = Reply::new(self.connection.invoke(&fast).await?)?;
        let head = ViewHead::read_batch(&mut reply)?;
        let epoch = reply.int()?.max(0) as u64;
        let mut entered_now = 0u64;
        for member in members {
            // The script answers every member up to and including the one it stops at.
            let code = reply.int()?;
            if code >= 0 {
                let mut view = head.view(MemberStatus::Waiting, Some((code / 2) as u64), None, None);
                view.placement = Some(Placement {
                    epoch,
                    place: reply.int()?,
                });
                outcomes.push(Ok(if code % 2 == 1 {
                    entered_now += 1;
                    EnterOutcome::Entered(view)
                } else {
                    EnterOutcome::AlreadyPresent(view)
                }));
                continue;
            }
            if entered_now > 0 && head.waiting_count <= entered_now {
                // This batch made an empty queue busy.
                self.activate(queue).await?;
            }
            // The queue does not exist yet, or the member holds a token: the full entry decides.
            let outcome = self.enter_full(queue, member).await?;
            outcomes.push(Ok(outcome));
            return Ok(());
        }
        if entered_now > 0 && head.waiting_count <= entered_now {
            self.activate(queue).await?;
        }
        Ok(())
    }

    /// `enter.lua` for one member ([`RedisStore::enter_or_restore`] without a claimed place).
    async fn enter_full(&self, queue: &QueueName, member: &MemberId) -> Result<EnterOutcome, StoreError> {
        self.enter_or_restore(queue, member, None)
            .await
            .map(|(outcome, _)| outcome)
    }

    /// `enter.lua`, or `restore.lua` when the member claims a place of an earlier epoch; answers whether
    /// the place came back. A queue that does not exist yet is first given its place in the registry under
    /// `max_queues` ([`StoreError::TooManyQueues`] beyond it), then made: with the settings this instance
    /// kept of it if it had any (the store lost it; see [`crate::queue::kept_settings`]), else the defaults.
    async fn enter_or_restore(
        &self,
        queue: &QueueName,
        member: &MemberId,
        claimed: Option<Placement>,
    ) -> Result<(EnterOutcome, bool), StoreError> {
        let mut may_create = "0";
        loop {
            let kept = (may_create == "1").then(|| self.kept.get(queue)).flatten();
            let mut call = match claimed {
                None => self.creating_call(&self.scripts.enter, queue, kept.as_ref()),
                Some(_) => self.retiring_call(&self.scripts.restore, queue, kept.as_ref()),
            };
            call.arg(member.as_str());
            if let Some(claimed) = claimed {
                call.arg(claimed.epoch).arg(claimed.restored_score());
            }
            call.arg(may_create);
            let mut full = Reply::new(self.connection.invoke(&call).await?)?;
            let entered = match full.int()? {
                -1 => {
                    self.register_new(queue).await?;
                    may_create = "1";
                    continue;
                }
                code => code == 1,
            };
            if full.int()? == 1 {
                // Created just now: listed again, in case the janitor dropped the name in between.
                self.register(queue).await?;
                if let Some(kept) = &kept {
                    self.made_again_as_kept(queue, kept).await?;
                }
            }
            let mut view = read_view(full.array()?)?;
            let epoch = full.int()?.max(0) as u64;
            let place = full.string()?;
            view.placement = match place.as_str() {
                "" => None,
                "A" => Some(Placement {
                    epoch,
                    place: Placement::ADMITTED,
                }),
                seq => Some(Placement {
                    epoch,
                    place: seq
                        .parse()
                        .map_err(|_| StoreError::Corrupt(format!("a place {seq:?}")))?,
                }),
            };
            let restored = claimed.is_some() && full.int()? == 1;
            // A restore may be the first member of a queue made again: it is made busy either way.
            if restored || (entered && view.waiting_count <= 1) {
                self.activate(queue).await?;
            }
            let outcome = if entered {
                EnterOutcome::Entered(view)
            } else {
                EnterOutcome::AlreadyPresent(view)
            };
            return Ok((outcome, restored));
        }
    }

    /// A queue the store had lost was made again by an entry with the settings kept of it: the rest of
    /// them (the adaptive controller's, and that an admin configured it) are written now, and the loss
    /// is logged.
    async fn made_again_as_kept(
        &self,
        queue: &QueueName,
        kept: &crate::queue::kept_settings::Kept,
    ) -> Result<(), StoreError> {
        tracing::warn!(
            queue = %queue,
            lost_epoch = kept.epoch,
            paused = kept.settings.paused,
            admit_per_second = kept.settings.admit_per_second,
            "the waiting room's store had lost this queue; made it again with the settings this instance kept"
        );
        if kept.managed {
            let patch = SettingsPatch::from_settings(&kept.settings);
            // Validation cannot fail: these settings were valid when stored.
            let _ = self.update_settings(queue, &patch).await?;
        }
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        if let Some(opens_at_ms) = kept.opens_at_ms.filter(|at| *at > now_ms) {
            // Still ahead: the pre-queue forms again, under a fresh seed (the old one was lost).
            let mut seed = [0u8; 32];
            rand::fill(&mut seed);
            let _ = self
                .schedule_opening(queue, Some(opens_at_ms), rankgate_core::queue::DrawSeed(seed))
                .await?;
            if let Some(round) = kept.beacon_round {
                let _ = self.set_beacon_round_redis(queue, Some(round)).await?;
            }
        }
        Ok(())
    }

    /// A queue's settings, epoch and whether an admin configured it, read from its meta hash (one
    /// `HMGET`, no script: a read that is not activity); `None` for a queue that does not exist.
    pub(super) async fn meta_settings(
        &self,
        queue: &QueueName,
    ) -> Result<Option<(QueueSettings, u64, bool)>, StoreError> {
        let meta = &self.queue_keys(queue)[0];
        let mut command = redis::cmd("HMGET");
        command.arg(meta);
        for field in [
            "aps",
            "rate_milli",
            "tick",
            "token_ttl",
            "claim_ttl",
            "max_active",
            "paused",
            "fail_mode",
            "abandon",
            "adaptive",
            "epoch",
            "managed",
        ] {
            command.arg(field);
        }
        let values: Vec<Option<String>> = self.connection.query(&command).await?;
        if values.first().is_none_or(Option::is_none) {
            return Ok(None);
        }
        let values = values
            .into_iter()
            .map(|v| redis::Value::BulkString(v.unwrap_or_default().into_bytes()))
            .collect();
        let mut reply = Reply::new(redis::Value::Array(values))?;
        let mut settings = read_settings(&mut reply)?;
        read_json_settings(&reply.string()?, &mut settings)?;
        let epoch = reply.string()?.parse().unwrap_or(0);
        let managed = reply.string()? == "1";
        Ok(Some((settings, epoch, managed)))
    }

    /// Keeps `settings` of `queue` as read now ([`crate::queue::kept_settings`]); a changed epoch means
    /// the store lost the queue since this instance last looked, and is logged.
    pub(super) fn observe_kept(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
        epoch: Option<u64>,
        managed: Option<bool>,
    ) {
        if let Observed::EpochChanged(lost) = self.kept.observe(queue, settings, epoch, managed) {
            tracing::warn!(queue = %queue, lost_epoch = lost, epoch = ?epoch, "the waiting room's store lost this queue (its epoch changed); members with tickets of the lost epoch get their places back when they return");
        }
    }

    /// One `expire.lua` step (at most `MAX_EXPIRIES` deadlines).
    async fn expire_step(&self, queue: &QueueName) -> Result<ExpiryOutcome, StoreError> {
        let call = self.queue_call(&self.scripts.expire, queue);
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        Ok(ExpiryOutcome {
            tokens_expired: reply.int()?.max(0) as u64,
            claims_expired: reply.int()?.max(0) as u64,
            more_due: reply.int()? == 1,
            abandoned: reply.int()?.max(0) as u64,
            next_deadline_ms: reply.opt_f64()?.map(|ms| ms as i64),
        })
    }
}

#[async_trait]
impl QueueStore for RedisStore {
    async fn enter(&self, queue: &QueueName, member: &MemberId) -> Result<EnterOutcome, StoreError> {
        self.check()?;
        self.entries.call(&self.me, queue, member.clone()).await
    }

    async fn position(&self, queue: &QueueName, member: &MemberId) -> Result<MemberView, StoreError> {
        self.check()?;
        let mut call = self.fast_call(&self.scripts.position, queue);
        call.arg(member.as_str());
        read_view(Reply::new(self.connection.invoke(&call).await?)?)
    }

    async fn leave(&self, queue: &QueueName, member: &MemberId) -> Result<LeaveOutcome, StoreError> {
        self.check()?;
        let mut call = self.queue_call(&self.scripts.leave, queue);
        call.arg(member.as_str());
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        Ok(match reply.int()? {
            0 => LeaveOutcome::NotPresent,
            1 => LeaveOutcome::Left(status_of(reply.int()?)?),
            _ => LeaveOutcome::Rejected(LeaveRejection::ClaimInFlight),
        })
    }

    async fn admit(
        &self,
        queue: &QueueName,
        tokens: Vec<TokenCandidate>,
    ) -> Result<AdmitOutcome, StoreError> {
        self.check()?;
        let mut call = self.queue_call(&self.scripts.admit, queue);
        for token in &tokens {
            call.arg(hex::encode(token.nonce))
                .arg(hex::encode(token.digest.0));
        }
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        let mut members = reply.array()?;
        let mut raw_members = Vec::new();
        while !members.is_empty() {
            raw_members.push(members.string()?);
        }
        let tokens_expired = reply.int()?.max(0) as u64;
        let claims_expired = reply.int()?.max(0) as u64;
        let waiting = reply.int()?.max(0) as u64;
        let outstanding = reply.int()?.max(0) as u64;
        let mut waits = reply.array()?;
        let abandoned = reply.int()?.max(0) as u64;
        let next_deadline_ms = reply.opt_f64()?.map(|ms| ms as i64);
        let mut admitted = Vec::with_capacity(raw_members.len());
        let mut waits_ms = Vec::with_capacity(raw_members.len());
        for raw in raw_members {
            let waited = if waits.is_empty() {
                None
            } else {
                u64::try_from(waits.int()?).ok()
            };
            match MemberId::parse(&raw) {
                Ok(id) => {
                    admitted.push(id);
                    waits_ms.push(waited);
                }
                Err(_) => tracing::warn!(queue = %queue, "admitted a member id that no longer parses"),
            }
        }
        let outcome = AdmitOutcome {
            admitted,
            waits_ms,
            abandoned,
            tokens_expired,
            claims_expired,
            waiting,
            outstanding,
            next_deadline_ms,
        };
        if outcome.waiting == 0 {
            // Nobody left to admit: a queue nobody waits in costs nothing per tick (its READY and CLAIMED
            // members' expiries are deadlines, `next_deadline_ms`, which the schedulers keep).
            self.deactivate_if_idle(queue).await?;
        }
        Ok(outcome)
    }

    async fn expire_due(&self, queue: &QueueName) -> Result<ExpiryOutcome, StoreError> {
        self.check()?;
        // Bounded script calls in a loop (defect 17): ten thousand due members are ten short scripts, with
        // entries and polls of every queue served in between, not one long one.
        let mut total = ExpiryOutcome::default();
        loop {
            let step = self.expire_step(queue).await?;
            total.tokens_expired += step.tokens_expired;
            total.claims_expired += step.claims_expired;
            total.abandoned += step.abandoned;
            total.next_deadline_ms = step.next_deadline_ms;
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
        let mut call = self.queue_call(&self.scripts.claim, queue);
        call.arg(member.as_str())
            .arg(hex::encode(token.0))
            .arg(hex::encode(claim.0));
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        Ok(match reply.int()? {
            0 => ClaimOutcome::Claimed {
                expires_at_ms: reply.int()?,
            },
            1 => ClaimOutcome::Rejected(ClaimRejection::NoToken),
            2 => ClaimOutcome::Rejected(ClaimRejection::WrongToken),
            3 => ClaimOutcome::Rejected(ClaimRejection::Expired),
            4 => ClaimOutcome::Rejected(ClaimRejection::AlreadyConsumed),
            _ => ClaimOutcome::Rejected(ClaimRejection::AlreadyClaimed),
        })
    }

    async fn consume(
        &self,
        queue: &QueueName,
        member: &MemberId,
        claim: &Digest,
    ) -> Result<ConsumeOutcome, StoreError> {
        self.check()?;
        let mut call = self.queue_call(&self.scripts.consume, queue);
        call.arg(member.as_str()).arg(hex::encode(claim.0));
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        Ok(match reply.int()? {
            0 => ConsumeOutcome::Consumed,
            1 => ConsumeOutcome::AlreadyConsumed,
            _ => ConsumeOutcome::Rejected(ConsumeRejection::UnknownClaim),
        })
    }

    async fn release(
        &self,
        queue: &QueueName,
        member: &MemberId,
        claim: &Digest,
    ) -> Result<ReleaseOutcome, StoreError> {
        self.check()?;
        let mut call = self.queue_call(&self.scripts.release, queue);
        call.arg(member.as_str()).arg(hex::encode(claim.0));
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        Ok(match reply.int()? {
            0 => ReleaseOutcome::Released(ReleasedTo::Ready),
            1 => ReleaseOutcome::Released(ReleasedTo::NotEntered),
            2 => ReleaseOutcome::Released(ReleasedTo::AlreadyReleased),
            3 => ReleaseOutcome::Rejected(ReleaseRejection::UnknownClaim),
            _ => ReleaseOutcome::Rejected(ReleaseRejection::AlreadyConsumed),
        })
    }

    async fn settings(&self, queue: &QueueName) -> Result<Option<QueueSettings>, StoreError> {
        self.check()?;
        Ok(self.meta_settings(queue).await?.map(|(settings, _, _)| settings))
    }

    async fn update_settings(
        &self,
        queue: &QueueName,
        patch: &SettingsPatch,
    ) -> Result<Result<QueueSettings, SettingsError>, StoreError> {
        self.check()?;
        // Validate against what is stored (rate × tick spans two fields, so a patch of one is checked with
        // the other's stored value); the script re-checks that product atomically, in case another
        // instance changed the other field meanwhile.
        let mut validated = match self.settings(queue).await? {
            Some(stored) => stored,
            None => self.options.default_settings.clone(),
        };
        if let Err(error) = validated.apply(patch) {
            return Ok(Err(error));
        }
        // Listed before the script may create it, so a crash in between leaves a listed queue that does
        // not exist (harmless: it reads as absent) but never an unlisted one.
        self.register(queue).await?;
        let mut call = self.queue_call(&self.scripts.update_settings, queue);
        for arg in patch_args(patch, &validated) {
            call.arg(arg);
        }
        call.arg(json_settings_arg(patch, &validated)?);
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        match reply.int()? {
            2 => return Ok(Err(SettingsError::MembersPerTick)),
            1 => self.register(queue).await?,
            _ => {}
        }
        let mut settings = read_settings(&mut reply)?;
        read_json_settings(&reply.string()?, &mut settings)?;
        self.observe_kept(queue, &settings, None, Some(true));
        self.bump_settings_version().await?;
        Ok(Ok(settings))
    }

    async fn stats(&self, queue: &QueueName) -> Result<Option<QueueStats>, StoreError> {
        self.check()?;
        let call = self.queue_call(&self.scripts.stats, queue);
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        if reply.is_empty() {
            return Ok(None);
        }
        let settings = read_settings(&mut reply)?;
        let waiting = reply.int()?.max(0) as u64;
        let ready = reply.int()?.max(0) as u64;
        let claimed = reply.int()?.max(0) as u64;
        let oldest_wait_ms = reply.int()?.max(0);
        let now_ms = reply.int()?;
        let mut estimator = ThroughputEstimator {
            admit_rate: reply.opt_f64()?,
            consume_rate: reply.opt_f64()?,
            ..ThroughputEstimator::default()
        };
        let mut buckets = reply.array()?;
        while !buckets.is_empty() {
            let second = buckets.int()?;
            let count = buckets.int()?.max(0) as u64;
            estimator.per_second.push((second, count));
        }
        let abandoned = reply.int()?.max(0) as u64;
        let mut settings = settings;
        read_json_settings(&reply.string()?, &mut settings)?;
        let epoch = reply.int()?.max(0) as u64;
        self.observe_kept(queue, &settings, Some(epoch), None);
        Ok(Some(QueueStats {
            epoch,
            abandoned,
            waiting,
            ready,
            claimed,
            admitted_last_minute: estimator.admitted_last_minute(now_ms),
            oldest_wait_seconds: (oldest_wait_ms / 1000) as u64,
            measured_rate: estimator.effective_rate(&settings),
            settings,
        }))
    }

    async fn queues(&self) -> Result<Vec<QueueName>, StoreError> {
        self.check()?;
        let names: Vec<String> = self
            .connection
            .query(redis::cmd("SMEMBERS").arg(self.registry_key()))
            .await?;
        let mut queues: Vec<QueueName> = names.iter().filter_map(|n| QueueName::parse(n).ok()).collect();
        queues.sort();
        Ok(queues)
    }

    async fn active_queues(&self) -> Result<Vec<QueueName>, StoreError> {
        self.check()?;
        let names: Vec<String> = self
            .connection
            .query(redis::cmd("SMEMBERS").arg(self.active_key()))
            .await?;
        let mut queues: Vec<QueueName> = names.iter().filter_map(|n| QueueName::parse(n).ok()).collect();
        queues.sort();
        Ok(queues)
    }

    async fn admission_preview(&self, queue: &QueueName) -> Result<Option<AdmissionPreview>, StoreError> {
        self.check()?;
        let call = self.queue_call(&self.scripts.preview, queue);
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        if reply.is_empty() {
            return Ok(None);
        }
        let mut settings = read_settings(&mut reply)?;
        let waiting = reply.int()?.max(0) as u64;
        let outstanding = reply.int()?.max(0) as u64;
        read_json_settings(&reply.string()?, &mut settings)?;
        self.observe_kept(queue, &settings, None, None);
        Ok(Some(AdmissionPreview {
            settings,
            waiting,
            outstanding,
        }))
    }

    async fn delete_queue(&self, queue: &QueueName) -> Result<bool, StoreError> {
        self.check()?;
        // Unlisted first: an entry racing the delete then either lands in the old keys (and goes with
        // them) or, after the UNLINK, creates the queue afresh through the registry.
        let _: i64 = self
            .connection
            .query(redis::cmd("SREM").arg(self.registry_key()).arg(queue.as_str()))
            .await?;
        let _: i64 = self
            .connection
            .query(redis::cmd("SREM").arg(self.active_key()).arg(queue.as_str()))
            .await?;
        let call = self.retiring_call(&self.scripts.delete, queue, None);
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        self.kept.forget(queue);
        self.bump_settings_version().await?;
        let _: i64 = self
            .connection
            .query(
                redis::cmd("UNLINK")
                    .arg(self.drawn_key(queue))
                    .arg(self.entrants_key(queue)),
            )
            .await?;
        Ok(reply.int()? == 1)
    }

    async fn forget_if_idle(&self, queue: &QueueName, idle_ms: i64) -> Result<bool, StoreError> {
        self.check()?;
        let mut call = self.retiring_call(&self.scripts.forget, queue, None);
        call.arg(idle_ms);
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        match reply.int()? {
            1 => {
                self.kept.forget(queue);
                self.bump_settings_version().await?;
                let _: i64 = self
                    .connection
                    .query(redis::cmd("SREM").arg(self.registry_key()).arg(queue.as_str()))
                    .await?;
                // A first entry may have re-created it between the script and the SREM; it lists the
                // name again after creating, but look once more so the registry is right either way.
                let exists: i64 = self
                    .connection
                    .query(redis::cmd("EXISTS").arg(&self.queue_keys(queue)[0]))
                    .await?;
                if exists == 1 {
                    self.register(queue).await?;
                    return Ok(false);
                }
                Ok(true)
            }
            // Busy: make sure the scheduler sees it (repairs the active set after a crash between an
            // entry and its SADD).
            2 => {
                self.activate(queue).await?;
                Ok(false)
            }
            _ => Ok(false),
        }
    }

    async fn restore(
        &self,
        queue: &QueueName,
        member: &MemberId,
        claimed: Placement,
    ) -> Result<EnterOutcome, StoreError> {
        self.check()?;
        let (outcome, restored) = self.enter_or_restore(queue, member, Some(claimed)).await?;
        if restored {
            tracing::info!(queue = %queue, lost_epoch = claimed.epoch, "a member came back to its place by ticket");
        }
        Ok(outcome)
    }

    /// Three calls a round while nothing changed: the marker, the registry and the settings version. Every
    /// queue's settings are read again only when the version moved (an admin PUT or a delete on any
    /// instance bumps it, after its write), after a loss, or once every [`KEPT_FULL_SWEEP_EVERY`] as a
    /// safety net (a writer that died between its write and the bump); a queue new to this copy is read at
    /// once. So a thousand idle queues cost three calls per round, not a thousand (issue 30).
    async fn keep_settings(&self) -> Result<(), StoreError> {
        self.check()?;
        // A marker key tells "this store kept its data since the last sweep" from "it lost everything":
        // only in the first case is a kept queue missing from the registry one that was deleted or
        // forgotten (by any instance), to be dropped from the copy; after a loss every copy is kept.
        let marker = format!("{}{{rg}}:kept-marker", self.options.prefix);
        let store_kept_its_data: bool = self.connection.query(redis::cmd("EXISTS").arg(&marker)).await?;
        let queues = self.queues().await?;
        if store_kept_its_data {
            self.kept
                .retain(|queue| queues.iter().any(|listed| listed.as_str() == queue));
        }
        let version: Option<i64> = self
            .connection
            .query(redis::cmd("GET").arg(self.settings_version_key()))
            .await?;
        let full = {
            let sweep = self.kept_sweep.lock();
            !store_kept_its_data
                || sweep.version != version
                || sweep
                    .last_full
                    .is_none_or(|at| at.elapsed() >= KEPT_FULL_SWEEP_EVERY)
        };
        for queue in &queues {
            if !full && self.kept.get(queue).is_some() {
                continue;
            }
            if let Some((settings, epoch, managed)) = self.meta_settings(queue).await? {
                self.observe_kept(queue, &settings, Some(epoch), Some(managed));
            }
        }
        if full {
            *self.kept_sweep.lock() = super::KeptSweep {
                version,
                last_full: Some(std::time::Instant::now()),
            };
        }
        let _: () = self
            .connection
            .query(redis::cmd("SET").arg(&marker).arg("1"))
            .await?;
        Ok(())
    }

    fn draws(&self) -> &dyn DrawStore {
        self
    }

    fn reports(&self) -> Option<&dyn crate::queue::report::ReportStore> {
        Some(self)
    }

    /// One `poll.lua` call instead of the default's position then limiter (the same sliding log, in
    /// the queue's slot), shared by concurrent polls of the queue.
    async fn poll(
        &self,
        queue: &QueueName,
        member: &MemberId,
        burst: u32,
        _limiter: &dyn RateLimiter,
    ) -> Result<(MemberView, RateDecision), StoreError> {
        let (view, window_ms, decision) = self.poll_in_one_script(queue, member, burst).await?;
        debug_assert_eq!(
            window_ms,
            poll_window_seconds(view.rank, burst) as i64 * 1000,
            "poll.lua's tiers"
        );
        Ok((view, decision))
    }

    fn coalescing(&self) -> Option<Coalescing> {
        Some(RedisStore::coalescing(self))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.check()?;
        let _: String = self.connection.query(&redis::cmd("PING")).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The hot-path scripts against the general ones, on the standalone Redis at 127.0.0.1:6379 (the
    //! conformance suite runs them on standalone and Cluster; these pin what it cannot see).
    use std::sync::Arc;

    use rand::{Rng as _, SeedableRng as _};
    use rankgate_core::limiter::{RateLimit, SlidingLog};

    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::queue::limiter::{RateLimiter, RateLimiterKind};
    use crate::queue::redis::{RedisOptions, RedisTime};
    use crate::queue::token::{digest_of, TokenSecret};

    async fn store(clock: &ManualClock, name: &str) -> Arc<RedisStore> {
        let options = RedisOptions {
            prefix: format!("rgtest:poll:{}:{name}:", std::process::id()),
            time: RedisTime::Injected(Arc::new(clock.clone()) as Arc<dyn Clock>),
            ..RedisOptions::default()
        };
        let store = RedisStore::connect(&[rankgate_testkit::redis_servers::standalone_url()], options)
            .await
            .expect("the shared Redis");
        store.purge_prefix().await.unwrap();
        store
    }

    fn id(raw: &str) -> MemberId {
        MemberId::parse(raw).unwrap()
    }

    /// `poll.lua` decides exactly as `rankgate_core`'s `SlidingLog` and as the limiter module's own Redis
    /// sliding log, on a random poll schedule, and its tiers are `polling_tier_seconds`.
    #[tokio::test]
    async fn one_script_poll_matches_the_sliding_log_and_the_tiers() {
        let clock = ManualClock::new(1_000_000);
        let store = store(&clock, "log").await;
        let q = QueueName::parse("sale").unwrap();
        for i in 0..1_001 {
            store.enter(&q, &id(&format!("m{i}"))).await.unwrap();
        }
        for (rank, burst) in [(0u64, 3u32), (99, 1), (100, 3), (999, 2), (1_000, 3)] {
            let (view, window_ms, _) = store
                .poll_in_one_script(&q, &id(&format!("m{rank}")), burst)
                .await
                .unwrap();
            assert_eq!(view.rank, Some(rank));
            let tier = polling_tier_seconds(view.rank);
            assert_eq!(window_ms, (tier * u64::from(burst) * 1000) as i64, "rank {rank}");
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let limit = RateLimit {
            limit: 3,
            window_ms: 3_000,
        };
        let mut model = SlidingLog::default();
        for step in 0..300 {
            let now = clock.advance(rng.random_range(0..1_200));
            let (_, _, decision) = store.poll_in_one_script(&q, &id("m1"), 3).await.unwrap();
            let module = store
                .try_acquire("poll:sale:m1", limit, RateLimiterKind::SlidingLog)
                .await
                .unwrap();
            let expected = model.try_acquire(now, limit);
            assert_eq!(decision, expected, "step {step} at {now}");
            assert_eq!(module, expected, "step {step} at {now}");
        }
        // A member who is not waiting polls on the 1 s tier, and an unknown queue creates nothing.
        let (view, window_ms, _) = store.poll_in_one_script(&q, &id("nobody"), 3).await.unwrap();
        assert_eq!((view.status, window_ms), (MemberStatus::NotEntered, 3_000));
        let other = QueueName::parse("absent").unwrap();
        let (view, _, _) = store.poll_in_one_script(&other, &id("m0"), 3).await.unwrap();
        assert_eq!(view.status, MemberStatus::NotEntered);
        assert!(store.settings(&other).await.unwrap().is_none());
        store.purge_prefix().await.unwrap();
    }

    /// Found by the backend-equivalence test: `poll.lua` decided the poll limit at the queue's guarded time,
    /// where the embedded service's limiter call (and `limiter_log.lua`) decide it at the store clock behind
    /// the key's own guard; after the clock stepped back behind a later entry the two answered different
    /// `Retry-After`s. The position stays on the queue's clock, the limit on the key's.
    #[tokio::test]
    async fn the_poll_limit_keeps_its_own_clock_guard_not_the_queues() {
        let start = 2_000_000;
        let clock = ManualClock::new(start);
        let store = store(&clock, "guard").await;
        let q = QueueName::parse("sale").unwrap();
        store.enter(&q, &id("m")).await.unwrap();
        let limit = RateLimit {
            limit: 1,
            window_ms: 1_000,
        };
        let mut model = SlidingLog::default();
        let (_, _, first) = store.poll_in_one_script(&q, &id("m"), 1).await.unwrap();
        assert_eq!(first, model.try_acquire(start, limit));
        let module_first = store
            .try_acquire("guard:m", limit, RateLimiterKind::SlidingLog)
            .await
            .unwrap();
        assert_eq!(module_first, first);
        // Another member's entry moves the queue's guard 500 ms on; then the clock steps back.
        clock.set(start + 500);
        store.enter(&q, &id("other")).await.unwrap();
        clock.set(start);
        let (view, window_ms, decision) = store.poll_in_one_script(&q, &id("m"), 1).await.unwrap();
        assert_eq!(
            (view.now_ms, window_ms),
            (start + 500, 1_000),
            "the position is on the queue's clock"
        );
        let expected = model.try_acquire(start, limit);
        assert_eq!(
            expected,
            RateDecision::Limited {
                retry_after_ms: 1_000
            }
        );
        assert_eq!(decision, expected, "the limit is on the key's clock");
        let module = store
            .try_acquire("guard:m", limit, RateLimiterKind::SlidingLog)
            .await
            .unwrap();
        assert_eq!(module, expected);
        store.purge_prefix().await.unwrap();
    }

    /// The fast entry and the read-only position agree with the full scripts: FIFO ranks, idempotent
    /// re-entry, READY only with a token, and an expired token is reported as NOT_ENTERED by the poll, which
    /// records the clock guard, and is then freed by the expiry step.
    #[tokio::test]
    async fn fast_entry_and_position_agree_with_the_full_scripts() {
        let clock = ManualClock::new(5_000_000);
        let store = store(&clock, "enter").await;
        let q = QueueName::parse("sale").unwrap();
        let first = store.enter(&q, &id("a")).await.unwrap();
        assert!(
            matches!(first, EnterOutcome::Entered(_)),
            "created by the full entry"
        );
        for (i, m) in ["b", "c", "d"].iter().enumerate() {
            match store.enter(&q, &id(m)).await.unwrap() {
                EnterOutcome::Entered(view) => {
                    assert_eq!(
                        (view.rank, view.waiting_count),
                        (Some(i as u64 + 1), i as u64 + 2)
                    );
                }
                other => panic!("{m}: {other:?}"),
            }
        }
        match store.enter(&q, &id("b")).await.unwrap() {
            EnterOutcome::AlreadyPresent(view) => assert_eq!(view.rank, Some(1)),
            other => panic!("{other:?}"),
        }
        let secret = TokenSecret::generate().unwrap();
        let admitted = store.admit(&q, vec![secret.prepare().unwrap()]).await.unwrap();
        assert_eq!(admitted.admitted, vec![id("a")]);
        let ready = store.position(&q, &id("a")).await.unwrap();
        assert_eq!(ready.status, MemberStatus::Ready);
        assert!(ready.token.is_some());
        let (polled, _, _) = store.poll_in_one_script(&q, &id("b"), 3).await.unwrap();
        assert_eq!((polled.status, polled.rank), (MemberStatus::Waiting, Some(0)));
        // Entering while READY changes nothing (the fast script declines, the full one decides).
        assert!(matches!(
            store.enter(&q, &id("a")).await.unwrap(),
            EnterOutcome::AlreadyPresent(v) if v.status == MemberStatus::Ready
        ));
        let token_ttl_ms = store.settings(&q).await.unwrap().unwrap().token_ttl_seconds as i64 * 1000;
        clock.advance(token_ttl_ms);
        let (expired, _, _) = store.poll_in_one_script(&q, &id("a"), 3).await.unwrap();
        assert_eq!(expired.status, MemberStatus::NotEntered);
        assert!(expired.token.is_none());
        // The poll recorded the clock guard: going back in time cannot revive the token for a claim.
        clock.advance(-token_ttl_ms);
        let (nonce, _) = ready.token.unwrap();
        let token = digest_of(&secret.token_for(&nonce));
        let claim = store.claim(&q, &id("a"), &token, &Digest([2; 32])).await.unwrap();
        assert_eq!(claim, ClaimOutcome::Rejected(ClaimRejection::Expired));
        assert_eq!(store.expire_due(&q).await.unwrap().tokens_expired, 1);
        store.purge_prefix().await.unwrap();
    }
}
