//! Filling a queue for the waiting-room benches, the same way on every backend.

use std::sync::Arc;

use rankgate_core::ids::MemberId;
use rankgate_core::queue::{QueueName, SettingsPatch};
use rankgate_store::queue::QueueStore;

/// Enters `waiting` members (`member-00000000`…) in concurrent waves of `wave`, so a batching store
/// batches them as it does under HTTP load, then gives the queue a huge admission rate so every
/// admission iteration may pop its 50.
pub async fn fill_queue<S: QueueStore>(store: &Arc<S>, queue: &QueueName, waiting: usize, wave: usize) {
    for chunk in (0..waiting).collect::<Vec<_>>().chunks(wave) {
        let mut tasks = tokio::task::JoinSet::new();
        for i in chunk {
            let (store, queue) = (Arc::clone(store), queue.clone());
            let member = MemberId::parse(&format!("member-{i:08}")).expect("member");
            tasks.spawn(async move { store.enter(&queue, &member).await.expect("enter") });
        }
        while tasks.join_next().await.is_some() {}
    }
    let patch = SettingsPatch {
        admit_per_second: Some(1_000_000.0),
        ..SettingsPatch::default()
    };
    store
        .update_settings(queue, &patch)
        .await
        .expect("store")
        .expect("valid");
}
