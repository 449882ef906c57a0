//! Defect 8 of issue 9: acknowledged writes must be able to survive a power loss. Both embedded SQLite
//! databases (`rankings.sqlite3` of the rankings source of truth, `queue.sqlite3` of the waiting room)
//! take the configured `synchronous` level, `FULL` by default; the level in force is read back from
//! SQLite through each store after it opened, for each setting, and again after a reopen (the pragma is
//! per connection, never stored in the file).

use std::sync::Arc;

use rankgate_store::clock::ManualClock;
use rankgate_store::queue::embedded::{EmbeddedOptions, EmbeddedStore};
use rankgate_store::ranking::sqlite::SqliteSource;
use rankgate_store::synchronous::Synchronous;

#[test]
fn acknowledged_ingest_is_fsynced_by_default_and_sqlite_synchronous_is_applied_to_both_databases() {
    let dir = tempfile::tempdir().expect("temp dir");
    let source = SqliteSource::open(dir.path()).expect("open with the default");
    assert_eq!(
        source.synchronous().unwrap(),
        Synchronous::Full,
        "the default survives power loss"
    );
    drop(source);
    let store = EmbeddedStore::open(
        dir.path(),
        Arc::new(ManualClock::new(1_764_547_200_000)),
        EmbeddedOptions::default(),
    )
    .expect("open queue store");
    assert_eq!(store.synchronous(), Synchronous::Full);
    store.close();
    drop(store);

    for level in [Synchronous::Normal, Synchronous::Full, Synchronous::Normal] {
        let source = SqliteSource::open_with(dir.path(), level).expect("open rankings");
        assert_eq!(source.synchronous().unwrap(), level, "rankings.sqlite3");
        drop(source);
        let store = EmbeddedStore::open(
            dir.path(),
            Arc::new(ManualClock::new(1_764_547_200_000)),
            EmbeddedOptions {
                synchronous: level,
                ..EmbeddedOptions::default()
            },
        )
        .expect("open queue store");
        assert_eq!(store.synchronous(), level, "queue.sqlite3");
        store.close();
    }
}
