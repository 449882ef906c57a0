//! Redis Streams ingest against the machine's Redis: at-least-once delivery made exact by dedupe, acks
//! only after durability, dead-lettering of poison entries, and reclaiming entries stuck with a dead
//! consumer.

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;

use rankgate::rankings::ingest::redis_streams::{StreamConfig, StreamConsumer};
use rankgate_store::clock::SystemClock;

use crate::helpers::*;

async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(rankgate_testkit::redis_servers::standalone_url())
        .unwrap()
        .get_multiplexed_tokio_connection()
        .await
        .expect("the shared Redis (scripts/test.sh starts one)")
}

fn config(key: &str, consumer: &str) -> StreamConfig {
    let mut config = StreamConfig::from_url(&format!(
        "{}/{key}",
        rankgate_testkit::redis_servers::standalone_url()
    ))
    .unwrap();
    config.consumer = consumer.into();
    config.block = Duration::from_millis(50);
    // Long enough that a loaded machine never makes fresh entries look abandoned.
    config.min_idle = Duration::from_millis(1500);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_entries_are_ingested_once_acked_and_poison_is_dead_lettered() {
    let app = spawn_app().await;
    let key = format!("rgtest:{}:stream", std::process::id());
    let mut redis = redis().await;
    let _: () = redis.del(&[&key, &format!("{key}:dead")]).await.unwrap();
    let now = now_millis();
    let mut consumer =
        StreamConsumer::connect(config(&key, "c1"), app.rankings(), Arc::new(SystemClock), 300_000)
            .await
            .unwrap();
    for i in 0..5 {
        let event = view(&format!("st-{i}"), "p1", now, &["c"]);
        let _: String = redis
            .xadd(&key, "*", &[("event", event.to_string())])
            .await
            .unwrap();
    }
    // The same event delivered twice (at-least-once upstream), and two poison entries.
    let _: String = redis
        .xadd(
            &key,
            "*",
            &[("event", view("st-0", "p1", now, &["c"]).to_string())],
        )
        .await
        .unwrap();
    let _: String = redis.xadd(&key, "*", &[("event", "{not json")]).await.unwrap();
    let _: String = redis
        .xadd(
            &key,
            "*",
            &[(
                "event",
                json!({"id": "bad", "type": "product_viewed", "ts": now, "product_id": "p1", "quantity": 2})
                    .to_string(),
            )],
        )
        .await
        .unwrap();
    let report = consumer.poll_once().await.unwrap();
    assert_eq!((report.entries, report.dead_lettered), (8, 2));
    let top = app.get_json("/v1/categories/c/top?window=1d").await;
    assert_eq!(
        top["items"][0]["metrics"]["views"], 5,
        "five distinct events, one duplicate"
    );
    let pending: redis::streams::StreamPendingReply = redis.xpending(&key, "rankgate").await.unwrap();
    assert_eq!(pending.count(), 0, "everything handled is acked");
    let dead: redis::streams::StreamRangeReply = redis.xrange_all(format!("{key}:dead")).await.unwrap();
    assert_eq!(dead.ids.len(), 2);
    let error: String = dead.ids[1].get("error").unwrap();
    assert!(error.starts_with("quantity"), "{error}");
    let _: () = redis.del(&[&key, &format!("{key}:dead")]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_stuck_with_a_dead_consumer_are_reclaimed_and_counted_once() {
    let app = spawn_app().await;
    let key = format!("rgtest:{}:reclaim", std::process::id());
    let mut redis = redis().await;
    let _: () = redis.del(&[&key, &format!("{key}:dead")]).await.unwrap();
    let now = now_millis();
    // Create the group, then let a consumer that will "die" read entries without acking them.
    let mut survivor = StreamConsumer::connect(
        config(&key, "survivor"),
        app.rankings(),
        Arc::new(SystemClock),
        300_000,
    )
    .await
    .unwrap();
    for i in 0..10 {
        let _: String = redis
            .xadd(
                &key,
                "*",
                &[("event", view(&format!("rc-{i}"), "p9", now, &["r"]).to_string())],
            )
            .await
            .unwrap();
    }
    let options = redis::streams::StreamReadOptions::default()
        .group("rankgate", "dead-consumer")
        .count(100);
    let taken: redis::streams::StreamReadReply =
        redis.xread_options(&[&key], &[">"], &options).await.unwrap();
    assert_eq!(taken.keys[0].ids.len(), 10);
    // Nothing new to read, and the entries are not idle long enough yet.
    assert_eq!(survivor.poll_once().await.unwrap().entries, 0);
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let report = survivor.poll_once().await.unwrap();
    assert_eq!(report.entries, 10, "reclaimed with XAUTOCLAIM");
    let top = app.get_json("/v1/categories/r/top?window=1d").await;
    assert_eq!(top["items"][0]["metrics"]["views"], 10);
    let pending: redis::streams::StreamPendingReply = redis.xpending(&key, "rankgate").await.unwrap();
    assert_eq!(pending.count(), 0);
    let _: () = redis.del(&[&key, &format!("{key}:dead")]).await.unwrap();
}
