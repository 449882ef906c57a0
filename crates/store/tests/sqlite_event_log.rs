//! The SQLite raw event log under hostile ids (issue 9, defect 1): rows written today are
//! length-prefixed, rows written by the old newline-joined encoding still load, dedupe and evict, and a
//! restart after hostile input shows the same state with nothing counted twice.

use std::path::Path;
use std::sync::Arc;

use parking_lot::RwLock;
use rusqlite::params;
use serde_json::json;

use rankgate_core::event::{Event, ParseLimits};
use rankgate_core::ranker::Policy;
use rankgate_store::ranking::engine::{EngineConfig, RankingEngine};
use rankgate_store::ranking::ingest::{EventOutcome, IngestConfig, Ingestor};
use rankgate_store::ranking::source::SourceOfTruth;
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

fn open_ingestor(dir: &Path) -> Ingestor {
    let engine = Arc::new(RwLock::new(RankingEngine::new(
        EngineConfig::default(),
        Policy::default(),
    )));
    Ingestor::open(
        Box::new(SqliteSource::open(dir).unwrap()),
        engine,
        IngestConfig {
            max_lateness_millis: 1000 * HOUR,
        },
    )
    .unwrap()
}

fn sorted_processed_ids(source: &mut dyn SourceOfTruth) -> Vec<String> {
    let mut ids: Vec<String> = source
        .load()
        .unwrap()
        .processed_ids
        .iter()
        .map(|id| id.as_str().to_owned())
        .collect();
    ids.sort();
    ids
}

fn stored_views(source: &mut dyn SourceOfTruth) -> i64 {
    source
        .load()
        .unwrap()
        .metrics
        .iter()
        .map(|(_, _, m)| m.views)
        .sum()
}

/// The canonical body the old code stored for an event with this id (it accepted any id then).
fn old_body(id: &str, hour: i64) -> String {
    serde_json::to_string(
        &json!({ "id": id, "type": "product_viewed", "ts": BASE + hour * HOUR,
                                   "product_id": "p1", "categories": [] }),
    )
    .unwrap()
}

/// A database as the old binary left it: `event_log` without a `format` column, ids and bodies
/// newline-joined, and the two hostile ids the issue reproduced (`"x\ny"`, `"w\n"`).
fn write_old_format_store(dir: &Path) {
    let connection = rusqlite::Connection::open(dir.join("rankings.sqlite3")).unwrap();
    connection
        .execute_batch(
            "CREATE TABLE event_log (hour INTEGER NOT NULL, seq INTEGER NOT NULL, ids TEXT NOT NULL,
                                     bodies BLOB NOT NULL, PRIMARY KEY (hour, seq)) WITHOUT ROWID;",
        )
        .unwrap();
    let hour0 = BASE / HOUR;
    let rows: [(i64, i64, &[&str]); 3] = [(0, 1, &["a", "b"]), (0, 2, &["x\ny", "z"]), (1, 3, &["w\n"])];
    for (hour, seq, ids) in rows {
        let bodies: Vec<String> = ids.iter().map(|id| old_body(id, hour)).collect();
        connection
            .execute(
                "INSERT INTO event_log (hour, seq, ids, bodies) VALUES (?1, ?2, ?3, ?4)",
                params![hour0 + hour, seq, ids.join("\n"), bodies.join("\n").into_bytes()],
            )
            .unwrap();
    }
}

#[test]
fn event_id_with_newline_in_an_old_format_log_still_loads_dedupes_and_evicts() {
    let dir = tempfile::tempdir().unwrap();
    write_old_format_store(dir.path());

    // Loads: the ids are exact, not the pieces of a newline split; the ids that today's rules refuse can
    // never arrive again, so they are not kept for dedupe.
    let mut source = SqliteSource::open(dir.path()).unwrap();
    assert_eq!(sorted_processed_ids(&mut source), ["a", "b", "z"]);
    let mut bodies = Vec::new();
    source
        .scan_event_log(&mut |_, body| bodies.push(String::from_utf8(body.to_vec()).unwrap()))
        .unwrap();
    assert_eq!(
        bodies,
        [
            old_body("a", 0),
            old_body("b", 0),
            old_body("x\ny", 0),
            old_body("z", 0),
            old_body("w\n", 1)
        ]
    );
    drop(source);

    // Dedupes: `a` and `z` were counted; `x`, `y` and `w` never were (the old split made `x` a duplicate).
    let mut ingestor = open_ingestor(dir.path());
    let outcomes = ingestor
        .ingest(
            &[
                view("a", 5),
                view("x", 5),
                view("y", 5),
                view("z", 5),
                view("w", 5),
            ],
            BASE,
        )
        .unwrap();
    use EventOutcome::{Accepted, Duplicate};
    assert_eq!(outcomes, [Duplicate, Accepted, Accepted, Duplicate, Accepted]);
    drop(ingestor);

    // New rows are length-prefixed; the old ones keep their marker.
    let connection = rusqlite::Connection::open(dir.path().join("rankings.sqlite3")).unwrap();
    let formats: Vec<(i64, i64)> = connection
        .prepare("SELECT hour - ?1, format FROM event_log ORDER BY hour, seq")
        .unwrap()
        .query_map(params![BASE / HOUR], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(formats, [(0, 0), (0, 0), (1, 0), (5, 1)]);
    drop(connection);

    // Evicts: retention over the old rows forgets exactly their ids, and the next start agrees.
    let mut source = SqliteSource::open(dir.path()).unwrap();
    let hour = |h: i64| rankgate_core::period::Hour::from_millis(BASE + h * HOUR);
    let mut forgotten: Vec<String> = source
        .evict(hour(2), hour(0))
        .unwrap()
        .iter()
        .map(|id| id.as_str().to_owned())
        .collect();
    forgotten.sort();
    assert_eq!(forgotten, ["a", "b", "z"]);
    drop(source);
    let mut source = SqliteSource::open(dir.path()).unwrap();
    assert_eq!(sorted_processed_ids(&mut source), ["w", "x", "y"]);
}

#[test]
fn hostile_ids_survive_a_restart_and_count_once() {
    let dir = tempfile::tempdir().unwrap();
    let hostile: Vec<String> = [
        "quote\"d",
        "back\\slash",
        "a\\nb",
        "[,]",
        "{\"id\":\"x\"}",
        "\u{2028}",
        "€",
        "a",
        "b",
    ]
    .iter()
    .map(|id| (*id).to_owned())
    .chain(["é".repeat(64), "x".repeat(128)])
    .collect();
    let events: Vec<Event> = hostile
        .iter()
        .enumerate()
        .map(|(i, id)| view(id, i as i64 % 3))
        .collect();
    let mut ingestor = open_ingestor(dir.path());
    let first = ingestor.ingest(&events, BASE).unwrap();
    assert!(first.iter().all(|o| *o == EventOutcome::Accepted), "{first:?}");
    drop(ingestor);

    for _restart in 0..2 {
        let mut source = SqliteSource::open(dir.path()).unwrap();
        let mut expected = hostile.clone();
        expected.sort();
        assert_eq!(sorted_processed_ids(&mut source), expected);
        assert_eq!(stored_views(&mut source), hostile.len() as i64);
        drop(source);
        let mut ingestor = open_ingestor(dir.path());
        assert_eq!(ingestor.processed_count(), hostile.len());
        let again = ingestor.ingest(&events, BASE).unwrap();
        assert!(again.iter().all(|o| *o == EventOutcome::Duplicate), "{again:?}");
    }
}
