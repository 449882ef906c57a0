//! The conformance suite of scheduled openings (the pre-queue and its draw), run against every queue
//! backend like [`super::conformance`]: [`draw_conformance_suite!`] expands to one `#[tokio::test]` per
//! check. Kept apart from the main suite so the draw's checks read as one story. The draw steps go
//! through each backend's [`DrawStore`] (reached as production reaches it, `QueueStore::draws`); entries,
//! positions and admissions through its [`QueueStore`].
//!
//! [`draw_conformance_suite!`]: crate::draw_conformance_suite

use std::collections::HashSet;

use rankgate_core::ids::MemberId;
use rankgate_core::queue::draw::{commitment_of, sort_in_draw_order, verify_draw};
use rankgate_core::queue::{DrawPhase, DrawSeed, MemberStatus, QueueName};

use super::conformance::Backend;
use super::draw::{run_draw, BeginDraw, DrawRun, DrawStep, DrawStore, ScheduleOutcome, DRAW_LEASE_MS};
use super::token::TokenSecret;
use super::waiting::QueueStore;
use crate::clock::Clock;

/// Expands to one `#[tokio::test]` per draw check, each given `$make().await` (a fresh [`Backend`]).
#[macro_export]
macro_rules! draw_conformance_suite {
    ($make:path) => {
        $crate::draw_conformance_suite!(@tests $make;
            the_pre_queue_admits_nobody_and_is_drawn_by_hmac_ahead_of_later_arrivals,
            a_draw_beyond_one_page_and_one_chunk_keeps_everyone_once,
            one_drawer_at_a_time_and_a_lost_lease_is_redrawn_whole,
            an_opening_can_be_moved_keeping_its_seed_and_cleared,
        );
    };
    (@tests $make:path; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                $crate::queue::draw_conformance::$name($make().await).await;
            }
        )*
    };
}

fn queue(name: &str) -> QueueName {
    QueueName::parse(name).expect("valid queue name")
}

fn member(name: &str) -> MemberId {
    MemberId::parse(name).expect("valid member id")
}

async fn schedule_in(draws: &dyn DrawStore, q: &QueueName, now_ms: i64, ahead_ms: i64) -> DrawSeed {
    match draws
        .schedule_opening(q, Some(now_ms + ahead_ms), DrawSeed(rand::random()))
        .await
        .unwrap()
    {
        ScheduleOutcome::Scheduled(record) => {
            assert_eq!(record.phase, DrawPhase::Scheduled);
            assert_eq!(
                record.revealed_seed(),
                None,
                "the seed stays secret until the draw"
            );
            assert_eq!(record.commitment(), commitment_of(&record.seed));
            record.seed
        }
        other => panic!("not scheduled: {other:?}"),
    }
}

/// Every waiting member of `q` by rank (0-based), read through `position`.
async fn ranks_of(store: &dyn QueueStore, q: &QueueName, members: &[String]) -> Vec<(u64, String)> {
    let mut ranked = Vec::new();
    for m in members {
        let view = store.position(q, &member(m)).await.unwrap();
        assert_eq!(view.status, MemberStatus::Waiting, "{m}");
        ranked.push((view.rank.expect("waiting has a rank"), m.clone()));
    }
    ranked.sort();
    ranked
}

/// The whole story: a pre-queue admits nobody (even with a full budget), a member entering twice keeps
/// one place, the draw orders the pre-queue by HMAC-SHA-256(seed, memberId), later arrivals queue FIFO
/// behind every early member, the seed is revealed and checks against the commitment, and admission then
/// follows the drawn order.
pub async fn the_pre_queue_admits_nobody_and_is_drawn_by_hmac_ahead_of_later_arrivals(backend: Backend) {
    let store = backend.queues.as_ref();
    let draws = store.draws();
    let q = queue("opening");
    let now = backend.clock.now_millis();
    let seed = schedule_in(draws, &q, now, 60_000).await;
    let early: Vec<String> = (0..40).map(|i| format!("early-{i:02}")).collect();
    for m in &early {
        store.enter(&q, &member(m)).await.unwrap();
    }
    // Entering again keeps one place.
    store.enter(&q, &member(&early[0])).await.unwrap();
    assert_eq!(store.stats(&q).await.unwrap().unwrap().waiting, 40);
    let secret = TokenSecret::generate().unwrap();
    let tokens = |n: usize| (0..n).map(|_| secret.prepare().unwrap()).collect::<Vec<_>>();
    backend.clock.advance(30_000);
    let outcome = store.admit(&q, tokens(10)).await.unwrap();
    assert!(outcome.admitted.is_empty(), "nobody is admitted before opensAt");
    assert_eq!(
        run_draw(draws, &q, "drawer-a").await.unwrap(),
        DrawRun::Idle,
        "not due yet"
    );

    backend.clock.advance(30_000);
    // Due, but not drawn yet: still nobody is admitted by an admission step.
    assert!(store.admit(&q, tokens(10)).await.unwrap().admitted.is_empty());
    assert_eq!(
        run_draw(draws, &q, "drawer-a").await.unwrap(),
        DrawRun::Done(Some(40))
    );
    let record = draws.draw_record(&q).await.unwrap().expect("a record");
    assert_eq!(record.phase, DrawPhase::Done);
    assert_eq!(record.revealed_seed(), Some(seed));
    assert_eq!(record.drawn, 40);
    assert_eq!(commitment_of(&seed), record.commitment());

    let late: Vec<String> = (0..5).map(|i| format!("late-{}", 9 - i)).collect();
    for m in &late {
        store.enter(&q, &member(m)).await.unwrap();
    }
    store.enter(&q, &member(&early[3])).await.unwrap();
    let mut expected = early.clone();
    sort_in_draw_order(&seed, &mut expected);
    expected.extend(late.iter().cloned());
    let everyone: Vec<String> = early.iter().chain(&late).cloned().collect();
    let ranked = ranks_of(store, &q, &everyone).await;
    assert_eq!(
        ranked.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
        (0..45).collect::<Vec<_>>()
    );
    assert_eq!(
        ranked.into_iter().map(|(_, m)| m).collect::<Vec<_>>(),
        expected,
        "early members in HMAC order, then later arrivals in arrival order"
    );
    let published = draws.drawn_members(&q, 0, 1_000).await.unwrap();
    assert_eq!(published, expected[..40]);
    assert_eq!(verify_draw(&seed, &record.commitment(), &published), Ok(()));
    assert_eq!(draws.drawn_members(&q, 38, 10).await.unwrap(), expected[38..40]);

    // Admission now follows the drawn order.
    backend.clock.advance(1_000);
    let admitted = store.admit(&q, tokens(10)).await.unwrap().admitted;
    let admitted: Vec<String> = admitted.iter().map(|m| m.as_str().to_string()).collect();
    assert_eq!(admitted, expected[..admitted.len()]);
    assert!(!admitted.is_empty());
    assert_eq!(
        run_draw(draws, &q, "drawer-b").await.unwrap(),
        DrawRun::Done(None),
        "a draw happens once"
    );
}

/// A pre-queue larger than one read page and several write chunks: everyone is drawn exactly once.
pub async fn a_draw_beyond_one_page_and_one_chunk_keeps_everyone_once(backend: Backend) {
    let store = backend.queues.as_ref();
    let draws = store.draws();
    let q = queue("big-opening");
    let now = backend.clock.now_millis();
    let seed = schedule_in(draws, &q, now, 1_000).await;
    let count = super::draw::DRAW_READ_PAGE + 700;
    let members: Vec<String> = (0..count).map(|i| format!("m-{i:05}")).collect();
    let mut tasks = Vec::new();
    for chunk in members.chunks(count.div_ceil(8)) {
        let store = std::sync::Arc::clone(&backend.queues);
        let (q, chunk) = (q.clone(), chunk.to_vec());
        tasks.push(tokio::spawn(async move {
            for m in chunk {
                store.enter(&q, &member(&m)).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    backend.clock.advance(1_000);
    assert_eq!(
        run_draw(draws, &q, "drawer").await.unwrap(),
        DrawRun::Done(Some(count as u64))
    );
    let mut expected = members.clone();
    sort_in_draw_order(&seed, &mut expected);
    let mut published = Vec::new();
    while published.len() < count {
        let page = draws
            .drawn_members(&q, published.len() as u64, 1_000)
            .await
            .unwrap();
        assert!(!page.is_empty());
        published.extend(page);
    }
    assert_eq!(published, expected);
    for probe in [0, 999, 1_000, 2_500, count - 1] {
        let view = store.position(&q, &member(&expected[probe])).await.unwrap();
        assert_eq!(view.rank, Some(probe as u64), "{}", expected[probe]);
    }
    assert_eq!(store.stats(&q).await.unwrap().unwrap().waiting, count as u64);
}

/// The store grants the draw to one drawer at a time; a drawer that dies mid-pass leaves a half-written
/// order that the next pass (after the lease lapses) rewrites whole: nobody lost, nobody twice, the order
/// exactly the seed's. A member who leaves during the draw and comes back queues behind.
pub async fn one_drawer_at_a_time_and_a_lost_lease_is_redrawn_whole(backend: Backend) {
    let store = backend.queues.as_ref();
    let draws = store.draws();
    let q = queue("crashed-draw");
    let now = backend.clock.now_millis();
    let seed = schedule_in(draws, &q, now, 1_000).await;
    let members: Vec<String> = (0..30).map(|i| format!("m-{i:02}")).collect();
    for m in &members {
        store.enter(&q, &member(m)).await.unwrap();
    }
    backend.clock.advance(1_000);
    let BeginDraw::Begun(pass) = draws.begin_draw(&q, "dies", DRAW_LEASE_MS).await.unwrap() else {
        panic!("the first drawer gets the draw");
    };
    assert_eq!(pass.seed, seed);
    assert_eq!(
        draws.begin_draw(&q, "other", DRAW_LEASE_MS).await.unwrap(),
        BeginDraw::HeldElsewhere
    );
    assert_eq!(run_draw(draws, &q, "other").await.unwrap(), DrawRun::Idle);
    // The first drawer writes a third of a wrong order (as if its pass had read a different set), then dies.
    let mut wrong = members.clone();
    wrong.reverse();
    assert_eq!(
        draws
            .write_draw_chunk(&q, "dies", DRAW_LEASE_MS, 0, &wrong[..10])
            .await
            .unwrap(),
        DrawStep::Written
    );
    assert_eq!(
        draws
            .write_draw_chunk(&q, "dies", DRAW_LEASE_MS, 0, &wrong[..10])
            .await
            .unwrap(),
        DrawStep::Written,
        "a retried chunk is a no-op"
    );
    assert_eq!(
        draws
            .write_draw_chunk(&q, "other", DRAW_LEASE_MS, 10, &wrong[10..20])
            .await
            .unwrap(),
        DrawStep::LostLease,
        "only the lease holder writes"
    );
    // Meanwhile a member leaves and comes back: a later arrival now.
    store.leave(&q, &member("m-05")).await.unwrap();
    store.enter(&q, &member("m-05")).await.unwrap();
    let secret = TokenSecret::generate().unwrap();
    assert!(
        store
            .admit(&q, vec![secret.prepare().unwrap()])
            .await
            .unwrap()
            .admitted
            .is_empty(),
        "nobody is admitted while drawing"
    );
    backend.clock.advance(DRAW_LEASE_MS + 1);
    assert_eq!(
        run_draw(draws, &q, "other").await.unwrap(),
        DrawRun::Done(Some(29))
    );
    assert_eq!(
        draws
            .write_draw_chunk(&q, "dies", DRAW_LEASE_MS, 10, &wrong[10..20])
            .await
            .unwrap(),
        DrawStep::LostLease,
        "the dead drawer's late write is refused"
    );
    let mut expected: Vec<String> = members.iter().filter(|m| *m != "m-05").cloned().collect();
    sort_in_draw_order(&seed, &mut expected);
    assert_eq!(draws.drawn_members(&q, 0, 100).await.unwrap(), expected);
    expected.push("m-05".into());
    let ranked = ranks_of(store, &q, &members).await;
    assert_eq!(
        ranked.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
        (0..30).collect::<Vec<_>>(),
        "nobody lost, nobody twice"
    );
    assert_eq!(ranked.into_iter().map(|(_, m)| m).collect::<Vec<_>>(), expected);
    let unique: HashSet<_> = expected.iter().collect();
    assert_eq!(unique.len(), 30);
}

/// Moving a scheduled opening keeps its seed (the published commitment stays true); clearing it makes the
/// queue an ordinary FIFO queue again, admitting in arrival order; a running draw cannot be moved.
pub async fn an_opening_can_be_moved_keeping_its_seed_and_cleared(backend: Backend) {
    let store = backend.queues.as_ref();
    let draws = store.draws();
    let q = queue("moved-opening");
    let now = backend.clock.now_millis();
    let seed = schedule_in(draws, &q, now, 60_000).await;
    let moved = schedule_in(draws, &q, now, 120_000).await;
    assert_eq!(moved, seed, "moving keeps the seed");
    assert_eq!(
        draws.draw_record(&q).await.unwrap().unwrap().opens_at_ms,
        now + 120_000
    );
    for i in 0..5 {
        store.enter(&q, &member(&format!("m-{i}"))).await.unwrap();
    }
    assert_eq!(
        draws.schedule_opening(&q, None, DrawSeed([0; 32])).await.unwrap(),
        ScheduleOutcome::Cleared
    );
    assert_eq!(draws.draw_record(&q).await.unwrap(), None);
    assert_eq!(
        draws.schedule_opening(&q, None, DrawSeed([0; 32])).await.unwrap(),
        ScheduleOutcome::NothingToClear
    );
    let secret = TokenSecret::generate().unwrap();
    backend.clock.advance(1_000);
    let admitted = store
        .admit(&q, (0..2).map(|_| secret.prepare().unwrap()).collect())
        .await
        .unwrap()
        .admitted;
    assert_eq!(
        admitted.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
        ["m-0", "m-1"],
        "FIFO again"
    );

    let q = queue("running-draw");
    let now = backend.clock.now_millis();
    schedule_in(draws, &q, now, 1_000).await;
    store.enter(&q, &member("a")).await.unwrap();
    backend.clock.advance(1_000);
    assert!(matches!(
        draws.begin_draw(&q, "drawer", DRAW_LEASE_MS).await.unwrap(),
        BeginDraw::Begun(_)
    ));
    assert_eq!(
        draws
            .schedule_opening(&q, Some(now + 50_000), DrawSeed([1; 32]))
            .await
            .unwrap(),
        ScheduleOutcome::DrawRunning
    );
    assert_eq!(
        draws.schedule_opening(&q, None, DrawSeed([1; 32])).await.unwrap(),
        ScheduleOutcome::DrawRunning
    );
}

#[cfg(test)]
mod embedded {
    use super::Backend;
    use crate::clock::ManualClock;
    use crate::queue::embedded::{EmbeddedOptions, EmbeddedStore};

    async fn make() -> Backend {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = ManualClock::new(1_700_000_000_000);
        let store = EmbeddedStore::open(
            dir.path(),
            std::sync::Arc::new(clock.clone()),
            EmbeddedOptions::default(),
        )
        .expect("open");
        Backend {
            queues: store.clone(),
            jobs: store.clone(),
            limiter: store,
            clock,
            guard: Box::new(dir),
        }
    }

    crate::draw_conformance_suite!(make);

    /// The embedded store restarts twice: during the pre-queue (members, `opensAt`, seed and commitment
    /// survive) and in the middle of a draw (a half-written pass on disk); after the dead drawer's lease
    /// lapses the draw completes with everyone once, in the seed's order.
    #[tokio::test]
    async fn a_restart_before_and_during_the_draw_keeps_the_pre_queue_and_its_seed() {
        use crate::queue::draw::{run_draw, BeginDraw, DrawRun, DrawStep, DrawStore as _, DRAW_LEASE_MS};
        use crate::queue::waiting::QueueStore;
        use rankgate_core::queue::draw::sort_in_draw_order;
        use rankgate_core::queue::{DrawPhase, DrawSeed};

        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let open = || {
            EmbeddedStore::open(
                dir.path(),
                std::sync::Arc::new(clock.clone()),
                EmbeddedOptions::default(),
            )
            .unwrap()
        };
        let q = super::queue("restarted");
        let members: Vec<String> = (0..12).map(|i| format!("m-{i}")).collect();
        let seed = DrawSeed([42; 32]);
        {
            let store = open();
            store
                .schedule_opening(&q, Some(1_700_000_060_000), seed)
                .await
                .unwrap();
            for m in &members {
                store.enter(&q, &super::member(m)).await.unwrap();
            }
            store.close();
        }
        {
            let store = open();
            let record = store.draw_record(&q).await.unwrap().unwrap();
            assert_eq!((record.phase, record.seed), (DrawPhase::Scheduled, seed));
            assert_eq!(store.stats(&q).await.unwrap().unwrap().waiting, 12);
            clock.advance(60_000);
            let BeginDraw::Begun(_) = store.begin_draw(&q, "dies", DRAW_LEASE_MS).await.unwrap() else {
                panic!("due");
            };
            let wrong: Vec<String> = members.iter().rev().cloned().collect();
            assert_eq!(
                store
                    .write_draw_chunk(&q, "dies", DRAW_LEASE_MS, 0, &wrong[..5])
                    .await
                    .unwrap(),
                DrawStep::Written
            );
            store.close();
        }
        let store = open();
        assert_eq!(
            run_draw(store.as_ref(), &q, "after-restart").await.unwrap(),
            DrawRun::Idle,
            "the dead drawer's lease still runs"
        );
        clock.advance(DRAW_LEASE_MS + 1);
        assert_eq!(
            run_draw(store.as_ref(), &q, "after-restart").await.unwrap(),
            DrawRun::Done(Some(12))
        );
        let mut expected = members.clone();
        sort_in_draw_order(&seed, &mut expected);
        for (rank, m) in expected.iter().enumerate() {
            assert_eq!(
                store.position(&q, &super::member(m)).await.unwrap().rank,
                Some(rank as u64),
                "{m}"
            );
        }
        store.close();
        drop(store);
        let store = open();
        assert_eq!(store.drawn_members(&q, 0, 100).await.unwrap(), expected);
        assert_eq!(
            store.draw_record(&q).await.unwrap().unwrap().revealed_seed(),
            Some(seed)
        );
        store.enter(&q, &super::member("late")).await.unwrap();
        assert_eq!(
            store.position(&q, &super::member("late")).await.unwrap().rank,
            Some(12),
            "a later arrival queues behind the drawn pre-queue, after a restart too"
        );
    }
}
