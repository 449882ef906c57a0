//! The flash-sale scene of `rankgate demo` (issue 4).
//!
//! A burst of simulated members enters one queue over HTTP; the admission scheduler admits them at the
//! configured rate; every member polls at the interval it is told (in process, against the same service the
//! HTTP handlers call); admitted members order through the gate proxy in front of a simulated order
//! service that fails every tenth order, so those tokens are released and the order retried.
//!
//! Time is simulated with a [`ManualClock`]: a sale that takes minutes of queue time runs in seconds, and
//! the numbers printed (admissions per second, waits) are in simulated seconds, exact and repeatable.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use futures_util::StreamExt as _;
use rankgate_core::ids::MemberId;
use rankgate_core::queue::{MemberStatus, QueueName};
use rankgate_store::clock::{Clock, ManualClock};
use rankgate_store::queue::token::TokenSecret;

use crate::waiting_room::WaitingRoom;
use crate::waiting_room::{GateConfig, GateRoute, WaitingRoomConfig};

/// Simulated clients in flight at once, for the burst and for orders.
const CONCURRENT_ENTRIES: usize = 64;
const CONCURRENT_ORDERS: usize = 64;
/// Polls in flight at once in each simulated second.
const CONCURRENT_POLLS: usize = 256;

/// What the flash-sale demo measured (simulated time).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlashSaleReport {
    /// Members queued in the burst.
    pub members: usize,
    /// The configured admission rate.
    pub admit_per_second: f64,
    /// Members admitted.
    pub admitted: u64,
    /// Orders that committed (tokens consumed).
    pub orders_committed: u64,
    /// Orders the order service failed (tokens released, orders retried).
    pub orders_failed: u64,
    /// Simulated seconds from the burst to the last admission.
    pub simulated_seconds: u64,
    /// The most admitted in any one simulated second.
    pub max_admitted_in_one_second: u64,
    /// Mean wait estimated at entry, in seconds.
    pub mean_estimated_wait_seconds: f64,
    /// Mean actual wait from entry to admission, in seconds.
    pub mean_actual_wait_seconds: f64,
    /// Polls answered (position lookups).
    pub polls: u64,
    /// Polls whose answer differed from the member's previous one: the events a member stream would have
    /// pushed in their place, over one request per member.
    pub changed_polls: u64,
    /// Admitted members whose entry carried an estimate (the backtest's sample).
    pub backtested: u64,
    /// Backtest: median of |estimated wait at entry − actual wait to admission|, in seconds.
    pub median_absolute_error_seconds: f64,
    /// Backtest: share of the sample whose actual wait exceeded the P90 estimated at entry (ideally ~0.1).
    pub beyond_p90_share: f64,
}

/// The backtest of the wait estimates: for every admitted member with an estimate at entry, the median
/// absolute error of the median estimate and the share of actual waits beyond the P90 estimate. Actual
/// waits are from entry to the admission step that issued the token (not to the poll that saw it).
fn backtest(shoppers: &[Shopper]) -> (u64, f64, f64) {
    let mut errors = Vec::new();
    let mut beyond = 0u64;
    for shopper in shoppers {
        let (Some(admitted), Some(median), Some(p90)) = (
            shopper.admission_ms,
            shopper.estimated_wait_seconds_median,
            shopper.estimated_wait_seconds_p90,
        ) else {
            continue;
        };
        let actual = (admitted - shopper.entered_at_ms) as f64 / 1000.0;
        errors.push((median as f64 - actual).abs());
        if actual > p90 as f64 {
            beyond += 1;
        }
    }
    if errors.is_empty() {
        return (0, 0.0, 0.0);
    }
    errors.sort_by(f64::total_cmp);
    let count = errors.len();
    let median = if count % 2 == 1 {
        errors[count / 2]
    } else {
        (errors[count / 2 - 1] + errors[count / 2]) / 2.0
    };
    (count as u64, median, beyond as f64 / count as f64)
}

/// The estimates an entry answered: median and P90 (`null` while paused).
type Estimates = (Option<u64>, Option<u64>);

/// What a poll showed, to tell a changed position from the same one: status, rank, median, P90.
type Seen = (MemberStatus, Option<u64>, Option<u64>, Option<u64>);

struct Shopper {
    member: MemberId,
    estimated_wait_seconds: u64,
    /// The estimates the entry answered (`null` while paused).
    estimated_wait_seconds_median: Option<u64>,
    estimated_wait_seconds_p90: Option<u64>,
    /// Simulated time of the entry and of the admission step that admitted the member.
    entered_at_ms: i64,
    admission_ms: Option<i64>,
    admitted_at_ms: Option<i64>,
    /// The last position polled (status, rank, median, P90), to count the polls a stream would replace.
    last_seen: Option<Seen>,
    ordered: bool,
}

async fn spawn_order_service(attempts: Arc<AtomicU64>) -> anyhow::Result<std::net::SocketAddr> {
    use axum::routing::post;
    let router = axum::Router::new().route(
        "/orders",
        post(move || {
            let attempts = Arc::clone(&attempts);
            async move {
                // Every tenth order attempt fails, as an out-of-stock row lock or a database timeout would.
                if attempts.fetch_add(1, Ordering::SeqCst) % 10 == 9 {
                    (axum::http::StatusCode::SERVICE_UNAVAILABLE, "order database busy")
                } else {
                    (axum::http::StatusCode::CREATED, "order placed")
                }
            }
        }),
    );
    serve_on_loopback(router, "the order service").await
}

/// Serves `router` on a free loopback port in the background, for the rest of the process: the demos'
/// own servers (the waiting room, the simulated order service). `what` names it in a bind error.
pub(super) async fn serve_on_loopback(
    router: axum::Router,
    what: &'static str,
) -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .with_context(|| format!("binding {what}"))?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(address)
}

/// Runs the flash-sale scene with `members` simulated members, in-process on port 0, writing progress to `out`.
pub async fn run_flash_sale_demo(
    data_dir: &Path,
    members: usize,
    redis: &[String],
    out: &mut (dyn Write + Send),
) -> anyhow::Result<FlashSaleReport> {
    let queue_name = "flash-sale";
    let queue = QueueName::parse(queue_name).expect("valid queue name");
    // Admit the crowd over about a minute of simulated time, and never slower than the spec's default.
    let admit_per_second = ((members as f64 / 60.0).ceil()).max(50.0);
    let attempts = Arc::new(AtomicU64::new(0));
    let orders = spawn_order_service(Arc::clone(&attempts)).await?;
    let config = WaitingRoomConfig {
        admit_per_second,
        gates: vec![GateConfig {
            queue: queue_name.into(),
            upstream: format!("http://{orders}"),
            routes: vec![GateRoute {
                method: "POST".into(),
                path: "/orders".into(),
                prefix: false,
            }],
            timeout_millis: 10_000,
            max_body_bytes: 65_536,
        }],
        // The demo's shoppers all come from 127.0.0.1: one address, no per-address budget (issue 28).
        entries_per_address_per_minute: 0,
        // A fresh secret of the demo's own, as an operator would configure one for a shared store.
        token_secret: Some(
            URL_SAFE_NO_PAD.encode(
                TokenSecret::generate()
                    .context("reading the OS random number generator")?
                    .to_bytes(),
            ),
        ),
        ..WaitingRoomConfig::default()
    };
    let clock = ManualClock::new(rankgate_store::clock::SystemClock.now_millis());
    let room = if redis.is_empty() {
        WaitingRoom::open_embedded(data_dir, config, Arc::new(clock.clone())).await?
    } else {
        // A key prefix of its own, deleted at the end: the demo never touches anyone's queues.
        let prefix = format!("rankgate-demo:{}:{}:", std::process::id(), clock.now_millis());
        WaitingRoom::open_redis_simulated(redis, &prefix, config, Arc::new(clock.clone()))
            .await
            .context("opening the demo's waiting room on Redis (check --redis)")?
    };
    // The scene, then the clean-up whatever the scene's outcome.
    let scene: anyhow::Result<FlashSaleReport> = async {
        let mut router = crate::waiting_room::member_routes(Arc::clone(&room));
        if let Some(gate) = crate::waiting_room::gate_routes(Arc::clone(&room)) {
            router = router.merge(gate);
        }
        let base = format!("http://{}", serve_on_loopback(router, "the demo server").await?);
        let client = reqwest::Client::new();

        writeln!(
            out,
            "flash sale: {members} members arrive at once; admitting {admit_per_second}/s through the gate ({})",
            if redis.is_empty() {
                "embedded store"
            } else {
                "on Redis"
            }
        )?;
        let burst_started = std::time::Instant::now();
        let mut shoppers: Vec<Shopper> = Vec::with_capacity(members);
        let mut burst = tokio::task::JoinSet::new();
        let mut next = 0usize;
        let mut entered: Vec<Option<(MemberId, Estimates)>> = vec![None; members];
        while next < members || !burst.is_empty() {
            while next < members && burst.len() < CONCURRENT_ENTRIES {
                let client = client.clone();
                let url = format!("{base}/v1/queues/{queue_name}/entries");
                let index = next;
                burst.spawn(async move {
                    let member = format!("shopper-{index:06}");
                    let body: serde_json::Value = client
                        .post(url)
                        .json(&serde_json::json!({ "memberId": member }))
                        .send()
                        .await?
                        .json()
                        .await?;
                    let estimates = (
                        body["estimatedWaitSeconds"].as_u64(),
                        body["estimatedWaitSecondsP90"].as_u64(),
                    );
                    anyhow::Ok((
                        index,
                        MemberId::parse(&member).expect("valid member id"),
                        estimates,
                    ))
                });
                next += 1;
            }
            if let Some(joined) = burst.join_next().await {
                let (index, member, estimates) = joined.context("entry task")??;
                entered[index] = Some((member, estimates));
            }
        }
        let entered_at_ms = clock.now_millis();
        for (member, (median, p90)) in entered.into_iter().flatten() {
            shoppers.push(Shopper {
                member,
                estimated_wait_seconds: median.unwrap_or(0),
                estimated_wait_seconds_median: median,
                estimated_wait_seconds_p90: p90,
                entered_at_ms,
                admission_ms: None,
                admitted_at_ms: None,
                last_seen: None,
                ordered: false,
            });
        }
        writeln!(
            out,
            "  burst: {} entries over HTTP in {:.2} s",
            shoppers.len(),
            burst_started.elapsed().as_secs_f64()
        )?;

        let started_ms = clock.now_millis();
        // Each shopper polls at the interval it is told: a heap of (next poll time, shopper).
        let mut polls_due: BinaryHeap<Reverse<(i64, usize)>> = (0..shoppers.len())
            .map(|i| Reverse((started_ms + 1000, i)))
            .collect();
        let mut report = FlashSaleReport {
            members,
            admit_per_second,
            ..FlashSaleReport::default()
        };
        let mut second = 0u64;
        let mut last_admission_second = 0u64;
        let mut committed = 0usize;
        while committed < shoppers.len() && second < 100_000 {
            second += 1;
            clock.advance(1000);
            let now = clock.now_millis();
            let outcomes = room.admit_due_queues().await?;
            let admitted_now: u64 = outcomes.iter().map(|(_, o)| o.admitted.len() as u64).sum();
            // The backtest's actual waits: when each member's token was issued.
            for member in outcomes.iter().flat_map(|(_, o)| o.admitted.iter()) {
                let index = member
                    .as_str()
                    .strip_prefix("shopper-")
                    .and_then(|n| n.parse::<usize>().ok());
                if let Some(shopper) = index.and_then(|i| shoppers.get_mut(i)) {
                    shopper.admission_ms.get_or_insert(now);
                }
            }
            report.admitted += admitted_now;
            report.max_admitted_in_one_second = report.max_admitted_in_one_second.max(admitted_now);
            if admitted_now > 0 {
                last_admission_second = second;
            }

            let mut ready_to_order: Vec<(usize, String)> = Vec::new();
            let mut due_now = Vec::new();
            while let Some(Reverse((due, index))) = polls_due.peek().copied() {
                if due > now {
                    break;
                }
                polls_due.pop();
                due_now.push(index);
            }
            // The shoppers due this second poll at once, as a crowd does (on Redis, concurrent polls share
            // script calls); their answers are handled in the order they were due.
            let answers: Vec<_> = futures_util::stream::iter(due_now.into_iter().map(|index| {
                let (room, queue, member) = (&room, &queue, shoppers[index].member.clone());
                async move { (index, room.poll(queue, &member).await) }
            }))
            .buffered(CONCURRENT_POLLS)
            .collect()
            .await;
            for (index, answer) in answers {
                let shopper = &mut shoppers[index];
                let (position, _) = match answer {
                    Ok(answer) => answer,
                    Err(crate::http::error::ApiError::TooManyRequests { retry_after_secs, .. }) => {
                        polls_due.push(Reverse((now + retry_after_secs as i64 * 1000, index)));
                        continue;
                    }
                    Err(error) => return Err(anyhow::anyhow!("poll failed: {error}")),
                };
                report.polls += 1;
                // What a member stream would have pushed instead: the answers that changed (the first
                // is the stream's opening event), at the same cadence.
                let seen = (
                    position.status,
                    position.rank,
                    position.estimated_wait_seconds,
                    position.estimated_wait_seconds_p90,
                );
                if shopper.last_seen != Some(seen) {
                    shopper.last_seen = Some(seen);
                    report.changed_polls += 1;
                }
                match position.status {
                    MemberStatus::Ready => {
                        shopper.admitted_at_ms.get_or_insert(now);
                        ready_to_order.push((index, position.entry_token.unwrap_or_default()));
                    }
                    MemberStatus::Waiting | MemberStatus::Claimed => {
                        let interval_ms = (position.polling_interval_seconds * 1000.0) as i64;
                        polls_due.push(Reverse((now + interval_ms.max(1000), index)));
                    }
                    MemberStatus::NotEntered => {}
                }
            }
            // Orders go through the gate over HTTP, a bounded number at a time (like the shop's own clients).
            let mut orders = tokio::task::JoinSet::new();
            let mut pending = ready_to_order.into_iter();
            loop {
                while orders.len() < CONCURRENT_ORDERS {
                    let Some((index, token)) = pending.next() else {
                        break;
                    };
                    let (client, url, member) = (
                        client.clone(),
                        format!("{base}/orders"),
                        shoppers[index].member.to_string(),
                    );
                    // The ticket the shopper's entry answered with (member_auth = "ticket").
                    let ticket = room.ticket_for(&queue, &shoppers[index].member);
                    orders.spawn(async move {
                        let response = client
                            .post(url)
                            .header("x-entry-token", token)
                            .header("x-member-id", member)
                            .header("x-queue-ticket", ticket)
                            .body("{\"sku\":\"limited-edition\"}")
                            .send()
                            .await?;
                        anyhow::Ok((index, response.status().is_success()))
                    });
                }
                let Some(joined) = orders.join_next().await else {
                    break;
                };
                let (index, success) = joined.context("order task")??;
                if success {
                    shoppers[index].ordered = true;
                    committed += 1;
                    report.orders_committed += 1;
                } else {
                    // Released by the gate: the shopper tries again on its next poll.
                    report.orders_failed += 1;
                    polls_due.push(Reverse((now + 1000, index)));
                }
            }
            if second.is_multiple_of(10) || committed == shoppers.len() {
                let stats = room.stats(&queue).await.map_err(|e| anyhow::anyhow!("{e}"))?;
                writeln!(
                    out,
                    "  t={second:>4}s  waiting {:>7}  ready {:>5}  admitted/s (measured) {:>8.1}  orders {:>7}  failed+retried {:>5}",
                    stats.waiting,
                    stats.ready,
                    stats.measured_rate.unwrap_or(0.0),
                    report.orders_committed,
                    report.orders_failed,
                )?;
            }
        }
        report.simulated_seconds = second;
        let admitted: Vec<&Shopper> = shoppers.iter().filter(|s| s.admitted_at_ms.is_some()).collect();
        if !admitted.is_empty() {
            let count = admitted.len() as f64;
            report.mean_estimated_wait_seconds = admitted
                .iter()
                .map(|s| s.estimated_wait_seconds as f64)
                .sum::<f64>()
                / count;
            report.mean_actual_wait_seconds = admitted
                .iter()
                .map(|s| (s.admitted_at_ms.unwrap_or(started_ms) - started_ms) as f64 / 1000.0)
                .sum::<f64>()
                / count;
        }
        writeln!(
            out,
            "  done: {} admitted over {} simulated s ({:.1}/s, at most {} in one second; configured {admit_per_second}/s); \
             last order at {} s",
            report.admitted,
            last_admission_second,
            report.admitted as f64 / last_admission_second.max(1) as f64,
            report.max_admitted_in_one_second,
            report.simulated_seconds,
        )?;
        writeln!(
            out,
            "  wait: estimated {:.1} s on average at entry, actual {:.1} s (admission seen at the member's next poll)",
            report.mean_estimated_wait_seconds, report.mean_actual_wait_seconds
        )?;
        (
            report.backtested,
            report.median_absolute_error_seconds,
            report.beyond_p90_share,
        ) = backtest(&shoppers);
        writeln!(
            out,
            "  estimate backtest ({} admitted members; the wait estimated at entry vs the actual wait until \
             admission): median absolute error {:.2} s, actual beyond the P90 estimate for {:.1}%",
            report.backtested,
            report.median_absolute_error_seconds,
            report.beyond_p90_share * 100.0
        )?;
        // The scene admits at a constant rate and nobody leaves early, so the line should read 0: what it
        // can show here is that the estimates are right, not how the P90 behaves under a varying rate.
        writeln!(
            out,
            "    (this sale admits at a constant rate and nobody leaves, so the estimates should be exact and \
             0% beyond P90 is right; when the rate varies, a calibrated P90 is exceeded by about 10% of waits)"
        )?;
        let admitted = report.admitted.max(1) as f64;
        let orders = (report.orders_committed + report.orders_failed) as f64;
        writeln!(
            out,
            "  requests per admitted member: polling {:.2} (entry + {:.2} polls + {:.2} order attempts); with member \
             streams {:.2} (entry + 1 stream + order attempts; the stream pushes the {:.2} changed positions)",
            (report.members as f64 + report.polls as f64 + orders) / admitted,
            report.polls as f64 / admitted,
            orders / admitted,
            (report.members as f64 * 2.0 + orders) / admitted,
            report.changed_polls as f64 / admitted,
        )?;
        writeln!(
            out,
            "  orders: {} committed, {} failed and retried through the gate; {} polls answered",
            report.orders_committed, report.orders_failed, report.polls
        )?;
        Ok(report)
    }
    .await;
    if let Some(store) = room.embedded_store() {
        store.close();
    }
    if let Some(store) = room.redis_store() {
        if store.is_cluster() {
            // One SCAN does not visit every node of a Cluster, and queue keys have no TTL.
            writeln!(
                out,
                "  the demo's keys stay on the Cluster under the prefix {:?}; delete them on each node",
                store.prefix()
            )?;
        } else {
            store
                .purge_prefix()
                .await
                .map_err(|e| anyhow::anyhow!("deleting the demo's keys: {e}"))?;
        }
    }
    scene
}
