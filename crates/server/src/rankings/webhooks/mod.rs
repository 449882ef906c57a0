//! Webhooks: "entered / left / moved within the top N" posted to the shop when a watched ranking changes.
//!
//! ```text
//! watch loop (every instance; only the WatchLedger lease holder works), every freshness interval:
//!   for each [[webhook]]: reader.top(ranking, N) ─► product ids in order
//!     vs the ledger's snapshot (sequence, span, products) ─► entered / left / moved
//!     changed ─► JobStore::enqueue("webhooks", id = "<webhook>:<sequence+1>", body)   (1)
//!             ─► WatchLedger::record(snapshot)  — fenced by the lease                 (2)
//! delivery loop (every instance): claim due jobs ─► POST body, signed ─► 2xx: ack
//!   anything else: nack ─► retried with capped exponential backoff and jitter (core::job),
//!   dead-lettered after max_attempts (rankgate_webhook_jobs{state="dead"}, GET /v1/admin/webhooks)
//! ```
//!
//! - **Once across instances.** Detection runs under the ledger's lease (`P{wh}:lease` on Redis): with
//!   several instances on one Redis, one of them numbers and enqueues each change. The job id is
//!   deterministic, `<webhook>:<sequence>`, and (1) comes before (2): a holder that dies in between
//!   leaves the next holder to compute the same id, which the job store ignores while the job exists. So
//!   a change is delivered at least once and, barring that crash, exactly once; the id is in the body
//!   and in `X-Rankgate-Delivery` for receivers to drop a repeat. Delivery itself runs on every instance:
//!   the job queue's claim hands each job to one of them.
//! - **Spans.** A webhook watches the current period or window. When the span moves on (midnight for
//!   `daily`), the new span starts from an empty top N: its products arrive as `entered`; the old span's
//!   products are not reported as `left`. The very first reading (no snapshot yet: a webhook's first
//!   start) is recorded silently as a baseline, so adding a webhook does not post the whole top N. The
//!   snapshots outlive restarts (Redis, or `webhooks.json` in the embedded data dir), so a change made
//!   while no instance ran is reported at the next start.
//! - **Signatures.** `X-Rankgate-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`,
//!   made at each attempt (so `t` is the attempt's time, for receivers to refuse old replays). Secrets
//!   stay in the config: jobs hold only the body, and no log, error or admin view shows a secret.
//! - **Bounds.** At most [`config::MAX_WEBHOOKS`] webhooks; a body holds at most 2 × N ≤ 2,000 changes;
//!   [`CLAIM_BATCH`] deliveries in flight per instance; redirects are not followed.

//!
//! # Layout
//! - this module: [`Webhooks`], opened with the rankings ([`open`]), and its admin view;
//! - [`detect`]: the watch loop: the top N compared with the ledger's snapshot, deliveries enqueued;
//! - [`deliver`]: the delivery loop: due jobs claimed and posted, acked or retried;
//! - [`sign`]: the signature a receiver checks;
//! - [`config`]: the `[[webhook]]` tables.

pub mod config;
pub mod deliver;
pub mod detect;
pub mod sign;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use rankgate_core::period::Zone;
use rankgate_store::clock::Clock;
use rankgate_store::queue::jobs::JobAckOutcome;
use rankgate_store::queue::{DeadJob, JobStore};
use rankgate_store::watch_ledger::{EmbeddedWatchLedger, RedisWatchLedger, WatchLedger};

use super::config::RankingsConfig;
use super::reader::RankingsReader;
use super::Storage;
use config::{ChangeKind, WebhookConfig};
pub use detect::{changes_between, Change};
pub use sign::{signature_header, DELIVERY_HEADER, SIGNATURE_HEADER};

/// The job queue deliveries go through.
pub const JOB_QUEUE: &str = "webhooks";
/// Deliveries claimed (and in flight) per instance at once.
pub const CLAIM_BATCH: usize = 16;

/// The webhooks of this instance: detection (under the ledger's lease) and delivery.
pub struct Webhooks {
    pub(super) hooks: Vec<WebhookConfig>,
    pub(super) reader: Arc<RankingsReader>,
    pub(super) ledger: Arc<dyn WatchLedger>,
    pub(super) jobs: Arc<dyn JobStore>,
    pub(super) http: reqwest::Client,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) zone: Zone,
    pub(super) metric_retention_millis: i64,
    pub(super) freshness: Duration,
    /// This instance's lease owner id (random per process).
    pub(super) owner: String,
}

/// The admin view of one webhook (`GET /v1/admin/webhooks`): never the secret.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookView {
    name: String,
    url: String,
    category: String,
    ranking: String,
    events: Vec<ChangeKind>,
    max_attempts: u32,
}

/// A dead-lettered delivery in the admin view.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadDeliveryView {
    id: String,
    died_at_millis: i64,
    reason: String,
}

/// `GET /v1/admin/webhooks`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhooksView {
    webhooks: Vec<WebhookView>,
    ready: u64,
    processing: u64,
    dead: u64,
    /// The oldest dead deliveries (at most 100).
    dead_deliveries: Vec<DeadDeliveryView>,
}

/// The webhooks of `config`: numbered under a lease in Redis when instances share one (so each change
/// is delivered once, not once per instance), in memory otherwise; delivered through `jobs`
/// (the waiting room's job store, embedded or Redis).
pub async fn open(
    config: &RankingsConfig,
    storage: &Storage,
    jobs: &Arc<dyn JobStore>,
    reader: &Arc<RankingsReader>,
    clock: &Arc<dyn Clock>,
) -> anyhow::Result<Webhooks> {
    let ledger: Arc<dyn WatchLedger> = if storage.redis.is_empty() || config.webhooks.is_empty() {
        if config.database.is_some() && !config.webhooks.is_empty() {
            tracing::warn!(
                "[[webhook]] with a shared database but no --redis: each instance detects and delivers \
                 changes on its own; give --redis to deliver each change once across instances"
            );
        }
        Arc::new(
            EmbeddedWatchLedger::persisted(storage.data_dir.join("webhooks.json"))
                .context("opening the webhook ledger (webhooks.json in the data dir)")?,
        )
    } else {
        Arc::new(
            RedisWatchLedger::connect(&storage.redis, &storage.redis_prefix)
                .await
                .context("opening the webhook ledger on Redis (check --redis)")?,
        )
    };
    Webhooks::new(
        config.webhooks.clone(),
        reader.clone(),
        ledger,
        jobs.clone(),
        clock.clone(),
        config.zone.clone(),
        config.metric_retention_millis,
        Duration::from_millis(config.freshness_millis.max(1)),
    )
}

impl Webhooks {
    /// The webhooks of `hooks`, reading through `reader`, numbered in `ledger`, delivered through `jobs`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        hooks: Vec<WebhookConfig>,
        reader: Arc<RankingsReader>,
        ledger: Arc<dyn WatchLedger>,
        jobs: Arc<dyn JobStore>,
        clock: Arc<dyn Clock>,
        zone: Zone,
        metric_retention_millis: i64,
        freshness: Duration,
    ) -> anyhow::Result<Webhooks> {
        // Redirects are not followed: a receiver's 3xx is a failed delivery, never a signed body sent to
        // wherever it points.
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(15))
            .build()
            .context("building the webhook HTTP client")?;
        let owner = {
            use rand::Rng;
            let bytes: [u8; 16] = rand::rng().random();
            hex::encode(bytes)
        };
        Ok(Webhooks {
            hooks,
            reader,
            ledger,
            jobs,
            http,
            clock,
            zone,
            metric_retention_millis,
            freshness,
            owner,
        })
    }

    /// Whether any webhook is configured (no workers otherwise).
    pub fn is_empty(&self) -> bool {
        self.hooks.is_empty()
    }

    /// Starts the watch loop and the delivery loop.
    pub fn spawn_workers(self: &Arc<Self>, shutdown: CancellationToken) -> Vec<tokio::task::JoinHandle<()>> {
        vec![
            tokio::spawn(Arc::clone(self).run_watch_until_stopped(shutdown.clone())),
            tokio::spawn(Arc::clone(self).run_delivery_until_stopped(shutdown)),
        ]
    }

    /// The admin view: webhooks (no secrets), job counts and the oldest dead deliveries.
    pub async fn view(&self) -> anyhow::Result<WebhooksView> {
        let counts = self.jobs.counts(JOB_QUEUE).await?;
        let dead = self.jobs.dead_jobs(JOB_QUEUE, 100).await?;
        Ok(WebhooksView {
            webhooks: self
                .hooks
                .iter()
                .map(|hook| WebhookView {
                    name: hook.name.clone(),
                    url: hook.url.to_string(),
                    category: hook.category.as_str().to_string(),
                    ranking: hook.query.clone(),
                    events: hook.events.clone(),
                    max_attempts: hook.retry.max_attempts,
                })
                .collect(),
            ready: counts.ready,
            processing: counts.processing,
            dead: counts.dead,
            dead_deliveries: dead
                .into_iter()
                .map(|job: DeadJob| DeadDeliveryView {
                    id: job.id,
                    died_at_millis: job.died_at_ms,
                    reason: job.reason,
                })
                .collect(),
        })
    }

    /// Puts a dead delivery back in the queue, due now, with fresh attempts.
    pub async fn replay_dead(&self, id: &str) -> anyhow::Result<bool> {
        Ok(self.jobs.replay_dead(JOB_QUEUE, id).await? == JobAckOutcome::Done)
    }
}
