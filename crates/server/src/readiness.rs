//! What `/readyz` tells a load balancer (issue 30): the state of each dependency, since when, and its
//! last error, from real outcomes, and whether this instance can take writes.
//!
//! - **Source of truth** (SQLite or PostgreSQL): the writer thread records every ingest commit's result
//!   ([`SourceHealth::record_commit`]); a probe every [`PROBE_EVERY`] (`SourceOfTruth::probe` on the
//!   writer thread: `SELECT 1`, the free space of an embedded database's disk, and, after a failed write,
//!   a one-row write) notices an outage and its end on a quiet instance too. A probe that gets no answer
//!   within [`PROBE_TIMEOUT`] (the writer is stuck on the database) counts as down. While it is down the
//!   instance cannot take writes: `/readyz` answers 503.
//! - **Queue store** (embedded or Redis): `QueueStore::ping` every probe. Reported, but not a 503: every
//!   instance on the same store is equally affected (the waiting room fails closed, or open where a
//!   queue says so), and taking them all out of rotation would only add the rankings and the gate's
//!   answers to the outage.
//! - **Serving** (embedded engine or Redis): Redis serving's staleness rule; stale is `degraded`, still
//!   ready (reads answer from memory, marked `stale`).
//! - **Kafka** (with `--kafka`): the consumer's last poll; a failing one is `down`, still ready (HTTP
//!   ingest is not affected; records wait in Kafka).
//!
//! Times are wall-clock ([`jiff::Timestamp::now`]): they are for people reading `/readyz`, not for the
//! store's ordering. Errors pass through [`scrub`] so no credential reaches the body.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;

/// How often the probes run.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long a probe of the source of truth may take before the source counts as down.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A dependency's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DependencyState {
    /// Answers and does its work.
    Up,
    /// Answers, but not fully: stale serving, for instance.
    Degraded,
    /// Cannot be used.
    Down,
}

/// One dependency as `/readyz` shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DependencyView {
    /// Which backend: `sqlite`, `postgres`, `embedded`, `redis`, `redis-cluster`, `kafka`.
    pub kind: &'static str,
    /// Its state now.
    pub state: DependencyState,
    /// When it entered that state (RFC 3339).
    pub since: String,
    /// The last error seen (credentials scrubbed), also after recovery, until a newer one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the last error was seen (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error_at: Option<String>,
}

/// A dependency's state with its history: when it last changed and the last error.
#[derive(Debug)]
pub struct DependencyHealth {
    kind: &'static str,
    record: Mutex<Record>,
}

#[derive(Debug)]
struct Record {
    state: DependencyState,
    since: jiff::Timestamp,
    last_error: Option<(String, jiff::Timestamp)>,
}

impl DependencyHealth {
    /// A dependency of `kind`, up from now (it was opened to start the process).
    pub fn new(kind: &'static str) -> DependencyHealth {
        DependencyHealth {
            kind,
            record: Mutex::new(Record {
                state: DependencyState::Up,
                since: jiff::Timestamp::now(),
                last_error: None,
            }),
        }
    }

    /// Records `state` now, with the error that explains it (if any); `since` moves only on a change.
    pub fn set(&self, state: DependencyState, error: Option<String>) {
        let now = jiff::Timestamp::now();
        let mut record = self.record.lock();
        if record.state != state {
            record.state = state;
            record.since = now;
        }
        if let Some(error) = error {
            record.last_error = Some((error, now));
        }
    }

    /// The state now.
    pub fn state(&self) -> DependencyState {
        self.record.lock().state
    }

    /// What `/readyz` shows.
    pub fn view(&self) -> DependencyView {
        let record = self.record.lock();
        DependencyView {
            kind: self.kind,
            state: record.state,
            since: record.since.to_string(),
            last_error: record.last_error.as_ref().map(|(error, _)| error.clone()),
            last_error_at: record.last_error.as_ref().map(|(_, at)| at.to_string()),
        }
    }
}

/// The source of truth's health: a [`DependencyHealth`] fed by commits and probes, plus whether the last
/// write failed (then only a probe that writes may call it up again).
#[derive(Debug)]
pub struct SourceHealth {
    health: DependencyHealth,
    write_failing: AtomicBool,
    /// The connection string, whose credentials are scrubbed from errors (PostgreSQL's may quote it).
    url: Option<String>,
}

impl SourceHealth {
    /// `kind` is `sqlite` or `postgres`; `url` the PostgreSQL connection string, if any.
    pub fn new(kind: &'static str, url: Option<String>) -> SourceHealth {
        SourceHealth {
            health: DependencyHealth::new(kind),
            write_failing: AtomicBool::new(false),
            url,
        }
    }

    /// An ingest commit's outcome (the writer thread). `Err` is a failure of the store; a batch the
    /// store refused for its content is not reported here.
    pub fn record_commit(&self, result: Result<(), &dyn std::fmt::Display>) {
        match result {
            Ok(()) => {
                self.write_failing.store(false, Ordering::Release);
                self.health.set(DependencyState::Up, None);
            }
            Err(error) => {
                self.write_failing.store(true, Ordering::Release);
                self.health.set(
                    DependencyState::Down,
                    Some(self.scrubbed(&format!("writes fail: {error}"))),
                );
            }
        }
    }

    /// Whether the next probe must write (the last write failed).
    pub fn probe_must_write(&self) -> bool {
        self.write_failing.load(Ordering::Acquire)
    }

    /// A probe's outcome; `wrote` says whether it was a write probe.
    pub fn record_probe(&self, wrote: bool, result: Result<(), String>) {
        match result {
            Ok(()) => {
                if wrote {
                    self.write_failing.store(false, Ordering::Release);
                }
                if !self.probe_must_write() {
                    self.health.set(DependencyState::Up, None);
                }
            }
            Err(error) => self
                .health
                .set(DependencyState::Down, Some(self.scrubbed(&error))),
        }
    }

    /// Whether writes can be taken now.
    pub fn takes_writes(&self) -> bool {
        self.health.state() == DependencyState::Up
    }

    /// What `/readyz` shows.
    pub fn view(&self) -> DependencyView {
        self.health.view()
    }

    fn scrubbed(&self, text: &str) -> String {
        scrub(text, self.url.as_deref())
    }
}

/// `text` without the credentials of `url` (a connection string an error may quote).
pub fn scrub(text: &str, url: Option<&str>) -> String {
    match url {
        Some(url) => rankgate_store::redact::scrub_credentials(text, url),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_moves_only_when_the_state_changes_and_the_last_error_outlives_recovery() {
        let health = DependencyHealth::new("redis");
        let up_since = health.view().since;
        health.set(DependencyState::Up, None);
        assert_eq!(health.view().since, up_since);
        health.set(DependencyState::Down, Some("connection refused".into()));
        let down = health.view();
        assert_eq!(down.state, DependencyState::Down);
        assert_eq!(down.last_error.as_deref(), Some("connection refused"));
        health.set(DependencyState::Up, None);
        let up = health.view();
        assert_eq!(up.state, DependencyState::Up);
        assert_eq!(up.last_error.as_deref(), Some("connection refused"));
    }

    #[test]
    fn after_a_failed_write_only_a_write_probe_brings_the_source_back() {
        let source = SourceHealth::new("postgres", Some("postgres://u:s3cret@db/x".into()));
        source.record_commit(Err(&"postgres://u:s3cret@db/x refused" as &dyn std::fmt::Display));
        assert!(!source.takes_writes());
        let error = source.view().last_error.unwrap();
        assert!(!error.contains("s3cret"), "{error}");
        source.record_probe(false, Ok(()));
        assert!(!source.takes_writes(), "a read probe proves no write");
        assert!(source.probe_must_write());
        source.record_probe(true, Ok(()));
        assert!(source.takes_writes());
        source.record_probe(false, Err("connection refused".into()));
        assert!(!source.takes_writes());
        source.record_probe(false, Ok(()));
        assert!(
            source.takes_writes(),
            "an outage seen by a read probe ends with one"
        );
    }
}
