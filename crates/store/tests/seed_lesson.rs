//! The seed lesson's own tests 1–7 (lesson 9, "Design Sales Ranking by Category"), as a floor for the
//! ranking engine. Each test names the lesson test it pins; the engine is driven through the real ingest
//! path (SQLite source of truth) and read like the HTTP API reads it.

use std::sync::Arc;

use parking_lot::RwLock;
use serde_json::json;

use rankgate_core::event::{Event, ParseLimits};
use rankgate_core::ids::{Category, CategoryOrAll, ProductId};
use rankgate_core::period::{Hour, Span, WindowLen, Zone};
use rankgate_core::ranker::{Policy, PopularWeights, RankerName};
use rankgate_store::ranking::engine::{EngineConfig, RankingEngine, RankingQuery};
use rankgate_store::ranking::ingest::{EventOutcome, IngestConfig, Ingestor};
use rankgate_store::ranking::recompute::BatchModel;
use rankgate_store::ranking::sqlite::SqliteSource;
use rankgate_zset::SortedSet;

const HOUR: i64 = 3_600_000;
const BASE: i64 = 1_783_641_600_000;

struct Fixture {
    _dir: tempfile::TempDir,
    ingestor: Ingestor,
    engine: Arc<RwLock<RankingEngine>>,
}

fn fixture(max_lateness_hours: i64) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(RwLock::new(RankingEngine::new(
        EngineConfig::default(),
        Policy::default(),
    )));
    let ingestor = Ingestor::open(
        Box::new(SqliteSource::open(dir.path()).unwrap()),
        engine.clone(),
        IngestConfig {
            max_lateness_millis: max_lateness_hours * HOUR,
        },
    )
    .unwrap();
    Fixture {
        _dir: dir,
        ingestor,
        engine,
    }
}

fn sale(id: &str, product: &str, hour: i64, quantity: u32, categories: &[&str]) -> Event {
    Event::from_json(
        &json!({ "id": id, "type": "payment_succeeded", "ts": BASE + hour * HOUR, "product_id": product,
                 "categories": categories, "quantity": quantity, "price": 100 }),
        &ParseLimits::at(BASE + 10_000 * HOUR),
    )
    .unwrap()
}

fn category(name: &str) -> CategoryOrAll {
    CategoryOrAll::Category(Category::parse(name).unwrap())
}

fn units_7d(end_hour: i64, cat: &CategoryOrAll) -> RankingQuery {
    RankingQuery {
        ranker: RankerName::Units,
        category: cat.clone(),
        span: Span::Window {
            len: WindowLen::D7,
            end: Hour::from_millis(BASE + end_hour * HOUR),
        },
    }
}

fn top(fixture: &Fixture, query: &RankingQuery, limit: usize) -> Vec<(String, f64)> {
    fixture
        .engine
        .write()
        .top(query, 0, limit)
        .items
        .iter()
        .map(|i| (i.product.to_string(), i.score))
        .collect()
}

#[test]
fn lesson_test_1_sorted_set_zincrby_zrevrange_zrevrank_and_ties_by_member() {
    let mut set = SortedSet::new();
    set.zincrby(b"a", 6.0).unwrap();
    set.zincrby(b"b", 4.0).unwrap();
    set.zincrby(b"b", 5.0).unwrap();
    set.zincrby(b"c", 5.0).unwrap();
    let descending: Vec<(&[u8], f64)> = set.range_by_rank(0, -1, true);
    assert_eq!(
        descending,
        vec![(&b"b"[..], 9.0), (&b"a"[..], 6.0), (&b"c"[..], 5.0)]
    );
    assert_eq!(set.zrevrank(b"c"), Some(2));
    set.zadd(b"d", 5.0, Default::default()).unwrap();
    // Redis orders equal scores by member, so REV returns them in reverse member order...
    assert_eq!(
        set.range_by_rank(2, 3, true),
        vec![(&b"d"[..], 5.0), (&b"c"[..], 5.0)]
    );
    // ...while rankgate's rankings store negated scores to list equal scores by product id ascending.
    let mut fixture = fixture(35 * 24);
    fixture
        .ingestor
        .ingest(&[sale("1", "d", 0, 5, &[]), sale("2", "c", 0, 5, &[])], BASE)
        .unwrap();
    assert_eq!(
        top(&fixture, &units_7d(1, &CategoryOrAll::All), 10),
        vec![("c".into(), 5.0), ("d".into(), 5.0)]
    );
}

#[test]
fn lesson_test_2_top_n_per_category_and_a_product_in_two_categories() {
    let mut fixture = fixture(35 * 24);
    fixture
        .ingestor
        .ingest(
            &[
                sale("1", "p1", 0, 3, &["toys", "gifts"]),
                sale("2", "p2", 0, 2, &["toys"]),
                sale("3", "p3", 0, 5, &["gifts"]),
            ],
            BASE,
        )
        .unwrap();
    assert_eq!(
        top(&fixture, &units_7d(1, &category("toys")), 10),
        vec![("p1".into(), 3.0), ("p2".into(), 2.0)]
    );
    assert_eq!(
        top(&fixture, &units_7d(1, &category("gifts")), 10),
        vec![("p3".into(), 5.0), ("p1".into(), 3.0)]
    );
}

#[test]
fn lesson_test_3_the_window_slides_and_old_hours_are_subtracted() {
    let mut fixture = fixture(35 * 24);
    fixture
        .ingestor
        .ingest(
            &[
                sale("1", "p1", 0, 4, &["toys"]),
                sale("2", "p2", 100, 1, &["toys"]),
            ],
            BASE,
        )
        .unwrap();
    assert_eq!(
        top(&fixture, &units_7d(100, &category("toys")), 10),
        vec![("p1".into(), 4.0), ("p2".into(), 1.0)]
    );
    // 168 hours after hour 0, hour 0 has left the 7-day window.
    assert_eq!(
        top(&fixture, &units_7d(168, &category("toys")), 10),
        vec![("p2".into(), 1.0)]
    );
}

#[test]
fn lesson_test_4_duplicates_are_ignored_and_events_older_than_the_limit_are_dropped() {
    let mut fixture = fixture(7 * 24);
    let outcomes = fixture
        .ingestor
        .ingest(
            &[
                sale("1", "p1", 200, 1, &[]),
                sale("1", "p1", 200, 1, &[]),
                sale("2", "p1", 10, 9, &[]),
            ],
            BASE,
        )
        .unwrap();
    assert_eq!(
        outcomes,
        vec![
            EventOutcome::Accepted,
            EventOutcome::Duplicate,
            EventOutcome::TooOld
        ]
    );
    let again = fixture
        .ingestor
        .ingest(&[sale("1", "p1", 200, 1, &[])], BASE)
        .unwrap();
    assert_eq!(
        again,
        vec![EventOutcome::Duplicate],
        "dedupe holds across batches"
    );
    assert_eq!(
        top(&fixture, &units_7d(200, &CategoryOrAll::All), 10),
        vec![("p1".into(), 1.0)]
    );
}

#[test]
fn lesson_test_5_a_late_sale_inside_the_window_is_counted() {
    let mut fixture = fixture(35 * 24);
    fixture
        .ingestor
        .ingest(&[sale("1", "p1", 50, 1, &["toys"])], BASE)
        .unwrap();
    let query = units_7d(50, &category("toys"));
    assert_eq!(top(&fixture, &query, 10), vec![("p1".into(), 1.0)]);
    fixture
        .ingestor
        .ingest(&[sale("2", "p2", 40, 3, &["toys"])], BASE)
        .unwrap(); // 10 hours late
    assert_eq!(
        top(&fixture, &query, 10),
        vec![("p2".into(), 3.0), ("p1".into(), 1.0)]
    );
}

#[test]
fn lesson_test_6_incremental_ranker_equals_the_batch_recompute_on_random_data() {
    // The exhaustive version is tests/ranking_recompute.rs; this is the lesson's demo shape at small scale.
    let mut fixture = fixture(35 * 24);
    let mut seed = 7u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let events: Vec<Event> = (0..3000)
        .map(|i| {
            let product = format!("p{}", (next() % 200).min(next() % 200));
            let cat = format!("cat{}", next() % 5);
            sale(
                &format!("s{}", next() % 2800),
                &product,
                (next() % 336) as i64,
                1 + (i % 3),
                &[&cat],
            )
        })
        .collect();
    for batch in events.chunks(100) {
        fixture.ingestor.ingest(batch, BASE).unwrap();
    }
    let (model, _) = BatchModel::from_stream(events, 35 * 24 * HOUR, Zone::utc(), PopularWeights::default());
    for c in 0..5 {
        let cat = category(&format!("cat{c}"));
        let query = units_7d(335, &cat);
        let served: Vec<(ProductId, f64)> = fixture
            .engine
            .write()
            .top(&query, 0, 10)
            .items
            .into_iter()
            .map(|i| (i.product, i.score))
            .collect();
        let expected: Vec<(ProductId, f64)> = model
            .ranking(RankerName::Units, &cat, &query.span)
            .into_iter()
            .take(10)
            .map(|i| (i.product, i.score))
            .collect();
        assert!(!expected.is_empty());
        assert_eq!(served, expected, "cat{c}");
    }
}

#[test]
fn lesson_test_7_backfill_from_raw_events_gives_the_same_top_n_as_the_live_ranker() {
    let dir = tempfile::tempdir().unwrap();
    let live_engine = Arc::new(RwLock::new(RankingEngine::new(
        EngineConfig::default(),
        Policy::default(),
    )));
    let mut live = Ingestor::open(
        Box::new(SqliteSource::open(dir.path()).unwrap()),
        live_engine.clone(),
        IngestConfig::default(),
    )
    .unwrap();
    let events: Vec<Event> = (0..600)
        .map(|i| {
            sale(
                &format!("s{i}"),
                &format!("p{}", i % 37),
                (i * 7 % 300) as i64,
                1,
                &["toys"],
            )
        })
        .collect();
    let query = units_7d(299, &category("toys"));
    // Live: small batches, with reads in between (the lesson's "flush before advance" bug lived here).
    for batch in events.chunks(13) {
        live.ingest(batch, BASE).unwrap();
        live_engine.write().top(&query, 0, 10);
    }
    // Backfill: every raw event in one go into a fresh data dir.
    let backfill_dir = tempfile::tempdir().unwrap();
    let backfill_engine = Arc::new(RwLock::new(RankingEngine::new(
        EngineConfig::default(),
        Policy::default(),
    )));
    let mut backfill = Ingestor::open(
        Box::new(SqliteSource::open(backfill_dir.path()).unwrap()),
        backfill_engine.clone(),
        IngestConfig::default(),
    )
    .unwrap();
    backfill.ingest(&events, BASE).unwrap();
    let live_top = live_engine.write().top(&query, 0, 10);
    let backfill_top = backfill_engine.write().top(&query, 0, 10);
    assert_eq!(live_top.items, backfill_top.items);
    assert_eq!(live_top.total, backfill_top.total);
}
