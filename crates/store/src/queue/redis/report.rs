//! [`ReportStore`] on Redis: every instance adds its counts with one script per queue per flush, so the
//! stored report is the sum over instances.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `P{rg:q:<queue>}:report:m:<minute>` | hash | one minute's counters ([`ReportField::code`] → count) |
//! | `P{rg:q:<queue>}:report:minutes` | zset | the minutes kept (score = member = Unix minute) |
//! | `P{rg:q:<queue>}:report:totals` | hash | every count since the report began |
//! | `P{rg}:reports` | zset | queue → when its report was last written (ms), for `drop_reports_beyond` |
//!
//! The report's keys carry the queue's hash tag, so the add script touches one slot on a Cluster; the
//! minute hashes it makes and drops are named from the base key it is given, in that same slot. No TTL:
//! the queue's own keys are deleted when it goes idle and is forgotten, these are not (SPEC 2.5: kept
//! until the queue is deleted). The `{rg}` index is written after the report, so a crash in between
//! leaves a report that the next flush indexes.

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

use async_trait::async_trait;
use rankgate_core::queue::QueueName;
use redis::Script;

use super::RedisStore;
use crate::queue::report::{
    ReportCounts, ReportDelta, ReportField, ReportStore, StoredReport, REPORT_MINUTES_KEPT,
};
use crate::queue::StoreError;

/// `KEYS[1]` the minutes zset, `KEYS[2]` the totals hash; `ARGV[1]` the base key, `ARGV[2]` the minutes
/// kept, then per minute: minute, field count, and that many (field, increment) pairs.
const ADD_TO_REPORT: &str = r"
local base, kept = ARGV[1], tonumber(ARGV[2])
local i = 3
while i <= #ARGV do
  local minute, n = ARGV[i], tonumber(ARGV[i + 1])
  i = i + 2
  local key = base .. ':m:' .. minute
  for _ = 1, n do
    redis.call('HINCRBY', key, ARGV[i], ARGV[i + 1])
    redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1])
    i = i + 2
  end
  redis.call('ZADD', KEYS[1], minute, minute)
end
local newest = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if newest[2] then
  local cutoff = tonumber(newest[2]) - kept
  local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff)
  for _, m in ipairs(old) do redis.call('DEL', base .. ':m:' .. m) end
  if #old > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff) end
end
return 1
";

fn add_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(ADD_TO_REPORT))
}

/// Most minute hashes read or deleted per round trip.
const KEYS_PER_CALL: usize = 1_000;

fn counts_from(fields: HashMap<String, u64>) -> ReportCounts {
    let mut counts = ReportCounts::default();
    for (code, count) in fields {
        // A field of a later version is skipped, not an error: the report stays readable.
        if let Some(field) = ReportField::parse(&code) {
            counts.add(field, count);
        }
    }
    counts
}

impl RedisStore {
    fn report_base(&self, queue: &QueueName) -> String {
        format!("{}{{rg:q:{}}}:report", self.options.prefix, queue.as_str())
    }

    fn reports_index_key(&self) -> String {
        format!("{}{{rg}}:reports", self.options.prefix)
    }

    async fn report_minutes(&self, base: &str) -> Result<Vec<i64>, StoreError> {
        self.connection
            .query(redis::cmd("ZRANGE").arg(format!("{base}:minutes")).arg(0).arg(-1))
            .await
    }
}

#[async_trait]
impl ReportStore for RedisStore {
    async fn add_to_report(
        &self,
        queue: &QueueName,
        delta: &ReportDelta,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.check()?;
        if delta.is_empty() {
            return Ok(());
        }
        let base = self.report_base(queue);
        let mut call = add_script().prepare_invoke();
        call.key(format!("{base}:minutes"))
            .key(format!("{base}:totals"))
            .arg(&base)
            .arg(REPORT_MINUTES_KEPT);
        for (minute, counts) in &delta.minutes {
            if counts.is_empty() {
                continue;
            }
            call.arg(*minute).arg(counts.fields.len());
            for (field, count) in &counts.fields {
                call.arg(field.code()).arg(*count);
            }
        }
        let _: i64 = self.connection.invoke(&call).await?;
        let _: i64 = self
            .connection
            .query(
                redis::cmd("ZADD")
                    .arg(self.reports_index_key())
                    .arg(now_ms)
                    .arg(queue.as_str()),
            )
            .await?;
        Ok(())
    }

    async fn read_report(&self, queue: &QueueName) -> Result<Option<StoredReport>, StoreError> {
        self.check()?;
        let base = self.report_base(queue);
        let totals: HashMap<String, u64> = self
            .connection
            .query(redis::cmd("HGETALL").arg(format!("{base}:totals")))
            .await?;
        let minutes = self.report_minutes(&base).await?;
        if totals.is_empty() && minutes.is_empty() {
            return Ok(None);
        }
        let mut report = StoredReport {
            minutes: BTreeMap::new(),
            totals: counts_from(totals),
        };
        for chunk in minutes.chunks(KEYS_PER_CALL) {
            let mut pipeline = redis::pipe();
            for minute in chunk {
                pipeline.cmd("HGETALL").arg(format!("{base}:m:{minute}"));
            }
            let hashes: Vec<HashMap<String, u64>> = self.connection.pipeline(&pipeline).await?;
            for (minute, fields) in chunk.iter().zip(hashes) {
                report.minutes.insert(*minute, counts_from(fields));
            }
        }
        Ok(Some(report))
    }

    async fn read_report_totals(&self, queue: &QueueName) -> Result<Option<ReportCounts>, StoreError> {
        self.check()?;
        let totals: HashMap<String, u64> = self
            .connection
            .query(redis::cmd("HGETALL").arg(format!("{}:totals", self.report_base(queue))))
            .await?;
        Ok((!totals.is_empty()).then(|| counts_from(totals)))
    }

    async fn delete_report(&self, queue: &QueueName) -> Result<(), StoreError> {
        self.check()?;
        let base = self.report_base(queue);
        let minutes = self.report_minutes(&base).await?;
        for chunk in minutes.chunks(KEYS_PER_CALL) {
            let keys: Vec<String> = chunk.iter().map(|minute| format!("{base}:m:{minute}")).collect();
            let _: i64 = self.connection.query(redis::cmd("UNLINK").arg(keys)).await?;
        }
        // The minutes zset last: a delete cut short leaves minute keys it can still find next time.
        let _: i64 = self
            .connection
            .query(
                redis::cmd("UNLINK")
                    .arg(format!("{base}:totals"))
                    .arg(format!("{base}:minutes")),
            )
            .await?;
        let _: i64 = self
            .connection
            .query(
                redis::cmd("ZREM")
                    .arg(self.reports_index_key())
                    .arg(queue.as_str()),
            )
            .await?;
        Ok(())
    }

    async fn drop_reports_beyond(&self, max_reports: usize) -> Result<Vec<QueueName>, StoreError> {
        self.check()?;
        let count: usize = self
            .connection
            .query(redis::cmd("ZCARD").arg(self.reports_index_key()))
            .await?;
        if count <= max_reports {
            return Ok(Vec::new());
        }
        let oldest: Vec<String> = self
            .connection
            .query(
                redis::cmd("ZRANGE")
                    .arg(self.reports_index_key())
                    .arg(0)
                    .arg(count - max_reports - 1),
            )
            .await?;
        let mut dropped = Vec::new();
        for name in oldest {
            if let Ok(queue) = QueueName::parse(&name) {
                self.delete_report(&queue).await?;
                dropped.push(queue);
            } else {
                let _: i64 = self
                    .connection
                    .query(redis::cmd("ZREM").arg(self.reports_index_key()).arg(&name))
                    .await?;
            }
        }
        Ok(dropped)
    }
}
