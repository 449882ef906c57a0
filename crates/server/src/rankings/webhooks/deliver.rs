//! The delivery loop (every instance): due jobs claimed from the job queue, posted signed, then acked;
//! a failure is nacked and retried with the job queue's capped exponential backoff, and dead-lettered
//! after the webhook's `max_attempts`.
//!
//! Two answers say more than "failed" (as Standard Webhooks defines them):
//! - **`410 Gone`** disables the webhook: its job group is paused in the job store ([`JobStore::pause_group`]),
//!   which parks this delivery and every pending one of it, and the watch loop stops enqueueing for it, until
//!   an admin re-enables it (`PUT /v1/admin/webhooks/{name}`). Parked, not dropped: the deliveries are a
//!   numbered chain of changes, and a receiver brought back gets the ones it missed, in full, before the
//!   changes since (see [`super`]).
//! - **`Retry-After`** on a 429 or 503 sets the earliest next attempt ([`super::retry_after`]), within the
//!   webhook's backoff cap.
//!
//! [`JobStore::pause_group`]: rankgate_store::queue::JobStore::pause_group

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use rankgate_store::queue::jobs::{job_group, JobAckOutcome, JobCounts};
use rankgate_store::queue::{ClaimedJob, NackOutcome};

use super::retry_after::requested_delay_millis;
use super::sign::{
    signature_header, standard_signature_header, DELIVERY_HEADER, SIGNATURE_HEADER, STANDARD_ID_HEADER,
    STANDARD_SIGNATURE_HEADER, STANDARD_TIMESTAMP_HEADER,
};
use super::{Webhooks, CLAIM_BATCH, JOB_QUEUE};

/// How often the delivery loop looks for due jobs.
const DELIVERY_POLL: Duration = Duration::from_millis(200);

/// What one delivery attempt ended as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeliveryOutcome {
    Delivered,
    Retry,
    Dead,
    /// The receiver answered 410: the webhook is disabled and the delivery parked with it.
    Disabled,
    /// The webhook was disabled meanwhile (by another delivery's 410, or an admin): parked.
    Parked,
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
            DeliveryOutcome::Disabled => "disabled",
            DeliveryOutcome::Parked => "parked",
            DeliveryOutcome::Unconfigured => "unconfigured",
            DeliveryOutcome::Stale => "stale",
        }
    }
}

impl Webhooks {
    pub(super) async fn run_delivery_until_stopped(self: Arc<Self>, shutdown: CancellationToken) {
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
        // The webhook is the job's group (`<webhook>:<sequence>`), the unit a 410 pauses.
        let name = job_group(&job.id).unwrap_or(job.id.as_str()).to_string();
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
        let standard_signature =
            standard_signature_header(hook.standard_key(), &job.id, unix_seconds, &job.payload);
        let sent = self
            .http
            .post(hook.url.clone())
            .timeout(hook.timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(STANDARD_ID_HEADER, job.id.as_str())
            .header(STANDARD_TIMESTAMP_HEADER, unix_seconds.to_string())
            .header(STANDARD_SIGNATURE_HEADER, standard_signature)
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
        let status = sent.as_ref().ok().map(reqwest::Response::status);
        if status == Some(reqwest::StatusCode::GONE) {
            return (name.clone(), self.disable_on_gone(&name, &job).await);
        }
        // The receiver's Retry-After, only where HTTP gives it that meaning for a failure.
        let min_delay_millis = match (status, &sent) {
            (
                Some(reqwest::StatusCode::TOO_MANY_REQUESTS | reqwest::StatusCode::SERVICE_UNAVAILABLE),
                Ok(response),
            ) => response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|value| requested_delay_millis(value.as_bytes(), self.clock.now_millis()))
                .unwrap_or(0),
            _ => 0,
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
            Some(reason) => match self
                .jobs
                .nack_with_min_delay(JOB_QUEUE, &job.id, job.claim_token, &reason, min_delay_millis)
                .await
            {
                Ok(NackOutcome::RetryAt(_)) => DeliveryOutcome::Retry,
                Ok(NackOutcome::Parked) => DeliveryOutcome::Parked,
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

    /// The receiver answered `410 Gone`: the webhook's group is paused first (so this delivery, and any
    /// other of it that fails meanwhile, is parked, not retried), then this delivery is handed back.
    /// Should the pause not be stored, the delivery is retried as any failure, and its next 410 tries
    /// again.
    async fn disable_on_gone(&self, name: &str, job: &ClaimedJob) -> DeliveryOutcome {
        let reason = format!("the receiver answered 410 Gone to delivery {}", job.id);
        match self.jobs.pause_group(JOB_QUEUE, name, &reason).await {
            Ok(newly) => {
                if newly {
                    tracing::warn!(
                        webhook = name,
                        delivery = job.id.as_str(),
                        "a webhook is disabled: its receiver answered 410 Gone; its deliveries are parked \
                         until PUT /v1/admin/webhooks/{{name}} {{\"enabled\": true}}"
                    );
                }
            }
            Err(error) => {
                tracing::warn!(webhook = name, error = %error, "a webhook answered 410 but could not be disabled; will retry");
            }
        }
        match self
            .jobs
            .nack(JOB_QUEUE, &job.id, job.claim_token, "the receiver answered 410")
            .await
        {
            Ok(NackOutcome::Parked) => DeliveryOutcome::Disabled,
            Ok(NackOutcome::RetryAt(_)) => DeliveryOutcome::Retry,
            Ok(NackOutcome::Dead) => DeliveryOutcome::Dead,
            Ok(NackOutcome::StaleClaim) => DeliveryOutcome::Stale,
            Err(error) => {
                tracing::warn!(delivery = job.id.as_str(), error = %error, "a webhook delivery answered 410 could not be parked; the reaper will");
                DeliveryOutcome::Stale
            }
        }
    }
}

fn publish_counts(counts: &JobCounts) {
    metrics::gauge!("rankgate_webhook_jobs", "state" => "ready").set(counts.ready as f64);
    metrics::gauge!("rankgate_webhook_jobs", "state" => "processing").set(counts.processing as f64);
    metrics::gauge!("rankgate_webhook_jobs", "state" => "dead").set(counts.dead as f64);
    metrics::gauge!("rankgate_webhook_jobs", "state" => "parked").set(counts.parked as f64);
}
