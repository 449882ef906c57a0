//! Retention: raw events and processed ids, and metric rows, older than their limits are dropped from
//! the source of truth and from the engine, and a restart sees the same thing.

use std::sync::Arc;

use parking_lot::RwLock;
use serde_json::json;

use rankgate_core::event::{Event, ParseLimits};
use rankgate_core::ids::CategoryOrAll;
use rankgate_core::period::{Hour, Span, WindowLen};
use rankgate_core::ranker::{Policy, RankerName};
use rankgate_store::ranking::engine::{EngineConfig, RankingEngine, RankingQuery};
use rankgate_store::ranking::ingest::{EventOutcome, IngestConfig, Ingestor};
use rankgate_store::ranking::sqlite::SqliteSource;

const HOUR: i64 = 3_600_000;
const BASE: i64 = 1_783_641_600_000;

fn view(id: &str, hour: i64) -> Event {
    Event::from_json(
        &json!({ "id": id, "type": "product_viewed", "ts": BASE + hour * HOUR, "product_id": "p1" }),
        &ParseLimits::at(BASE + 1000 * HOUR),
    )
    .unwrap()
}

fn open(dir: &std::path::Path) -> (Ingestor, Arc<RwLock<RankingEngine>>) {
    let engine = Arc::new(RwLock::new(RankingEngine::new(
        EngineConfig::default(),
        Policy::default(),
    )));
    let ingestor = Ingestor::open(
        Box::new(SqliteSource::open(dir).unwrap()),
        engine.clone(),
        IngestConfig {
            max_lateness_millis: 1000 * HOUR,
        },
    )
    .unwrap();
    (ingestor, engine)
}

fn views_in_window(engine: &Arc<RwLock<RankingEngine>>) -> i64 {
    let query = RankingQuery {
        ranker: RankerName::Popular,
        category: CategoryOrAll::All,
        span: Span::Window {
            len: WindowLen::D30,
            end: Hour::from_millis(BASE + 200 * HOUR),
        },
    };
    engine
        .write()
        .top(&query, 0, 10)
        .items
        .iter()
        .map(|item| item.metrics.views)
        .sum()
}

#[test]
fn old_events_ids_and_metrics_are_dropped_everywhere_and_stay_dropped_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut ingestor, engine) = open(dir.path());
    let events: Vec<Event> = (0..100).map(|h| view(&format!("e{h}"), h * 2)).collect();
    ingestor.ingest(&events, BASE).unwrap();
    assert_eq!(views_in_window(&engine), 100);
    assert_eq!(ingestor.processed_count(), 100);

    // Raw events before hour 50 and metrics before hour 100 go.
    let forgotten = ingestor
        .evict(
            Hour::from_millis(BASE + 50 * HOUR),
            Hour::from_millis(BASE + 100 * HOUR),
        )
        .unwrap();
    assert_eq!(forgotten, 25, "hours 0, 2, … 48");
    assert_eq!(ingestor.processed_count(), 75);
    assert_eq!(views_in_window(&engine), 50, "hours 100, 102, … 198 remain");

    drop(ingestor);
    let (mut reopened, engine) = open(dir.path());
    assert_eq!(reopened.processed_count(), 75);
    assert_eq!(views_in_window(&engine), 50);
    // A retained id is still a duplicate after the restart.
    assert_eq!(
        reopened.ingest(&[view("e60", 120)], BASE).unwrap(),
        vec![EventOutcome::Duplicate]
    );
}
