//! rankgate's Prometheus exposition: the process-wide recorder behind `/metrics`, set up by
//! Prometheus's conventions.
//!
//! - [`catalogue`]: every series with its type, labels, unit and help text, given to the recorder
//!   before it renders anything; histograms get buckets that fit them there.
//! - [`http_requests`]: requests by route template, method and status, and their latency.
//! - here: installing the recorder ([`prometheus_handle`]), and the series of the process as a whole,
//!   refreshed at each scrape ([`refresh_process_series`]): `process_*` (CPU, memory, file
//!   descriptors, start time, threads; read by the `metrics-process` crate) and `rankgate_build_info`.
//!
//! The products record their own series where they happen (`waiting_room::telemetry`, the rankings'
//! ingest, serving and webhooks), through the `metrics` facade.

pub mod catalogue;
pub mod http_requests;

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::waiting_room::SERIES_IDLE_TIMEOUT;
use catalogue::{Exporter, Kind, SERIES};

/// How often histogram samples are folded into their buckets between scrapes. Without it, samples pile
/// up in memory until the next `/metrics` (an unscraped instance would grow without bound).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The process-wide Prometheus recorder; installed once even when tests start many apps.
pub fn prometheus_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            // Series idle this long are dropped, so those of deleted and forgotten queues do not pile up
            // (defect 4; see waiting_room::telemetry).
            let mut builder = PrometheusBuilder::new()
                .idle_timeout(metrics_util::MetricKindMask::ALL, Some(SERIES_IDLE_TIMEOUT));
            for series in SERIES
                .iter()
                .filter(|s| s.kind == Kind::Histogram && s.exporter == Exporter::Server)
            {
                builder = builder
                    .set_buckets_for_metric(Matcher::Full(series.name.to_string()), series.buckets)
                    .expect("the catalogue's buckets are not empty (a unit test checks)");
            }
            let recorder = builder.build_recorder();
            // Described on the recorder itself, before it is installed: the descriptions reach ours even
            // if another global recorder is already installed (e.g. by an embedding test).
            catalogue::describe_all(&recorder);
            let handle = recorder.handle();
            let _ = metrics::set_global_recorder(recorder);
            let upkeep = handle.clone();
            let spawned = std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || loop {
                    std::thread::sleep(UPKEEP_EVERY);
                    upkeep.run_upkeep();
                });
            if let Err(error) = spawned {
                tracing::warn!(%error, "no metrics upkeep thread: histogram samples wait for the next scrape");
            }
            handle
        })
        .clone()
}

/// Sets the series of the process as a whole (module docs); called before each render, so they are as
/// of the scrape and never idle long enough to be dropped.
pub fn refresh_process_series() {
    static PROCESS: OnceLock<metrics_process::Collector> = OnceLock::new();
    // Its own descriptions are not used: the catalogue's are given to the recorder first.
    PROCESS.get_or_init(metrics_process::Collector::default).collect();
    metrics::gauge!("rankgate_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}
