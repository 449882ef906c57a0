//! Places that survive the store (SPEC 2.2; issue 29), on the shared Redis (and a private one where calls are counted): a queue whose keys
//! are wiped (what a Redis restarted empty, a `FLUSHALL` or a failover to an empty replica leaves) is
//! detected by its epoch, made again with the settings the instance kept, and its members come back to
//! their original places by the placement their tickets carry: ahead of everyone who entered afresh, in
//! their original order, once each. Every test wipes only its own key prefix.

use std::sync::Arc;

use proptest::prelude::*;
use rankgate_core::ids::MemberId;
use rankgate_core::queue::{MemberStatus, QueueName, SettingsPatch};
use rankgate_store::clock::ManualClock;
use rankgate_store::queue::redis::{RedisOptions, RedisStore, RedisTime};
use rankgate_store::queue::{EnterOutcome, Placement, QueueStore};
use rankgate_testkit::redis_servers::{standalone_url, unique_prefix, KeyCleanup};

async fn store_on(prefix: &str) -> Arc<RedisStore> {
    let options = RedisOptions {
        prefix: prefix.to_string(),
        time: RedisTime::Injected(Arc::new(ManualClock::new(1_700_000_000_000))),
        ..RedisOptions::default()
    };
    RedisStore::connect(&[standalone_url()], options)
        .await
        .expect("the shared Redis")
}

/// Deletes every key under `prefix`: the store lost everything.
fn lose_everything(prefix: &str) {
    drop(KeyCleanup::standalone(prefix));
}

fn member(name: &str) -> MemberId {
    MemberId::parse(name).unwrap()
}

fn placement(outcome: &EnterOutcome) -> Placement {
    outcome
        .view()
        .placement
        .expect("an entry answers the member's place")
}

async fn rank(store: &RedisStore, queue: &QueueName, name: &str) -> Option<u64> {
    store.position(queue, &member(name)).await.unwrap().rank
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_queue_comes_back_paused_and_ticket_holders_get_their_places_back_once() {
    let prefix = unique_prefix();
    let _cleanup = KeyCleanup::standalone(prefix.clone());
    let store = store_on(&prefix).await;
    let queue = QueueName::parse("sale").unwrap();
    let paused = SettingsPatch {
        admit_per_second: Some(0.5),
        token_ttl_seconds: Some(900),
        paused: Some(true),
        ..SettingsPatch::default()
    };
    store.update_settings(&queue, &paused).await.unwrap().unwrap();
    let mut places = Vec::new();
    for i in 0..10 {
        places.push(placement(
            &store.enter(&queue, &member(&format!("m{i}"))).await.unwrap(),
        ));
    }
    let lost_epoch = places[0].epoch;
    assert_ne!(lost_epoch, 0, "a new queue has an epoch");
    assert_eq!(store.stats(&queue).await.unwrap().unwrap().epoch, lost_epoch);

    // Another queue opens in an hour, with a pre-queue.
    let later = QueueName::parse("later").unwrap();
    let opens_at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        + 3_600_000;
    store
        .draws()
        .schedule_opening(&later, Some(opens_at_ms), rankgate_core::queue::DrawSeed([1; 32]))
        .await
        .unwrap();
    store
        .draws()
        .set_beacon_round(&later, Some(12_345))
        .await
        .unwrap();

    lose_everything(&prefix);
    assert!(
        store.stats(&queue).await.unwrap().is_none(),
        "the store lost the queue"
    );
    assert!(store.draws().draw_record(&later).await.unwrap().is_none());
    store.enter(&later, &member("early")).await.unwrap();
    let record = store.draws().draw_record(&later).await.unwrap();
    assert_eq!(
        record.map(|record| (record.opens_at_ms, record.beacon_round)),
        Some((opens_at_ms, Some(12_345))),
        "an opening still ahead is scheduled again, with its beacon round"
    );

    // The first entry after the loss makes the queue again, with the settings kept, not the defaults.
    let fresh = store.enter(&queue, &member("fresh-1")).await.unwrap();
    assert!(matches!(fresh, EnterOutcome::Entered(_)));
    let settings = store.settings(&queue).await.unwrap().unwrap();
    assert!(settings.paused, "a paused queue never comes back unpaused");
    assert_eq!(
        (settings.admit_per_second, settings.token_ttl_seconds),
        (0.5, 900)
    );
    let epoch = store.stats(&queue).await.unwrap().unwrap().epoch;
    assert_ne!(epoch, lost_epoch, "the epoch tells the loss");

    // Ticket holders come back out of order, among fresh arrivals: they wait ahead of every fresh
    // arrival, in their original order.
    for i in [7, 2, 9] {
        let back = store
            .restore(&queue, &member(&format!("m{i}")), places[i])
            .await
            .unwrap();
        assert!(matches!(back, EnterOutcome::Entered(_)));
        assert_eq!(
            placement(&back).epoch,
            epoch,
            "the new ticket names the new epoch"
        );
        store.enter(&queue, &member(&format!("fresh-{i}"))).await.unwrap();
    }
    let order = [
        ("m2", 0),
        ("m7", 1),
        ("m9", 2),
        ("fresh-1", 3),
        ("fresh-7", 4),
        ("fresh-2", 5),
        ("fresh-9", 6),
    ];
    for (name, expected) in order {
        assert_eq!(rank(&store, &queue, name).await, Some(expected), "{name}");
    }

    // A fresh arrival of the new epoch who shows its old ticket moves up to its place.
    store.enter(&queue, &member("m0")).await.unwrap();
    assert_eq!(rank(&store, &queue, "m0").await, Some(7));
    store.restore(&queue, &member("m0"), places[0]).await.unwrap();
    assert_eq!(rank(&store, &queue, "m0").await, Some(0));

    // A ticket restores once: m2 leaves and comes back with the same old ticket: at the back.
    store.leave(&queue, &member("m2")).await.unwrap();
    let again = store.restore(&queue, &member("m2"), places[2]).await.unwrap();
    assert!(matches!(again, EnterOutcome::Entered(_)));
    assert_eq!(again.view().rank, Some(7), "the back of the line");

    // A ticket of the current epoch is an ordinary entry (already waiting: unchanged).
    let current = placement(&store.enter(&queue, &member("m7")).await.unwrap());
    store.restore(&queue, &member("m7"), current).await.unwrap();
    assert_eq!(rank(&store, &queue, "m7").await, Some(1));

    // A queue deleted on purpose retires its epoch: its tickets name no place.
    assert!(store.delete_queue(&queue).await.unwrap());
    let after_delete = store.restore(&queue, &member("m9"), places[9]).await.unwrap();
    assert_eq!(after_delete.view().rank, Some(0), "alone in a new queue");
    let retired = Placement {
        epoch: placement(&after_delete).epoch,
        place: 0,
    };
    store.enter(&queue, &member("x")).await.unwrap();
    assert!(store.delete_queue(&queue).await.unwrap());
    store.enter(&queue, &member("y")).await.unwrap();
    store.restore(&queue, &member("m9"), retired).await.unwrap();
    assert_eq!(
        (rank(&store, &queue, "y").await, rank(&store, &queue, "m9").await),
        (Some(0), Some(1)),
        "a deleted queue's ticket is an ordinary entry"
    );
    let settings = store.settings(&queue).await.unwrap().unwrap();
    assert!(!settings.paused, "a deleted queue's settings are not kept");
}

/// What a property case does after the first members entered.
#[derive(Debug, Clone)]
enum Step {
    /// Member `i` of the first epoch comes back with its ticket.
    Return(usize),
    /// A member nobody saw before enters.
    Fresh,
    /// Member `i` polls (changes nothing).
    Poll(usize),
}

fn steps(first: usize) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            3 => (0..first).prop_map(Step::Return),
            2 => Just(Step::Fresh),
            1 => (0..first).prop_map(Step::Poll),
        ],
        0..40,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random entries, polls, a loss, returns with tickets (some twice) among fresh arrivals, then a
    /// second loss after which everyone returns with the newest ticket: FIFO holds among ticket holders
    /// (original order), every ticket holder waits ahead of every fresh arrival, and the second loss
    /// gives back exactly the order there was before it.
    #[test]
    fn fifo_holds_among_ticket_holders_through_losses(first in 1usize..25, plan in steps(25), seed in any::<u64>()) {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async move {
            let prefix = unique_prefix();
            let _cleanup = KeyCleanup::standalone(prefix.clone());
            let store = store_on(&prefix).await;
            let queue = QueueName::parse("prop").unwrap();
            let mut tickets = std::collections::HashMap::new();
            for i in 0..first {
                let name = format!("m{i}");
                tickets.insert(name.clone(), placement(&store.enter(&queue, &member(&name)).await.unwrap()));
            }
            lose_everything(&prefix);
            let (mut returned, mut fresh) = (Vec::<usize>::new(), Vec::<String>::new());
            for step in &plan {
                match step {
                    Step::Return(i) if *i < first => {
                        let name = format!("m{i}");
                        let back = store.restore(&queue, &member(&name), tickets[&name]).await.unwrap();
                        if !returned.contains(i) {
                            returned.push(*i);
                        }
                        tickets.insert(name, placement(&back));
                    }
                    Step::Poll(i) if *i < first => {
                        store.position(&queue, &member(&format!("m{i}"))).await.unwrap();
                    }
                    Step::Fresh => {
                        let name = format!("f{}", fresh.len());
                        tickets.insert(name.clone(), placement(&store.enter(&queue, &member(&name)).await.unwrap()));
                        fresh.push(name);
                    }
                    _ => {}
                }
            }
            returned.sort_unstable();
            let expected: Vec<String> = returned
                .iter()
                .map(|i| format!("m{i}"))
                .chain(fresh.iter().cloned())
                .collect();
            for (rank, name) in expected.iter().enumerate() {
                let view = store.position(&queue, &member(name)).await.unwrap();
                assert_eq!((view.status, view.rank), (MemberStatus::Waiting, Some(rank as u64)), "{name} in {expected:?}");
            }

            // A second loss; everyone comes back with the newest ticket, in a shuffled order.
            lose_everything(&prefix);
            let mut order = expected.clone();
            let mut state = seed | 1;
            for i in (1..order.len()).rev() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                order.swap(i, (state % (i as u64 + 1)) as usize);
            }
            for name in &order {
                store.restore(&queue, &member(name), tickets[name]).await.unwrap();
            }
            for (rank, name) in expected.iter().enumerate() {
                assert_eq!(store.position(&queue, &member(name)).await.unwrap().rank, Some(rank as u64), "{name} after the second loss");
            }
        });
    }
}

/// A queue deleted through another instance is dropped from this instance's kept copy at its next sweep
/// (the store kept its data, so a queue it no longer lists was deleted, not lost): entries make it again
/// with the defaults, not the deleted queue's pause. After a loss, the sweep keeps every copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_deleted_elsewhere_is_not_made_again_from_the_kept_copy() {
    let prefix = unique_prefix();
    let _cleanup = KeyCleanup::standalone(prefix.clone());
    let (one, other) = (store_on(&prefix).await, store_on(&prefix).await);
    let queue = QueueName::parse("gone").unwrap();
    let paused = SettingsPatch {
        paused: Some(true),
        ..SettingsPatch::default()
    };
    one.update_settings(&queue, &paused).await.unwrap().unwrap();
    one.keep_settings().await.unwrap();
    assert!(one.kept_settings().get(&queue).is_some());

    // Lost: the sweep keeps the copy, and the next entry makes the queue paused again.
    lose_everything(&prefix);
    one.keep_settings().await.unwrap();
    assert!(one.kept_settings().get(&queue).is_some(), "a loss keeps the copy");
    one.enter(&queue, &member("a")).await.unwrap();
    assert!(one.settings(&queue).await.unwrap().unwrap().paused);

    // Deleted through the other instance: the sweep drops the copy; entries make a default queue.
    one.keep_settings().await.unwrap();
    assert!(other.delete_queue(&queue).await.unwrap());
    one.keep_settings().await.unwrap();
    assert!(
        one.kept_settings().get(&queue).is_none(),
        "a deletion drops the copy"
    );
    one.enter(&queue, &member("b")).await.unwrap();
    assert!(!one.settings(&queue).await.unwrap().unwrap().paused);
}

/// The sweep follows another instance's settings change and a queue made elsewhere at its next round, and
/// while nothing changed it costs a few calls, not one per queue (issue 30: a thousand idle queues cost a
/// thousand reads every five seconds). Counted on a private Redis, where nothing else calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_reads_every_queue_only_when_settings_moved() {
    let server = rankgate_testkit::redis_servers::LocalRedis::start(1, false);
    let url = server.urls[0].clone();
    let connect = |url: String| async move {
        let options = RedisOptions {
            prefix: "sweep:".to_string(),
            time: RedisTime::Injected(Arc::new(ManualClock::new(1_700_000_000_000))),
            ..RedisOptions::default()
        };
        RedisStore::connect(&[url], options)
            .await
            .expect("the private Redis")
    };
    let (one, other) = (connect(url.clone()).await, connect(url.clone()).await);
    let queues: Vec<QueueName> = (0..40)
        .map(|i| QueueName::parse(&format!("q{i}")).unwrap())
        .collect();
    for queue in &queues {
        other.enter(queue, &member("a")).await.unwrap();
    }
    one.keep_settings().await.unwrap();
    for queue in &queues {
        assert!(
            one.kept_settings().get(queue).is_some(),
            "{queue} made elsewhere is kept"
        );
    }

    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let calls = |admin: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("stats").query(admin).unwrap();
        info.lines()
            .find_map(|line| line.strip_prefix("total_commands_processed:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("total_commands_processed")
    };
    let before = calls(&mut admin);
    one.keep_settings().await.unwrap();
    let quiet = calls(&mut admin) - before - 1; // the INFO that read `before`
    assert!(quiet <= 5, "a quiet sweep over 40 queues made {quiet} calls");

    // Changed through the other instance: the next sweep reads them all and sees it.
    let paused = SettingsPatch {
        paused: Some(true),
        ..SettingsPatch::default()
    };
    other.update_settings(&queues[7], &paused).await.unwrap().unwrap();
    assert!(!one.kept_settings().get(&queues[7]).unwrap().settings.paused);
    let before = calls(&mut admin);
    one.keep_settings().await.unwrap();
    let after_change = calls(&mut admin) - before - 1;
    assert!(
        after_change >= 40,
        "a sweep after a change read {after_change} times for 40 queues"
    );
    assert!(one.kept_settings().get(&queues[7]).unwrap().settings.paused);

    // A queue made elsewhere is read at once, the others are not.
    let new = QueueName::parse("late").unwrap();
    other.enter(&new, &member("a")).await.unwrap();
    let before = calls(&mut admin);
    one.keep_settings().await.unwrap();
    let with_new = calls(&mut admin) - before - 1;
    assert!(with_new <= 6, "{with_new} calls for one new queue");
    assert!(one.kept_settings().get(&new).is_some());
    server.stop();
}
