//! [`WatchLedger`]: who watches the fleet's webhook rankings, and what each watch last reported.
//!
//! A webhook reports how a watched top N changed ("entered", "left", "moved"). With several instances
//! sharing Redis, every instance sees the same change; delivering it once per instance would be wrong, and
//! so would letting two instances number changes independently. So exactly one instance at a time — the
//! holder of a **lease** — compares the ranking with the last reported snapshot, enqueues a delivery job
//! and records the new snapshot. The snapshot (its sequence number and the products in order) lives beside
//! the lease, so an instance that takes the lease over continues the sequence where the last holder
//! stopped instead of starting a new baseline, and its record is **fenced**: a holder that lost the lease
//! cannot overwrite what the new holder recorded.
//!
//! The delivery job's id is `<webhook>:<sequence>` and it is enqueued before the snapshot is recorded, so
//! a holder that dies between the two leaves the next holder to compute the same sequence and the same id
//! (the job store ignores an id it already holds): a change is delivered at least once, and every
//! delivery carries that id for receivers to drop the rare repeat (a job acked before the repeat was
//! enqueued).
//!
//! | backend | lease | snapshots |
//! |---|---|---|
//! | [`EmbeddedWatchLedger`] | always held: one process owns an embedded data dir | in memory, and (in `rankgate serve`) a JSON file in the data dir, replaced atomically on every record, so a restart continues the sequence |
//! | [`RedisWatchLedger`] | `P{wh}:lease` (`SET NX PX`, renewed each round) | `P{wh}:state`, one hash field per webhook, written only by the lease holder (one script) |
//!
//! Both keys share the `{wh}` hash tag, so each script touches one slot on a Cluster.

use std::collections::HashMap;

use async_trait::async_trait;
use parking_lot::Mutex;
use redis::Script;
use serde::{Deserialize, Serialize};

use crate::queue::StoreError;
use crate::redis_connection::{Connection, Timeouts};

/// What a watch last reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchSnapshot {
    /// The sequence number of the last change reported (0 before the first).
    pub sequence: u64,
    /// The span the products were ranked in (`daily:20260717`); a new span starts from an empty top.
    pub span: String,
    /// The watched top N's product ids, best first.
    pub products: Vec<String>,
}

/// The lease and the snapshots of webhook watches.
#[async_trait]
pub trait WatchLedger: Send + Sync + 'static {
    /// Takes or renews the lease for `owner` for `ttl_millis`; true while `owner` holds it.
    async fn hold_lease(&self, owner: &str, ttl_millis: u64) -> Result<bool, StoreError>;
    /// Gives the lease up if `owner` holds it (clean shutdown), so another instance takes over at once.
    async fn release_lease(&self, owner: &str) -> Result<(), StoreError>;
    /// The snapshot recorded for `watch`, if any.
    async fn snapshot(&self, watch: &str) -> Result<Option<WatchSnapshot>, StoreError>;
    /// Records `snapshot` for `watch` if `owner` still holds the lease; false (nothing written) if not.
    async fn record(&self, owner: &str, watch: &str, snapshot: &WatchSnapshot) -> Result<bool, StoreError>;
}

/// One process, one ledger: the lease is always held; snapshots are kept in memory and, when opened
/// with [`EmbeddedWatchLedger::persisted`], in a file.
#[derive(Default)]
pub struct EmbeddedWatchLedger {
    snapshots: Mutex<HashMap<String, WatchSnapshot>>,
    /// Where snapshots are kept across restarts (`None`: memory only).
    file: Option<std::path::PathBuf>,
}

impl EmbeddedWatchLedger {
    /// A ledger kept in `file` (created on the first record; an unreadable file is refused).
    pub fn persisted(file: std::path::PathBuf) -> Result<EmbeddedWatchLedger, StoreError> {
        let snapshots = match std::fs::read(&file) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| StoreError::Corrupt(format!("{}: {e}", file.display())))?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => HashMap::new(),
            Err(error) => {
                return Err(StoreError::Unavailable(format!("{}: {error}", file.display())));
            }
        };
        Ok(EmbeddedWatchLedger {
            snapshots: Mutex::new(snapshots),
            file: Some(file),
        })
    }
}

#[async_trait]
impl WatchLedger for EmbeddedWatchLedger {
    async fn hold_lease(&self, _owner: &str, _ttl_millis: u64) -> Result<bool, StoreError> {
        Ok(true)
    }

    async fn release_lease(&self, _owner: &str) -> Result<(), StoreError> {
        Ok(())
    }

    async fn snapshot(&self, watch: &str) -> Result<Option<WatchSnapshot>, StoreError> {
        Ok(self.snapshots.lock().get(watch).cloned())
    }

    async fn record(&self, _owner: &str, watch: &str, snapshot: &WatchSnapshot) -> Result<bool, StoreError> {
        let encoded = {
            let mut snapshots = self.snapshots.lock();
            snapshots.insert(watch.to_string(), snapshot.clone());
            self.file
                .as_ref()
                .map(|_| serde_json::to_vec(&*snapshots).expect("snapshots serialize"))
        };
        if let (Some(file), Some(encoded)) = (self.file.clone(), encoded) {
            // Written beside and renamed over, so a crash leaves the old file or the new one, whole.
            tokio::task::spawn_blocking(move || {
                let partial = file.with_extension("json.partial");
                std::fs::write(&partial, encoded)?;
                std::fs::rename(&partial, &file)
            })
            .await
            .map_err(|e| StoreError::Unavailable(format!("webhook ledger writer: {e}")))?
            .map_err(|e| StoreError::Unavailable(format!("writing the webhook ledger: {e}")))?;
        }
        Ok(true)
    }
}

/// The ledger on Redis (standalone or Cluster), shared by every instance on it.
pub struct RedisWatchLedger {
    connection: Connection,
    lease_key: String,
    state_key: String,
    lease: Script,
    record: Script,
}

impl RedisWatchLedger {
    /// Connects to `urls` (one URL, or Cluster nodes); keys start with `prefix`.
    pub async fn connect(urls: &[String], prefix: &str) -> Result<RedisWatchLedger, StoreError> {
        let (connection, _cluster) = Connection::open(urls, Timeouts::default()).await?;
        Ok(RedisWatchLedger {
            connection,
            lease_key: format!("{prefix}{{wh}}:lease"),
            state_key: format!("{prefix}{{wh}}:state"),
            // The same lease rules as the serving publisher's: take when free, renew when ours.
            lease: Script::new(include_str!("ranking/lua/serving_lease.lua")),
            record: Script::new(
                "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end \
                 redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) return 1",
            ),
        })
    }
}

#[async_trait]
impl WatchLedger for RedisWatchLedger {
    async fn hold_lease(&self, owner: &str, ttl_millis: u64) -> Result<bool, StoreError> {
        let held: i64 = self
            .connection
            .invoke(self.lease.key(&self.lease_key).arg(owner).arg(ttl_millis.max(1)))
            .await?;
        Ok(held == 1)
    }

    async fn release_lease(&self, owner: &str) -> Result<(), StoreError> {
        // Renewing for 1 ms hands the lease back almost at once, and only if it is still ours.
        self.hold_lease(owner, 1).await.map(|_| ())
    }

    async fn snapshot(&self, watch: &str) -> Result<Option<WatchSnapshot>, StoreError> {
        let raw: Option<String> = self
            .connection
            .query(redis::cmd("HGET").arg(&self.state_key).arg(watch))
            .await?;
        raw.map(|raw| {
            serde_json::from_str(&raw)
                .map_err(|e| StoreError::Corrupt(format!("webhook snapshot of {watch}: {e}")))
        })
        .transpose()
    }

    async fn record(&self, owner: &str, watch: &str, snapshot: &WatchSnapshot) -> Result<bool, StoreError> {
        let encoded = serde_json::to_string(snapshot).expect("snapshots serialize");
        let written: i64 = self
            .connection
            .invoke(
                self.record
                    .key(&self.lease_key)
                    .key(&self.state_key)
                    .arg(owner)
                    .arg(watch)
                    .arg(encoded),
            )
            .await?;
        Ok(written == 1)
    }
}
