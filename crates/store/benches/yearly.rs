//! What a yearly span costs the engine (issue 14) with `metric_retention` = 400 days of hourly rows
//! retained: its first read (built from the hourly table, like every span, in one lock hold here) and
//! keeping it current, i.e. the cost of one coalesced micro-batch of 1,000 (hour, product) deltas applied
//! and flushed with every hot span cached, with and without the current year among them.
//!
//! Workload: 10,000 products in 50 categories (each product in one), 150 active products per hour over
//! 400 × 24 hours = 1.44 M hourly cells, deterministic. Criterion reports time per read / per batch;
//! divide the batch by 1,000 for the per-delta cost.
#![allow(missing_docs)] // criterion_group! generates an undocumented public function.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

use rankgate_core::ids::{Category, CategoryOrAll, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{Hour, PeriodKey, PeriodKind, Span, WindowLen, Zone};
use rankgate_core::ranker::{Policy, RankerName};
use rankgate_store::ranking::engine::{EngineConfig, RankingEngine, RankingQuery};

const PRODUCTS: u64 = 10_000;
const CATEGORIES: u64 = 50;
const CELLS_PER_HOUR: u64 = 150;
const RETAINED_HOURS: i64 = 400 * 24;
const BATCH: u64 = 1_000;
/// 2026-11-30T12:00Z: the current year holds 334 days of the retained history.
const NOW: Hour = Hour(20_787 * 24 + 12);

fn product(n: u64) -> ProductId {
    ProductId::parse(&format!("sku-{n:05}")).unwrap()
}

fn cell(hour: i64, slot: u64) -> (Hour, ProductId, Metrics) {
    let n = (hour as u64)
        .wrapping_mul(7_919)
        .wrapping_add(slot.wrapping_mul(2_654_435_761))
        % PRODUCTS;
    let metrics = if slot.is_multiple_of(10) {
        Metrics {
            views: 3,
            units: 1,
            sales: 1_999,
            ..Metrics::default()
        }
    } else {
        Metrics {
            views: 1 + (slot % 4) as i64,
            likes: (slot % 2) as i64,
            ..Metrics::default()
        }
    };
    (Hour(hour), product(n), metrics)
}

/// An engine holding 400 days of hourly rows ending at [`NOW`].
fn retained_engine() -> RankingEngine {
    let mut engine = RankingEngine::new(
        EngineConfig {
            zone: Zone::utc(),
            max_cached_members: usize::MAX,
        },
        Policy::default(),
    );
    let memberships: Vec<(ProductId, Category)> = (0..PRODUCTS)
        .map(|n| {
            (
                product(n),
                Category::parse(&format!("c{}", n % CATEGORIES)).unwrap(),
            )
        })
        .collect();
    engine.apply(&[], &memberships, None);
    let first = NOW.0 - RETAINED_HOURS + 1;
    for day in 0..400 {
        let rows: Vec<_> = (first + day * 24..first + (day + 1) * 24)
            .flat_map(|hour| (0..CELLS_PER_HOUR).map(move |slot| cell(hour, slot)))
            .collect();
        engine.apply(&rows, &[], Some(NOW.start_millis()));
    }
    engine
}

fn query(span: Span) -> RankingQuery {
    RankingQuery {
        ranker: RankerName::Popular,
        category: CategoryOrAll::All,
        span,
    }
}

fn year() -> Span {
    Span::Period(PeriodKey::containing(PeriodKind::Yearly, NOW, &Zone::utc()))
}

/// The hot spans of `all` and of one category (what the Redis publisher keeps current), optionally
/// without the year.
fn hot(with_year: bool) -> Vec<RankingQuery> {
    let zone = Zone::utc();
    let kinds = PeriodKind::ALL
        .into_iter()
        .filter(|kind| with_year || *kind != PeriodKind::Yearly);
    let spans: Vec<Span> = kinds
        .map(|kind| Span::Period(PeriodKey::containing(kind, NOW, &zone)))
        .chain(WindowLen::ALL.map(|len| Span::Window { len, end: NOW }))
        .collect();
    let mut queries = Vec::new();
    for span in spans {
        queries.push(query(span));
        queries.push(RankingQuery {
            category: CategoryOrAll::Category(Category::parse("c7").unwrap()),
            ..query(span)
        });
    }
    queries
}

fn first_reads(c: &mut Criterion) {
    let mut engine = retained_engine();
    let mut group = c.benchmark_group("first_read_400_days_retained");
    group.sample_size(10);
    let month = Span::Period(PeriodKey::containing(PeriodKind::Monthly, NOW, &Zone::utc()));
    for (name, span) in [("yearly", year()), ("monthly", month)] {
        for category in [
            CategoryOrAll::All,
            CategoryOrAll::Category(Category::parse("c7").unwrap()),
        ] {
            let query = RankingQuery {
                category: category.clone(),
                ..query(span)
            };
            group.bench_function(format!("{name}_{category}"), |b| {
                b.iter(|| {
                    engine.evict_cached_spans();
                    engine.top(&query, 0, 20).total
                })
            });
        }
    }
    group.finish();
}

fn keeping_current(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply_and_flush_1000_deltas_hot_spans_cached");
    group.sample_size(20);
    group.throughput(Throughput::Elements(BATCH));
    for with_year in [false, true] {
        let mut engine = retained_engine();
        let hot = hot(with_year);
        for query in &hot {
            engine.top(query, 0, 20);
        }
        let mut round = 0u64;
        let name = if with_year {
            "with_yearly"
        } else {
            "without_yearly"
        };
        group.bench_function(name, |b| {
            b.iter_batched(
                || {
                    round += 1;
                    (0..BATCH)
                        .map(|slot| cell(NOW.0, slot + round * BATCH))
                        .collect::<Vec<_>>()
                },
                |deltas| {
                    engine.apply(&deltas, &[], Some(NOW.start_millis()));
                    engine.flush_all();
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, first_reads, keeping_current);
criterion_main!(benches);
