//! Cold reads must not cost unbounded memory or stall ingest (issue 9, defect 3): every cached span counts
//! against `max_cached_members`, a cold span is built in short lock holds while batches keep landing, and
//! a span built that way equals the batch recompute.

#[path = "support/workload.rs"]
mod workload;

use std::sync::mpsc;
use std::sync::Arc;

use parking_lot::RwLock;
use proptest::prelude::*;

use rankgate_core::event::Event;
use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{Hour, PeriodKey, PeriodKind, Span, WindowLen, Zone};
use rankgate_core::ranker::{Policy, PopularWeights, RankerName};
use rankgate_store::ranking::engine::{
    BuildPhase, EngineConfig, RankingEngine, RankingQuery, SPAN_OVERHEAD_MEMBERS,
};
use rankgate_store::ranking::recompute::BatchModel;
use rankgate_store::ranking::sqlite::SqliteSource;
use workload::{
    assert_engine_equals_model, categories, ingestor_over, raw_event, to_event, RawEvent, BASE, HOUR,
};

fn query(category: CategoryOrAll, span: Span) -> RankingQuery {
    RankingQuery {
        ranker: RankerName::Popular,
        category,
        span,
    }
}

fn views(n: i64) -> Metrics {
    Metrics {
        views: n,
        ..Metrics::default()
    }
}

#[test]
fn empty_spans_count_against_the_cap_so_a_burst_of_distinct_cold_reads_stays_bounded() {
    let cap = 200;
    let engine = RwLock::new(RankingEngine::new(
        EngineConfig {
            zone: Zone::utc(),
            max_cached_members: cap,
        },
        Policy::default(),
    ));
    let product = ProductId::parse("p1").unwrap();
    engine
        .write()
        .apply(&[(Hour::from_millis(BASE), product, views(3))], &[], Some(BASE));
    // 5,000 distinct hourly spans, almost all empty, then daily ones (carry days count too).
    for hour in 0..5_000 {
        let span = Span::Period(PeriodKey::containing(
            PeriodKind::Hourly,
            Hour::from_millis(BASE + hour * HOUR),
            &Zone::utc(),
        ));
        RankingEngine::build_span_in_steps(&engine, &query(CategoryOrAll::All, span));
        let engine = engine.read();
        assert!(engine.cached_cost() <= cap, "{} > {cap}", engine.cached_cost());
        assert!(engine.cached_span_count() <= cap / SPAN_OVERHEAD_MEMBERS);
    }
    for day in 0..400 {
        let span = Span::Period(PeriodKey::containing(
            PeriodKind::Daily,
            Hour::from_millis(BASE + day * 24 * HOUR),
            &Zone::utc(),
        ));
        engine.write().top(&query(CategoryOrAll::All, span), 0, 10);
        assert!(
            engine.read().cached_cost() <= cap,
            "{}",
            engine.read().cached_cost()
        );
    }
}

#[test]
fn ingest_is_not_blocked_by_a_slow_cold_build() {
    let engine = Arc::new(RwLock::new(RankingEngine::new(
        EngineConfig::default(),
        Policy::default(),
    )));
    let hour = Hour::from_millis(BASE);
    let big: Vec<(Hour, ProductId, Metrics)> = (0..5_000)
        .map(|p| {
            (
                hour.plus(p % 48),
                ProductId::parse(&format!("p{p}")).unwrap(),
                views(1 + p % 7),
            )
        })
        .collect();
    engine.write().apply(&big, &[], Some(BASE));
    engine.write().set_build_cells_per_step(100);
    let span = Span::Window {
        len: WindowLen::D7,
        end: hour.plus(60),
    };

    // The builder stops in the middle of reading hours, and again while scoring off the lock; each time
    // the test applies a batch from this thread and only then lets the builder go on. If the build held
    // the engine lock, the apply could not complete and the builder would never be released.
    let (at_phase, phases) = mpsc::channel::<BuildPhase>();
    let (release, released) = mpsc::channel::<()>();
    let builder = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            let mut stopped = Vec::new();
            RankingEngine::build_span_in_steps_observed(&engine, &query(CategoryOrAll::All, span), |phase| {
                if !stopped.contains(&phase) {
                    stopped.push(phase);
                    at_phase.send(phase).unwrap();
                    released.recv().unwrap();
                }
            });
        })
    };
    let mut seen = Vec::new();
    for (i, phase) in phases.iter().enumerate() {
        let product = ProductId::parse(&format!("late{i}")).unwrap();
        let delta = [(hour.plus(i as i64), product, views(1_000))];
        let applied = engine
            .try_write_for(std::time::Duration::from_secs(30))
            .map(|mut engine| {
                engine.apply(&delta, &[], Some(BASE));
            });
        assert!(
            applied.is_some(),
            "an apply could not take the lock during {phase:?}"
        );
        seen.push(phase);
        release.send(()).unwrap();
    }
    builder.join().unwrap();
    assert_eq!(seen, [BuildPhase::Between, BuildPhase::Scoring]);

    // What was applied during the build is in the span, exactly as a build from scratch has it.
    let built = engine.write().full_ranking(&query(CategoryOrAll::All, span));
    engine.write().evict_cached_spans();
    let rebuilt = engine.write().full_ranking(&query(CategoryOrAll::All, span));
    assert_eq!(built, rebuilt);
    assert_eq!(built[0].product.as_str(), "late0");
    assert!(built.iter().any(|item| item.product.as_str() == "late1"));
}

fn spans(zone: &Zone) -> Vec<Span> {
    let mut spans: Vec<Span> = (-2..5)
        .map(|day| {
            Span::Period(PeriodKey::containing(
                PeriodKind::Daily,
                Hour::from_millis(BASE + day * 24 * HOUR),
                zone,
            ))
        })
        .collect();
    spans.push(Span::Period(PeriodKey::containing(
        PeriodKind::Weekly,
        Hour::from_millis(BASE + 50 * HOUR),
        zone,
    )));
    spans.push(Span::Window {
        len: WindowLen::D7,
        end: Hour::from_millis(BASE + 95 * HOUR),
    });
    spans
}

/// Builds every span in steps of one hour while the rest of the events arrive, one batch per step, then
/// compares every ranking with the batch recompute.
fn check_built_in_steps_while_ingesting_equals_recompute(
    raw: &[RawEvent],
    batch_size: usize,
    carry_top_n: u32,
) -> Result<(), TestCaseError> {
    let zone = Zone::utc();
    let weights = PopularWeights {
        carry_top_n,
        ..PopularWeights::default()
    };
    let lateness = 10_000 * HOUR;
    let dir = tempfile::tempdir().unwrap();
    let (mut ingestor, engine) = ingestor_over(
        Box::new(SqliteSource::open(dir.path()).unwrap()),
        weights,
        lateness,
    );
    engine.write().set_build_cells_per_step(1);
    let events: Vec<Event> = raw.iter().map(to_event).collect();
    let (first, rest) = events.split_at(events.len() / 2);
    ingestor.ingest(first, BASE).unwrap();
    let mut batches = rest.chunks(batch_size.max(1));
    for span in spans(&zone) {
        for category in categories() {
            RankingEngine::build_span_in_steps_observed(&engine, &query(category, span), |_| {
                if let Some(batch) = batches.next() {
                    ingestor.ingest(batch, BASE).unwrap();
                }
            });
        }
    }
    for batch in batches {
        ingestor.ingest(batch, BASE).unwrap();
    }
    let (model, _) = BatchModel::from_stream(events.clone(), lateness, zone.clone(), weights);
    assert_engine_equals_model(&engine, &model, &spans(&zone))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]

    #[test]
    fn a_span_built_in_steps_while_batches_land_equals_the_recompute(
        raw in proptest::collection::vec(raw_event(), 2..200),
        batch_size in 1usize..8,
        carry_top_n in 1u32..5,
    ) {
        check_built_in_steps_while_ingesting_equals_recompute(&raw, batch_size, carry_top_n)?;
    }
}
