//! The adaptive-admission scene of `rankgate demo` (issue 12): the order service degrades mid-sale and
//! the queue's admission rate follows it down, then back up.
//!
//! A queue in `adaptive` mode (6–40 members/s, p95 target 150 ms, error threshold 2 %) admits a waiting
//! crowd; every admitted member orders through the gate. The simulated order service is healthy, then for
//! a stretch of the sale it can only take [`DEGRADED_CAPACITY`] orders a second: above that it answers
//! slowly (300 ms) and fails one order in four with a 503, as an overloaded database does; then it
//! recovers. The controller backs off while the service is overloaded, hovers around what it can take
//! (so few orders fail), and climbs back when it recovers. A timeline is printed.
//!
//! Queue time is a [`ManualClock`] (one step = one control interval = one simulated second); the order
//! service's latency is real, so the gate measures it as it would in production.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use futures_util::StreamExt as _;
use rankgate_core::ids::MemberId;
use rankgate_core::queue::{AdmissionMode, QueueName, SettingsPatch};
use rankgate_store::clock::{Clock, ManualClock};
use rankgate_store::queue::token::TokenSecret;

use super::flash_sale::serve_on_loopback;
use crate::waiting_room::WaitingRoom;
use crate::waiting_room::{GateConfig, GateRoute, WaitingRoomConfig};

/// Orders per second the degraded order service takes before it slows down and fails.
pub const DEGRADED_CAPACITY: u64 = 12;
const QUEUE: &str = "adaptive-sale";
const MEMBERS: usize = 1_500;
const HEALTHY_SECONDS: usize = 8;
const DEGRADED_SECONDS: usize = 14;
const RECOVERED_SECONDS: usize = 14;
const CONCURRENT: usize = 64;

/// One simulated second of the scene.
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveDemoSecond {
    /// `healthy`, `degraded` or `recovered`.
    pub phase: &'static str,
    /// The admission rate the controller set at the start of the second.
    pub rate: f64,
    /// Members admitted in the second.
    pub admitted: usize,
    /// Orders that failed (5xx) in the second.
    pub failed: usize,
    /// The upstream p95 the controller saw for the previous second (ms).
    pub p95_millis: Option<f64>,
}

/// What the adaptive scene measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdaptiveDemoReport {
    /// Every simulated second, in order.
    pub seconds: Vec<AdaptiveDemoSecond>,
}

impl AdaptiveDemoReport {
    fn phase(&self, phase: &str) -> impl Iterator<Item = &AdaptiveDemoSecond> {
        let phase = phase.to_string();
        self.seconds.iter().filter(move |s| s.phase == phase)
    }

    /// The rate at the end of `phase`.
    #[must_use]
    pub fn last_rate(&self, phase: &str) -> Option<f64> {
        self.phase(phase).last().map(|s| s.rate)
    }

    /// Failed orders over orders in `phase`.
    #[must_use]
    pub fn error_rate(&self, phase: &str) -> f64 {
        let (failed, ordered) = self
            .phase(phase)
            .fold((0, 0), |(f, o), s| (f + s.failed, o + s.admitted));
        failed as f64 / ordered.max(1) as f64
    }
}

/// The order service: healthy, or degraded to [`DEGRADED_CAPACITY`] orders per second.
#[derive(Clone, Default)]
struct OrderService {
    /// 0 = healthy, else orders per second taken before overload.
    capacity: Arc<AtomicU64>,
    /// Orders taken in the current simulated second (the demo resets it every second).
    this_second: Arc<AtomicU64>,
}

async fn spawn_order_service(service: OrderService) -> anyhow::Result<std::net::SocketAddr> {
    let router = axum::Router::new().route(
        "/orders",
        axum::routing::post(move || {
            let service = service.clone();
            async move {
                let n = service.this_second.fetch_add(1, Ordering::SeqCst) + 1;
                let capacity = service.capacity.load(Ordering::SeqCst);
                if capacity > 0 && n > capacity {
                    // Overloaded: slow, and one order in four fails.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    if n.is_multiple_of(4) {
                        return (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            "order database overloaded",
                        );
                    }
                } else {
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
                (axum::http::StatusCode::CREATED, "order placed")
            }
        }),
    );
    serve_on_loopback(router, "the demo order service").await
}

/// Runs the adaptive-admission scene, in-process on port 0, writing its timeline to `out`.
pub async fn run_adaptive_admission_demo(
    data_dir: &Path,
    redis: &[String],
    out: &mut (dyn Write + Send),
) -> anyhow::Result<AdaptiveDemoReport> {
    let queue = QueueName::parse(QUEUE).expect("valid queue name");
    let service = OrderService::default();
    let orders = spawn_order_service(service.clone()).await?;
    let config = WaitingRoomConfig {
        poll_burst: 10_000,
        adaptive_min_samples: 5,
        gates: vec![GateConfig {
            queue: QUEUE.into(),
            upstream: format!("http://{orders}"),
            routes: vec![GateRoute {
                method: "POST".into(),
                path: "/orders".into(),
                prefix: false,
            }],
            timeout_millis: 5_000,
            max_body_bytes: 65_536,
        }],
        token_secret: Some(
            URL_SAFE_NO_PAD.encode(
                TokenSecret::generate()
                    .context("reading the OS random number generator")?
                    .to_bytes(),
            ),
        ),
        ..WaitingRoomConfig::default()
    };
    // 600 ms into a second, so each step's orders land inside one control interval.
    let start = rankgate_store::clock::SystemClock.now_millis() / 1000 * 1000 + 600;
    let clock = ManualClock::new(start);
    let room = if redis.is_empty() {
        WaitingRoom::open_embedded(data_dir, config, Arc::new(clock.clone())).await?
    } else {
        let prefix = format!("rankgate-demo-adaptive:{}:{}:", std::process::id(), start);
        WaitingRoom::open_redis_simulated(redis, &prefix, config, Arc::new(clock.clone()))
            .await
            .context("opening the adaptive demo's waiting room on Redis (check --redis)")?
    };
    let scene = run_scene(&room, &queue, &clock, &service, out).await;
    if let Some(store) = room.embedded_store() {
        store.close();
    }
    if let Some(store) = room.redis_store() {
        if !store.is_cluster() {
            store
                .purge_prefix()
                .await
                .map_err(|e| anyhow::anyhow!("deleting the adaptive demo's keys: {e}"))?;
        }
    }
    scene
}

async fn run_scene(
    room: &Arc<WaitingRoom>,
    queue: &QueueName,
    clock: &ManualClock,
    service: &OrderService,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<AdaptiveDemoReport> {
    let router = crate::waiting_room::member_routes(Arc::clone(room))
        .merge(crate::waiting_room::gate_routes(Arc::clone(room)).context("the demo's gate")?);
    let base = format!("http://{}", serve_on_loopback(router, "the demo server").await?);
    let client = reqwest::Client::new();

    let settings = SettingsPatch {
        admission_mode: Some(AdmissionMode::Adaptive),
        min_admit_per_second: Some(6.0),
        max_admit_per_second: Some(40.0),
        admit_per_second: Some(30.0),
        target_p95_millis: Some(150),
        max_error_rate: Some(0.02),
        ..SettingsPatch::default()
    };
    room.update_settings(queue, &settings)
        .await
        .map_err(|e| anyhow::anyhow!("configuring the adaptive queue: {e:?}"))?;
    futures_util::stream::iter(0..MEMBERS)
        .map(|i| {
            let member = MemberId::parse(&format!("shopper-{i:05}")).expect("valid member id");
            async move { room.enter(queue, &member).await.map(|_| ()) }
        })
        .buffer_unordered(CONCURRENT)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>, _>>()
        .map_err(|e| anyhow::anyhow!("entering the crowd: {e:?}"))?;
    writeln!(
        out,
        "adaptive admission: {MEMBERS} members; the order service takes only {DEGRADED_CAPACITY} orders/s from \
         second {HEALTHY_SECONDS} to {}",
        HEALTHY_SECONDS + DEGRADED_SECONDS
    )?;
    writeln!(
        out,
        "  the rate (6-40/s) aims at the order service's p95 150 ms and 2% failed orders: each second beyond \
         either target cuts it, seconds within both raise it again, so the seconds where the service turns \
         slow show the overshoot the controller then corrects"
    )?;
    writeln!(out, "  second  phase      rate/s  admitted  p95 ms  failed")?;

    let mut report = AdaptiveDemoReport::default();
    let phases = std::iter::repeat_n("healthy", HEALTHY_SECONDS)
        .chain(std::iter::repeat_n("degraded", DEGRADED_SECONDS))
        .chain(std::iter::repeat_n("recovered", RECOVERED_SECONDS));
    for (second, phase) in phases.enumerate() {
        service.capacity.store(
            if phase == "degraded" { DEGRADED_CAPACITY } else { 0 },
            Ordering::SeqCst,
        );
        service.this_second.store(0, Ordering::SeqCst);
        // Flush every instance's orders of the second just past, then close it after the grace.
        clock.advance(400);
        room.run_adaptive_control().await?;
        clock.advance(600);
        let decided = room.run_adaptive_control().await?;
        let summary = decided
            .into_iter()
            .find(|(q, _)| q == queue)
            .map(|(_, summary)| summary);
        let admitted = room.admit_queue_now(queue).await?.admitted;
        let failed = futures_util::stream::iter(admitted.iter().cloned())
            .map(|member| {
                // The ticket the member's entry answered with: every call for the member shows it.
                let ticket = room.ticket_for(queue, &member);
                order_through_gate(&client, &base, member, ticket)
            })
            .buffer_unordered(CONCURRENT)
            .collect::<Vec<anyhow::Result<bool>>>()
            .await
            .into_iter()
            .collect::<anyhow::Result<Vec<bool>>>()?
            .into_iter()
            .filter(|ok| !ok)
            .count();
        let rate = match &summary {
            Some(summary) => summary.effective_admit_per_second,
            None => {
                room.stats(queue)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?
                    .settings
                    .admit_per_second
            }
        };
        let row = AdaptiveDemoSecond {
            phase,
            rate,
            admitted: admitted.len(),
            failed,
            p95_millis: summary.as_ref().and_then(|s| s.p95_millis),
        };
        if second % 2 == 1 {
            writeln!(
                out,
                "  {:>6}  {:<9}  {:>6.1}  {:>8}  {:>6}  {:>6}",
                second,
                row.phase,
                row.rate,
                row.admitted,
                row.p95_millis.map_or("-".to_string(), |p| format!("{p:.0}")),
                row.failed
            )?;
        }
        report.seconds.push(row);
    }
    writeln!(
        out,
        "  failed orders: {:.1}% while healthy, {:.1}% while degraded (a fixed 40/s would have failed about \
         {:.0}%), {:.1}% after; rate {:.1}/s before, {:.1}/s at the end of the degradation, {:.1}/s after recovery",
        report.error_rate("healthy") * 100.0,
        report.error_rate("degraded") * 100.0,
        (40 - DEGRADED_CAPACITY) as f64 / 4.0 / 40.0 * 100.0,
        report.error_rate("recovered") * 100.0,
        report.last_rate("healthy").unwrap_or(0.0),
        report.last_rate("degraded").unwrap_or(0.0),
        report.last_rate("recovered").unwrap_or(0.0),
    )?;
    Ok(report)
}

/// Polls the member's token and orders through the gate, each with the member's `ticket`; `Ok(false)`
/// when the order service failed the order.
async fn order_through_gate(
    client: &reqwest::Client,
    base: &str,
    member: MemberId,
    ticket: String,
) -> anyhow::Result<bool> {
    let position: serde_json::Value = client
        .get(format!("{base}/v1/queues/{QUEUE}/entries/{member}"))
        .header("x-queue-ticket", &ticket)
        .send()
        .await?
        .json()
        .await?;
    let token = position["entryToken"]
        .as_str()
        .context("an admitted member holds a token")?
        .to_string();
    let response = client
        .post(format!("{base}/orders"))
        .header("x-member-id", member.as_str())
        .header("x-queue-ticket", ticket)
        .header("x-entry-token", token)
        .body("{}")
        .send()
        .await?;
    Ok(response.status().is_success())
}
