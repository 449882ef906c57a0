//! Webhooks: "entered / left / moved within the top N" posted to the shop when a watched ranking changes.
//!
//! ```text
//! watch loop (every instance; only the WatchLedger lease holder works), every freshness interval:
//!   for each [[webhook]]: reader.top(ranking, N) ─► product ids in order
//!     vs the ledger's snapshot (sequence, span, products) ─► entered / left / moved
//!     changed ─► JobStore::enqueue("webhooks", id = "<webhook>:<sequence+1>", body)   (1)
//!             ─► WatchLedger::record(snapshot)  — fenced by the lease                 (2)
//! delivery loop (every instance): claim due jobs ─► POST body, signed ─► 2xx: ack
//!   410 Gone: JobStore::pause_group(webhook) ─► this and every pending delivery of it parked
//!   anything else: nack ─► retried with capped exponential backoff and jitter (core::job), not before a
//!     429/503's Retry-After (within the cap), dead-lettered after max_attempts
//!     (rankgate_webhook_jobs{state="dead"}, GET /v1/admin/webhooks)
//! PUT /v1/admin/webhooks/{name} {"enabled": true} ─► JobStore::resume_group ─► parked deliveries due now
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
//! - **Signatures.** Standard Webhooks (`webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64
//!   HMAC-SHA256 over "<id>.<timestamp>.<body>">`) and rankgate's older `X-Rankgate-Signature: t=…,v1=…`,
//!   both made at each attempt ([`sign`]). Secrets stay in the config: jobs hold only the body, and no
//!   log, error or admin view shows a secret.
//! - **Disabled webhooks.** A receiver's `410 Gone` pauses the webhook's job group (ids `<webhook>:…`) in
//!   the job store, beside its jobs: every instance sharing the store stops delivering it, and the pause
//!   outlives restarts. Its pending deliveries are **parked**, not dropped, and the watch loop stops
//!   comparing its ranking (its snapshot stays at the last change enqueued). Re-enabled, the parked
//!   deliveries go out at once with fresh attempts, and the next round posts one delivery with everything
//!   that changed while it was disabled: the receiver sees the numbered chain without a gap, and the
//!   backlog cannot grow while nobody listens. Dropping would have left a receiver's copy of the top N
//!   wrong, silently, until the next change of each product.
//! - **Bounds.** At most [`config::MAX_WEBHOOKS`] webhooks; a body holds at most 2 × N ≤ 2,000 changes;
//!   [`CLAIM_BATCH`] deliveries in flight per instance; redirects are not followed.

//!
//! # Layout
//! - this module: [`Webhooks`], opened with the rankings ([`open`]), and its admin view;
//! - [`detect`]: the watch loop: the top N compared with the ledger's snapshot, deliveries enqueued;
//! - [`deliver`]: the delivery loop: due jobs claimed and posted, acked or retried;
//! - [`sign`]: the signatures a receiver checks;
//! - [`retry_after`]: a receiver's `Retry-After`, read defensively;
//! - [`config`]: the `[[webhook]]` tables.

pub mod config;
pub mod deliver;
pub mod detect;
pub mod retry_after;
pub mod sign;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use rankgate_core::period::Zone;
use rankgate_store::clock::Clock;
use rankgate_store::queue::jobs::JobAckOutcome;
use rankgate_store::queue::{DeadJob, JobStore, PausedGroup};
use rankgate_store::watch_ledger::{EmbeddedWatchLedger, RedisWatchLedger, WatchLedger};

use super::config::RankingsConfig;
use super::reader::RankingsReader;
use super::Storage;
use config::{ChangeKind, WebhookConfig};
pub use detect::{changes_between, Change};
pub use sign::{
    signature_header, standard_signature_header, DELIVERY_HEADER, SIGNATURE_HEADER, STANDARD_ID_HEADER,
    STANDARD_SIGNATURE_HEADER, STANDARD_TIMESTAMP_HEADER,
};

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
    /// Disabled (a receiver's 410, or an admin): nothing is delivered until it is enabled again.
    disabled: bool,
    /// Since when (RFC 3339, UTC); only when disabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    disabled_at: Option<String>,
    /// Why; only when disabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    disabled_reason: Option<String>,
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
    /// Deliveries held while their webhook is disabled.
    parked: u64,
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
        let paused = self.jobs.paused_groups(JOB_QUEUE).await?;
        Ok(WebhooksView {
            webhooks: self
                .hooks
                .iter()
                .map(|hook| webhook_view(hook, &paused))
                .collect(),
            ready: counts.ready,
            processing: counts.processing,
            dead: counts.dead,
            parked: counts.parked,
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

    /// Enables or disables webhook `name` (the admin's `PUT`): disabling parks its pending deliveries,
    /// enabling makes the parked ones due now with fresh attempts. `None` for a name not configured.
    pub async fn set_enabled(&self, name: &str, enabled: bool) -> anyhow::Result<Option<WebhookView>> {
        let Some(hook) = self.hooks.iter().find(|hook| hook.name == name) else {
            return Ok(None);
        };
        if enabled {
            if self.jobs.resume_group(JOB_QUEUE, name).await? {
                tracing::info!(
                    webhook = name,
                    "a webhook is enabled again; its parked deliveries are due now"
                );
            }
        } else if self
            .jobs
            .pause_group(JOB_QUEUE, name, "disabled by an admin")
            .await?
        {
            tracing::info!(
                webhook = name,
                "a webhook is disabled by an admin; its deliveries are parked"
            );
        }
        let paused = self.jobs.paused_groups(JOB_QUEUE).await?;
        Ok(Some(webhook_view(hook, &paused)))
    }

    /// The webhooks disabled now, by name.
    pub(super) async fn disabled_names(&self) -> anyhow::Result<std::collections::HashSet<String>> {
        Ok(self
            .jobs
            .paused_groups(JOB_QUEUE)
            .await?
            .into_iter()
            .map(|paused| paused.group)
            .collect())
    }

    /// Puts a dead delivery back in the queue, due now, with fresh attempts.
    pub async fn replay_dead(&self, id: &str) -> anyhow::Result<bool> {
        Ok(self.jobs.replay_dead(JOB_QUEUE, id).await? == JobAckOutcome::Done)
    }
}

/// `hook` as the admin view shows it, disabled if its group is among `paused`.
fn webhook_view(hook: &WebhookConfig, paused: &[PausedGroup]) -> WebhookView {
    let pause = paused.iter().find(|paused| paused.group == hook.name);
    WebhookView {
        name: hook.name.clone(),
        url: hook.url.to_string(),
        category: hook.category.as_str().to_string(),
        ranking: hook.query.clone(),
        events: hook.events.clone(),
        max_attempts: hook.retry.max_attempts,
        disabled: pause.is_some(),
        disabled_at: pause.map(|pause| {
            jiff::Timestamp::from_millisecond(pause.since_ms)
                .map(|at| format!("{at:.3}"))
                .unwrap_or_default()
        }),
        disabled_reason: pause.map(|pause| pause.reason.clone()),
    }
}
