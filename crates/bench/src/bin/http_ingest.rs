//! `http-ingest`: durable ingest over HTTP, measured from the client side.
//!
//! Reads an NDJSON file of SPEC 1.1 events (for example `gen-workload seed-lesson --out seed.ndjson`),
//! groups its lines into JSON arrays of `--batch` events (2,000 by default) *before* the clock starts, then
//! `POST`s them to `{url}/v1/events` over `--connections` concurrent keep-alive connections, each taking
//! the next batch as soon as its previous one is acknowledged. A 200 means every accepted event of the batch
//! is committed, so the figure is durable events per second. It prints one line:
//!
//! ```text
//! http-ingest: 892000 events in 5.123 s = 174117 events/s (accepted …, duplicates …, tooOld …, rejected …), 2 connections × 2000-event batches
//! ```
//!
//! ```text
//! http-ingest FILE [--url http://127.0.0.1:8080] [--batch 2000] [--connections 2] [--max-secs 120]
//! ```
//!
//! Only loopback URLs are accepted; `--max-secs` bounds the run (unsent batches are then reported).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use rankgate_bench::loopback_base_url;

#[derive(Parser)]
#[command(
    name = "http-ingest",
    about = "POST an NDJSON file's events to rankgate as JSON-array batches and report events/s"
)]
struct Cli {
    /// NDJSON file, one event per line.
    file: PathBuf,
    /// Base URL of the rankgate server (loopback only).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Events per POST.
    #[arg(long, default_value_t = 2000)]
    batch: usize,
    /// Concurrent connections.
    #[arg(long, default_value_t = 2)]
    connections: usize,
    /// Upper bound on the run, in seconds.
    #[arg(long, default_value_t = 120.0)]
    max_secs: f64,
}

/// Outcome counters summed over every acknowledged batch.
#[derive(Default)]
struct Totals {
    sent: AtomicU64,
    accepted: AtomicU64,
    duplicates: AtomicU64,
    too_old: AtomicU64,
    rejected: AtomicU64,
}

fn field(v: &serde_json::Value, name: &str) -> u64 {
    v.get(name).and_then(serde_json::Value::as_u64).unwrap_or(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.batch == 0 || cli.connections == 0 {
        bail!("--batch and --connections must be at least 1");
    }
    let base = loopback_base_url(&cli.url).map_err(anyhow::Error::msg)?;
    let text =
        std::fs::read_to_string(&cli.file).with_context(|| format!("reading {}", cli.file.display()))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let bodies: Arc<Vec<(usize, String)>> = Arc::new(
        lines
            .chunks(cli.batch)
            .map(|chunk| (chunk.len(), format!("[{}]", chunk.join(","))))
            .collect(),
    );
    drop(lines);
    drop(text);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(cli.connections)
        .build()?;
    let endpoint = format!("{base}/v1/events");
    let next = Arc::new(AtomicUsize::new(0));
    let totals = Arc::new(Totals::default());
    let deadline = Duration::from_secs_f64(cli.max_secs);
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..cli.connections {
        let (client, endpoint, next, totals, bodies) = (
            client.clone(),
            endpoint.clone(),
            next.clone(),
            totals.clone(),
            bodies.clone(),
        );
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= bodies.len() || started.elapsed() > deadline {
                    return Ok::<(), anyhow::Error>(());
                }
                let (n, body) = &bodies[i];
                let response = client
                    .post(&endpoint)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await?;
                let status = response.status();
                let answer: serde_json::Value = response.json().await?;
                if !status.is_success() {
                    bail!("batch {i}: HTTP {status}: {answer}");
                }
                totals.sent.fetch_add(*n as u64, Ordering::Relaxed);
                totals
                    .accepted
                    .fetch_add(field(&answer, "accepted"), Ordering::Relaxed);
                totals
                    .duplicates
                    .fetch_add(field(&answer, "duplicates"), Ordering::Relaxed);
                totals
                    .too_old
                    .fetch_add(field(&answer, "tooOld"), Ordering::Relaxed);
                let rejected = answer
                    .get("rejected")
                    .and_then(serde_json::Value::as_array)
                    .map_or(0, Vec::len);
                totals.rejected.fetch_add(rejected as u64, Ordering::Relaxed);
            }
        }));
    }
    for w in workers {
        w.await??;
    }
    let secs = started.elapsed().as_secs_f64();
    let sent = totals.sent.load(Ordering::Relaxed);
    println!(
        "http-ingest: {sent} events in {secs:.3} s = {:.0} events/s (accepted {}, duplicates {}, tooOld {}, rejected {}), {} connections × {}-event batches{}",
        sent as f64 / secs,
        totals.accepted.load(Ordering::Relaxed),
        totals.duplicates.load(Ordering::Relaxed),
        totals.too_old.load(Ordering::Relaxed),
        totals.rejected.load(Ordering::Relaxed),
        cli.connections,
        cli.batch,
        if next.load(Ordering::Relaxed) < bodies.len() { " (stopped at --max-secs)" } else { "" },
    );
    Ok(())
}
