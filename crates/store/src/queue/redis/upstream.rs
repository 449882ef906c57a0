//! [`UpstreamObservationStore`] on Redis: the gate measurements of every instance sharing this Redis are
//! summed per queue and control interval, and each interval is closed by exactly one instance.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `P{rg:q:<queue>}:upstream:<interval>` | hash | `b<i>` latency bucket counts, `ok`, `s5`, `other`, `timeout`, `transport`; `closed` once handed out |
//! | `P{rg:q:<queue>}:upstream:last` | string | JSON of the last closed interval's `IntervalSummary` |
//!
//! Both carry the queue's hash tag (one slot with the queue's keys on a Cluster) and expire on their own
//! ([`INTERVAL_TTL_MS`], [`SUMMARY_TTL_MS`]), so a deleted or forgotten queue leaves nothing behind for
//! long. Adding and closing are one script each, so an add racing the close either lands before it (and is
//! counted) or sees `closed` and is dropped: a sample is never counted twice nor handed to two controllers.

use std::sync::OnceLock;

use async_trait::async_trait;
use rankgate_core::queue::adaptive::{IntervalSummary, LATENCY_BUCKETS};
use rankgate_core::queue::{QueueName, UpstreamSamples};
use redis::Script;

use super::{RedisStore, Reply};
use crate::queue::upstream::UpstreamObservationStore;
use crate::queue::StoreError;

/// How long an interval's sums live: well past any grace period, short enough to be no cost.
const INTERVAL_TTL_MS: i64 = 120_000;
/// How long the last summary is shown when no interval is closed any more (no gate traffic).
const SUMMARY_TTL_MS: i64 = 3_600_000;

/// `KEYS[1]` the interval hash; `ARGV` field, increment pairs, then the TTL last. Dropped once closed.
const ADD_SAMPLES: &str = r"
if redis.call('HEXISTS', KEYS[1], 'closed') == 1 then return 0 end
for i = 1, #ARGV - 1, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[#ARGV])
return 1
";

/// `KEYS[1]` the interval hash, `ARGV[1]` the TTL: the first caller gets every field, later callers `{}`.
const CLOSE_INTERVAL: &str = r"
if redis.call('HSETNX', KEYS[1], 'closed', '1') == 0 then return {0} end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
local out = {1}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all do out[#out + 1] = all[i] end
return out
";

fn add_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(ADD_SAMPLES))
}

fn close_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(CLOSE_INTERVAL))
}

/// The non-zero fields of `samples`, as hash field → count.
fn sample_fields(samples: &UpstreamSamples) -> Vec<(String, u64)> {
    let mut fields: Vec<(String, u64)> = samples
        .latency_buckets
        .iter()
        .enumerate()
        .filter(|(_, count)| **count > 0)
        .map(|(index, count)| (format!("b{index}"), *count))
        .collect();
    for (name, count) in [
        ("ok", samples.success),
        ("s5", samples.server_errors),
        ("other", samples.other_status),
        ("timeout", samples.timeouts),
        ("transport", samples.transport_errors),
    ] {
        if count > 0 {
            fields.push((name.to_string(), count));
        }
    }
    fields
}

/// Samples from the hash's fields (unknown fields, such as `closed`, are skipped).
fn samples_from_fields(mut pairs: Reply) -> Result<UpstreamSamples, StoreError> {
    let mut samples = UpstreamSamples::default();
    while !pairs.is_empty() {
        let field = pairs.string()?;
        let count: u64 = pairs
            .string()?
            .parse()
            .map_err(|_| StoreError::Corrupt(format!("upstream sample {field} is unreadable")))?;
        match field.as_str() {
            "ok" => samples.success = count,
            "s5" => samples.server_errors = count,
            "other" => samples.other_status = count,
            "timeout" => samples.timeouts = count,
            "transport" => samples.transport_errors = count,
            bucket => {
                if let Some(index) = bucket
                    .strip_prefix('b')
                    .and_then(|i| i.parse::<usize>().ok())
                    .filter(|i| *i < LATENCY_BUCKETS)
                {
                    samples.latency_buckets[index] = count;
                }
            }
        }
    }
    Ok(samples)
}

impl RedisStore {
    fn upstream_interval_key(&self, queue: &QueueName, interval: i64) -> String {
        format!(
            "{}{{rg:q:{}}}:upstream:{interval}",
            self.options.prefix,
            queue.as_str()
        )
    }

    fn upstream_summary_key(&self, queue: &QueueName) -> String {
        format!("{}{{rg:q:{}}}:upstream:last", self.options.prefix, queue.as_str())
    }
}

#[async_trait]
impl UpstreamObservationStore for RedisStore {
    async fn add_samples(
        &self,
        queue: &QueueName,
        interval: i64,
        samples: &UpstreamSamples,
    ) -> Result<(), StoreError> {
        self.check()?;
        let fields = sample_fields(samples);
        if fields.is_empty() {
            return Ok(());
        }
        let mut call = add_script().prepare_invoke();
        call.key(self.upstream_interval_key(queue, interval));
        for (field, count) in fields {
            call.arg(field).arg(count);
        }
        call.arg(INTERVAL_TTL_MS);
        let _: i64 = self.connection.invoke(&call).await?;
        Ok(())
    }

    async fn close_interval(
        &self,
        queue: &QueueName,
        interval: i64,
    ) -> Result<Option<UpstreamSamples>, StoreError> {
        self.check()?;
        let mut call = close_script().prepare_invoke();
        call.key(self.upstream_interval_key(queue, interval));
        call.arg(INTERVAL_TTL_MS);
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        if reply.int()? == 0 {
            return Ok(None);
        }
        samples_from_fields(reply).map(Some)
    }

    async fn publish_summary(&self, queue: &QueueName, summary: &IntervalSummary) -> Result<(), StoreError> {
        self.check()?;
        let json = serde_json::to_string(summary)
            .map_err(|e| StoreError::Corrupt(format!("upstream summary: {e}")))?;
        let _: () = self
            .connection
            .query(
                redis::cmd("SET")
                    .arg(self.upstream_summary_key(queue))
                    .arg(json)
                    .arg("PX")
                    .arg(SUMMARY_TTL_MS),
            )
            .await?;
        Ok(())
    }

    async fn last_summary(&self, queue: &QueueName) -> Result<Option<IntervalSummary>, StoreError> {
        self.check()?;
        let raw: Option<String> = self
            .connection
            .query(redis::cmd("GET").arg(self.upstream_summary_key(queue)))
            .await?;
        raw.map(|json| {
            serde_json::from_str(&json)
                .map_err(|_| StoreError::Corrupt("upstream summary is unreadable".into()))
        })
        .transpose()
    }
}
