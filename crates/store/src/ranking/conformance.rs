//! The conformance suite for [`SourceOfTruth`]: one set of checks that every backend must pass, so
//! "no behaviour may differ from the embedded engine" is tested rather than hoped for.
//!
//! It is test code behind the `testsuite` feature (on for the store's own tests and benches through its
//! dev-dependency on itself; another crate's tests turn it on the same way), so integration tests, and any
//! future backend crate, can run it against a real store while the library the server links stays free
//! of it: each check takes a [`Factory`] that opens a new handle to the same,
//! initially empty store, and panics with a message naming the broken contract. The test binary
//! (`tests/source_conformance.rs`) creates one fresh store per check (a temp dir for SQLite, a schema for
//! PostgreSQL). Checks of database-side dedupe ([`dedupe_by_database`],
//! [`concurrent_duplicates_are_counted_once`]) apply only to backends that several processes share.

use std::collections::{BTreeMap, BTreeSet};

use rankgate_core::ids::{Category, EventId, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::Hour;
use rankgate_core::policy::{PolicyError, PolicyState};
use rankgate_core::ranker::{Policy, PopularWeights, RankerName};

use super::source::{CommitBatch, SourceError, SourceOfTruth};

/// Opens a new handle to the store under test (the same store on every call).
pub type Factory<'a> = &'a (dyn Fn() -> Box<dyn SourceOfTruth> + Sync);

/// First hour of a UTC day (day 20,600 ≈ May 2026), so day-partitioned backends see aligned days.
pub const DAY0: i64 = 20_600 * 24;

/// One test event: (hour, id, product, delta).
pub type TestEvent<'a> = (i64, &'a str, &'a str, Metrics);

/// A view-only delta.
pub fn views(n: i64) -> Metrics {
    Metrics {
        views: n,
        ..Metrics::default()
    }
}

/// The raw body stored for a test event.
pub fn body_of(id: &str) -> Vec<u8> {
    format!("{{\"id\":\"{id}\"}}").into_bytes()
}

/// Builds a batch as the ingestor does: events, their own deltas, and the coalesced deltas sorted by
/// (hour, product).
pub fn batch_of(events: &[TestEvent<'_>]) -> CommitBatch {
    let mut batch = CommitBatch::default();
    let mut sums: BTreeMap<(i64, String), Metrics> = BTreeMap::new();
    for &(hour, id, product, delta) in events {
        let product_id = ProductId::parse(product).expect("valid product");
        batch
            .events
            .push((Hour(hour), EventId::parse(id).expect("valid id"), body_of(id)));
        batch.event_deltas.push((product_id, delta));
        let sum = sums.entry((hour, product.to_owned())).or_default();
        *sum = sum.checked_add(&delta).expect("test deltas do not overflow");
    }
    batch.metric_deltas = sums
        .into_iter()
        .map(|((hour, product), m)| (Hour(hour), ProductId::parse(&product).expect("valid product"), m))
        .collect();
    batch
}

fn product(s: &str) -> ProductId {
    ProductId::parse(s).expect("valid product")
}

fn category(s: &str) -> Category {
    Category::parse(s).expect("valid category")
}

/// Everything observable through the trait, in a canonical order.
#[derive(Debug, PartialEq)]
pub struct Snapshot {
    /// Metric rows, sorted.
    pub metrics: Vec<(i64, String, Metrics)>,
    /// Memberships, sorted.
    pub memberships: Vec<(String, String)>,
    /// Processed ids, sorted.
    pub processed: Vec<String>,
    /// Watermark.
    pub watermark: Option<i64>,
    /// Last ingest time.
    pub last_ingest: Option<i64>,
    /// The raw log in scan order.
    pub log: Vec<(i64, Vec<u8>)>,
}

/// Loads and scans `source` into a [`Snapshot`].
pub fn snapshot(source: &mut dyn SourceOfTruth) -> Snapshot {
    let state = source.load().expect("load");
    let mut metrics: Vec<_> = state
        .metrics
        .into_iter()
        .map(|(h, p, m)| (h.0, p.as_str().to_owned(), m))
        .collect();
    metrics.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let mut memberships: Vec<_> = state
        .memberships
        .into_iter()
        .map(|(p, c)| (p.as_str().to_owned(), c.as_str().to_owned()))
        .collect();
    memberships.sort();
    let mut processed: Vec<_> = state
        .processed_ids
        .into_iter()
        .map(|id| id.as_str().to_owned())
        .collect();
    processed.sort();
    let mut log = Vec::new();
    source
        .scan_event_log(&mut |hour, body| log.push((hour.0, body.to_vec())))
        .expect("scan");
    Snapshot {
        metrics,
        memberships,
        processed,
        watermark: state.watermark_millis,
        last_ingest: state.last_ingest_millis,
        log,
    }
}

/// A commit is visible, complete, to a new handle (as after a restart).
pub fn commit_load_round_trip(open: Factory<'_>) {
    let mut source = open();
    let mut batch = batch_of(&[
        (DAY0 + 1, "e1", "p1", views(1)),
        (
            DAY0 + 1,
            "e2",
            "p1",
            Metrics {
                views: 0,
                likes: -1,
                units: 2,
                sales: 900,
            },
        ),
        (DAY0 + 30, "e3", "p2", views(1)),
    ]);
    batch.new_memberships = vec![(product("p1"), category("c1")), (product("p2"), category("c2"))];
    batch.watermark_millis = Some((DAY0 + 30) * 3_600_000);
    batch.ingested_at_millis = Some(1_000);
    source.commit(&batch).expect("commit");
    drop(source);
    let seen = snapshot(open().as_mut());
    assert_eq!(
        seen.metrics,
        vec![
            (
                DAY0 + 1,
                "p1".into(),
                Metrics {
                    views: 1,
                    likes: -1,
                    units: 2,
                    sales: 900
                }
            ),
            (DAY0 + 30, "p2".into(), views(1)),
        ]
    );
    assert_eq!(
        seen.memberships,
        vec![("p1".into(), "c1".into()), ("p2".into(), "c2".into())]
    );
    assert_eq!(seen.processed, vec!["e1", "e2", "e3"]);
    assert_eq!(seen.watermark, Some((DAY0 + 30) * 3_600_000));
    assert_eq!(seen.last_ingest, Some(1_000));
    assert_eq!(
        seen.log,
        vec![
            (DAY0 + 1, body_of("e1")),
            (DAY0 + 1, body_of("e2")),
            (DAY0 + 30, body_of("e3"))
        ]
    );
}

/// Deltas for an existing (hour, product) row add up, including negative ones; other rows are separate.
pub fn metric_upserts_accumulate(open: Factory<'_>) {
    let mut source = open();
    source
        .commit(&batch_of(&[(
            DAY0,
            "a1",
            "p1",
            Metrics {
                views: 2,
                likes: 1,
                units: 3,
                sales: 50,
            },
        )]))
        .expect("commit");
    source
        .commit(&batch_of(&[(
            DAY0,
            "a2",
            "p1",
            Metrics {
                views: 1,
                likes: -2,
                units: -1,
                sales: -20,
            },
        )]))
        .expect("commit");
    source
        .commit(&batch_of(&[(DAY0 + 1, "a3", "p1", views(5))]))
        .expect("commit");
    let seen = snapshot(source.as_mut());
    assert_eq!(
        seen.metrics,
        vec![
            (
                DAY0,
                "p1".into(),
                Metrics {
                    views: 3,
                    likes: -1,
                    units: 2,
                    sales: 30
                }
            ),
            (DAY0 + 1, "p1".into(), views(5)),
        ]
    );
}

/// A membership committed twice is stored once; memberships need no events.
pub fn memberships_are_a_set(open: Factory<'_>) {
    let mut source = open();
    for _ in 0..2 {
        let batch = CommitBatch {
            new_memberships: vec![(product("p1"), category("c1")), (product("p1"), category("c2"))],
            ..CommitBatch::default()
        };
        source.commit(&batch).expect("commit");
    }
    let seen = snapshot(open().as_mut());
    assert_eq!(
        seen.memberships,
        vec![("p1".into(), "c1".into()), ("p1".into(), "c2".into())]
    );
}

/// The watermark and the last ingest time follow the newest batch; a batch without them leaves them.
pub fn watermark_and_last_ingest(open: Factory<'_>) {
    let mut source = open();
    assert_eq!(snapshot(source.as_mut()).watermark, None);
    assert_eq!(snapshot(source.as_mut()).last_ingest, None);
    for (watermark, at) in [(100, 10), (250, 20)] {
        let mut batch = batch_of(&[(DAY0, &format!("w{watermark}"), "p1", views(1))]);
        batch.watermark_millis = Some(watermark);
        batch.ingested_at_millis = Some(at);
        source.commit(&batch).expect("commit");
    }
    source
        .commit(&batch_of(&[(DAY0, "w-none", "p1", views(1))]))
        .expect("commit");
    let seen = snapshot(open().as_mut());
    assert_eq!((seen.watermark, seen.last_ingest), (Some(250), Some(20)));
}

fn weights_with_view(view: f64) -> PopularWeights {
    PopularWeights {
        view,
        like: 0.0,
        sales: 0.125,
        carry_ratio: 0.3,
        carry_top_n: 7,
        half_life_hours: 24.0,
    }
}

/// Policy states round-trip through a reopen: active, previous, building with their weights, the latest
/// version and the sequence number. An unconfigured ranker has none; a first transition starts from
/// [`PolicyState::initial`].
pub fn policies_round_trip(open: Factory<'_>) {
    let mut source = open();
    assert!(source.load_policies(RankerName::Popular).expect("load").is_none());
    let started = source
        .transition_policies(RankerName::Popular, &mut |_| Ok(()))
        .expect("a no-op transition");
    assert_eq!(
        started,
        PolicyState::initial(),
        "an unconfigured ranker starts at version 1"
    );
    let mut created = None;
    let state = source
        .transition_policies(RankerName::Popular, &mut |state| {
            created = Some(state.create(weights_with_view(1.5))?);
            Ok(())
        })
        .expect("create");
    let v2 = created.expect("created");
    assert_eq!((v2.version, state.building, state.seq), (2, Some(v2), 1));
    state_survives_a_reopen(open, &state);
    let state = source
        .transition_policies(RankerName::Popular, &mut |state| {
            state.complete_build(2).map(|_| ())
        })
        .expect("switch");
    assert_eq!(
        (state.active, state.previous, state.building),
        (v2, Some(Policy::default()), None)
    );
    state_survives_a_reopen(open, &state);
    let state = source
        .transition_policies(RankerName::Popular, &mut |state| {
            state.create(weights_with_view(3.0)).map(|_| ())
        })
        .expect("create");
    state_survives_a_reopen(open, &state);
    assert!(source.load_policies(RankerName::Units).expect("load").is_none());

    // `trending` has a state of its own, starting from its own defaults (no carry, a 24-hour
    // half-life), and its half-life round-trips.
    let trending = source
        .transition_policies(RankerName::Trending, &mut |_| Ok(()))
        .expect("a no-op transition");
    assert_eq!(trending, PolicyState::initial_for(RankerName::Trending));
    assert_eq!(trending.active.weights, PopularWeights::trending_default());
    let state = source
        .transition_policies(RankerName::Trending, &mut |state| {
            state
                .create(PopularWeights {
                    half_life_hours: 6.5,
                    ..PopularWeights::trending_default()
                })
                .map(|_| ())
        })
        .expect("create");
    assert_eq!(state.building.map(|p| p.weights.half_life_hours), Some(6.5));
    ranker_state_survives_a_reopen(open, RankerName::Trending, &state);
    assert_eq!(
        source
            .load_policies(RankerName::Popular)
            .expect("load")
            .map(|s| s.latest_version),
        Some(3),
        "popular's versions are its own"
    );
}

fn state_survives_a_reopen(open: Factory<'_>, state: &PolicyState) {
    ranker_state_survives_a_reopen(open, RankerName::Popular, state);
}

fn ranker_state_survives_a_reopen(open: Factory<'_>, ranker: RankerName, state: &PolicyState) {
    let loaded = open().load_policies(ranker).expect("load").expect("stored");
    assert_eq!(&loaded, state, "the stored policy state round-trips");
}

/// A refused transition stores nothing and reports [`SourceError::Policy`]; the rules are the core's
/// ([`PolicyState`]): a superseded build is not switched to, a rollback of a rollback returns, a
/// rollback needs the previous version the caller built.
pub fn policy_transitions_follow_the_rules(open: Factory<'_>) {
    let mut source = open();
    let transition =
        |source: &mut Box<dyn SourceOfTruth>,
         step: &mut dyn FnMut(&mut PolicyState) -> Result<(), PolicyError>| {
            source.transition_policies(RankerName::Popular, step)
        };
    transition(&mut source, &mut |s| s.create(weights_with_view(2.0)).map(|_| ())).expect("create 2");
    transition(&mut source, &mut |s| s.create(weights_with_view(3.0)).map(|_| ())).expect("create 3");
    let before = open()
        .load_policies(RankerName::Popular)
        .expect("load")
        .expect("stored");
    match transition(&mut source, &mut |s| s.complete_build(2).map(|_| ())) {
        Err(SourceError::Policy(PolicyError::Superseded {
            version: 2,
            latest: 3,
        })) => {}
        other => panic!("switching to a superseded version must be refused, got {other:?}"),
    }
    let after = open()
        .load_policies(RankerName::Popular)
        .expect("load")
        .expect("stored");
    assert_eq!(after, before, "a refused transition stores nothing");
    let switched = transition(&mut source, &mut |s| s.complete_build(3).map(|_| ())).expect("switch");
    assert_eq!(
        (switched.active.version, switched.previous.map(|p| p.version)),
        (3, Some(1))
    );
    let back = transition(&mut source, &mut |s| s.rollback_to(1).map(|_| ())).expect("rollback");
    assert_eq!(
        (back.active.version, back.previous.map(|p| p.version)),
        (1, Some(3))
    );
    let again = transition(&mut source, &mut |s| s.rollback_to(3).map(|_| ())).expect("rollback again");
    assert_eq!(
        (again.active, again.previous),
        (switched.active, switched.previous)
    );
    match transition(&mut source, &mut |s| s.rollback_to(3).map(|_| ())) {
        Err(SourceError::Policy(PolicyError::PreviousChanged {
            expected: 3,
            previous: 1,
        })) => {}
        other => panic!("a rollback built for another previous version must be refused, got {other:?}"),
    }
    assert_eq!(
        open()
            .load_policies(RankerName::Popular)
            .expect("load")
            .expect("stored"),
        again
    );
}

/// Concurrent transitions through several handles (instances) apply one after the other: eight
/// threads each create a version and try to switch to it; every version number is drawn once, the
/// sequence counts every transition, and the version active at the end is the newest one created
/// (every other build was superseded or switched before it).
pub fn concurrent_policy_transitions_apply_in_one_order(open: Factory<'_>) {
    const THREADS: usize = 8;
    open()
        .transition_policies(RankerName::Popular, &mut |_| Ok(()))
        .expect("initial state");
    let outcomes: Vec<(u32, bool)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                scope.spawn(move || {
                    let mut source = open();
                    let mut version = 0;
                    source
                        .transition_policies(RankerName::Popular, &mut |state| {
                            version = state.create(weights_with_view(thread as f64))?.version;
                            Ok(())
                        })
                        .expect("create");
                    let switched = match source.transition_policies(RankerName::Popular, &mut |state| {
                        state.complete_build(version).map(|_| ())
                    }) {
                        Ok(_) => true,
                        Err(SourceError::Policy(PolicyError::Superseded { .. })) => false,
                        Err(other) => panic!("switch: {other}"),
                    };
                    (version, switched)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let versions: BTreeSet<u32> = outcomes.iter().map(|(v, _)| *v).collect();
    assert_eq!(
        versions,
        (2..2 + THREADS as u32).collect(),
        "every version number drawn exactly once: {outcomes:?}"
    );
    let state = open()
        .load_policies(RankerName::Popular)
        .expect("load")
        .expect("stored");
    let switches = outcomes.iter().filter(|(_, switched)| *switched).count();
    assert_eq!(state.latest_version, 1 + THREADS as u32);
    assert_eq!(
        state.seq as usize,
        THREADS + switches,
        "one sequence step per applied transition"
    );
    // The newest version was created last; nothing superseded it, so its own switch succeeded.
    assert_eq!(state.active.version, state.latest_version, "{outcomes:?}");
    assert_eq!(state.building, None);
    assert_eq!(
        state.active.weights.view,
        outcomes
            .iter()
            .position(|(v, _)| *v == state.latest_version)
            .map(|thread| thread as f64)
            .expect("the newest version's thread"),
        "the active version's weights are the ones created with it"
    );
}

/// Catalogue entries upsert (last write wins) and round-trip as JSON values.
pub fn catalog_round_trip(open: Factory<'_>) {
    let mut source = open();
    let a = serde_json::json!({"name": "Kettle", "price": 1999, "tags": ["home", "kitchen"], "ratio": 0.25});
    let b = serde_json::json!({"name": "Lamp"});
    let b2 = serde_json::json!({"name": "Lamp v2", "nested": {"x": null}});
    source
        .put_catalog(&[(product("p1"), a.clone()), (product("p2"), b)])
        .expect("put");
    source.put_catalog(&[(product("p2"), b2.clone())]).expect("put");
    let mut loaded = open().load_catalog().expect("load");
    loaded.sort_by(|x, y| x.0.as_str().cmp(y.0.as_str()));
    assert_eq!(loaded, vec![(product("p1"), a), (product("p2"), b2)]);
}

/// The raw log is scanned hour by hour, whatever the commit order, with every event exactly once. The
/// order inside one hour is the backend's (commit order, or id order): replay and verify only sum.
pub fn scan_event_log_order(open: Factory<'_>) {
    let mut source = open();
    source
        .commit(&batch_of(&[
            (DAY0 + 50, "b", "p1", views(1)),
            (DAY0 + 2, "a", "p1", views(1)),
        ]))
        .expect("commit");
    source
        .commit(&batch_of(&[
            (DAY0 + 2, "B", "p1", views(1)),
            (DAY0 + 2, "aa", "p1", views(1)),
            (DAY0 - 3, "z", "p1", views(1)),
            (DAY0 + 2, "a-", "p1", views(1)),
        ]))
        .expect("commit");
    let log = snapshot(source.as_mut()).log;
    let hours: Vec<i64> = log.iter().map(|(hour, _)| *hour).collect();
    assert_eq!(
        hours,
        vec![DAY0 - 3, DAY0 + 2, DAY0 + 2, DAY0 + 2, DAY0 + 2, DAY0 + 50]
    );
    let mut scanned = log.clone();
    scanned.sort();
    let mut expected: Vec<(i64, Vec<u8>)> = [
        (DAY0 - 3, "z"),
        (DAY0 + 2, "a"),
        (DAY0 + 2, "B"),
        (DAY0 + 2, "aa"),
        (DAY0 + 2, "a-"),
        (DAY0 + 50, "b"),
    ]
    .into_iter()
    .map(|(hour, id)| (hour, body_of(id)))
    .collect();
    expected.sort();
    assert_eq!(scanned, expected);
}

/// `replace_metrics` leaves exactly the given rows, and touches nothing else.
pub fn replace_metrics_replaces(open: Factory<'_>) {
    let mut source = open();
    source
        .commit(&batch_of(&[
            (DAY0, "r1", "p1", views(1)),
            (DAY0 + 5, "r2", "p2", views(4)),
        ]))
        .expect("commit");
    let before = snapshot(source.as_mut());
    let rows = vec![
        (
            Hour(DAY0),
            product("p1"),
            Metrics {
                views: 7,
                likes: 1,
                units: 0,
                sales: 0,
            },
        ),
        (Hour(DAY0 + 9), product("p3"), views(2)),
    ];
    source.replace_metrics(&rows).expect("replace");
    let after = snapshot(open().as_mut());
    assert_eq!(
        after.metrics,
        vec![
            (
                DAY0,
                "p1".into(),
                Metrics {
                    views: 7,
                    likes: 1,
                    units: 0,
                    sales: 0
                }
            ),
            (DAY0 + 9, "p3".into(), views(2))
        ]
    );
    assert_eq!((after.processed, after.log), (before.processed, before.log));
    source.replace_metrics(&[]).expect("replace with nothing");
    assert!(snapshot(source.as_mut()).metrics.is_empty());
}

/// Ids that a packed or text encoding could trip on (quotes, backslashes, brackets, separators spelled
/// out, a line separator, 128 bytes of two-byte characters) read back exactly after a reopen, with their
/// canonical bodies, and retention forgets exactly the old ones (issue 9, defect 1).
pub fn hostile_ids_round_trip_a_reopen(open: Factory<'_>) {
    let long = "é".repeat(64);
    let day0 = [
        "quote\"d",
        "back\\slash",
        "a\\nb",
        "[,]",
        "{\"id\":\"x\"}",
        long.as_str(),
    ];
    let day1 = ["\u{2028}sep\u{2029}", "tab\\t\u{a0}end", "€"];
    let events: Vec<TestEvent<'_>> = day0
        .iter()
        .map(|id| (DAY0 + 1, *id, "p1", views(1)))
        .chain(day1.iter().map(|id| (DAY0 + 25, *id, "p2", views(1))))
        .collect();
    let mut batch = batch_of(&events);
    for (_, id, body) in &mut batch.events {
        *body = serde_json::to_vec(&serde_json::json!({ "id": id.as_str() })).expect("canonical body");
    }
    let mut source = open();
    source.commit(&batch).expect("commit");
    let sorted = |ids: &[&str]| {
        let mut ids: Vec<String> = ids.iter().map(|id| (*id).to_owned()).collect();
        ids.sort();
        ids
    };
    let seen = snapshot(open().as_mut());
    assert_eq!(seen.processed, sorted(&[&day0[..], &day1[..]].concat()));
    let logged: Vec<(i64, Vec<u8>)> = batch
        .events
        .iter()
        .map(|(hour, _, body)| (hour.0, body.clone()))
        .collect();
    assert_eq!(
        seen.log, logged,
        "bodies come back byte for byte, in commit order"
    );
    let mut forgotten: Vec<String> = open()
        .evict(Hour(DAY0 + 24), Hour(0))
        .expect("evict")
        .into_iter()
        .map(|id| id.as_str().to_owned())
        .collect();
    forgotten.sort();
    assert_eq!(forgotten, sorted(&day0));
    assert_eq!(snapshot(open().as_mut()).processed, sorted(&day1));
}

/// Retention: at a day boundary exactly the older events and ids go (and are returned); metric rows
/// go by hour. At a cut inside a day, a backend may keep more (retention is a floor) but never less,
/// and whatever it reports forgotten is gone.
pub fn evict_drops_old_events_and_metrics(open: Factory<'_>) {
    let mut source = open();
    source
        .commit(&batch_of(&[
            (DAY0 + 1, "d0a", "p1", views(1)),
            (DAY0 + 23, "d0b", "p1", views(1)),
            (DAY0 + 24, "d1a", "p1", views(1)),
            (DAY0 + 48, "d2a", "p2", views(1)),
            (DAY0 + 60, "d2b", "p2", views(1)),
            (DAY0 + 72, "d3a", "p2", views(1)),
        ]))
        .expect("commit");
    let mut forgotten: Vec<String> = source
        .evict(Hour(DAY0 + 48), Hour(DAY0 + 24))
        .expect("evict")
        .into_iter()
        .map(|id| id.as_str().to_owned())
        .collect();
    forgotten.sort();
    assert_eq!(forgotten, vec!["d0a", "d0b", "d1a"]);
    let seen = snapshot(open().as_mut());
    assert_eq!(seen.processed, vec!["d2a", "d2b", "d3a"]);
    assert_eq!(
        seen.log.iter().map(|(h, _)| *h).collect::<Vec<_>>(),
        vec![DAY0 + 48, DAY0 + 60, DAY0 + 72]
    );
    assert_eq!(
        seen.metrics
            .iter()
            .map(|(h, p, _)| (*h, p.as_str()))
            .collect::<Vec<_>>(),
        vec![
            (DAY0 + 24, "p1"),
            (DAY0 + 48, "p2"),
            (DAY0 + 60, "p2"),
            (DAY0 + 72, "p2")
        ]
    );

    // A cut inside day 2: d3a must stay; d2a may go; whatever is reported is gone, the rest stays.
    let forgotten: BTreeSet<String> = source
        .evict(Hour(DAY0 + 55), Hour(DAY0 + 60))
        .expect("evict")
        .into_iter()
        .map(|id| id.as_str().to_owned())
        .collect();
    assert!(
        forgotten.iter().all(|id| id == "d2a"),
        "only d2a is older than the cut: {forgotten:?}"
    );
    let seen = snapshot(source.as_mut());
    let kept: BTreeSet<String> = seen.processed.iter().cloned().collect();
    assert!(
        kept.contains("d2b") && kept.contains("d3a"),
        "events after the cut must stay: {kept:?}"
    );
    assert_eq!(kept.len() + forgotten.len(), 3);
    assert_eq!(seen.log.len(), kept.len());
    assert_eq!(
        seen.metrics.iter().map(|(h, _, _)| *h).collect::<Vec<_>>(),
        vec![DAY0 + 60, DAY0 + 72]
    );
}

/// A commit the backend rejects leaves nothing behind: not its events, ids, metrics, memberships or
/// meta. `failing` must be a batch this backend rejects when applied after `setup`.
pub fn failed_commit_leaves_nothing(open: Factory<'_>, setup: &CommitBatch, failing: &CommitBatch) {
    let mut source = open();
    source.commit(setup).expect("setup commit");
    let before = snapshot(source.as_mut());
    assert!(
        source.commit_deduped(failing).is_err(),
        "the failing batch must be rejected"
    );
    assert_eq!(
        snapshot(source.as_mut()),
        before,
        "a rejected commit changed the store"
    );
    assert_eq!(
        snapshot(open().as_mut()),
        before,
        "a rejected commit is visible to a new handle"
    );
    // The handle still works after the failure.
    source
        .commit(&batch_of(&[(DAY0 + 7, "after-failure", "p9", views(1))]))
        .expect("commit after failure");
    assert!(snapshot(source.as_mut())
        .processed
        .contains(&"after-failure".to_owned()));
}

/// (Shared backends.) The database arbitrates: ids processed before, at any hour, are reported as not
/// counted, and only the new events' deltas and log rows are applied.
pub fn dedupe_by_database(open: Factory<'_>) {
    let mut source = open();
    let first = source.commit_deduped(&batch_of(&[
        (DAY0, "x1", "p1", views(1)),
        (DAY0 + 1, "x2", "p1", views(10)),
    ]));
    assert_eq!(first.expect("commit"), vec![true, true]);
    let second = source
        .commit_deduped(&batch_of(&[
            (DAY0, "x1", "p1", views(100)),       // same id, same hour
            (DAY0 + 40, "x2", "p1", views(1000)), // same id, another hour (and another day)
            (DAY0 + 1, "x3", "p2", views(5)),
            (DAY0 + 2, "x3", "p2", views(7)), // repeated within the batch: the first wins
        ]))
        .expect("commit");
    assert_eq!(second, vec![false, false, true, false]);
    let seen = snapshot(open().as_mut());
    assert_eq!(
        seen.metrics,
        vec![
            (DAY0, "p1".into(), views(1)),
            (DAY0 + 1, "p1".into(), views(10)),
            (DAY0 + 1, "p2".into(), views(5))
        ]
    );
    assert_eq!(seen.processed, vec!["x1", "x2", "x3"]);
    assert_eq!(seen.log.len(), 3);
    // Plain `commit` of an already processed id does not count it twice either.
    source
        .commit(&batch_of(&[(DAY0, "x1", "p1", views(1))]))
        .expect("commit");
    assert_eq!(
        snapshot(source.as_mut()).metrics[0],
        (DAY0, "p1".into(), views(1))
    );
}

/// (Shared backends.) Two handles commit overlapping ids from two threads at once, the same id
/// sometimes at different hours: every id is counted exactly once, by exactly one of them.
pub fn concurrent_duplicates_are_counted_once(open: Factory<'_>) {
    const BATCHES: usize = 20;
    const PER_BATCH: usize = 100;
    const IDS: usize = 600;
    let run = |instance: usize| {
        let mut source = open();
        let mut counted: Vec<(String, bool)> = Vec::new();
        for b in 0..BATCHES {
            let events: Vec<(i64, String, String)> = (0..PER_BATCH)
                .map(|i| {
                    // Both instances walk the same ids, offset and in different orders, so they collide.
                    let n = (b * PER_BATCH + i * 7 + instance * 131) % IDS;
                    let hour = DAY0 + (n % 5) as i64 * 11 + instance as i64 * (n % 2) as i64 * 30;
                    (hour, format!("c{n}"), format!("p{}", n % 13))
                })
                .collect();
            let refs: Vec<TestEvent<'_>> = events
                .iter()
                .map(|(h, id, p)| (*h, id.as_str(), p.as_str(), views(1)))
                .collect();
            let flags = source.commit_deduped(&batch_of(&refs)).expect("commit");
            counted.extend(
                events
                    .iter()
                    .zip(flags)
                    .map(|((_, id, _), flag)| (id.clone(), flag)),
            );
        }
        counted
    };
    let (a, b) = std::thread::scope(|scope| {
        let a = scope.spawn(|| run(0));
        let b = scope.spawn(|| run(1));
        (a.join().expect("instance 0"), b.join().expect("instance 1"))
    });
    let mut times_counted: BTreeMap<String, usize> = BTreeMap::new();
    let mut seen_ids = BTreeSet::new();
    let refused = a.iter().chain(&b).filter(|(_, flag)| !flag).count();
    assert!(refused > 0, "the workload must collide");
    for (id, flag) in a.into_iter().chain(b) {
        seen_ids.insert(id.clone());
        *times_counted.entry(id).or_default() += usize::from(flag);
    }
    assert!(
        times_counted.values().all(|&n| n == 1),
        "every id counted exactly once: {times_counted:?}"
    );
    let seen = snapshot(open().as_mut());
    assert_eq!(seen.processed, seen_ids.iter().cloned().collect::<Vec<_>>());
    assert_eq!(seen.log.len(), seen_ids.len());
    let mut per_product: BTreeMap<String, i64> = BTreeMap::new();
    for (_, product, m) in &seen.metrics {
        *per_product.entry(product.clone()).or_default() += m.views;
    }
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for id in &seen_ids {
        let n: usize = id[1..].parse().expect("numeric id");
        *expected.entry(format!("p{}", n % 13)).or_default() += 1;
    }
    assert_eq!(per_product, expected);
}
