//! Random ranking workloads and the helpers the incremental-equals-recompute tests share: event
//! generation, ranking comparison, and an ingestor over any source of truth.
#![allow(dead_code)]

use std::sync::Arc;

use parking_lot::RwLock;
use proptest::prelude::*;
use serde_json::json;

use rankgate_core::event::{Event, ParseLimits};
use rankgate_core::ids::{Category, CategoryOrAll};
use rankgate_core::period::{Span, Zone};
use rankgate_core::ranker::{Policy, PopularWeights, RankerName};
use rankgate_store::ranking::engine::{EngineConfig, RankedItem, RankingEngine, RankingQuery};
use rankgate_store::ranking::ingest::{IngestConfig, Ingestor};
use rankgate_store::ranking::recompute::BatchModel;
use rankgate_store::ranking::source::SourceOfTruth;

pub const HOUR: i64 = 3_600_000;
/// 2026-07-10T00:00:00Z: a Friday, so the workload spans two ISO weeks and a month.
pub const BASE: i64 = 1_783_641_600_000;

#[derive(Debug, Clone)]
pub struct RawEvent {
    pub id: u32,
    pub kind: u8,
    pub hour_offset: i64,
    pub minute: i64,
    pub product: u8,
    pub categories: Vec<u8>,
    pub quantity: u32,
    pub price: u64,
}

pub fn raw_event() -> impl Strategy<Value = RawEvent> {
    (
        0u32..400,
        0u8..5,
        prop_oneof![8 => 0i64..96, 1 => -400i64..0],
        0i64..60,
        0u8..12,
        proptest::collection::vec(0u8..4, 0..3),
        1u32..4,
        0u64..5000,
    )
        .prop_map(
            |(id, kind, hour_offset, minute, product, categories, quantity, price)| RawEvent {
                id,
                kind,
                hour_offset,
                minute,
                product,
                categories,
                quantity,
                price,
            },
        )
}

pub fn to_event(raw: &RawEvent) -> Event {
    let kinds = [
        "product_viewed",
        "product_liked",
        "product_unliked",
        "payment_succeeded",
        "payment_refunded",
    ];
    let mut value = json!({
        "id": format!("e{}", raw.id),
        "type": kinds[raw.kind as usize],
        "ts": BASE + raw.hour_offset * HOUR + raw.minute * 60_000,
        "product_id": format!("p{}", raw.product),
        "categories": raw.categories.iter().map(|c| format!("c{c}")).collect::<Vec<_>>(),
    });
    if raw.kind >= 3 {
        value["quantity"] = json!(raw.quantity);
        value["price"] = json!(raw.price);
    }
    Event::from_json(&value, &ParseLimits::at(BASE + 1000 * HOUR)).expect("generated events are valid")
}

pub fn categories() -> Vec<CategoryOrAll> {
    let mut all = vec![CategoryOrAll::All];
    all.extend((0..4).map(|c| CategoryOrAll::Category(Category::parse(&format!("c{c}")).unwrap())));
    all
}

pub fn assert_same(label: &str, served: &[RankedItem], expected: &[RankedItem]) -> Result<(), TestCaseError> {
    prop_assert_eq!(served.len(), expected.len(), "{}: list lengths differ", label);
    for (s, e) in served.iter().zip(expected) {
        prop_assert_eq!(
            &s.product,
            &e.product,
            "{}: order differs at rank {}",
            label,
            e.rank
        );
        prop_assert_eq!(s.rank, e.rank);
        prop_assert_eq!(s.metrics, e.metrics, "{}: metrics of {}", label, e.product);
        prop_assert_eq!(
            s.score.to_bits(),
            e.score.to_bits(),
            "{}: score of {}: {} vs {}",
            label,
            e.product,
            s.score,
            e.score
        );
        prop_assert_eq!(
            s.carry.to_bits(),
            e.carry.to_bits(),
            "{}: carry of {}",
            label,
            e.product
        );
    }
    Ok(())
}

/// An ingestor over `source` with a fresh engine, as `rankgate serve` builds them.
pub fn ingestor_over(
    source: Box<dyn SourceOfTruth>,
    weights: PopularWeights,
    lateness: i64,
) -> (Ingestor, Arc<RwLock<RankingEngine>>) {
    let engine = Arc::new(RwLock::new(RankingEngine::new(
        EngineConfig {
            zone: Zone::utc(),
            max_cached_members: 1_000_000,
        },
        Policy { version: 1, weights },
    )));
    let ingestor = Ingestor::open(
        source,
        engine.clone(),
        IngestConfig {
            max_lateness_millis: lateness,
        },
    )
    .unwrap();
    (ingestor, engine)
}

/// Every ranking of every ranker and category over `spans`, as the engine serves it, equals the batch
/// recompute's.
pub fn assert_engine_equals_model(
    engine: &RwLock<RankingEngine>,
    model: &BatchModel,
    spans: &[Span],
) -> Result<(), TestCaseError> {
    let mut engine = engine.write();
    for span in spans {
        for category in categories() {
            for ranker in RankerName::ALL {
                let query = RankingQuery {
                    ranker,
                    category: category.clone(),
                    span: *span,
                };
                let served = engine.full_ranking(&query);
                let expected = model.ranking(ranker, &category, span);
                assert_same(&format!("{ranker} {category} {span:?}"), &served, &expected)?;
            }
        }
    }
    Ok(())
}
