//! [`WaitingRoom`]: the waiting room's service layer, shared by the HTTP handlers, the gate, the workers
//! and the demo.
//!
//! It holds the stores behind their traits (`Arc<dyn QueueStore>` etc.), so the same code runs on the
//! embedded backend or Redis; turns raw credentials into digests (raw tokens never go further, and are never
//! logged); answers in the shapes of [`super::position`], with store outcomes mapped by
//! [`super::errors`]; and records metrics.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use parking_lot::Mutex;
use rand::Rng as _;
use rankgate_core::ids::MemberId;
use rankgate_core::limiter::RateDecision;
use rankgate_core::queue::EntryChallenge;
use rankgate_core::queue::{
    polling_interval_seconds, ClaimRejection, ConsumeRejection, FailMode, MemberStatus, QueueName,
    QueueSettings, RefusalReason, ReleaseRejection, SettingsPatch,
};
use rankgate_store::clock::Clock;
use rankgate_store::queue::embedded::{EmbeddedOptions, EmbeddedStore};
use rankgate_store::queue::redis::RedisStore;
use rankgate_store::queue::token::{digest_of, new_claim_id, TokenSecret};
use rankgate_store::queue::{
    poll_window_seconds, AdmitOutcome, ClaimOutcome, ConsumeOutcome, EnterOutcome, JobStore, LastOutcome,
    LeaveOutcome, MemberView, Placement, QueueStats, QueueStore, RateLimiter, ReleaseOutcome,
};

use super::adaptive::{AdaptiveControl, ADAPTIVE_INTERVAL_MILLIS, ADAPTIVE_MIN_SAMPLES};
use super::config::WaitingRoomConfig;
use super::entry_guard::{
    address_label, ChallengeKey, ChallengeRefusal, EntryEvidence, EntryGuards, GuardSettings,
};
pub(crate) use super::errors::store_error;
use super::identity::{Credential, Entrant, EntryProof, Identity, Standing};
use super::member_streams::{MemberStreamLimits, MemberStreams};
use super::position::{rate_limit_value, ClaimGranted, PollLimitHeaders, Position};
use super::secret::load_or_create_secret;
use super::telemetry;
use super::ticket::TicketKey;
use crate::http::error::{ApiError, ApiResult};
use crate::http::peer::client_address;

/// The waiting room.
pub struct WaitingRoom {
    pub(crate) queues: Arc<dyn QueueStore>,
    pub(crate) limiter: Arc<dyn RateLimiter>,
    jobs: Arc<dyn JobStore>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) config: WaitingRoomConfig,
    secret: TokenSecret,
    /// Checks members' credentials (tickets, visitor cookies); keys derived from `secret`.
    pub(crate) identity: Identity,
    /// Set when running on the embedded backend, for its drill hooks.
    embedded: Option<Arc<EmbeddedStore>>,
    /// Set when running on Redis, for the demos' key cleanup (requests reach Redis through `queues`).
    pub(crate) redis: Option<Arc<RedisStore>>,
    /// Last fail mode seen per queue: when the store is down it cannot be asked, yet the gate must decide.
    fail_modes: Mutex<HashMap<QueueName, FailMode>>,
    /// When this instance next runs each queue's tick (store-clock ms). Per instance on purpose: the budget
    /// that makes the rate global lives in the store, so extra ticks cost nothing and a dead instance
    /// leaves no lease behind.
    pub(crate) next_tick_ms: Mutex<HashMap<QueueName, i64>>,
    /// When this instance next visits each queue nobody waits in: its earliest token or claim expiry, as
    /// the store last answered it (issue 30: such a queue costs nothing per tick; see `deadlines`).
    pub(crate) deadlines: super::deadlines::DeadlineIndex,
    /// Queues whose gauges may have changed since they were last published, besides those with somebody
    /// waiting (published every round): a queue nobody waits in is published only when it changed.
    gauges_changed: Mutex<HashSet<QueueName>>,
    /// The gate's HTTP client (connection pool shared by every gate).
    pub(crate) http: reqwest::Client,
    /// Members' position streams on this instance (`…/entries/{memberId}/events`).
    pub(crate) member_streams: MemberStreams,
    /// Adaptive admission: this instance's gate measurements and where they are shared (issue 12).
    pub(crate) adaptive: AdaptiveControl,
    /// Recently read draw records of scheduled openings (see `opening`).
    pub(crate) openings: super::opening::OpeningCache,
    /// Consumes this instance answered, so a lost store's consumed members get no place back by ticket.
    consumed: super::consumed::ConsumedLedger,
    /// What a new member's entry must get past (issue 28).
    guards: EntryGuards,
    /// This instance's sale-report counts not yet in the store (issue 28, `sale_report`).
    pub(crate) sale_reports: super::sale_report::SaleReports,
    /// The waiting counts of the gauges worker's last round, for the dashboard (`dashboard_feed`).
    pub(crate) gauged_waiting: Mutex<Option<super::dashboard_feed::GaugedWaiting>>,
}

/// Whether [`WaitingRoom::guard_entry`] counts a missing proof as a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CountMissing {
    /// An API entry: it was told to fetch a challenge first.
    Yes,
    /// The waiting page's first view: showing the challenge is its normal first step.
    No,
}

impl std::fmt::Debug for WaitingRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitingRoom")
            .field("config", &self.config)
            .finish_non_exhaustive()
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
        let guards = EntryGuards::new(
            ChallengeKey::derived_from(&secret),
            config.entries_per_address_per_minute,
            config.captcha_hook.clone(),
        );
        let identity = Identity::new(
            TicketKey::derived_from(&secret),
            super::page::cookies::VisitorKey::derived_from(&secret),
            config.member_auth.clone(),
        );
        Ok(WaitingRoom {
            adaptive,
            member_streams,
            queues,
            limiter,
            jobs,
            clock,
            config,
            identity,
            guards,
            secret,
            embedded: None,
            redis: None,
            fail_modes: Mutex::new(HashMap::new()),
            next_tick_ms: Mutex::new(HashMap::new()),
            deadlines: super::deadlines::DeadlineIndex::default(),
            gauges_changed: Mutex::new(HashSet::new()),
            http,
            openings: super::opening::OpeningCache::default(),
            consumed: super::consumed::ConsumedLedger::default(),
            sale_reports: super::sale_report::SaleReports::default(),
            gauged_waiting: Mutex::new(None),
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

    /// The key of the waiting page's visitor cookies ([`super::page::cookies::VisitorKey::derived_from`] the token secret).
    pub(crate) fn visitor_key(&self) -> super::page::cookies::VisitorKey {
        self.identity.visitor_key().clone()
    }

    /// A ticket that proves `member` of `queue` but names no place to come back to (SPEC 2.2, "Member
    /// identity"): for members entered in process (the demos) and tests. Entries over HTTP answer the
    /// ticket of the member's place.
    #[must_use]
    pub fn ticket_for(&self, queue: &QueueName, member: &MemberId) -> String {
        self.identity.ticket_for(queue, member, None)
    }

    /// Whether `ticket` is `member`'s in `queue` (the waiting page's ticket cookie).
    pub(crate) fn ticket_proves(&self, queue: &QueueName, member: &MemberId, ticket: &str) -> bool {
        self.identity.ticket_proves(queue, member, ticket.as_bytes())
    }

    /// Ok when `credential` proves `member` of `queue` (see [`super::identity`]).
    pub(crate) fn authorize(
        &self,
        queue: &QueueName,
        member: &MemberId,
        credential: &Credential<'_>,
    ) -> ApiResult<()> {
        self.identity.authorize(queue, member, credential)
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
            member_id: None,
            ticket: None,
        }
    }

    /// Counts an entry refused before it made a member: the metric, and (issue 28) the admin view's
    /// `refused` counts and the sale report's refusals of this minute.
    pub(crate) async fn count_refusal(&self, queue: &QueueName, reason: RefusalReason) {
        telemetry::entry_refused(queue, reason);
        let field = rankgate_store::queue::report::ReportField::Refused(reason);
        self.sale_reports.count(queue, self.clock.now_millis(), field, 1);
    }

    /// The entry guards (see [`super::entry_guard`]): Ok when `member`'s entry may go on. Only a new
    /// member is asked for anything; a member of unknown standing is looked up first when a guard is on.
    /// Each refusal is counted, except a missing proof-of-work solution when `count_missing` is `No`
    /// (the waiting page's first view, which is how a browser gets its challenge).
    pub(crate) async fn guard_entry(
        &self,
        queue: &QueueName,
        member: &MemberId,
        standing: Standing,
        evidence: &EntryEvidence<'_>,
        client: Option<std::net::IpAddr>,
        count_missing: CountMissing,
    ) -> ApiResult<()> {
        if standing == Standing::Returning {
            return Ok(());
        }
        let settings = self.guard_settings(queue).await?;
        let challenge = settings.entry.entry_challenge;
        if challenge == EntryChallenge::None && !self.guards.budget_is_on() {
            return Ok(());
        }
        if standing == Standing::Unknown {
            let view = self.queues.position(queue, member).await.map_err(store_error)?;
            if view.status != MemberStatus::NotEntered {
                return Ok(());
            }
        }
        let address = address_label(client);
        match challenge {
            EntryChallenge::None => {}
            EntryChallenge::Pow => {
                let now_ms = self.clock.now_millis();
                let passed = self
                    .guards
                    .pass_challenge(
                        &*self.limiter,
                        queue,
                        &address,
                        settings.entry.pow_difficulty,
                        evidence,
                        now_ms,
                    )
                    .await;
                if let Err((refusal, error)) = passed {
                    let counted = match refusal {
                        Some(ChallengeRefusal::Missing) => count_missing == CountMissing::Yes,
                        Some(_) => true,
                        None => false,
                    };
                    if counted {
                        self.count_refusal(queue, RefusalReason::Challenge).await;
                    }
                    return Err(error);
                }
            }
            EntryChallenge::Captcha => {
                let passed = self
                    .guards
                    .pass_captcha(&self.http, settings.fail_mode, evidence, client)
                    .await;
                if let Err(error) = passed {
                    let missing = evidence.captcha_token.is_none_or(str::is_empty);
                    if matches!(error, ApiError::Refused(_))
                        && (!missing || count_missing == CountMissing::Yes)
                    {
                        self.count_refusal(queue, RefusalReason::Captcha).await;
                    }
                    return Err(error);
                }
            }
        }
        let budget = self.guards.pass_budget(&*self.limiter, queue, &address).await;
        if let Err(error @ ApiError::Refused(_)) = budget {
            self.count_refusal(queue, RefusalReason::Address).await;
            return Err(error);
        }
        budget
    }

    /// `queue`'s settings as the entry guards read them: this instance's copy of the last second, else
    /// the store's (the defaults for a queue that does not exist yet).
    async fn guard_settings(&self, queue: &QueueName) -> ApiResult<GuardSettings> {
        let now_ms = self.clock.now_millis();
        if let Some(settings) = self.guards.cached_settings(queue, now_ms) {
            return Ok(settings);
        }
        let settings = match self.queues.settings(queue).await.map_err(store_error)? {
            Some(settings) => settings,
            None => self.config.default_settings().map_err(ApiError::Internal)?,
        };
        Ok(self.guards.remember_settings(queue, &settings, now_ms))
    }

    /// `GET /v1/queues/{queue}/challenge`: what a new member's entry into `queue` must show now: a fresh
    /// proof-of-work challenge bound to `client`, the CAPTCHA's provider and site key, or nothing.
    pub async fn challenge_for(
        &self,
        queue: &QueueName,
        client: Option<std::net::IpAddr>,
    ) -> ApiResult<serde_json::Value> {
        let settings = self.guard_settings(queue).await?;
        Ok(match settings.entry.entry_challenge {
            EntryChallenge::None => serde_json::json!({"kind": "none"}),
            EntryChallenge::Pow => self
                .guards
                .key()
                .issue(
                    queue,
                    &address_label(client),
                    settings.entry.pow_difficulty,
                    self.clock.now_millis(),
                )
                .to_json(),
            EntryChallenge::Captcha => match self.guards.captcha() {
                Some(captcha) => serde_json::json!({
                    "kind": "captcha",
                    "provider": captcha.provider.name(),
                    "siteKey": captcha.site_key,
                }),
                None => {
                    return Err(ApiError::Unavailable(
                        "this queue asks for a CAPTCHA but this server has no [waiting_room.captcha]".into(),
                    ))
                }
            },
        })
    }

    /// The entry guards (the waiting page renders challenges with their key and CAPTCHA hook).
    pub(crate) fn guards(&self) -> &EntryGuards {
        &self.guards
    }

    /// `POST /v1/queues/{queue}/entries`.
    pub async fn enter(&self, queue: &QueueName, member: &MemberId) -> ApiResult<Position> {
        Ok(self.enter_claiming(queue, member, None).await?.0)
    }

    /// The entry, claiming the place `claimed` (a ticket's) when the queue's epoch is no longer the
    /// ticket's: the store lost the queue, and the member gets its place back ([`QueueStore::restore`])
    /// unless this instance saw its order consumed. Answers the position, whether the entry created the
    /// member, and the place its new ticket names.
    async fn enter_claiming(
        &self,
        queue: &QueueName,
        member: &MemberId,
        claimed: Option<Placement>,
    ) -> ApiResult<(Position, bool, Option<Placement>)> {
        let mut outcome = self.queues.enter(queue, member).await.map_err(store_error)?;
        if let Some(claimed) = claimed {
            let epoch_now = outcome.view().placement.map(|now| now.epoch);
            if epoch_now.is_some_and(|epoch| epoch != claimed.epoch) && !self.consumed.contains(queue, member)
            {
                let entered_now = matches!(outcome, EnterOutcome::Entered(_));
                outcome = self
                    .queues
                    .restore(queue, member, claimed)
                    .await
                    .map_err(store_error)?;
                if entered_now {
                    outcome = EnterOutcome::Entered(outcome.view().clone());
                }
            }
        }
        let entered = matches!(outcome, EnterOutcome::Entered(_));
        if entered {
            self.refuse_entry_beyond_max_pre_queue(queue, member, outcome.view())
                .await?;
            telemetry::entered(queue);
        }
        let mut position = self.position_from(outcome.view());
        self.mark_pre_queue(queue, &mut position).await?;
        if entered {
            // In memory only: the sale report's flush takes it to the store (no call on this path).
            let estimate = position.estimated_wait_seconds;
            self.sale_reports
                .entered(queue, member, self.clock.now_millis(), estimate);
        }
        Ok((position, entered, outcome.view().placement))
    }

    /// `POST /v1/queues/{queue}/entries` (SPEC 2.2, "Member identity"): enters `member`, or a fresh
    /// `v-…` id when the body named none, and answers the position with `memberId` and the member's
    /// `ticket`. A member already in the queue is answered only to its own credential (401 otherwise,
    /// the entry changing nothing); a credential naming another member gets 403 and enters nobody.
    pub async fn enter_member(
        &self,
        queue: &QueueName,
        member: Option<MemberId>,
        credential: &Credential<'_>,
        evidence: &EntryEvidence<'_>,
    ) -> ApiResult<Position> {
        let Entrant {
            member,
            proof,
            claimed,
            standing,
        } = self.identity.entrant(queue, member, credential)?;
        let client = client_address(
            credential.peer(),
            credential.headers(),
            &self.config.client_proxies,
        );
        self.guard_entry(queue, &member, standing, evidence, client, CountMissing::Yes)
            .await?;
        let (mut position, entered, placement) = self.enter_claiming(queue, &member, claimed).await?;
        if !entered && proof == EntryProof::Claimed {
            return Err(ApiError::Unauthorized(format!(
                "X-Queue-Ticket: memberId {member} is already in this queue; only its own ticket (the one \
                 its entry answered with) can act for it"
            )));
        }
        position.ticket = Some(self.identity.ticket_for(queue, &member, placement));
        position.member_id = Some(member.as_str().to_owned());
        Ok(position)
    }

    /// The waiting page's entry of its visitor (already proven by its visitor cookie or its gateway's
    /// ticket): claims the place the page's ticket cookie names, if it is this member's, and answers the
    /// position with the ticket to keep in that cookie.
    pub(crate) async fn enter_page(
        &self,
        queue: &QueueName,
        member: &MemberId,
        ticket_cookie: Option<&str>,
    ) -> ApiResult<(Position, String)> {
        let claimed =
            ticket_cookie.and_then(|ticket| self.identity.place_claimed_by(queue, member, ticket.as_bytes()));
        let (position, _, placement) = self.enter_claiming(queue, member, claimed).await?;
        Ok((position, self.identity.ticket_for(queue, member, placement)))
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
        let (view, decision) = self
            .queues
            .poll(queue, member, burst, self.limiter.as_ref())
            .await
            .map_err(store_error)?;
        let window_seconds = poll_window_seconds(view.rank, burst);
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
            LeaveOutcome::Left(status) => {
                if status != MemberStatus::Waiting {
                    // A token given back: the READY count changed in a queue that may have nobody waiting.
                    self.note_gauges_changed(queue);
                }
                Ok(())
            }
            LeaveOutcome::NotPresent => Ok(()),
            LeaveOutcome::Rejected(rejection) => Err(ApiError::Conflict(rejection.to_string())),
        }
    }

    /// `DELETE /v1/admin/queues/{queue}/members/{member}`: the member's own leave, done by an admin, except
    /// that removing somebody who is not there is a 404 (an admin wants to know).
    pub async fn remove_member(&self, queue: &QueueName, member: &MemberId) -> ApiResult<()> {
        match self.queues.leave(queue, member).await.map_err(store_error)? {
            LeaveOutcome::Left(status) => {
                telemetry::member_removed(queue);
                self.note_gauges_changed(queue);
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
                // The claim's expiry may come before the token's: the sweep must visit by then.
                self.deadlines.note_deadline(queue, expires_at_ms);
                self.note_gauges_changed(queue);
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
                self.note_gauges_changed(queue);
                let orders = rankgate_store::queue::report::ReportField::Orders;
                self.sale_reports.count(queue, self.clock.now_millis(), orders, 1);
                self.consumed.record(queue, member);
                Ok(())
            }
            ConsumeOutcome::AlreadyConsumed => {
                self.consumed.record(queue, member);
                Ok(())
            }
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
                // Back to READY until the token's expiry, which the release does not answer: the next
                // sweep visits the queue and learns it.
                self.deadlines.note_change(queue);
                self.note_gauges_changed(queue);
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
                self.guards
                    .remember_settings(queue, &settings, self.clock.now_millis());
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
        let visit = self.deadlines.start_visit();
        let Some(preview) = self.queues.admission_preview(queue).await? else {
            self.deadlines.learn(queue, None, visit);
            return Ok(AdmitOutcome::default());
        };
        self.note_gauges_changed(queue);
        self.remember_fail_mode(queue, preview.settings.fail_mode);
        // A scheduled opening holds admission until its draw is done; a due draw runs here, once across
        // instances (the store's lease decides who draws).
        // Nobody waiting: nothing to draw or hold (and no store call spent on it).
        let holds_for_opening = preview.waiting > 0 && self.draw_if_due(queue).await?;
        if preview.settings.paused || holds_for_opening {
            // Still expire: a paused queue's tokens and claims keep their lifetimes.
            let expired = self.queues.expire_due(queue).await?;
            self.deadlines.learn(queue, expired.next_deadline_ms, visit);
            telemetry::token_event(queue, "expired", expired.tokens_expired);
            telemetry::token_event(queue, "claim_expired", expired.claims_expired);
            let abandoned = rankgate_store::queue::report::ReportField::Abandoned;
            self.sale_reports
                .count(queue, self.clock.now_millis(), abandoned, expired.abandoned);
            return Ok(AdmitOutcome {
                abandoned: expired.abandoned,
                tokens_expired: expired.tokens_expired,
                claims_expired: expired.claims_expired,
                waiting: preview.waiting,
                outstanding: preview.outstanding,
                next_deadline_ms: expired.next_deadline_ms,
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
            self.sale_reports.admitted(queue, self.clock.now_millis(), &step);
            let admitted = step.admitted.len() as u64;
            total.admitted.extend(step.admitted);
            total.waits_ms.extend(step.waits_ms);
            total.abandoned += step.abandoned;
            total.tokens_expired += step.tokens_expired;
            total.claims_expired += step.claims_expired;
            total.waiting = step.waiting;
            total.outstanding = step.outstanding;
            total.next_deadline_ms = step.next_deadline_ms;
            remaining = remaining.saturating_sub(admitted);
            // Fewer admitted than offered: the budget, the room or the line is spent for this tick.
            if remaining == 0 || admitted < offered {
                break;
            }
        }
        self.deadlines.learn(queue, total.next_deadline_ms, visit);
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

    /// Runs the tick of every active queue whose tick is due on this instance (store clock), and of every
    /// queue whose earliest deadline passed (see [`super::deadlines`]); returns what each did. Queues with
    /// somebody waiting are found in one store call; a queue nobody waits in, READY and CLAIMED members
    /// included, is not visited before its deadline, so a thousand of them cost one call per round.
    pub async fn admit_due_queues(&self) -> anyhow::Result<Vec<(QueueName, AdmitOutcome)>> {
        let now = self.clock.now_millis();
        let mut done = Vec::new();
        let mut active = self.queues.active_queues().await?;
        let waiting = active.clone();
        for due in self.deadlines.due(now) {
            if let Err(at) = active.binary_search(&due) {
                active.insert(at, due);
            }
        }
        // Forget the tick times of queues that went idle, so this map stays as small as the active set.
        self.next_tick_ms
            .lock()
            .retain(|queue, _| waiting.binary_search(queue).is_ok());
        for queue in active {
            let due = waiting.binary_search(&queue).is_err()
                || self
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

    /// Expires due tokens, claims and abandoned members in every queue whose earliest deadline, as this
    /// instance knows it, has passed ([`super::deadlines`]); no store call when none has.
    pub async fn expire_due_everywhere(&self) -> anyhow::Result<()> {
        for queue in self.deadlines.due(self.clock.now_millis()) {
            self.expire_queue_now(&queue).await?;
        }
        Ok(())
    }

    /// Expires what is due in `queue` and learns its next deadline.
    async fn expire_queue_now(&self, queue: &QueueName) -> anyhow::Result<()> {
        let visit = self.deadlines.start_visit();
        let expired = self.queues.expire_due(queue).await?;
        self.deadlines.learn(queue, expired.next_deadline_ms, visit);
        if expired.tokens_expired + expired.claims_expired + expired.abandoned > 0 {
            self.note_gauges_changed(queue);
        }
        telemetry::token_event(queue, "expired", expired.tokens_expired);
        telemetry::token_event(queue, "claim_expired", expired.claims_expired);
        let abandoned = rankgate_store::queue::report::ReportField::Abandoned;
        self.sale_reports
            .count(queue, self.clock.now_millis(), abandoned, expired.abandoned);
        Ok(())
    }

    /// The slow safety net of [`super::deadlines`]: visits every queue once, expiring what is due and
    /// learning its next deadline, so deadlines another instance made (its admissions and claims) are
    /// kept here too, at most one rescan period late; refreshes the gauges of every queue holding anyone.
    /// O(queues) store calls: run once a minute, not per tick.
    pub async fn rescan_deadlines(&self) -> anyhow::Result<()> {
        for queue in self.queues.queues().await? {
            let visit = self.deadlines.start_visit();
            let expired = self.queues.expire_due(&queue).await?;
            self.deadlines.learn(&queue, expired.next_deadline_ms, visit);
            if expired.next_deadline_ms.is_some() {
                self.note_gauges_changed(&queue);
            }
            telemetry::token_event(&queue, "expired", expired.tokens_expired);
            telemetry::token_event(&queue, "claim_expired", expired.claims_expired);
            let abandoned = rankgate_store::queue::report::ReportField::Abandoned;
            self.sale_reports
                .count(&queue, self.clock.now_millis(), abandoned, expired.abandoned);
        }
        Ok(())
    }

    /// The gauges of `queue` are published at the next round even if nobody waits in it.
    fn note_gauges_changed(&self, queue: &QueueName) {
        self.gauges_changed.lock().insert(queue.clone());
    }

    /// Brings the settings this instance keeps of every queue up to date (SPEC 2.2, "Places that survive
    /// the store"): on Redis, so a queue the store loses is made again as the admin left it.
    pub async fn keep_queue_settings(&self) -> anyhow::Result<()> {
        Ok(self.queues.keep_settings().await?)
    }

    /// Keeps this instance's copy of every queue's settings in `data_dir` too, so it survives a restart of
    /// this instance as well as a loss of the store. Only a store that can lose queues keeps one.
    pub fn keep_settings_in(&self, data_dir: &Path) -> anyhow::Result<()> {
        if let Some(redis) = &self.redis {
            redis
                .kept_settings()
                .persist_in(data_dir)
                .with_context(|| format!("reading the kept queue settings in {}", data_dir.display()))?;
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

    /// `DELETE /v1/admin/queues/{queue}`: the queue and everyone in it, and its sale report (which
    /// outlives a queue forgotten when idle: deleting such a queue deletes its report). 404 when there
    /// was neither.
    pub async fn delete_queue(&self, queue: &QueueName) -> ApiResult<()> {
        let existed = self.queues.delete_queue(queue).await.map_err(store_error)?;
        let had_report = self.delete_sale_report(queue).await.map_err(store_error)?;
        if !existed && !had_report {
            return Err(ApiError::NotFound(format!("queue: {queue} does not exist")));
        }
        self.forget_local_state(queue);
        tracing::info!(queue = %queue, "queue deleted by an admin");
        Ok(())
    }

    /// Drops what this instance keeps about a queue that no longer exists (and zeroes its gauges).
    fn forget_local_state(&self, queue: &QueueName) {
        self.next_tick_ms.lock().remove(queue);
        self.deadlines.forget(queue);
        self.gauges_changed.lock().remove(queue);
        self.openings.forget(queue);
        self.fail_modes.lock().remove(queue);
        telemetry::queue_gone(queue);
    }

    /// Publishes queue gauges (length, oldest wait, measured rate, ready, claimed) and, on Redis, how the
    /// hot path's calls were coalesced.
    /// Only queues with somebody waiting, and queues this instance saw change since the last round, are
    /// looked at (one stats call each): a queue nobody waits in keeps its values until it changes (the
    /// deadline rescan refreshes them once a minute, also for changes other instances made); a queue that
    /// went idle keeps its last values until the exporter drops series idle for a while (see `telemetry`).
    pub async fn publish_queue_gauges(&self) -> anyhow::Result<()> {
        let mut waiting = Vec::new();
        let mut queues = std::mem::take(&mut *self.gauges_changed.lock());
        queues.extend(self.queues.active_queues().await?);
        for queue in queues {
            if let Some(stats) = self.queues.stats(&queue).await? {
                self.remember_fail_mode(&queue, stats.settings.fail_mode);
                telemetry::queue_gauges(&queue, &stats);
                waiting.push((queue, stats.waiting));
            }
        }
        // A whole round only: a failed one leaves the last, which the dashboard then sees grow old.
        self.gauges_round_done(waiting);
        if let Some(coalescing) = self.queues.coalescing() {
            telemetry::hot_path_coalescing(coalescing);
        }
        Ok(())
    }
}
