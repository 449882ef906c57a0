//! The relay's figures: counters kept in atomics, shown as a progress line on a terminal and as
//! Prometheus text on `--metrics-listen`'s `/metrics` (the relay has no recorder of its own to install,
//! and a handful of series is clearer written out than registered; their help and type lines come from
//! `telemetry::catalogue`, like the server's).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};

use super::outbox::Backlog;
use crate::telemetry::catalogue;

/// Counters and gauges of one relay process.
#[derive(Default)]
pub struct Telemetry {
    /// Rows published and marked.
    pub published: AtomicU64,
    /// Committed batches.
    pub batches: AtomicU64,
    /// Of the published rows, events rankgate rejected (`--to`).
    pub rejected: AtomicU64,
    /// Batches that failed and were rolled back (sent again later).
    pub errors: AtomicU64,
    /// Published rows deleted by `--retention`.
    pub deleted: AtomicU64,
    backlog_rows: AtomicI64,
    /// f64 bits.
    oldest_seconds: AtomicU64,
    /// Rows per second over the last two refreshes: (instant in µs since `epoch`, published then).
    rate: parking_lot::Mutex<RateWindow>,
}

#[derive(Default)]
struct RateWindow {
    epoch: Option<Instant>,
    last_micros: u64,
    last_published: u64,
    rows_per_second: f64,
}

impl Telemetry {
    /// Records the latest backlog measurement.
    pub fn set_backlog(&self, backlog: Backlog) {
        self.backlog_rows.store(backlog.rows, Ordering::Relaxed);
        self.oldest_seconds
            .store(backlog.oldest_seconds.to_bits(), Ordering::Relaxed);
    }

    fn rows_per_second(&self) -> f64 {
        let mut rate = self.rate.lock();
        let epoch = *rate.epoch.get_or_insert_with(Instant::now);
        let now = epoch.elapsed().as_micros() as u64;
        let published = self.published.load(Ordering::Relaxed);
        if now >= rate.last_micros + 1_000_000 {
            rate.rows_per_second =
                (published - rate.last_published) as f64 * 1e6 / (now - rate.last_micros) as f64;
            rate.last_micros = now;
            rate.last_published = published;
        }
        rate.rows_per_second
    }

    /// Updates the progress line (a no-op when hidden).
    pub fn show(&self, progress: &ProgressBar, started: Instant) {
        if progress.is_hidden() {
            return;
        }
        let published = self.published.load(Ordering::Relaxed);
        progress.set_message(format!(
            "{published} rows published ({:.0} rows/s overall), backlog {}, oldest unpublished {:.1}s, {} failed batches",
            published as f64 / started.elapsed().as_secs_f64().max(1e-9),
            self.backlog_rows.load(Ordering::Relaxed),
            f64::from_bits(self.oldest_seconds.load(Ordering::Relaxed)),
            self.errors.load(Ordering::Relaxed),
        ));
    }

    /// Prometheus text exposition; the help and type lines come from the metrics catalogue, which
    /// lists these series beside the server's.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut series = |name: &str, value: String| {
            out.push_str(&catalogue::header_lines(name));
            let _ = writeln!(out, "{name} {value}");
        };
        let counter = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        series("rankgate_relay_rows_published_total", counter(&self.published));
        series(
            "rankgate_relay_rows_per_second",
            format!("{:.1}", self.rows_per_second()),
        );
        series("rankgate_relay_batches_total", counter(&self.batches));
        series("rankgate_relay_batch_failures_total", counter(&self.errors));
        series("rankgate_relay_events_rejected_total", counter(&self.rejected));
        series("rankgate_relay_rows_deleted_total", counter(&self.deleted));
        series(
            "rankgate_relay_backlog_rows",
            self.backlog_rows.load(Ordering::Relaxed).to_string(),
        );
        series(
            "rankgate_relay_oldest_unpublished_seconds",
            format!(
                "{:.3}",
                f64::from_bits(self.oldest_seconds.load(Ordering::Relaxed))
            ),
        );
        out
    }
}

/// A spinner line on a terminal; hidden otherwise (a service logs to its journal instead).
pub fn progress(interactive: bool) -> ProgressBar {
    if !interactive {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}").expect("valid template"),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

/// Serves `GET /metrics` on `address` in the background.
pub async fn serve(address: std::net::SocketAddr, telemetry: Arc<Telemetry>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("--metrics-listen: binding {address}"))?;
    let bound = listener.local_addr()?;
    // On stdout, so a script that asked for port 0 learns the real one.
    println!("relay metrics on http://{bound}/metrics");
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let telemetry = telemetry.clone();
            async move {
                (
                    [("content-type", "text/plain; version=0.0.4")],
                    telemetry.render(),
                )
            }
        }),
    );
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::warn!(%error, "the relay's /metrics listener stopped");
        }
    });
    Ok(())
}
