//! Entry guards (SPEC 2.2, "Entry challenges" and "Per-address budgets"; issue 28): what an entry that
//! would make a **new** member must get past. A member's own re-entries (shown by its ticket) pass
//! untouched; so does everything in a queue whose guards are off.
//!
//! ```text
//! entry of a new member ─► challenge (queue's entryChallenge)
//!                           pow:     signature, expiry, queue, address, difficulty, then one SHA-256
//!                                    (microseconds, no store) ─► spent once (the limiter, 1 per 2 min)
//!                           captcha: the provider's siteverify (bounded; unreachable → fail mode)
//!                        ─► budget: entries_per_address_per_minute for (queue, client address), on the
//!                           store's sliding-window limiter (global across instances on Redis)
//!                        ─► enter
//! ```
//!
//! A challenge is stateless: `1.<difficulty>.<expires, unix s>.<16 random bytes, hex>.<tag, hex>`, where
//! the tag is HMAC-SHA-256 (truncated to 128 bits) under a key derived from the token secret, over the
//! queue, the client's [`AddressKey`] and the rest of the string. So every instance sharing the secret
//! checks any instance's challenge, a challenge fetched from one address or for one queue is refused for
//! another, and nothing is stored until a solution is spent. The characters are `[0-9a-f.]`, never the
//! `:` that separates the challenge from its nonce in `X-Queue-Challenge`.
//!
//! Refusals are JSON naming the reason (`challenge`, `address`, `captcha`) and are counted
//! (`WaitingRoom::count_refusal`).

use std::collections::HashMap;
use std::net::IpAddr;

use axum::http::StatusCode;
use parking_lot::Mutex;
use rankgate_core::limiter::{RateDecision, RateLimit};
use rankgate_core::queue::challenge::{self, EntryChallengeSettings};
use rankgate_core::queue::draw::hmac_sha256;
use rankgate_core::queue::{FailMode, QueueName, QueueSettings, RefusalReason};
use rankgate_store::queue::token::TokenSecret;
use rankgate_store::queue::{RateLimiter, RateLimiterKind};
use serde_json::json;
use subtle::ConstantTimeEq as _;

use super::captcha::{Captcha, Verdict, MAX_CAPTCHA_TOKEN_BYTES};
use crate::http::error::{ApiError, ApiResult, Refusal};
use crate::http::fast_path::DirectHeaders;
use crate::http::peer::AddressKey;

/// The header that carries a solution: `X-Queue-Challenge: <challenge>:<nonce>`.
pub const CHALLENGE_HEADER: &str = "x-queue-challenge";
/// How long a challenge may be solved and spent (SPEC 2.2: 60 s).
pub const CHALLENGE_TTL_SECONDS: i64 = 60;
/// How long a spent challenge is remembered: past its expiry, so it can never be spent twice.
const SPENT_MEMORY_MILLIS: i64 = 2 * CHALLENGE_TTL_SECONDS * 1000;
/// Longest challenge string accepted (an issued one is about 80 characters).
const MAX_CHALLENGE_BYTES: usize = 128;
/// How long an instance trusts its copy of a queue's challenge settings: a change reaches every
/// instance within this, and an entry does not pay a store read for them.
const SETTINGS_CACHE_MILLIS: i64 = 1000;
/// Allowed `entries_per_address_per_minute` (0 turns the budget off).
pub const MAX_ENTRIES_PER_ADDRESS_PER_MINUTE: u32 = 1_000_000;
/// The budget's window.
const BUDGET_WINDOW_MILLIS: i64 = 60_000;
/// The budget limiter's buckets per window (its sliding-window counter).
const BUDGET_BUCKETS: u32 = 12;

const CHALLENGE_KEY_LABEL: &[u8] = b"rankgate entry challenge key v1";

/// What an entry showed to get past the guards, as sent (unchecked).
#[derive(Debug, Clone, Copy, Default)]
pub struct EntryEvidence<'a> {
    /// A proof-of-work challenge and the nonce solving it.
    pub solution: Option<(&'a str, &'a str)>,
    /// The CAPTCHA widget's token.
    pub captcha_token: Option<&'a str>,
}

impl<'a> EntryEvidence<'a> {
    /// What `X-Queue-Challenge` carries (the body's fields, when present, are given by the caller).
    #[must_use]
    pub fn of_headers(headers: &DirectHeaders<'a>) -> EntryEvidence<'a> {
        let solution = headers
            .get_bytes(CHALLENGE_HEADER)
            .and_then(|raw| std::str::from_utf8(raw).ok())
            .and_then(|raw| raw.trim().rsplit_once(':'));
        EntryEvidence {
            solution,
            captcha_token: None,
        }
    }
}

/// A challenge as `GET /v1/queues/{queue}/challenge` answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedChallenge {
    /// The opaque challenge string.
    pub challenge: String,
    /// Leading zero bits a solution needs.
    pub difficulty: u32,
    /// When it expires (unix ms).
    pub expires_at_ms: i64,
}

impl IssuedChallenge {
    /// The JSON object of the challenge route and of a 428.
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "kind": "pow",
            "challenge": self.challenge,
            "difficulty": self.difficulty,
            "algorithm": "sha256",
            "expiresAt": super::service::rfc3339(self.expires_at_ms),
        })
    }
}

/// Why a solution was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChallengeRefusal {
    /// No solution came.
    Missing,
    /// Not a challenge string, or a nonce that is not 1–20 digits.
    Malformed,
    /// Issued for another queue, another address or another deployment (or tampered with).
    Foreign,
    /// Past its 60 s.
    Expired,
    /// Issued at a lower difficulty than the queue asks now.
    TooEasy,
    /// The nonce does not solve it.
    Unsolved,
    /// Already spent by an earlier entry.
    Replayed,
}

impl ChallengeRefusal {
    fn message(self) -> &'static str {
        match self {
            ChallengeRefusal::Missing => {
                "X-Queue-Challenge: missing; this queue asks new entries for a proof of work: GET \
                 /v1/queues/{queue}/challenge, find a nonce (see the challenge object), then enter with \
                 X-Queue-Challenge: <challenge>:<nonce>"
            }
            ChallengeRefusal::Malformed => {
                "X-Queue-Challenge: not <challenge>:<nonce> with a challenge this queue issued and a nonce of \
                 1 to 20 digits; solve the challenge in this answer"
            }
            ChallengeRefusal::Foreign => {
                "X-Queue-Challenge: the challenge was issued for another queue or another client address (or \
                 was altered); solve the challenge in this answer"
            }
            ChallengeRefusal::Expired => {
                "X-Queue-Challenge: the challenge expired (they last 60 s); solve the challenge in this answer"
            }
            ChallengeRefusal::TooEasy => {
                "X-Queue-Challenge: the queue now asks a higher difficulty; solve the challenge in this answer"
            }
            ChallengeRefusal::Unsolved => {
                "X-Queue-Challenge: the nonce does not solve the challenge (SHA-256 of \"<challenge>:<nonce>\" \
                 must start with difficulty zero bits); solve the challenge in this answer"
            }
            ChallengeRefusal::Replayed => {
                "X-Queue-Challenge: this solution was already used; each challenge admits one entry; solve \
                 the challenge in this answer"
            }
        }
    }
}

/// Signs and checks challenges; the key is derived from the token secret.
#[derive(Clone)]
pub struct ChallengeKey([u8; 32]);

impl std::fmt::Debug for ChallengeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChallengeKey(…)")
    }
}

impl ChallengeKey {
    /// The key derived from `secret`.
    #[must_use]
    pub fn derived_from(secret: &TokenSecret) -> ChallengeKey {
        ChallengeKey(hmac_sha256(&secret.to_bytes(), CHALLENGE_KEY_LABEL))
    }

    fn tag(&self, queue: &QueueName, address: &str, body: &str) -> [u8; 16] {
        let mut message = Vec::with_capacity(8 + queue.as_str().len() + address.len() + body.len());
        for part in [queue.as_str(), address, body] {
            message.extend_from_slice(&(part.len() as u32).to_be_bytes());
            message.extend_from_slice(part.as_bytes());
        }
        let full = hmac_sha256(&self.0, &message);
        let mut tag = [0u8; 16];
        tag.copy_from_slice(&full[..16]);
        tag
    }

    /// A fresh challenge for `queue` and `address` at `difficulty`, expiring 60 s after `now_ms`.
    #[must_use]
    pub fn issue(&self, queue: &QueueName, address: &str, difficulty: u32, now_ms: i64) -> IssuedChallenge {
        let random: [u8; 16] = rand::random();
        let expires_s = now_ms.div_euclid(1000) + CHALLENGE_TTL_SECONDS;
        let body = format!("1.{difficulty}.{expires_s}.{}", hex::encode(random));
        let tag = hex::encode(self.tag(queue, address, &body));
        IssuedChallenge {
            challenge: format!("{body}.{tag}"),
            difficulty,
            expires_at_ms: expires_s * 1000,
        }
    }

    /// Checks a solution for `queue` from `address` against the queue's current `difficulty`. Ok gives
    /// the challenge's random part, the key under which it is spent once. Costs one HMAC and one SHA-256.
    pub fn check(
        &self,
        challenge: &str,
        nonce: &str,
        queue: &QueueName,
        address: &str,
        difficulty: u32,
        now_ms: i64,
    ) -> Result<String, ChallengeRefusal> {
        if challenge.len() > MAX_CHALLENGE_BYTES || !challenge::nonce_is_well_formed(nonce) {
            return Err(ChallengeRefusal::Malformed);
        }
        let (body, tag) = challenge.rsplit_once('.').ok_or(ChallengeRefusal::Malformed)?;
        let mut parts = body.split('.');
        let (Some("1"), Some(issued_difficulty), Some(expires_s), Some(random), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(ChallengeRefusal::Malformed);
        };
        let tag = hex::decode(tag).map_err(|_| ChallengeRefusal::Malformed)?;
        let issued_difficulty: u32 = issued_difficulty
            .parse()
            .map_err(|_| ChallengeRefusal::Malformed)?;
        let expires_s: i64 = expires_s.parse().map_err(|_| ChallengeRefusal::Malformed)?;
        if tag.len() != 16 || random.len() != 32 {
            return Err(ChallengeRefusal::Malformed);
        }
        if !bool::from(self.tag(queue, address, body).ct_eq(&tag[..])) {
            return Err(ChallengeRefusal::Foreign);
        }
        if now_ms >= expires_s.saturating_mul(1000) {
            return Err(ChallengeRefusal::Expired);
        }
        if issued_difficulty < difficulty {
            return Err(ChallengeRefusal::TooEasy);
        }
        if !challenge::solves(challenge, nonce, issued_difficulty) {
            return Err(ChallengeRefusal::Unsolved);
        }
        Ok(random.to_owned())
    }
}

/// What the guards read of a queue's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardSettings {
    /// `entryChallenge` and `powDifficulty`.
    pub entry: EntryChallengeSettings,
    /// `failMode`, for an unreachable CAPTCHA verifier.
    pub fail_mode: FailMode,
}

/// The guards of a room: the challenge key, the per-address budget, the CAPTCHA hook, and each queue's
/// settings as this instance last read them (for their `entryChallenge`, `powDifficulty`, `failMode`).
pub struct EntryGuards {
    key: ChallengeKey,
    budget_per_minute: u32,
    captcha: Option<Captcha>,
    settings: Mutex<HashMap<QueueName, (i64, GuardSettings)>>,
}

impl std::fmt::Debug for EntryGuards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryGuards")
            .field("budget_per_minute", &self.budget_per_minute)
            .field("captcha", &self.captcha)
            .finish_non_exhaustive()
    }
}

/// Most queues whose challenge settings an instance keeps a copy of (beyond, the copy starts over).
const MAX_CACHED_QUEUES: usize = 10_000;

impl EntryGuards {
    /// The guards: `budget_per_minute` 0 turns the budget off.
    #[must_use]
    pub fn new(key: ChallengeKey, budget_per_minute: u32, captcha: Option<Captcha>) -> EntryGuards {
        EntryGuards {
            key,
            budget_per_minute,
            captcha,
            settings: Mutex::new(HashMap::new()),
        }
    }

    /// The challenge key.
    #[must_use]
    pub fn key(&self) -> &ChallengeKey {
        &self.key
    }

    /// The CAPTCHA hook, when configured.
    #[must_use]
    pub fn captcha(&self) -> Option<&Captcha> {
        self.captcha.as_ref()
    }

    /// Whether any guard may apply to some queue: the budget is on (a queue's challenge is read only
    /// when this is asked for a queue, see [`EntryGuards::cached_settings`]).
    #[must_use]
    pub fn budget_is_on(&self) -> bool {
        self.budget_per_minute > 0
    }

    /// This instance's copy of `queue`'s guard settings, if fresh (read within the last second).
    pub fn cached_settings(&self, queue: &QueueName, now_ms: i64) -> Option<GuardSettings> {
        let settings = self.settings.lock();
        let (read_at, value) = settings.get(queue)?;
        (now_ms - read_at < SETTINGS_CACHE_MILLIS && now_ms >= *read_at).then_some(*value)
    }

    /// Keeps a copy of `queue`'s guard settings, from its settings read at `now_ms`.
    pub fn remember_settings(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
        now_ms: i64,
    ) -> GuardSettings {
        let value = GuardSettings {
            entry: settings.entry,
            fail_mode: settings.fail_mode,
        };
        let mut settings = self.settings.lock();
        if settings.len() >= MAX_CACHED_QUEUES && !settings.contains_key(queue) {
            settings.clear();
        }
        settings.insert(queue.clone(), (now_ms, value));
        value
    }

    /// Checks a proof-of-work solution and spends it; the refusal (428) carries a fresh challenge. The
    /// error's refusal is `None` when the store could not be asked (a 503, not a refusal).
    pub async fn pass_challenge(
        &self,
        limiter: &dyn RateLimiter,
        queue: &QueueName,
        address: &str,
        difficulty: u32,
        evidence: &EntryEvidence<'_>,
        now_ms: i64,
    ) -> Result<(), (Option<ChallengeRefusal>, ApiError)> {
        let refused = |refusal: ChallengeRefusal| {
            let fresh = self.key.issue(queue, address, difficulty, now_ms);
            let mut extra = serde_json::Map::new();
            extra.insert("challenge".into(), fresh.to_json());
            (
                Some(refusal),
                ApiError::Refused(Box::new(Refusal {
                    status: StatusCode::PRECONDITION_REQUIRED,
                    message: refusal.message().replace("{queue}", queue.as_str()),
                    reason: RefusalReason::Challenge.as_str(),
                    retry_after_secs: None,
                    extra,
                })),
            )
        };
        let Some((challenge, nonce)) = evidence.solution else {
            return Err(refused(ChallengeRefusal::Missing));
        };
        let random = self
            .key
            .check(challenge, nonce, queue, address, difficulty, now_ms)
            .map_err(refused)?;
        let spent = limiter
            .try_acquire(
                &format!("challenge-spent:{random}"),
                RateLimit {
                    limit: 1,
                    window_ms: SPENT_MEMORY_MILLIS,
                },
                RateLimiterKind::SlidingLog,
            )
            .await
            .map_err(|error| (None, super::service::store_error(error)))?;
        match spent {
            RateDecision::Allowed { .. } => Ok(()),
            RateDecision::Limited { .. } => Err(refused(ChallengeRefusal::Replayed)),
        }
    }

    /// Asks the CAPTCHA provider about the entry's token. `Ok(())` lets the entry in (a pass, or an
    /// unreachable verifier under fail mode `open`).
    pub async fn pass_captcha(
        &self,
        http: &reqwest::Client,
        queue_fail_mode: FailMode,
        evidence: &EntryEvidence<'_>,
        client: Option<IpAddr>,
    ) -> ApiResult<()> {
        let Some(captcha) = &self.captcha else {
            return Err(ApiError::Unavailable(
                "this queue asks for a CAPTCHA but this server has no [waiting_room.captcha]; an operator \
                 must configure the provider (or set the queue's entryChallenge to \"none\" or \"pow\")"
                    .into(),
            ));
        };
        let refused = |message: &str| {
            let mut extra = serde_json::Map::new();
            extra.insert(
                "challenge".into(),
                json!({"kind": "captcha", "provider": captcha.provider.name(), "siteKey": captcha.site_key}),
            );
            ApiError::Refused(Box::new(Refusal {
                status: StatusCode::PRECONDITION_REQUIRED,
                message: message.to_owned(),
                reason: RefusalReason::Captcha.as_str(),
                retry_after_secs: None,
                extra,
            }))
        };
        let token = match evidence.captcha_token {
            None | Some("") => {
                return Err(refused(
                    "captchaToken: missing; this queue asks new entries to pass a CAPTCHA: render the \
                     provider's widget with the challenge's siteKey and enter with its token as captchaToken",
                ))
            }
            Some(token) if token.len() > MAX_CAPTCHA_TOKEN_BYTES || token.bytes().any(|b| b < 0x20) => {
                return Err(refused(
                    "captchaToken: not a CAPTCHA token (at most 4096 bytes, no control characters)",
                ))
            }
            Some(token) => token,
        };
        match captcha.verify(http, token, client).await {
            Verdict::Passed => Ok(()),
            Verdict::Failed => Err(refused(
                "captchaToken: the CAPTCHA provider refused this token (wrong, used or expired); solve the \
                 CAPTCHA again",
            )),
            Verdict::Unreachable => match captcha.fail_mode.unwrap_or(queue_fail_mode) {
                FailMode::Open => Ok(()),
                FailMode::Closed => Err(ApiError::Unavailable(
                    "captchaToken: the CAPTCHA provider could not be reached in time; try again shortly"
                        .into(),
                )),
            },
        }
    }

    /// Spends one of `address`'s new members in `queue` this minute; 429 naming the key when spent.
    pub async fn pass_budget(
        &self,
        limiter: &dyn RateLimiter,
        queue: &QueueName,
        address: &str,
    ) -> ApiResult<()> {
        if self.budget_per_minute == 0 {
            return Ok(());
        }
        let decision = limiter
            .try_acquire(
                &budget_key(queue, address),
                RateLimit {
                    limit: self.budget_per_minute,
                    window_ms: BUDGET_WINDOW_MILLIS,
                },
                RateLimiterKind::SlidingWindow {
                    buckets: BUDGET_BUCKETS,
                },
            )
            .await
            .map_err(super::service::store_error)?;
        match decision {
            RateDecision::Allowed { .. } => Ok(()),
            RateDecision::Limited { retry_after_ms } => Err(ApiError::Refused(Box::new(Refusal {
                status: StatusCode::TOO_MANY_REQUESTS,
                message: format!(
                    "entries_per_address_per_minute: this address already made {} new members in this queue \
                     in the last minute; try again later",
                    self.budget_per_minute
                ),
                reason: RefusalReason::Address.as_str(),
                retry_after_secs: Some((retry_after_ms.max(1) as u64).div_ceil(1000)),
                extra: serde_json::Map::new(),
            }))),
        }
    }
}

/// The limiter key of `address`'s budget in `queue` (built without `fmt`: every new member's entry
/// builds one).
fn budget_key(queue: &QueueName, address: &str) -> String {
    const PREFIX: &str = "entries-per-address:";
    let mut key = String::with_capacity(PREFIX.len() + queue.as_str().len() + 1 + address.len());
    key.push_str(PREFIX);
    key.push_str(queue.as_str());
    key.push(':');
    key.push_str(address);
    key
}

/// The budget's and the challenge's key of a client: its [`AddressKey`], or `unknown` when the edge
/// recorded no peer (every such request shares one budget).
#[must_use]
pub fn address_label(client: Option<IpAddr>) -> String {
    client.map_or_else(|| "unknown".to_owned(), |address| AddressKey::of(address).label())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ChallengeKey {
        ChallengeKey::derived_from(&TokenSecret::from_bytes([7; 32]))
    }

    fn queue(name: &str) -> QueueName {
        QueueName::parse(name).unwrap()
    }

    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn an_issued_challenge_solved_checks_and_names_its_spend_key() {
        let issued = key().issue(&queue("drop"), "192.0.2.7", 8, NOW);
        assert!(issued
            .challenge
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'.'));
        assert!(issued.challenge.len() <= MAX_CHALLENGE_BYTES);
        assert_eq!(issued.expires_at_ms, NOW + 60_000);
        let nonce = challenge::solve(&issued.challenge, 8).to_string();
        let spend = key()
            .check(
                &issued.challenge,
                &nonce,
                &queue("drop"),
                "192.0.2.7",
                8,
                NOW + 59_000,
            )
            .unwrap();
        assert_eq!(spend.len(), 32);
    }

    #[test]
    fn a_solution_is_refused_elsewhere_later_or_altered() {
        let issued = key().issue(&queue("drop"), "192.0.2.7", 8, NOW);
        let nonce = challenge::solve(&issued.challenge, 8).to_string();
        let check = |challenge: &str, nonce: &str, name: &str, address: &str, difficulty: u32, at: i64| {
            key().check(challenge, nonce, &queue(name), address, difficulty, at)
        };
        let c = issued.challenge.as_str();
        assert_eq!(
            check(c, &nonce, "other", "192.0.2.7", 8, NOW),
            Err(ChallengeRefusal::Foreign)
        );
        assert_eq!(
            check(c, &nonce, "drop", "192.0.2.8", 8, NOW),
            Err(ChallengeRefusal::Foreign)
        );
        assert_eq!(
            check(c, &nonce, "drop", "192.0.2.7", 8, NOW + 60_000),
            Err(ChallengeRefusal::Expired)
        );
        assert_eq!(
            check(c, &nonce, "drop", "192.0.2.7", 9, NOW),
            Err(ChallengeRefusal::TooEasy)
        );
        // Lowering the difficulty in the challenge breaks its tag.
        let easier = c.replacen("1.8.", "1.0.", 1);
        assert_eq!(
            check(&easier, "0", "drop", "192.0.2.7", 0, NOW),
            Err(ChallengeRefusal::Foreign)
        );
        let foreign = ChallengeKey::derived_from(&TokenSecret::from_bytes([8; 32]));
        assert_eq!(
            foreign.check(c, &nonce, &queue("drop"), "192.0.2.7", 8, NOW),
            Err(ChallengeRefusal::Foreign)
        );
        for (challenge, nonce) in [
            (c, ""),
            (c, "12a"),
            ("1.8.x", "1"),
            ("", "1"),
            (&"1".repeat(200)[..], "1"),
        ] {
            assert_eq!(
                check(challenge, nonce, "drop", "192.0.2.7", 8, NOW),
                Err(ChallengeRefusal::Malformed),
                "{challenge:?} {nonce:?}"
            );
        }
        let wrong = (0..)
            .map(|n: u64| n.to_string())
            .find(|n| !challenge::solves(c, n, 8))
            .unwrap();
        assert_eq!(
            check(c, &wrong, "drop", "192.0.2.7", 8, NOW),
            Err(ChallengeRefusal::Unsolved)
        );
    }

    #[test]
    fn the_header_splits_at_the_last_colon() {
        let mut map = axum::http::HeaderMap::new();
        map.insert(CHALLENGE_HEADER, " 1.8.9.ab.cd:123 ".parse().unwrap());
        let evidence = EntryEvidence::of_headers(&DirectHeaders::Map(&map));
        assert_eq!(evidence.solution, Some(("1.8.9.ab.cd", "123")));
    }

    #[test]
    fn unknown_peers_share_one_label_and_ipv6_counts_by_its_64() {
        assert_eq!(address_label(None), "unknown");
        assert_eq!(
            address_label(Some("2001:db8::1".parse().unwrap())),
            "6:20010db800000000"
        );
    }
}
