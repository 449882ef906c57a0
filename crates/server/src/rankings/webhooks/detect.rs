//! The watch loop: every freshness interval, under the ledger's lease, each webhook's top N is read
//! through the reader and compared with the last snapshot; a change is enqueued as a delivery job
//! first and recorded second (see the module doc of [`super`] for why that order). A disabled webhook
//! is skipped: its snapshot stays at the last change enqueued, so the first round after it is enabled
//! again reports everything that changed meanwhile, in one delivery.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use rankgate_core::read::{parse_read_query, ReadContext, ReadEndpoint};
use rankgate_store::queue::NewJob;
use rankgate_store::ranking::engine::RankingQuery;
use rankgate_store::watch_ledger::WatchSnapshot;

use super::config::{ChangeKind, WebhookConfig};
use super::{Webhooks, JOB_QUEUE};
use crate::rankings::reader::TopRequest;

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
struct DeliveryBody<'a> {
    /// `<webhook>:<sequence>`: the dedupe key.
    id: String,
    webhook: &'a str,
    sequence: u64,
    /// When the change was seen (RFC 3339, UTC).
    time: String,
    ranking: RankingRef<'a>,
    events: Vec<Change>,
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

impl Webhooks {
    pub(super) async fn run_watch_until_stopped(self: Arc<Self>, shutdown: CancellationToken) {
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
            // Read once a round, from the job store every instance shares. Unreadable, no webhook is
            // skipped: a delivery enqueued for a disabled one is parked by the store all the same.
            let disabled = match self.disabled_names().await {
                Ok(disabled) => disabled,
                Err(error) => {
                    tracing::warn!(
                        error = format!("{error:#}"),
                        "disabled webhooks could not be read; will retry"
                    );
                    Default::default()
                }
            };
            for hook in self.hooks.iter().filter(|hook| !disabled.contains(&hook.name)) {
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
            let delivery = DeliveryBody {
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
}
