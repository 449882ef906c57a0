//! What a Redis publication writes: the bookkeeping between the engine's spans and the serving store.
//!
//! The [`RankingEngine`] computes rankings and keeps, for every span a reader follows, a change log of
//! what it re-scored ([`RankingEngine::take_span_changes`]). This module turns those logs into
//! [`SpanPublication`]s, the writes [`RedisServing::publish`](super::redis_serving::RedisServing::publish)
//! applies:
//!
//! - a span the engine built since the last round (first publication, policy switch, rebuilt after
//!   eviction), and every span of a [`PublicationScope::Everything`] round (a rebuild into a fresh
//!   generation), goes out **whole**, replacing what the store holds;
//! - otherwise only the products re-scored since the last round go out, each with its current key per
//!   ranker (`None` once unlisted) and its detail: coalesced, one entry per product however many events
//!   touched it, and a view moves `popular` and the detail only. Unchanged spans are left out;
//! - with a Top-N depth `k` a changed span goes out as its top `k` per ranker, replacing the stored top,
//!   so products that fall out of the top are dropped and the ones that enter are written even when they
//!   did not change themselves.
//!
//! [`take_publication_in_slices`] takes the engine's write lock a few spans (one category's hot spans)
//! at a time, so ingest's applies interleave with a long publication, and builds a span that is not
//! cached yet (the first round, a new period, the current year: 8,760 hours) beforehand in short lock
//! holds ([`RankingEngine::build_span_in_steps`]), so no slice's hold includes a cold build.

use parking_lot::RwLock;

use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{Hour, Span, Zone};
use rankgate_core::ranker::RankerName;

use super::engine::{CachedSpan, RankingEngine, RankingQuery, SpanChanges};
use super::redis_serving::{hot_spans, PUBLISHED_RANKERS};

/// Per published ranker, in [`PUBLISHED_RANKERS`] order: (product, ascending key or `None` to remove).
pub type PublishedRankings = [Vec<(ProductId, Option<f64>)>; 3];
/// (product, metrics and carry, or `None` to forget the product).
pub type PublishedDetails = Vec<(ProductId, Option<(Metrics, f64)>)>;

/// One ranking span as the serving store must hold it after a publication.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanPublication {
    /// `all` or one category.
    pub category: CategoryOrAll,
    /// The span.
    pub span: Span,
    /// Replace what the store holds for this span (delete it, then write); otherwise apply as changes.
    pub replace: bool,
    /// The span was published before, so the store must still hold it: if it does not, the store lost
    /// data and needs a rebuild rather than this publication.
    pub existing: bool,
    /// Per ranker: the entries to write, in product id order for a change set.
    pub rankings: PublishedRankings,
    /// Listed products per ranker (the whole ranking, also when only its top is published).
    pub totals: [usize; 3],
    /// Per product: its metrics over the span and its popular carry, `None` to forget the product.
    pub details: PublishedDetails,
    /// Microseconds the engine spent bringing the span up to date (its flush: re-scores, carry) and
    /// reading this publication out of it, under its lock: with [`SpanPublication::writes`], what the
    /// span costs its publisher (the deal of span groups weighs both; `RedisServing::add_group_costs`).
    pub build_micros: u64,
}

impl SpanPublication {
    /// Member writes this publication makes (sorted-set entries plus detail entries).
    #[must_use]
    pub fn writes(&self) -> usize {
        self.rankings.iter().map(Vec::len).sum::<usize>() + self.details.len()
    }

    /// What publishing the span cost its publisher, in about microseconds of its CPU: the engine's work
    /// ([`SpanPublication::build_micros`]) plus a microsecond per member write for encoding and sending
    /// it. The engine's share is most of an instance's cost and does not follow the writes (a category's
    /// daily span recomputes a carry chain over every product of it), so weighing groups by writes alone
    /// left one of two instances with 60% more CPU than the other.
    #[must_use]
    pub fn publisher_cost(&self) -> u64 {
        self.build_micros + self.writes() as u64
    }
}

/// Which spans a publication round writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublicationScope {
    /// What changed since the last round, into the generation the store already serves.
    Changes,
    /// Every span whole: a rebuild into a fresh generation.
    Everything,
}

/// What a publication round covers: every hot span of `all` and of every category `engine` knows.
#[must_use]
pub fn hot_requests(engine: &RankingEngine, now_hour: Hour, zone: &Zone) -> Vec<(CategoryOrAll, Span)> {
    let spans = hot_spans(now_hour, zone);
    engine
        .categories()
        .into_iter()
        .flat_map(|category| spans.iter().map(move |span| (category.clone(), *span)))
        .collect()
}

/// One publication round over `spans` (see the module docs), under one hold of the engine: takes each
/// span's change log, so what it returns counts as published. Spans of a category the engine has never
/// seen are left out. `depth` is the Top-N-only depth, `None` when every member is served.
pub fn take_publication(
    engine: &mut RankingEngine,
    spans: &[(CategoryOrAll, Span)],
    depth: Option<usize>,
    scope: PublicationScope,
) -> Vec<SpanPublication> {
    let mut out = Vec::new();
    for (category, span) in spans {
        let started = std::time::Instant::now();
        let Some((changes, cached)) = engine.take_span_changes(category, *span) else {
            continue;
        };
        let rebuilt = changes == SpanChanges::Rebuilt;
        if scope == PublicationScope::Changes && changes.is_empty() {
            continue;
        }
        let (rankings, details) = match (scope, depth, changes) {
            (PublicationScope::Changes, None, SpanChanges::Rescored { rankings, details }) => {
                changes_of(&cached, rankings, details)
            }
            _ => whole(&cached, depth),
        };
        out.push(SpanPublication {
            category: category.clone(),
            span: *span,
            replace: scope == PublicationScope::Everything || depth.is_some() || rebuilt,
            existing: scope == PublicationScope::Changes && !rebuilt,
            rankings,
            totals: PUBLISHED_RANKERS.map(|ranker| cached.total(ranker)),
            details,
            build_micros: started.elapsed().as_micros() as u64,
        });
    }
    out
}

/// [`take_publication`] a few spans at a time, holding the engine's write lock for one slice only, so
/// the writer's applies interleave with a long publication instead of waiting for all of it. Spans
/// changed after their slice keep the change in their log and go out in the next round.
pub fn take_publication_in_slices(
    engine: &RwLock<RankingEngine>,
    spans: &[(CategoryOrAll, Span)],
    depth: Option<usize>,
    scope: PublicationScope,
) -> Vec<SpanPublication> {
    /// Spans per lock hold: one category's hot spans.
    const SLICE: usize = 8;
    let mut publications = Vec::new();
    for slice in spans.chunks(SLICE) {
        for (category, span) in slice {
            if !engine.read().is_span_cached(category, *span) {
                let query = RankingQuery {
                    ranker: RankerName::Popular,
                    category: category.clone(),
                    span: *span,
                };
                RankingEngine::build_span_in_steps(engine, &query);
            }
        }
        publications.extend(take_publication(&mut engine.write(), slice, depth, scope));
    }
    publications
}

/// A span's top `depth` per ranker (all of it when `None`), with the details of every product shown.
fn whole(cached: &CachedSpan<'_>, depth: Option<usize>) -> (PublishedRankings, PublishedDetails) {
    let rankings = PUBLISHED_RANKERS.map(|ranker| {
        cached
            .ranked(ranker)
            .take(depth.unwrap_or(usize::MAX))
            .map(|(product, key)| (product.clone(), Some(key)))
            .collect::<Vec<_>>()
    });
    let mut shown: Vec<&ProductId> = rankings.iter().flatten().map(|(product, _)| product).collect();
    shown.sort_unstable();
    shown.dedup();
    let details = shown
        .into_iter()
        .map(|product| (product.clone(), cached.detail(product)))
        .collect();
    (rankings, details)
}

/// The current keys and details of the products the change log names (already in product id order).
fn changes_of(
    cached: &CachedSpan<'_>,
    mut rankings: [Vec<ProductId>; RankerName::ALL.len()],
    details: Vec<ProductId>,
) -> (PublishedRankings, PublishedDetails) {
    let rankings = PUBLISHED_RANKERS.map(|ranker| {
        std::mem::take(&mut rankings[ranker.index()])
            .into_iter()
            .map(|product| {
                let key = cached.key(ranker, &product);
                (product, key)
            })
            .collect::<Vec<_>>()
    });
    let details = details
        .into_iter()
        .map(|product| {
            let detail = cached.detail(&product);
            (product, detail)
        })
        .collect();
    (rankings, details)
}
