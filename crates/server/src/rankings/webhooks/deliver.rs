//! The delivery loop (every instance): due jobs claimed from the job queue, posted signed, then acked;
//! a failure is nacked and retried with the job queue's capped exponential backoff, and dead-lettered
//! after the webhook's `max_attempts`.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use rankgate_store::queue::jobs::{JobAckOutcome, JobCounts};
use rankgate_store::queue::{ClaimedJob, NackOutcome};

use super::sign::{signature_header, DELIVERY_HEADER, SIGNATURE_HEADER};
use super::{Webhooks, CLAIM_BATCH, JOB_QUEUE};

/// How often the delivery loop looks for due jobs.
const DELIVERY_POLL: Duration = Duration::from_millis(200);

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
