//! The catalogue of every Prometheus series rankgate exports: name, type, labels, unit and help text,
//! in one list.
//!
//! The recorder is given every description from here before it renders anything ([`describe_all`]),
//! so each series carries `# HELP` and `# TYPE` (`promtool check metrics` flags a series without
//! help); each histogram gets buckets that fit what it measures ([`Series::buckets`]), so it is a
//! Prometheus histogram (aggregatable across instances) and not a summary. The relay, a separate
//! process with its own `/metrics`, writes its help and type lines from the same list.
//!
//! The tests hold the list to what runs: every series a live server renders must be listed here with
//! the same type, and every metric name the alert rules and the Grafana dashboard in `deploy/` use must
//! be one of these (`tests/api/metrics.rs`).

use metrics::{KeyName, Recorder, SharedString, Unit};

/// A Prometheus metric type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (resets on restart); `_total`.
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Observations counted into buckets (`_bucket{le=…}`, `_sum`, `_count`).
    Histogram,
}

impl Kind {
    /// The word `# TYPE` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Which process exports a series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exporter {
    /// `rankgate serve`, at `/metrics`.
    Server,
    /// `rankgate relay`, at `--metrics-listen`'s `/metrics`.
    Relay,
}

/// One series family.
#[derive(Debug)]
pub struct Series {
    /// The metric name (for a histogram, without `_bucket`/`_sum`/`_count`).
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Its label names (beside a histogram's `le`).
    pub labels: &'static [&'static str],
    /// What it measures in (`None`: a plain count or a 0/1 flag).
    pub unit: Option<Unit>,
    /// The `# HELP` text: what the series means, and what moves it.
    pub help: &'static str,
    /// A histogram's bucket bounds (upper, inclusive), chosen for the range it measures.
    pub buckets: &'static [f64],
    /// Who exports it.
    pub exporter: Exporter,
}

/// HTTP answers: from half a millisecond (a rank read) to a gated order's upstream (seconds).
const HTTP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// A durable commit of an ingest batch: an fsync or a PostgreSQL commit, a millisecond to seconds.
const COMMIT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// A policy build replays retained history: tens of milliseconds to minutes.
const POLICY_BUILD_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
/// An admission step: about a millisecond at a million waiting (BENCHMARKS row 21), 5 ms its bound.
const ADMISSION_STEP_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

const fn counter(name: &'static str, labels: &'static [&'static str], help: &'static str) -> Series {
    Series {
        name,
        kind: Kind::Counter,
        labels,
        unit: None,
        help,
        buckets: &[],
        exporter: Exporter::Server,
    }
}

const fn gauge(
    name: &'static str,
    labels: &'static [&'static str],
    unit: Option<Unit>,
    help: &'static str,
) -> Series {
    Series {
        name,
        kind: Kind::Gauge,
        labels,
        unit,
        help,
        buckets: &[],
        exporter: Exporter::Server,
    }
}

const fn histogram(
    name: &'static str,
    labels: &'static [&'static str],
    buckets: &'static [f64],
    help: &'static str,
) -> Series {
    Series {
        name,
        kind: Kind::Histogram,
        labels,
        unit: Some(Unit::Seconds),
        help,
        buckets,
        exporter: Exporter::Server,
    }
}

const fn relay(series: Series) -> Series {
    Series {
        exporter: Exporter::Relay,
        ..series
    }
}

const SECONDS: Option<Unit> = Some(Unit::Seconds);
const BYTES: Option<Unit> = Some(Unit::Bytes);

/// Every series, grouped as README's table is.
pub const SERIES: &[Series] = &[
    // The service as a whole.
    gauge("rankgate_build_info", &["version"], None, "Always 1; the version label names the running build."),
    counter(
        "rankgate_http_requests_total",
        &["route", "method", "status"],
        "HTTP requests answered, by route template (`unmatched` for a path no route serves; \
         `connection_limit` for connections refused past max_connections), method and status.",
    ),
    histogram(
        "rankgate_http_request_duration_seconds",
        &["route"],
        HTTP_BUCKETS,
        "Time from a request's head to its answer's head, by route template (a stream's lifetime is not included).",
    ),
    counter("process_cpu_seconds_total", &[], "User and system CPU time the process spent, in whole seconds."),
    gauge("process_resident_memory_bytes", &[], BYTES, "Resident memory of the process."),
    gauge("process_virtual_memory_bytes", &[], BYTES, "Virtual memory size of the process."),
    gauge(
        "process_virtual_memory_max_bytes",
        &[],
        BYTES,
        "The address-space limit of the process (0: unlimited).",
    ),
    gauge("process_open_fds", &[], None, "File descriptors the process holds open."),
    gauge("process_max_fds", &[], None, "The process's limit of open file descriptors (soft limit)."),
    gauge("process_start_time_seconds", &[], SECONDS, "When the process started, in seconds since the Unix epoch."),
    gauge("process_threads", &[], None, "OS threads of the process."),
    // Rankings: ingest.
    counter("rankgate_events_accepted_total", &[], "Events accepted and durable, from every source."),
    counter(
        "rankgate_events_duplicate_total",
        &[],
        "Events whose id was already stored (answered as duplicates, not counted again).",
    ),
    counter(
        "rankgate_events_too_old_total",
        &[],
        "Events older than max_lateness behind the watermark (answered tooOld, not stored).",
    ),
    counter(
        "rankgate_events_rejected_total",
        &[],
        "Events refused as invalid (the `rejected` entries of ingest answers, and the stream and Kafka \
         records dead-lettered as invalid).",
    ),
    histogram(
        "rankgate_ingest_commit_seconds",
        &[],
        COMMIT_BUCKETS,
        "Time to make one writer batch durable in the source of truth.",
    ),
    gauge("rankgate_products", &[], None, "Products the ranking engine knows."),
    gauge(
        "rankgate_freshness_lag_seconds",
        &[],
        SECONDS,
        "Age of the newest ingest the served rankings include (time since the last applied batch).",
    ),
    histogram(
        "rankgate_policy_build_seconds",
        &[],
        POLICY_BUILD_BUCKETS,
        "Time to build a ranking policy's scores from retained history.",
    ),
    // Rankings: Redis serving.
    gauge(
        "rankgate_serving_stale",
        &[],
        None,
        "1 while Redis serving is stale (reads answer from memory, marked stale), else 0.",
    ),
    counter("rankgate_serving_writes_total", &[], "Writes made to Redis serving keys."),
    counter("rankgate_serving_calls_total", &[], "Redis calls (pipelines, scripts) made to publish serving keys."),
    counter(
        "rankgate_serving_rebuilds_total",
        &[],
        "Rebuilds of this instance's span groups into a fresh Redis generation.",
    ),
    gauge(
        "rankgate_serving_groups",
        &[],
        None,
        "Span groups (of 36) this instance publishes to Redis now.",
    ),
    gauge(
        "rankgate_serving_spans",
        &[],
        None,
        "Hot spans this instance keeps published in Redis now (its groups' spans in demand).",
    ),
    // Rankings: stream and Kafka ingest.
    counter("rankgate_stream_entries_total", &[], "Redis Stream entries consumed and acknowledged."),
    counter(
        "rankgate_stream_dead_lettered_total",
        &[],
        "Redis Stream entries moved to the dead-letter stream as invalid.",
    ),
    counter("rankgate_kafka_records_total", &[], "Kafka records consumed and committed."),
    counter(
        "rankgate_kafka_dead_lettered_total",
        &[],
        "Kafka records written to the dead-letter topic as invalid.",
    ),
    counter("rankgate_kafka_rebalances_total", &["kind"], "Consumer-group rebalances seen, by kind (assign, revoke)."),
    counter("rankgate_kafka_pauses_total", &[], "Times consumption paused because too many records were in flight."),
    gauge("rankgate_kafka_paused", &[], None, "1 while consumption is paused for back-pressure, else 0."),
    gauge("rankgate_kafka_in_flight_records", &[], None, "Records read and not yet durable."),
    gauge("rankgate_kafka_records_per_second", &[], None, "Records consumed per second, over the last interval."),
    gauge("rankgate_kafka_assigned_partitions", &[], None, "Partitions of the topic assigned to this instance."),
    gauge(
        "rankgate_kafka_consumer_lag",
        &["topic", "partition"],
        None,
        "Records behind the high watermark, per assigned partition.",
    ),
    gauge(
        "rankgate_kafka_instance_lag",
        &[],
        None,
        "Records behind the high watermark, summed over this instance's partitions.",
    ),
    // Rankings: webhooks and streams.
    counter(
        "rankgate_webhook_deliveries_total",
        &["webhook", "outcome"],
        "Webhook delivery attempts, by outcome (delivered, retry, dead, unconfigured, stale).",
    ),
    gauge(
        "rankgate_webhook_jobs",
        &["state"],
        None,
        "Webhook deliveries in the job store, by state (ready, processing, dead: dead-lettered).",
    ),
    gauge("rankgate_top_streams_open", &[], None, "Top-list Server-Sent Event streams open."),
    counter(
        "rankgate_top_streams_dropped_total",
        &["reason"],
        "Top-list streams dropped, by reason (slow_client: it did not read).",
    ),
    gauge("rankgate_top_stream_watchers", &[], None, "Rankings watched by at least one top-list stream."),
    // Waiting room.
    counter("rankgate_queue_entered_total", &["queue"], "Members who entered a queue (a repeated entry is not counted)."),
    counter("rankgate_queue_admitted_total", &["queue"], "Members admitted (given an entry token)."),
    counter(
        "rankgate_queue_tokens_total",
        &["queue", "outcome"],
        "Entry tokens by what became of them (issued, claimed, consumed, released, expired, claim_expired).",
    ),
    counter(
        "rankgate_queue_abandoned_total",
        &["queue"],
        "Waiting members dropped for not polling (the store's total, shared by every instance).",
    ),
    counter("rankgate_queue_members_removed_total", &["queue"], "Members an admin removed."),
    counter(
        "rankgate_queue_entries_refused_total",
        &["queue", "reason"],
        "Entries refused before they made a member, by reason (challenge, address, captcha, ...).",
    ),
    counter("rankgate_queue_poll_limited_total", &["queue"], "Position polls answered 429 (polled too often)."),
    gauge("rankgate_queue_waiting", &["queue"], None, "Members waiting in the queue."),
    gauge(
        "rankgate_queue_oldest_wait_seconds",
        &["queue"],
        SECONDS,
        "How long the longest-waiting member has waited.",
    ),
    gauge("rankgate_queue_ready", &["queue"], None, "Admitted members holding an unclaimed token."),
    gauge("rankgate_queue_claimed", &["queue"], None, "Admitted members whose token is claimed by a gated request."),
    gauge(
        "rankgate_queue_admitted_per_second",
        &["queue"],
        None,
        "Admissions per second, a measured moving average.",
    ),
    gauge(
        "rankgate_queue_effective_admit_per_second",
        &["queue"],
        None,
        "The admission rate the budget spends (the controller's, in adaptive mode).",
    ),
    histogram(
        "rankgate_queue_admission_step_seconds",
        &["queue"],
        ADMISSION_STEP_BUCKETS,
        "Time of one admission step (pop, issue tokens, expire).",
    ),
    counter(
        "rankgate_gate_requests_total",
        &["queue", "outcome"],
        "Requests through the gate, by outcome (consumed, rejected_unauthorized, rejected_conflict, \
         released_upstream_error, released_timeout, released_upstream_status, unavailable, fail_open).",
    ),
    gauge(
        "rankgate_gate_upstream_p95_seconds",
        &["queue"],
        SECONDS,
        "p95 upstream latency over the last closed control interval (all instances).",
    ),
    gauge(
        "rankgate_gate_upstream_error_rate",
        &["queue"],
        None,
        "Share of upstream answers that were errors over the last closed control interval (0 to 1).",
    ),
    gauge(
        "rankgate_gate_upstream_samples",
        &["queue"],
        None,
        "Upstream answers measured in the last closed control interval.",
    ),
    counter(
        "rankgate_queue_redis_script_calls_total",
        &["lane"],
        "Redis script calls of the waiting room's hot path, by lane (enter, poll).",
    ),
    counter(
        "rankgate_queue_redis_requests_total",
        &["lane"],
        "Entries and polls served by those calls (requests per call is the coalescing).",
    ),
    gauge("rankgate_member_streams_open", &[], None, "Members' position streams (Server-Sent Events) open."),
    counter(
        "rankgate_member_streams_dropped_total",
        &["reason"],
        "Member streams dropped, by reason (slow_client: it did not read).",
    ),
    gauge("rankgate_member_stream_watches", &[], None, "Queues watched by at least one member stream."),
    // The outbox relay (`rankgate relay`).
    relay(counter("rankgate_relay_rows_published_total", &[], "Outbox rows published and marked published.")),
    relay(gauge(
        "rankgate_relay_rows_per_second",
        &[],
        None,
        "Rows published per second, over the last second or more.",
    )),
    relay(counter("rankgate_relay_batches_total", &[], "Batches committed.")),
    relay(counter(
        "rankgate_relay_batch_failures_total",
        &[],
        "Batches that failed and were rolled back, to be sent again.",
    )),
    relay(counter(
        "rankgate_relay_events_rejected_total",
        &[],
        "Published rows whose event rankgate rejected as invalid (--to).",
    )),
    relay(counter("rankgate_relay_rows_deleted_total", &[], "Published rows deleted by --retention.")),
    relay(gauge("rankgate_relay_backlog_rows", &[], None, "Unpublished outbox rows at the last measurement.")),
    relay(gauge(
        "rankgate_relay_oldest_unpublished_seconds",
        &[],
        SECONDS,
        "Age of the oldest unpublished row at the last measurement (0 when none).",
    )),
];

/// The catalogue entry of `name`.
pub fn series(name: &str) -> Option<&'static Series> {
    SERIES.iter().find(|series| series.name == name)
}

/// Gives `recorder` the help text and unit of every series the server exports.
pub fn describe_all(recorder: &dyn Recorder) {
    for series in SERIES.iter().filter(|s| s.exporter == Exporter::Server) {
        let (name, help) = (
            KeyName::from_const_str(series.name),
            SharedString::const_str(series.help),
        );
        match series.kind {
            Kind::Counter => recorder.describe_counter(name, series.unit, help),
            Kind::Gauge => recorder.describe_gauge(name, series.unit, help),
            Kind::Histogram => recorder.describe_histogram(name, series.unit, help),
        }
    }
}

/// The `# HELP` and `# TYPE` lines of `name` (a relay series), for a hand-written exposition.
pub fn header_lines(name: &str) -> String {
    let series = series(name).unwrap_or_else(|| panic!("{name} is not in the metrics catalogue"));
    format!(
        "# HELP {name} {}\n# TYPE {name} {}\n",
        series.help,
        series.kind.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_histogram_has_increasing_buckets_and_nothing_else_has_any() {
        for series in SERIES {
            match series.kind {
                Kind::Histogram => {
                    assert!(!series.buckets.is_empty(), "{} has no buckets", series.name);
                    assert!(
                        series.buckets.windows(2).all(|pair| pair[0] < pair[1]),
                        "{}: buckets must increase",
                        series.name
                    );
                }
                _ => assert!(
                    series.buckets.is_empty(),
                    "{}: buckets on a non-histogram",
                    series.name
                ),
            }
        }
    }

    #[test]
    fn readme_lists_every_series() {
        let readme = include_str!("../../../../README.md");
        for series in SERIES {
            assert!(
                readme.contains(&format!("| `{}` | {} |", series.name, series.kind.as_str())),
                "README's metrics table lacks {} ({})",
                series.name,
                series.kind.as_str()
            );
        }
    }

    #[test]
    fn names_are_unique_and_follow_prometheus_naming() {
        let mut names: Vec<_> = SERIES.iter().map(|s| s.name).collect();
        names.sort();
        let count = names.len();
        names.dedup();
        assert_eq!(names.len(), count, "a name is listed twice");
        for series in SERIES {
            assert_eq!(
                series.kind == Kind::Counter,
                series.name.ends_with("_total"),
                "{}: counters and only counters end in _total",
                series.name
            );
            if series.unit == Some(Unit::Seconds) {
                assert!(series.name.ends_with("_seconds"), "{}: say the unit", series.name);
            }
            assert!(!series.help.is_empty() && !series.help.contains('\n'));
        }
    }
}
