//! `freshness`: how soon an ingested event is visible in reads, under a steady ingest load.
//!
//! For `--secs` seconds it `POST`s `product_viewed` events stamped with the current time to
//! `{url}/v1/events` at `--rate` events/s, in one batch every `--tick-ms` (1,000 events every 50 ms at
//! the default 20,000 events/s). Every `--marker-every`-th batch carries one *marker*: a view of a product
//! of its own (`fm<run>x<k>`). From the moment that batch's `POST` starts, a watcher polls
//! `GET /v1/products/{marker}/rank?category=all&window=1h` every `--poll-ms` until `metrics.views` is 1;
//! the marker's freshness is the time from send to the first read that shows it. Batches are sent on
//! schedule whether or not earlier ones were acknowledged (at most `--max-in-flight` at once), so a slow
//! server shows up as latency rather than as a lower offered rate.
//!
//! It prints the achieved event rate, the acknowledgement latency of the batches and the p50/p99/max
//! send→visible latency of the markers (a marker not visible within `--give-up-secs` is reported as lost):
//!
//! ```text
//! freshness [--url http://127.0.0.1:8080] [--rate 20000] [--secs 20] [--tick-ms 50] [--marker-every 2]
//!           [--poll-ms 2] [--max-in-flight 32] [--give-up-secs 10]
//! ```
//!
//! Only loopback URLs are accepted.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::bail;
use clap::Parser;
use rand::Rng;
use rankgate_bench::loopback_base_url;
use tokio::sync::{Mutex, Semaphore};

#[derive(Parser)]
#[command(
    name = "freshness",
    about = "Measure send→visible latency of marker events under a fixed ingest rate"
)]
struct Cli {
    /// Base URL of the rankgate server (loopback only).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Offered ingest rate, events per second.
    #[arg(long, default_value_t = 20_000)]
    rate: u64,
    /// Duration of the load, seconds.
    #[arg(long, default_value_t = 20)]
    secs: u64,
    /// One batch every this many milliseconds.
    #[arg(long, default_value_t = 50)]
    tick_ms: u64,
    /// Put a marker in every this many batches.
    #[arg(long, default_value_t = 2)]
    marker_every: u64,
    /// Interval between visibility polls of one marker, milliseconds.
    #[arg(long, default_value_t = 2)]
    poll_ms: u64,
    /// Most batches in flight at once; a batch that finds none free waits (and is counted late).
    #[arg(long, default_value_t = 32)]
    max_in_flight: usize,
    /// A marker not visible after this many seconds is counted as lost.
    #[arg(long, default_value_t = 10)]
    give_up_secs: u64,
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn view(id: &str, product: &str, category: &str, ts: i64) -> String {
    format!(
        r#"{{"id":"{id}","type":"product_viewed","ts":{ts},"product_id":"{product}","categories":["{category}"]}}"#
    )
}

/// The value at quantile `q` (0..=1) of sorted `v`, nearest rank.
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// Polls the marker's rank until its view is counted; returns the send→visible seconds.
async fn watch(
    client: reqwest::Client,
    url: String,
    sent: Instant,
    poll: Duration,
    give_up: Duration,
) -> Option<f64> {
    loop {
        if let Ok(response) = client.get(&url).send().await {
            if response.status().is_success() {
                if let Ok(body) = response.json::<serde_json::Value>().await {
                    let views = body
                        .pointer("/metrics/views")
                        .and_then(serde_json::Value::as_f64)
                        .unwrap_or(0.0);
                    if views >= 1.0 {
                        return Some(sent.elapsed().as_secs_f64());
                    }
                }
            }
        }
        if sent.elapsed() > give_up {
            return None;
        }
        tokio::time::sleep(poll).await;
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.rate == 0 || cli.tick_ms == 0 || cli.marker_every == 0 || cli.max_in_flight == 0 {
        bail!("--rate, --tick-ms, --marker-every and --max-in-flight must be at least 1");
    }
    let base = loopback_base_url(&cli.url).map_err(anyhow::Error::msg)?;
    let client = reqwest::Client::new();
    let run = std::process::id();
    let per_batch = (cli.rate * cli.tick_ms / 1000).max(1) as usize;
    let batches = cli.secs * 1000 / cli.tick_ms;
    let slots = Arc::new(Semaphore::new(cli.max_in_flight));
    let acks = Arc::new(Mutex::new(Vec::<f64>::new()));
    let mut posts = Vec::new();
    let mut watchers = Vec::new();
    let mut interval = tokio::time::interval(Duration::from_millis(cli.tick_ms));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let (mut seq, mut markers, mut late) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    for b in 0..batches {
        interval.tick().await;
        let now = now_millis();
        let mut events = Vec::with_capacity(per_batch);
        let marker = (b % cli.marker_every == 0).then(|| {
            markers += 1;
            format!("fm{run}x{markers}")
        });
        {
            let mut rng = rand::rng();
            for _ in 0..per_batch - usize::from(marker.is_some()) {
                seq += 1;
                let product = format!("p{}", rng.random_range(0..20_000));
                let category = format!("cat{}", rng.random_range(0..50));
                events.push(view(&format!("fr{run}-{seq}"), &product, &category, now));
            }
        }
        if let Some(m) = &marker {
            events.push(view(&format!("fmid{run}-{m}"), m, "cat0", now));
        }
        let body = format!("[{}]", events.join(","));
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                late += 1;
                slots.clone().acquire_owned().await?
            }
        };
        let sent = Instant::now();
        let (c, url, acks) = (client.clone(), format!("{base}/v1/events"), acks.clone());
        posts.push(tokio::spawn(async move {
            let response = c
                .post(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await?;
            let status = response.status();
            let text = response.text().await?;
            drop(permit);
            if !status.is_success() {
                bail!("ingest: HTTP {status}: {text}");
            }
            acks.lock().await.push(sent.elapsed().as_secs_f64());
            Ok(())
        }));
        if let Some(m) = marker {
            let url = format!("{base}/v1/products/{m}/rank?category=all&window=1h");
            watchers.push(tokio::spawn(watch(
                client.clone(),
                url,
                sent,
                Duration::from_millis(cli.poll_ms),
                Duration::from_secs(cli.give_up_secs),
            )));
        }
    }
    let offered_secs = started.elapsed().as_secs_f64();
    for p in posts {
        p.await??;
    }
    let mut fresh = Vec::new();
    let mut lost = 0;
    for w in watchers {
        match w.await? {
            Some(s) => fresh.push(s * 1000.0),
            None => lost += 1,
        }
    }
    fresh.sort_by(f64::total_cmp);
    let mut acks: Vec<f64> = acks.lock().await.iter().map(|s| s * 1000.0).collect();
    acks.sort_by(f64::total_cmp);
    let events = batches * per_batch as u64;
    println!(
        "freshness: offered {events} events in {offered_secs:.2} s = {:.0} events/s ({per_batch}-event batches every {} ms, {late} batches waited for a free slot)",
        events as f64 / offered_secs,
        cli.tick_ms
    );
    println!(
        "freshness: batch ack ms p50 {:.1} p99 {:.1} max {:.1}",
        quantile(&acks, 0.5),
        quantile(&acks, 0.99),
        quantile(&acks, 1.0)
    );
    println!(
        "freshness: {} markers, send→visible ms p50 {:.1} p99 {:.1} max {:.1}, lost {lost}",
        fresh.len() + lost,
        quantile(&fresh, 0.5),
        quantile(&fresh, 0.99),
        quantile(&fresh, 1.0)
    );
    Ok(())
}
