//! Crash safety: SIGKILL the real binary in the middle of a stream of ingests, restart it, re-send
//! everything, and check that every acknowledged event is counted exactly once and `verify` passes.

use std::process::Command;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::helpers::*;

fn start_server(data_dir: &std::path::Path) -> (ServerProcess, String) {
    serve_process(data_dir, |_| {}).unwrap()
}

fn batch(index: usize, now: i64) -> Value {
    let events: Vec<Value> = (0..100)
        .map(|i| {
            view(
                &format!("b{index}-e{i}"),
                &format!("p{}", (index + i) % 10),
                now,
                &["c"],
            )
        })
        .collect();
    json!(events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_ingest_loses_no_acknowledged_event_and_counts_none_twice() {
    let dir = tempfile::tempdir().unwrap();
    let now = now_millis();
    let batches = 80;
    let (mut child, address) = start_server(dir.path());
    let client = reqwest::Client::new();
    let acknowledged = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let acked_count = Arc::new(AtomicUsize::new(0));
    let mut senders = Vec::new();
    for lane in 0..2 {
        let (client, address, acknowledged, acked_count) = (
            client.clone(),
            address.clone(),
            acknowledged.clone(),
            acked_count.clone(),
        );
        senders.push(tokio::spawn(async move {
            for index in (lane..batches).step_by(2) {
                let sent = client
                    .post(format!("{address}/v1/events"))
                    .json(&batch(index, now))
                    .send()
                    .await;
                match sent {
                    Ok(response) if response.status() == 200 => {
                        let body: Value = response.json().await.unwrap();
                        assert_eq!(body["accepted"], 100);
                        acknowledged.lock().push(index);
                        acked_count.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => return,
                }
            }
        }));
    }
    while acked_count.load(Ordering::SeqCst) < 20 {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    child.0.kill().unwrap(); // SIGKILL: no chance to flush anything.
    child.0.wait().unwrap();
    for sender in senders {
        sender.await.unwrap();
    }
    let acknowledged: Vec<usize> = acknowledged.lock().clone();
    assert!(
        acknowledged.len() >= 20 && acknowledged.len() < batches,
        "the kill landed mid-stream"
    );

    let (child, address) = start_server(dir.path());
    let mut accepted_after_restart = 0;
    for index in 0..batches {
        let response = client
            .post(format!("{address}/v1/events"))
            .json(&batch(index, now))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.unwrap();
        if acknowledged.contains(&index) {
            assert_eq!(
                body["duplicates"], 100,
                "batch {index} was acknowledged before the crash"
            );
        }
        // A batch is one transaction: it landed whole (its ack may have died with the process) or not at all.
        let accepted = body["accepted"].as_u64().unwrap();
        assert!(
            accepted == 0 || accepted == 100,
            "batch {index} was half committed: {body}"
        );
        accepted_after_restart += accepted;
    }
    assert!(accepted_after_restart as usize <= (batches - acknowledged.len()) * 100);
    let top: Value = client
        .get(format!(
            "{address}/v1/categories/c/top?period=daily&limit=100&at={}",
            day_key(now)
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let views: i64 = top["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metrics"]["views"].as_i64().unwrap())
        .sum();
    assert_eq!(views, batches as i64 * 100, "every event counted exactly once");
    drop(child);

    let verify = Command::new(env!("CARGO_BIN_EXE_rankgate"))
        .args(["verify", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success(), "verify failed: {stdout}");
    assert!(stdout.contains("OK"), "{stdout}");
}
