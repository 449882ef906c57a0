//! Runs the [`SourceOfTruth`] conformance suite against SQLite (a temp dir per test) and PostgreSQL (the
//! machine's server, `RANKGATE_TEST_POSTGRES` or `postgres://postgres@127.0.0.1:5432/test`, one schema per
//! test, dropped at the end). PostgreSQL being unreachable fails these tests: CI starts it.
//! Plus PostgreSQL-only checks: partitions are created and dropped, migrations are idempotent, and a
//! killed connection is replaced without losing or double counting a batch.

use rankgate_core::ids::ProductId;
use rankgate_core::metrics::Metrics;
use rankgate_core::period::Hour;
use rankgate_store::ranking::conformance::{self as suite, batch_of, views, DAY0};
use rankgate_store::ranking::postgres::PostgresSource;
use rankgate_store::ranking::source::SourceOfTruth;
use rankgate_store::ranking::sqlite::SqliteSource;
use rankgate_testkit::postgres_schemas::{postgres_url, SchemaGuard};

/// A fresh schema for one test, dropped (with everything in it) when the test ends, pass or fail.
fn fresh_schema() -> SchemaGuard {
    SchemaGuard::unique("rgtest")
}

fn open_source(schema: &SchemaGuard) -> PostgresSource {
    PostgresSource::connect(&postgres_url(), schema.name())
        .unwrap_or_else(|e| panic!("PostgreSQL at {} must be reachable: {e}", postgres_url()))
}

fn with_sqlite(check: impl FnOnce(suite::Factory<'_>)) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().to_owned();
    check(&move || Box::new(SqliteSource::open(&path).expect("open sqlite")) as Box<dyn SourceOfTruth>);
}

fn with_postgres(check: impl FnOnce(suite::Factory<'_>)) {
    let schema = fresh_schema();
    check(&|| Box::new(open_source(&schema)) as Box<dyn SourceOfTruth>);
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test] fn $name() { super::with_sqlite(|open| super::suite::$name(open)); })*
        }
        mod postgres {
            $(#[test] fn $name() { super::with_postgres(|open| super::suite::$name(open)); })*
        }
    };
}

both_backends!(
    commit_load_round_trip,
    metric_upserts_accumulate,
    memberships_are_a_set,
    watermark_and_last_ingest,
    policies_round_trip,
    policy_transitions_follow_the_rules,
    concurrent_policy_transitions_apply_in_one_order,
    catalog_round_trip,
    scan_event_log_order,
    replace_metrics_replaces,
    evict_drops_old_events_and_metrics,
    hostile_ids_round_trip_a_reopen,
);

#[test]
fn sqlite_failed_commit_leaves_nothing() {
    // SQLite trusts the caller's dedupe, so nothing in a valid batch fails on its own: a trigger injects
    // the failure at the batch's last write (the watermark), after its events and metrics were written.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().to_owned();
    drop(SqliteSource::open(&path).expect("create"));
    let connection = rusqlite::Connection::open(path.join("rankings.sqlite3")).expect("open file");
    connection
        .execute_batch(
            "CREATE TRIGGER inject_failure BEFORE INSERT ON meta WHEN NEW.value = '9999'
             BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
        )
        .expect("trigger");
    drop(connection);
    let setup = batch_of(&[(DAY0, "s1", "p1", views(1))]);
    let mut failing = batch_of(&[(DAY0 + 1, "f1", "p2", views(1)), (DAY0, "f2", "p1", views(1))]);
    failing.new_memberships = vec![(
        rankgate_core::ids::ProductId::parse("p2").unwrap(),
        rankgate_core::ids::Category::parse("c9").unwrap(),
    )];
    failing.watermark_millis = Some(9_999);
    let open = move || Box::new(SqliteSource::open(&path).expect("open sqlite")) as Box<dyn SourceOfTruth>;
    suite::failed_commit_leaves_nothing(&open, &setup, &failing);
}

#[test]
fn postgres_failed_commit_leaves_nothing() {
    // The stored row is at i64::MAX views: one more overflows `bigint` and aborts the transaction,
    // after the ids, the log rows and the partition of a new day were already written in it.
    let setup = batch_of(&[(DAY0, "s1", "p1", views(i64::MAX))]);
    let mut failing = batch_of(&[
        (DAY0 + 200, "f1", "p2", views(1)),
        (DAY0, "f2", "p1", views(1)),
        (DAY0, "s1", "p1", views(3)),
    ]);
    failing.new_memberships = vec![(
        rankgate_core::ids::ProductId::parse("p2").unwrap(),
        rankgate_core::ids::Category::parse("c9").unwrap(),
    )];
    failing.watermark_millis = Some(9_999);
    let schema = fresh_schema();
    suite::failed_commit_leaves_nothing(
        &|| Box::new(open_source(&schema)) as Box<dyn SourceOfTruth>,
        &setup,
        &failing,
    );
    assert_eq!(
        open_source(&schema).partition_days().unwrap(),
        vec![DAY0 / 24],
        "the failed day partition was rolled back"
    );
}

#[test]
fn postgres_catalog_changes_reach_other_instances() {
    with_postgres(suite::catalog_changes_reach_other_instances);
}

#[test]
fn postgres_dedupe_by_database() {
    with_postgres(suite::dedupe_by_database);
}

#[test]
fn postgres_concurrent_duplicates_are_counted_once() {
    with_postgres(suite::concurrent_duplicates_are_counted_once);
}

#[test]
fn sqlite_default_commit_deduped_reports_all_new() {
    // The provided method: SQLite is owned by one process, so the caller's dedupe is authoritative.
    with_sqlite(|open| {
        let mut source = open();
        let flags = source.commit_deduped(&batch_of(&[
            (DAY0, "a", "p1", views(1)),
            (DAY0, "b", "p1", views(1)),
        ]));
        assert_eq!(flags.unwrap(), vec![true, true]);
        assert_eq!(suite::snapshot(open().as_mut()).processed, vec!["a", "b"]);
    });
}

#[test]
fn postgres_partitions_are_created_per_day_and_dropped_by_retention() {
    let schema = fresh_schema();
    let mut source = open_source(&schema);
    assert!(source.partition_days().unwrap().is_empty());
    source
        .commit(&batch_of(&[
            (DAY0 + 3, "a", "p1", views(1)),
            (DAY0 + 27, "b", "p1", views(1)),
            (DAY0 + 51, "c", "p1", views(1)),
        ]))
        .unwrap();
    let day0 = DAY0 / 24;
    assert_eq!(source.partition_days().unwrap(), vec![day0, day0 + 1, day0 + 2]);
    // A cut inside day 1 drops day 0 only; day 1's rows stay until all of day 1 is older.
    let forgotten = source.evict(Hour(DAY0 + 30), Hour(0)).unwrap();
    assert_eq!(
        forgotten.iter().map(|id| id.as_str()).collect::<Vec<_>>(),
        vec!["a"]
    );
    assert_eq!(source.partition_days().unwrap(), vec![day0 + 1, day0 + 2]);
    let mut client = ::postgres::Client::connect(&postgres_url(), ::postgres::NoTls).unwrap();
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename LIKE '%\\_d%'",
            &[&schema.0],
        )
        .unwrap()
        .get(0);
    assert_eq!(tables, 4, "two partitions each of processed and event_log remain");
    // Metrics are untouched by the event cut (metrics_before = hour 0).
    assert_eq!(suite::snapshot(&mut source).metrics.len(), 3);
}

#[test]
fn postgres_migrations_are_versioned_and_idempotent() {
    let schema = fresh_schema();
    let mut source = open_source(&schema);
    assert!(source.migrate().unwrap().is_empty(), "connect already migrated");
    let mut again = open_source(&schema);
    assert!(again.migrate().unwrap().is_empty());
    let mut client = ::postgres::Client::connect(&postgres_url(), ::postgres::NoTls).unwrap();
    let versions: Vec<i32> = client
        .query(
            &format!(
                "SELECT version FROM \"{}\".schema_migrations ORDER BY version",
                schema.0
            ),
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(versions, vec![1, 2, 3, 4, 5], "every migration applied once");
    assert!(
        PostgresSource::connect(&postgres_url(), "Bad-Name").is_err(),
        "schema names are plain identifiers"
    );
}

#[test]
fn postgres_a_killed_connection_is_replaced_and_the_batch_counted_once() {
    let schema = fresh_schema();
    let mut source = open_source(&schema);
    source.commit(&batch_of(&[(DAY0, "k1", "p1", views(1))])).unwrap();
    let pid = source.backend_pid().unwrap();
    let mut admin = ::postgres::Client::connect(&postgres_url(), ::postgres::NoTls).unwrap();
    let terminated: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap()
        .get(0);
    assert!(terminated, "the source's connection was terminated");
    let flags = source
        .commit_deduped(&batch_of(&[
            (DAY0, "k1", "p1", views(1)),
            (DAY0, "k2", "p1", views(2)),
        ]))
        .expect("the commit reconnects and succeeds");
    assert_eq!(flags, vec![false, true]);
    assert_eq!(
        suite::snapshot(&mut source).metrics,
        vec![(
            DAY0,
            "p1".into(),
            Metrics {
                views: 3,
                ..Metrics::default()
            }
        )]
    );
}

#[test]
fn postgres_ids_committed_by_another_instance_are_duplicates() {
    // Each source decides duplicates against its own in-memory set, kept exact by reading what other
    // writers committed since its cursor. B loads (or first commits) before A writes, so only that feed
    // can tell B about A's ids.
    let schema = fresh_schema();
    let mut a = open_source(&schema);
    let mut b = open_source(&schema);
    let mut lazy = open_source(&schema); // never loads: its set is read inside its first commit
    b.load().unwrap();
    assert_eq!(
        lazy.commit_deduped(&batch_of(&[(DAY0, "l1", "p1", views(1))]))
            .unwrap(),
        vec![true]
    );
    assert_eq!(
        a.commit_deduped(&batch_of(&[
            (DAY0, "x", "p1", views(1)),
            (DAY0, "l1", "p1", views(1))
        ]))
        .unwrap(),
        vec![true, false],
        "A never loaded either: its first commit reads every stored id"
    );
    // The same id at another hour (another day partition): the primary key alone would not catch it.
    assert_eq!(
        b.commit_deduped(&batch_of(&[
            (DAY0 + 30, "x", "p2", views(5)),
            (DAY0, "y", "p1", views(1))
        ]))
        .unwrap(),
        vec![false, true],
        "B must see the id A committed after B loaded"
    );
    assert_eq!(
        lazy.commit_deduped(&batch_of(&[
            (DAY0 + 50, "x", "p1", views(1)),
            (DAY0, "y", "p1", views(1))
        ]))
        .unwrap(),
        vec![false, false]
    );
    // A writer that predates the commit feed (no `seq` in its COPY) is still seen: the column's default.
    let mut admin = ::postgres::Client::connect(&postgres_url(), ::postgres::NoTls).unwrap();
    admin
        .execute(
            &format!(
                "INSERT INTO \"{}\".processed (hour, id, batch) VALUES ($1, 'old', 0)",
                schema.0
            ),
            &[&DAY0],
        )
        .unwrap();
    assert_eq!(
        a.commit_deduped(&batch_of(&[(DAY0 + 1, "old", "p1", views(1))]))
            .unwrap(),
        vec![false]
    );
    // A restart resumes from what load saw.
    let mut restarted = open_source(&schema);
    restarted.load().unwrap();
    assert_eq!(
        restarted
            .commit_deduped(&batch_of(&[
                (DAY0 + 2, "y", "p1", views(1)),
                (DAY0 + 2, "z", "p1", views(1))
            ]))
            .unwrap(),
        vec![false, true]
    );
    assert_eq!(
        b.commit_deduped(&batch_of(&[(DAY0 + 3, "z", "p1", views(1))]))
            .unwrap(),
        vec![false]
    );
    let counted: i64 = suite::snapshot(&mut a)
        .metrics
        .iter()
        .map(|(_, _, m)| m.views)
        .sum();
    assert_eq!(
        counted, 4,
        "l1, x, y and z counted once each (the raw 'old' row carries no metrics)"
    );
}

#[test]
fn postgres_upgrade_from_v2_keeps_every_id() {
    // A schema written before migration 3: its rows get seq 0 and a loaded source still knows them.
    let schema = fresh_schema();
    let mut source = open_source(&schema);
    source
        .commit(&batch_of(&[
            (DAY0, "v2a", "p1", views(1)),
            (DAY0 + 40, "v2b", "p1", views(1)),
        ]))
        .unwrap();
    let mut admin = ::postgres::Client::connect(&postgres_url(), ::postgres::NoTls).unwrap();
    admin
        .batch_execute(&format!(
            "SET search_path TO \"{s}\";
             DROP INDEX processed_by_seq; ALTER TABLE processed DROP COLUMN seq; DROP SEQUENCE processed_seq;
             DELETE FROM schema_migrations WHERE version = 3;",
            s = schema.0
        ))
        .unwrap();
    let mut upgraded = open_source(&schema);
    let seqs: Vec<i64> = admin
        .query(
            &format!("SELECT seq FROM \"{}\".processed ORDER BY id", schema.0),
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(seqs, vec![0, 0], "existing rows get 0 without a rewrite");
    let indexes: i64 = admin
        .query_one(
            // The catalogs, not `pg_indexes`: its `pg_get_indexdef` opens every index it scans, and
            // one that a concurrent test's DROP SCHEMA removes mid-scan fails the whole query.
            "SELECT count(*) FROM pg_index i
               JOIN pg_class c ON c.oid = i.indexrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
              WHERE n.nspname = $1 AND a.attname = 'seq' AND i.indnatts = 1",
            &[&schema.0],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        indexes, 3,
        "the parent's index and one per existing day partition"
    );
    upgraded.load().unwrap();
    assert_eq!(
        upgraded
            .commit_deduped(&batch_of(&[
                (DAY0 + 1, "v2a", "p1", views(1)),
                (DAY0 + 1, "v3", "p1", views(1))
            ]))
            .unwrap(),
        vec![false, true]
    );
    let mut lazy = open_source(&schema);
    assert_eq!(
        lazy.commit_deduped(&batch_of(&[
            (DAY0 + 2, "v2b", "p1", views(1)),
            (DAY0 + 2, "v3", "p1", views(1))
        ]))
        .unwrap(),
        vec![false, false]
    );
}

#[test]
fn postgres_event_id_with_newline_stored_before_spec_1_1_neither_stops_a_start_nor_retention() {
    let schema = fresh_schema();
    let mut source = open_source(&schema);
    source
        .commit(&batch_of(&[
            (DAY0, "e1", "p1", views(1)),
            (DAY0, "e2", "p1", views(1)),
        ]))
        .expect("commit");
    // The old binary accepted any id: make one of the stored ids what it would have written.
    let mut client = ::postgres::Client::connect(&postgres_url(), ::postgres::NoTls).expect("connect");
    client
        .batch_execute(&format!(
            "UPDATE \"{}\".processed SET id = 'a' || chr(10) || 'b' WHERE id = 'e1'",
            schema.0
        ))
        .expect("update");
    let state = open_source(&schema).load().expect("a start still loads");
    let ids: Vec<&str> = state.processed_ids.iter().map(|id| id.as_str()).collect();
    assert_eq!(ids, ["e2"], "the id no event can carry any more needs no dedupe");
    let forgotten = open_source(&schema)
        .evict(Hour(DAY0 + 48), Hour(0))
        .expect("retention still runs");
    assert_eq!(forgotten.iter().map(|id| id.as_str()).collect::<Vec<_>>(), ["e2"]);
}

/// A policy state written before migration 4 (no `building_version`, no `state_seq`) reads back as
/// the same versions at sequence 0 with nothing building, and its next transition continues from it.
#[test]
fn postgres_upgrade_to_policy_states_keeps_the_versions() {
    use rankgate_core::policy::PolicyState;
    use rankgate_core::ranker::{PopularWeights, RankerName};
    let schema = fresh_schema();
    let mut admin = ::postgres::Client::connect(&postgres_url(), ::postgres::NoTls).unwrap();
    drop(open_source(&schema));
    // What a binary before migration 4 stored after one switch: version 2 active, 1 previous.
    admin
        .batch_execute(&format!(
            "SET search_path TO \"{s}\";
             ALTER TABLE ranker_state DROP COLUMN building_version, DROP COLUMN state_seq;
             DELETE FROM schema_migrations WHERE version = 4;
             INSERT INTO policies VALUES ('popular', 1, '{d}'), ('popular', 2, '{w}');
             INSERT INTO ranker_state VALUES ('popular', 2, 1, 2);",
            s = schema.0,
            d = serde_json::to_string(&PopularWeights::default()).unwrap(),
            w = serde_json::to_string(&PopularWeights {
                view: 9.0,
                ..PopularWeights::default()
            })
            .unwrap(),
        ))
        .unwrap();
    let mut upgraded = open_source(&schema);
    let state = upgraded
        .load_policies(RankerName::Popular)
        .unwrap()
        .expect("stored");
    assert_eq!(
        (
            state.active.version,
            state.active.weights.view,
            state.previous.map(|p| p.version)
        ),
        (2, 9.0, Some(1))
    );
    assert_eq!((state.building, state.latest_version, state.seq), (None, 2, 0));
    let next = upgraded
        .transition_policies(RankerName::Popular, &mut |state: &mut PolicyState| {
            state.create(PopularWeights::default()).map(|_| ())
        })
        .unwrap();
    assert_eq!((next.latest_version, next.seq, next.active.version), (3, 1, 2));
}

/// The same for SQLite: a `ranker_state` table from before fleet state gets its columns on open.
#[test]
fn sqlite_upgrade_to_policy_states_keeps_the_versions() {
    use rankgate_core::ranker::{PopularWeights, RankerName};
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("rankings.sqlite3");
    let connection = rusqlite::Connection::open(&path).unwrap();
    connection
        .execute_batch(&format!(
            "CREATE TABLE policies (ranker TEXT NOT NULL, version INTEGER NOT NULL, weights TEXT NOT NULL,
                                    PRIMARY KEY (ranker, version));
             CREATE TABLE ranker_state (ranker TEXT PRIMARY KEY, active_version INTEGER NOT NULL,
                                        previous_version INTEGER, latest_version INTEGER NOT NULL);
             INSERT INTO policies VALUES ('popular', 1, '{d}'), ('popular', 3, '{w}');
             INSERT INTO ranker_state VALUES ('popular', 3, 1, 3);",
            d = serde_json::to_string(&PopularWeights::default()).unwrap(),
            w = serde_json::to_string(&PopularWeights {
                view: 4.0,
                ..PopularWeights::default()
            })
            .unwrap(),
        ))
        .unwrap();
    drop(connection);
    let mut source = SqliteSource::open(dir.path()).expect("open sqlite");
    let state = source
        .load_policies(RankerName::Popular)
        .unwrap()
        .expect("stored");
    assert_eq!(
        (
            state.active.version,
            state.active.weights.view,
            state.previous.map(|p| p.version)
        ),
        (3, 4.0, Some(1))
    );
    assert_eq!((state.building, state.latest_version, state.seq), (None, 3, 0));
}

/// A catalogue stored before products could be delisted (migration 5): its entries stay listed, keep
/// their fields, and a later write joins the change feed.
#[test]
fn postgres_upgrade_to_listing_keeps_the_catalogue_listed() {
    use rankgate_store::ranking::catalog::CatalogUpdate;
    let schema = fresh_schema();
    let mut admin = ::postgres::Client::connect(&postgres_url(), ::postgres::NoTls).unwrap();
    drop(open_source(&schema));
    admin
        .batch_execute(&format!(
            "SET search_path TO \"{s}\";
             DROP INDEX catalog_change; ALTER TABLE catalog DROP COLUMN listed, DROP COLUMN change_seq;
             DELETE FROM schema_migrations WHERE version = 5;
             INSERT INTO catalog VALUES ('p1', '{{\"name\":\"Kettle\"}}');",
            s = schema.0
        ))
        .unwrap();
    let mut upgraded = open_source(&schema);
    let state = upgraded.load().unwrap();
    assert_eq!(state.catalog.len(), 1);
    assert!(state.catalog[0].1.listed);
    assert_eq!(state.catalog[0].1.fields["name"], "Kettle");
    let mut writer = open_source(&schema);
    writer
        .put_catalog(&[(
            ProductId::parse("p1").unwrap(),
            CatalogUpdate {
                listed: Some(false),
                ..CatalogUpdate::default()
            },
        )])
        .unwrap();
    let changes = upgraded.changes_since(state.change_cursor).unwrap().unwrap();
    assert_eq!(changes.catalog.len(), 1);
    assert!(!changes.catalog[0].1.listed);
    assert_eq!(changes.catalog[0].1.fields["name"], "Kettle");
}

/// The same for SQLite: a `catalog` table without the flag gets it on open, every entry listed.
#[test]
fn sqlite_upgrade_to_listing_keeps_the_catalogue_listed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let connection = rusqlite::Connection::open(dir.path().join("rankings.sqlite3")).unwrap();
    connection
        .execute_batch(
            "CREATE TABLE catalog (product TEXT PRIMARY KEY, body TEXT NOT NULL);
             INSERT INTO catalog VALUES ('p1', '{\"name\":\"Lamp\"}');",
        )
        .unwrap();
    drop(connection);
    let mut source = SqliteSource::open(dir.path()).expect("open sqlite");
    let catalog = source.load_catalog().unwrap();
    assert_eq!(catalog.len(), 1);
    assert!(catalog[0].1.listed);
    assert_eq!(catalog[0].1.fields["name"], "Lamp");
}
