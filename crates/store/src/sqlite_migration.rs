//! Numbered schema migrations for the two embedded SQLite databases: the rankings source of truth
//! (`ranking/sqlite_migrations/`) and the queue store (`queue/embedded/migrations/`).
//!
//! Each database's schema is a list of `.sql` files, `0001_initial.sql` onwards, compiled in with
//! `include_str!` and applied in order, as PostgreSQL's are (`ranking/migrations/`). A file is never
//! edited once released: a change of schema is a new file.
//!
//! **The version is kept in `PRAGMA user_version`**, not in a `schema_migrations` table as on
//! PostgreSQL. A PostgreSQL schema lives in a shared database with no header of its own, so it needs a
//! table (and an advisory lock, for several instances migrating at once). A SQLite file has a header
//! integer made for exactly this: it is read without a table existing, it leaves the list of tables
//! what it always was (so the schema a new database gets is the one older builds gave, which the tests
//! compare), and it is written in the same transaction as the DDL, since SQLite's DDL is transactional:
//! a crash mid-migration leaves the old version with the old schema. The transaction is `IMMEDIATE`,
//! taking the write lock before the version is read, so two processes opening one file migrate it
//! once — the counterpart of PostgreSQL's advisory lock.
//!
//! **Databases from before versioning.** Builds before these files created the schema inline with
//! `CREATE TABLE IF NOT EXISTS` and added later columns when a probe of `pragma_table_info` found them
//! missing. Their files have `user_version` 0, exactly as a new, empty file does. So at version 0 each
//! migration carries the probe that used to guard it ([`LegacyProbe`]) and is applied only if its change
//! is not already there; this brings every shape an older build left (or any mix of them) to the
//! current version, as the probes did, and a new file (where nothing is there) gets every migration.
//! The `CREATE TABLE`s of these files say `IF NOT EXISTS` for the same reason: a database with only some
//! of a migration's tables gets the rest. Migrations written after versioning need no probe: no
//! unversioned database can hold them. From version 1 on, the version alone decides.
//!
//! Older builds ignore `user_version` and only ever add tables and columns, so a database this code
//! migrated still opens with them (a downgrade), and coming back finds nothing missing.

use rusqlite::{Connection, TransactionBehavior};

/// One numbered migration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Migration {
    /// Its number, from the file name: 1, 2, … with no gap.
    pub version: u32,
    /// The file's statements.
    pub sql: &'static str,
    /// How to tell that a database from before versioning already holds this change; `None` for a
    /// migration written after versioning.
    pub legacy_probe: Option<LegacyProbe>,
}

/// What the inline schema of older builds looked at to decide whether a change was there.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LegacyProbe {
    /// Every one of these tables exists.
    Tables(&'static [&'static str]),
    /// The table has this column.
    Column {
        /// The table.
        table: &'static str,
        /// The column.
        column: &'static str,
    },
}

impl LegacyProbe {
    fn is_present(self, connection: &Connection) -> rusqlite::Result<bool> {
        match self {
            LegacyProbe::Tables(tables) => {
                let mut statement =
                    connection.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1")?;
                for table in tables {
                    if !statement.exists([table])? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            LegacyProbe::Column { table, column } => connection
                .prepare("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")?
                .exists([table, column]),
        }
    }
}

/// The schema version recorded in the database (`PRAGMA user_version`); 0 for a new file or one from
/// before versioning.
pub(crate) fn schema_version(connection: &Connection) -> rusqlite::Result<u32> {
    connection.pragma_query_value(None, "user_version", |row| row.get(0))
}

/// Brings the database to the last of `migrations` in one `IMMEDIATE` transaction, and returns the
/// versions it applied (none when it was current). A database at a higher version than any of
/// `migrations` (written by a newer build) is left as it is: migrations only add, so this build still
/// finds everything it uses.
pub(crate) fn migrate(connection: &mut Connection, migrations: &[Migration]) -> rusqlite::Result<Vec<u32>> {
    debug_assert!(
        migrations
            .iter()
            .enumerate()
            .all(|(i, m)| m.version as usize == i + 1),
        "migrations are numbered 1, 2, … in order"
    );
    let Some(latest) = migrations.last().map(|m| m.version) else {
        return Ok(Vec::new());
    };
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let current = schema_version(&transaction)?;
    if current >= latest {
        return Ok(Vec::new());
    }
    let mut applied = Vec::new();
    for migration in migrations.iter().filter(|m| m.version > current) {
        // Probed one at a time, after the migrations before it ran: an earlier one may have created
        // the table a later probe looks at (in the shape before the later change).
        let already_there = current == 0
            && migration
                .legacy_probe
                .map(|probe| probe.is_present(&transaction))
                .transpose()?
                .unwrap_or(false);
        if !already_there {
            transaction.execute_batch(migration.sql)?;
            applied.push(migration.version);
        }
    }
    // PRAGMA takes no bound parameters; `latest` is a number of ours.
    transaction.execute_batch(&format!("PRAGMA user_version = {latest}"))?;
    transaction.commit()?;
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIGRATIONS: &[Migration] = &[
        Migration {
            version: 1,
            sql: "CREATE TABLE IF NOT EXISTS a (x INTEGER NOT NULL); CREATE TABLE IF NOT EXISTS b (y TEXT);",
            legacy_probe: Some(LegacyProbe::Tables(&["a", "b"])),
        },
        Migration {
            version: 2,
            sql: "ALTER TABLE a ADD COLUMN z INTEGER NOT NULL DEFAULT 7; UPDATE a SET z = 8;",
            legacy_probe: Some(LegacyProbe::Column {
                table: "a",
                column: "z",
            }),
        },
        Migration {
            version: 3,
            sql: "CREATE TABLE c (w BLOB);",
            legacy_probe: None,
        },
    ];

    #[test]
    fn a_new_database_gets_every_migration_once() {
        let mut connection = Connection::open_in_memory().unwrap();
        assert_eq!(migrate(&mut connection, MIGRATIONS).unwrap(), vec![1, 2, 3]);
        assert_eq!(schema_version(&connection).unwrap(), 3);
        assert_eq!(migrate(&mut connection, MIGRATIONS).unwrap(), Vec::<u32>::new());
        assert_eq!(
            migrate(&mut connection, &MIGRATIONS[..2]).unwrap(),
            Vec::<u32>::new(),
            "a newer database is left as it is"
        );
        assert_eq!(schema_version(&connection).unwrap(), 3);
    }

    #[test]
    fn an_unversioned_database_gets_only_what_its_probes_miss() {
        let mut connection = Connection::open_in_memory().unwrap();
        connection
            .execute_batch("CREATE TABLE a (x INTEGER NOT NULL); INSERT INTO a VALUES (1);")
            .unwrap();
        assert_eq!(
            migrate(&mut connection, MIGRATIONS).unwrap(),
            vec![1, 2, 3],
            "b was missing, so 1 ran again (IF NOT EXISTS)"
        );
        let z: i64 = connection
            .query_row("SELECT z FROM a", [], |row| row.get(0))
            .unwrap();
        assert_eq!(z, 8, "the data step of 2 ran");

        let mut current = Connection::open_in_memory().unwrap();
        current
            .execute_batch(
                "CREATE TABLE a (x INTEGER NOT NULL, z INTEGER NOT NULL DEFAULT 7); CREATE TABLE b (y TEXT);
                 INSERT INTO a VALUES (1, 5);",
            )
            .unwrap();
        assert_eq!(migrate(&mut current, MIGRATIONS).unwrap(), vec![3]);
        let z: i64 = current
            .query_row("SELECT z FROM a", [], |row| row.get(0))
            .unwrap();
        assert_eq!(z, 5, "2 did not run again");
    }

    #[test]
    fn a_failed_migration_leaves_the_old_version_and_schema() {
        let mut connection = Connection::open_in_memory().unwrap();
        migrate(&mut connection, &MIGRATIONS[..1]).unwrap();
        let broken = [
            MIGRATIONS[0],
            MIGRATIONS[1],
            Migration {
                version: 3,
                sql: "CREATE TABLE c (w BLOB); SELECT no_such_function();",
                legacy_probe: None,
            },
        ];
        assert!(migrate(&mut connection, &broken).is_err());
        assert_eq!(schema_version(&connection).unwrap(), 1);
        assert!(!LegacyProbe::Column {
            table: "a",
            column: "z"
        }
        .is_present(&connection)
        .unwrap());
        assert!(!LegacyProbe::Tables(&["c"]).is_present(&connection).unwrap());
    }
}
