//! Incremental equals recompute: random workloads with duplicates, out-of-order and late events,
//! refunds and unlikes go through the real ingest path (SQLite source of truth + engine) in random
//! micro-batches, with reads in between so cached spans are updated incrementally, not rebuilt. Every
//! (ranker, category, span) is then compared with the plain batch recompute, and again after a restart.
//! Products are delisted and relisted through the catalogue between batches (SPEC 1.5): the recompute
//! leaves out the products delisted at the end, the engine must agree after every flip it applied in
//! place, and the restart must keep the flags.

#[path = "support/workload.rs"]
mod workload;

use std::sync::Arc;

use parking_lot::RwLock;
use proptest::prelude::*;

use rankgate_core::event::Event;
use rankgate_core::ids::CategoryOrAll;
use rankgate_core::ids::ProductId;
use rankgate_core::period::{Hour, PeriodKey, PeriodKind, Span, WindowLen, Zone};
use rankgate_core::ranker::{Policy, PopularWeights, RankerName};
use rankgate_store::ranking::catalog::CatalogUpdate;
use rankgate_store::ranking::engine::{RankingEngine, RankingQuery};
use rankgate_store::ranking::ingest::{EventOutcome, Ingestor};
use rankgate_store::ranking::recompute::BatchModel;
use rankgate_store::ranking::sqlite::SqliteSource;
use rankgate_testkit::postgres_schemas::{postgres_url, SchemaGuard};
use workload::{
    assert_engine_equals_model, categories, ingestor_over, raw_event, to_event, RawEvent, BASE, HOUR,
};

fn spans(zone: &Zone) -> Vec<Span> {
    let mut spans = Vec::new();
    for day in -2..5 {
        spans.push(Span::Period(PeriodKey::containing(
            PeriodKind::Daily,
            Hour::from_millis(BASE + day * 24 * HOUR),
            zone,
        )));
    }
    for hour in [0, 5, 30, 95] {
        spans.push(Span::Period(PeriodKey::containing(
            PeriodKind::Hourly,
            Hour::from_millis(BASE + hour * HOUR),
            zone,
        )));
    }
    for kind in [PeriodKind::Weekly, PeriodKind::Monthly, PeriodKind::Yearly] {
        spans.push(Span::Period(PeriodKey::containing(
            kind,
            Hour::from_millis(BASE + 50 * HOUR),
            zone,
        )));
    }
    for (len, end) in [
        (WindowLen::H1, 20),
        (WindowLen::D1, 40),
        (WindowLen::D7, 95),
        (WindowLen::D30, 95),
    ] {
        spans.push(Span::Window {
            len,
            end: Hour::from_millis(BASE + end * HOUR),
        });
    }
    spans
}

fn open(
    dir: &std::path::Path,
    weights: PopularWeights,
    lateness: i64,
) -> (Ingestor, Arc<RwLock<RankingEngine>>) {
    ingestor_over(Box::new(SqliteSource::open(dir).unwrap()), weights, lateness)
}

/// A product of the workload (`p0` … `p11`).
fn workload_product(n: u8) -> ProductId {
    ProductId::parse(&format!("p{n}")).unwrap()
}

/// Stores `listed` for product `n` through the catalogue, as `PUT /v1/products/{id}` does.
fn set_listed(ingestor: &mut Ingestor, n: u8, listed: bool) {
    ingestor
        .put_catalog(&[(
            workload_product(n),
            CatalogUpdate {
                listed: Some(listed),
                ..CatalogUpdate::default()
            },
        )])
        .unwrap();
}

/// The products delisted once every flip, in order, has been applied.
fn delisted_after(flips: &[(u8, bool)]) -> Vec<ProductId> {
    let mut last = std::collections::BTreeMap::new();
    for (n, listed) in flips {
        last.insert(*n, *listed);
    }
    last.into_iter()
        .filter(|(_, listed)| !listed)
        .map(|(n, _)| workload_product(n))
        .collect()
}

/// The property itself, for any backend: ingest in random micro-batches with reads in between and a
/// listing flip after each of the first batches (`flips[i]` after batch `i`), compare every ranking and
/// the outcome counts with the batch recompute, then reopen (`open` again, i.e. a restart rebuilt from
/// the source of truth alone) and compare again.
fn check_incremental_equals_recompute(
    open: &dyn Fn() -> (Ingestor, Arc<RwLock<RankingEngine>>),
    raw: &[RawEvent],
    batch_sizes: &[usize],
    flips: &[(u8, bool)],
    weights: PopularWeights,
    lateness: i64,
) -> Result<(), TestCaseError> {
    let zone = Zone::utc();
    let (mut ingestor, engine) = open();
    let events: Vec<Event> = raw.iter().map(to_event).collect();
    let mut outcomes = Vec::new();
    let mut rest = &events[..];
    let mut sizes = batch_sizes.iter().cycle();
    let mut pending_flips = flips.iter();
    while !rest.is_empty() {
        let size = (*sizes.next().unwrap()).min(rest.len());
        let (batch, tail) = rest.split_at(size);
        outcomes.extend(ingestor.ingest(batch, BASE).unwrap());
        rest = tail;
        if let Some((n, listed)) = pending_flips.next() {
            set_listed(&mut ingestor, *n, *listed);
        }
        // Read a few rankings between batches so later batches update cached spans in place.
        let mut engine = engine.write();
        for span in spans(&zone).into_iter().step_by(3) {
            let popular = RankingQuery {
                ranker: RankerName::Popular,
                category: CategoryOrAll::All,
                span,
            };
            engine.top(&popular, 0, 3);
            let units = RankingQuery {
                ranker: RankerName::Units,
                category: categories()[1].clone(),
                span,
            };
            engine.top(&units, 0, 3);
        }
    }
    for (n, listed) in pending_flips {
        set_listed(&mut ingestor, *n, *listed);
    }
    let (model, counts) = BatchModel::from_stream(events.clone(), lateness, zone.clone(), weights);
    let model = model.with_delisted(delisted_after(flips));
    let count = |wanted: EventOutcome| outcomes.iter().filter(|o| **o == wanted).count();
    prop_assert_eq!(
        (
            count(EventOutcome::Accepted),
            count(EventOutcome::Duplicate),
            count(EventOutcome::TooOld)
        ),
        (counts.accepted, counts.duplicates, counts.too_old)
    );
    compare_everything(&engine, &model, &zone)?;

    // Restart: a fresh engine rebuilt from the source of truth answers exactly the same.
    drop(ingestor);
    let (_reopened, engine) = open();
    compare_everything(&engine, &model, &zone)
}

fn compare_everything(
    engine: &Arc<RwLock<RankingEngine>>,
    model: &BatchModel,
    zone: &Zone,
) -> Result<(), TestCaseError> {
    assert_engine_equals_model(engine, model, &spans(zone))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn incremental_equals_recompute(
        raw in proptest::collection::vec(raw_event(), 1..300),
        batch_sizes in proptest::collection::vec(1usize..60, 1..20),
        flips in proptest::collection::vec((0u8..12, any::<bool>()), 0..8),
        carry_top_n in 1u32..6,
    ) {
        let weights = PopularWeights { carry_top_n, ..PopularWeights::default() };
        // Small lateness so some late events are dropped as tooOld.
        let lateness = 72 * HOUR;
        let dir = tempfile::tempdir().unwrap();
        check_incremental_equals_recompute(
            &|| open(dir.path(), weights, lateness),
            &raw,
            &batch_sizes,
            &flips,
            weights,
            lateness,
        )?;
    }
}

#[test]
fn a_policy_switch_rebuilds_every_cached_span_under_the_new_weights() {
    let zone = Zone::utc();
    let dir = tempfile::tempdir().unwrap();
    let (mut ingestor, engine) = open(dir.path(), PopularWeights::default(), 35 * 24 * HOUR);
    let raw: Vec<RawEvent> = (0..200)
        .map(|i| RawEvent {
            id: i,
            kind: (i % 5) as u8,
            hour_offset: (i as i64 * 7) % 90,
            minute: 1,
            product: (i % 9) as u8,
            categories: vec![(i % 3) as u8],
            quantity: 1 + i % 3,
            price: 100 + i as u64,
        })
        .collect();
    let events: Vec<Event> = raw.iter().map(to_event).collect();
    ingestor.ingest(&events, BASE).unwrap();
    for span in spans(&zone) {
        engine.write().top(
            &RankingQuery {
                ranker: RankerName::Popular,
                category: CategoryOrAll::All,
                span,
            },
            0,
            5,
        );
    }
    let new_weights = PopularWeights {
        view: 1.0,
        like: 0.0,
        sales: 2.0,
        carry_ratio: 0.5,
        carry_top_n: 3,
        ..PopularWeights::default()
    };
    let rebuilt = RankingEngine::rebuild_in_steps(
        &engine,
        RankerName::Popular,
        Policy {
            version: 2,
            weights: new_weights,
        },
    );
    engine.write().install(rebuilt);
    assert_eq!(engine.read().policy().version, 2);
    let model = BatchModel::from_accepted(events, zone.clone(), new_weights);
    compare_everything(&engine, &model, &zone).unwrap();
}

#[test]
fn a_policy_switch_built_in_steps_while_batches_land_equals_the_recompute() {
    let zone = Zone::utc();
    let dir = tempfile::tempdir().unwrap();
    let (mut ingestor, engine) = open(dir.path(), PopularWeights::default(), 35 * 24 * HOUR);
    let events: Vec<Event> = (0..400u32)
        .map(|i| RawEvent {
            id: i,
            kind: (i % 5) as u8,
            hour_offset: (i as i64 * 11) % 90,
            minute: 2,
            product: (i % 13) as u8,
            categories: vec![(i % 4) as u8],
            quantity: 1 + i % 3,
            price: 100 + u64::from(i),
        })
        .map(|raw| to_event(&raw))
        .collect();
    let (before, during) = events.split_at(150);
    ingestor.ingest(before, BASE).unwrap();
    for span in spans(&zone) {
        for category in categories() {
            let query = RankingQuery {
                ranker: RankerName::Popular,
                category,
                span,
            };
            engine.write().top(&query, 0, 5);
        }
    }
    engine.write().set_rebuild_spans_per_step(1);
    let new_weights = PopularWeights {
        view: 0.5,
        like: 3.0,
        sales: 1.0,
        carry_ratio: 0.25,
        carry_top_n: 2,
        ..PopularWeights::default()
    };
    // One chunk of the remaining events lands between every two steps, and the rest after the last one.
    let mut chunks = during.chunks(10);
    let mut steps = 0;
    let rebuilt = RankingEngine::rebuild_in_steps_observed(
        &engine,
        RankerName::Popular,
        Policy {
            version: 2,
            weights: new_weights,
        },
        || {
            steps += 1;
            if let Some(chunk) = chunks.next() {
                ingestor.ingest(chunk, BASE).unwrap();
            }
            // A delisting in the middle of the build: spans already rebuilt still rank p3.
            if steps == 3 {
                set_listed(&mut ingestor, 3, false);
            }
        },
    );
    for chunk in chunks {
        ingestor.ingest(chunk, BASE).unwrap();
    }
    assert!(
        steps > 5,
        "the rebuild took {steps} steps: batches must land in the middle of it"
    );
    engine.write().install(rebuilt);
    assert_eq!(engine.read().policy().version, 2);
    let model =
        BatchModel::from_accepted(events, zone.clone(), new_weights).with_delisted([workload_product(3)]);
    compare_everything(&engine, &model, &zone).unwrap();
}

#[test]
fn a_delisted_product_leaves_every_ranking_and_its_carry_place_and_relisting_restores_it() {
    let zone = Zone::utc();
    let dir = tempfile::tempdir().unwrap();
    let weights = PopularWeights {
        carry_top_n: 2,
        ..PopularWeights::default()
    };
    let (mut ingestor, engine) = open(dir.path(), weights, 35 * 24 * HOUR);
    // p0 leads every day by far, so it holds a carry place until it is delisted.
    let events: Vec<Event> = (0..300u32)
        .map(|i| RawEvent {
            id: i,
            kind: if i % 3 == 0 { 3 } else { 0 },
            hour_offset: (i as i64 * 13) % 90,
            minute: 3,
            product: if i % 2 == 0 { 0 } else { (i % 7) as u8 },
            categories: vec![(i % 2) as u8],
            quantity: 1,
            price: 500,
        })
        .map(|raw| to_event(&raw))
        .collect();
    ingestor.ingest(&events, BASE).unwrap();
    let model = BatchModel::from_accepted(events.clone(), zone.clone(), weights);
    compare_everything(&engine, &model, &zone).unwrap();
    let day = Span::Period(PeriodKey::containing(
        PeriodKind::Daily,
        Hour::from_millis(BASE + 30 * HOUR),
        &zone,
    ));
    let query = RankingQuery {
        ranker: RankerName::Popular,
        category: CategoryOrAll::All,
        span: day,
    };
    let before = engine.write().full_ranking(&query);
    assert_eq!(before[0].product, workload_product(0));
    assert!(before[0].carry > 0.0, "p0 carries over from the day before");

    set_listed(&mut ingestor, 0, false);
    let delisted = model.clone().with_delisted([workload_product(0)]);
    compare_everything(&engine, &delisted, &zone).unwrap();
    let after = engine.write().full_ranking(&query);
    // (Its carry place goes to the next product of the day before, which may list one product more.)
    assert!(after.iter().all(|item| item.product != workload_product(0)));
    assert!(
        after.iter().enumerate().all(|(i, item)| item.rank == i + 1),
        "ranks close up"
    );
    assert_eq!(after[0].product, before[1].product);
    let rank = engine.write().rank(&query, &workload_product(0));
    assert_eq!((rank.rank, rank.score), (None, None));
    assert_eq!(rank.total, after.len());
    // Its metrics keep counting while it is delisted.
    let more: Vec<Event> = (1000..1010u32)
        .map(|i| RawEvent {
            id: i,
            kind: 0,
            hour_offset: 30,
            minute: 4,
            product: 0,
            categories: vec![0],
            quantity: 1,
            price: 1,
        })
        .map(|raw| to_event(&raw))
        .collect();
    ingestor.ingest(&more, BASE).unwrap();
    let all_events: Vec<Event> = events.iter().chain(&more).cloned().collect();
    let model = BatchModel::from_accepted(all_events, zone.clone(), weights);
    compare_everything(
        &engine,
        &model.clone().with_delisted([workload_product(0)]),
        &zone,
    )
    .unwrap();

    set_listed(&mut ingestor, 0, true);
    compare_everything(&engine, &model, &zone).unwrap();
    let relisted = engine.write().full_ranking(&query);
    assert_eq!(relisted[0].product, workload_product(0));
    assert_eq!(relisted[0].metrics.views, before[0].metrics.views + 10);
}

// ---------------------------------------------------------------------------------------------------
// The same random workloads with PostgreSQL as the source of truth (one schema per case, dropped at the
// end). Fewer cases: every case is a few hundred round trips to a real server.

fn open_postgres(
    schema: &SchemaGuard,
    weights: PopularWeights,
    lateness: i64,
) -> (Ingestor, Arc<RwLock<RankingEngine>>) {
    let source = rankgate_store::ranking::postgres::PostgresSource::connect(&postgres_url(), &schema.0)
        .unwrap_or_else(|e| panic!("PostgreSQL at {} must be reachable: {e}", postgres_url()));
    ingestor_over(Box::new(source), weights, lateness)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, .. ProptestConfig::default() })]

    #[test]
    fn incremental_equals_recompute_on_postgres(
        raw in proptest::collection::vec(raw_event(), 1..300),
        batch_sizes in proptest::collection::vec(1usize..60, 1..20),
        flips in proptest::collection::vec((0u8..12, any::<bool>()), 0..8),
        carry_top_n in 1u32..6,
    ) {
        let weights = PopularWeights { carry_top_n, ..PopularWeights::default() };
        let lateness = 72 * HOUR;
        let schema = SchemaGuard::unique("rgrecompute");
        check_incremental_equals_recompute(
            &|| open_postgres(&schema, weights, lateness),
            &raw,
            &batch_sizes,
            &flips,
            weights,
            lateness,
        )?;
    }
}

// ---------------------------------------------------------------------------------------------------
// `trending`: its scores depend on the span's end hour E, which for a running period is the engine's
// current hour. The clock moves between batches (hour turns drop the running spans, rebuilt in steps as
// the refresher does), late and out-of-order events land in hours already scored, and reads keep spans
// cached so most changes are applied incrementally. Every ranking (trending and the others) must equal
// the batch recompute at the final hour, bit for bit, and again after a restart.

/// The engine of `open`, on `trending` with `half_life_hours` and the clock at `now`.
fn open_trending(
    open: &dyn Fn() -> (Ingestor, Arc<RwLock<RankingEngine>>),
    trending: PopularWeights,
    now: Hour,
) -> (Ingestor, Arc<RwLock<RankingEngine>>) {
    let (ingestor, engine) = open();
    {
        let mut engine = engine.write();
        engine.set_trending_policy(Policy {
            version: 1,
            weights: trending,
        });
        engine.advance_to_hour(now);
    }
    (ingestor, engine)
}

/// Moves the clock the way the server's refresher does: spans whose E moved are rebuilt in steps.
fn advance_like_the_refresher(engine: &RwLock<RankingEngine>, now: Hour) {
    let dropped = engine.write().advance_to_hour(now);
    for query in &dropped {
        RankingEngine::build_span_in_steps(engine, query);
    }
}

fn check_trending_incremental_equals_recompute(
    open: &dyn Fn() -> (Ingestor, Arc<RwLock<RankingEngine>>),
    raw: &[RawEvent],
    batch_sizes: &[usize],
    clock_steps: &[i64],
    half_life_hours: f64,
) -> Result<(), TestCaseError> {
    let zone = Zone::utc();
    let lateness = 72 * HOUR;
    let trending = PopularWeights {
        half_life_hours,
        ..PopularWeights::trending_default()
    };
    // The clock starts inside the workload's days, so daily, weekly and monthly periods are running.
    let mut now = Hour::from_millis(BASE + 10 * HOUR);
    let (mut ingestor, engine) = open_trending(open, trending, now);
    engine.write().set_build_cells_per_step(7);
    let events: Vec<Event> = raw.iter().map(to_event).collect();
    let mut rest = &events[..];
    let mut sizes = batch_sizes.iter().cycle();
    let mut steps = clock_steps.iter().cycle();
    while !rest.is_empty() {
        let size = (*sizes.next().unwrap()).min(rest.len());
        let (batch, tail) = rest.split_at(size);
        ingestor.ingest(batch, BASE).unwrap();
        rest = tail;
        now = now.plus(*steps.next().unwrap());
        advance_like_the_refresher(&engine, now);
        // Reads between batches keep spans cached, so later batches re-score products in place.
        let mut engine = engine.write();
        for (i, span) in spans(&zone).into_iter().enumerate() {
            let query = RankingQuery {
                ranker: RankerName::Trending,
                category: categories()[i % 3].clone(),
                span,
            };
            engine.top(&query, 0, 3);
        }
    }
    let (model, _) =
        BatchModel::from_stream(events.clone(), lateness, zone.clone(), PopularWeights::default());
    let model = model.with_trending(trending).at_hour(now);
    compare_everything(&engine, &model, &zone)?;
    // At least one ranking is a running period, so E really was the moving clock.
    let running = spans(&zone)
        .into_iter()
        .any(|span| span.trending_end(&zone, now) == now && span.hours(&zone).end > now.plus(1));
    prop_assert!(running || now > Hour::from_millis(BASE + 200 * HOUR));

    drop(ingestor);
    let (_reopened, engine) = open_trending(open, trending, now);
    compare_everything(&engine, &model, &zone)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn trending_incremental_equals_recompute_across_hour_turns(
        raw in proptest::collection::vec(raw_event(), 1..300),
        batch_sizes in proptest::collection::vec(1usize..60, 1..20),
        clock_steps in proptest::collection::vec(prop_oneof![3 => Just(0i64), 3 => Just(1i64), 1 => 2i64..30], 1..10),
        half_life_hours in prop_oneof![Just(24.0), 1.0f64..100.0],
    ) {
        let lateness = 72 * HOUR;
        let dir = tempfile::tempdir().unwrap();
        check_trending_incremental_equals_recompute(
            &|| open(dir.path(), PopularWeights::default(), lateness),
            &raw,
            &batch_sizes,
            &clock_steps,
            half_life_hours,
        )?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, .. ProptestConfig::default() })]

    #[test]
    fn trending_incremental_equals_recompute_on_postgres(
        raw in proptest::collection::vec(raw_event(), 1..300),
        batch_sizes in proptest::collection::vec(1usize..60, 1..20),
        clock_steps in proptest::collection::vec(0i64..3, 1..10),
    ) {
        let lateness = 72 * HOUR;
        let schema = SchemaGuard::unique("rgrecompute");
        check_trending_incremental_equals_recompute(
            &|| open_postgres(&schema, PopularWeights::default(), lateness),
            &raw,
            &batch_sizes,
            &clock_steps,
            24.0,
        )?;
    }
}

#[test]
fn a_trending_policy_switch_built_while_batches_land_equals_the_recompute() {
    let zone = Zone::utc();
    let dir = tempfile::tempdir().unwrap();
    let now = Hour::from_millis(BASE + 50 * HOUR);
    let (mut ingestor, engine) = open_trending(
        &|| open(dir.path(), PopularWeights::default(), 35 * 24 * HOUR),
        PopularWeights::trending_default(),
        now,
    );
    let events: Vec<Event> = (0..400u32)
        .map(|i| RawEvent {
            id: i,
            kind: (i % 5) as u8,
            hour_offset: (i as i64 * 11) % 90,
            minute: 2,
            product: (i % 13) as u8,
            categories: vec![(i % 4) as u8],
            quantity: 1 + i % 3,
            price: 100 + u64::from(i),
        })
        .map(|raw| to_event(&raw))
        .collect();
    let (before, during) = events.split_at(150);
    ingestor.ingest(before, BASE).unwrap();
    for span in spans(&zone) {
        for category in categories() {
            let query = RankingQuery {
                ranker: RankerName::Trending,
                category,
                span,
            };
            engine.write().top(&query, 0, 5);
        }
    }
    engine.write().set_rebuild_spans_per_step(1);
    let new_weights = PopularWeights {
        view: 0.5,
        like: 3.0,
        sales: 1.0,
        half_life_hours: 6.0,
        ..PopularWeights::trending_default()
    };
    let mut chunks = during.chunks(10);
    let rebuilt = RankingEngine::rebuild_in_steps_observed(
        &engine,
        RankerName::Trending,
        Policy {
            version: 2,
            weights: new_weights,
        },
        || {
            if let Some(chunk) = chunks.next() {
                ingestor.ingest(chunk, BASE).unwrap();
            }
        },
    );
    for chunk in chunks {
        ingestor.ingest(chunk, BASE).unwrap();
    }
    engine.write().install(rebuilt);
    assert_eq!(engine.read().policy_version(RankerName::Trending), 2);
    assert_eq!(
        engine.read().policy_version(RankerName::Popular),
        1,
        "popular is untouched"
    );
    let model = BatchModel::from_accepted(events, zone.clone(), PopularWeights::default())
        .with_trending(new_weights)
        .at_hour(now);
    compare_everything(&engine, &model, &zone).unwrap();
}
