//! `/metrics` by Prometheus's conventions (issue 30), and the operations files in `deploy/`.
//!
//! The series test runs the real binary in a process of its own: the recorder is one per process, and
//! the other tests of this binary move its counters at the same time, so only a server of its own lets
//! each counter be compared with exactly the answers it counts. Prometheus's own tools judge the rest:
//! `promtool check metrics` on the live exposition, `promtool check rules` and `promtool test rules` on
//! the alert rules. promtool comes from Debian's `prometheus` package (`apt-get install prometheus`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rankgate::telemetry::catalogue::{self, Exporter, Kind};
use serde_json::{json, Value};

use crate::helpers::*;

/// promtool, or a failure that says how to get it.
fn promtool() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("promtool"))
            .find(|candidate| candidate.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("promtool is missing: install Debian's `prometheus` package (apt-get install prometheus)")
    })
}

/// Runs promtool with `args` (and `stdin`), failing with its output unless it succeeds.
fn run_promtool(args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new(promtool())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    let output = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?} failed:\n{said}");
    said
}

/// The repository's `deploy/` folder.
fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// `rankgate serve` in a process of its own, on a fresh data dir, without keys; returns it and its base URL.
fn start_server(data_dir: &Path) -> (ServerProcess, String) {
    let config = data_dir.with_extension("toml");
    std::fs::write(&config, "max_lateness_hours = 2\n").unwrap();
    serve_process(data_dir, |command| {
        command
            .arg("--config")
            .arg(&config)
            .env_remove("RANKGATE_ADMIN_KEYS")
            .env_remove("RANKGATE_INGEST_KEYS");
    })
    .unwrap_or_else(|failure| panic!("{failure}"))
}

/// One sample of the exposition.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The text exposition, read: `# HELP` and `# TYPE` by family, and the samples.
#[derive(Debug, Default)]
struct Exposition {
    help: BTreeMap<String, String>,
    types: BTreeMap<String, String>,
    samples: Vec<Sample>,
}

impl Exposition {
    fn parse(text: &str) -> Exposition {
        let mut exposition = Exposition::default();
        for line in text.lines().filter(|line| !line.trim().is_empty()) {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
                exposition.help.insert(name.to_string(), help.to_string());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("a TYPE line names a type");
                exposition.types.insert(name.to_string(), kind.to_string());
            } else if !line.starts_with('#') {
                exposition.samples.push(parse_sample(line));
            }
        }
        exposition
    }

    /// The value of the sample `name` whose labels include `labels` (0 when there is none: a counter
    /// not moved yet is not rendered).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let matching: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
        assert!(matching.len() <= 1, "{name}{labels:?} matches {matching:?}");
        matching.first().map_or(0.0, |s| s.value)
    }
}

fn parse_sample(line: &str) -> Sample {
    let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
    let (name, labels) = match series.split_once('{') {
        None => (series, BTreeMap::new()),
        Some((name, rest)) => {
            let body = rest.strip_suffix('}').expect("labels end in }");
            let mut labels = BTreeMap::new();
            // Label values here hold no `",` (route templates, queue names, versions).
            for pair in body.split("\",").filter(|p| !p.is_empty()) {
                let (key, value) = pair.split_once("=\"").expect("label=\"value\"");
                labels.insert(key.to_string(), value.trim_end_matches('"').to_string());
            }
            (name, labels)
        }
    };
    Sample {
        name: name.to_string(),
        labels,
        value: value.parse().unwrap_or_else(|_| panic!("a number in {line:?}")),
    }
}

/// The family a sample belongs to (a histogram's `_bucket`, `_sum`, `_count` are its family's).
fn family_of<'a>(name: &'a str, exposition: &Exposition) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if exposition.types.get(base).is_some_and(|t| t == "histogram") {
                return base;
            }
        }
    }
    name
}

/// A client that counts every answer it gets by (route template, method, status), as the server
/// should.
struct CountingClient {
    http: reqwest::Client,
    base: String,
    answers: BTreeMap<(String, String, String), u64>,
}

impl CountingClient {
    async fn send(&mut self, route: &str, request: reqwest::RequestBuilder) -> (u16, Value) {
        let request = request.build().unwrap();
        let method = request.method().to_string();
        let response = self.http.execute(request).await.unwrap();
        let status = response.status().as_u16();
        *self
            .answers
            .entry((route.to_string(), method, status.to_string()))
            .or_default() += 1;
        let body = response.json().await.unwrap_or(Value::Null);
        (status, body)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// Sums ingest answers as a client would read them.
#[derive(Debug, Default, PartialEq)]
struct IngestTotals {
    accepted: u64,
    duplicates: u64,
    too_old: u64,
    rejected: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_and_every_counter_equals_the_answers_it_counts() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, base) = start_server(&dir.path().join("data"));
    let mut client = CountingClient {
        http: reqwest::Client::new(),
        base,
        answers: BTreeMap::new(),
    };

    // Ingest: accepted, duplicate, too old (max_lateness 2 h behind the watermark) and invalid events,
    // in two bodies; the answers are summed as a client reads them.
    let now = now_millis();
    let bodies = [
        json!([
            view("e1", "p1", now, &["shoes"]),
            view("e2", "p2", now, &["shoes"]),
            view("e1", "p1", now, &["shoes"]),
            { "id": "bad-1", "type": "product_viewed", "ts": now },
            { "id": "bad-2", "type": "no_such_type", "ts": now, "product_id": "p1" },
            { "id": "bad-3", "type": "product_viewed", "ts": "yesterday", "product_id": "p1" },
        ]),
        json!([
            view("e3", "p1", now, &[]),
            view("old", "p1", now - 3 * 3_600_000, &[]),
            { "type": "product_viewed", "ts": now, "product_id": "p9" },
        ]),
    ];
    let mut totals = IngestTotals::default();
    for body in &bodies {
        let url = client.url("/v1/events");
        let (status, answer) = client.send("/v1/events", client.http.post(url).json(body)).await;
        assert_eq!(status, 200, "{answer}");
        totals.accepted += answer["accepted"].as_u64().unwrap();
        totals.duplicates += answer["duplicates"].as_u64().unwrap();
        totals.too_old += answer["tooOld"].as_u64().unwrap();
        totals.rejected += answer["rejected"].as_array().unwrap().len() as u64;
    }
    assert_eq!(
        totals,
        IngestTotals {
            accepted: 3,
            duplicates: 1,
            too_old: 1,
            rejected: 4
        },
        "the bodies exercise every outcome"
    );

    // Reads: the rank read through the fast path (a plain keep-alive request), through the edge's direct
    // path (`connection: close` takes it to hyper) and through the router (an escaped segment); a top
    // list; a method a route does not allow; and paths no route serves.
    let rank = "/v1/products/{product_id}/rank";
    for _ in 0..3 {
        let url = client.url("/v1/products/p1/rank?period=daily");
        client.send(rank, client.http.get(url)).await;
    }
    let url = client.url("/v1/products/p1/rank?period=daily");
    client
        .send(rank, client.http.get(url).header("connection", "close"))
        .await;
    let url = client.url("/v1/products/p%31/rank?period=daily");
    client.send(rank, client.http.get(url)).await;
    let url = client.url("/v1/categories/shoes/top?period=daily");
    let (status, _) = client
        .send("/v1/categories/{category}/top", client.http.get(url))
        .await;
    assert_eq!(status, 200);
    let url = client.url("/v1/events");
    let (status, _) = client.send("/v1/events", client.http.delete(url)).await;
    assert_eq!(status, 405);
    for secret in ["/no/such/path/secret-1", "/v1/nothing-here-secret-2"] {
        let url = client.url(secret);
        let (status, _) = client.send("unmatched", client.http.get(url)).await;
        assert_eq!(status, 404);
    }

    // The waiting room: a queue, three members (one enters twice), each polled until admitted.
    let queue = "sale";
    let url = client.url(&format!("/v1/admin/queues/{queue}"));
    let (status, answer) = client
        .send(
            "/v1/admin/queues/{queue}",
            client.http.put(url).json(&json!({ "admitPerSecond": 50 })),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let mut tickets = BTreeMap::new();
    for member in ["m1", "m2", "m3", "m1"] {
        let url = client.url(&format!("/v1/queues/{queue}/entries"));
        let mut entry = client.http.post(url).json(&json!({ "memberId": member }));
        if let Some(ticket) = tickets.get(member) {
            // Entering again, as the member's own client would: with its ticket.
            entry = entry.header("x-queue-ticket", ticket);
        }
        let (status, answer) = client.send("/v1/queues/{queue}/entries", entry).await;
        assert_eq!(status, 200, "{answer}");
        if let Some(ticket) = answer["ticket"].as_str() {
            tickets.insert(member, ticket.to_string());
        }
    }
    for (member, ticket) in &tickets {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{member} was never admitted"
            );
            let url = client.url(&format!("/v1/queues/{queue}/entries/{member}"));
            let (status, position) = client
                .send(
                    "/v1/queues/{queue}/entries/{member}",
                    client.http.get(url).header("x-queue-ticket", ticket),
                )
                .await;
            if status == 200 && position["status"] == "READY" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(if status == 429 { 1000 } else { 100 })).await;
        }
    }

    // Scrapes count as requests too: each scrape is recorded once it is answered, so the last one
    // counts every earlier one.
    let url = client.url("/metrics");
    let (status, _) = client.send("/metrics", client.http.get(url)).await;
    assert_eq!(status, 200);
    let text = client
        .http
        .get(client.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lint = run_promtool(&["check", "metrics"], Some(&text));
    assert!(lint.trim().is_empty(), "promtool check metrics: {lint}");
    let exposition = Exposition::parse(&text);

    // Every family has help and a type, both the catalogue's.
    let families: BTreeSet<&str> = exposition
        .samples
        .iter()
        .map(|s| family_of(&s.name, &exposition))
        .collect();
    for family in &families {
        let series = catalogue::series(family)
            .unwrap_or_else(|| panic!("{family} is rendered but not in telemetry::catalogue"));
        assert_eq!(series.exporter, Exporter::Server, "{family}");
        assert_eq!(
            exposition.types.get(*family).map(String::as_str),
            Some(series.kind.as_str()),
            "{family}"
        );
        assert_eq!(
            exposition.help.get(*family).map(String::as_str),
            Some(series.help),
            "{family}"
        );
        for sample in exposition
            .samples
            .iter()
            .filter(|s| family_of(&s.name, &exposition) == *family)
        {
            let labels: BTreeSet<&str> = sample
                .labels
                .keys()
                .map(String::as_str)
                .filter(|l| *l != "le")
                .collect();
            let listed: BTreeSet<&str> = series.labels.iter().copied().collect();
            assert_eq!(labels, listed, "{family}: the catalogue's labels");
        }
    }

    // Latencies are histograms, with buckets.
    assert!(!text.contains("quantile="), "no summaries: {text}");
    for histogram in [
        "rankgate_http_request_duration_seconds",
        "rankgate_ingest_commit_seconds",
        "rankgate_queue_admission_step_seconds",
    ] {
        assert_eq!(
            exposition.types.get(histogram).map(String::as_str),
            Some("histogram")
        );
        assert!(
            exposition
                .samples
                .iter()
                .any(|s| s.name == format!("{histogram}_bucket")
                    && s.labels.get("le").is_some_and(|le| le == "+Inf")),
            "{histogram} has buckets"
        );
    }

    // Ingest counters equal the answers.
    let counted = IngestTotals {
        accepted: exposition.value("rankgate_events_accepted_total", &[]) as u64,
        duplicates: exposition.value("rankgate_events_duplicate_total", &[]) as u64,
        too_old: exposition.value("rankgate_events_too_old_total", &[]) as u64,
        rejected: exposition.value("rankgate_events_rejected_total", &[]) as u64,
    };
    assert_eq!(counted, totals, "ingest counters against the answers");

    // HTTP requests: exactly the answers the client got, by route template, method and status.
    let mut served: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    for sample in exposition
        .samples
        .iter()
        .filter(|s| s.name == "rankgate_http_requests_total")
    {
        let key = (
            sample.labels["route"].clone(),
            sample.labels["method"].clone(),
            sample.labels["status"].clone(),
        );
        served.insert(key, sample.value as u64);
    }
    assert_eq!(
        served, client.answers,
        "HTTP requests counted by route, method and status"
    );
    assert!(!text.contains("secret-"), "a raw path in a label");
    let durations = exposition.value("rankgate_http_request_duration_seconds_count", &[("route", rank)]);
    assert_eq!(durations, 5.0, "five rank reads timed");

    // The waiting room: entries once per member, admissions as seen by the members.
    let entered = exposition.value("rankgate_queue_entered_total", &[("queue", queue)]);
    assert_eq!(entered, tickets.len() as f64, "a repeated entry is not counted");
    let admitted = exposition.value("rankgate_queue_admitted_total", &[("queue", queue)]);
    assert_eq!(admitted, tickets.len() as f64);
    let issued = exposition.value(
        "rankgate_queue_tokens_total",
        &[("queue", queue), ("outcome", "issued")],
    );
    assert_eq!(issued, admitted);

    // The process and the build.
    assert_eq!(
        exposition.value("rankgate_build_info", &[("version", env!("CARGO_PKG_VERSION"))]),
        1.0
    );
    for process in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(
            exposition.samples.iter().any(|s| s.name == process),
            "{process} is exported"
        );
    }
    assert!(exposition.value("process_resident_memory_bytes", &[]) > 1e6);
    assert!(exposition.value("process_open_fds", &[]) >= 3.0);
    let started = exposition.value("process_start_time_seconds", &[]);
    assert!(
        (started - now as f64 / 1000.0).abs() < 600.0,
        "start time {started}"
    );
}

/// The metric names an expression uses (`rankgate_…` and `process_…`), histogram suffixes included.
fn metric_names_in(text: &str) -> BTreeSet<String> {
    let is_name_byte = |byte: u8| byte.is_ascii_alphanumeric() || byte == b'_';
    let bytes = text.as_bytes();
    let mut names = BTreeSet::new();
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let starts_name = (rest.starts_with(b"rankgate_") || rest.starts_with(b"process_"))
            && (at == 0 || !is_name_byte(bytes[at - 1]));
        if starts_name {
            let len = rest.iter().position(|b| !is_name_byte(*b)).unwrap_or(rest.len());
            names.insert(String::from_utf8_lossy(&rest[..len]).into_owned());
            at += len;
        } else {
            at += 1;
        }
    }
    names
}

/// Whether `name` is a series rankgate exports (a histogram's `_bucket`, `_sum` and `_count` included).
fn exported(name: &str) -> bool {
    if catalogue::series(name).is_some_and(|s| s.kind != Kind::Histogram) {
        return true;
    }
    ["_bucket", "_sum", "_count"].iter().any(|suffix| {
        name.strip_suffix(suffix)
            .and_then(catalogue::series)
            .is_some_and(|s| s.kind == Kind::Histogram)
    })
}

/// The alert rules and their unit tests pass promtool, and every alert is tested both firing and not.
#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let rules = deploy_dir().join("prometheus/rankgate-alerts.yml");
    let tests = deploy_dir().join("prometheus/rankgate-alerts.test.yml");
    run_promtool(&["check", "rules", rules.to_str().unwrap()], None);
    run_promtool(&["test", "rules", tests.to_str().unwrap()], None);
    let rules_text = std::fs::read_to_string(&rules).unwrap();
    let tests_text = std::fs::read_to_string(&tests).unwrap();
    let alerts: Vec<&str> = rules_text
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert: "))
        .map(str::trim)
        .collect();
    assert!(alerts.len() >= 7, "{alerts:?}");
    for alert in alerts {
        // One case expects it firing (with alerts listed), one expects none.
        let cases: Vec<&str> = tests_text
            .split("- eval_time:")
            .filter(|case| case.contains(&format!("alertname: {alert}\n")))
            .collect();
        assert!(
            cases.iter().any(|case| case.contains("exp_alerts: []")),
            "{alert}: no test that it does not fire"
        );
        assert!(
            cases.iter().any(|case| !case.contains("exp_alerts: []")),
            "{alert}: no test that it fires"
        );
    }
}

/// The dashboard's queries are PromQL Prometheus parses (checked as recording rules, with Grafana's
/// variables filled in), and the rules, their tests and the dashboard name only series rankgate
/// exports, so none can drift from the code unnoticed (the catalogue itself is checked against a live
/// server above).
#[test]
fn dashboard_queries_parse_and_deploy_files_use_only_series_rankgate_exports() {
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(deploy_dir().join("grafana/rankgate.json")).unwrap())
            .expect("the dashboard is JSON");
    let mut expressions = Vec::new();
    fn collect_exprs(value: &Value, into: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("expr" | "query", Value::String(expr)) => into.push(expr.clone()),
                        _ => collect_exprs(value, into),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| collect_exprs(item, into)),
            _ => {}
        }
    }
    collect_exprs(&dashboard, &mut expressions);
    assert!(expressions.len() >= 12, "the dashboard's panels have queries");
    let dir = tempfile::tempdir().unwrap();
    let mut recording = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (index, expr) in expressions
        .iter()
        .filter(|e| !e.starts_with("label_values("))
        .enumerate()
    {
        let filled = expr
            .replace("$__rate_interval", "5m")
            .replace("$instance", ".*")
            .replace("$queue", ".*");
        // A JSON string is a YAML double-quoted scalar.
        recording.push_str(&format!(
            "      - record: dashboard:query{index}\n        expr: {}\n",
            serde_json::to_string(&filled).unwrap()
        ));
    }
    let recording_path = dir.path().join("dashboard.yml");
    std::fs::write(&recording_path, recording).unwrap();
    run_promtool(&["check", "rules", recording_path.to_str().unwrap()], None);
    let files = [
        ("grafana/rankgate.json", expressions.join("\n")),
        (
            "prometheus/rankgate-alerts.yml",
            std::fs::read_to_string(deploy_dir().join("prometheus/rankgate-alerts.yml")).unwrap(),
        ),
        (
            "prometheus/rankgate-alerts.test.yml",
            std::fs::read_to_string(deploy_dir().join("prometheus/rankgate-alerts.test.yml")).unwrap(),
        ),
    ];
    for (file, text) in files {
        let names = metric_names_in(&text);
        assert!(!names.is_empty(), "{file} names no series");
        let unknown: Vec<&String> = names.iter().filter(|name| !exported(name)).collect();
        assert!(
            unknown.is_empty(),
            "{file} uses series rankgate does not export: {unknown:?}"
        );
    }
}
