//! The one conformance suite of [`ServingStore`]: whatever store answers a ranking read (the in-process
//! engine, Redis standalone, Redis Cluster), it answers what the plain batch recompute says — same products
//! in the same order (ties by product id, bytes ascending), scores bit for bit, metrics, carry, totals,
//! `asOf` and policy version — for first pages, middle pages, pages that run past the end or start past
//! it, ranks of listed, unlisted and unknown products; and a Top-N-only store truncates at its depth while
//! still reporting the full total. Compiled only into test binaries (`#[path]`-included).
//!
//! A backend's test builds a [`ServingFixture`] (events, an engine that ingested them, the recompute of
//! the same events), makes its store serve that engine's data (Redis: through the real publisher path,
//! `publication::take_publication` → `RedisServing::publish` → the pointer), and calls [`check_store`].
#![allow(dead_code)]

use std::sync::Arc;

use parking_lot::RwLock;

use rankgate_core::event::Event;
use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::period::{Hour, PeriodKey, PeriodKind, Span, WindowLen, Zone};
use rankgate_core::ranker::{Policy, PopularWeights, RankerName};
use rankgate_store::ranking::engine::{RankedItem, RankingEngine, RankingQuery};
use rankgate_store::ranking::ingest::Ingestor;
use rankgate_store::ranking::recompute::BatchModel;
use rankgate_store::ranking::serving_store::ServingStore;
use rankgate_store::ranking::sqlite::SqliteSource;

use super::workload::{assert_same, categories, ingestor_over, to_event, RawEvent, BASE, HOUR};

/// The `popular` policy version the fixture's engine serves (not 1, so a store that forgets to carry it
/// is caught).
pub const POPULAR_VERSION: u32 = 3;

/// Products the workload touches (`p0` … `p11`); `p99` never appears.
pub const PRODUCTS: u8 = 12;

/// Events, the engine that ingested them, and the recompute of the same events.
pub struct ServingFixture {
    /// Keeps the SQLite source of truth alive.
    _dir: tempfile::TempDir,
    ingestor: Ingestor,
    /// The engine, as `rankgate serve` has it.
    pub engine: Arc<RwLock<RankingEngine>>,
    events: Vec<Event>,
    next_id: u32,
}

/// The spans every store is asked about: each period kind, days with carry, every window, and a day
/// with no events at all.
pub fn spans(zone: &Zone) -> Vec<Span> {
    let mut spans: Vec<Span> = (0..3)
        .map(|day| {
            Span::Period(PeriodKey::containing(
                PeriodKind::Daily,
                Hour::from_millis(BASE + day * 24 * HOUR),
                zone,
            ))
        })
        .collect();
    spans.push(Span::Period(PeriodKey::containing(
        PeriodKind::Daily,
        Hour::from_millis(BASE + 20 * 24 * HOUR),
        zone,
    )));
    for (kind, hour) in [
        (PeriodKind::Hourly, 5),
        (PeriodKind::Weekly, 30),
        (PeriodKind::Monthly, 30),
    ] {
        spans.push(Span::Period(PeriodKey::containing(
            kind,
            Hour::from_millis(BASE + hour * HOUR),
            zone,
        )));
    }
    for len in WindowLen::ALL {
        spans.push(Span::Window {
            len,
            end: Hour::from_millis(BASE + 60 * HOUR),
        });
    }
    spans
}

/// Every (category, span) the suite reads, which is also what a Redis test publishes.
pub fn requests(zone: &Zone) -> Vec<(CategoryOrAll, Span)> {
    categories()
        .into_iter()
        .flat_map(|c| spans(zone).into_iter().map(move |s| (c.clone(), s)))
        .collect()
}

impl ServingFixture {
    /// A fresh engine that ingested the first batch of the workload.
    pub fn new() -> ServingFixture {
        let dir = tempfile::tempdir().unwrap();
        let (ingestor, engine) = ingestor_over(
            Box::new(SqliteSource::open(dir.path()).unwrap()),
            PopularWeights::default(),
            60 * 24 * HOUR,
        );
        // Ingest, carry and publication never look at the version; reads report it.
        let rebuilt = RankingEngine::rebuild_in_steps(
            &engine,
            RankerName::Popular,
            Policy {
                version: POPULAR_VERSION,
                weights: PopularWeights::default(),
            },
        );
        engine.write().install(rebuilt);
        let mut fixture = ServingFixture {
            _dir: dir,
            ingestor,
            engine,
            events: Vec::new(),
            next_id: 0,
        };
        fixture.ingest_batch(0);
        fixture
    }

    /// Ingests one more batch: views and likes spread over three days and four categories, with ties (the
    /// same counts on several products), payments, a refund, and an unlike.
    pub fn ingest_batch(&mut self, round: u32) {
        let mut raw = Vec::new();
        for i in 0..140u32 {
            let product = (i * 7 + round) % PRODUCTS as u32;
            raw.push(RawEvent {
                id: self.next_id + i,
                // Mostly views; every product gets the same number of views in some spans (ties).
                kind: match i % 10 {
                    0..=5 => 0,
                    6 | 7 => 1,
                    8 => 3,
                    _ => [2, 4][(i / 10 % 2) as usize],
                },
                hour_offset: ((i * 11) % 60) as i64,
                minute: (i % 60) as i64,
                product: product as u8,
                categories: vec![(product % 4) as u8],
                quantity: 1 + i % 3,
                price: 100 + (i as u64 * 37) % 900,
            });
        }
        self.next_id += raw.len() as u32;
        let events: Vec<Event> = raw.iter().map(to_event).collect();
        self.ingestor.ingest(&events, BASE).unwrap();
        self.events.extend(events);
    }

    /// What every store must answer for `query`: the full ranking by the batch recompute.
    pub fn expected(&self, query: &RankingQuery) -> Vec<RankedItem> {
        BatchModel::from_accepted(self.events.clone(), Zone::utc(), PopularWeights::default()).ranking(
            query.ranker,
            &query.category,
            &query.span,
        )
    }

    /// The `asOf` every answer must carry: the engine's newest ingest.
    pub fn as_of_millis(&self) -> Option<i64> {
        self.engine.read().as_of_millis()
    }
}

fn expected_version(ranker: RankerName) -> u32 {
    match ranker {
        RankerName::Popular => POPULAR_VERSION,
        RankerName::Units | RankerName::Revenue | RankerName::Trending => 1,
    }
}

fn product(n: u32) -> ProductId {
    ProductId::parse(&format!("p{n}")).unwrap()
}

/// Runs every check on `store`, which serves the data of `fixture` (at `store.depth()`), and returns the
/// rankers it declines. A store may decline a whole ranker (`Ok(None)`: "not served here", the reader
/// then asks the engine), but only `trending`, and then for every page and product of every span.
pub async fn check_store<S: ServingStore>(store: &S, fixture: &ServingFixture) -> Vec<RankerName> {
    let zone = Zone::utc();
    let depth = store.depth();
    let cap = depth.unwrap_or(usize::MAX);
    let as_of = fixture.as_of_millis();
    assert!(as_of.is_some(), "the fixture ingested events");
    let model = BatchModel::from_accepted(fixture.events.clone(), Zone::utc(), PopularWeights::default());
    let mut ties_seen = 0;
    let mut past_depth_seen = 0;
    let mut declined = Vec::new();
    for (category, span) in requests(&zone) {
        for ranker in RankerName::ALL {
            let query = RankingQuery {
                ranker,
                category: category.clone(),
                span,
            };
            let label = format!("{ranker} {category} {span:?}");
            let first = store
                .top_page(&query, 0, 1)
                .await
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            if first.is_none() || declined.contains(&ranker) {
                assert_eq!(
                    ranker,
                    RankerName::Trending,
                    "{label}: only trending may be declined"
                );
                assert!(first.is_none(), "{label}: declined elsewhere, served here");
                let rank = store
                    .rank_of(&query, &product(0))
                    .await
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                assert!(rank.is_none(), "{label}: pages declined, ranks served");
                if !declined.contains(&ranker) {
                    declined.push(ranker);
                }
                continue;
            }
            let want = model.ranking(ranker, &category, &span);
            let total = want.len();
            let shown = &want[..cap.min(total)];

            // The first page, far longer than the ranking.
            let page = store
                .top_page(&query, 0, 1_000)
                .await
                .unwrap_or_else(|e| panic!("{label}: {e}"))
                .unwrap_or_else(|| panic!("{label}: not served"));
            assert_eq!(page.total, total, "{label}: total");
            assert_eq!(
                page.policy_version,
                expected_version(ranker),
                "{label}: policy version"
            );
            assert_eq!(page.as_of_millis, as_of, "{label}: asOf");
            assert_same(&label, &page.items, shown).unwrap();
            ties_seen += want
                .windows(2)
                .filter(|pair| pair[0].score == pair[1].score)
                .count();
            for pair in page.items.windows(2) {
                if pair[0].score == pair[1].score {
                    assert!(
                        pair[0].product.as_str().as_bytes() < pair[1].product.as_str().as_bytes(),
                        "{label}: a tie is ordered by product id: {} before {}",
                        pair[0].product,
                        pair[1].product
                    );
                }
            }

            // Pages from the middle, running past the end, starting at and past the end.
            for (offset, limit) in [(1, 2), (total.saturating_sub(1), 5), (total, 3), (total + 10, 3)] {
                let page = store
                    .top_page(&query, offset, limit)
                    .await
                    .unwrap_or_else(|e| panic!("{label}: {e}"))
                    .unwrap_or_else(|| panic!("{label}: not served"));
                let start = offset.min(shown.len());
                let end = offset.saturating_add(limit).min(shown.len());
                assert_eq!(page.total, total, "{label} page {offset}+{limit}: total");
                assert_same(
                    &format!("{label} page {offset}+{limit}"),
                    &page.items,
                    &shown[start..end.max(start)],
                )
                .unwrap();
            }

            // Every product the workload touched, listed or not, and one it never touched.
            for n in (0..PRODUCTS as u32).chain([99]) {
                let product = product(n);
                let answer = store
                    .rank_of(&query, &product)
                    .await
                    .unwrap_or_else(|e| panic!("{label}: {e}"))
                    .unwrap_or_else(|| panic!("{label}: not served"));
                let position = want.iter().position(|item| item.product == product);
                let held = position.filter(|p| *p < cap);
                past_depth_seen += usize::from(position.is_some() && held.is_none());
                assert_eq!(answer.total, total, "{label}: total beside {product}");
                assert_eq!(
                    answer.policy_version,
                    expected_version(ranker),
                    "{label}: version"
                );
                assert_eq!(answer.as_of_millis, as_of, "{label}: asOf beside {product}");
                assert_eq!(answer.rank, held.map(|p| p + 1), "{label}: rank of {product}");
                match held {
                    Some(p) => {
                        assert_eq!(answer.score.map(f64::to_bits), Some(want[p].score.to_bits()));
                        assert_eq!(answer.metrics, want[p].metrics, "{label}: metrics of {product}");
                        assert_eq!(answer.carry.to_bits(), want[p].carry.to_bits());
                    }
                    None if position.is_none() => {
                        assert_eq!(answer.score, None, "{label}: unlisted {product} has no score");
                        assert_eq!(answer.carry, 0.0, "{label}: unlisted {product} has no carry");
                    }
                    // Past a Top-N depth: the store does not know the product's place.
                    None => assert_eq!(answer.score, None, "{label}: {product} past the depth"),
                }
            }

            // Every product the workload touched and one it never did, asked for in a scrambled order
            // (odd numbers descending, then even ones ascending), sorted in one call.
            let asked: Vec<ProductId> = (0..PRODUCTS as u32)
                .rev()
                .filter(|n| n % 2 == 1)
                .chain([99])
                .chain((0..PRODUCTS as u32).filter(|n| n % 2 == 0))
                .map(product)
                .collect();
            let sorted = store
                .sort_products(&query, &asked)
                .await
                .unwrap_or_else(|e| panic!("{label}: {e}"))
                .unwrap_or_else(|| panic!("{label}: sort not served"));
            assert_eq!(sorted.total, total, "{label}: sort total");
            assert_eq!(
                sorted.policy_version,
                expected_version(ranker),
                "{label}: sort version"
            );
            assert_eq!(sorted.as_of_millis, as_of, "{label}: sort asOf");
            let held_in_order: Vec<&RankedItem> = shown
                .iter()
                .filter(|item| asked.contains(&item.product))
                .collect();
            let unranked_in_asked_order: Vec<&ProductId> = asked
                .iter()
                .filter(|p| !held_in_order.iter().any(|item| item.product == **p))
                .collect();
            assert_eq!(
                sorted.items.len(),
                asked.len(),
                "{label}: one item per product asked"
            );
            for (item, want) in sorted.items.iter().zip(&held_in_order) {
                assert_eq!(item.product, want.product, "{label}: sorted order");
                assert_eq!(
                    item.rank,
                    Some(want.rank),
                    "{label}: sorted rank of {}",
                    want.product
                );
                assert_eq!(
                    item.score.map(f64::to_bits),
                    Some(want.score.to_bits()),
                    "{label}: score"
                );
                assert_eq!(
                    item.metrics, want.metrics,
                    "{label}: sorted metrics of {}",
                    want.product
                );
            }
            let unranked: Vec<&ProductId> = sorted.items[held_in_order.len()..]
                .iter()
                .map(|item| &item.product)
                .collect();
            assert_eq!(
                unranked, unranked_in_asked_order,
                "{label}: unranked last, in the order asked"
            );
            assert!(
                sorted.items[held_in_order.len()..]
                    .iter()
                    .all(|item| item.rank.is_none() && item.score.is_none()),
                "{label}: unranked items have no rank and no score"
            );
        }
    }
    assert!(ties_seen > 0, "the workload has ties to check");
    if depth.is_some() {
        assert!(past_depth_seen > 0, "the depth cuts some rankings");
    }
    declined
}
