//! One test for two implementations of the waiting room's rules (issue 10).
//!
//! The embedded store runs `rankgate-core`'s queue rules in Rust; the Redis store re-states them in Lua,
//! one atomic script per step (transitions, the global budget, the estimator, the poll limiter and its
//! polling tiers). This property test proves the two agree: it generates random operation sequences over
//! three queues and four members (entries, a crowd of a hundred entries, polls, positions, scheduler ticks,
//! raw admission steps, claims with the right, a stale or a wrong token, the gate's claim-then-consume or
//! claim-then-release, consumes and releases of known and unknown claim ids, leaves, expiry steps, the
//! clock moving forward past TTLs and `abandon_after_seconds` (the crowd is abandoned) and stepping back, settings changes valid and invalid, the admin view,
//! the janitor's forget and admin deletes; a first entry may meet `max_queues`), runs each sequence
//! **in lock step** against the embedded store
//! and against Redis (standalone at 127.0.0.1:6379, and the 3-node Cluster this binary starts), on **one**
//! shared [`ManualClock`], and after every step compares the step's outcome and every view: each member's
//! position, every queue's settings, stats and admission preview, the queue list and the active list.
//!
//! What is compared as is and what is normalized (and why) is spelled out in [`Normalized`] and
//! [`compare_active`]; nothing else is left out. Tokens are random on each side, so a view's token is
//! compared by presence and expiry, and each side claims with the token *it* handed out. Claim ids are
//! chosen by the caller, so both sides get the same ones.
//!
//! Isolation: each case gets a fresh temp directory (embedded) and a fresh key prefix (Redis), deleted when
//! the case ends. Bounded: 64 cases of at most 40 operations per topology; proptest shrinks a failure to a
//! minimal sequence and records its seed in `queue_equivalence.proptest-regressions` beside this file,
//! replayed first on every run. `PROPTEST_CASES=N` runs a longer hunt. Each topology's test prints how
//! often each kind of outcome was reached and the time spent inside each backend's calls (`--nocapture`).
//!
//! [`jobs_and_limits`] does the same for the two other rule sets the Redis store re-states in Lua: the rate
//! limiter's sliding log and window counter (keys used with changing limits, windows and bucket counts)
//! and the job queue (enqueue, claim, ack and nack with current and stale claim tokens, reap, the dead
//! set, replay), with the clock moving both ways.
//!
//! The differences it found, each fixed with a regression test of its own in the suites that own the rule:
//! the embedded store recorded its clock guard on reads that Redis leaves alone
//! (`reads_record_the_clock_guard_only_when_they_read_a_token`), and the poll limit ran on the queue's
//! guard in `poll.lua` but on a per-shard guard in the embedded limiter, where the rule is one guard per
//! key over the store clock (`each_limiter_key_has_its_own_clock_guard`,
//! `the_poll_limit_keeps_its_own_clock_guard_not_the_queues`); the window counter in core kept its
//! buckets in arrival order where the script keeps a set by start, which differ once a key changes its
//! window or bucket count (`buckets_on_two_grids_stay_one_set_ordered_by_start`); the embedded job store
//! kept one clock guard for all job queues that an ack did not move
//! (`each_job_queue_has_its_own_clock_guard_moved_by_every_step`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};
use rankgate_core::ids::MemberId;
use rankgate_core::limiter::RateLimit;
use rankgate_core::queue::{
    AdmissionMode, Digest, EntryChallenge, FailMode, MemberStatus, QueueName, QueueSettings, SettingsError,
    SettingsPatch,
};
use rankgate_store::clock::ManualClock;
use rankgate_store::queue::embedded::{EmbeddedOptions, EmbeddedStore};
use rankgate_store::queue::redis::{RedisOptions, RedisStore, RedisTime};
use rankgate_store::queue::token::{digest_of, TokenSecret};
use rankgate_store::queue::{
    poll_window_seconds, ClaimOutcome, EnterOutcome, MemberView, QueueStore, RateLimiter, RateLimiterKind,
    StoreError,
};
use rankgate_store::synchronous::Synchronous;
use rankgate_testkit::redis_servers::{cluster, standalone_url, unique_prefix, KeyCleanup};

const QUEUES: [&str; 3] = ["eq-a", "eq-b", "eq-c"];
const MEMBERS: [&str; 4] = ["m-0", "m-1", "m-2", "m-3"];
/// Small, so the third queue's first entry meets the limit (an admin PUT may still create it).
const MAX_QUEUES: usize = 2;
/// Short, so remembered consumed members are forgotten within a case.
const CONSUMED_MEMORY_MS: i64 = 20_000;
const START_MS: i64 = 1_700_000_000_000;
/// Members a [`Op::Crowd`] enters: enough to put the test's members past the first polling tier.
const CROWD: usize = 100;
/// The server's admission chunk (`ADMIT_CHUNK` in the waiting-room service).
const ADMIT_CHUNK: u64 = 1_000;

/// Settings a queue gets from its first entry: slow and short-lived enough that a 40-step case sees the
/// budget run dry, tokens and claims expire, the estimator move, and waiting members abandoned. (The
/// views after every step read each of [`MEMBERS`]' positions, which counts as polling, so it is the
/// crowd's members, never read, who go unseen past `abandon_after_seconds` when the clock jumps.)
fn default_settings() -> QueueSettings {
    QueueSettings {
        admit_per_second: 2.0,
        token_ttl_seconds: 20,
        claim_ttl_seconds: 5,
        abandon_after_seconds: 20,
        ..QueueSettings::default()
    }
}

/// Which token a claim presents.
#[derive(Debug, Clone, Copy)]
enum Presented {
    /// The last token this side showed the member in any view (it may have expired since).
    Latest,
    /// A token nobody was given.
    Wrong,
}

/// An operation. A member is an index into [`MEMBERS`]; for claims, consumes and releases an index past
/// them means "the n-th member this queue has shown a token to", resolved by [`resolve`] before the step.
#[derive(Debug, Clone)]
enum Op {
    Enter(usize, usize),
    /// A hundred other members enter, one after another, so the test's members wait at ranks of 100 and
    /// beyond (the polling tiers) and admission steps pop strangers too.
    Crowd(usize),
    Position(usize, usize),
    /// A member's poll with its per-member limit (`poll_burst`), as the service does it.
    Poll(usize, usize, u32),
    /// The scheduler's tick: preview, prepare what it needs, admit (the service's `admit_queue_now`).
    Tick(usize),
    /// One raw admission step offered this many tokens.
    Admit(usize, usize),
    Claim(usize, usize, Presented),
    /// Consume with the member's n-th claim id (modulo how many it has), or a stranger's when it has none.
    Consume(usize, usize, usize),
    Release(usize, usize, usize),
    /// The order gate's whole step for a member holding a token: claim with the latest token, then consume
    /// (the upstream answered 2xx) or release (it did not).
    Gate(usize, usize, bool),
    Leave(usize, usize),
    Expire(usize),
    Advance(i64),
    /// The clock steps back (NTP): every guard must hold.
    StepBack(i64),
    Settings(usize, SettingsPatch),
    /// The admin view of one queue (`GET /v1/admin/queues/{queue}`).
    Stats(usize),
    Forget(usize, i64),
    Delete(usize),
}

fn rate() -> impl Strategy<Value = f64> {
    prop_oneof![
        // Valid: fractional, slow, the default, at the members-per-tick cap with the default tick.
        4 => prop::sample::select(vec![0.5, 1.0, 2.0, 3.0, 1.0 / 3.0, 0.0005, 50.0, 100_000.0]),
        // Invalid: not positive, not finite, above 1e6, or rounding to zero milli-members per second.
        1 => prop::sample::select(vec![0.0, -1.0, f64::NAN, f64::INFINITY, 2e6, 0.0004]),
    ]
}

fn patch() -> impl Strategy<Value = SettingsPatch> {
    let tick = prop_oneof![
        4 => prop::sample::select(vec![10u64, 250, 1000, 2000, 60_000]),
        1 => prop::sample::select(vec![0u64, 9, 60_001, 3_600_000]),
    ];
    let token_ttl = prop::sample::select(vec![1u64, 2, 5, 20, 300, 604_800, 0, 604_801]);
    let claim_ttl = prop::sample::select(vec![1u64, 3, 5, 30, 86_400, 0, 86_401]);
    let max_active = prop_oneof![
        Just(None),
        (1u64..=3).prop_map(Some),
        Just(Some(0)),
        Just(Some(10_000_000)),
        Just(Some(10_000_001)),
    ];
    let fail_mode = prop::sample::select(vec![FailMode::Closed, FailMode::Open]);
    let abandon = prop::sample::select(vec![5u64, 10, 20, 300, 4, 86_401]);
    // Adaptive admission's settings (issue 12), valid and not: mode, min, max; the Redis store keeps them
    // in their own meta field, so both backends must agree on what a PUT keeps and refuses.
    let adaptive = (
        prop::sample::select(vec![AdmissionMode::Fixed, AdmissionMode::Adaptive]),
        prop::sample::select(vec![0.5f64, 1.0, 3.0, 0.0, 1e7]),
        prop::sample::select(vec![2.0f64, 10.0, 200_000.0, 0.25]),
    );
    (
        (
            prop::option::weighted(0.4, rate()),
            prop::option::weighted(0.3, tick),
            prop::option::weighted(0.25, token_ttl),
            prop::option::weighted(0.25, claim_ttl),
            prop::option::weighted(0.3, max_active),
            prop::option::weighted(0.25, any::<bool>()),
            prop::option::weighted(0.1, fail_mode),
            prop::option::weighted(0.2, abandon),
        ),
        prop::option::weighted(0.2, adaptive),
        // The entry challenge's settings (issue 28) ride in the same JSON meta field on Redis; 40 is
        // out of range (both must refuse it alike).
        prop::option::weighted(
            0.2,
            (
                prop::sample::select(vec![
                    EntryChallenge::None,
                    EntryChallenge::Pow,
                    EntryChallenge::Captcha,
                ]),
                prop::sample::select(vec![0u32, 18, 32, 40]),
            ),
        ),
    )
        .prop_map(
            |(
                (
                    admit_per_second,
                    tick_millis,
                    token_ttl_seconds,
                    claim_ttl_seconds,
                    max_active,
                    paused,
                    fail_mode,
                    abandon_after_seconds,
                ),
                adaptive,
                entry,
            )| {
                SettingsPatch {
                    entry_challenge: entry.map(|e| e.0),
                    pow_difficulty: entry.map(|e| e.1),
                    admission_mode: adaptive.map(|a| a.0),
                    min_admit_per_second: adaptive.map(|a| a.1),
                    max_admit_per_second: adaptive.map(|a| a.2),
                    target_p95_millis: None,
                    max_error_rate: None,
                    abandon_after_seconds,
                    admit_per_second,
                    tick_millis,
                    token_ttl_seconds,
                    claim_ttl_seconds,
                    max_active,
                    paused,
                    fail_mode,
                }
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    // Mostly the first queue, so its members get far enough to claim and consume; the third queue is
    // the one a first entry may not create (MAX_QUEUES).
    let q = || prop::sample::select(vec![0usize, 0, 0, 0, 0, 1, 1, 1, 2]);
    let m = || 0..MEMBERS.len();
    // A claim, consume or release mostly names a member who was shown a token (see `resolve`), since a
    // random member mostly holds none.
    let holder = || 0..MEMBERS.len() * 3;
    prop_oneof![
        7 => (q(), m()).prop_map(|(q, m)| Op::Enter(q, m)),
        1 => q().prop_map(Op::Crowd),
        2 => (q(), m()).prop_map(|(q, m)| Op::Position(q, m)),
        3 => (q(), m(), 1u32..=3).prop_map(|(q, m, burst)| Op::Poll(q, m, burst)),
        7 => q().prop_map(Op::Tick),
        1 => (q(), 0usize..=3).prop_map(|(q, n)| Op::Admit(q, n)),
        7 => (q(), holder(), prop_oneof![6 => Just(Presented::Latest), 1 => Just(Presented::Wrong)])
            .prop_map(|(q, m, p)| Op::Claim(q, m, p)),
        4 => (q(), holder(), 0usize..3).prop_map(|(q, m, c)| Op::Consume(q, m, c)),
        3 => (q(), holder(), 0usize..3).prop_map(|(q, m, c)| Op::Release(q, m, c)),
        5 => (q(), holder(), any::<bool>()).prop_map(|(q, m, commit)| Op::Gate(q, m, commit)),
        1 => (q(), m()).prop_map(|(q, m)| Op::Leave(q, m)),
        1 => q().prop_map(Op::Expire),
        4 => prop_oneof![
            3 => 0i64..1_500,
            1 => prop::sample::select(vec![1_000i64, 5_000, 20_000, 25_000, 61_000]),
        ]
        .prop_map(Op::Advance),
        1 => prop::sample::select(vec![1i64, 500, 3_000]).prop_map(Op::StepBack),
        2 => (q(), patch()).prop_map(|(q, p)| Op::Settings(q, p)),
        1 => (q(), prop::sample::select(vec![0i64, 10_000])).prop_map(|(q, idle)| Op::Forget(q, idle)),
        1 => q().prop_map(Op::Stats),
        1 => q().prop_map(Op::Delete),
    ]
}

/// What a step is compared by. Each field is either the backend's answer as is or normalized here, and
/// every normalization says why.
#[derive(Debug, Clone, PartialEq)]
enum Normalized {
    /// A member view. The token is random per side (each side's scheduler prepared its own), so it is
    /// compared by presence and expiry, never by its bytes. Everything else is as the store answered.
    View {
        status: MemberStatus,
        rank: Option<u64>,
        waiting: u64,
        token_expires_ms: Option<i64>,
        last_outcome: Option<rankgate_store::queue::LastOutcome>,
        estimate: Option<u64>,
        estimate_p90: Option<u64>,
        now_ms: i64,
        /// The place an entry's ticket would name (entries only; the epochs differ by design).
        place: Option<i64>,
    },
    /// The shared clock after it moved (the same on both sides by construction; kept in the trace so a
    /// failure report reads as a timeline).
    Clock(i64),
    /// Anything else with a plain `Debug` form that is the same on both sides when they agree.
    Plain(String),
    /// A store error. Only its kind is compared: the message names backend internals (a Redis error, a
    /// SQLite path) that legitimately differ; `TooManyQueues` carries the configured limit, compared too.
    Error(String),
}

fn view(view: &MemberView) -> Normalized {
    Normalized::View {
        status: view.status,
        rank: view.rank,
        waiting: view.waiting_count,
        token_expires_ms: view.token.map(|(_, expires)| expires),
        last_outcome: view.last_outcome,
        estimate: view.estimated_wait_seconds,
        estimate_p90: view.estimated_wait_p90_seconds,
        now_ms: view.now_ms,
        place: view.placement.map(|placement| placement.place),
    }
}

fn error(error: &StoreError) -> Normalized {
    Normalized::Error(match error {
        StoreError::Unavailable(_) => "Unavailable".into(),
        StoreError::Corrupt(_) => "Corrupt".into(),
        StoreError::TooManyQueues { max_queues } => format!("TooManyQueues({max_queues})"),
    })
}

/// Stats with the epoch left out: each store draws its own (a random number, Redis's clock in µs), and
/// only that it stays the same matters (`queue_store_loss.rs` checks when it changes).
fn without_epoch(
    stats: Option<rankgate_store::queue::QueueStats>,
) -> Option<rankgate_store::queue::QueueStats> {
    stats.map(|stats| rankgate_store::queue::QueueStats { epoch: 0, ..stats })
}

fn plain(value: impl std::fmt::Debug) -> Normalized {
    Normalized::Plain(format!("{value:?}"))
}

/// One backend under test, and what the test remembers about it.
struct Side {
    queues: Arc<dyn QueueStore>,
    limiter: Arc<dyn RateLimiter>,
    secret: TokenSecret,
    /// The last token this side showed each (queue, member), derived from the nonce in a view.
    tokens: HashMap<(usize, usize), String>,
    /// The status of each (queue, member) in the last view of them.
    statuses: HashMap<(usize, usize), MemberStatus>,
    /// Wall time spent inside this side's store calls.
    busy: Duration,
    _guard: Box<dyn std::any::Any>,
}

fn queue_name(q: usize) -> QueueName {
    QueueName::parse(QUEUES[q]).expect("valid queue name")
}

fn member_id(m: usize) -> MemberId {
    MemberId::parse(MEMBERS[m]).expect("valid member id")
}

impl Side {
    fn embedded(clock: &ManualClock) -> Side {
        let dir = tempfile::tempdir().expect("temp dir");
        let options = EmbeddedOptions {
            default_settings: default_settings(),
            consumed_memory_ms: CONSUMED_MEMORY_MS,
            // Durability is not what is compared; NORMAL skips an fsync per step.
            synchronous: Synchronous::Normal,
            max_queues: MAX_QUEUES,
        };
        let store = EmbeddedStore::open(dir.path(), Arc::new(clock.clone()), options).expect("open embedded");
        Side {
            queues: store.clone(),
            limiter: store,
            secret: TokenSecret::generate().expect("os rng"),
            tokens: HashMap::new(),
            statuses: HashMap::new(),
            busy: Duration::ZERO,
            _guard: Box::new(dir),
        }
    }

    async fn redis(urls: &[String], clock: &ManualClock) -> Side {
        let prefix = unique_prefix();
        let options = RedisOptions {
            prefix: prefix.clone(),
            default_settings: default_settings(),
            consumed_memory_ms: CONSUMED_MEMORY_MS,
            time: RedisTime::Injected(Arc::new(clock.clone())),
            max_queues: MAX_QUEUES,
            ..RedisOptions::default()
        };
        let store = RedisStore::connect(urls, options)
            .await
            .unwrap_or_else(|e| panic!("connecting to redis at {urls:?}: {e}"));
        assert_eq!(store.is_cluster(), urls.len() > 1, "the intended topology");
        Side {
            queues: store.clone(),
            limiter: store,
            secret: TokenSecret::generate().expect("os rng"),
            tokens: HashMap::new(),
            statuses: HashMap::new(),
            busy: Duration::ZERO,
            _guard: Box::new(KeyCleanup {
                nodes: urls.to_vec(),
                prefix,
            }),
        }
    }

    /// Remembers the token a view shows, and normalizes the view.
    fn seen(&mut self, q: usize, m: usize, v: &MemberView) -> Normalized {
        if let Some((nonce, _)) = v.token {
            self.tokens.insert((q, m), self.secret.token_for(&nonce));
        }
        self.statuses.insert((q, m), v.status);
        view(v)
    }

    async fn position(&mut self, q: usize, m: usize) -> Normalized {
        match self.queues.position(&queue_name(q), &member_id(m)).await {
            Ok(v) => self.seen(q, m, &v),
            Err(e) => error(&e),
        }
    }

    /// The member's poll, exactly as the waiting-room service runs it: [`QueueStore::poll`], on Redis one
    /// script for the position and the limit (its window checked against the tiers in debug builds),
    /// elsewhere the position then the store's sliding log over `burst` polling intervals of the tier of
    /// the rank just read.
    async fn poll(&mut self, q: usize, m: usize, burst: u32) -> Vec<Normalized> {
        let (queue, member) = (queue_name(q), member_id(m));
        let answer = self
            .queues
            .poll(&queue, &member, burst, self.limiter.as_ref())
            .await
            .map(|(v, decision)| {
                (
                    v.clone(),
                    poll_window_seconds(v.rank, burst) as i64 * 1000,
                    decision,
                )
            });
        match answer {
            Ok((v, window_ms, decision)) => vec![self.seen(q, m, &v), plain((window_ms, decision))],
            Err(e) => vec![error(&e)],
        }
    }

    /// The scheduler's tick for one queue (the service's `admit_queue_now`, minus telemetry).
    async fn tick(&mut self, q: usize) -> Vec<Normalized> {
        let queue = queue_name(q);
        let mut out = Vec::new();
        let preview = match self.queues.admission_preview(&queue).await {
            Ok(Some(preview)) => preview,
            Ok(None) => return vec![plain("no queue")],
            Err(e) => return vec![error(&e)],
        };
        out.push(plain(&preview));
        if preview.settings.paused {
            out.push(match self.queues.expire_due(&queue).await {
                Ok(expired) => plain(expired),
                Err(e) => error(&e),
            });
            return out;
        }
        let mut remaining = preview.tokens_needed();
        loop {
            let offered = remaining.min(ADMIT_CHUNK);
            let tokens = (0..offered)
                .map(|_| self.secret.prepare().expect("os rng"))
                .collect();
            match self.queues.admit(&queue, tokens).await {
                Ok(step) => {
                    let admitted = step.admitted.len() as u64;
                    out.push(plain(&step));
                    remaining = remaining.saturating_sub(admitted);
                    if remaining == 0 || admitted < offered {
                        return out;
                    }
                }
                Err(e) => {
                    out.push(error(&e));
                    return out;
                }
            }
        }
    }

    /// Applies one operation; the answers to compare.
    async fn apply(
        &mut self,
        op: &Op,
        claims: &HashMap<(usize, usize), Vec<Digest>>,
        clock: &ManualClock,
    ) -> Vec<Normalized> {
        let started = Instant::now();
        let out = match *op {
            Op::Enter(q, m) => match self.queues.enter(&queue_name(q), &member_id(m)).await {
                Ok(EnterOutcome::Entered(v)) => vec![plain("Entered"), self.seen(q, m, &v)],
                Ok(EnterOutcome::AlreadyPresent(v)) => vec![plain("AlreadyPresent"), self.seen(q, m, &v)],
                Err(e) => vec![error(&e)],
            },
            Op::Crowd(q) => {
                let queue = queue_name(q);
                let mut out = Vec::with_capacity(CROWD);
                for i in 0..CROWD {
                    let stranger = MemberId::parse(&format!("crowd-{i:03}")).expect("valid member id");
                    out.push(match self.queues.enter(&queue, &stranger).await {
                        Ok(EnterOutcome::Entered(v)) => plain(("Entered", view(&v))),
                        Ok(EnterOutcome::AlreadyPresent(v)) => plain(("AlreadyPresent", view(&v))),
                        Err(e) => error(&e),
                    });
                }
                out
            }
            Op::Position(q, m) => vec![self.position(q, m).await],
            Op::Poll(q, m, burst) => self.poll(q, m, burst).await,
            Op::Tick(q) => self.tick(q).await,
            Op::Admit(q, offered) => {
                let tokens = (0..offered)
                    .map(|_| self.secret.prepare().expect("os rng"))
                    .collect();
                vec![match self.queues.admit(&queue_name(q), tokens).await {
                    Ok(step) => plain(step),
                    Err(e) => error(&e),
                }]
            }
            Op::Claim(q, m, presented) => {
                let token = match (presented, self.tokens.get(&(q, m))) {
                    (Presented::Latest, Some(token)) => digest_of(token),
                    _ => digest_of("a token nobody was given"),
                };
                // The claim id the op sequence chose: the same bytes on both sides.
                let claim = *claims[&(q, m)]
                    .last()
                    .expect("the claim id was chosen before applying");
                vec![match self
                    .queues
                    .claim(&queue_name(q), &member_id(m), &token, &claim)
                    .await
                {
                    Ok(outcome) => plain(outcome),
                    Err(e) => error(&e),
                }]
            }
            Op::Gate(q, m, commit) => {
                let (queue, member) = (queue_name(q), member_id(m));
                let token = match self.tokens.get(&(q, m)) {
                    Some(token) => digest_of(token),
                    None => digest_of("a token nobody was given"),
                };
                let claim = *claims[&(q, m)]
                    .last()
                    .expect("the claim id was chosen before applying");
                match self.queues.claim(&queue, &member, &token, &claim).await {
                    Ok(outcome @ ClaimOutcome::Claimed { .. }) => {
                        let ended = if commit {
                            self.queues.consume(&queue, &member, &claim).await.map(plain)
                        } else {
                            self.queues.release(&queue, &member, &claim).await.map(plain)
                        };
                        vec![plain(outcome), ended.unwrap_or_else(|e| error(&e))]
                    }
                    Ok(refused) => vec![plain(refused)],
                    Err(e) => vec![error(&e)],
                }
            }
            Op::Consume(q, m, n) => {
                let claim = pick_claim(claims, q, m, n);
                vec![
                    match self.queues.consume(&queue_name(q), &member_id(m), &claim).await {
                        Ok(outcome) => plain(outcome),
                        Err(e) => error(&e),
                    },
                ]
            }
            Op::Release(q, m, n) => {
                let claim = pick_claim(claims, q, m, n);
                vec![
                    match self.queues.release(&queue_name(q), &member_id(m), &claim).await {
                        Ok(outcome) => plain(outcome),
                        Err(e) => error(&e),
                    },
                ]
            }
            Op::Leave(q, m) => vec![match self.queues.leave(&queue_name(q), &member_id(m)).await {
                Ok(outcome) => plain(outcome),
                Err(e) => error(&e),
            }],
            Op::Expire(q) => vec![match self.queues.expire_due(&queue_name(q)).await {
                Ok(outcome) => plain(outcome),
                Err(e) => error(&e),
            }],
            // The clock is shared: the driver moves it once, before either side applies the step.
            Op::Advance(_) | Op::StepBack(_) => vec![Normalized::Clock(clock_reading(clock))],
            Op::Settings(q, ref patch) => {
                vec![match self.queues.update_settings(&queue_name(q), patch).await {
                    Ok(Ok(settings)) => plain(Ok::<_, SettingsError>(settings)),
                    Ok(Err(invalid)) => plain(Err::<QueueSettings, _>((invalid.field(), invalid))),
                    Err(e) => error(&e),
                }]
            }
            Op::Forget(q, idle_ms) => vec![match self.queues.forget_if_idle(&queue_name(q), idle_ms).await {
                Ok(forgotten) => plain(("forgotten", forgotten)),
                Err(e) => error(&e),
            }],
            Op::Stats(q) => vec![match self.queues.stats(&queue_name(q)).await {
                Ok(stats) => plain(without_epoch(stats)),
                Err(e) => error(&e),
            }],
            Op::Delete(q) => vec![match self.queues.delete_queue(&queue_name(q)).await {
                Ok(existed) => plain(("deleted", existed)),
                Err(e) => error(&e),
            }],
        };
        self.busy += started.elapsed();
        out
    }

    /// Every view after a step: each queue's settings, stats and preview, the queue list, and each
    /// member's position. The active list is returned apart (see [`compare_active`]).
    async fn views(&mut self) -> (Vec<Normalized>, Vec<QueueName>) {
        let started = Instant::now();
        let mut out = Vec::new();
        for q in 0..QUEUES.len() {
            let queue = queue_name(q);
            out.push(match self.queues.settings(&queue).await {
                Ok(settings) => plain(settings),
                Err(e) => error(&e),
            });
            out.push(match self.queues.stats(&queue).await {
                Ok(stats) => plain(without_epoch(stats)),
                Err(e) => error(&e),
            });
            out.push(match self.queues.admission_preview(&queue).await {
                Ok(preview) => plain(preview),
                Err(e) => error(&e),
            });
            for m in 0..MEMBERS.len() {
                let position = self.position(q, m).await;
                out.push(position);
            }
        }
        out.push(match self.queues.queues().await {
            Ok(names) => plain(names),
            Err(e) => error(&e),
        });
        let active = self.queues.active_queues().await.expect("active queues");
        self.busy += started.elapsed();
        (out, active)
    }
}

fn clock_reading(clock: &ManualClock) -> i64 {
    use rankgate_store::clock::Clock as _;
    clock.now_millis()
}

/// The member's n-th claim id (modulo how many were chosen for it), or one never issued.
fn pick_claim(claims: &HashMap<(usize, usize), Vec<Digest>>, q: usize, m: usize, n: usize) -> Digest {
    match claims.get(&(q, m)) {
        Some(ids) if !ids.is_empty() => ids[n % ids.len()],
        _ => digest_of("a claim id nobody was given"),
    }
}

/// The active list is the one view whose answer is implementation-defined within a contract:
/// `QueueStore::active_queues` "may list a queue that just went idle (a visit is harmless); never misses one
/// that has had somebody waiting". The embedded store computes it exactly from each queue's state; Redis
/// keeps a set that entries add to and admission steps take queues nobody waits in out of (it spans
/// queues, so no queue script can hold it on a Cluster), so it may still list a queue that a leave, an
/// abandonment or an admission just emptied.
/// So: every queue the embedded store lists, Redis lists too; and whatever Redis lists beyond that is idle
/// by the embedded store's own (compared, equal) stats.
fn compare_active(
    embedded: &[QueueName],
    redis: &[QueueName],
    embedded_side: &[Normalized],
) -> Result<(), String> {
    for queue in embedded {
        if !redis.contains(queue) {
            return Err(format!(
                "{queue} is busy but Redis does not list it as active: {redis:?}"
            ));
        }
    }
    for queue in redis.iter().filter(|q| !embedded.contains(q)) {
        let q = QUEUES
            .iter()
            .position(|n| *n == queue.as_str())
            .expect("a test queue");
        // views() pushes, per queue, settings, stats, preview, then the members' positions.
        let stats = &embedded_side[q * (3 + MEMBERS.len()) + 1];
        // Nobody waiting: the active list is the queues admission visits (issue 30); READY and CLAIMED
        // members are deadlines, not activity.
        let idle = match stats {
            Normalized::Plain(text) => text == "None" || text.contains("waiting: 0,"),
            _ => false,
        };
        if !idle {
            return Err(format!(
                "Redis lists {queue} as active beyond the embedded store, which is not idle: {stats:?}"
            ));
        }
    }
    Ok(())
}

/// Turns a claim's, consume's or release's member index past [`MEMBERS`] into a (queue, member) the
/// embedded store last showed as READY or CLAIMED (any queue; the n-th, modulo how many), else one it ever
/// showed a token to, else the plain member. The choice reads only the reference side's history, and both
/// sides have answered alike up to this step, so it is the same choice for both; it stays a function of
/// the generated value, so shrinking works.
fn resolve(op: &Op, reference: &Side) -> Op {
    let pick = |q: usize, m: usize| -> (usize, usize) {
        if m < MEMBERS.len() {
            return (q, m);
        }
        let mut holding: Vec<(usize, usize)> = reference
            .statuses
            .iter()
            .filter(|(_, status)| matches!(status, MemberStatus::Ready | MemberStatus::Claimed))
            .map(|(key, _)| *key)
            .collect();
        if holding.is_empty() {
            holding = reference.tokens.keys().copied().collect();
        }
        holding.sort_unstable();
        if holding.is_empty() {
            (q, m % MEMBERS.len())
        } else {
            holding[(m - MEMBERS.len()) % holding.len()]
        }
    };
    match *op {
        Op::Claim(q, m, presented) => {
            let (q, m) = pick(q, m);
            Op::Claim(q, m, presented)
        }
        Op::Consume(q, m, n) => {
            let (q, m) = pick(q, m);
            Op::Consume(q, m, n)
        }
        Op::Release(q, m, n) => {
            let (q, m) = pick(q, m);
            Op::Release(q, m, n)
        }
        Op::Gate(q, m, commit) => {
            let (q, m) = pick(q, m);
            Op::Gate(q, m, commit)
        }
        ref other => other.clone(),
    }
}

/// One step of a case: an operation, and whether every view is compared after it. Not after every step:
/// reading the admin view records the store's clock on both backends (it is activity), which would hide
/// from the test whether the *operations* record it alike (the idle time `forget_if_idle` measures, the
/// guard a clock stepping back meets). The shrinker drops the looks a failure does not need.
type Step = (Op, bool);

/// Runs `steps` on the embedded store and on Redis at `urls` in lock step; the first difference fails the
/// case, naming the step, the operation and both answers.
async fn run_case(urls: Vec<String>, steps: Vec<Step>, timing: &Timing) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(START_MS);
    let mut embedded = Side::embedded(&clock);
    let mut redis = Side::redis(&urls, &clock).await;
    let mut claims: HashMap<(usize, usize), Vec<Digest>> = HashMap::new();
    let mut next_claim = 0u64;
    for (step, (op, look)) in steps.iter().enumerate() {
        let op = &resolve(op, &embedded);
        match *op {
            Op::Advance(ms) => {
                clock.advance(ms);
            }
            Op::StepBack(ms) => {
                clock.advance(-ms);
            }
            Op::Claim(q, m, _) | Op::Gate(q, m, _) => {
                next_claim += 1;
                claims
                    .entry((q, m))
                    .or_default()
                    .push(digest_of(&format!("claim-{next_claim}")));
            }
            _ => {}
        }
        let want = embedded.apply(op, &claims, &clock).await;
        let got = redis.apply(op, &claims, &clock).await;
        prop_assert_eq!(
            &want,
            &got,
            "step {} {:?}: embedded (left) vs redis (right)",
            step,
            op
        );
        timing.cover(&want);
        if !look {
            continue;
        }
        let (want_views, want_active) = embedded.views().await;
        let (got_views, got_active) = redis.views().await;
        prop_assert_eq!(want_views.len(), got_views.len());
        for (i, (w, g)) in want_views.iter().zip(&got_views).enumerate() {
            prop_assert_eq!(
                w,
                g,
                "view {} after step {} {:?}: embedded (left) vs redis (right)",
                i,
                step,
                op
            );
        }
        // Abandonment shows in the views' stats (a step's own answer rarely is a stats read).
        let abandoned: Vec<Normalized> = want_views
            .iter()
            .filter(|v| matches!(v, Normalized::Plain(t) if t.contains("QueueStats") && !t.contains("abandoned: 0")))
            .take(1)
            .cloned()
            .collect();
        timing.cover(&abandoned);
        if let Err(difference) = compare_active(&want_active, &got_active, &want_views) {
            return Err(TestCaseError::fail(format!(
                "after step {step} {op:?}: {difference}"
            )));
        }
    }
    timing.add(embedded.busy, redis.busy, steps.len());
    Ok(())
}

/// Time spent in each backend's calls over a test, reported at its end (`--nocapture` shows it).
#[derive(Default)]
struct Timing {
    inner: std::sync::Mutex<(Duration, Duration, usize, usize)>,
    /// How often each kind of outcome was seen (the report shows the sequences reach every rule).
    outcomes: std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
}

impl Timing {
    fn add(&self, embedded: Duration, redis: Duration, ops: usize) {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.0 += embedded;
        inner.1 += redis;
        inner.2 += 1;
        inner.3 += ops;
    }

    fn cover(&self, answers: &[Normalized]) {
        let mut outcomes = self
            .outcomes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for answer in answers {
            let kind = match answer {
                Normalized::View { status, .. } => format!("view {status:?}"),
                Normalized::Error(kind) => format!("error {kind}"),
                Normalized::Clock(_) => "clock moved".to_string(),
                Normalized::Plain(text) if text.starts_with("AdmitOutcome") => {
                    let admitted = text.matches("MemberId").count();
                    format!("admitted {}", admitted.min(3))
                }
                Normalized::Plain(text)
                    if text.starts_with("ExpiryOutcome") || text.starts_with("AdmissionPreview") =>
                {
                    text.split_whitespace().next().unwrap_or_default().to_string()
                }
                Normalized::Plain(text) if text.contains("QueueStats") && !text.contains("abandoned: 0") => {
                    "stats with abandoned members".to_string()
                }
                Normalized::Plain(text) => text.chars().take(40).collect(),
            };
            *outcomes.entry(kind).or_default() += 1;
        }
    }

    fn report(&self, topology: &str) {
        for (kind, count) in self
            .outcomes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
        {
            println!("{topology}: {count:>6} × {kind}");
        }
        let inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        println!(
            "{topology}: {} cases, {} operations; embedded {:.2?}, redis {:.2?} inside store calls",
            inner.2, inner.3, inner.0, inner.1
        );
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        // 64 by default; `PROPTEST_CASES=1000` for a longer hunt.
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(64),
        // Where a failing case's seed is recorded (proptest-regressions/ beside this file), and replayed
        // first on every later run.
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

fn check(urls: fn() -> Vec<String>, topology: &str) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let timing = Timing::default();
    let mut runner = proptest::test_runner::TestRunner::new(config());
    let steps = proptest::collection::vec((op(), prop::bool::weighted(0.75)), 1..=40);
    let result = runner.run(&steps, |steps| runtime.block_on(run_case(urls(), steps, &timing)));
    timing.report(topology);
    if let Err(failure) = result {
        panic!("{topology}: the embedded store and Redis disagree: {failure}");
    }
}

/// The embedded store and the Redis at 127.0.0.1:6379 answer every random sequence identically.
#[test]
fn embedded_and_redis_standalone_agree_on_every_step() {
    check(|| vec![standalone_url()], "standalone");
}

/// The embedded store and a 3-node Redis Cluster answer every random sequence identically.
#[test]
fn embedded_and_redis_cluster_agree_on_every_step() {
    check(|| cluster().urls.clone(), "cluster");
}

/// The other two rule sets the Redis store re-states in Lua, the rate limiter's two algorithms and the job
/// queue's transitions, under the same lock-step comparison. The job policies here retry after at most
/// one millisecond of backoff, so the jitter each store draws for itself (the trait takes none) decides
/// nothing and every answer is comparable exactly; the backoff maths themselves are checked against
/// `rankgate_core::job::backoff_delay_ms` with pinned jitter in the Redis jobs module's own property test.
/// A minimum delay (a webhook's Retry-After) up to past the cap, and pausing and resuming job groups
/// (a webhook's 410, an admin's PUT), run in the same lock-step: the job ids fall in two groups.
mod jobs_and_limits {
    use super::*;
    use rankgate_core::job::RetryPolicy;
    use rankgate_store::queue::{JobStore, NewJob};

    const JOB_IDS: [&str; 3] = ["job-a:0", "job-a:1", "job-b:0"];
    const GROUPS: [&str; 2] = ["job-a", "job-b"];
    const LIMIT_KEYS: [&str; 3] = ["poll:eq:m-0", "ip:127.0.0.1", "{odd}%key"];

    #[derive(Debug, Clone)]
    enum Op {
        /// key, sliding log (`None`) or window counter with this many buckets, limit, window ms.
        Acquire(usize, Option<u32>, u32, i64),
        Enqueue(usize, i64, RetryPolicy),
        ClaimDue(usize, i64),
        /// Ack / nack a job with its latest claim token (`true`) or its first one (stale once re-claimed).
        Ack(usize, bool),
        Nack(usize, bool),
        /// A nack asking for at least this many ms before the retry.
        NackNotBefore(usize, bool, u64),
        Pause(usize),
        Resume(usize),
        Paused,
        Reap,
        Dead(usize),
        Replay(usize),
        Counts,
        Advance(i64),
        StepBack(i64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let job = || 0..JOB_IDS.len();
        let policy = (0u64..=2, 0u64..=1, 1u32..=3).prop_map(|(base, max, attempts)| RetryPolicy {
            base_delay_ms: base,
            max_delay_ms: max,
            max_attempts: attempts,
        });
        prop_oneof![
            6 => (
                0..LIMIT_KEYS.len(),
                prop_oneof![Just(None), (1u32..=10).prop_map(Some)],
                1u32..=3,
                prop::sample::select(vec![100i64, 1_000, 3_000]),
            )
                .prop_map(|(k, kind, limit, window)| Op::Acquire(k, kind, limit, window)),
            3 => (job(), prop::sample::select(vec![0i64, 500, 3_000]), policy)
                .prop_map(|(j, delay, p)| Op::Enqueue(j, delay, p)),
            3 => (1usize..=3, prop::sample::select(vec![1_000i64, 5_000])).prop_map(|(n, lease)| Op::ClaimDue(n, lease)),
            2 => (job(), any::<bool>()).prop_map(|(j, latest)| Op::Ack(j, latest)),
            2 => (job(), any::<bool>()).prop_map(|(j, latest)| Op::Nack(j, latest)),
            1 => (job(), any::<bool>(), prop::sample::select(vec![0u64, 1, 1_000_000_000]))
                .prop_map(|(j, latest, min)| Op::NackNotBefore(j, latest, min)),
            2 => (0..GROUPS.len()).prop_map(Op::Pause),
            2 => (0..GROUPS.len()).prop_map(Op::Resume),
            1 => Just(Op::Paused),
            1 => Just(Op::Reap),
            1 => (1usize..=3).prop_map(Op::Dead),
            1 => job().prop_map(Op::Replay),
            1 => Just(Op::Counts),
            4 => prop_oneof![3 => 0i64..1_500, 1 => prop::sample::select(vec![3_000i64, 6_000])].prop_map(Op::Advance),
            1 => prop::sample::select(vec![1i64, 500, 3_000]).prop_map(Op::StepBack),
        ]
    }

    struct Side {
        jobs: Arc<dyn JobStore>,
        limiter: Arc<dyn RateLimiter>,
        /// Claim tokens this side handed out, per job, in order.
        claim_tokens: HashMap<usize, Vec<u128>>,
        _guard: Box<dyn std::any::Any>,
    }

    impl Side {
        async fn apply(&mut self, op: &Op) -> String {
            let token = |sides: &HashMap<usize, Vec<u128>>, j: usize, latest: bool| -> u128 {
                match sides.get(&j) {
                    Some(tokens) if latest => *tokens.last().expect("non-empty"),
                    Some(tokens) => tokens[0],
                    None => 0,
                }
            };
            let answer = match *op {
                Op::Acquire(k, buckets, limit, window_ms) => {
                    let kind = buckets.map_or(RateLimiterKind::SlidingLog, |buckets| {
                        RateLimiterKind::SlidingWindow { buckets }
                    });
                    let limit = RateLimit { limit, window_ms };
                    format!("{:?}", self.limiter.try_acquire(LIMIT_KEYS[k], limit, kind).await)
                }
                Op::Enqueue(j, delay_ms, policy) => {
                    let job = NewJob {
                        id: JOB_IDS[j].into(),
                        payload: JOB_IDS[j].as_bytes().to_vec(),
                        delay_ms,
                        policy,
                    };
                    format!("{:?}", self.jobs.enqueue("work", job).await)
                }
                Op::ClaimDue(limit, lease_ms) => match self.jobs.claim_due("work", limit, lease_ms).await {
                    // The claim token is random per side: compared by presence (every claimed job has one,
                    // used later on this side only); everything else as is.
                    Ok(claimed) => {
                        let mut out = Vec::new();
                        for job in claimed {
                            let j = JOB_IDS.iter().position(|id| *id == job.id).expect("a test job");
                            self.claim_tokens.entry(j).or_default().push(job.claim_token);
                            out.push((job.id, job.payload, job.attempt, job.claim_expires_at_ms));
                        }
                        format!("{out:?}")
                    }
                    Err(e) => format!("{:?}", error(&e)),
                },
                Op::Ack(j, latest) => {
                    let claim = token(&self.claim_tokens, j, latest);
                    format!("{:?}", self.jobs.ack("work", JOB_IDS[j], claim).await)
                }
                Op::Nack(j, latest) => {
                    let claim = token(&self.claim_tokens, j, latest);
                    format!("{:?}", self.jobs.nack("work", JOB_IDS[j], claim, "boom").await)
                }
                Op::NackNotBefore(j, latest, min_delay_ms) => {
                    let claim = token(&self.claim_tokens, j, latest);
                    let outcome = self
                        .jobs
                        .nack_with_min_delay("work", JOB_IDS[j], claim, "busy", min_delay_ms)
                        .await;
                    format!("{outcome:?}")
                }
                Op::Pause(g) => format!("{:?}", self.jobs.pause_group("work", GROUPS[g], "gone").await),
                Op::Resume(g) => format!("{:?}", self.jobs.resume_group("work", GROUPS[g]).await),
                Op::Paused => format!("{:?}", self.jobs.paused_groups("work").await),
                Op::Reap => format!("{:?}", self.jobs.reap_expired("work").await),
                Op::Dead(limit) => format!("{:?}", self.jobs.dead_jobs("work", limit).await),
                Op::Replay(j) => format!("{:?}", self.jobs.replay_dead("work", JOB_IDS[j]).await),
                Op::Counts => format!("{:?}", self.jobs.counts("work").await),
                Op::Advance(_) | Op::StepBack(_) => String::new(),
            };
            // No store error is expected here: one would carry a backend's own message and fail the
            // comparison, which is what an error on one side only should do anyway.
            answer
        }
    }

    async fn run_case(urls: Vec<String>, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let clock = ManualClock::new(START_MS);
        let dir = tempfile::tempdir().expect("temp dir");
        let options = EmbeddedOptions {
            synchronous: Synchronous::Normal,
            ..EmbeddedOptions::default()
        };
        let embedded_store =
            EmbeddedStore::open(dir.path(), Arc::new(clock.clone()), options).expect("open embedded");
        let mut embedded = Side {
            jobs: embedded_store.clone(),
            limiter: embedded_store,
            claim_tokens: HashMap::new(),
            _guard: Box::new(dir),
        };
        let prefix = unique_prefix();
        let options = RedisOptions {
            prefix: prefix.clone(),
            time: RedisTime::Injected(Arc::new(clock.clone())),
            ..RedisOptions::default()
        };
        let redis_store = RedisStore::connect(&urls, options)
            .await
            .unwrap_or_else(|e| panic!("connecting to redis at {urls:?}: {e}"));
        let mut redis = Side {
            jobs: redis_store.clone(),
            limiter: redis_store,
            claim_tokens: HashMap::new(),
            _guard: Box::new(KeyCleanup {
                nodes: urls.clone(),
                prefix,
            }),
        };
        for (step, op) in ops.iter().enumerate() {
            match *op {
                Op::Advance(ms) => {
                    clock.advance(ms);
                }
                Op::StepBack(ms) => {
                    clock.advance(-ms);
                }
                _ => {}
            }
            let want = embedded.apply(op).await;
            let got = redis.apply(op).await;
            prop_assert_eq!(
                &want,
                &got,
                "step {} {:?}: embedded (left) vs redis (right)",
                step,
                op
            );
            let want = embedded.apply(&Op::Counts).await;
            let got = redis.apply(&Op::Counts).await;
            prop_assert_eq!(&want, &got, "counts after step {} {:?}", step, op);
        }
        Ok(())
    }

    fn check(urls: fn() -> Vec<String>, topology: &str) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let started = Instant::now();
        let mut runner = proptest::test_runner::TestRunner::new(config());
        let ops = proptest::collection::vec(op(), 1..=40);
        let result = runner.run(&ops, |ops| runtime.block_on(run_case(urls(), ops)));
        println!("{topology} jobs and limits: {:.2?}", started.elapsed());
        if let Err(failure) = result {
            panic!("{topology}: the embedded store and Redis disagree on jobs or limits: {failure}");
        }
    }

    /// The embedded store and the Redis at 127.0.0.1:6379 decide every limit and job step identically.
    #[test]
    fn embedded_and_redis_standalone_agree_on_jobs_and_limits() {
        check(|| vec![standalone_url()], "standalone");
    }

    /// The embedded store and a 3-node Redis Cluster decide every limit and job step identically.
    #[test]
    fn embedded_and_redis_cluster_agree_on_jobs_and_limits() {
        check(|| cluster().urls.clone(), "cluster");
    }
}
