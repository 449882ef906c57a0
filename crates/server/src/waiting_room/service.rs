//! [`WaitingRoom`]: the waiting room's service layer, shared by the HTTP handlers, the gate, the workers
//! and the demo.
//!
//! It holds the stores behind their traits (`Arc<dyn QueueStore>` etc.), so the same code runs on the
//! embedded backend or Redis; turns raw credentials into digests (raw tokens never go further, and are never
//! logged); maps store outcomes to [`ApiError`]s; and records metrics.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use parking_lot::Mutex;
use rand::Rng as _;
use rankgate_core::ids::MemberId;
use rankgate_core::limiter::{RateDecision, RateLimit};
use rankgate_core::queue::{
    polling_interval_seconds, polling_tier_seconds, ClaimRejection, ConsumeRejection, FailMode, MemberStatus,
    QueueName, QueueSettings, ReleaseRejection, SettingsPatch,
};
use rankgate_store::clock::Clock;
use rankgate_store::queue::embedded::{EmbeddedOptions, EmbeddedStore};
use rankgate_store::queue::redis::RedisStore;
use rankgate_store::queue::token::{digest_of, new_claim_id, TokenSecret};
use rankgate_store::queue::{
    AdmitOutcome, ClaimOutcome, ConsumeOutcome, JobStore, LastOutcome, LeaveOutcome, MemberView, QueueStats,
    QueueStore, RateLimiter, RateLimiterKind, ReleaseOutcome, StoreError,
};
use serde::Serialize;

use super::adaptive::{AdaptiveControl, ADAPTIVE_INTERVAL_MILLIS, ADAPTIVE_MIN_SAMPLES};
use super::config::WaitingRoomConfig;
use super::member_streams::{MemberStreamLimits, MemberStreams};
use super::telemetry;
use crate::http::error::{ApiError, ApiResult};
use crate::http::json_writer::JsonWriter;

/// The position body of SPEC 2.2.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Position {
    /// `NOT_ENTERED`, `WAITING`, `READY` or `CLAIMED`.
    pub status: MemberStatus,
    /// 0-based rank while WAITING, else `null`.
    pub rank: Option<u64>,
    /// Members waiting in the queue.
    pub current_total_waiting_count: u64,
    /// Seconds until admission at the measured rate, while WAITING (`null` if paused).
    pub estimated_wait_seconds: Option<u64>,
    /// The wait admitted within nine times in ten (from the measured spread of admissions), while
    /// WAITING (`null` if paused); never below `estimatedWaitSeconds`.
    pub estimated_wait_seconds_p90: Option<u64>,
    /// When to poll next: 1/3/5 s by rank plus up to 20% jitter.
    pub polling_interval_seconds: f64,
    /// The entry token, only while READY.
    pub entry_token: Option<String>,
    /// When the token expires (RFC 3339), only while READY.
    pub token_expires_at: Option<String>,
    /// `CONSUMED` while a consumed member is remembered; omitted otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_outcome: Option<&'static str>,
    /// `true` while the member waits in a scheduled opening's pre-queue (rank `null` until the draw);
    /// omitted otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pre_queue: Option<bool>,
    /// The opening's time (RFC 3339) while in the pre-queue; omitted otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opens_at: Option<String>,
}

impl Position {
    /// The body, byte for byte what `serde_json::to_vec` writes for it (a test holds the two together),
    /// written by hand because the poll is the waiting room's hottest answer: the derived form cost a
    /// poll about 2,800 instructions, a fifth of all it costs (see [`crate::http::json_writer`]).
    pub fn to_json(&self) -> bytes::Bytes {
        let mut out = JsonWriter::with_capacity(256);
        out.raw(match self.status {
            MemberStatus::NotEntered => r#"{"status":"NOT_ENTERED","rank":"#,
            MemberStatus::Waiting => r#"{"status":"WAITING","rank":"#,
            MemberStatus::Ready => r#"{"status":"READY","rank":"#,
            MemberStatus::Claimed => r#"{"status":"CLAIMED","rank":"#,
        });
        out.opt_u64(self.rank);
        out.raw(r#","currentTotalWaitingCount":"#);
        out.u64(self.current_total_waiting_count);
        out.raw(r#","estimatedWaitSeconds":"#);
        out.opt_u64(self.estimated_wait_seconds);
        out.raw(r#","estimatedWaitSecondsP90":"#);
        out.opt_u64(self.estimated_wait_seconds_p90);
        out.raw(r#","pollingIntervalSeconds":"#);
        out.f64(self.polling_interval_seconds);
        out.raw(r#","entryToken":"#);
        out.opt_str(self.entry_token.as_deref());
        out.raw(r#","tokenExpiresAt":"#);
        out.opt_str(self.token_expires_at.as_deref());
        if let Some(outcome) = self.last_outcome {
            out.raw(r#","lastOutcome":"#);
            out.str(outcome);
        }
        if let Some(pre_queue) = self.pre_queue {
            out.raw(r#","preQueue":"#);
            out.bool(pre_queue);
        }
        if let Some(opens_at) = &self.opens_at {
            out.raw(r#","opensAt":"#);
            out.str(opens_at);
        }
        out.raw("}");
        out.into_bytes()
    }
}

/// A granted claim (SPEC 2.4).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimGranted {
    /// Present it to consume or release. Shown once; only its hash is stored.
    pub claim_id: String,
    /// When the claim is released automatically (RFC 3339).
    pub expires_at: String,
}

/// The embedded limiter's key of a member's poll limit. Built by hand, as are the two header values
/// below: `format!` was ~2,100 of a poll's ~15,200 instructions (callgrind, `WHAT=position
/// bench/queue_callgrind.sh`).
fn poll_limit_key(queue: &QueueName, member: &MemberId) -> String {
    let (queue, member) = (queue.as_str(), member.as_str());
    let mut key = String::with_capacity("poll:".len() + queue.len() + 1 + member.len());
    key.push_str("poll:");
    key.push_str(queue);
    key.push(':');
    key.push_str(member);
    key
}

/// `{first}{a}{second}{b}`: a `RateLimit-Policy` or `RateLimit` value such as `"poll";q=3;w=3`.
fn rate_limit_value(first: &str, a: u64, second: &str, b: u64) -> String {
    let (mut a_digits, mut b_digits) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (a, b) = (a_digits.format(a), b_digits.format(b));
    let mut value = String::with_capacity(first.len() + a.len() + second.len() + b.len());
    value.push_str(first);
    value.push_str(a);
    value.push_str(second);
    value.push_str(b);
    value
}

/// Headers describing the poll limit (IETF `RateLimit-Policy` / `RateLimit`, draft-ietf-httpapi-ratelimit-headers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollLimitHeaders {
    /// `RateLimit-Policy` value.
    pub policy: String,
    /// `RateLimit` value.
    pub limit: String,
}

/// The waiting room.
pub struct WaitingRoom {
    pub(crate) queues: Arc<dyn QueueStore>,
    pub(crate) limiter: Arc<dyn RateLimiter>,
    jobs: Arc<dyn JobStore>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) config: WaitingRoomConfig,
    secret: TokenSecret,
    /// Set when running on the embedded backend, for its drill hooks.
    embedded: Option<Arc<EmbeddedStore>>,
    /// Set when running on Redis: a poll is then one script (position + poll limit) instead of two.
    pub(crate) redis: Option<Arc<RedisStore>>,
    /// Last fail mode seen per queue: when the store is down it cannot be asked, yet the gate must decide.
    fail_modes: Mutex<HashMap<QueueName, FailMode>>,
    /// When this instance next runs each queue's tick (store-clock ms). Per instance on purpose: the budget
    /// that makes the rate global lives in the store, so extra ticks cost nothing and a dead instance
    /// leaves no lease behind.
    pub(crate) next_tick_ms: Mutex<HashMap<QueueName, i64>>,
    /// The gate's HTTP client (connection pool shared by every gate).
    pub(crate) http: reqwest::Client,
    /// Members' position streams on this instance (`…/entries/{memberId}/events`).
    pub(crate) member_streams: MemberStreams,
    /// Adaptive admission: this instance's gate measurements and where they are shared (issue 12).
    pub(crate) adaptive: AdaptiveControl,
    /// Recently read draw records of scheduled openings (see `opening`).
    pub(crate) openings: super::opening::OpeningCache,
}

impl std::fmt::Debug for WaitingRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitingRoom")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

pub(crate) fn store_error(error: StoreError) -> ApiError {
    match error {
        StoreError::Unavailable(message) => {
            tracing::warn!(error = %message, "queue store unavailable; failing closed");
            ApiError::Unavailable("the waiting room is unavailable; try again shortly".into())
        }
        StoreError::Corrupt(message) => ApiError::Internal(anyhow::anyhow!(message)),
        StoreError::TooManyQueues { max_queues } => ApiError::TooManyRequests {
            message: format!(
                "max_queues: this waiting room already has {max_queues} queues, the most an entry may \
                 create; enter an existing queue, or ask an admin to configure this one (PUT \
                 /v1/admin/queues/{{queue}}) or delete an unused one"
            ),
            retry_after_secs: 60,
            headers: Vec::new(),
        },
    }
}

/// Most tokens one admission call is offered: each call is one bounded store step (one script on Redis,
/// one lock hold in the embedded store), so a tick of 100,000 admissions is a hundred short steps with
/// everyone else's requests served in between, and a shutdown is honoured between them.
const ADMIT_CHUNK: u64 = 1_000;

/// RFC 3339 for a store-clock millisecond.
pub(crate) fn rfc3339(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The token secret the config gives (`token_secret` or `token_secret_file`), if any. Errors name the
/// setting and never show the secret.
pub(crate) fn configured_token_secret(config: &WaitingRoomConfig) -> anyhow::Result<Option<TokenSecret>> {
    let (encoded, source) = match (&config.token_secret, &config.token_secret_file) {
        (Some(_), Some(_)) => anyhow::bail!(
            "waiting_room.token_secret and waiting_room.token_secret_file are both set; keep one"
        ),
        (Some(inline), None) => (inline.clone(), "waiting_room.token_secret".to_string()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("waiting_room.token_secret_file: reading {}", path.display()))?;
            (
                text,
                format!("waiting_room.token_secret_file ({})", path.display()),
            )
        }
        (None, None) => return Ok(None),
    };
    let bytes = URL_SAFE_NO_PAD
        .decode(encoded.trim().trim_end_matches('='))
        .map_err(|_| {
            anyhow::anyhow!(
                "{source}: not URL-safe base64 (make one with `openssl rand 32 | basenc --base64url`)"
            )
        })?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|_| anyhow::anyhow!("{source}: must decode to exactly 32 bytes"))?;
    Ok(Some(TokenSecret::from_bytes(bytes)))
}

/// The embedded backend's secret: the configured one, else `<data_dir>/queue.secret` (generated on the
/// first start, so a single instance starts with no configuration). That file sits next to the store it
/// protects, so a backup of the data directory holds both (SPEC 2.3): a warning says so at every start.
fn load_or_create_secret(config: &WaitingRoomConfig, data_dir: &Path) -> anyhow::Result<TokenSecret> {
    if let Some(secret) = configured_token_secret(config)? {
        if let Some(path) = &config.token_secret_file {
            if let (Ok(file), Ok(dir)) = (path.canonicalize(), data_dir.canonicalize()) {
                if file.starts_with(&dir) {
                    tracing::warn!(
                        file = %path.display(),
                        "waiting_room.token_secret_file is inside the data directory: a backup of the \
                         data directory then holds the secret with the tokens it protects; move it out"
                    );
                }
            }
        }
        return Ok(secret);
    }
    let path = data_dir.join("queue.secret");
    tracing::warn!(
        file = %path.display(),
        "waiting_room.token_secret_file is not set: entry tokens are derived from a secret kept in the data \
         directory, next to the queue store; set token_secret_file to a file outside it for production"
    );
    if let Ok(existing) = std::fs::read(&path) {
        let bytes: [u8; 32] = existing
            .try_into()
            .map_err(|_| anyhow::anyhow!("{} is not 32 bytes", path.display()))?;
        return Ok(TokenSecret::from_bytes(bytes));
    }
    let secret = TokenSecret::generate().context("reading the OS random number generator")?;
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
    write_private_file(&path, &secret.to_bytes()).with_context(|| format!("writing {}", path.display()))?;
    Ok(secret)
}

#[cfg(unix)]
fn write_private_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(not(unix))]
fn write_private_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

impl WaitingRoom {
    /// Opens the embedded backend under `data_dir` (restoring state: entries, tokens, claims, settings).
    pub async fn open_embedded(
        data_dir: &Path,
        config: WaitingRoomConfig,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Arc<WaitingRoom>> {
        let options = EmbeddedOptions {
            default_settings: config.default_settings()?,
            consumed_memory_ms: config.consumed_memory_seconds as i64 * 1000,
            synchronous: config.synchronous,
            max_queues: config.max_queues,
        };
        let secret = load_or_create_secret(&config, data_dir)?;
        let dir = data_dir.to_path_buf();
        let store_clock = Arc::clone(&clock);
        // Loading a big queue reads SQLite for a while: keep it off the async workers.
        let store = tokio::task::spawn_blocking(move || EmbeddedStore::open(&dir, store_clock, options))
            .await
            .context("opening the queue store")?
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("opening the queue store in {}", data_dir.display()))?;
        let mut room =
            WaitingRoom::from_stores(store.clone(), store.clone(), store.clone(), clock, config, secret)?;
        room.embedded = Some(store);
        Ok(Arc::new(room))
    }

    /// A room over any backend. Instances that share a store must share `secret` too.
    pub fn from_stores(
        queues: Arc<dyn QueueStore>,
        limiter: Arc<dyn RateLimiter>,
        jobs: Arc<dyn JobStore>,
        clock: Arc<dyn Clock>,
        config: WaitingRoomConfig,
        secret: TokenSecret,
    ) -> anyhow::Result<WaitingRoom> {
        config.default_settings()?;
        anyhow::ensure!(
            config.max_queues >= 1,
            "[waiting_room] max_queues must be at least 1"
        );
        anyhow::ensure!(
            (1..=10_000_000).contains(&config.max_pre_queue),
            "[waiting_room] max_pre_queue must be between 1 and 10000000"
        );
        anyhow::ensure!(
            config.max_member_streams >= 1,
            "[waiting_room] max_member_streams must be at least 1"
        );
        anyhow::ensure!(
            (100..=3_600_000).contains(&config.member_stream_heartbeat_millis),
            "[waiting_room] member_stream_heartbeat_millis must be between 100 and 3600000"
        );
        anyhow::ensure!(
            config.forget_idle_queues_after_seconds >= 60,
            "[waiting_room] forget_idle_queues_after_seconds must be at least 60"
        );
        anyhow::ensure!(
            ADAPTIVE_INTERVAL_MILLIS.contains(&config.adaptive_interval_millis),
            "[waiting_room] adaptive_interval_millis must be between 100 and 60000"
        );
        anyhow::ensure!(
            ADAPTIVE_MIN_SAMPLES.contains(&config.adaptive_min_samples),
            "[waiting_room] adaptive_min_samples must be between 1 and 100000"
        );
        for gate in &config.gates {
            QueueName::parse(&gate.queue)
                .map_err(|e| anyhow::anyhow!("[[gate]] queue {:?}: {e}", gate.queue))?;
            reqwest::Url::parse(&gate.upstream)
                .with_context(|| format!("[[gate]] upstream {:?}", gate.upstream))?;
        }
        // No pooled keep-alive past the upstream's own idle timeout: a reused, half-closed connection would
        // turn into a spurious "connection error" and a needless release.
        let http = reqwest::Client::builder()
            .pool_idle_timeout(std::time::Duration::from_secs(15))
            .build()
            .context("building the gate HTTP client")?;
        let member_streams = MemberStreams::new(MemberStreamLimits {
            max_streams: config.max_member_streams,
            heartbeat: std::time::Duration::from_millis(config.member_stream_heartbeat_millis),
        });
        let adaptive = AdaptiveControl::new(
            config.adaptive_interval_millis,
            config.adaptive_min_samples,
            config
                .gates
                .iter()
                .filter_map(|gate| QueueName::parse(&gate.queue).ok())
                .collect(),
        );
        Ok(WaitingRoom {
            adaptive,
            member_streams,
            queues,
            limiter,
            jobs,
            clock,
            config,
            secret,
            embedded: None,
            redis: None,
            fail_modes: Mutex::new(HashMap::new()),
            next_tick_ms: Mutex::new(HashMap::new()),
            http,
            openings: super::opening::OpeningCache::default(),
        })
    }

    /// The embedded store, when running on it (drills: [`EmbeddedStore::set_unreachable`]).
    #[must_use]
    pub fn embedded_store(&self) -> Option<&Arc<EmbeddedStore>> {
        self.embedded.as_ref()
    }

    /// The Redis store, when running on Redis.
    #[must_use]
    pub fn redis_store(&self) -> Option<&Arc<RedisStore>> {
        self.redis.as_ref()
    }

    /// The job store, for other workers (carry-over, rollovers) that need delayed/retry jobs.
    #[must_use]
    pub fn jobs(&self) -> &Arc<dyn JobStore> {
        &self.jobs
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &WaitingRoomConfig {
        &self.config
    }

    pub(crate) fn parse_queue(raw: &str) -> ApiResult<QueueName> {
        QueueName::parse(raw).map_err(|e| ApiError::bad_field("queue", e))
    }

    /// The key of the waiting page's visitor cookies: derived from the token secret, so instances sharing
    /// a store verify each other's cookies, and never the token key itself.
    pub(crate) fn visitor_key(&self) -> super::page::cookies::VisitorKey {
        super::page::cookies::VisitorKey::new(rankgate_store::queue::token::hmac_sha256(
            &self.secret.to_bytes(),
            super::page::cookies::VISITOR_KEY_LABEL,
        ))
    }

    pub(crate) fn parse_member(field: &str, raw: &str) -> ApiResult<MemberId> {
        MemberId::parse(raw).map_err(|e| ApiError::bad_field(field, e))
    }

    fn position_from(&self, view: &MemberView) -> Position {
        let jitter: f64 = rand::rng().random();
        let ready = view.status == MemberStatus::Ready;
        Position {
            status: view.status,
            rank: view.rank,
            current_total_waiting_count: view.waiting_count,
            estimated_wait_seconds: if view.status == MemberStatus::Waiting {
                view.estimated_wait_seconds
            } else {
                None
            },
            estimated_wait_seconds_p90: if view.status == MemberStatus::Waiting {
                view.estimated_wait_p90_seconds
            } else {
                None
            },
            polling_interval_seconds: polling_interval_seconds(view.rank, jitter),
            entry_token: if ready {
                view.token.map(|(nonce, _)| self.secret.token_for(&nonce))
            } else {
                None
            },
            token_expires_at: if ready {
                view.token.map(|(_, expires)| rfc3339(expires))
            } else {
                None
            },
            last_outcome: view.last_outcome.map(|LastOutcome::Consumed| "CONSUMED"),
            pre_queue: None,
            opens_at: None,
        }
    }

    /// `POST /v1/queues/{queue}/entries`.
    pub async fn enter(&self, queue: &QueueName, member: &MemberId) -> ApiResult<Position> {
        let outcome = self.queues.enter(queue, member).await.map_err(store_error)?;
        let entered = matches!(outcome, rankgate_store::queue::EnterOutcome::Entered(_));
        if entered {
            self.refuse_entry_beyond_max_pre_queue(queue, member, outcome.view())
                .await?;
            telemetry::entered(queue);
        }
        let mut position = self.position_from(outcome.view());
        self.mark_pre_queue(queue, &mut position).await?;
        Ok(position)
    }

    /// The member's position as the poll route answers it, without the poll limit: the member streams'
    /// read (their cadence is the limit).
    pub(crate) async fn position(&self, queue: &QueueName, member: &MemberId) -> ApiResult<Position> {
        let view = self.queues.position(queue, member).await.map_err(store_error)?;
        let mut position = self.position_from(&view);
        self.mark_pre_queue(queue, &mut position).await?;
        Ok(position)
    }

    /// Member streams open on this instance now.
    #[must_use]
    pub fn open_member_streams(&self) -> usize {
        self.member_streams.open_streams()
    }

    /// `GET /v1/queues/{queue}/entries/{member}`, rate-limited per member to the polling interval.
    pub async fn poll(
        &self,
        queue: &QueueName,
        member: &MemberId,
    ) -> ApiResult<(Position, PollLimitHeaders)> {
        let burst = self.config.poll_burst.max(1);
        // `burst` polls per `burst × interval`: on average one poll per interval, as the client was told.
        let window_of = |view: &MemberView| polling_tier_seconds(view.rank) * u64::from(burst);
        let (view, decision) = if let Some(redis) = &self.redis {
            // One script: the position and the same sliding-log limit, on the queue's slot.
            let (view, window_ms, decision) = redis.poll(queue, member, burst).await.map_err(store_error)?;
            debug_assert_eq!(window_ms, window_of(&view) as i64 * 1000, "poll.lua's tiers");
            (view, decision)
        } else {
            let view = self.queues.position(queue, member).await.map_err(store_error)?;
            let limit = RateLimit {
                limit: burst,
                window_ms: window_of(&view) as i64 * 1000,
            };
            let key = poll_limit_key(queue, member);
            let decision = self
                .limiter
                .try_acquire(&key, limit, RateLimiterKind::SlidingLog)
                .await
                .map_err(store_error)?;
            (view, decision)
        };
        let window_seconds = window_of(&view);
        let policy = rate_limit_value("\"poll\";q=", u64::from(burst), ";w=", window_seconds);
        match decision {
            RateDecision::Allowed { remaining, reset_ms } => {
                let reset = (reset_ms as u64).div_ceil(1000);
                let headers = PollLimitHeaders {
                    policy,
                    limit: rate_limit_value("\"poll\";r=", u64::from(remaining), ";t=", reset),
                };
                let mut position = self.position_from(&view);
                self.mark_pre_queue(queue, &mut position).await?;
                Ok((position, headers))
            }
            RateDecision::Limited { retry_after_ms } => {
                telemetry::poll_limited(queue);
                let retry_after_secs = (retry_after_ms as u64).div_ceil(1000).max(1);
                Err(ApiError::TooManyRequests {
                    message: format!("polling too fast; poll again in {retry_after_secs} s"),
                    retry_after_secs,
                    headers: vec![
                        ("ratelimit-policy", policy),
                        ("ratelimit", format!("\"poll\";r=0;t={retry_after_secs}")),
                    ],
                })
            }
        }
    }

    /// `DELETE /v1/queues/{queue}/entries/{member}`.
    pub async fn leave(&self, queue: &QueueName, member: &MemberId) -> ApiResult<()> {
        match self.queues.leave(queue, member).await.map_err(store_error)? {
            LeaveOutcome::Left(_) | LeaveOutcome::NotPresent => Ok(()),
            LeaveOutcome::Rejected(rejection) => Err(ApiError::Conflict(rejection.to_string())),
        }
    }

    /// `DELETE /v1/admin/queues/{queue}/members/{member}`: the member's own leave, done by an admin, except
    /// that removing somebody who is not there is a 404 (an admin wants to know).
    pub async fn remove_member(&self, queue: &QueueName, member: &MemberId) -> ApiResult<()> {
        match self.queues.leave(queue, member).await.map_err(store_error)? {
            LeaveOutcome::Left(status) => {
                telemetry::member_removed(queue);
                tracing::info!(queue = %queue, status = ?status, "member removed by an admin");
                Ok(())
            }
            LeaveOutcome::NotPresent => Err(ApiError::NotFound(format!(
                "memberId: {member} is not in queue {queue}"
            ))),
            LeaveOutcome::Rejected(rejection) => Err(ApiError::Conflict(rejection.to_string())),
        }
    }

    /// `POST …/tokens/claim`: `token` is the raw entry token; it is hashed here and goes no further.
    pub async fn claim(&self, queue: &QueueName, member: &MemberId, token: &str) -> ApiResult<ClaimGranted> {
        if token.is_empty() {
            return Err(ApiError::Unauthorized("token: missing entry token".into()));
        }
        let (claim_id, claim_digest) = new_claim_id()
            .map_err(|e| ApiError::Internal(anyhow::anyhow!("OS random number generator: {e}")))?;
        let outcome = self
            .queues
            .claim(queue, member, &digest_of(token), &claim_digest)
            .await
            .map_err(store_error)?;
        match outcome {
            ClaimOutcome::Claimed { expires_at_ms } => {
                telemetry::token_event(queue, "claimed", 1);
                Ok(ClaimGranted {
                    claim_id,
                    expires_at: rfc3339(expires_at_ms),
                })
            }
            ClaimOutcome::Rejected(ClaimRejection::AlreadyClaimed) => Err(ApiError::Conflict(
                "the entry token is already claimed by an order in flight".into(),
            )),
            ClaimOutcome::Rejected(rejection) => Err(ApiError::Unauthorized(format!("token: {rejection}"))),
        }
    }

    /// `POST …/tokens/consume`: the order committed. Idempotent.
    pub async fn consume(&self, queue: &QueueName, member: &MemberId, claim_id: &str) -> ApiResult<()> {
        match self
            .queues
            .consume(queue, member, &digest_of(claim_id))
            .await
            .map_err(store_error)?
        {
            ConsumeOutcome::Consumed => {
                telemetry::token_event(queue, "consumed", 1);
                Ok(())
            }
            ConsumeOutcome::AlreadyConsumed => Ok(()),
            ConsumeOutcome::Rejected(ConsumeRejection::UnknownClaim) => Err(ApiError::NotFound(
                "claimId: no such claim for this member".into(),
            )),
        }
    }

    /// `POST …/tokens/release`: the order failed; back to READY. Idempotent.
    pub async fn release(&self, queue: &QueueName, member: &MemberId, claim_id: &str) -> ApiResult<()> {
        match self
            .queues
            .release(queue, member, &digest_of(claim_id))
            .await
            .map_err(store_error)?
        {
            ReleaseOutcome::Released(rankgate_core::queue::ReleasedTo::AlreadyReleased) => Ok(()),
            ReleaseOutcome::Released(_) => {
                telemetry::token_event(queue, "released", 1);
                Ok(())
            }
            ReleaseOutcome::Rejected(ReleaseRejection::UnknownClaim) => Err(ApiError::NotFound(
                "claimId: no such claim for this member".into(),
            )),
            ReleaseOutcome::Rejected(rejection) => Err(ApiError::Conflict(rejection.to_string())),
        }
    }

    /// `PUT /v1/admin/queues/{queue}`.
    pub async fn update_settings(
        &self,
        queue: &QueueName,
        patch: &SettingsPatch,
    ) -> ApiResult<QueueSettings> {
        match self
            .queues
            .update_settings(queue, patch)
            .await
            .map_err(store_error)?
        {
            Ok(settings) => {
                self.fail_modes.lock().insert(queue.clone(), settings.fail_mode);
                Ok(settings)
            }
            Err(error) => Err(ApiError::BadRequest(error.to_string())),
        }
    }

    /// `GET /v1/admin/queues/{queue}`.
    pub async fn stats(&self, queue: &QueueName) -> ApiResult<QueueStats> {
        let stats = self.queues.stats(queue).await.map_err(store_error)?;
        let stats = stats.ok_or_else(|| ApiError::NotFound(format!("queue: {queue} does not exist")))?;
        self.fail_modes
            .lock()
            .insert(queue.clone(), stats.settings.fail_mode);
        Ok(stats)
    }

    /// Every queue.
    pub async fn queue_names(&self) -> ApiResult<Vec<QueueName>> {
        self.queues.queues().await.map_err(store_error)
    }

    /// The fail mode to apply for `queue` when the store cannot be asked.
    pub(crate) fn fail_mode_when_unreachable(&self, queue: &QueueName) -> FailMode {
        self.fail_modes
            .lock()
            .get(queue)
            .copied()
            .unwrap_or(self.config.fail_mode)
    }

    /// Remembers a queue's fail mode from fresh settings.
    pub(crate) fn remember_fail_mode(&self, queue: &QueueName, mode: FailMode) {
        self.fail_modes.lock().insert(queue.clone(), mode);
    }

    /// One admission tick for `queue` now, whether or not its tick is due. Prepares only the tokens the
    /// step can use, `min(per tick, waiting, room under max_active)` (defect 5: it used to prepare a full
    /// tick's worth, 3.6 billion for a rate of 1,000,000/s and a one-hour tick), and hands them to the
    /// store in chunks of [`ADMIT_CHUNK`]. A queue with nobody waiting and no token outstanding is left
    /// alone (defect 4).
    pub async fn admit_queue_now(&self, queue: &QueueName) -> anyhow::Result<AdmitOutcome> {
        let Some(preview) = self.queues.admission_preview(queue).await? else {
            return Ok(AdmitOutcome::default());
        };
        self.remember_fail_mode(queue, preview.settings.fail_mode);
        // A scheduled opening holds admission until its draw is done; a due draw runs here, once across
        // instances (the store's lease decides who draws).
        // Nobody waiting: nothing to draw or hold (and no store call spent on it).
        let holds_for_opening = preview.waiting > 0 && self.draw_if_due(queue).await?;
        if preview.settings.paused || holds_for_opening {
            // Still expire: a paused queue's tokens and claims keep their lifetimes.
            let expired = self.queues.expire_due(queue).await?;
            telemetry::token_event(queue, "expired", expired.tokens_expired);
            telemetry::token_event(queue, "claim_expired", expired.claims_expired);
            return Ok(AdmitOutcome {
                tokens_expired: expired.tokens_expired,
                claims_expired: expired.claims_expired,
                waiting: preview.waiting,
                outstanding: preview.outstanding,
                ..AdmitOutcome::default()
            });
        }
        let started = std::time::Instant::now();
        let mut remaining = preview.tokens_needed();
        let mut total = AdmitOutcome::default();
        loop {
            let offered = remaining.min(ADMIT_CHUNK);
            let tokens = self.prepare_tokens(offered as usize).await?;
            let step = self.queues.admit(queue, tokens).await?;
            let admitted = step.admitted.len() as u64;
            total.admitted.extend(step.admitted);
            total.tokens_expired += step.tokens_expired;
            total.claims_expired += step.claims_expired;
            total.waiting = step.waiting;
            total.outstanding = step.outstanding;
            remaining = remaining.saturating_sub(admitted);
            // Fewer admitted than offered: the budget, the room or the line is spent for this tick.
            if remaining == 0 || admitted < offered {
                break;
            }
        }
        // O(admitted): only the admitted members' streams are woken (see member_streams).
        self.member_streams.wake(queue, &total.admitted);
        telemetry::admission_step(queue, &total, started.elapsed());
        Ok(total)
    }

    /// `count` fresh tokens. A large batch is made on a blocking thread: thousands of HMACs would hold an
    /// async worker for milliseconds.
    async fn prepare_tokens(
        &self,
        count: usize,
    ) -> anyhow::Result<Vec<rankgate_store::queue::TokenCandidate>> {
        let secret = self.secret.clone();
        let prepare = move || -> anyhow::Result<Vec<_>> {
            (0..count)
                .map(|_| secret.prepare().context("reading the OS random number generator"))
                .collect()
        };
        if count <= 64 {
            return prepare();
        }
        tokio::task::spawn_blocking(prepare)
            .await
            .context("preparing entry tokens")?
    }

    /// Runs the tick of every active queue whose tick is due on this instance (store clock); returns what
    /// each did. Only queues with somebody waiting or a token outstanding are visited, found in one store
    /// call, so a thousand idle queues cost one call per round, not a thousand.
    pub async fn admit_due_queues(&self) -> anyhow::Result<Vec<(QueueName, AdmitOutcome)>> {
        let now = self.clock.now_millis();
        let mut done = Vec::new();
        let active = self.queues.active_queues().await?;
        // Forget the tick times of queues that went idle, so this map stays as small as the active set.
        self.next_tick_ms
            .lock()
            .retain(|queue, _| active.binary_search(queue).is_ok());
        for queue in active {
            let due = self
                .next_tick_ms
                .lock()
                .get(&queue)
                .is_none_or(|next| *next <= now);
            if !due {
                continue;
            }
            let tick = self
                .queues
                .settings(&queue)
                .await?
                .map_or(1000, |s| s.tick_millis as i64);
            let outcome = self.admit_queue_now(&queue).await?;
            if outcome.waiting == 0 && outcome.outstanding == 0 {
                // Idle now: the store took it out of the active set; its gauges read 0 from here.
                telemetry::queue_gone(&queue);
            }
            self.next_tick_ms.lock().insert(queue.clone(), now + tick);
            done.push((queue, outcome));
        }
        Ok(done)
    }

    /// Expires due tokens and claims in every active queue (an idle queue has nothing to expire but
    /// remembered consumed members, which the janitor forgets).
    pub async fn expire_due_everywhere(&self) -> anyhow::Result<()> {
        for queue in self.queues.active_queues().await? {
            let expired = self.queues.expire_due(&queue).await?;
            telemetry::token_event(&queue, "expired", expired.tokens_expired);
            telemetry::token_event(&queue, "claim_expired", expired.claims_expired);
        }
        Ok(())
    }

    /// The janitor's round: forgets every auto-created queue idle for `forget_idle_queues_after_seconds`
    /// (and, on Redis, puts any busy queue missing from the active set back). O(queues), but once a
    /// minute, not every tick. Returns the queues forgotten.
    pub async fn forget_idle_queues(&self) -> anyhow::Result<Vec<QueueName>> {
        let idle_ms = self.config.forget_idle_queues_after_seconds as i64 * 1000;
        let mut forgotten = Vec::new();
        for queue in self.queues.queues().await? {
            if self.queues.forget_if_idle(&queue, idle_ms).await? {
                self.forget_local_state(&queue);
                forgotten.push(queue);
            }
        }
        if !forgotten.is_empty() {
            tracing::info!(count = forgotten.len(), "forgot idle auto-created queues");
        }
        Ok(forgotten)
    }

    /// `DELETE /v1/admin/queues/{queue}`: the queue and everyone in it. 404 for an unknown queue.
    pub async fn delete_queue(&self, queue: &QueueName) -> ApiResult<()> {
        if !self.queues.delete_queue(queue).await.map_err(store_error)? {
            return Err(ApiError::NotFound(format!("queue: {queue} does not exist")));
        }
        self.forget_local_state(queue);
        tracing::info!(queue = %queue, "queue deleted by an admin");
        Ok(())
    }

    /// Drops what this instance keeps about a queue that no longer exists (and zeroes its gauges).
    fn forget_local_state(&self, queue: &QueueName) {
        self.next_tick_ms.lock().remove(queue);
        self.openings.forget(queue);
        self.fail_modes.lock().remove(queue);
        telemetry::queue_gone(queue);
    }

    /// Publishes queue gauges (length, oldest wait, measured rate, ready, claimed) and, on Redis, how the
    /// hot path's calls were coalesced.
    /// Only active queues are looked at (one stats call each); a queue that went idle keeps its last
    /// values until the exporter drops series idle for a while (see `telemetry`).
    pub async fn publish_queue_gauges(&self) -> anyhow::Result<()> {
        for queue in self.queues.active_queues().await? {
            if let Some(stats) = self.queues.stats(&queue).await? {
                self.remember_fail_mode(&queue, stats.settings.fail_mode);
                telemetry::queue_gauges(&queue, &stats);
            }
        }
        if let Some(redis) = &self.redis {
            telemetry::redis_coalescing(redis.coalescing());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn the_poll_limit_strings_are_what_format_wrote(
            queue in "[a-z0-9_-]{1,16}", member in "[!-~]{1,32}", a in any::<u64>(), b in any::<u64>(),
        ) {
            let (Ok(queue_name), Ok(member_id)) = (QueueName::parse(&queue), MemberId::parse(&member)) else {
                return Ok(());
            };
            prop_assert_eq!(poll_limit_key(&queue_name, &member_id), format!("poll:{queue}:{member}"));
            prop_assert_eq!(rate_limit_value("\"poll\";q=", a, ";w=", b), format!("\"poll\";q={a};w={b}"));
        }
    }

    fn status() -> impl Strategy<Value = MemberStatus> {
        prop_oneof![
            Just(MemberStatus::NotEntered),
            Just(MemberStatus::Waiting),
            Just(MemberStatus::Ready),
            Just(MemberStatus::Claimed),
        ]
    }

    /// Strings as a position may hold them, and ones that need escaping.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("2026-12-01T23:40:00Z".to_owned()),
            "[a-zA-Z0-9_-]{0,40}",
            "\\PC{0,8}",
            Just("quote \" backslash \\ newline \n nul \u{0}".to_owned()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn the_hand_written_position_body_is_serde_jsons(
            status in status(),
            rank in proptest::option::of(any::<u64>()),
            waiting in any::<u64>(),
            estimate in proptest::option::of(any::<u64>()),
            p90 in proptest::option::of(any::<u64>()),
            interval in prop_oneof![0.8f64..7.0, any::<f64>()],
            token in proptest::option::of(text()),
            expires in proptest::option::of(text()),
            consumed in any::<bool>(),
            pre_queue in proptest::option::of(any::<bool>()),
            opens_at in proptest::option::of(text()),
        ) {
            let position = Position {
                status,
                rank,
                current_total_waiting_count: waiting,
                estimated_wait_seconds: estimate,
                estimated_wait_seconds_p90: p90,
                polling_interval_seconds: interval,
                entry_token: token,
                token_expires_at: expires,
                last_outcome: consumed.then_some("CONSUMED"),
                pre_queue,
                opens_at,
            };
            prop_assert_eq!(
                String::from_utf8(position.to_json().to_vec()).unwrap(),
                serde_json::to_string(&position).unwrap()
            );
        }
    }
}
