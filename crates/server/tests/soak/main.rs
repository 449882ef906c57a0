//! A soak of the waiting room with faults (issue 9): three `rankgate serve` processes on one Redis this
//! test owns, under a bounded surge of members who enter, poll, claim, consume, release, order through the
//! `[[gate]]` proxy, leave, let tokens expire and hang up mid-request, while one instance is SIGKILLed and
//! restarted, and Redis is paused (SIGSTOP) for a few seconds, the same instance killed again meanwhile,
//! and resumed. Every operation goes into a history ([`history`]); the invariant checker then judges it:
//! nobody admitted twice, nobody lost, no token consumed twice, the admission rate within budget,
//! admission in entry order. The run prints the history's size, the invariants and what it counted.
//!
//! The test never asserts timings: the machine may be slow, so every wait is bounded generously and every
//! rule is an invariant that holds however long things take. The seed of the member plan is printed, and
//! `SOAK_SEED=<n>` replays it.

mod history;
mod processes;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use parking_lot::{Mutex, RwLock};
use rand::{Rng as _, SeedableRng as _};
use serde_json::{json, Value};

use history::{Budget, Fault, History, Observed, Op, Outcome, Record, Status};
use processes::{Instance, OwnRedis};

const QUEUE: &str = "soak";
const MEMBERS: usize = 500;
const INSTANCES: usize = 3;
/// The instance that is SIGKILLed and restarted. Gate orders avoid it: an order the upstream committed
/// while the gate process died cannot consume its token (no gate can help that; the shop's order API
/// must be idempotent), and that is not what this soak measures.
const KILLED: usize = 1;
const ADMIT_PER_SECOND: f64 = 50.0;
const TICK_MS: i64 = 500;
const TOKEN_TTL_S: i64 = 10;
const CLAIM_TTL_S: i64 = 2;
/// Members stop, wherever they are, this long after the surge starts (the drain's bound).
const BOUND: Duration = Duration::from_secs(60);
/// A normal request's timeout: far above Redis's 2 s response timeout, so a paused store answers 503.
const NORMAL: Duration = Duration::from_secs(15);
const ADMIN_KEY: &str = "soak-admin";
/// 32 bytes, URL-safe base64: the token secret every instance shares.
const TOKEN_SECRET: &str = "c29hay10ZXN0LXRva2VuLXNlY3JldC0zMi1ieXRlcyE";

/// Epoch microseconds of the real-time clock (comparable with Redis `TIME`).
fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as i64
}

/// What each member does once admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// claim → consume.
    Buyer,
    /// claim → release → claim → consume.
    Releaser,
    /// claim, then walk away until the claim expires back to READY → claim → consume.
    ClaimAbandoner,
    /// a claim it hangs up on → then claims and consumes when it can.
    ClaimHangUp,
    /// claim → a consume it hangs up on → consume again (idempotent).
    ConsumeHangUp,
    /// one order through the gate.
    GateBuyer,
    /// an order through the gate it hangs up on while the upstream commits → then whatever it sees.
    GateHangUp,
    /// leaves after a few polls.
    Leaver,
    /// stops polling once READY: the token expires.
    Expirer,
}

fn role_of(roll: u32) -> Role {
    match roll % 100 {
        0..=29 => Role::Buyer,
        30..=39 => Role::Releaser,
        40..=47 => Role::ClaimAbandoner,
        48..=55 => Role::ClaimHangUp,
        56..=63 => Role::ConsumeHangUp,
        64..=75 => Role::GateBuyer,
        76..=85 => Role::GateHangUp,
        86..=92 => Role::Leaver,
        _ => Role::Expirer,
    }
}

/// Shared by every client task.
struct Ctx {
    http: reqwest::Client,
    /// Signs each member's ticket as the instances do (they share `TOKEN_SECRET`): a member's calls
    /// show it, as its client keeps the one its entry answered with (an entry it hung up on included).
    tickets: rankgate::waiting_room::ticket::TicketKey,
    addresses: RwLock<Vec<String>>,
    history: Mutex<History>,
    stop: AtomicBool,
}

/// What a call answered: the recorded outcome and the JSON body when there was one.
struct Answer {
    outcome: Outcome,
    body: Value,
}

fn parse_ms(value: &Value) -> Option<i64> {
    value
        .as_str()?
        .parse::<jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond())
}

fn observed(body: &Value) -> Option<Observed> {
    let status = match body["status"].as_str()? {
        "NOT_ENTERED" => Status::NotEntered,
        "WAITING" => Status::Waiting,
        "READY" => Status::Ready,
        "CLAIMED" => Status::Claimed,
        _ => return None,
    };
    Some(Observed {
        status,
        token: body["entryToken"].as_str().map(str::to_string),
        token_expires_ms: parse_ms(&body["tokenExpiresAt"]),
        consumed: body["lastOutcome"] == "CONSUMED",
    })
}

impl Ctx {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn address(&self, instance: usize) -> String {
        self.addresses.read()[instance].clone()
    }

    /// Sends one request, records it, and returns what it answered.
    async fn call(
        &self,
        op: Op,
        member: &str,
        instance: usize,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Answer {
        let start_us = now_us();
        let result = async {
            let response = request.timeout(timeout).send().await?;
            let status = response.status().as_u16();
            let bytes = response.bytes().await?;
            Ok::<_, reqwest::Error>((status, bytes))
        }
        .await;
        let end_us = now_us();
        let (outcome, body) = match result {
            Ok((status, bytes)) => {
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let outcome = match (&op, status) {
                    (Op::Enter | Op::Poll, 200) => match observed(&body) {
                        Some(o) => Outcome::Position(o),
                        None => Outcome::Status(status),
                    },
                    (Op::Claim { .. }, 200) => match (body["claimId"].as_str(), parse_ms(&body["expiresAt"]))
                    {
                        (Some(claim_id), Some(expires_ms)) => Outcome::Claimed {
                            claim_id: claim_id.to_string(),
                            expires_ms,
                        },
                        _ => Outcome::Status(status),
                    },
                    _ => Outcome::Status(status),
                };
                (outcome, body)
            }
            Err(error) => (Outcome::Unknown(error.to_string()), Value::Null),
        };
        self.history.lock().records.push(Record {
            op,
            member: member.to_string(),
            instance,
            start_us,
            end_us,
            outcome: outcome.clone(),
        });
        Answer { outcome, body }
    }

    fn queue_url(&self, instance: usize, rest: &str) -> String {
        format!("{}/v1/queues/{QUEUE}{rest}", self.address(instance))
    }

    /// The ticket of `member`, the credential every call for it shows (SPEC 2.2).
    fn ticket(&self, member: &str) -> String {
        let queue = rankgate_core::queue::QueueName::parse(QUEUE).expect("the soak's queue");
        let member = rankgate_core::ids::MemberId::parse(member).expect("a soak member id");
        self.tickets.issue(&queue, &member, None)
    }

    async fn enter(&self, member: &str, instance: usize, timeout: Duration) -> Answer {
        let request = self
            .http
            .post(self.queue_url(instance, "/entries"))
            .header("x-queue-ticket", self.ticket(member))
            .json(&json!({ "memberId": member }));
        self.call(Op::Enter, member, instance, request, timeout).await
    }

    async fn poll(&self, member: &str, instance: usize) -> Answer {
        let request = self
            .http
            .get(self.queue_url(instance, &format!("/entries/{member}")))
            .header("x-queue-ticket", self.ticket(member));
        self.call(Op::Poll, member, instance, request, NORMAL).await
    }

    async fn leave(&self, member: &str, instance: usize) -> Answer {
        let request = self
            .http
            .delete(self.queue_url(instance, &format!("/entries/{member}")))
            .header("x-queue-ticket", self.ticket(member));
        self.call(Op::Leave, member, instance, request, NORMAL).await
    }

    async fn claim(&self, member: &str, token: &str, instance: usize, timeout: Duration) -> Answer {
        let request = self
            .http
            .post(self.queue_url(instance, "/tokens/claim"))
            .header("x-queue-ticket", self.ticket(member))
            .json(&json!({ "memberId": member, "token": token }));
        let op = Op::Claim {
            token: token.to_string(),
        };
        self.call(op, member, instance, request, timeout).await
    }

    async fn finish(
        &self,
        what: &str,
        member: &str,
        claim_id: &str,
        instance: usize,
        timeout: Duration,
    ) -> Answer {
        let request = self
            .http
            .post(self.queue_url(instance, &format!("/tokens/{what}")))
            .header("x-queue-ticket", self.ticket(member))
            .json(&json!({ "memberId": member, "claimId": claim_id }));
        let claim_id = claim_id.to_string();
        let op = if what == "consume" {
            Op::Consume { claim_id }
        } else {
            Op::Release { claim_id }
        };
        self.call(op, member, instance, request, timeout).await
    }

    async fn order(&self, member: &str, token: &str, instance: usize, timeout: Duration) -> Answer {
        let request = self
            .http
            .post(format!("{}/orders", self.address(instance)))
            .header("x-member-id", member)
            .header("x-queue-ticket", self.ticket(member))
            .header("x-entry-token", token)
            .body("{\"sku\":\"soak\"}");
        let op = Op::Order {
            token: token.to_string(),
        };
        self.call(op, member, instance, request, timeout).await
    }
}

/// One member's plan, drawn from the seed.
struct Plan {
    id: String,
    arrive_after: Duration,
    role: Role,
    hang_up_entry: bool,
    leave_after_polls: u32,
    rng: rand::rngs::StdRng,
}

impl Plan {
    fn instance(&mut self) -> usize {
        self.rng.random_range(0..INSTANCES)
    }

    /// The gate is asked only through instances that are never killed.
    fn gate_instance(&mut self) -> usize {
        if self.rng.random_bool(0.5) {
            0
        } else {
            2
        }
    }

    /// A hang-up: a timeout short enough to drop the request somewhere mid-way.
    fn hang_up(&mut self) -> Duration {
        Duration::from_micros(self.rng.random_range(500..8_000))
    }
}

#[derive(PartialEq, Eq)]
enum Step {
    Done,
    Continue,
}

async fn pause(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// A member's whole life; bounded by `ctx.stop`.
async fn member_life(ctx: Arc<Ctx>, mut plan: Plan) {
    tokio::time::sleep(plan.arrive_after).await;
    let id = plan.id.clone();
    if plan.hang_up_entry {
        let (instance, timeout) = (plan.instance(), plan.hang_up());
        ctx.enter(&id, instance, timeout).await;
    }
    let mut answer = loop {
        if ctx.stopping() {
            return;
        }
        let answer = ctx.enter(&id, plan.instance(), NORMAL).await;
        if matches!(answer.outcome, Outcome::Position(_)) {
            break answer;
        }
        pause(200).await;
    };
    let mut polls = 0u32;
    let mut special_done = false;
    while !ctx.stopping() {
        let Outcome::Position(position) = &answer.outcome else {
            unreachable!("only positions get here")
        };
        match position.status {
            Status::Waiting => {
                if plan.role == Role::Leaver && polls >= plan.leave_after_polls {
                    for _ in 0..20 {
                        match ctx.leave(&id, plan.instance()).await.outcome {
                            Outcome::Status(204) => return,
                            // Refused only while a claim is in flight, which a leaver never makes.
                            Outcome::Status(409) => return,
                            _ => pause(300).await,
                        }
                    }
                    return;
                }
            }
            Status::Ready => {
                if plan.role == Role::Expirer {
                    return;
                }
                let token = position.token.clone().expect("READY carries a token");
                if act(&ctx, &mut plan, &token, &mut special_done).await == Step::Done {
                    return;
                }
            }
            Status::Claimed => {}
            // Consumed (perhaps by a consume it never heard back from), expired, or left: nothing to do.
            Status::NotEntered => return,
        }
        let interval = answer.body["pollingIntervalSeconds"].as_f64().unwrap_or(1.0);
        tokio::time::sleep(Duration::from_secs_f64(interval.clamp(0.2, 5.0))).await;
        answer = loop {
            if ctx.stopping() {
                return;
            }
            let answer = ctx.poll(&id, plan.instance()).await;
            if matches!(answer.outcome, Outcome::Position(_)) {
                break answer;
            }
            pause(if answer.outcome == Outcome::Status(429) {
                1000
            } else {
                300
            })
            .await;
        };
        polls += 1;
    }
}

/// What a READY member does with its token.
async fn act(ctx: &Ctx, plan: &mut Plan, token: &str, special_done: &mut bool) -> Step {
    let id = plan.id.clone();
    let special = !*special_done;
    match plan.role {
        Role::GateBuyer | Role::GateHangUp => {
            let hang_up = plan.role == Role::GateHangUp && special;
            // The upstream takes 300 ms to answer a committed order: 100 ms is mid-order.
            let timeout = if hang_up {
                Duration::from_millis(100)
            } else {
                NORMAL
            };
            *special_done = true;
            let answer = ctx.order(&id, token, plan.gate_instance(), timeout).await;
            return match answer.outcome {
                Outcome::Status(200..=299) => Step::Done,
                _ => Step::Continue,
            };
        }
        Role::ClaimHangUp if special => {
            *special_done = true;
            let (instance, timeout) = (plan.instance(), plan.hang_up());
            ctx.claim(&id, token, instance, timeout).await;
            return Step::Continue;
        }
        _ => {}
    }
    let Outcome::Claimed { claim_id, .. } = ctx.claim(&id, token, plan.instance(), NORMAL).await.outcome
    else {
        return Step::Continue;
    };
    match plan.role {
        Role::Releaser if special => {
            *special_done = true;
            for _ in 0..20 {
                match ctx
                    .finish("release", &id, &claim_id, plan.instance(), NORMAL)
                    .await
                    .outcome
                {
                    Outcome::Status(204 | 404 | 409) => break,
                    _ => pause(300).await,
                }
            }
            return Step::Continue;
        }
        Role::ClaimAbandoner if special => {
            *special_done = true;
            return Step::Continue;
        }
        Role::ConsumeHangUp if special => {
            *special_done = true;
            let (instance, timeout) = (plan.instance(), plan.hang_up());
            ctx.finish("consume", &id, &claim_id, instance, timeout).await;
        }
        _ => {}
    }
    for _ in 0..20 {
        match ctx
            .finish("consume", &id, &claim_id, plan.instance(), NORMAL)
            .await
            .outcome
        {
            Outcome::Status(204) => return Step::Done,
            // The claim expired meanwhile (a slow machine, a paused store): start over from a poll.
            Outcome::Status(404 | 409 | 401) => return Step::Continue,
            _ => pause(300).await,
        }
    }
    Step::Continue
}

/// The shop's order service behind the gate: it commits an order when it receives it, then takes 300 ms
/// to answer (so a client can hang up mid-order), and fails one order in seven without committing.
async fn spawn_upstream(ctx: Arc<Ctx>) -> String {
    let received = Arc::new(AtomicU64::new(0));
    let router = axum::Router::new().route(
        "/orders",
        axum::routing::post(move |headers: HeaderMap| {
            let ctx = Arc::clone(&ctx);
            let received = Arc::clone(&received);
            async move {
                let member = headers
                    .get("x-member-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                if headers.contains_key("x-entry-token") {
                    return StatusCode::BAD_REQUEST; // the gate must strip it
                }
                if received.fetch_add(1, Ordering::SeqCst) % 7 == 3 {
                    pause(20).await;
                    return StatusCode::INTERNAL_SERVER_ERROR;
                }
                ctx.history.lock().orders.push((member, now_us()));
                pause(300).await;
                StatusCode::CREATED
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, router).await.expect("upstream serves") });
    format!("http://{address}")
}

/// Records the store's own admission counts: `admittedLastMinute` from the admin view, and the per-second
/// counts the admission script keeps in Redis (merged, so a second that left the 60 s window stays).
async fn monitor(ctx: Arc<Ctx>, redis_url: String, done: Arc<AtomicBool>) {
    let admitted_key = format!("soak:{{rg:q:{QUEUE}}}:admitted");
    let client = redis::Client::open(redis_url.as_str()).expect("redis url");
    let mut connection = None;
    let mut turn = 0usize;
    loop {
        let last = done.load(Ordering::SeqCst);
        turn += 1;
        let instance = if turn.is_multiple_of(2) { 0 } else { 2 };
        let view = ctx
            .http
            .get(format!("{}/v1/admin/queues/{QUEUE}", ctx.address(instance)))
            .bearer_auth(ADMIN_KEY)
            .timeout(Duration::from_secs(3))
            .send()
            .await;
        if let Ok(response) = view {
            if let Ok(body) = response.json::<Value>().await {
                if let Some(n) = body["admittedLastMinute"].as_u64() {
                    ctx.history.lock().admin_views.push((now_us(), n));
                }
            }
        }
        if connection.is_none() {
            connection =
                tokio::time::timeout(Duration::from_secs(1), client.get_multiplexed_async_connection())
                    .await
                    .ok()
                    .and_then(Result::ok);
        }
        if let Some(c) = connection.as_mut() {
            let read = tokio::time::timeout(
                Duration::from_secs(1),
                redis::cmd("HGETALL")
                    .arg(&admitted_key)
                    .query_async::<std::collections::HashMap<i64, u64>>(c),
            )
            .await;
            match read {
                Ok(Ok(counts)) => {
                    let mut history = ctx.history.lock();
                    for (second, n) in counts {
                        let slot = history.admitted_by_second.entry(second).or_default();
                        *slot = (*slot).max(n);
                    }
                }
                // A paused Redis: drop the connection and reconnect later.
                _ => connection = None,
            }
        }
        if last {
            return;
        }
        pause(500).await;
    }
}

async fn admin_put(http: &reqwest::Client, address: &str, body: Value) -> Value {
    let response = http
        .put(format!("{address}/v1/admin/queues/{QUEUE}"))
        .bearer_auth(ADMIN_KEY)
        .json(&body)
        .send()
        .await
        .expect("admin PUT answers");
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 200, "PUT settings: {body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_one_redis_survive_a_kill_and_a_pause_with_every_invariant_held() {
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| now_us() as u64);
    eprintln!("soak seed {seed} (SOAK_SEED={seed} replays the member plan)");
    let redis = OwnRedis::start();
    let root = tempfile::tempdir().expect("temp dir");
    let ctx = Arc::new(Ctx {
        http: reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("http client"),
        tickets: {
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(TOKEN_SECRET)
                .expect("TOKEN_SECRET is URL-safe base64");
            let secret = rankgate_store::queue::token::TokenSecret::from_bytes(
                bytes.try_into().expect("TOKEN_SECRET is 32 bytes"),
            );
            rankgate::waiting_room::ticket::TicketKey::derived_from(&secret)
        },
        addresses: RwLock::new(Vec::new()),
        history: Mutex::new(History::default()),
        stop: AtomicBool::new(false),
    });
    let upstream = spawn_upstream(Arc::clone(&ctx)).await;
    let config = root.path().join("rankgate.toml");
    std::fs::write(
        &config,
        format!(
            "redis_prefix = \"soak:\"\n\
             admin_keys = [\"{ADMIN_KEY}\"]\n\
             [waiting_room]\n\
             token_secret = \"{TOKEN_SECRET}\"\n\
             poll_burst = 5\n\
             entries_per_address_per_minute = 0\n\
             [[gate]]\n\
             queue = \"{QUEUE}\"\n\
             upstream = \"{upstream}\"\n\
             timeout_millis = 10000\n\
             routes = [ {{ method = \"POST\", path = \"/orders\" }} ]\n"
        ),
    )
    .expect("config");
    let instances: Vec<Instance> = {
        let (root, config, url) = (root.path().to_path_buf(), config.clone(), redis.url.clone());
        tokio::task::spawn_blocking(move || {
            (0..INSTANCES)
                .map(|i| Instance::start(&root, i, &config, &url))
                .collect()
        })
        .await
        .expect("instances start")
    };
    *ctx.addresses.write() = instances.iter().map(|i| i.address.clone()).collect();
    let instances = Arc::new(Mutex::new(instances));
    admin_put(
        &ctx.http,
        &ctx.address(0),
        json!({ "admitPerSecond": ADMIT_PER_SECOND, "tickMillis": TICK_MS,
                "tokenTtlSeconds": TOKEN_TTL_S, "claimTtlSeconds": CLAIM_TTL_S,
                "maxActive": null, "paused": false, "failMode": "closed" }),
    )
    .await;

    // The surge: arrivals over the first ~4 s, each member with its own role and random stream.
    let mut master = rand::rngs::StdRng::seed_from_u64(seed);
    let surge_start = Instant::now();
    let mut members = tokio::task::JoinSet::new();
    for i in 0..MEMBERS {
        let mut rng = rand::rngs::StdRng::seed_from_u64(master.random());
        let plan = Plan {
            id: format!("m-{i:04}"),
            arrive_after: Duration::from_millis(i as u64 * 8 + rng.random_range(0..40)),
            role: role_of(rng.random()),
            hang_up_entry: rng.random_bool(0.1),
            leave_after_polls: rng.random_range(0..3),
            rng,
        };
        members.spawn(member_life(Arc::clone(&ctx), plan));
    }
    let monitor_done = Arc::new(AtomicBool::new(false));
    let monitor = tokio::spawn(monitor(
        Arc::clone(&ctx),
        redis.url.clone(),
        Arc::clone(&monitor_done),
    ));

    // The faults, mid-surge: SIGKILL one instance and restart it; then pause Redis for 3 s, and while it
    // is paused SIGKILL the same instance again, so requests it had already sent reach Redis only after
    // their sender died; restart it once Redis is back (an instance cannot start without its store).
    let kill = |instances: &Arc<Mutex<Vec<Instance>>>| {
        let instances = Arc::clone(instances);
        tokio::task::spawn_blocking(move || instances.lock()[KILLED].kill())
    };
    let restart = |instances: &Arc<Mutex<Vec<Instance>>>| {
        let instances = Arc::clone(instances);
        tokio::task::spawn_blocking(move || {
            let mut instances = instances.lock();
            instances[KILLED].restart();
            instances[KILLED].address.clone()
        })
    };
    pause(3000).await;
    let killed_at = now_us();
    kill(&instances).await.expect("kill");
    pause(2000).await;
    ctx.addresses.write()[KILLED] = restart(&instances).await.expect("restart");
    let restarted_at = now_us();
    pause(2000).await;
    let paused_at = now_us();
    redis.pause();
    pause(1000).await;
    let killed_again_at = now_us();
    kill(&instances).await.expect("kill");
    pause(2000).await;
    redis.resume();
    let resumed_at = now_us();
    ctx.addresses.write()[KILLED] = restart(&instances).await.expect("restart");
    let restarted_again_at = now_us();
    ctx.history.lock().faults.extend([
        Fault {
            what: format!("instance {KILLED} SIGKILLed, then restarted"),
            from_us: killed_at,
            to_us: restarted_at,
        },
        Fault {
            what: "redis SIGSTOPped, then SIGCONTed".into(),
            from_us: paused_at,
            to_us: resumed_at,
        },
        Fault {
            what: format!("instance {KILLED} SIGKILLed while redis was paused, restarted after"),
            from_us: killed_again_at,
            to_us: restarted_again_at,
        },
    ]);

    // The drain: members finish by themselves once admitted (each ends consumed, left or expired); the
    // bound stops the rest wherever they are.
    let bound = tokio::time::sleep_until((surge_start + BOUND).into());
    tokio::pin!(bound);
    let mut bounded = false;
    loop {
        tokio::select! {
            next = members.join_next() => match next {
                Some(result) => result.expect("a member task panicked"),
                None => break,
            },
            () = &mut bound => {
                bounded = true;
                ctx.stop.store(true, Ordering::SeqCst);
            }
        }
    }
    let drained_after = surge_start.elapsed();

    // Let anything sent during the pause land (Redis answers within its 2 s timeout), then look at every
    // member that entered once more: the final state each is accounted for by.
    pause(2500).await;
    let entered: Vec<String> = {
        let history = ctx.history.lock();
        let mut ids: Vec<String> = history
            .records
            .iter()
            .filter(|r| r.op == Op::Enter && matches!(r.outcome, Outcome::Position(_)))
            .map(|r| r.member.clone())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    };
    let mut sweep = tokio::task::JoinSet::new();
    for (i, id) in entered.into_iter().enumerate() {
        let ctx = Arc::clone(&ctx);
        sweep.spawn(async move {
            pause((i % 100) as u64 * 10).await;
            for attempt in 0..30 {
                let answer = ctx.poll(&id, (i + attempt) % INSTANCES).await;
                if matches!(answer.outcome, Outcome::Position(_)) {
                    return;
                }
                pause(if answer.outcome == Outcome::Status(429) {
                    1000
                } else {
                    300
                })
                .await;
            }
        });
    }
    while sweep.join_next().await.is_some() {}
    monitor_done.store(true, Ordering::SeqCst);
    monitor.await.expect("monitor");

    let history = ctx.history.lock().clone();
    let budget = Budget {
        admit_per_second: ADMIT_PER_SECOND,
        tick_ms: TICK_MS,
        token_ttl_ms: TOKEN_TTL_S * 1000,
    };
    let report = history::check(&history, &budget);
    let admissions = history.admissions(budget.token_ttl_ms);
    let mut ops: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for record in &history.records {
        let name = format!("{:?}", record.op);
        let name = name.split([' ', '{']).next().unwrap_or("").to_string();
        let kind = match &record.outcome {
            Outcome::Position(_) => "200".to_string(),
            Outcome::Claimed { .. } => "200".to_string(),
            Outcome::Status(s) => s.to_string(),
            Outcome::Unknown(_) => "no answer".to_string(),
        };
        *ops.entry(format!("{name} {kind}")).or_default() += 1;
    }
    eprintln!(
        "soak: {} members, {} history records, {} admission events, {} upstream orders, drained after \
         {:.1} s{}",
        MEMBERS,
        history.records.len(),
        admissions.len(),
        history.orders.len(),
        drained_after.as_secs_f64(),
        if bounded { " (stopped by the bound)" } else { "" }
    );
    for fault in &history.faults {
        eprintln!(
            "fault: {} from {} to {} ({:.1} s)",
            fault.what,
            fault.from_us,
            fault.to_us,
            (fault.to_us - fault.from_us) as f64 / 1e6
        );
    }
    eprintln!("operations by outcome:");
    for (name, n) in &ops {
        eprintln!("  {name}: {n}");
    }
    eprintln!("invariants checked:");
    for invariant in history::INVARIANTS {
        eprintln!("  - {invariant}");
    }
    eprintln!("checker:\n{}", report.summary());
    let logs = {
        let instances = instances.lock();
        (0..INSTANCES)
            .map(|i| format!("--- instance {i} log tail ---\n{}", instances[i].log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        report.violations.is_empty(),
        "the soak broke {} invariant(s) (seed {seed}):\n{}\n{logs}",
        report.violations.len(),
        report.violations_summary()
    );
    // The soak must actually have exercised what it claims to.
    let admitted = report.counts["admission events observed (first READY)"];
    assert!(admitted > MEMBERS / 2, "only {admitted} admissions observed");
    assert!(report.counts["FIFO pairs checked"] > MEMBERS);
    assert!(
        !history.admitted_by_second.is_empty(),
        "the store's admission counts were never read"
    );
    drop(instances);
    drop(redis);
}
