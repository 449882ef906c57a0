//! Waiting-room configuration: `[waiting_room]` defaults and `[[gate]]` proxy routes.
//!
//! ```toml
//! [waiting_room]
//! admit_per_second = 50        # defaults for queues created by their first entry (SPEC 2.1)
//! tick_millis = 1000
//! token_ttl_seconds = 300
//! claim_ttl_seconds = 30
//! # max_active = 200
//! fail_mode = "closed"         # or "open": the gate forwards unclaimed requests while the store is down
//! poll_burst = 3               # polls allowed per `poll_burst × polling interval` window before 429
//! consumed_memory_seconds = 3600
//! # token_secret_file = "/etc/rankgate/token-secret"  # 43 chars of URL-safe base64 (32 bytes); required
//! # token_secret = "<43 chars of URL-safe base64>"     # with --redis (one of the two); outside the data dir
//! max_queues = 1000            # queues first entries may create; beyond, an entry into a new queue gets 429
//! forget_idle_queues_after_seconds = 3600  # auto-created queues idle this long are forgotten
//! # fsync_every_commit = true  # deprecated: the top-level `sqlite_synchronous` decides (default "full")
//!
//! member_auth = "ticket"      # or "gateway", "jwt": how a request proves its member; see `member_auth`
//! entries_per_address_per_minute = 30  # new members per client address per queue per minute; 0: off
//! # trusted_proxies = ["10.0.0.0/8"]  # peers whose X-Forwarded-For / Forwarded names the client
//!
//! # [waiting_room.captcha]    # entryChallenge = "captcha": see `captcha`
//!
//! page_cookie_secure = "auto"  # Secure cookies on TLS / X-Forwarded-Proto: https; or "always", "never"
//! visitor_cookie_max_age_seconds = 86400
//!
//! [[waiting_room.page]]        # the waiting page at GET /wait/{queue}; see `page::config`
//! title = "Example Shop"
//! continue_url = "/checkout"
//!
//! [[gate]]
//! queue = "summer-sale"
//! upstream = "http://127.0.0.1:9000"
//! timeout_millis = 10000
//! routes = [ { method = "POST", path = "/orders" },                 # exact path
//!            { method = "POST", path = "/orders/", prefix = true } ] # every path under /orders/
//! ```

use rankgate_core::queue::{FailMode, QueueSettings};
use rankgate_store::synchronous::Synchronous;
use serde::Deserialize;

pub use super::captcha::{Captcha, CaptchaFile};
use super::entry_guard::MAX_ENTRIES_PER_ADDRESS_PER_MINUTE;
pub use super::member_auth::{GatewayAuth, MemberAuth, MemberAuthFile};
use super::page::config::Pages;
pub use super::page::config::{CookieSecure, PageConfig};
use crate::http::peer::TrustedProxies;

/// Longest `visitor_cookie_max_age_seconds`: 400 days, the longest a browser keeps a cookie (RFC 6265bis).
pub const MAX_VISITOR_COOKIE_MAX_AGE_SECONDS: u64 = 400 * 86_400;

/// Settings from the config file: `[waiting_room]` defaults and `[[gate]]` routes. `Debug` never shows
/// the token secret.
#[derive(Clone, Deserialize)]
#[serde(default)]
pub struct WaitingRoomConfig {
    /// Default `admit_per_second` of new queues.
    pub admit_per_second: f64,
    /// Default `tick` of new queues (ms).
    pub tick_millis: u64,
    /// Default token lifetime (s).
    pub token_ttl_seconds: u64,
    /// Default claim lifetime (s).
    pub claim_ttl_seconds: u64,
    /// Default cap on READY + CLAIMED.
    pub max_active: Option<u64>,
    /// Default gate behaviour when the store is down; also used for queues the gate cannot look up.
    pub fail_mode: FailMode,
    /// Default `abandonAfterSeconds` of new queues: a waiting member unseen this long is dropped (s).
    pub abandon_after_seconds: u64,
    /// Polls allowed within `poll_burst × polling interval` before 429: the average stays at one poll
    /// per interval while tolerating a retried request or a page reload.
    pub poll_burst: u32,
    /// How long a consumed member is reported with `lastOutcome: CONSUMED` (s).
    pub consumed_memory_seconds: u64,
    /// Token secret (URL-safe base64 of 32 bytes). Instances sharing a store must share it; when neither
    /// this nor `token_secret_file` is given, the embedded backend generates one in
    /// `<data_dir>/queue.secret`, and the Redis backend refuses to start (SPEC 2.3). Never printed.
    pub token_secret: Option<String>,
    /// A file holding the token secret (URL-safe base64 of 32 bytes, surrounding whitespace ignored); keep
    /// it outside the data directory and out of backups of the store.
    pub token_secret_file: Option<std::path::PathBuf>,
    /// Most queues that first entries may create (SPEC 2.1); beyond, an entry into a new queue gets 429.
    /// An admin PUT may create queues beyond it.
    pub max_queues: usize,
    /// Queues created by an entry (never PUT by an admin) that stay empty (nobody waiting, READY, CLAIMED
    /// or remembered as consumed) and untouched this long are forgotten (s).
    pub forget_idle_queues_after_seconds: u64,
    /// Deprecated override of the queue database's durability: `true` is `sqlite_synchronous = "full"`,
    /// `false` is `"normal"`, for `queue.sqlite3` only. Absent: the top-level `sqlite_synchronous` decides.
    pub fsync_every_commit: Option<bool>,
    /// The `synchronous` level of `queue.sqlite3`, resolved by [`crate::config::Config`] from
    /// `sqlite_synchronous` and `fsync_every_commit` (not a file key of its own).
    #[serde(skip)]
    pub synchronous: Synchronous,
    /// How often the scheduler checks whether a queue's tick is due (ms).
    pub scheduler_poll_millis: u64,
    /// Member position streams (`…/entries/{memberId}/events`) open at once on this instance; past it,
    /// 429 naming this key.
    pub max_member_streams: usize,
    /// Between heartbeat comments on a member stream (ms).
    pub member_stream_heartbeat_millis: u64,
    /// Reverse-proxy gates (the top-level `[[gate]]` tables).
    pub gates: Vec<GateConfig>,
    /// `[[waiting_room.page]]`: the waiting pages at `GET /wait/{queue}` (see [`super::page::config`]).
    pub page: Vec<PageConfig>,
    /// When the waiting page's cookies carry `Secure`: `auto` (TLS or `X-Forwarded-Proto: https`),
    /// `always` or `never`.
    pub page_cookie_secure: CookieSecure,
    /// Lifetime of the `rankgate_visitor` cookie (s); at most 400 days, the most browsers keep a cookie.
    pub visitor_cookie_max_age_seconds: u64,
    /// Adaptive admission's control interval (ms, 100..=60000): how often the controller judges the
    /// upstream's p95 and error rate and moves an adaptive queue's rate.
    pub adaptive_interval_millis: u64,
    /// Fewer forwarded orders than this in an interval (over every instance): the controller holds the
    /// rate (1..=100000).
    pub adaptive_min_samples: u64,
    /// How often this instance runs its control round (flushes its measurements, closes intervals) (ms).
    /// Absent: a quarter of `adaptive_interval_millis`, so flushes land well inside the half-interval
    /// grace; longer than the grace, this instance's orders may miss their interval's decision. Tests set
    /// it beyond their length and run the rounds themselves.
    pub adaptive_round_millis: Option<u64>,
    /// Most members a scheduled opening's pre-queue holds (the draw sorts them in one instance's
    /// memory); past it, an entry gets 429 naming this key.
    pub max_pre_queue: u64,
    /// `member_auth`, `gateway_keys`, `gateway_key_files`, `trusted_proxies` and `[waiting_room.jwt]` as
    /// the file gives them; [`crate::config::Config`] resolves them into `member_auth` and takes the
    /// secrets out (see [`super::member_auth`]).
    #[serde(flatten)]
    pub member_auth_file: MemberAuthFile,
    /// How a request proves which member it speaks for (SPEC 2.2, "Member identity"), resolved from
    /// `member_auth_file` (not a file key of its own).
    #[serde(skip)]
    pub member_auth: MemberAuth,
    /// New members one client address may make per queue per minute (SPEC 2.2, "Per-address
    /// budgets"); 0 turns the budget off. A member's own re-entries do not count.
    pub entries_per_address_per_minute: u32,
    /// `trusted_proxies` resolved (not a file key of its own): peers whose `Forwarded` /
    /// `X-Forwarded-For` names the client address budgets count by. Parsed in every `member_auth` mode.
    #[serde(skip)]
    pub client_proxies: TrustedProxies,
    /// `[waiting_room.captcha]` as the file gives it; [`crate::config::Config`] resolves it into
    /// `captcha_hook` and takes the secret out.
    pub captcha: Option<CaptchaFile>,
    /// The CAPTCHA hook, resolved from `captcha` (not a file key of its own).
    #[serde(skip)]
    pub captcha_hook: Option<Captcha>,
}

impl std::fmt::Debug for WaitingRoomConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitingRoomConfig")
            .field("admit_per_second", &self.admit_per_second)
            .field("tick_millis", &self.tick_millis)
            .field("max_queues", &self.max_queues)
            .field("token_secret", &self.token_secret.as_ref().map(|_| "(hidden)"))
            .field("token_secret_file", &self.token_secret_file)
            .field("gates", &self.gates.len())
            .field("member_auth", &self.member_auth)
            .finish_non_exhaustive()
    }
}

impl Default for WaitingRoomConfig {
    fn default() -> Self {
        let settings = QueueSettings::default();
        WaitingRoomConfig {
            admit_per_second: settings.admit_per_second,
            tick_millis: settings.tick_millis,
            token_ttl_seconds: settings.token_ttl_seconds,
            claim_ttl_seconds: settings.claim_ttl_seconds,
            max_active: settings.max_active,
            fail_mode: settings.fail_mode,
            abandon_after_seconds: settings.abandon_after_seconds,
            poll_burst: 3,
            consumed_memory_seconds: 3600,
            token_secret: None,
            token_secret_file: None,
            max_queues: rankgate_store::queue::DEFAULT_MAX_QUEUES,
            forget_idle_queues_after_seconds: 3600,
            fsync_every_commit: None,
            synchronous: Synchronous::default(),
            scheduler_poll_millis: 50,
            max_member_streams: 20_000,
            member_stream_heartbeat_millis: 15_000,
            gates: Vec::new(),
            page: Vec::new(),
            page_cookie_secure: CookieSecure::default(),
            visitor_cookie_max_age_seconds: 86_400,
            adaptive_interval_millis: 1000,
            adaptive_min_samples: 10,
            adaptive_round_millis: None,
            max_pre_queue: rankgate_core::queue::draw::DEFAULT_MAX_PRE_QUEUE,
            member_auth_file: MemberAuthFile::default(),
            member_auth: MemberAuth::Ticket,
            entries_per_address_per_minute: 30,
            client_proxies: TrustedProxies::default(),
            captcha: None,
            captcha_hook: None,
        }
    }
}

impl WaitingRoomConfig {
    /// Checks `[[waiting_room.page]]` and the page's cookie settings; errors name the key.
    pub fn validate_pages(&self) -> anyhow::Result<()> {
        Pages::from_config(&self.page, &self.gates)?;
        anyhow::ensure!(
            (1..=MAX_VISITOR_COOKIE_MAX_AGE_SECONDS).contains(&self.visitor_cookie_max_age_seconds),
            "waiting_room.visitor_cookie_max_age_seconds must be 1 to {MAX_VISITOR_COOKIE_MAX_AGE_SECONDS} \
             (400 days), got {}",
            self.visitor_cookie_max_age_seconds
        );
        Ok(())
    }

    /// Resolves the entry guards' keys: `trusted_proxies` for client addresses, the CAPTCHA hook (its
    /// secret taken out of the file), and checks `entries_per_address_per_minute`.
    pub fn resolve_entry_guards(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.entries_per_address_per_minute <= MAX_ENTRIES_PER_ADDRESS_PER_MINUTE,
            "waiting_room.entries_per_address_per_minute must be 0 (off) to {MAX_ENTRIES_PER_ADDRESS_PER_MINUTE}, \
             got {}",
            self.entries_per_address_per_minute
        );
        self.client_proxies = TrustedProxies::parse(
            "waiting_room.trusted_proxies",
            &self.member_auth_file.trusted_proxies,
        )?;
        self.captcha_hook = Captcha::from_file(self.captcha.as_mut())?;
        Ok(())
    }

    /// The settings a queue gets when its first entry creates it; validated.
    pub fn default_settings(&self) -> anyhow::Result<QueueSettings> {
        let settings = QueueSettings {
            admit_per_second: self.admit_per_second,
            tick_millis: self.tick_millis,
            token_ttl_seconds: self.token_ttl_seconds,
            claim_ttl_seconds: self.claim_ttl_seconds,
            max_active: self.max_active,
            paused: false,
            fail_mode: self.fail_mode,
            abandon_after_seconds: self.abandon_after_seconds,
            adaptive: Default::default(),
            entry: Default::default(),
        };
        settings
            .validate()
            .map_err(|e| anyhow::anyhow!("[waiting_room] {e}"))?;
        Ok(settings)
    }
}

/// One `[[gate]]`: requests matching `routes` must carry a valid entry token for `queue`, and are
/// forwarded to `upstream`.
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "GateConfigFile")]
pub struct GateConfig {
    /// The queue whose tokens this gate accepts.
    pub queue: String,
    /// Base URL of the protected service, e.g. `http://127.0.0.1:9000` (the request path is appended).
    pub upstream: String,
    /// The protected routes.
    pub routes: Vec<GateRoute>,
    /// Upstream timeout (ms); a timeout releases the token and answers 504.
    #[serde(default = "default_gate_timeout_millis")]
    pub timeout_millis: u64,
    /// Largest request body forwarded (bytes).
    #[serde(default = "default_gate_max_body_bytes")]
    pub max_body_bytes: usize,
}

/// What a `[[gate]]` table may say: `routes = [{ method, path }]`, or for a single route the shorthand
/// `method = "POST"` + `path = "/orders"` (or `methods`/`paths` lists); `upstream_url` and `url` are
/// accepted for `upstream`. Being lenient here costs nothing and saves an operator a failed start.
#[derive(Debug, Clone, Deserialize)]
struct GateConfigFile {
    queue: String,
    #[serde(alias = "upstream_url", alias = "url")]
    upstream: String,
    #[serde(default)]
    routes: Vec<GateRoute>,
    method: Option<String>,
    path: Option<String>,
    #[serde(default)]
    methods: Vec<String>,
    #[serde(default)]
    paths: Vec<String>,
    #[serde(default)]
    prefix: bool,
    #[serde(default = "default_gate_timeout_millis", alias = "timeout_ms")]
    timeout_millis: u64,
    #[serde(default = "default_gate_max_body_bytes")]
    max_body_bytes: usize,
}

impl From<GateConfigFile> for GateConfig {
    fn from(file: GateConfigFile) -> GateConfig {
        let mut routes = file.routes;
        let methods: Vec<String> = file.method.into_iter().chain(file.methods).collect();
        let paths: Vec<String> = file.path.into_iter().chain(file.paths).collect();
        let methods = if methods.is_empty() && !paths.is_empty() {
            vec!["POST".to_string()]
        } else {
            methods
        };
        for path in &paths {
            for method in &methods {
                routes.push(GateRoute {
                    method: method.clone(),
                    path: path.clone(),
                    prefix: file.prefix,
                });
            }
        }
        GateConfig {
            queue: file.queue,
            upstream: file.upstream,
            routes,
            timeout_millis: file.timeout_millis,
            max_body_bytes: file.max_body_bytes,
        }
    }
}

fn default_gate_timeout_millis() -> u64 {
    10_000
}

fn default_gate_max_body_bytes() -> usize {
    1024 * 1024
}

/// A protected method and path.
#[derive(Debug, Clone, Deserialize)]
pub struct GateRoute {
    /// HTTP method, e.g. `POST` (case-insensitive).
    pub method: String,
    /// Path. Exact by default: `/orders` matches only `/orders`.
    pub path: String,
    /// With `prefix = true` the route also matches every path below `path`: `/orders` then matches
    /// `/orders`, `/orders/` and `/orders/123/items`.
    #[serde(default)]
    pub prefix: bool,
}
