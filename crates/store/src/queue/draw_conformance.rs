//! The conformance suite of scheduled openings (the pre-queue and its draw), run against every queue
//! backend like [`super::conformance`]: [`draw_conformance_suite!`] expands to one `#[tokio::test]` per
//! check. Kept apart from the main suite so the draw's checks read as one story. The draw steps go
//! through each backend's [`DrawStore`] (reached as production reaches it, `QueueStore::draws`); entries,
//! positions and admissions through its [`QueueStore`].
//!
//! [`draw_conformance_suite!`]: crate::draw_conformance_suite

use std::collections::HashSet;

use rankgate_core::ids::MemberId;
use rankgate_core::queue::draw::{
    commitment_of, draw_key, entrants_commitment, sort_in_draw_order, verify_draw, DrawMismatch, RevealedDraw,
};
use rankgate_core::queue::{DrawPhase, DrawSeed, MemberStatus, QueueName};

use super::conformance::Backend;
use super::draw::{
    run_draw, BeaconRoundOutcome, BeginDraw, DrawRecord, DrawRun, DrawStage, DrawStep, DrawStore, FinishDraw,
    ScheduleOutcome, SealEntrants, SupplyBeacon, DRAW_LEASE_MS,
};
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
            a_beacon_round_holds_the_draw_until_its_value_and_enters_the_order,
            the_beacon_round_is_fixed_at_the_close_and_a_beacon_is_refused_before_it,
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

/// `entrants` in the order the draw gives them: `drawKey = HMAC(seed, entrantsCommitment ‖ beacon)`,
/// recomputed from the test's own list of who entered.
fn recomputed_order(seed: &DrawSeed, entrants: &[String], beacon: &[u8]) -> Vec<String> {
    let mut order = entrants.to_vec();
    sort_in_draw_order(
        &draw_key(seed, &entrants_commitment(entrants), beacon),
        &mut order,
    );
    order
}

/// The published draw of `q` as `rankgate queue verify-draw` reads it.
async fn revealed(draws: &dyn DrawStore, q: &QueueName, record: &DrawRecord) -> RevealedDraw {
    RevealedDraw {
        seed: record.revealed_seed().expect("revealed"),
        commitment: record.commitment(),
        entrants_commitment: record.entrants_commitment,
        beacon: record.beacon.clone().unwrap_or_default(),
        order: draws.drawn_members(q, 0, 100_000).await.unwrap(),
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
/// one place, the close commits to exactly the members who entered before it (`entrantsCommitment`,
/// checked against a recompute from this test's own list), the draw orders them by
/// HMAC-SHA-256(drawKey, memberId), later arrivals queue FIFO behind every early member and are not in the
/// draw, the seed is revealed and checks against the commitment, the published draw verifies (and a
/// tampered entrant list does not), and admission then follows the drawn order.
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
    // opensAt has come, and no drawer ran yet: this entry closes the pre-queue and queues behind it.
    store.enter(&q, &member("at-opens-at")).await.unwrap();
    assert_eq!(
        draws.draw_record(&q).await.unwrap().unwrap().phase,
        DrawPhase::Closing,
        "the close is exact: the first entry at opensAt closes the pre-queue"
    );
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
    assert_eq!(
        record.entrants_commitment,
        Some(entrants_commitment(&early)),
        "the commitment is over exactly the members who entered before the close"
    );
    assert_eq!(record.entrant_count, 40);
    assert_eq!((record.beacon_round, record.beacon.as_ref()), (None, None));
    assert!(
        draws.entrants(&q, 0, 100).await.unwrap().is_empty(),
        "the entrant list is dropped once the drawn list holds them"
    );

    let mut late: Vec<String> = vec!["at-opens-at".into()];
    late.extend((0..5).map(|i| format!("late-{}", 9 - i)));
    for m in &late {
        store.enter(&q, &member(m)).await.unwrap();
    }
    store.enter(&q, &member(&early[3])).await.unwrap();
    let mut expected = recomputed_order(&seed, &early, &[]);
    expected.extend(late.iter().cloned());
    let everyone: Vec<String> = early.iter().chain(&late).cloned().collect();
    let ranked = ranks_of(store, &q, &everyone).await;
    assert_eq!(
        ranked.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
        (0..46).collect::<Vec<_>>()
    );
    assert_eq!(
        ranked.into_iter().map(|(_, m)| m).collect::<Vec<_>>(),
        expected,
        "early members in HMAC order, then later arrivals in arrival order"
    );
    let published = revealed(draws, &q, &record).await;
    assert_eq!(published.order, expected[..40]);
    assert_eq!(verify_draw(&published), Ok(()));
    let mut slipped_in = published.clone();
    slipped_in.order.push(late[0].clone());
    sort_in_draw_order(&slipped_in.draw_key(), &mut slipped_in.order);
    assert!(matches!(
        verify_draw(&slipped_in),
        Err(DrawMismatch::EntrantsCommitment { .. })
    ));
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
    let expected = recomputed_order(&seed, &members, &[]);
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
/// list that the next pass (after the lease lapses) rewrites whole, at the close (the entrant list) and
/// while ordering (the drawn list): nobody lost, nobody twice, the order exactly the draw key's. A member
/// who leaves during the close and comes back is a later arrival, not an entrant.
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
    assert_eq!(pass.stage, DrawStage::RecordEntrants, "the close comes first");
    assert_eq!(
        draws.begin_draw(&q, "other", DRAW_LEASE_MS).await.unwrap(),
        BeginDraw::HeldElsewhere
    );
    assert_eq!(run_draw(draws, &q, "other").await.unwrap(), DrawRun::Idle);
    // The first drawer records a third of a wrong entrant list, then dies.
    let mut wrong = members.clone();
    wrong.reverse();
    for _ in 0..2 {
        assert_eq!(
            draws
                .write_entrants_chunk(&q, "dies", DRAW_LEASE_MS, 0, &wrong[..10])
                .await
                .unwrap(),
            DrawStep::Written,
            "a retried chunk is a no-op"
        );
    }
    assert_eq!(
        draws
            .write_entrants_chunk(&q, "other", DRAW_LEASE_MS, 10, &wrong[10..20])
            .await
            .unwrap(),
        DrawStep::LostLease,
        "only the lease holder writes"
    );
    assert_eq!(
        draws
            .write_draw_chunk(&q, "dies", DRAW_LEASE_MS, 0, &wrong[..10])
            .await
            .unwrap(),
        DrawStep::LostLease,
        "no order is written before the entrants are sealed"
    );
    let record = draws.draw_record(&q).await.unwrap().unwrap();
    assert_eq!(record.phase, DrawPhase::Closing);
    assert_eq!(record.entrants_commitment, None, "nothing published mid-close");
    assert_eq!(record.revealed_seed(), None);
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
        "nobody is admitted while closing"
    );

    // The lease lapses: a second drawer closes anew, seals, and dies a third into the order.
    backend.clock.advance(DRAW_LEASE_MS + 1);
    let entrants: Vec<String> = members.iter().filter(|m| *m != "m-05").cloned().collect();
    let BeginDraw::Begun(pass) = draws.begin_draw(&q, "second", DRAW_LEASE_MS).await.unwrap() else {
        panic!("a lapsed lease is granted anew");
    };
    assert_eq!(pass.stage, DrawStage::RecordEntrants);
    let mut page = draws
        .pre_queue_page(&q, 0, pass.late_from, 1_000)
        .await
        .unwrap()
        .into_iter()
        .map(|(m, _)| m)
        .collect::<Vec<_>>();
    page.sort();
    assert_eq!(page, entrants, "a returning member is not an entrant");
    assert_eq!(
        draws
            .write_entrants_chunk(&q, "second", DRAW_LEASE_MS, 0, &page)
            .await
            .unwrap(),
        DrawStep::Written
    );
    assert_eq!(
        draws
            .seal_entrants(&q, "dies", entrants_commitment(&page))
            .await
            .unwrap(),
        SealEntrants::LostLease
    );
    assert_eq!(
        draws
            .seal_entrants(&q, "second", entrants_commitment(&page))
            .await
            .unwrap(),
        SealEntrants::ReadyToDraw
    );
    let BeginDraw::Begun(pass) = draws.begin_draw(&q, "second", DRAW_LEASE_MS).await.unwrap() else {
        panic!("the sealing drawer goes on");
    };
    assert_eq!(
        pass.stage,
        DrawStage::WriteOrder {
            entrants_commitment: entrants_commitment(&entrants),
            beacon: Vec::new()
        }
    );
    assert_eq!(
        draws
            .write_draw_chunk(&q, "second", DRAW_LEASE_MS, 0, &wrong[..10])
            .await
            .unwrap(),
        DrawStep::Written
    );
    backend.clock.advance(DRAW_LEASE_MS + 1);
    assert_eq!(
        run_draw(draws, &q, "third").await.unwrap(),
        DrawRun::Done(Some(29))
    );
    assert_eq!(
        draws
            .write_draw_chunk(&q, "second", DRAW_LEASE_MS, 10, &wrong[10..20])
            .await
            .unwrap(),
        DrawStep::LostLease,
        "the dead drawer's late write is refused"
    );
    assert_eq!(
        draws.finish_draw(&q, "second").await.unwrap(),
        FinishDraw::LostLease
    );
    let mut expected = recomputed_order(&seed, &entrants, &[]);
    assert_eq!(draws.drawn_members(&q, 0, 100).await.unwrap(), expected);
    let record = draws.draw_record(&q).await.unwrap().unwrap();
    assert_eq!(verify_draw(&revealed(draws, &q, &record).await), Ok(()));
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

/// With `drawBeaconRound` the close publishes `entrantsCommitment` and then holds: nobody is admitted, the
/// seed stays secret and every drawer run waits, until an admin supplies the round's value. A wrong round
/// is refused, the value is accepted once (again the same: a no-op; another: refused), and the order is
/// the one `drawKey = HMAC(seed, entrantsCommitment ‖ beacon)` gives, which the published draw verifies;
/// the same draw without the beacon, or with another one, does not.
pub async fn a_beacon_round_holds_the_draw_until_its_value_and_enters_the_order(backend: Backend) {
    let store = backend.queues.as_ref();
    let draws = store.draws();
    let q = queue("beacon-opening");
    let now = backend.clock.now_millis();
    let seed = schedule_in(draws, &q, now, 1_000).await;
    let BeaconRoundOutcome::Set(record) = draws.set_beacon_round(&q, Some(4_242)).await.unwrap() else {
        panic!("a scheduled draw takes a beacon round");
    };
    assert_eq!(record.beacon_round, Some(4_242));
    assert_eq!(record.seed, seed, "naming the round keeps the seed");
    let entrants: Vec<String> = (0..25).map(|i| format!("b-{i:02}")).collect();
    for m in &entrants {
        store.enter(&q, &member(m)).await.unwrap();
    }
    assert_eq!(
        draws.supply_beacon(&q, 4_242, b"too early").await.unwrap(),
        SupplyBeacon::NotAwaiting,
        "no beacon before the entrants are committed"
    );
    backend.clock.advance(1_000);
    assert_eq!(
        run_draw(draws, &q, "drawer-a").await.unwrap(),
        DrawRun::AwaitingBeacon
    );
    let record = draws.draw_record(&q).await.unwrap().unwrap();
    assert_eq!(record.phase, DrawPhase::AwaitingBeacon);
    assert_eq!(
        record.entrants_commitment,
        Some(entrants_commitment(&entrants)),
        "published at the close, before anything is revealed"
    );
    assert_eq!(record.entrant_count, 25);
    assert_eq!(record.revealed_seed(), None);
    assert_eq!(record.revealed_draw_key(), None);
    let mut listed = draws.entrants(&q, 0, 100).await.unwrap();
    listed.sort();
    assert_eq!(listed, entrants);
    // A member entering after the close queues behind and is no entrant.
    store.enter(&q, &member("after-close")).await.unwrap();
    let secret = TokenSecret::generate().unwrap();
    for _ in 0..3 {
        backend.clock.advance(1_000);
        assert!(store
            .admit(&q, vec![secret.prepare().unwrap()])
            .await
            .unwrap()
            .admitted
            .is_empty());
        assert_eq!(
            run_draw(draws, &q, "drawer-b").await.unwrap(),
            DrawRun::AwaitingBeacon,
            "every instance waits"
        );
    }
    assert_eq!(
        draws.supply_beacon(&q, 4_241, b"\x01").await.unwrap(),
        SupplyBeacon::WrongRound {
            expected: Some(4_242)
        }
    );
    let beacon = hex_bytes("8d3ff1f0f5bd21ee5e0a94e49d1a1e3c07cfd16b8bfc74b0e5f2f2e4a1c6e9d0");
    assert_eq!(
        draws.supply_beacon(&q, 4_242, &beacon).await.unwrap(),
        SupplyBeacon::Accepted
    );
    assert_eq!(
        draws.supply_beacon(&q, 4_242, &beacon).await.unwrap(),
        SupplyBeacon::AlreadyAccepted
    );
    assert_eq!(
        draws.supply_beacon(&q, 4_242, b"other").await.unwrap(),
        SupplyBeacon::DifferentValueAccepted
    );
    assert_eq!(
        run_draw(draws, &q, "drawer-b").await.unwrap(),
        DrawRun::Done(Some(25))
    );
    let record = draws.draw_record(&q).await.unwrap().unwrap();
    assert_eq!(record.beacon.as_deref(), Some(beacon.as_slice()));
    let mut expected = recomputed_order(&seed, &entrants, &beacon);
    assert_eq!(
        record.revealed_draw_key(),
        Some(draw_key(&seed, &entrants_commitment(&entrants), &beacon))
    );
    let published = revealed(draws, &q, &record).await;
    assert_eq!(published.order, expected);
    assert_eq!(verify_draw(&published), Ok(()));
    for tampered_beacon in [Vec::new(), b"other".to_vec()] {
        let tampered = RevealedDraw {
            beacon: tampered_beacon,
            ..published.clone()
        };
        assert!(matches!(verify_draw(&tampered), Err(DrawMismatch::Order { .. })));
    }
    assert_eq!(
        draws.supply_beacon(&q, 4_242, &beacon).await.unwrap(),
        SupplyBeacon::AlreadyAccepted,
        "a retried PUT after the draw still answers the same"
    );
    expected.push("after-close".into());
    let mut everyone = entrants.clone();
    everyone.push("after-close".into());
    let ranked = ranks_of(store, &q, &everyone).await;
    assert_eq!(ranked.into_iter().map(|(_, m)| m).collect::<Vec<_>>(), expected);
}

/// `drawBeaconRound` changes only before the close; a queue without one takes no beacon; clearing the
/// opening clears the round.
pub async fn the_beacon_round_is_fixed_at_the_close_and_a_beacon_is_refused_before_it(backend: Backend) {
    let store = backend.queues.as_ref();
    let draws = store.draws();
    let q = queue("round-rules");
    assert_eq!(
        draws.set_beacon_round(&q, Some(7)).await.unwrap(),
        BeaconRoundOutcome::NoOpening
    );
    assert_eq!(
        draws.supply_beacon(&q, 7, b"x").await.unwrap(),
        SupplyBeacon::NotAwaiting
    );
    let now = backend.clock.now_millis();
    schedule_in(draws, &q, now, 1_000).await;
    assert!(matches!(
        draws.set_beacon_round(&q, Some(7)).await.unwrap(),
        BeaconRoundOutcome::Set(_)
    ));
    let BeaconRoundOutcome::Set(record) = draws.set_beacon_round(&q, None).await.unwrap() else {
        panic!("cleared while scheduled");
    };
    assert_eq!(record.beacon_round, None);
    assert_eq!(
        draws.supply_beacon(&q, 7, b"x").await.unwrap(),
        SupplyBeacon::WrongRound { expected: None },
        "no round named: no beacon awaited"
    );
    draws.set_beacon_round(&q, Some(8)).await.unwrap();
    // Moving the opening keeps the round.
    schedule_in(draws, &q, now, 2_000).await;
    assert_eq!(
        draws.draw_record(&q).await.unwrap().unwrap().beacon_round,
        Some(8)
    );
    store.enter(&q, &member("only")).await.unwrap();
    backend.clock.advance(2_000);
    assert_eq!(
        run_draw(draws, &q, "drawer").await.unwrap(),
        DrawRun::AwaitingBeacon
    );
    assert_eq!(
        draws.set_beacon_round(&q, Some(9)).await.unwrap(),
        BeaconRoundOutcome::Closed
    );
    assert_eq!(
        draws
            .schedule_opening(&q, Some(now + 60_000), DrawSeed([3; 32]))
            .await
            .unwrap(),
        ScheduleOutcome::DrawRunning,
        "a closed pre-queue cannot be moved"
    );
    assert_eq!(
        draws.schedule_opening(&q, None, DrawSeed([3; 32])).await.unwrap(),
        ScheduleOutcome::DrawRunning
    );
    // An empty pre-queue is done at its close, beacon or not: the empty set is committed.
    let empty = queue("empty-opening");
    let now = backend.clock.now_millis();
    schedule_in(draws, &empty, now, 1_000).await;
    draws.set_beacon_round(&empty, Some(1)).await.unwrap();
    backend.clock.advance(1_000);
    assert_eq!(
        run_draw(draws, &empty, "drawer").await.unwrap(),
        DrawRun::Done(None)
    );
    let record = draws.draw_record(&empty).await.unwrap().unwrap();
    assert_eq!(record.phase, DrawPhase::Done);
    assert_eq!(record.entrants_commitment, Some(entrants_commitment::<&str>(&[])));
}

fn hex_bytes(raw: &str) -> Vec<u8> {
    hex::decode(raw).expect("hex")
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
                    .write_entrants_chunk(&q, "dies", DRAW_LEASE_MS, 0, &wrong[..5])
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
        let expected = super::recomputed_order(&seed, &members, &[]);
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

    /// A restart while the draw awaits its beacon keeps the sealed entrant list, its commitment and the
    /// round; the beacon supplied after the restart draws exactly the committed entrants.
    #[tokio::test]
    async fn a_restart_while_awaiting_the_beacon_keeps_the_sealed_entrants() {
        use crate::queue::draw::{run_draw, DrawRun, DrawStore as _, SupplyBeacon};
        use crate::queue::waiting::QueueStore;
        use rankgate_core::queue::draw::entrants_commitment;
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
        let q = super::queue("restarted-beacon");
        let members: Vec<String> = (0..9).map(|i| format!("m-{i}")).collect();
        let seed = DrawSeed([5; 32]);
        {
            let store = open();
            store
                .schedule_opening(&q, Some(1_700_000_001_000), seed)
                .await
                .unwrap();
            store.set_beacon_round(&q, Some(77)).await.unwrap();
            for m in &members {
                store.enter(&q, &super::member(m)).await.unwrap();
            }
            clock.advance(1_000);
            assert_eq!(
                run_draw(store.as_ref(), &q, "a").await.unwrap(),
                DrawRun::AwaitingBeacon
            );
            store.close();
        }
        let store = open();
        let record = store.draw_record(&q).await.unwrap().unwrap();
        assert_eq!(record.phase, DrawPhase::AwaitingBeacon);
        assert_eq!(record.beacon_round, Some(77));
        assert_eq!(record.entrants_commitment, Some(entrants_commitment(&members)));
        assert_eq!(store.entrants(&q, 0, 100).await.unwrap().len(), 9);
        assert_eq!(
            store.supply_beacon(&q, 77, b"beacon").await.unwrap(),
            SupplyBeacon::Accepted
        );
        assert_eq!(
            run_draw(store.as_ref(), &q, "b").await.unwrap(),
            DrawRun::Done(Some(9))
        );
        assert_eq!(
            store.drawn_members(&q, 0, 100).await.unwrap(),
            super::recomputed_order(&seed, &members, b"beacon")
        );
        store.close();
        drop(store);
        let store = open();
        assert!(store.entrants(&q, 0, 100).await.unwrap().is_empty());
        assert_eq!(
            store.draw_record(&q).await.unwrap().unwrap().beacon.as_deref(),
            Some(&b"beacon"[..])
        );
    }
}
