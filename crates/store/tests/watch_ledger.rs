//! The webhook watch ledger on Redis standalone and a 3-node Cluster: the lease is held by one owner at
//! a time, moves when it expires or is released, and a record is fenced by it — an owner that lost the
//! lease cannot overwrite the snapshot the new holder recorded. Embedded: one process, always held.

use std::time::Duration;

use rankgate_testkit::redis_servers::{cluster, standalone_url, unique_prefix, KeyCleanup};

use rankgate_store::watch_ledger::{EmbeddedWatchLedger, RedisWatchLedger, WatchLedger, WatchSnapshot};

fn snapshot(sequence: u64, products: &[&str]) -> WatchSnapshot {
    WatchSnapshot {
        sequence,
        span: "1d:2026120115".into(),
        products: products.iter().map(|p| p.to_string()).collect(),
    }
}

async fn lease_fences_records(nodes: Vec<String>) {
    let prefix = unique_prefix();
    let _cleanup = KeyCleanup {
        nodes: nodes.clone(),
        prefix: prefix.clone(),
    };
    let ledger = RedisWatchLedger::connect(&nodes, &prefix).await.unwrap();
    assert_eq!(ledger.snapshot("hook").await.unwrap(), None);
    assert!(
        ledger.hold_lease("a", 300).await.unwrap(),
        "a free lease is taken"
    );
    assert!(!ledger.hold_lease("b", 300).await.unwrap(), "a held lease is not");
    assert!(ledger.hold_lease("a", 300).await.unwrap(), "the holder renews");
    assert!(ledger.record("a", "hook", &snapshot(1, &["p1"])).await.unwrap());
    assert!(
        !ledger.record("b", "hook", &snapshot(9, &["px"])).await.unwrap(),
        "a non-holder's record is refused"
    );
    assert_eq!(ledger.snapshot("hook").await.unwrap(), Some(snapshot(1, &["p1"])));
    // The holder goes silent: the lease expires and b takes over, continuing from a's snapshot.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        ledger.hold_lease("b", 60_000).await.unwrap(),
        "an expired lease moves"
    );
    assert!(ledger
        .record("b", "hook", &snapshot(2, &["p2", "p1"]))
        .await
        .unwrap());
    assert!(
        !ledger
            .record("a", "hook", &snapshot(2, &["stale"]))
            .await
            .unwrap(),
        "the former holder cannot overwrite the new holder's snapshot"
    );
    assert_eq!(
        ledger.snapshot("hook").await.unwrap(),
        Some(snapshot(2, &["p2", "p1"]))
    );
    // A release hands over at once.
    ledger.release_lease("b").await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(ledger.hold_lease("a", 60_000).await.unwrap());
}

#[tokio::test]
async fn the_lease_fences_records_on_redis_standalone() {
    lease_fences_records(vec![standalone_url()]).await;
}

#[tokio::test]
async fn the_lease_fences_records_on_redis_cluster() {
    lease_fences_records(cluster().urls.clone()).await;
}

#[tokio::test]
async fn the_embedded_ledger_is_one_process_and_always_held() {
    let ledger = EmbeddedWatchLedger::default();
    assert!(ledger.hold_lease("a", 1).await.unwrap());
    assert!(ledger.record("a", "hook", &snapshot(3, &["p"])).await.unwrap());
    assert_eq!(ledger.snapshot("hook").await.unwrap(), Some(snapshot(3, &["p"])));
}

#[tokio::test]
async fn the_persisted_embedded_ledger_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("webhooks.json");
    let ledger = EmbeddedWatchLedger::persisted(file.clone()).unwrap();
    assert_eq!(ledger.snapshot("hook").await.unwrap(), None);
    assert!(ledger
        .record("a", "hook", &snapshot(4, &["p1", "p2"]))
        .await
        .unwrap());
    drop(ledger);
    let reopened = EmbeddedWatchLedger::persisted(file.clone()).unwrap();
    assert_eq!(
        reopened.snapshot("hook").await.unwrap(),
        Some(snapshot(4, &["p1", "p2"]))
    );
    std::fs::write(&file, b"{not json").unwrap();
    assert!(
        EmbeddedWatchLedger::persisted(file).is_err(),
        "a damaged ledger is refused, not silently reset"
    );
}

#[tokio::test]
async fn the_lease_fences_records_on_a_sentinel_master() {
    lease_fences_records(vec![rankgate_testkit::redis_servers::sentinel().url()]).await;
}
