//! PostgreSQL for tests: the shared server at [`postgres_url`], where each test writes into a schema of
//! its own, guarded by a [`SchemaGuard`] that drops it (with everything in it) when the test ends, passed
//! or failed.
//!
//! The guard talks to PostgreSQL from a thread of its own: the synchronous `postgres` client starts a
//! runtime, which it may not do on a thread already running one, and guards are dropped inside async
//! tests as often as in plain ones.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The shared PostgreSQL: `RANKGATE_TEST_POSTGRES` (scripts/test.sh sets it when it starts a private
/// server), or the machine's (`postgres` user, `test` database,
/// trust on loopback; CI starts it).
pub fn postgres_url() -> String {
    std::env::var("RANKGATE_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A schema one test owns, dropped when the guard is.
#[derive(Debug)]
pub struct SchemaGuard(pub String);

impl SchemaGuard {
    /// A schema name no other test uses: `<stem>_<pid>_<n>`. Nothing is created: the code under test
    /// creates the schema (and its migrations) itself.
    pub fn unique(stem: &str) -> SchemaGuard {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        SchemaGuard(format!(
            "{stem}_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// Guards the schema `name` after dropping what an earlier, killed run may have left under it.
    pub fn named(name: impl Into<String>) -> SchemaGuard {
        let name = name.into();
        drop_schema(&name);
        SchemaGuard(name)
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl Drop for SchemaGuard {
    fn drop(&mut self) {
        // Never panic here: a second panic while a failed test unwinds would abort the whole binary.
        let _ = try_drop_schema(&self.0);
    }
}

/// `DROP SCHEMA IF EXISTS "<name>" CASCADE` on the shared server. Panics when PostgreSQL cannot be
/// reached: the test would fail later and less clearly.
pub fn drop_schema(name: &str) {
    if let Err(error) = try_drop_schema(name) {
        panic!(
            "dropping schema {name} on PostgreSQL at {}: {error}",
            postgres_url()
        );
    }
}

fn try_drop_schema(name: &str) -> Result<(), String> {
    let statement = format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE");
    std::thread::spawn(move || {
        let mut client = postgres::Client::connect(&postgres_url(), postgres::NoTls)
            .map_err(|e| format!("connecting: {e}"))?;
        // A NOTICE per cascaded object would only clutter the test's output.
        client
            .batch_execute(&format!("SET client_min_messages = warning; {statement}"))
            .map_err(|e| e.to_string())
    })
    .join()
    .map_err(|_| "the thread dropping the schema panicked".to_string())?
}
