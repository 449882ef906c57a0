//! What the engine's unit tests share: ids and metrics in a line, a deterministic workload of events that
//! feeds both the engine and the batch recompute ([`BatchModel`]), and the comparisons the parts' tests
//! assert with: a served ranking against the recompute's, and one span state against another, bit for bit.
//!
//! The workload goes through `apply` the way ingest sends it (memberships, then deltas coalesced per
//! (hour, product)), in arrival order, so late events land in hours already summed.

use std::collections::{BTreeMap, BTreeSet};

use rankgate_core::event::{Event, EventKind, Payment};
use rankgate_core::ids::{Category, CategoryOrAll, EventId, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{Hour, PeriodKey, PeriodKind, Span, WindowLen, Zone};
use rankgate_core::ranker::{Policy, PopularWeights, RankerName};

use super::span_cache::{SpanKey, SpanState};
use super::{EngineConfig, RankingEngine, RankingQuery, RANKERS};
use crate::ranking::recompute::BatchModel;

/// 2026-07-10T00:00:00Z, a Friday: three days from here stay in one ISO week.
pub(super) const BASE_MILLIS: i64 = 1_783_641_600_000;

/// The first hour of the workloads: midnight UTC, the start of a day.
pub(super) fn base_hour() -> Hour {
    Hour::from_millis(BASE_MILLIS)
}

/// `base_hour() + offset`.
pub(super) fn hour(offset: i64) -> Hour {
    base_hour().plus(offset)
}

pub(super) fn product(id: &str) -> ProductId {
    ProductId::parse(id).expect("test product ids are valid")
}

pub(super) fn category(name: &str) -> Category {
    Category::parse(name).expect("test categories are valid")
}

pub(super) fn in_category(name: &str) -> CategoryOrAll {
    CategoryOrAll::Category(category(name))
}

pub(super) fn views(n: i64) -> Metrics {
    Metrics {
        views: n,
        ..Metrics::default()
    }
}

/// The day (UTC) `day` days after the base day.
pub(super) fn day(day: i64) -> Span {
    Span::Period(PeriodKey::containing(
        PeriodKind::Daily,
        hour(24 * day),
        &Zone::utc(),
    ))
}

/// The hourly period of `hour(offset)`.
pub(super) fn hourly(offset: i64) -> Span {
    Span::Period(PeriodKey::containing(
        PeriodKind::Hourly,
        hour(offset),
        &Zone::utc(),
    ))
}

/// The window of `len` ending with `hour(end)`.
pub(super) fn window(len: WindowLen, end: i64) -> Span {
    Span::Window { len, end: hour(end) }
}

pub(super) fn query(ranker: RankerName, category: CategoryOrAll, span: Span) -> RankingQuery {
    RankingQuery {
        ranker,
        category,
        span,
    }
}

/// An engine on UTC with the default `popular` policy and room for everything a test caches.
pub(super) fn engine() -> RankingEngine {
    engine_with(Policy::default(), 1_000_000)
}

pub(super) fn engine_with(policy: Policy, max_cached_members: usize) -> RankingEngine {
    RankingEngine::new(
        EngineConfig {
            zone: Zone::utc(),
            max_cached_members,
        },
        policy,
    )
}

/// The categories of the workloads, `all` first.
pub(super) fn workload_categories() -> Vec<CategoryOrAll> {
    let mut categories = vec![CategoryOrAll::All];
    categories.extend((0..4).map(|c| in_category(&format!("c{c}"))));
    categories
}

/// Spans over a three-day workload: each day (carry), an hour, windows and the week, so every kind of
/// span and the carry chain are exercised.
pub(super) fn workload_spans() -> Vec<Span> {
    vec![
        day(0),
        day(1),
        day(2),
        hourly(30),
        window(WindowLen::D1, 40),
        window(WindowLen::D7, 71),
        Span::Period(PeriodKey::containing(PeriodKind::Weekly, hour(0), &Zone::utc())),
    ]
}

/// Every ranker over every workload category, for each of `spans`.
pub(super) fn queries_over(spans: &[Span]) -> Vec<RankingQuery> {
    let mut queries = Vec::new();
    for span in spans {
        for category in workload_categories() {
            for ranker in RankerName::ALL {
                queries.push(query(ranker, category.clone(), *span));
            }
        }
    }
    queries
}

/// xorshift64: the same workload on every run and every machine.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// `count` events over `hours` hours from the base hour, in arrival order: hours drawn at random, so
/// most batches hold late events; 12 products, each event naming 0 to 2 of 4 categories (so products
/// gain categories midway); every kind, refunds and unlikes included.
pub(super) fn workload(seed: u64, count: usize, hours: i64) -> Vec<Event> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    (0..count)
        .map(|i| {
            let kind = EventKind::ALL[[0, 0, 0, 1, 1, 2, 3, 3, 4][rng.below(9) as usize]];
            let payment =
                matches!(kind, EventKind::PaymentSucceeded | EventKind::PaymentRefunded).then(|| Payment {
                    quantity: 1 + rng.below(3) as u32,
                    price: rng.below(5_000),
                });
            let categories: BTreeSet<Category> = (0..rng.below(3))
                .map(|_| category(&format!("c{}", rng.below(4))))
                .collect();
            Event {
                id: EventId::parse(&format!("e{seed}-{i}")).expect("valid id"),
                kind,
                ts_millis: hour(rng.below(hours as u64) as i64).start_millis()
                    + 60_000 * rng.below(60) as i64,
                product: product(&format!("p{}", rng.below(12))),
                categories: categories.into_iter().collect(),
                payment,
            }
        })
        .collect()
}

/// One `product_viewed` event at the start of `at`.
pub(super) fn view_event(id: &str, at: Hour, product_id: &str, categories: &[&str]) -> Event {
    Event {
        id: EventId::parse(id).expect("valid id"),
        kind: EventKind::ProductViewed,
        ts_millis: at.start_millis(),
        product: product(product_id),
        categories: categories
            .iter()
            .map(|c| category(c))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
        payment: None,
    }
}

/// Applies `events` as one committed micro-batch, as ingest does: new memberships, then the deltas
/// coalesced per (hour, product), zero sums left out.
pub(super) fn apply_events(engine: &mut RankingEngine, events: &[Event]) {
    let mut deltas: BTreeMap<(Hour, ProductId), Metrics> = BTreeMap::new();
    let mut memberships: BTreeSet<(ProductId, Category)> = BTreeSet::new();
    for event in events {
        let cell = deltas.entry((event.hour(), event.product.clone())).or_default();
        *cell = cell.checked_add(&event.metrics_delta()).expect("no overflow");
        memberships.extend(
            event
                .categories
                .iter()
                .map(|c| (event.product.clone(), c.clone())),
        );
    }
    let deltas: Vec<(Hour, ProductId, Metrics)> = deltas
        .into_iter()
        .filter(|(_, m)| !m.is_zero())
        .map(|((hour, product), m)| (hour, product, m))
        .collect();
    let memberships: Vec<(ProductId, Category)> = memberships.into_iter().collect();
    let as_of = events.iter().map(|e| e.ts_millis).max();
    engine.apply(&deltas, &memberships, as_of);
}

/// Applies `events` in batches of `batch` events.
pub(super) fn apply_in_batches(engine: &mut RankingEngine, events: &[Event], batch: usize) {
    for chunk in events.chunks(batch) {
        apply_events(engine, chunk);
    }
}

/// The batch recompute of `events` under `popular` (and the default `trending`).
pub(super) fn model_of(events: &[Event], popular: PopularWeights) -> BatchModel {
    BatchModel::from_accepted(events.iter().cloned(), Zone::utc(), popular)
}

/// Asserts that the engine serves `query` exactly as the recompute ranks it: same products in the same
/// order, same metrics, and scores and carry equal to the bit. Returns how many products are listed, so
/// a caller can check the comparison was not of two empty lists.
pub(super) fn assert_matches_model(
    engine: &mut RankingEngine,
    model: &BatchModel,
    query: &RankingQuery,
) -> usize {
    let served = engine.full_ranking(query);
    let expected = model.ranking(query.ranker, &query.category, &query.span);
    let label = format!("{} {} {:?}", query.ranker, query.category, query.span);
    assert_eq!(
        served.iter().map(|i| i.product.as_str()).collect::<Vec<_>>(),
        expected.iter().map(|i| i.product.as_str()).collect::<Vec<_>>(),
        "{label}: order"
    );
    for (s, e) in served.iter().zip(&expected) {
        assert_eq!(s.rank, e.rank, "{label}: rank of {}", e.product);
        assert_eq!(s.metrics, e.metrics, "{label}: metrics of {}", e.product);
        assert_eq!(
            s.score.to_bits(),
            e.score.to_bits(),
            "{label}: score of {}: {} vs {}",
            e.product,
            s.score,
            e.score
        );
        assert_eq!(
            s.carry.to_bits(),
            e.carry.to_bits(),
            "{label}: carry of {}",
            e.product
        );
    }
    served.len()
}

/// [`assert_matches_model`] for every query; returns the products listed across them all.
pub(super) fn assert_all_match_model(
    engine: &mut RankingEngine,
    model: &BatchModel,
    queries: &[RankingQuery],
) -> usize {
    queries
        .iter()
        .map(|q| assert_matches_model(engine, model, q))
        .sum()
}

/// A cached span as its product ids see it, so spans of two engines compare even when the engines
/// interned products in another order.
#[derive(Debug, PartialEq)]
pub(super) struct SpanByIds {
    pub(super) hours: std::ops::Range<Hour>,
    pub(super) metrics: BTreeMap<String, Metrics>,
    /// Carry bits per product.
    pub(super) carry: BTreeMap<String, u64>,
    /// Per ranker, (member, key bits) in set order.
    pub(super) rankings: [Vec<(Vec<u8>, u64)>; RANKERS],
}

/// `state` (a span of `engine`) by product ids.
pub(super) fn by_ids(engine: &RankingEngine, state: &SpanState) -> SpanByIds {
    let id = |p: &u32| engine.products.ids[*p as usize].as_str().to_string();
    SpanByIds {
        hours: state.hours.clone(),
        metrics: state.metrics.iter().map(|(p, m)| (id(p), *m)).collect(),
        carry: state.carry.iter().map(|(p, c)| (id(p), c.to_bits())).collect(),
        rankings: std::array::from_fn(|r| {
            state.rankings[r]
                .iter_from_rank(0)
                .map(|(member, key)| (member.to_vec(), key.to_bits()))
                .collect()
        }),
    }
}

/// The cached span of (`category`, `span`) by product ids; panics when it is not cached.
pub(super) fn cached_by_ids(engine: &RankingEngine, category: &CategoryOrAll, span: Span) -> SpanByIds {
    let key = SpanKey {
        category: engine
            .categories
            .lookup(category)
            .expect("a category the engine has seen"),
        span,
    };
    by_ids(engine, engine.spans.get(&key).expect("the span is cached"))
}
