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

pub mod config;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use rankgate_core::period::Zone;
use rankgate_core::read::{parse_read_query, ReadContext, ReadEndpoint};
use rankgate_store::clock::Clock;
use rankgate_store::queue::jobs::{JobAckOutcome, JobCounts};
use rankgate_store::queue::token::hmac_sha256;
use rankgate_store::queue::{ClaimedJob, DeadJob, JobStore, NackOutcome, NewJob};
use rankgate_store::ranking::engine::RankingQuery;
use rankgate_store::watch_ledger::{WatchLedger, WatchSnapshot};

use crate::rankings::reader::{RankingsReader, TopRequest};
use config::{ChangeKind, WebhookConfig};

/// The job queue deliveries go through.
pub const JOB_QUEUE: &str = "webhooks";
/// Deliveries claimed (and in flight) per instance at once.
pub const CLAIM_BATCH: usize = 16;
/// How often the delivery loop looks for due jobs.
const DELIVERY_POLL: Duration = Duration::from_millis(200);
/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-rankgate-signature";
/// The delivery id header (`<webhook>:<sequence>`, also the body's `id`).
pub const DELIVERY_HEADER: &str = "x-rankgate-delivery";

/// The webhooks of this instance: detection (under the ledger's lease) and delivery.
pub struct Webhooks {
    hooks: Vec<WebhookConfig>,
    reader: Arc<RankingsReader>,
    ledger: Arc<dyn WatchLedger>,
    jobs: Arc<dyn JobStore>,
    http: reqwest::Client,
    clock: Arc<dyn Clock>,
    zone: Zone,
    metric_retention_millis: i64,
    freshness: Duration,
    /// This instance's lease owner id (random per process).
    owner: String,
}

/// The parts of the reader's top body a webhook needs.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TopBody {
    at: String,
    period: Option<String>,
    window: Option<String>,
    policy_version: u32,
    items: Vec<TopBodyItem>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TopBodyItem {
    product_id: String,
}

/// One change in a delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// `entered`, `left` or `moved`.
    pub kind: ChangeKind,
    /// The product.
    pub product_id: String,
    /// 1-based rank before; `null` for `entered`.
    pub old_rank: Option<usize>,
    /// 1-based rank now; `null` for `left`.
    pub new_rank: Option<usize>,
}

/// The watched ranking, as a delivery names it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct RankingRef<'a> {
    ranker: &'a str,
    category: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    period: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    window: Option<&'a str>,
    at: &'a str,
    limit: usize,
    policy_version: u32,
}

/// The body of one delivery.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Delivery<'a> {
    /// `<webhook>:<sequence>`: the dedupe key.
    id: String,
    webhook: &'a str,
    sequence: u64,
    /// When the change was seen (RFC 3339, UTC).
    time: String,
    ranking: RankingRef<'a>,
    events: Vec<Change>,
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

/// What one watch round did for one webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WatchOutcome {
    /// The top N is what was last reported.
    Unchanged,
    /// The first reading, recorded as the baseline.
    Baseline,
    /// Changed; a delivery was enqueued (or none of the changes is a kind this webhook posts).
    Changed,
    /// The lease moved to another instance during the round: nothing recorded.
    LeaseLost,
}

/// What one delivery attempt ended as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeliveryOutcome {
    Delivered,
    Retry,
    Dead,
    /// The webhook is no longer configured: the job is dropped.
    Unconfigured,
    /// The claim expired meanwhile (another instance has the job now).
    Stale,
}

impl DeliveryOutcome {
    fn label(self) -> &'static str {
        match self {
            DeliveryOutcome::Delivered => "delivered",
            DeliveryOutcome::Retry => "retry",
            DeliveryOutcome::Dead => "dead",
            DeliveryOutcome::Unconfigured => "unconfigured",
            DeliveryOutcome::Stale => "stale",
        }
    }
}

/// The changes from `before` to `after` (product ids best first): `left` in old order, then `entered`
/// and `moved` in new order.
pub fn changes_between(before: &[String], after: &[String]) -> Vec<Change> {
    let old_ranks: HashMap<&str, usize> = before
        .iter()
        .enumerate()
        .map(|(i, p)| (p.as_str(), i + 1))
        .collect();
    let new_ranks: HashMap<&str, usize> = after
        .iter()
        .enumerate()
        .map(|(i, p)| (p.as_str(), i + 1))
        .collect();
    let left = before
        .iter()
        .filter(|p| !new_ranks.contains_key(p.as_str()))
        .map(|p| Change {
            kind: ChangeKind::Left,
            product_id: p.clone(),
            old_rank: old_ranks.get(p.as_str()).copied(),
            new_rank: None,
        });
    let now_in = after.iter().enumerate().filter_map(|(i, p)| {
        let new_rank = i + 1;
        match old_ranks.get(p.as_str()) {
            None => Some(Change {
                kind: ChangeKind::Entered,
                product_id: p.clone(),
                old_rank: None,
                new_rank: Some(new_rank),
            }),
            Some(&old) if old != new_rank => Some(Change {
                kind: ChangeKind::Moved,
                product_id: p.clone(),
                old_rank: Some(old),
                new_rank: Some(new_rank),
            }),
            Some(_) => None,
        }
    });
    left.chain(now_in).collect()
}

/// `t=<seconds>,v1=<hex>` for `body` signed with `secret` at `unix_seconds`.
pub fn signature_header(secret: &[u8], unix_seconds: i64, body: &[u8]) -> String {
    let mut message = format!("{unix_seconds}.").into_bytes();
    message.extend_from_slice(body);
    let mac = hmac_sha256(secret, &message);
    format!("t={unix_seconds},v1={}", hex::encode(mac))
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

    async fn run_watch_until_stopped(self: Arc<Self>, shutdown: CancellationToken) {
        let lease_millis = (self.freshness.as_millis() as u64 * 8).max(3_000);
        let mut ticker = tokio::time::interval(self.freshness);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Snapshots as this instance last recorded them, trusted only while it holds the lease without a
        // break (another holder may have recorded newer ones meanwhile).
        let mut recorded: HashMap<String, WatchSnapshot> = HashMap::new();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = ticker.tick() => {}
            }
            match self.ledger.hold_lease(&self.owner, lease_millis).await {
                Ok(true) => {}
                Ok(false) => {
                    recorded.clear();
                    continue;
                }
                Err(error) => {
                    recorded.clear();
                    tracing::warn!(error = %error, "the webhook lease could not be checked; will retry");
                    continue;
                }
            }
            for hook in &self.hooks {
                match self.watch_once(hook, &mut recorded).await {
                    Ok(WatchOutcome::LeaseLost) => {
                        recorded.clear();
                        break;
                    }
                    Ok(_) => {}
                    Err(error) => tracing::warn!(
                        webhook = hook.name.as_str(),
                        error = format!("{error:#}"),
                        "a webhook's ranking could not be compared; will retry"
                    ),
                }
            }
        }
        let _ = self.ledger.release_lease(&self.owner).await;
    }

    /// Compares one webhook's ranking with its last snapshot; enqueues a delivery when it changed.
    async fn watch_once(
        &self,
        hook: &WebhookConfig,
        recorded: &mut HashMap<String, WatchSnapshot>,
    ) -> anyhow::Result<WatchOutcome> {
        let now_millis = self.clock.now_millis();
        let context = ReadContext {
            zone: &self.zone,
            now_millis,
            metric_retention_millis: self.metric_retention_millis,
        };
        let parsed = parse_read_query(ReadEndpoint::Top, &hook.query, &context)?;
        let request = TopRequest {
            query: RankingQuery {
                ranker: parsed.ranker,
                category: hook.category.clone(),
                span: parsed.span,
            },
            offset: 0,
            limit: hook.limit,
        };
        let body = self.reader.top(&request).await?;
        let top: TopBody = serde_json::from_slice(&body).context("the reader's top body")?;
        let span_name = top.period.as_deref().or(top.window.as_deref()).unwrap_or("");
        let span = format!("{span_name}:{}", top.at);
        let products: Vec<String> = top.items.into_iter().map(|item| item.product_id).collect();
        let previous = match recorded.get(&hook.name) {
            Some(snapshot) => Some(snapshot.clone()),
            None => self.ledger.snapshot(&hook.name).await?,
        };
        let Some(previous) = previous else {
            let baseline = WatchSnapshot {
                sequence: 0,
                span,
                products,
            };
            return self
                .record(hook, baseline, recorded, WatchOutcome::Baseline)
                .await;
        };
        if previous.span == span && previous.products == products {
            recorded.insert(hook.name.clone(), previous);
            return Ok(WatchOutcome::Unchanged);
        }
        let before: &[String] = if previous.span == span {
            &previous.products
        } else {
            &[]
        };
        let events: Vec<Change> = changes_between(before, &products)
            .into_iter()
            .filter(|change| hook.events.contains(&change.kind))
            .collect();
        let mut sequence = previous.sequence;
        if !events.is_empty() {
            sequence += 1;
            let id = format!("{}:{sequence}", hook.name);
            let delivery = Delivery {
                id: id.clone(),
                webhook: &hook.name,
                sequence,
                time: jiff::Timestamp::from_millisecond(now_millis)
                    .map(|ts| format!("{ts:.3}"))
                    .unwrap_or_default(),
                ranking: RankingRef {
                    ranker: parsed.ranker.as_str(),
                    category: hook.category.as_str(),
                    period: top.period.as_deref(),
                    window: top.window.as_deref(),
                    at: &top.at,
                    limit: hook.limit,
                    policy_version: top.policy_version,
                },
                events,
            };
            let payload = serde_json::to_vec(&delivery).expect("deliveries serialize");
            self.jobs
                .enqueue(
                    JOB_QUEUE,
                    NewJob {
                        id,
                        payload,
                        delay_ms: 0,
                        policy: hook.retry,
                    },
                )
                .await?;
        }
        let snapshot = WatchSnapshot {
            sequence,
            span,
            products,
        };
        self.record(hook, snapshot, recorded, WatchOutcome::Changed).await
    }

    async fn record(
        &self,
        hook: &WebhookConfig,
        snapshot: WatchSnapshot,
        recorded: &mut HashMap<String, WatchSnapshot>,
        outcome: WatchOutcome,
    ) -> anyhow::Result<WatchOutcome> {
        if !self.ledger.record(&self.owner, &hook.name, &snapshot).await? {
            return Ok(WatchOutcome::LeaseLost);
        }
        recorded.insert(hook.name.clone(), snapshot);
        Ok(outcome)
    }

    async fn run_delivery_until_stopped(self: Arc<Self>, shutdown: CancellationToken) {
        let longest_timeout = self
            .hooks
            .iter()
            .map(|hook| hook.timeout)
            .max()
            .unwrap_or(Duration::from_secs(5));
        // A claim outlives the slowest attempt, so the reaper never hands a job in flight to another
        // instance.
        let claim_millis = longest_timeout.as_millis() as i64 + 5_000;
        let mut ticker = tokio::time::interval(DELIVERY_POLL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut rounds: u64 = 0;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            rounds += 1;
            if let Err(error) = self.deliver_due(claim_millis).await {
                tracing::warn!(error = %error, "webhook deliveries could not be claimed; will retry");
            }
            // The job counts once a second: the dead-letter gauge for alerts.
            if rounds.is_multiple_of(5) {
                if let Ok(counts) = self.jobs.counts(JOB_QUEUE).await {
                    publish_counts(&counts);
                }
            }
        }
    }

    async fn deliver_due(&self, claim_millis: i64) -> Result<(), rankgate_store::queue::StoreError> {
        self.jobs.reap_expired(JOB_QUEUE).await?;
        let claimed = self.jobs.claim_due(JOB_QUEUE, CLAIM_BATCH, claim_millis).await?;
        let attempts = claimed.into_iter().map(|job| self.deliver(job));
        for (webhook, outcome) in futures_util::future::join_all(attempts).await {
            metrics::counter!(
                "rankgate_webhook_deliveries_total",
                "webhook" => webhook,
                "outcome" => outcome.label()
            )
            .increment(1);
        }
        Ok(())
    }

    /// One attempt of one delivery.
    async fn deliver(&self, job: ClaimedJob) -> (String, DeliveryOutcome) {
        let name = job
            .id
            .rsplit_once(':')
            .map_or(job.id.as_str(), |(name, _)| name)
            .to_string();
        let Some(hook) = self.hooks.iter().find(|hook| hook.name == name) else {
            tracing::warn!(
                delivery = job.id.as_str(),
                "a delivery for a webhook no longer configured is dropped"
            );
            let _ = self.jobs.ack(JOB_QUEUE, &job.id, job.claim_token).await;
            return (name, DeliveryOutcome::Unconfigured);
        };
        let unix_seconds = self.clock.now_millis().div_euclid(1000);
        let signature = signature_header(hook.secret(), unix_seconds, &job.payload);
        let sent = self
            .http
            .post(hook.url.clone())
            .timeout(hook.timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature)
            .header(DELIVERY_HEADER, job.id.as_str())
            .header("x-rankgate-attempt", job.attempt.to_string())
            .body(job.payload.clone())
            .send()
            .await;
        // The reason is kept with the job (admin view): a status or an error class, never a URL (it
        // could be shown to someone who may not see the receiver's address) or a secret.
        let failure = match &sent {
            Ok(response) if response.status().is_success() => None,
            Ok(response) => Some(format!("the receiver answered {}", response.status().as_u16())),
            Err(error) if error.is_timeout() => Some("no answer within timeout_millis".to_string()),
            Err(error) if error.is_connect() => Some("the receiver could not be reached".to_string()),
            Err(_) => Some("the request failed".to_string()),
        };
        let outcome = match failure {
            None => match self.jobs.ack(JOB_QUEUE, &job.id, job.claim_token).await {
                Ok(JobAckOutcome::Done) => DeliveryOutcome::Delivered,
                Ok(JobAckOutcome::Stale) => DeliveryOutcome::Stale,
                Err(error) => {
                    tracing::warn!(delivery = job.id.as_str(), error = %error, "a delivered webhook could not be acked; it may be sent again");
                    DeliveryOutcome::Stale
                }
            },
            Some(reason) => match self.jobs.nack(JOB_QUEUE, &job.id, job.claim_token, &reason).await {
                Ok(NackOutcome::RetryAt(_)) => DeliveryOutcome::Retry,
                Ok(NackOutcome::Dead) => {
                    tracing::warn!(
                        delivery = job.id.as_str(),
                        attempts = job.attempt,
                        reason = reason.as_str(),
                        "a webhook delivery is dead-lettered after its last attempt"
                    );
                    DeliveryOutcome::Dead
                }
                Ok(NackOutcome::StaleClaim) => DeliveryOutcome::Stale,
                Err(error) => {
                    tracing::warn!(delivery = job.id.as_str(), error = %error, "a failed webhook delivery could not be rescheduled; the reaper will");
                    DeliveryOutcome::Stale
                }
            },
        };
        (name, outcome)
    }
}

fn publish_counts(counts: &JobCounts) {
    metrics::gauge!("rankgate_webhook_jobs", "state" => "ready").set(counts.ready as f64);
    metrics::gauge!("rankgate_webhook_jobs", "state" => "processing").set(counts.processing as f64);
    metrics::gauge!("rankgate_webhook_jobs", "state" => "dead").set(counts.dead as f64);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn changes_name_what_entered_left_and_moved() {
        let changes = changes_between(&ids(&["a", "b", "c"]), &ids(&["b", "d", "c"]));
        let summary: Vec<(ChangeKind, &str, Option<usize>, Option<usize>)> = changes
            .iter()
            .map(|c| (c.kind, c.product_id.as_str(), c.old_rank, c.new_rank))
            .collect();
        assert_eq!(
            summary,
            vec![
                (ChangeKind::Left, "a", Some(1), None),
                (ChangeKind::Moved, "b", Some(2), Some(1)),
                (ChangeKind::Entered, "d", None, Some(2)),
            ]
        );
        assert!(changes_between(&ids(&["a"]), &ids(&["a"])).is_empty());
    }

    #[test]
    fn the_signature_is_hmac_sha256_over_the_timestamp_and_body() {
        // Python: hmac.new(b"whsec-0123456789abcdef", b"1700000000.{}", hashlib.sha256).hexdigest()
        assert_eq!(
            signature_header(b"whsec-0123456789abcdef", 1_700_000_000, b"{}"),
            "t=1700000000,v1=2d586df5f91a6ea5c4bc37bd80e94fb1103f9da69ee9cbd3f6a22a939e1fe1f8"
        );
    }
}
