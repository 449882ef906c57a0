//! The Redis backend of the waiting room, the job queue and the rate limiter, on a standalone Redis or a
//! Redis Cluster. The behaviour is the embedded backend's, checked by the same conformance suite and by
//! the backend-equivalence property test (`tests/queue_equivalence.rs`), which runs random operation
//! sequences on both in lock step and compares every answer: the scripts re-state `rankgate-core`'s rules
//! in Lua (transitions, the budget, the estimator, backoff, the limiter, polling tiers), so that test is
//! what keeps the two from drifting.
//!
//! # One step, one script, one slot
//! Every state change of one object (a queue, a job queue, a limiter key) is exactly one Lua script
//! (`lua/*.lua`, compiled in with `include_str!` and run through [`redis::Script`], i.e. `EVALSHA` with a
//! load-and-retry on `NOSCRIPT`). Redis runs a script atomically, so a step can never be half-applied or
//! interleaved with another instance's: the entry check and `ZADD NX`, the pop and the token issue, the
//! budget refill and spend, a claim and its expiry all happen in one step. Each script touches the keys of
//! **one object only**, and all of those keys share a hash tag, so in a cluster they sit in one slot on one
//! node and the script is legal there (Redis refuses cross-slot scripts).
//!
//! What spans objects, the queue registry (`max_queues`) and the active set, lives in the `{rg}` slot and
//! is kept by separate calls around a queue's script, ordered so a crash between them is harmless. So some
//! trait methods take more than one round trip: `enter` (the fast script; then the full `enter.lua` for a
//! member with a record: READY, CLAIMED or a remembered CONSUMED; for a queue's first entry `register.lua`
//! and `enter.lua` again, then `SADD`s to the registry and the active set: up to six), `admit` (plus `SREM`
//! active, `busy.lua` and maybe `SADD` when the step left the queue idle), `expire_due` (one bounded
//! `expire.lua` per 1,000 due deadlines), `update_settings` (`HMGET` to validate against the stored
//! settings, `SADD` registry, the script, `SADD` again if it created the queue), `delete_queue` (two
//! `SREM`s, then `delete.lua`) and `forget_if_idle` (`forget.lua`, then `SREM` + `EXISTS`, or `SADD`
//! active). Every other method is one script or one read command.
//!
//! # The hot path: entries and polls
//! Redis runs scripts on its one thread, so the two requests every member repeats are kept short, and
//! concurrent ones share a script call (`coalesce.rs`: each round takes every entry, or every poll, that
//! queued up while the previous round ran, one call per queue). `enter` first runs `enter_fast.lua` (one
//! `HMGET` of the holders and one `ZMSCORE` of the waiting set for the whole batch; the unknown members
//! go in with one `ZADD NX` and one deadline `ZADD`, a waiting member is only read and seen); only when
//! the queue does not exist yet or the member holds a token does it decline, untouched, and `enter.lua`
//! does the full entry. [`RedisStore::poll`] answers a member's poll, position **and** the per-member
//! poll limit, in one script (`poll.lua`; the log keys carry the queue's hash tag). Both carry only
//! `queue_base.lua`, and a waiting member's poll writes to the queue's keys only once per abandonment
//! slack (`touch_waiting`: a `ZSCORE` of its deadline, and a `ZADD` only when the deadline would fall
//! short).
//!
//! # Key layout (`P` = the configured prefix, e.g. `rankgate:`)
//! | key | type | holds |
//! |---|---|---|
//! | `P{rg:q:<queue>}:meta` | hash | settings, next sequence, READY/CLAIMED counters, budget (micro-members), estimator, last clock reading |
//! | `P{rg:q:<queue>}:waiting` | zset | member → arrival sequence (strict FIFO; never a timestamp) |
//! | `P{rg:q:<queue>}:holders` | hash | member → READY / CLAIMED / CONSUMED record: nonce, **token hash**, claim hash, expiries |
//! | `P{rg:q:<queue>}:deadlines` | zset | member → its next deadline (token expiry, claim expiry, forgetting a consumed member) |
//! | `P{rg:q:<queue>}:arrivals` | zset | arrival ms → first sequence of that ms (oldest-wait without a timestamp per member) |
//! | `P{rg:q:<queue>}:admitted` | hash | second → members admitted (last 60 s) |
//! | `P{rg:q:<queue>}:drawn` | list | a scheduled opening's drawn list: pre-queue member ids in drawn order (`draw_*.lua`; the draw's state is in `meta`'s `d*` fields) |
//! | `P{rg:q:<queue>}:entrants` | list | a closed pre-queue's entrant list, sealed by `dentc` (the entrants commitment); from the close to the end of the draw |
//! | `P{rg:q:<queue>}:poll:<member>` | string | the member's poll log (`poll.lua`); expires when idle |
//! | `P{rg:j:<jobs>}:{ready,processing,dead,records,payloads,reasons,meta}` | | one job queue |
//! | `P{rg:rl:<key>}:{log,window,meta}` | | one rate-limit key; expires when idle |
//! | `P{rg}:queues` | set | every queue name (for schedulers and the admin API) |
//! | `P{rg}:active` | set | the busy queues (someone waits or holds a token): the ones schedulers visit |
//! | `P{rg:q:<queue>}:upstream:*` | hash, string | gate measurements per control interval, last summary (`upstream.rs`, issue 12) |
//! | `P{rg:q:<queue>}:report:*`, `P{rg}:reports` | hash, zset | the sale report: counters per minute, totals, the index of reports (`report.rs`, issue 28) |
//!
//! Job-queue names and limiter keys are free text, so `%`, `{` and `}` in them are percent-encoded: a brace
//! in a key name would move the hash tag. Queue names cannot contain braces.
//!
//! # Time
//! Scripts read the store's clock, `redis.call('TIME')`, so every instance agrees on expiry and order, and
//! pass it through a monotonic guard: the last time used is kept in the object's meta hash and time never
//! goes backwards for that object. Tests replace `TIME` with an injected clock ([`RedisTime::Injected`]) so
//! they control time exactly as they do for the embedded store; the guard applies either way.
//!
//! # Lifetimes
//! Rate-limit keys expire once idle (`PEXPIRE`, twice the window plus slack). Consumed members are forgotten
//! through their deadline. Queue and job keys have no TTL: a queue with people in it must never vanish.

mod coalesce;
mod draw;
mod jobs;
mod limiter;
mod report;
mod upstream;
mod waiting;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use rankgate_core::queue::{FailMode, QueueName, QueueSettings};
use redis::{Script, ScriptInvocation};

use crate::clock::Clock;
use crate::queue::kept_settings::{Kept, KeptSettings};
use crate::queue::waiting::EnterOutcome;
use crate::queue::StoreError;
pub use crate::redis_connection::Timeouts;
use crate::redis_connection::{escape, escape_into, Connection, Reply};
use coalesce::Coalescer;
use rankgate_core::ids::MemberId;
use waiting::PollAnswer;

/// Where scripts take "now" from.
#[derive(Clone)]
pub enum RedisTime {
    /// Redis `TIME`: the store's clock, shared by every instance. Production.
    Server,
    /// A clock passed into every script instead of `TIME` (tests, simulations).
    Injected(Arc<dyn Clock>),
}

impl std::fmt::Debug for RedisTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisTime::Server => f.write_str("Server"),
            RedisTime::Injected(_) => f.write_str("Injected"),
        }
    }
}

/// Options of the Redis store.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Prefix of every key, so deployments (and tests) can share a Redis. Must not contain `{` or `}`.
    pub prefix: String,
    /// Settings a queue gets when it is created by its first entry.
    pub default_settings: QueueSettings,
    /// How long a consumed member is reported with `lastOutcome: CONSUMED` (ms).
    pub consumed_memory_ms: i64,
    /// The clock scripts use.
    pub time: RedisTime,
    /// Connect and response timeouts.
    pub timeouts: Timeouts,
    /// Most queues first entries may create, across every instance (an admin PUT may create more).
    pub max_queues: usize,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: "rankgate:".into(),
            default_settings: QueueSettings::default(),
            consumed_memory_ms: 3_600_000,
            time: RedisTime::Server,
            timeouts: Timeouts::default(),
            max_queues: crate::queue::DEFAULT_MAX_QUEUES,
        }
    }
}

/// Every script, compiled once per store.
struct Scripts {
    enter: Script,
    enter_fast: Script,
    restore: Script,
    position: Script,
    poll: Script,
    leave: Script,
    admit: Script,
    expire: Script,
    claim: Script,
    consume: Script,
    release: Script,
    update_settings: Script,
    stats: Script,
    register: Script,
    preview: Script,
    busy: Script,
    delete: Script,
    forget: Script,
    job_enqueue: Script,
    job_claim: Script,
    job_ack: Script,
    job_nack: Script,
    job_reap: Script,
    job_dead: Script,
    job_replay: Script,
    job_counts: Script,
    job_pause: Script,
    job_resume: Script,
    job_paused: Script,
    limiter_log: Script,
    limiter_window: Script,
    draw_schedule: Script,
    draw_begin: Script,
    draw_write: Script,
    draw_finish: Script,
    draw_entrants: Script,
    draw_seal: Script,
    draw_beacon: Script,
    draw_round: Script,
}

/// Helpers shared by every waiting-room, job and limiter script (integers, `|` records, the clock).
const UTIL: &str = include_str!("lua/util.lua");
const QUEUE_BASE: &str = include_str!("lua/queue_base.lua");
const QUEUE_COMMON: &str = include_str!("lua/queue_common.lua");
const JOBS_COMMON: &str = include_str!("lua/jobs_common.lua");
const LIMITER_COMMON: &str = include_str!("lua/limiter_common.lua");

impl Scripts {
    fn new() -> Scripts {
        let queue = |body: &str| Script::new(&[UTIL, QUEUE_BASE, QUEUE_COMMON, body].join("\n"));
        // The hot read and entry scripts carry only the base prelude: less Lua to set up on every call.
        let fast = |body: &str| Script::new(&[UTIL, QUEUE_BASE, body].join("\n"));
        let job = |body: &str| Script::new(&[UTIL, JOBS_COMMON, body].join("\n"));
        let limiter = |body: &str| Script::new(&[UTIL, LIMITER_COMMON, body].join("\n"));
        Scripts {
            enter: queue(include_str!("lua/enter.lua")),
            enter_fast: fast(include_str!("lua/enter_fast.lua")),
            restore: queue(include_str!("lua/restore.lua")),
            position: fast(include_str!("lua/position.lua")),
            poll: fast(include_str!("lua/poll.lua")),
            leave: queue(include_str!("lua/leave.lua")),
            admit: queue(include_str!("lua/admit.lua")),
            expire: queue(include_str!("lua/expire.lua")),
            claim: queue(include_str!("lua/claim.lua")),
            consume: queue(include_str!("lua/consume.lua")),
            release: queue(include_str!("lua/release.lua")),
            update_settings: queue(include_str!("lua/update_settings.lua")),
            stats: queue(include_str!("lua/stats.lua")),
            // The registry's own script: one key, in the {rg} slot, no queue prelude.
            register: Script::new(include_str!("lua/register.lua")),
            preview: queue(include_str!("lua/preview.lua")),
            busy: queue(include_str!("lua/busy.lua")),
            delete: queue(include_str!("lua/delete.lua")),
            forget: queue(include_str!("lua/forget.lua")),
            job_enqueue: job(include_str!("lua/job_enqueue.lua")),
            job_claim: job(include_str!("lua/job_claim.lua")),
            job_ack: job(include_str!("lua/job_ack.lua")),
            job_nack: job(include_str!("lua/job_nack.lua")),
            job_reap: job(include_str!("lua/job_reap.lua")),
            job_dead: job(include_str!("lua/job_dead.lua")),
            job_replay: job(include_str!("lua/job_replay.lua")),
            job_counts: job(include_str!("lua/job_counts.lua")),
            job_pause: job(include_str!("lua/job_pause.lua")),
            job_resume: job(include_str!("lua/job_resume.lua")),
            job_paused: job(include_str!("lua/job_paused.lua")),
            limiter_log: limiter(include_str!("lua/limiter_log.lua")),
            limiter_window: limiter(include_str!("lua/limiter_window.lua")),
            draw_schedule: queue(include_str!("lua/draw_schedule.lua")),
            draw_begin: queue(include_str!("lua/draw_begin.lua")),
            draw_write: queue(include_str!("lua/draw_write.lua")),
            draw_finish: queue(include_str!("lua/draw_finish.lua")),
            draw_entrants: queue(include_str!("lua/draw_entrants.lua")),
            draw_seal: queue(include_str!("lua/draw_seal.lua")),
            draw_beacon: queue(include_str!("lua/draw_beacon.lua")),
            draw_round: queue(include_str!("lua/draw_round.lua")),
        }
    }
}

pub use super::waiting::Coalescing;

/// The Redis store: implements [`QueueStore`](crate::queue::QueueStore), [`JobStore`](crate::queue::JobStore)
/// and [`RateLimiter`](crate::queue::RateLimiter). Cheap to share behind an `Arc`; every instance of the
/// service opens its own and they agree through Redis.
pub struct RedisStore {
    connection: Connection,
    options: RedisOptions,
    scripts: Scripts,
    /// Settings of a new queue, as script arguments (ARGV 3..10).
    default_args: Vec<String>,
    /// Test and drill hook: when set, every operation fails as if Redis were unreachable.
    unreachable: AtomicBool,
    cluster: bool,
    /// Every queue's settings as this instance last saw them, kept out of Redis's reach.
    kept: KeptSettings,
    /// What the last [`keep_settings`](crate::queue::QueueStore::keep_settings) sweep read: the store-wide
    /// settings version and when every queue was last read (see `waiting.rs`).
    kept_sweep: parking_lot::Mutex<KeptSweep>,
    /// This store, for the coalescing lanes' driver tasks (weak: the lanes belong to the store).
    me: Weak<RedisStore>,
    /// Concurrent entries, one `enter_fast.lua` call per queue per round.
    entries: Coalescer<MemberId, EnterOutcome>,
    /// Concurrent polls (member, poll burst), one `poll.lua` call per queue per round.
    polls: Coalescer<(MemberId, u32), PollAnswer>,
}

/// The state of the kept-settings sweep between rounds.
#[derive(Debug, Default)]
pub(crate) struct KeptSweep {
    /// The settings version (`{rg}:settings-version`) the last full read saw.
    pub(crate) version: Option<i64>,
    /// When every queue's settings were last read.
    pub(crate) last_full: Option<std::time::Instant>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.options.prefix)
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects. One URL: a standalone server, unless that server says it runs in cluster mode (then it is
    /// used as the cluster's seed). Several URLs: the nodes of a cluster.
    pub async fn connect(urls: &[String], options: RedisOptions) -> Result<Arc<RedisStore>, StoreError> {
        if options.prefix.contains(['{', '}']) {
            return Err(StoreError::Unavailable(format!(
                "redis key prefix {:?} must not contain braces (they would move the hash tag)",
                options.prefix
            )));
        }
        let (connection, cluster) = Connection::open(urls, options.timeouts).await?;
        let s = &options.default_settings;
        let default_args = settings_args(s);
        Ok(Arc::new_cyclic(|me| RedisStore {
            connection,
            options,
            scripts: Scripts::new(),
            default_args,
            unreachable: AtomicBool::new(false),
            cluster,
            kept: KeptSettings::default(),
            kept_sweep: parking_lot::Mutex::new(KeptSweep::default()),
            me: me.clone(),
            entries: Coalescer::new(RedisStore::enter_batch),
            polls: Coalescer::new(RedisStore::poll_batch),
        }))
    }

    /// How concurrent hot-path calls were coalesced so far: script calls made against requests answered,
    /// for entries and for polls (benchmarks, tests).
    #[must_use]
    pub fn coalescing(&self) -> Coalescing {
        let (entry_calls, entries) = self.entries.counts();
        let (poll_calls, polls) = self.polls.counts();
        Coalescing {
            entry_calls,
            entries,
            poll_calls,
            polls,
        }
    }

    /// Whether this store talks to a Redis Cluster.
    #[must_use]
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The key prefix.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.options.prefix
    }

    /// Simulates losing Redis (a partition): while `true`, every operation answers
    /// [`StoreError::Unavailable`], exactly like a real connection failure. For fail-closed tests and drills.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.unreachable.store(unreachable, Ordering::SeqCst);
    }

    /// `MEMORY USAGE` of a queue's waiting set in bytes (for the memory benchmark).
    pub async fn waiting_memory_bytes(&self, queue: &QueueName) -> Result<u64, StoreError> {
        let key = self.queue_keys(queue)[1].clone();
        let bytes: Option<u64> = self
            .connection
            .query(redis::cmd("MEMORY").arg("USAGE").arg(&key).arg("SAMPLES").arg(0))
            .await?;
        Ok(bytes.unwrap_or(0))
    }

    /// Deletes every key under this store's prefix (tests and teardown). Standalone only: on a cluster the
    /// keys are spread over nodes that one `SCAN` does not visit, so it answers an error there.
    pub async fn purge_prefix(&self) -> Result<u64, StoreError> {
        self.connection
            .purge_matching(&format!("{}*", self.options.prefix))
            .await
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.unreachable.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("redis unreachable".into()));
        }
        Ok(())
    }

    /// ARGV[1]: the injected time, or empty for Redis `TIME`.
    fn now_arg(&self) -> String {
        match &self.options.time {
            RedisTime::Server => String::new(),
            RedisTime::Injected(clock) => clock.now_millis().to_string(),
        }
    }

    fn queue_keys(&self, queue: &QueueName) -> [String; 6] {
        let base = format!("{}{{rg:q:{}}}", self.options.prefix, queue.as_str());
        ["meta", "waiting", "holders", "deadlines", "arrivals", "admitted"].map(|s| format!("{base}:{s}"))
    }

    /// The per-member poll log of `poll.lua`: it carries the queue's hash tag, so the poll limit and the
    /// position are one script on one slot. Expires when idle, like the limiter's keys.
    fn poll_key(&self, queue: &QueueName, member: &str) -> String {
        // One buffer, no formatting machinery: this runs once per poll.
        let (prefix, queue) = (self.options.prefix.as_str(), queue.as_str());
        let mut key = String::with_capacity(prefix.len() + queue.len() + member.len() + 13);
        key.push_str(prefix);
        key.push_str("{rg:q:");
        key.push_str(queue);
        key.push_str("}:poll:");
        escape_into(&mut key, member);
        key
    }

    fn job_keys(&self, queue: &str) -> [String; 9] {
        let base = format!("{}{{rg:j:{}}}", self.options.prefix, escape(queue));
        [
            "ready",
            "processing",
            "dead",
            "records",
            "payloads",
            "reasons",
            "meta",
            "parked",
            "paused",
        ]
        .map(|s| format!("{base}:{s}"))
    }

    fn limiter_keys(&self, key: &str) -> [String; 3] {
        let base = format!("{}{{rg:rl:{}}}", self.options.prefix, escape(key));
        ["log", "window", "meta"].map(|s| format!("{base}:{s}"))
    }

    /// Bumped after every settings write and every delete, by any instance: the kept-settings sweep reads
    /// every queue again only when it moved (see `keep_settings` in `waiting.rs`).
    fn settings_version_key(&self) -> String {
        format!("{}{{rg}}:settings-version", self.options.prefix)
    }

    async fn bump_settings_version(&self) -> Result<(), StoreError> {
        let _: i64 = self
            .connection
            .query(redis::cmd("INCR").arg(self.settings_version_key()))
            .await?;
        Ok(())
    }

    fn registry_key(&self) -> String {
        format!("{}{{rg}}:queues", self.options.prefix)
    }

    fn active_key(&self) -> String {
        format!("{}{{rg}}:active", self.options.prefix)
    }

    /// Puts `queue` in the active set (idempotent). Called after an entry that may have made an empty
    /// queue busy: after, not before, so that a scheduler taking the queue out concurrently either sees the
    /// entry in its re-check ([`RedisStore::deactivate_if_idle`]) or is followed by this `SADD`.
    pub(super) async fn activate(&self, queue: &QueueName) -> Result<(), StoreError> {
        let _: i64 = self
            .connection
            .query(redis::cmd("SADD").arg(self.active_key()).arg(queue.as_str()))
            .await?;
        Ok(())
    }

    /// Takes a queue that an admission step found empty out of the active set, then looks again and puts
    /// it back if somebody entered meanwhile. The active set spans queues, so no one script can hold it and
    /// a queue's keys together on a cluster; the remove-then-recheck order, with entries adding after they
    /// enter, keeps every busy queue listed.
    pub(super) async fn deactivate_if_idle(&self, queue: &QueueName) -> Result<(), StoreError> {
        let _: i64 = self
            .connection
            .query(redis::cmd("SREM").arg(self.active_key()).arg(queue.as_str()))
            .await?;
        let call = self.queue_call(&self.scripts.busy, queue);
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        if reply.int()? == 1 {
            self.activate(queue).await?;
        }
        Ok(())
    }

    /// Reserves `queue` a place in the registry before its first entry creates it, under `max_queues`.
    async fn register_new(&self, queue: &QueueName) -> Result<(), StoreError> {
        let mut call = self.scripts.register.prepare_invoke();
        call.key(self.registry_key())
            .arg(queue.as_str())
            .arg(self.options.max_queues);
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        if reply.int()? == 1 {
            Ok(())
        } else {
            Err(StoreError::TooManyQueues {
                max_queues: self.options.max_queues,
            })
        }
    }

    /// A queue script invocation with the common arguments (keys 1–6, ARGV 1–11).
    fn queue_call<'a>(&self, script: &'a Script, queue: &QueueName) -> ScriptInvocation<'a> {
        self.creating_call(script, queue, None)
    }

    /// [`RedisStore::queue_call`] for a script that may make the queue: with `kept` settings (a queue the
    /// store lost) in place of the defaults as ARGV 3–11.
    fn creating_call<'a>(
        &self,
        script: &'a Script,
        queue: &QueueName,
        kept: Option<&Kept>,
    ) -> ScriptInvocation<'a> {
        let mut invocation = script.prepare_invoke();
        for key in self.queue_keys(queue) {
            invocation.key(key);
        }
        invocation
            .arg(self.now_arg())
            .arg(self.options.consumed_memory_ms);
        match kept {
            None => {
                for arg in &self.default_args {
                    invocation.arg(arg);
                }
            }
            Some(kept) => {
                for arg in settings_args(&kept.settings) {
                    invocation.arg(arg);
                }
            }
        }
        invocation
    }

    /// [`RedisStore::creating_call`] with a seventh key, the queue's retired epochs (`restore.lua`,
    /// `delete.lua`, `forget.lua`): kept beside the queue's keys (same slot) for 30 days after a delete.
    fn retiring_call<'a>(
        &self,
        script: &'a Script,
        queue: &QueueName,
        kept: Option<&Kept>,
    ) -> ScriptInvocation<'a> {
        let mut invocation = self.creating_call(script, queue, kept);
        invocation.key(format!(
            "{}{{rg:q:{}}}:retired",
            self.options.prefix,
            queue.as_str()
        ));
        invocation
    }

    /// The settings this instance keeps of every queue, out of Redis's reach.
    #[must_use]
    pub fn kept_settings(&self) -> &KeptSettings {
        &self.kept
    }

    /// A hot-path script invocation (`enter_fast`, `position`, `poll`): keys 1–6 and only ARGV 1 (the
    /// injected time); the script's own arguments follow from ARGV 2. Less for Redis to parse per call.
    fn fast_call<'a>(&self, script: &'a Script, queue: &QueueName) -> ScriptInvocation<'a> {
        let mut invocation = script.prepare_invoke();
        for key in self.queue_keys(queue) {
            invocation.key(key);
        }
        invocation.arg(self.now_arg());
        invocation
    }

    fn job_call<'a>(&self, script: &'a Script, queue: &str) -> ScriptInvocation<'a> {
        let mut invocation = script.prepare_invoke();
        for key in self.job_keys(queue) {
            invocation.key(key);
        }
        invocation.arg(self.now_arg());
        invocation
    }

    /// Puts `queue` in the registry before a script may create it, so a crash between the two can leave a
    /// listed queue that does not exist yet (harmless: it reads as absent) but never an unlisted queue that
    /// no scheduler would admit from.
    async fn register(&self, queue: &QueueName) -> Result<(), StoreError> {
        let _: i64 = self
            .connection
            .query(redis::cmd("SADD").arg(self.registry_key()).arg(queue.as_str()))
            .await?;
        Ok(())
    }
}

/// The nine setting fields as stored in the meta hash, in `SETTING_FIELDS` order.
fn settings_args(s: &QueueSettings) -> Vec<String> {
    vec![
        format!("{}", s.admit_per_second),
        s.admit_rate_milli().to_string(),
        s.tick_millis.to_string(),
        s.token_ttl_seconds.to_string(),
        s.claim_ttl_seconds.to_string(),
        s.max_active.map_or_else(String::new, |n| n.to_string()),
        if s.paused { "1" } else { "0" }.to_string(),
        fail_mode_str(s.fail_mode).to_string(),
        s.abandon_after_seconds.to_string(),
    ]
}

fn fail_mode_str(mode: FailMode) -> &'static str {
    match mode {
        FailMode::Closed => "closed",
        FailMode::Open => "open",
    }
}

fn unhex<const N: usize>(raw: &str) -> Result<[u8; N], StoreError> {
    let mut out = [0u8; N];
    hex::decode_to_slice(raw, &mut out).map_err(|_| StoreError::Corrupt(format!("bad hex field {raw:?}")))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_keeps_the_hash_tag_and_hex_round_trips() {
        assert_eq!(escape("poll:q:{m}%"), "poll:q:%7Bm%7D%25");
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(hex::encode(bytes), "0001abff");
        assert_eq!(unhex::<4>("0001abff").unwrap(), bytes);
        assert!(unhex::<4>("0001abf").is_err());
        let args = settings_args(&QueueSettings {
            admit_per_second: 0.5,
            max_active: Some(7),
            ..QueueSettings::default()
        });
        assert_eq!(
            args,
            ["0.5", "500", "1000", "300", "30", "7", "0", "closed", "300"]
        );
    }
}
