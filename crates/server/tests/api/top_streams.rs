//! Ranking change streams (`GET /v1/categories/{category}/top/events`, SSE) through the whole HTTP
//! stack: on the embedded engine, and on PostgreSQL + Redis serving (standalone and the 3-node Cluster)
//! through two instances — an event ingested through one shows on a stream opened on the other.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::helpers::*;
use crate::redis_servers;

/// One record of an event stream.
#[derive(Debug)]
pub enum SseItem {
    /// `event: top` with its JSON data.
    Top(Value),
    /// `event: position` (a member stream, tests/api/member_streams.rs) with its JSON data.
    Position(Value),
    /// A `: heartbeat` comment.
    Heartbeat,
}

/// A minimal SSE reader: a task reads the response as it arrives (so arrival times are the server's
/// spacing, not the test's pauses) and hands records over; dropping the client closes the connection.
pub struct SseClient {
    records: tokio::sync::mpsc::UnboundedReceiver<(Instant, SseItem)>,
    reading: tokio::task::JoinHandle<()>,
}

impl Drop for SseClient {
    fn drop(&mut self) {
        self.reading.abort();
    }
}

impl SseClient {
    /// Opens `path` (a member's stream with the member's ticket, as its client sends it).
    pub async fn open(app: &TestApp, path: &str) -> SseClient {
        SseClient::reading(app.get(path).await, path)
    }

    /// Reads the event stream `response` (of a GET of `path`) as it arrives.
    pub fn reading(mut response: reqwest::Response, path: &str) -> SseClient {
        assert_eq!(response.status(), 200, "GET {path}");
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        let (sender, records) = tokio::sync::mpsc::unbounded_channel();
        let reading = tokio::spawn(async move {
            let mut buffer = String::new();
            while let Ok(Some(chunk)) = response.chunk().await {
                let arrived = Instant::now();
                buffer.push_str(std::str::from_utf8(&chunk).unwrap());
                while let Some(end) = buffer.find("\n\n") {
                    let record: String = buffer.drain(..end + 2).collect();
                    let item = if record.lines().any(|line| line.starts_with(": heartbeat")) {
                        SseItem::Heartbeat
                    } else {
                        let data = record
                            .lines()
                            .find_map(|line| line.strip_prefix("data: "))
                            .expect("an event record has data");
                        let data = serde_json::from_str(data).unwrap();
                        if record.contains("event: top") {
                            SseItem::Top(data)
                        } else {
                            assert!(record.contains("event: position"), "unexpected record {record:?}");
                            SseItem::Position(data)
                        }
                    };
                    if sender.send((arrived, item)).is_err() {
                        return;
                    }
                }
            }
        });
        SseClient { records, reading }
    }

    /// The next record and when it arrived, or `None` when nothing came within `within`.
    pub async fn next(&mut self, within: Duration) -> Option<(Instant, SseItem)> {
        tokio::time::timeout(within, self.records.recv())
            .await
            .ok()
            .flatten()
    }

    /// The next top page, skipping heartbeats; fails the test after `within`.
    pub async fn next_top(&mut self, within: Duration) -> (Instant, Value) {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Some((at, SseItem::Top(page))) => return (at, page),
                Some((_, SseItem::Heartbeat)) => continue,
                Some((_, SseItem::Position(position))) => panic!("a position on a top stream: {position}"),
                None => panic!("no top page within {within:?}"),
            }
        }
    }
}

fn product_ids(page: &Value) -> Vec<String> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["productId"].as_str().unwrap().to_string())
        .collect()
}

/// The same page, `asOf` aside (a stream's page and a later GET may differ only there).
fn same_page(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        v.as_object_mut().unwrap().remove("asOf");
        v
    };
    strip(a) == strip(b)
}

const FRESHNESS_MILLIS: u64 = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_top_stream_sends_the_page_on_open_and_each_change_at_most_once_per_freshness_interval() {
    let app = spawn_app_with(|config| {
        config.rankings.freshness_millis = FRESHNESS_MILLIS;
        config.rankings.top_streams.heartbeat_millis = 300;
        config.rankings.top_streams.max_streams = 3;
    })
    .await;
    let now = now_millis();
    app.post_events_ok(&json!([sale("e0", "p0", now, 1, 100, &["toys"])]))
        .await;
    let query = "ranker=units&window=1d&limit=3";
    let path = format!("/v1/categories/toys/top/events?{query}");
    let mut stream = SseClient::open(&app, &path).await;
    let (_, first) = stream.next_top(Duration::from_secs(5)).await;
    let top = app.get_json(&format!("/v1/categories/toys/top?{query}")).await;
    assert!(
        same_page(&first, &top),
        "the first message is GET …/top's object: {first} vs {top}"
    );
    assert_eq!(product_ids(&first), ["p0"]);

    // A scripted burst: every 40 ms a new product takes the lead, 12 times (480 ms of changes).
    let burst_started = Instant::now();
    for i in 1..=12u32 {
        app.post_events_ok(&json!([sale(
            &format!("e{i}"),
            &format!("p{i}"),
            now,
            1 + i,
            100,
            &["toys"]
        )]))
        .await;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let mut arrivals = Vec::new();
    let last = loop {
        let (at, page) = stream.next_top(Duration::from_secs(10)).await;
        arrivals.push(at);
        if product_ids(&page) == ["p12", "p11", "p10"] {
            break page;
        }
    };
    let top = app.get_json(&format!("/v1/categories/toys/top?{query}")).await;
    assert!(
        same_page(&last, &top),
        "the stream ends on what GET …/top answers"
    );
    for pair in arrivals.windows(2) {
        let gap = pair[1] - pair[0];
        // The server spaces pages by the freshness interval; arrival times jitter by a few ms.
        assert!(
            gap >= Duration::from_millis(FRESHNESS_MILLIS - 40),
            "two pages {gap:?} apart (freshness {FRESHNESS_MILLIS} ms)"
        );
    }
    let allowed = (burst_started.elapsed().as_millis() as u64 / FRESHNESS_MILLIS + 1) as usize;
    assert!(
        arrivals.len() <= allowed,
        "{} pages in {:?}: at most one per freshness interval",
        arrivals.len(),
        burst_started.elapsed()
    );
    assert!(
        arrivals.len() >= 2,
        "the burst was followed, not only its end: {arrivals:?}"
    );

    // An ingest elsewhere moves `asOf` but not this ranking: heartbeats, no page.
    app.post_events_ok(&json!([sale("g1", "g1", now, 5, 100, &["garden"])]))
        .await;
    let mut heartbeats = 0;
    let quiet_until = Instant::now() + Duration::from_millis(1_000);
    while let Some((_, item)) = stream
        .next(quiet_until.saturating_duration_since(Instant::now()))
        .await
    {
        match item {
            SseItem::Heartbeat => heartbeats += 1,
            SseItem::Top(page) => panic!("a page without a change of this ranking: {page}"),
            SseItem::Position(position) => panic!("a position on a top stream: {position}"),
        }
    }
    assert!(
        heartbeats >= 2,
        "a heartbeat every 300 ms, got {heartbeats} in 1 s"
    );

    // Streams on one ranking share one watcher; the instance's limit holds.
    let second = SseClient::open(&app, &path).await;
    assert_eq!(
        app.state.rankings.top_streams.watchers(),
        1,
        "one watcher for one ranking"
    );
    let other = SseClient::open(&app, "/v1/categories/all/top/events?limit=1").await;
    assert_eq!(app.state.rankings.top_streams.watchers(), 2);
    assert_eq!(app.state.rankings.top_streams.open_streams(), 3);
    let refused = app.get(&path).await;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().starts_with("max_top_streams"),
        "{body}"
    );
    // A stream that ends gives its slot back (noticed at its next write, a heartbeat at the latest).
    drop(second);
    drop(other);
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.state.rankings.top_streams.open_streams() > 1 {
        assert!(
            Instant::now() < deadline,
            "the closed streams' slots were not freed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _reopened = SseClient::open(&app, &path).await;

    // Parameters are those of `…/top`, refused the same way.
    for (bad, named) in [
        ("/v1/categories/toys/top/events?limit=1001", "limit"),
        ("/v1/categories/toys/top/events?period=fortnightly", "period"),
        ("/v1/categories/toys/top/events?limit=1&limit=2", "limit"),
    ] {
        let response = app.get(bad).await;
        assert_eq!(response.status(), 400, "{bad}");
        let body: Value = response.json().await.unwrap();
        assert!(
            body["error"].as_str().unwrap().starts_with(named),
            "{bad}: {body}"
        );
    }
    drop(stream);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_dropped_not_buffered_for() {
    let app = spawn_app_with(|config| {
        config.rankings.freshness_millis = 100;
        config.rankings.top_streams.heartbeat_millis = 100;
        config.rankings.top_streams.buffer = 2;
    })
    .await;
    let now = now_millis();
    // 1,000 products, so each page is large (~130 kB) and a few fill the socket buffers.
    let events: Vec<Value> = (0..1_000)
        .map(|i| {
            sale(
                &format!("base{i}"),
                &format!("p{i:04}"),
                now,
                1 + i % 7,
                100,
                &["toys"],
            )
        })
        .collect();
    app.post_events_ok(&Value::Array(events)).await;
    // A client with a tiny receive window that sends its request and never reads.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let address = app.address.trim_start_matches("http://").parse().unwrap();
    let mut silent = socket.connect(address).await.unwrap();
    silent
        .write_all(b"GET /v1/categories/toys/top/events?ranker=units&limit=1000 HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while app.state.rankings.top_streams.open_streams() == 0 {
        assert!(Instant::now() < deadline, "the stream never opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Change the ranking every 50 ms until the server gives up on the silent client.
    let mut round = 0u32;
    while app.state.rankings.top_streams.open_streams() > 0 {
        assert!(
            Instant::now() < deadline,
            "a client that does not read was kept (and buffered for) for 60 s"
        );
        let product = format!("p{:04}", round % 1_000);
        app.post_events_ok(&json!([sale(
            &format!("more{round}"),
            &product,
            now,
            50,
            100,
            &["toys"]
        )]))
        .await;
        round += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("rankgate_top_streams_dropped_total{reason=\"slow_client\"}")),
        "the drop is counted"
    );
    // A reading client is unaffected and its slot works as before.
    let mut reader = SseClient::open(&app, "/v1/categories/toys/top/events?ranker=units&limit=5").await;
    reader.next_top(Duration::from_secs(5)).await;
    drop(silent);
    app.stop().await;
}

/// PostgreSQL + Redis serving, two instances, on `redis` (one standalone URL or the Cluster's nodes).
async fn streams_follow_ingest_on_another_instance(redis: Vec<String>, label: &str) {
    let schema = format!("rgtest_streams_{label}_{}", std::process::id());
    let _schema = SchemaGuard::named(schema.clone());
    let prefix = redis_servers::unique_prefix();
    let _keys = redis_servers::KeyCleanup {
        nodes: redis.clone(),
        prefix: prefix.clone(),
    };
    let spawn = || {
        let (schema, redis, prefix) = (schema.clone(), redis.clone(), prefix.clone());
        spawn_app_with(move |config| {
            config.rankings.database = Some(postgres_url());
            config.rankings.database_schema = schema;
            config.redis = redis;
            config.redis_prefix = prefix;
            config.waiting_room.token_secret = Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8".into());
            config.rankings.freshness_millis = FRESHNESS_MILLIS;
            config.rankings.top_streams.heartbeat_millis = 500;
        })
    };
    let a = spawn().await;
    let b = spawn().await;
    let now = now_millis();
    a.post_events_ok(&json!([sale("e0", "p0", now, 1, 100, &["toys"])]))
        .await;
    let path = "/v1/categories/toys/top/events?ranker=units&window=1d&limit=3";
    let mut on_b = SseClient::open(&b, path).await;
    // Through instance a only; the stream on b shows each step, from Redis once it is published.
    let mut arrivals = Vec::new();
    for (i, expected) in [(1u32, vec!["p1", "p0"]), (2, vec!["p2", "p1", "p0"])] {
        a.post_events_ok(&json!([sale(
            &format!("e{i}"),
            &format!("p{i}"),
            now,
            1 + i,
            100,
            &["toys"]
        )]))
        .await;
        loop {
            let (at, page) = on_b.next_top(Duration::from_secs(30)).await;
            arrivals.push(at);
            if product_ids(&page) == expected && page["stale"] == false {
                break;
            }
        }
    }
    for pair in arrivals.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_millis(FRESHNESS_MILLIS - 40),
            "two pages {:?} apart",
            pair[1] - pair[0]
        );
    }
    let served = b
        .get_json("/v1/categories/toys/top?ranker=units&window=1d&limit=3")
        .await;
    assert_eq!(product_ids(&served), ["p2", "p1", "p0"]);
    // Quiet: a heartbeat comes.
    let mut heartbeat = false;
    while let Some((_, item)) = on_b.next(Duration::from_secs(3)).await {
        if matches!(item, SseItem::Heartbeat) {
            heartbeat = true;
            break;
        }
    }
    assert!(heartbeat, "a heartbeat on the quiet stream");
    drop(on_b);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_one_instance_shows_events_ingested_through_another_on_redis_standalone() {
    streams_follow_ingest_on_another_instance(vec![redis_servers::standalone_url()], "standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_one_instance_shows_events_ingested_through_another_on_redis_cluster() {
    let nodes = redis_servers::cluster().urls.clone();
    streams_follow_ingest_on_another_instance(nodes, "cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_on_one_ranking_share_one_watcher_and_all_get_each_change() {
    const STREAMS: usize = 500;
    let app = spawn_app_with(|config| {
        config.rankings.freshness_millis = FRESHNESS_MILLIS;
    })
    .await;
    let now = now_millis();
    app.post_events_ok(&json!([sale("e0", "p0", now, 1, 100, &["toys"])]))
        .await;
    let path = "/v1/categories/toys/top/events?ranker=units&limit=10";
    let mut streams = Vec::with_capacity(STREAMS);
    for _ in 0..STREAMS {
        let mut stream = SseClient::open(&app, path).await;
        stream.next_top(Duration::from_secs(10)).await;
        streams.push(stream);
    }
    assert_eq!(
        app.state.rankings.top_streams.watchers(),
        1,
        "{STREAMS} streams, one reader"
    );
    assert_eq!(app.state.rankings.top_streams.open_streams(), STREAMS);
    let sent = Instant::now();
    app.post_events_ok(&json!([sale("e1", "p1", now, 2, 100, &["toys"])]))
        .await;
    let mut slowest = Duration::ZERO;
    for stream in &mut streams {
        let (at, page) = stream.next_top(Duration::from_secs(10)).await;
        assert_eq!(product_ids(&page), ["p1", "p0"]);
        slowest = slowest.max(at - sent);
    }
    println!(
        "{STREAMS} streams on one ranking: the change reached the last one {slowest:?} after the ingest"
    );
    assert!(
        slowest < Duration::from_millis(3 * FRESHNESS_MILLIS + 1_000),
        "the last of {STREAMS} streams got the change {slowest:?} after the ingest"
    );
    drop(streams);
    app.stop().await;
}
