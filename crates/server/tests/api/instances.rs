//! Several instances on one PostgreSQL source of truth: the same workload split across two instances,
//! with overlapping duplicates sent to both at once, is counted once, both instances answer identically
//! once they have followed each other, and `rankgate verify` passes on the shared database.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::*;

async fn spawn_instance(schema: &str) -> TestApp {
    let schema = schema.to_string();
    spawn_app_with(move |config| {
        config.rankings.database = Some(postgres_url());
        config.rankings.database_schema = schema;
        config.rankings.freshness_millis = 200;
    })
    .await
}

fn items(body: &Value) -> Value {
    json!({ "total": body["total"], "items": body["items"], "policyVersion": body["policyVersion"] })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_count_each_event_once_and_answer_identically() {
    let schema = format!("rgtest_instances_{}", std::process::id());
    let _cleanup = SchemaGuard::named(schema.clone());
    let a = spawn_instance(&schema).await;
    let b = spawn_instance(&schema).await;
    let now = now_millis();
    let events: Vec<Value> = (0..400)
        .map(|i| {
            let product = format!("p{}", i % 23);
            let category = format!("c{}", i % 3);
            if i % 5 == 0 {
                sale(
                    &format!("e{i}"),
                    &product,
                    now - (i % 30) * 3_600_000,
                    1 + (i % 2) as u32,
                    100 + i as u64,
                    &[&category],
                )
            } else {
                view(
                    &format!("e{i}"),
                    &product,
                    now - (i % 30) * 3_600_000,
                    &[&category],
                )
            }
        })
        .collect();
    // Events 150..250 go to both instances at the same time.
    let (first, second) = (json!(events[..250]), json!(events[150..]));
    let (to_a, to_b) = tokio::join!(a.post_events_ok(&first), b.post_events_ok(&second));
    let accepted = to_a["accepted"].as_u64().unwrap() + to_b["accepted"].as_u64().unwrap();
    let duplicates = to_a["duplicates"].as_u64().unwrap() + to_b["duplicates"].as_u64().unwrap();
    assert_eq!(
        (accepted, duplicates),
        (400, 100),
        "each id counted once across instances"
    );

    let queries = [
        "/v1/categories/all/top?window=7d&limit=100",
        "/v1/categories/c1/top?window=7d&ranker=units&limit=100",
        "/v1/categories/c2/top?period=daily&limit=100",
        "/v1/categories/all/top?window=30d&ranker=revenue&limit=100",
    ];
    let mut agreed = false;
    for _ in 0..300 {
        let mut same = true;
        for query in queries {
            same &= items(&a.get_json(query).await) == items(&b.get_json(query).await);
        }
        if same {
            agreed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(agreed, "both instances converge to the same rankings");
    let all = a.get_json("/v1/categories/all/top?window=7d&limit=100").await;
    let views: i64 = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metrics"]["views"].as_i64().unwrap())
        .sum();
    assert_eq!(views, 320, "400 events, one in five a sale");

    let data_dir = a.data_dir.display().to_string();
    assert_verify_passes(&[
        "--database",
        &postgres_url(),
        "--database-schema",
        &schema,
        "--data-dir",
        &data_dir,
    ]);
    a.stop().await;
    b.stop().await;
}
