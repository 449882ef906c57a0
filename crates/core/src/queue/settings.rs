//! Per-queue settings (SPEC 2.1), their JSON shape, and the rules a PUT must pass.
//!
//! A PUT may give only some fields, so updates arrive as a [`SettingsPatch`] whose fields are all optional;
//! `maxActive` is tri-state (absent keeps the value, `null` removes the cap, a number sets it). The patch is
//! applied to a copy and the result validated as a whole, so an invalid PUT changes nothing.

use serde::{Deserialize, Deserializer, Serialize};

use super::adaptive::{AdaptiveSettings, AdmissionMode};
use super::challenge::{EntryChallenge, EntryChallengeSettings, POW_DIFFICULTY};

/// What the order gate does when the queue store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Answer 503 and admit nobody (the default): the queue exists to protect the order database.
    #[default]
    Closed,
    /// Forward requests without a claim: for shops that prefer selling to protecting the backend.
    Open,
}

/// A queue's settings, in the JSON shape of `PUT/GET /v1/admin/queues/{queue}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueSettings {
    /// Members admitted per second across all instances. Fractions are allowed (0.5 = one every 2 s).
    #[serde(serialize_with = "serialize_whole_as_integer")]
    pub admit_per_second: f64,
    /// How often admission runs, in milliseconds.
    pub tick_millis: u64,
    /// How long an entry token stays valid.
    pub token_ttl_seconds: u64,
    /// How long a claim holds a token before it is released automatically.
    pub claim_ttl_seconds: u64,
    /// Optional cap on READY + CLAIMED tokens outstanding.
    pub max_active: Option<u64>,
    /// Stop admitting while true.
    pub paused: bool,
    /// Gate behaviour when the store is down.
    pub fail_mode: FailMode,
    /// A WAITING member who neither polled nor held a stream this long is dropped before admission, so
    /// no token and no `max_active` slot goes to somebody who left. Settings stored before this field
    /// existed read the default.
    #[serde(default = "default_abandon_after_seconds")]
    pub abandon_after_seconds: u64,
    /// `admissionMode` and the adaptive controller's bounds and targets (issue 12), flattened into the
    /// same JSON object. Settings stored before they existed read `fixed` and the defaults.
    #[serde(flatten, default)]
    pub adaptive: AdaptiveSettings,
    /// `entryChallenge` and `powDifficulty` (issue 28), flattened into the same JSON object. Settings
    /// stored before they existed read `none` and the default difficulty.
    #[serde(flatten, default)]
    pub entry: EntryChallengeSettings,
}

fn default_abandon_after_seconds() -> u64 {
    300
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            admit_per_second: 50.0,
            tick_millis: 1000,
            token_ttl_seconds: 300,
            claim_ttl_seconds: 30,
            max_active: None,
            paused: false,
            fail_mode: FailMode::Closed,
            abandon_after_seconds: default_abandon_after_seconds(),
            adaptive: AdaptiveSettings::default(),
            entry: EntryChallengeSettings::default(),
        }
    }
}

/// Why settings are invalid. Each variant names the JSON field, so a 400 can point at it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SettingsError {
    /// `admitPerSecond` is not a finite number in (0, 1,000,000].
    #[error("admitPerSecond: must be a positive number of at most 1000000")]
    AdmitPerSecond,
    /// `tickMillis` is outside [`QueueSettings::TICK_MILLIS`].
    #[error("tickMillis: must be a whole number of milliseconds between 10 and 60000")]
    TickMillis,
    /// `tokenTtlSeconds` is outside 1..=604,800 (a week).
    #[error("tokenTtlSeconds: must be between 1 and 604800")]
    TokenTtlSeconds,
    /// `claimTtlSeconds` is outside 1..=86,400 (a day).
    #[error("claimTtlSeconds: must be between 1 and 86400")]
    ClaimTtlSeconds,
    /// `maxActive` is 0 or above [`QueueSettings::MAX_ACTIVE_LIMIT`] (use `null` for no cap).
    #[error("maxActive: must be between 1 and 10000000, or null for no cap")]
    MaxActive,
    /// `abandonAfterSeconds` is outside [`QueueSettings::ABANDON_AFTER_SECONDS`].
    #[error("abandonAfterSeconds: must be between 5 and 86400")]
    AbandonAfterSeconds,
    /// `admitPerSecond × tickMillis` would admit more than [`QueueSettings::MAX_MEMBERS_PER_TICK`] in one
    /// tick: one tick's token preparation and pop would stall the service (defect 5).
    #[error(
        "admitPerSecond: admitPerSecond × tickMillis / 1000 must be at most 100000 members per tick; \
         lower admitPerSecond or tickMillis"
    )]
    MembersPerTick,
    /// `minAdmitPerSecond` is not a finite number in (0, 1,000,000], rounds to 0 milli-members, or is
    /// above `maxAdmitPerSecond`.
    #[error("minAdmitPerSecond: must be a positive number of at most 1000000 and at most maxAdmitPerSecond")]
    MinAdmitPerSecond,
    /// `maxAdmitPerSecond` is not a finite number in (0, 1,000,000].
    #[error("maxAdmitPerSecond: must be a positive number of at most 1000000")]
    MaxAdmitPerSecond,
    /// In adaptive mode, `maxAdmitPerSecond × tickMillis` would admit more than
    /// [`QueueSettings::MAX_MEMBERS_PER_TICK`] in one tick (the fixed rate's rule, for the highest rate the
    /// controller may reach).
    #[error(
        "maxAdmitPerSecond: maxAdmitPerSecond × tickMillis / 1000 must be at most 100000 members per tick; \
         lower maxAdmitPerSecond or tickMillis"
    )]
    AdaptiveMembersPerTick,
    /// `targetP95Millis` is outside [`AdaptiveSettings::TARGET_P95_MILLIS`].
    #[error("targetP95Millis: must be a whole number of milliseconds between 1 and 600000")]
    TargetP95Millis,
    /// `maxErrorRate` is not a finite number in (0, 1].
    #[error("maxErrorRate: must be a number above 0 and at most 1 (0.01 = 1%)")]
    MaxErrorRate,
    /// `powDifficulty` is outside [`POW_DIFFICULTY`].
    #[error("powDifficulty: must be a whole number of leading zero bits between 0 and 32")]
    PowDifficulty,
}

impl SettingsError {
    /// The JSON field the error is about.
    #[must_use]
    pub fn field(&self) -> &'static str {
        match self {
            SettingsError::AdmitPerSecond => "admitPerSecond",
            SettingsError::TickMillis => "tickMillis",
            SettingsError::TokenTtlSeconds => "tokenTtlSeconds",
            SettingsError::ClaimTtlSeconds => "claimTtlSeconds",
            SettingsError::MaxActive => "maxActive",
            SettingsError::AbandonAfterSeconds => "abandonAfterSeconds",
            SettingsError::MembersPerTick => "admitPerSecond",
            SettingsError::MinAdmitPerSecond => "minAdmitPerSecond",
            SettingsError::MaxAdmitPerSecond | SettingsError::AdaptiveMembersPerTick => "maxAdmitPerSecond",
            SettingsError::TargetP95Millis => "targetP95Millis",
            SettingsError::MaxErrorRate => "maxErrorRate",
            SettingsError::PowDifficulty => "powDifficulty",
        }
    }
}

impl QueueSettings {
    /// The most members one tick may admit (SPEC 2.1): `admit_per_second × tick` above this is refused.
    pub const MAX_MEMBERS_PER_TICK: u64 = 100_000;
    /// Allowed `tickMillis`: the scheduler looks every 50 ms by default, so a shorter tick means nothing, and
    /// a tick longer than a minute turns the rate into rare floods.
    pub const TICK_MILLIS: std::ops::RangeInclusive<u64> = 10..=60_000;
    /// Largest `maxActive`; a bigger cap is no cap (and must stay exact as a Lua number).
    pub const MAX_ACTIVE_LIMIT: u64 = 10_000_000;
    /// Allowed `abandonAfterSeconds`: below 5 s (the slowest polling tier) a member polling as told could
    /// be dropped; above a day it means never.
    pub const ABANDON_AFTER_SECONDS: std::ops::RangeInclusive<u64> = 5..=86_400;

    /// Members one tick admits at most: `admit_per_second × tick`, rounded up, at least one.
    #[must_use]
    pub fn members_per_tick(&self) -> u64 {
        (self.admit_rate_milli().saturating_mul(self.tick_millis))
            .div_ceil(1_000_000)
            .max(1)
    }

    /// Checks every rule of SPEC 2.1.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if !(self.admit_per_second.is_finite() && self.admit_per_second > 0.0 && self.admit_per_second <= 1e6)
        {
            return Err(SettingsError::AdmitPerSecond);
        }
        // A rate below one member per thousand seconds rounds to zero in the budget's milli-member units.
        if self.admit_rate_milli() == 0 {
            return Err(SettingsError::AdmitPerSecond);
        }
        if !Self::TICK_MILLIS.contains(&self.tick_millis) {
            return Err(SettingsError::TickMillis);
        }
        if !(1..=604_800).contains(&self.token_ttl_seconds) {
            return Err(SettingsError::TokenTtlSeconds);
        }
        if !(1..=86_400).contains(&self.claim_ttl_seconds) {
            return Err(SettingsError::ClaimTtlSeconds);
        }
        if self
            .max_active
            .is_some_and(|cap| cap == 0 || cap > Self::MAX_ACTIVE_LIMIT)
        {
            return Err(SettingsError::MaxActive);
        }
        if !Self::ABANDON_AFTER_SECONDS.contains(&self.abandon_after_seconds) {
            return Err(SettingsError::AbandonAfterSeconds);
        }
        if self.members_per_tick() > Self::MAX_MEMBERS_PER_TICK {
            return Err(SettingsError::MembersPerTick);
        }
        if !POW_DIFFICULTY.contains(&self.entry.pow_difficulty) {
            return Err(SettingsError::PowDifficulty);
        }
        self.validate_adaptive()
    }

    /// The adaptive fields' rules: checked in either mode, so a queue can be switched to adaptive later
    /// without surprises, except the per-tick cap of the maximum rate, which only binds in adaptive mode
    /// (a fixed queue with a long tick need not care about a maximum it never uses).
    fn validate_adaptive(&self) -> Result<(), SettingsError> {
        let adaptive = &self.adaptive;
        let rate_ok =
            |rate: f64| rate.is_finite() && rate > 0.0 && rate <= 1e6 && (rate * 1000.0).round() >= 1.0;
        if !rate_ok(adaptive.max_admit_per_second) {
            return Err(SettingsError::MaxAdmitPerSecond);
        }
        if !rate_ok(adaptive.min_admit_per_second)
            || adaptive.min_admit_per_second > adaptive.max_admit_per_second
        {
            return Err(SettingsError::MinAdmitPerSecond);
        }
        if !AdaptiveSettings::TARGET_P95_MILLIS.contains(&adaptive.target_p95_millis) {
            return Err(SettingsError::TargetP95Millis);
        }
        if !(adaptive.max_error_rate.is_finite()
            && adaptive.max_error_rate > 0.0
            && adaptive.max_error_rate <= 1.0)
        {
            return Err(SettingsError::MaxErrorRate);
        }
        if adaptive.is_adaptive() {
            let per_tick = ((adaptive.max_admit_per_second * 1000.0).round() as u64)
                .saturating_mul(self.tick_millis)
                .div_ceil(1_000_000);
            if per_tick > Self::MAX_MEMBERS_PER_TICK {
                return Err(SettingsError::AdaptiveMembersPerTick);
            }
        }
        Ok(())
    }

    /// The rate the budget spends now: `admitPerSecond`, which in adaptive mode is the controller's.
    #[must_use]
    pub fn effective_admit_per_second(&self) -> f64 {
        self.admit_per_second
    }

    /// The admission rate in milli-members per second, the integer unit the budget counts in.
    #[must_use]
    pub fn admit_rate_milli(&self) -> u64 {
        (self.admit_per_second * 1000.0).round() as u64
    }

    /// Token lifetime in milliseconds.
    #[must_use]
    pub fn token_ttl_millis(&self) -> i64 {
        self.token_ttl_seconds as i64 * 1000
    }

    /// How long a waiting member may go unseen before it is dropped, in milliseconds.
    #[must_use]
    pub fn abandon_after_millis(&self) -> i64 {
        self.abandon_after_seconds as i64 * 1000
    }

    /// How much later than `abandon_after_millis` an unseen member may be dropped: a twentieth of it, at
    /// most a minute (15 s at the default 300 s, 250 ms at the shortest 5 s). A sign of life moves the
    /// abandonment deadline only when it would fall short of `seen + abandon_after_millis`, and then to
    /// that plus this slack, so a member polling every few seconds rewrites its deadline once per slack
    /// instead of on every poll: on Redis that write was a `ZADD` into a set as large as the queue, a fifth
    /// of a poll's cost (issue 13). `queue_base.lua`'s `touch_waiting` states the same rule.
    #[must_use]
    pub fn abandon_slack_millis(&self) -> i64 {
        (self.abandon_after_millis() / 20).min(60_000)
    }

    /// Claim lifetime in milliseconds.
    #[must_use]
    pub fn claim_ttl_millis(&self) -> i64 {
        self.claim_ttl_seconds as i64 * 1000
    }

    /// Applies a partial update and validates the result; on error `self` is unchanged.
    pub fn apply(&mut self, patch: &SettingsPatch) -> Result<(), SettingsError> {
        let mut next = self.clone();
        if let Some(value) = patch.admit_per_second {
            next.admit_per_second = value;
        }
        if let Some(value) = patch.tick_millis {
            next.tick_millis = value;
        }
        if let Some(value) = patch.token_ttl_seconds {
            next.token_ttl_seconds = value;
        }
        if let Some(value) = patch.claim_ttl_seconds {
            next.claim_ttl_seconds = value;
        }
        if let Some(value) = patch.max_active {
            next.max_active = value;
        }
        if let Some(value) = patch.paused {
            next.paused = value;
        }
        if let Some(value) = patch.fail_mode {
            next.fail_mode = value;
        }
        if let Some(value) = patch.abandon_after_seconds {
            next.abandon_after_seconds = value;
        }
        if let Some(value) = patch.admission_mode {
            next.adaptive.admission_mode = value;
        }
        if let Some(value) = patch.min_admit_per_second {
            next.adaptive.min_admit_per_second = value;
        }
        if let Some(value) = patch.max_admit_per_second {
            next.adaptive.max_admit_per_second = value;
        }
        if let Some(value) = patch.target_p95_millis {
            next.adaptive.target_p95_millis = value;
        }
        if let Some(value) = patch.max_error_rate {
            next.adaptive.max_error_rate = value;
        }
        if let Some(value) = patch.entry_challenge {
            next.entry.entry_challenge = value;
        }
        if let Some(value) = patch.pow_difficulty {
            next.entry.pow_difficulty = value;
        }
        next.validate()?;
        if next.adaptive.is_adaptive() {
            // The controller's rate starts (or stays) inside the bounds the admin just gave.
            next.admit_per_second = next.adaptive.clamp_rate(next.admit_per_second);
        }
        *self = next;
        Ok(())
    }
}

/// A partial settings update: every field optional. Unknown fields are ignored so a client can PUT back
/// what it got from GET (which also carries the live counters).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SettingsPatch {
    /// New `admitPerSecond`.
    pub admit_per_second: Option<f64>,
    /// New `tickMillis`.
    pub tick_millis: Option<u64>,
    /// New `tokenTtlSeconds`.
    pub token_ttl_seconds: Option<u64>,
    /// New `claimTtlSeconds`.
    pub claim_ttl_seconds: Option<u64>,
    /// Absent: keep; `null`: no cap; a number: the cap.
    #[serde(default, deserialize_with = "deserialize_present")]
    pub max_active: Option<Option<u64>>,
    /// New `paused`.
    pub paused: Option<bool>,
    /// New `failMode`.
    pub fail_mode: Option<FailMode>,
    /// New `abandonAfterSeconds`.
    pub abandon_after_seconds: Option<u64>,
    /// New `admissionMode`.
    pub admission_mode: Option<AdmissionMode>,
    /// New `minAdmitPerSecond`.
    pub min_admit_per_second: Option<f64>,
    /// New `maxAdmitPerSecond`.
    pub max_admit_per_second: Option<f64>,
    /// New `targetP95Millis`.
    pub target_p95_millis: Option<u64>,
    /// New `maxErrorRate`.
    pub max_error_rate: Option<f64>,
    /// New `entryChallenge`.
    pub entry_challenge: Option<EntryChallenge>,
    /// New `powDifficulty`.
    pub pow_difficulty: Option<u32>,
}

impl SettingsPatch {
    /// A patch that sets every field to `settings`' value: writing a queue's whole settings again (a
    /// queue a store lost, made again as it was).
    #[must_use]
    pub fn from_settings(settings: &QueueSettings) -> SettingsPatch {
        SettingsPatch {
            admit_per_second: Some(settings.admit_per_second),
            tick_millis: Some(settings.tick_millis),
            token_ttl_seconds: Some(settings.token_ttl_seconds),
            claim_ttl_seconds: Some(settings.claim_ttl_seconds),
            max_active: Some(settings.max_active),
            paused: Some(settings.paused),
            fail_mode: Some(settings.fail_mode),
            abandon_after_seconds: Some(settings.abandon_after_seconds),
            admission_mode: Some(settings.adaptive.admission_mode),
            min_admit_per_second: Some(settings.adaptive.min_admit_per_second),
            max_admit_per_second: Some(settings.adaptive.max_admit_per_second),
            target_p95_millis: Some(settings.adaptive.target_p95_millis),
            max_error_rate: Some(settings.adaptive.max_error_rate),
            entry_challenge: Some(settings.entry.entry_challenge),
            pow_difficulty: Some(settings.entry.pow_difficulty),
        }
    }
}

/// Writes `50` rather than `50.0` for whole rates, so clients that compare with an integer see what they PUT.
fn serialize_whole_as_integer<S: serde::Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
    if value.fract() == 0.0 && value.abs() < 9.0e15 {
        serializer.serialize_i64(*value as i64)
    } else {
        serializer.serialize_f64(*value)
    }
}

/// Distinguishes a present `null` (`Some(None)`) from an absent field (`None`, via `#[serde(default)]`).
fn deserialize_present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Option<u64>>, D::Error> {
    Option::<u64>::deserialize(deserializer).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_spec_table() {
        let settings = QueueSettings::default();
        assert_eq!(settings.admit_per_second, 50.0);
        assert_eq!(settings.tick_millis, 1000);
        assert_eq!(settings.token_ttl_seconds, 300);
        assert_eq!(settings.claim_ttl_seconds, 30);
        assert_eq!(settings.max_active, None);
        assert!(!settings.paused);
        assert_eq!(settings.fail_mode, FailMode::Closed);
        assert_eq!(settings.abandon_after_seconds, 300);
        assert_eq!(settings.validate(), Ok(()));
    }

    #[test]
    fn the_abandonment_slack_is_a_twentieth_and_at_most_a_minute() {
        let slack = |abandon_after_seconds| {
            QueueSettings {
                abandon_after_seconds,
                ..QueueSettings::default()
            }
            .abandon_slack_millis()
        };
        assert_eq!(slack(5), 250);
        assert_eq!(slack(300), 15_000);
        assert_eq!(slack(1_200), 60_000);
        assert_eq!(slack(86_400), 60_000);
    }

    #[test]
    fn partial_patch_keeps_other_fields_and_max_active_is_tri_state() {
        let mut settings = QueueSettings::default();
        let patch: SettingsPatch = serde_json::from_str(r#"{"maxActive": 10, "paused": true}"#).unwrap();
        settings.apply(&patch).unwrap();
        assert_eq!(settings.max_active, Some(10));
        assert!(settings.paused);
        assert_eq!(settings.admit_per_second, 50.0);

        let keep: SettingsPatch = serde_json::from_str(r#"{"tickMillis": 500}"#).unwrap();
        settings.apply(&keep).unwrap();
        assert_eq!(settings.max_active, Some(10));

        let clear: SettingsPatch = serde_json::from_str(r#"{"maxActive": null}"#).unwrap();
        settings.apply(&clear).unwrap();
        assert_eq!(settings.max_active, None);
    }

    #[test]
    fn invalid_values_are_rejected_and_change_nothing() {
        let mut settings = QueueSettings::default();
        for (json, field) in [
            (r#"{"admitPerSecond": 0}"#, "admitPerSecond"),
            (r#"{"admitPerSecond": -3}"#, "admitPerSecond"),
            (r#"{"tickMillis": 0}"#, "tickMillis"),
            (r#"{"tokenTtlSeconds": 0}"#, "tokenTtlSeconds"),
            (r#"{"claimTtlSeconds": 0}"#, "claimTtlSeconds"),
            (r#"{"maxActive": 0}"#, "maxActive"),
            (r#"{"maxActive": 10000001}"#, "maxActive"),
            (r#"{"tickMillis": 3600000}"#, "tickMillis"),
            (r#"{"tickMillis": 5}"#, "tickMillis"),
            (r#"{"tokenTtlSeconds": 604801}"#, "tokenTtlSeconds"),
            (r#"{"claimTtlSeconds": 86401}"#, "claimTtlSeconds"),
            (r#"{"admitPerSecond": 1e7}"#, "admitPerSecond"),
            (r#"{"abandonAfterSeconds": 4}"#, "abandonAfterSeconds"),
            (r#"{"abandonAfterSeconds": 86401}"#, "abandonAfterSeconds"),
            (r#"{"minAdmitPerSecond": 0}"#, "minAdmitPerSecond"),
            (r#"{"minAdmitPerSecond": 2000}"#, "minAdmitPerSecond"),
            (r#"{"minAdmitPerSecond": 0.0001}"#, "minAdmitPerSecond"),
            (r#"{"maxAdmitPerSecond": -1}"#, "maxAdmitPerSecond"),
            (r#"{"maxAdmitPerSecond": 1e7}"#, "maxAdmitPerSecond"),
            (r#"{"maxAdmitPerSecond": 0.5}"#, "minAdmitPerSecond"),
            (r#"{"targetP95Millis": 0}"#, "targetP95Millis"),
            (r#"{"targetP95Millis": 600001}"#, "targetP95Millis"),
            (r#"{"maxErrorRate": 0}"#, "maxErrorRate"),
            (r#"{"maxErrorRate": 1.5}"#, "maxErrorRate"),
            (
                r#"{"admissionMode": "adaptive", "maxAdmitPerSecond": 200000}"#,
                "maxAdmitPerSecond",
            ),
            (
                r#"{"admissionMode": "adaptive", "maxAdmitPerSecond": 2000, "tickMillis": 60000}"#,
                "maxAdmitPerSecond",
            ),
        ] {
            let patch: SettingsPatch = serde_json::from_str(json).unwrap();
            let error = settings.apply(&patch).unwrap_err();
            assert_eq!(error.field(), field, "{json}");
            assert_eq!(settings, QueueSettings::default());
        }
    }

    /// Defect 5: `{"admitPerSecond":1000000,"tickMillis":3600000}` was accepted, and one tick then tried to
    /// prepare 3.6 billion tokens. Rate × tick above 100,000 members is refused, naming the rate, whichever
    /// of the two a patch changes; exactly 100,000 is allowed.
    #[test]
    fn a_rate_times_tick_above_100000_members_per_tick_is_refused() {
        let mut settings = QueueSettings::default();
        for json in [
            r#"{"admitPerSecond": 1000000, "tickMillis": 60000}"#,
            r#"{"admitPerSecond": 100001}"#,
            r#"{"admitPerSecond": 2000, "tickMillis": 60000}"#,
        ] {
            let patch: SettingsPatch = serde_json::from_str(json).unwrap();
            let error = settings.apply(&patch).unwrap_err();
            assert_eq!(error, SettingsError::MembersPerTick, "{json}");
            assert_eq!(error.field(), "admitPerSecond");
            assert!(error.to_string().contains("100000 members per tick"), "{error}");
            assert_eq!(
                settings,
                QueueSettings::default(),
                "an invalid patch changes nothing"
            );
        }
        let at_the_cap: SettingsPatch =
            serde_json::from_str(r#"{"admitPerSecond": 100000, "tickMillis": 1000}"#).unwrap();
        settings.apply(&at_the_cap).unwrap();
        assert_eq!(settings.members_per_tick(), 100_000);
        // With the rate at the cap, a longer tick is refused too.
        let longer: SettingsPatch = serde_json::from_str(r#"{"tickMillis": 1001}"#).unwrap();
        assert_eq!(settings.apply(&longer), Err(SettingsError::MembersPerTick));
    }

    #[test]
    fn adaptive_mode_clamps_the_rate_into_its_bounds_and_round_trips_through_json() {
        let mut settings = QueueSettings::default();
        let patch: SettingsPatch = serde_json::from_str(
            r#"{"admissionMode": "adaptive", "minAdmitPerSecond": 5, "maxAdmitPerSecond": 20}"#,
        )
        .unwrap();
        settings.apply(&patch).unwrap();
        assert_eq!(settings.admit_per_second, 20.0, "50 clamped to the maximum");
        assert_eq!(settings.effective_admit_per_second(), 20.0);
        let json = serde_json::to_string(&settings).unwrap();
        let back: QueueSettings = serde_json::from_str(&json).unwrap();
        assert_eq!(back, settings);
        // Settings stored before issue 12 read fixed mode and the defaults.
        let old: QueueSettings = serde_json::from_str(
            r#"{"admitPerSecond": 50, "tickMillis": 1000, "tokenTtlSeconds": 300, "claimTtlSeconds": 30,
                "maxActive": null, "paused": false, "failMode": "closed"}"#,
        )
        .unwrap();
        assert_eq!(old.adaptive, AdaptiveSettings::default());
        // A fixed queue with a long tick is not bound by the adaptive maximum it does not use.
        let mut fixed = QueueSettings::default();
        let long_tick: SettingsPatch =
            serde_json::from_str(r#"{"tickMillis": 60000, "admitPerSecond": 10}"#).unwrap();
        fixed.apply(&long_tick).unwrap();
    }

    #[test]
    fn settings_serialize_in_the_spec_shape() {
        let json = serde_json::to_value(QueueSettings::default()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"admitPerSecond": 50, "tickMillis": 1000, "tokenTtlSeconds": 300,
                "claimTtlSeconds": 30, "maxActive": null, "paused": false, "failMode": "closed",
                "abandonAfterSeconds": 300, "admissionMode": "fixed", "minAdmitPerSecond": 1.0,
                "maxAdmitPerSecond": 1000.0, "targetP95Millis": 500, "maxErrorRate": 0.01,
                "entryChallenge": "none", "powDifficulty": 18})
        );
    }

    #[test]
    fn entry_challenge_settings_patch_validate_and_leave_the_rest() {
        let mut settings = QueueSettings::default();
        let patch: SettingsPatch =
            serde_json::from_str(r#"{"entryChallenge": "pow", "powDifficulty": 22}"#).unwrap();
        settings.apply(&patch).unwrap();
        assert_eq!(
            settings.entry,
            EntryChallengeSettings {
                entry_challenge: EntryChallenge::Pow,
                pow_difficulty: 22
            }
        );
        assert_eq!(settings.admit_per_second, 50.0);
        let too_hard: SettingsPatch = serde_json::from_str(r#"{"powDifficulty": 33}"#).unwrap();
        assert_eq!(settings.apply(&too_hard), Err(SettingsError::PowDifficulty));
        assert_eq!(
            settings.entry.pow_difficulty, 22,
            "an invalid patch changes nothing"
        );
        assert_eq!(SettingsError::PowDifficulty.field(), "powDifficulty");
        let again = SettingsPatch::from_settings(&settings);
        let mut copy = QueueSettings::default();
        copy.apply(&again).unwrap();
        assert_eq!(copy, settings, "a lost queue made again keeps its challenge");
    }
}
