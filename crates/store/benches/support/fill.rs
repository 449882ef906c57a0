//! Filling a queue for the waiting-room benches, the same way on every backend.

use std::sync::Arc;

use rankgate_core::ids::MemberId;
use rankgate_core::queue::{QueueName, QueueSettings, SettingsPatch};
use rankgate_store::queue::QueueStore;

/// Enters `waiting` members (`member-00000000`…) in concurrent waves of `wave`, so a batching store
/// batches them as it does under HTTP load, into a queue given first the highest admission rate a queue may
/// have (`MAX_MEMBERS_PER_TICK` per default 1 s tick) so every admission iteration may pop its 50, and
/// the longest abandonment period (a member's deadline is set when it enters): the benches advance the
/// clock a second per iteration, and members who never poll would otherwise all be dropped as
/// abandoned after 300 of them.
pub async fn fill_queue<S: QueueStore>(store: &Arc<S>, queue: &QueueName, waiting: usize, wave: usize) {
    let patch = SettingsPatch {
        admit_per_second: Some(QueueSettings::MAX_MEMBERS_PER_TICK as f64),
        abandon_after_seconds: Some(*QueueSettings::ABANDON_AFTER_SECONDS.end()),
        ..SettingsPatch::default()
    };
    store
        .update_settings(queue, &patch)
        .await
        .expect("store")
        .expect("valid");
    for chunk in (0..waiting).collect::<Vec<_>>().chunks(wave) {
        let mut tasks = tokio::task::JoinSet::new();
        for i in chunk {
            let (store, queue) = (Arc::clone(store), queue.clone());
            let member = MemberId::parse(&format!("member-{i:08}")).expect("member");
            tasks.spawn(async move { store.enter(&queue, &member).await.expect("enter") });
        }
        while tasks.join_next().await.is_some() {}
    }
}
