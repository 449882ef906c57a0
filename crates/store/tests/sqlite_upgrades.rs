//! Data directories written before the SQLite schemas became numbered migrations (issue 26) keep
//! working, for both embedded databases: the rankings source of truth (`rankings.sqlite3`) and the queue
//! store (`queue.sqlite3`).
//!
//! The fixtures are the inline schemas older builds created, copied table by table from their source (the
//! commit that introduced each shape is named). For every shape the column probes of those builds
//! handled, a test creates a database exactly as such a build's open left it, puts rows in every table,
//! opens it with today's code, and checks that the rows read back, that the new columns hold what the
//! probes used to give them, that the version is current, and that the schema is now the one a new
//! database gets. A last test per store holds a new database to the schema the last inline build gave.
//!
//! Not covered, because no probe ever handled it: the very first rankings layout (`fb1fc98`, one
//! `event_log` row per event keyed by `(hour, id)`), which today's code could not open either.

use std::path::Path;
use std::sync::Arc;

use rankgate_core::ids::MemberId;
use rankgate_core::job::{JobRecord, RetryPolicy};
use rankgate_core::queue::{DrawSeed, MemberStatus, QueueName};
use rankgate_core::ranker::{PopularWeights, RankerName};
use rankgate_store::clock::ManualClock;
use rankgate_store::queue::draw::DrawRecord;
use rankgate_store::queue::embedded::{EmbeddedOptions, EmbeddedStore, DATABASE_FILE};
use rankgate_store::queue::{JobStore, QueueStore};
use rankgate_store::ranking::source::SourceOfTruth;
use rankgate_store::ranking::sqlite::SqliteSource;
use rusqlite::{params, Connection};

// ---------------------------------------------------------------------------------------------------
// Comparing schemas
// ---------------------------------------------------------------------------------------------------

/// Every table's kind (rowid or not, strict or not), columns (name, declared type, not-null, default,
/// key position) and indexes, from SQLite's pragmas: what a query can tell apart.
fn schema_shape(connection: &Connection) -> Vec<String> {
    let mut shape = Vec::new();
    let tables: Vec<(String, String)> = connection
        .prepare(
            "SELECT name, type, ncol, wr, strict FROM pragma_table_list
             WHERE schema = 'main' AND name NOT LIKE 'sqlite_%' ORDER BY name",
        )
        .unwrap()
        .query_map([], |row| {
            let name: String = row.get(0)?;
            let kind = format!(
                "{} {name} ncol={} without_rowid={} strict={}",
                row.get::<_, String>(1)?,
                row.get::<_, i64>(2)?,
                row.get::<_, i64>(3)?,
                row.get::<_, i64>(4)?
            );
            Ok((name, kind))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for (table, kind) in tables {
        shape.push(kind);
        let mut columns = connection
            .prepare("SELECT cid, name, type, \"notnull\", dflt_value, pk FROM pragma_table_info(?1)")
            .unwrap();
        let columns = columns
            .query_map([&table], |row| {
                Ok(format!(
                    "  column {} {} {} notnull={} default={:?} pk={}",
                    row.get::<_, i64>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, i64>(3)?,
                    row.get::<_, Option<String>>(4)?,
                    row.get::<_, i64>(5)?
                ))
            })
            .unwrap();
        shape.extend(columns.map(Result::unwrap));
        let indexes: Vec<(String, i64, String)> = connection
            .prepare("SELECT name, \"unique\", origin FROM pragma_index_list(?1) ORDER BY name")
            .unwrap()
            .query_map([&table], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for (index, unique, origin) in indexes {
            let columns: Vec<String> = connection
                .prepare("SELECT name FROM pragma_index_info(?1) ORDER BY seqno")
                .unwrap()
                .query_map([&index], |row| row.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            shape.push(format!(
                "  index {index} unique={unique} origin={origin} ({})",
                columns.join(", ")
            ));
        }
    }
    shape
}

/// `sqlite_master`'s `CREATE` texts by name. With `ignore_whitespace`, blanks are dropped: a column
/// added by `ALTER TABLE` lands in the text on the line of the column before it rather than on its own.
fn create_statements(connection: &Connection, ignore_whitespace: bool) -> Vec<(String, String)> {
    connection
        .prepare("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name")
        .unwrap()
        .query_map([], |row| {
            let sql: String = row.get(1)?;
            let sql = if ignore_whitespace {
                sql.split_whitespace().collect()
            } else {
                sql
            };
            Ok((row.get(0)?, sql))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn user_version(connection: &Connection) -> i64 {
    connection
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap()
}

fn has_column(connection: &Connection, table: &str, column: &str) -> bool {
    connection
        .prepare("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")
        .unwrap()
        .exists([table, column])
        .unwrap()
}

// ---------------------------------------------------------------------------------------------------
// The rankings source of truth
// ---------------------------------------------------------------------------------------------------

/// `event_log` with one row per (hour, batch), before rows were marked with their format (`4cdb250`).
const EVENT_LOG_BATCHED: &str = "
CREATE TABLE IF NOT EXISTS event_log (
    hour   INTEGER NOT NULL,
    seq    INTEGER NOT NULL,
    ids    TEXT    NOT NULL,
    bodies BLOB    NOT NULL,
    PRIMARY KEY (hour, seq)
) WITHOUT ROWID;";
/// ... and with the `format` marker (`f843988`).
const EVENT_LOG_WITH_FORMAT: &str = "
CREATE TABLE IF NOT EXISTS event_log (
    hour   INTEGER NOT NULL,
    seq    INTEGER NOT NULL,
    ids    TEXT    NOT NULL,
    bodies BLOB    NOT NULL,
    format INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, seq)
) WITHOUT ROWID;";
/// Unchanged since the first build.
const METRICS_HOURLY: &str = "
CREATE TABLE IF NOT EXISTS metrics_hourly (
    hour    INTEGER NOT NULL,
    product TEXT    NOT NULL,
    views   INTEGER NOT NULL,
    likes   INTEGER NOT NULL,
    units   INTEGER NOT NULL,
    sales   INTEGER NOT NULL,
    PRIMARY KEY (hour, product)
) WITHOUT ROWID;";
/// Packed metric cells (`77fc3fa`).
const PACKED_METRICS: &str = "
CREATE TABLE IF NOT EXISTS metric_deltas (
    seq      INTEGER PRIMARY KEY,
    max_hour INTEGER NOT NULL,
    cells    INTEGER NOT NULL,
    blob     BLOB    NOT NULL
);
CREATE TABLE IF NOT EXISTS metrics_packed (
    hour  INTEGER PRIMARY KEY,
    cells INTEGER NOT NULL,
    blob  BLOB    NOT NULL
);";
/// Unchanged since the first build.
const CATEGORIES_AND_POLICIES: &str = "
CREATE TABLE IF NOT EXISTS product_categories (
    product  TEXT NOT NULL,
    category TEXT NOT NULL,
    PRIMARY KEY (product, category)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS policies (
    ranker  TEXT    NOT NULL,
    version INTEGER NOT NULL,
    weights TEXT    NOT NULL,
    PRIMARY KEY (ranker, version)
);";
/// `ranker_state` before policy versions were fleet state.
const RANKER_STATE_PLAIN: &str = "
CREATE TABLE IF NOT EXISTS ranker_state (
    ranker           TEXT PRIMARY KEY,
    active_version   INTEGER NOT NULL,
    previous_version INTEGER,
    latest_version   INTEGER NOT NULL
);";
/// ... and after (`58cd399`).
const RANKER_STATE_VERSIONED: &str = "
CREATE TABLE IF NOT EXISTS ranker_state (
    ranker           TEXT PRIMARY KEY,
    active_version   INTEGER NOT NULL,
    previous_version INTEGER,
    latest_version   INTEGER NOT NULL,
    building_version INTEGER,
    state_seq        INTEGER NOT NULL DEFAULT 0
);";
/// `catalog` before products could be delisted.
const CATALOG_PLAIN: &str = "
CREATE TABLE IF NOT EXISTS catalog (
    product TEXT PRIMARY KEY,
    body    TEXT NOT NULL
);";
/// ... and after (`4da4581`).
const CATALOG_LISTED: &str = "
CREATE TABLE IF NOT EXISTS catalog (
    product TEXT PRIMARY KEY,
    body    TEXT NOT NULL,
    listed  INTEGER NOT NULL DEFAULT 1
);";
/// Unchanged since the first build.
const META: &str = "
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);";

/// The `SCHEMA` of each build that changed it, in its order (its probes added nothing to a database it
/// created itself, so this is what its open left).
fn rankings_schema_of(build: RankingsBuild) -> Vec<&'static str> {
    use RankingsBuild::*;
    let event_log = if build == BatchedLog {
        EVENT_LOG_BATCHED
    } else {
        EVENT_LOG_WITH_FORMAT
    };
    let ranker_state = if matches!(build, BatchedLog | FormatMarker) {
        RANKER_STATE_PLAIN
    } else {
        RANKER_STATE_VERSIONED
    };
    let catalog = if matches!(build, BatchedLog | FormatMarker | FleetPolicies) {
        CATALOG_PLAIN
    } else {
        CATALOG_LISTED
    };
    let mut schema = vec![event_log, METRICS_HOURLY];
    if build == PackedMetrics {
        schema.push(PACKED_METRICS);
    }
    schema.extend([CATEGORIES_AND_POLICIES, ranker_state, catalog, META]);
    schema
}

/// The rankings schemas older builds created, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RankingsBuild {
    /// `4cdb250`: batch rows in the raw log, newline-joined.
    BatchedLog,
    /// `f843988`: the raw log's `format` column.
    FormatMarker,
    /// `58cd399`: `ranker_state.building_version` and `state_seq`.
    FleetPolicies,
    /// `4da4581`: `catalog.listed`.
    Delisting,
    /// `77fc3fa`: `metric_deltas` and `metrics_packed`; the last inline schema.
    PackedMetrics,
}

const RANKINGS_BUILDS: [RankingsBuild; 5] = [
    RankingsBuild::BatchedLog,
    RankingsBuild::FormatMarker,
    RankingsBuild::FleetPolicies,
    RankingsBuild::Delisting,
    RankingsBuild::PackedMetrics,
];

const HOUR_MS: i64 = 3_600_000;
/// 2026-07-10T00:00:00Z, in hours.
const HOUR0: i64 = 1_783_641_600_000 / HOUR_MS;

fn old_event_body(id: &str) -> String {
    serde_json::json!({ "id": id, "type": "product_viewed", "ts": HOUR0 * HOUR_MS, "product_id": "p1",
                        "categories": [] })
    .to_string()
}

/// A rankings database as `build` left it, with rows in every table.
fn write_old_rankings_database(dir: &Path, build: RankingsBuild) {
    let connection = Connection::open(dir.join("rankings.sqlite3")).unwrap();
    connection
        .execute_batch(&rankings_schema_of(build).concat())
        .unwrap();
    let bodies = [old_event_body("a"), old_event_body("b")].join("\n");
    connection
        .execute(
            "INSERT INTO event_log (hour, seq, ids, bodies) VALUES (?1, 1, 'a\nb', ?2)",
            params![HOUR0, bodies.into_bytes()],
        )
        .unwrap();
    let weights = |view: f64| {
        serde_json::to_string(&PopularWeights {
            view,
            ..PopularWeights::default()
        })
        .unwrap()
    };
    connection
        .execute_batch(&format!(
            "INSERT INTO metrics_hourly VALUES ({HOUR0}, 'p1', 3, 1, 0, 0), ({HOUR0}, 'p2', 5, 0, 1, 900);
             INSERT INTO product_categories VALUES ('p1', 'lamps');
             INSERT INTO policies VALUES ('popular', 1, '{v1}'), ('popular', 2, '{v2}');
             INSERT INTO meta VALUES ('watermark_millis', '1783641000000'),
                                     ('last_ingest_millis', '1783641600123');",
            v1 = weights(1.0),
            v2 = weights(4.0),
        ))
        .unwrap();
    if has_column(&connection, "ranker_state", "state_seq") {
        connection
            .execute_batch(
                "INSERT INTO ranker_state (ranker, active_version, previous_version, latest_version,
                                           building_version, state_seq)
                 VALUES ('popular', 1, NULL, 2, 2, 4);",
            )
            .unwrap();
    } else {
        connection
            .execute_batch("INSERT INTO ranker_state VALUES ('popular', 2, 1, 2);")
            .unwrap();
    }
    if has_column(&connection, "catalog", "listed") {
        connection
            .execute_batch(
                r#"INSERT INTO catalog VALUES ('p1', '{"name":"Lamp"}', 1), ('p2', '{"name":"Rug"}', 0);"#,
            )
            .unwrap();
    } else {
        connection
            .execute_batch(
                r#"INSERT INTO catalog VALUES ('p1', '{"name":"Lamp"}'), ('p2', '{"name":"Rug"}');"#,
            )
            .unwrap();
    }
}

/// Checks that every row `write_old_rankings_database` put in reads back through today's code.
fn assert_rankings_rows_read_back(source: &mut SqliteSource, build: RankingsBuild) {
    let state = source.load().unwrap();
    let mut ids: Vec<&str> = state.processed_ids.iter().map(|id| id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["a", "b"], "{build:?}: the raw log's ids");
    let mut bodies = Vec::new();
    source
        .scan_event_log(&mut |_, body| bodies.push(String::from_utf8(body.to_vec()).unwrap()))
        .unwrap();
    assert_eq!(bodies, [old_event_body("a"), old_event_body("b")], "{build:?}");
    let mut metrics: Vec<(i64, String, i64, i64, i64, i64)> = state
        .metrics
        .iter()
        .map(|(hour, product, m)| {
            (
                hour.0,
                product.as_str().to_owned(),
                m.views,
                m.likes,
                m.units,
                m.sales,
            )
        })
        .collect();
    metrics.sort();
    assert_eq!(
        metrics,
        [
            (HOUR0, "p1".to_owned(), 3, 1, 0, 0),
            (HOUR0, "p2".to_owned(), 5, 0, 1, 900)
        ],
        "{build:?}: hourly metrics, now in hour blobs"
    );
    let memberships: Vec<(&str, &str)> = state
        .memberships
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str()))
        .collect();
    assert_eq!(memberships, [("p1", "lamps")], "{build:?}");
    assert_eq!(
        (state.watermark_millis, state.last_ingest_millis),
        (Some(1_783_641_000_000), Some(1_783_641_600_123)),
        "{build:?}: meta"
    );
    let mut catalog: Vec<(String, String, bool)> = state
        .catalog
        .iter()
        .map(|(p, e)| {
            (
                p.as_str().to_owned(),
                e.fields["name"].as_str().unwrap().to_owned(),
                e.listed,
            )
        })
        .collect();
    catalog.sort();
    let delisting_stored = !matches!(
        build,
        RankingsBuild::BatchedLog | RankingsBuild::FormatMarker | RankingsBuild::FleetPolicies
    );
    assert_eq!(
        catalog,
        [
            ("p1".to_owned(), "Lamp".to_owned(), true),
            // Stored delisted stays delisted; stored before the flag, listed.
            ("p2".to_owned(), "Rug".to_owned(), !delisting_stored)
        ],
        "{build:?}: catalogue"
    );
    let policies = source
        .load_policies(RankerName::Popular)
        .unwrap()
        .expect("stored");
    let fleet_state_stored = !matches!(build, RankingsBuild::BatchedLog | RankingsBuild::FormatMarker);
    if fleet_state_stored {
        assert_eq!(
            (
                policies.active.version,
                policies.building.map(|b| b.version),
                policies.latest_version,
                policies.seq
            ),
            (1, Some(2), 2, 4),
            "{build:?}: the stored fleet state, untouched"
        );
    } else {
        assert_eq!(
            (
                policies.active.version,
                policies.active.weights.view,
                policies.previous.map(|p| p.version),
                policies.building.is_some(),
                policies.seq
            ),
            (2, 4.0, Some(1), false, 0),
            "{build:?}: nothing building, sequence 0"
        );
    }
}

#[test]
fn every_older_rankings_database_is_brought_to_the_current_schema_with_its_rows() {
    let fresh_dir = tempfile::tempdir().unwrap();
    drop(SqliteSource::open(fresh_dir.path()).unwrap());
    let fresh = Connection::open(fresh_dir.path().join("rankings.sqlite3")).unwrap();

    for build in RANKINGS_BUILDS {
        let dir = tempfile::tempdir().unwrap();
        write_old_rankings_database(dir.path(), build);

        let mut source = SqliteSource::open(dir.path()).unwrap();
        assert_rankings_rows_read_back(&mut source, build);
        drop(source);

        let upgraded = Connection::open(dir.path().join("rankings.sqlite3")).unwrap();
        assert_eq!(user_version(&upgraded), 5, "{build:?}");
        assert_eq!(
            schema_shape(&upgraded),
            schema_shape(&fresh),
            "{build:?}: the schema a new database gets"
        );
        assert_eq!(
            create_statements(&upgraded, true),
            create_statements(&fresh, true),
            "{build:?}"
        );
        let format: i64 = upgraded
            .query_row("SELECT format FROM event_log", [], |row| row.get(0))
            .unwrap();
        assert_eq!(format, 0, "{build:?}: an old row is marked newline-joined");
        let hourly_rows: i64 = upgraded
            .query_row("SELECT COUNT(*) FROM metrics_hourly", [], |row| row.get(0))
            .unwrap();
        assert_eq!(hourly_rows, 0, "{build:?}: folded into hour blobs");
        drop(upgraded);

        // A second open finds nothing to do and the same rows.
        let mut source = SqliteSource::open(dir.path()).unwrap();
        assert_rankings_rows_read_back(&mut source, build);
    }
}

/// Existing tests made databases holding only some tables (`source_conformance.rs`); any such mix opens
/// too, as it did when every open ran the inline schema.
#[test]
fn a_rankings_database_with_only_some_tables_gets_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let connection = Connection::open(dir.path().join("rankings.sqlite3")).unwrap();
    connection.execute_batch(&[CATALOG_PLAIN, META].concat()).unwrap();
    connection
        .execute_batch(r#"INSERT INTO catalog VALUES ('p1', '{"name":"Lamp"}');"#)
        .unwrap();
    drop(connection);
    let mut source = SqliteSource::open(dir.path()).unwrap();
    let catalog = source.load_catalog().unwrap();
    assert_eq!((catalog.len(), catalog[0].1.listed), (1, true));
    drop(source);
    let fresh_dir = tempfile::tempdir().unwrap();
    drop(SqliteSource::open(fresh_dir.path()).unwrap());
    assert_eq!(
        schema_shape(&Connection::open(dir.path().join("rankings.sqlite3")).unwrap()),
        schema_shape(&Connection::open(fresh_dir.path().join("rankings.sqlite3")).unwrap())
    );
}

#[test]
fn a_new_rankings_database_gets_the_schema_the_last_inline_build_gave() {
    let dir = tempfile::tempdir().unwrap();
    drop(SqliteSource::open(dir.path()).unwrap());
    let new = Connection::open(dir.path().join("rankings.sqlite3")).unwrap();
    let old = Connection::open_in_memory().unwrap();
    old.execute_batch(&rankings_schema_of(RankingsBuild::PackedMetrics).concat())
        .unwrap();
    assert_eq!(schema_shape(&new), schema_shape(&old));
    // The texts differ only in where `ALTER TABLE` put an added column's definition.
    assert_eq!(create_statements(&new, true), create_statements(&old, true));
    assert_eq!(user_version(&new), 5);
}

// ---------------------------------------------------------------------------------------------------
// The queue store
// ---------------------------------------------------------------------------------------------------

/// The queue store's first inline schema (`2fdf746`).
const QUEUE_TABLES: &str = "
CREATE TABLE IF NOT EXISTS queues (
    name TEXT PRIMARY KEY, settings TEXT NOT NULL, next_seq INTEGER NOT NULL,
    budget TEXT NOT NULL, estimator TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS members (
    queue TEXT NOT NULL, member TEXT NOT NULL, kind INTEGER NOT NULL, seq INTEGER NOT NULL,
    at_ms INTEGER NOT NULL, digest BLOB, nonce BLOB, expires_ms INTEGER NOT NULL,
    claim_digest BLOB, claim_expires_ms INTEGER NOT NULL,
    PRIMARY KEY (queue, member)
) WITHOUT ROWID;";
/// The draw tables (`6655e58`), which that build's `SCHEMA` listed between `members` and `jobs`.
const DRAW_TABLES: &str = "
CREATE TABLE IF NOT EXISTS queue_draws (queue TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS queue_drawn_members (
    queue TEXT NOT NULL, position INTEGER NOT NULL, member TEXT NOT NULL,
    PRIMARY KEY (queue, position)
) WITHOUT ROWID;";
const JOBS_TABLE: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    queue TEXT NOT NULL, id TEXT NOT NULL, record TEXT NOT NULL, payload BLOB NOT NULL,
    PRIMARY KEY (queue, id)
) WITHOUT ROWID;";
/// The probe-guarded step of `d80b6b2` (every build since ran it on a new database too).
const ADD_MANAGED: &str =
    "ALTER TABLE queues ADD COLUMN managed INTEGER NOT NULL DEFAULT 0; UPDATE queues SET managed = 1;";
/// The probe-guarded step of `8e17666`.
const ADD_ABANDONED: &str = "ALTER TABLE queues ADD COLUMN abandoned INTEGER NOT NULL DEFAULT 0;";
/// Migration 5 (the first numbered one after the inline schema): each queue's epoch.
const ADD_EPOCH: &str = "ALTER TABLE queues ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;";
/// Migration 6: a closed pre-queue's entrant list (issue 28).
const ADD_DRAW_ENTRANTS: &str = "CREATE TABLE IF NOT EXISTS queue_draw_entrants (
    queue TEXT NOT NULL, position INTEGER NOT NULL, member TEXT NOT NULL,
    PRIMARY KEY (queue, position)
) WITHOUT ROWID;";

/// The queue schemas older builds created, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QueueBuild {
    /// `2fdf746`: queues, members, jobs.
    First,
    /// `d80b6b2`: `queues.managed`.
    Managed,
    /// `6655e58`: the draw tables.
    Draws,
    /// `8e17666`: `queues.abandoned`; the last inline schema.
    Abandoned,
}

const QUEUE_BUILDS: [QueueBuild; 4] = [
    QueueBuild::First,
    QueueBuild::Managed,
    QueueBuild::Draws,
    QueueBuild::Abandoned,
];

/// What `build`'s open ran on a new database: its `SCHEMA`, then the column steps it knew.
fn queue_schema_of(build: QueueBuild) -> String {
    let mut statements = vec![QUEUE_TABLES];
    if matches!(build, QueueBuild::Draws | QueueBuild::Abandoned) {
        statements.push(DRAW_TABLES);
    }
    statements.push(JOBS_TABLE);
    if build != QueueBuild::First {
        statements.push(ADD_MANAGED);
    }
    if build == QueueBuild::Abandoned {
        statements.push(ADD_ABANDONED);
    }
    statements.join("\n")
}

const NOW_MS: i64 = 1_000_000;

fn scheduled_draw() -> DrawRecord {
    DrawRecord::scheduled(NOW_MS + 3_600_000, DrawSeed([7; 32]))
}

/// [`scheduled_draw`] as JSON without the fields added since (the beacon round, the entrants commitment
/// and count, the beacon: issue 28), which serde defaults must fill.
fn draw_record_as_old_builds_wrote_it() -> String {
    let mut record = serde_json::to_value(scheduled_draw()).unwrap();
    let fields = record.as_object_mut().unwrap();
    for added in ["beacon_round", "entrants_commitment", "entrant_count", "beacon"] {
        assert!(fields.remove(added).is_some(), "{added}");
    }
    record.to_string()
}

/// A queue database as `build` left it, with rows in every table: queue `old` with two waiting members
/// (and, where stored, unmanaged with 3 abandoned), a job, and a scheduled draw where the tables exist.
fn write_old_queue_database(dir: &Path, build: QueueBuild) {
    let connection = Connection::open(dir.join(DATABASE_FILE)).unwrap();
    connection.execute_batch(&queue_schema_of(build)).unwrap();
    connection
        .execute_batch(
            "INSERT INTO queues (name, settings, next_seq, budget, estimator)
             VALUES ('old', '{}', 9, '{}', '{}');",
        )
        .unwrap();
    if build != QueueBuild::First {
        connection.execute_batch("UPDATE queues SET managed = 0").unwrap();
    }
    if build == QueueBuild::Abandoned {
        connection
            .execute_batch("UPDATE queues SET abandoned = 3")
            .unwrap();
    }
    for (member, seq) in [("m-1", 4), ("m-2", 7)] {
        connection
            .execute(
                "INSERT INTO members VALUES ('old', ?1, 0, ?2, ?3, NULL, NULL, 0, NULL, 0)",
                params![member, seq, NOW_MS - 1_000],
            )
            .unwrap();
    }
    let job = serde_json::to_string(&JobRecord::new(NOW_MS - 1, RetryPolicy::default())).unwrap();
    connection
        .execute(
            "INSERT INTO jobs VALUES ('mail', 'j-1', ?1, X'7061796c6f6164')",
            params![job],
        )
        .unwrap();
    if matches!(build, QueueBuild::Draws | QueueBuild::Abandoned) {
        connection
            .execute(
                "INSERT INTO queue_draws VALUES ('old', ?1)",
                params![draw_record_as_old_builds_wrote_it()],
            )
            .unwrap();
    }
}

fn open_queue_store(dir: &Path) -> Arc<EmbeddedStore> {
    EmbeddedStore::open(
        dir,
        Arc::new(ManualClock::new(NOW_MS)),
        EmbeddedOptions::default(),
    )
    .unwrap()
}

#[tokio::test]
async fn every_older_queue_database_is_brought_to_the_current_schema_with_its_rows() {
    let fresh_dir = tempfile::tempdir().unwrap();
    open_queue_store(fresh_dir.path()).close();
    let fresh = Connection::open(fresh_dir.path().join(DATABASE_FILE)).unwrap();
    let q = QueueName::parse("old").unwrap();

    for build in QUEUE_BUILDS {
        let dir = tempfile::tempdir().unwrap();
        write_old_queue_database(dir.path(), build);

        for open in ["first open", "second open"] {
            let store = open_queue_store(dir.path());
            let stats = store.stats(&q).await.unwrap().expect("the queue");
            let abandoned = if build == QueueBuild::Abandoned { 3 } else { 0 };
            assert_eq!(
                (stats.waiting, stats.abandoned),
                (2, abandoned),
                "{build:?}, {open}"
            );
            let view = store
                .position(&q, &MemberId::parse("m-2").unwrap())
                .await
                .unwrap();
            assert_eq!(
                (view.status, view.rank),
                (MemberStatus::Waiting, Some(1)),
                "{build:?}"
            );
            assert_eq!(store.counts("mail").await.unwrap().ready, 1, "{build:?}: the job");
            let draw = store.draws().draw_record(&q).await.unwrap();
            if matches!(build, QueueBuild::Draws | QueueBuild::Abandoned) {
                assert_eq!(draw, Some(scheduled_draw()), "{build:?}: the draw");
            } else {
                assert_eq!(draw, None, "{build:?}");
            }
            store.close();
        }

        let upgraded = Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
        assert_eq!(user_version(&upgraded), 7, "{build:?}");
        let epoch: i64 = upgraded
            .query_row("SELECT epoch FROM queues WHERE name = 'old'", [], |row| {
                row.get(0)
            })
            .unwrap();
        assert_eq!(
            epoch, 0,
            "{build:?}: a queue stored before epochs keeps epoch 0 (its tickets stay current)"
        );
        let managed: i64 = upgraded
            .query_row("SELECT managed FROM queues WHERE name = 'old'", [], |row| {
                row.get(0)
            })
            .unwrap();
        assert_eq!(
            managed,
            i64::from(build == QueueBuild::First),
            "{build:?}: marked managed only when the column was added, as the probe did"
        );
        let next_seq: i64 = upgraded
            .query_row("SELECT next_seq FROM queues WHERE name = 'old'", [], |row| {
                row.get(0)
            })
            .unwrap();
        assert!(next_seq >= 9, "{build:?}");
        assert_eq!(schema_shape(&upgraded), schema_shape(&fresh), "{build:?}");
        assert_eq!(
            create_statements(&upgraded, false),
            create_statements(&fresh, false),
            "{build:?}: the very texts, since the inline schema added these columns by ALTER too"
        );
    }
}

#[tokio::test]
async fn a_new_queue_database_gets_the_schema_the_last_inline_build_gave() {
    let dir = tempfile::tempdir().unwrap();
    open_queue_store(dir.path()).close();
    let new = Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
    let old = Connection::open_in_memory().unwrap();
    old.execute_batch(&queue_schema_of(QueueBuild::Abandoned))
        .unwrap();
    // What numbered migrations added since (5: each queue's epoch, issue 29; 6: the draw's entrant list,
    // issue 28; 7: the sale reports, issue 28).
    old.execute_batch(ADD_EPOCH).unwrap();
    old.execute_batch(ADD_DRAW_ENTRANTS).unwrap();
    old.execute_batch(include_str!(
        "../src/queue/embedded/migrations/0007_sale_reports.sql"
    ))
    .unwrap();
    assert_eq!(schema_shape(&new), schema_shape(&old));
    assert_eq!(create_statements(&new, false), create_statements(&old, false));
    assert_eq!(user_version(&new), 7);
    assert!(has_column(&new, "queues", "abandoned") && has_column(&new, "queues", "epoch"));
}
