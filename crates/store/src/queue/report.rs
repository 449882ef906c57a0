//! [`ReportStore`]: the sale's report (SPEC 2.5), counts per queue and minute that every instance adds to.
//!
//! The server counts in memory what happened on this instance (arrivals, admissions, abandonment,
//! refusals, orders, and histograms of waits and of the estimates members were given at entry) and adds
//! those counts to the store about once a second ([`ReportStore::add_to_report`]). Adding is the only
//! write, so instances never overwrite each other and the stored numbers are the sums over every
//! instance. Reports do not belong to a queue's live state: a queue forgotten when idle keeps its report;
//! only [`ReportStore::delete_report`] (the admin DELETE) removes it.
//!
//! # Bounds
//! - [`REPORT_MINUTES_KEPT`] minutes per report (7 days), counted back from the newest minute written;
//!   older minutes are dropped when a newer one is added. The totals are kept whole.
//! - At most `max_reports` reports ([`ReportStore::drop_reports_beyond`], the server passes
//!   `max_queues`): the reports written least recently go first.
//!
//! # Fields
//! Both backends store one counter per (minute, field), named by [`ReportField::code`]: `a` arrivals, `d`
//! admitted, `x` abandoned, `o` orders, `r.<reason>` refusals, `w<bucket>` waits and `e<bucket>`
//! estimates in the buckets of [`rankgate_core::queue::report`].

use std::collections::BTreeMap;

use async_trait::async_trait;
use rankgate_core::queue::{QueueName, RefusalReason};

use super::StoreError;

/// Minutes kept per report, back from the newest one written: 7 days.
pub const REPORT_MINUTES_KEPT: i64 = 7 * 24 * 60;

/// One counter of a minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReportField {
    /// New members.
    Arrivals,
    /// Members given a token.
    Admitted,
    /// Waiting members dropped as abandoned.
    Abandoned,
    /// Tokens consumed (orders).
    Orders,
    /// Entries refused before they made a member.
    Refused(RefusalReason),
    /// Members admitted whose wait fell in this bucket.
    Wait(u16),
    /// Members admitted whose estimate at entry fell in this bucket.
    Estimate(u16),
}

impl ReportField {
    /// The field's name in the store.
    #[must_use]
    pub fn code(self) -> String {
        match self {
            ReportField::Arrivals => "a".into(),
            ReportField::Admitted => "d".into(),
            ReportField::Abandoned => "x".into(),
            ReportField::Orders => "o".into(),
            ReportField::Refused(reason) => format!("r.{}", reason.as_str()),
            ReportField::Wait(bucket) => format!("w{bucket}"),
            ReportField::Estimate(bucket) => format!("e{bucket}"),
        }
    }

    /// The field a stored name names (`None` for a name this version does not know).
    #[must_use]
    pub fn parse(code: &str) -> Option<ReportField> {
        match code {
            "a" => Some(ReportField::Arrivals),
            "d" => Some(ReportField::Admitted),
            "x" => Some(ReportField::Abandoned),
            "o" => Some(ReportField::Orders),
            _ => {
                if let Some(reason) = code.strip_prefix("r.") {
                    RefusalReason::parse(reason).map(ReportField::Refused)
                } else if let Some(bucket) = code.strip_prefix('w') {
                    bucket.parse().ok().map(ReportField::Wait)
                } else if let Some(bucket) = code.strip_prefix('e') {
                    bucket.parse().ok().map(ReportField::Estimate)
                } else {
                    None
                }
            }
        }
    }
}

/// The counters of one minute (or of a whole report).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportCounts {
    /// Non-zero counters by field.
    pub fields: BTreeMap<ReportField, u64>,
}

impl ReportCounts {
    /// Adds `count` to `field`.
    pub fn add(&mut self, field: ReportField, count: u64) {
        if count > 0 {
            *self.fields.entry(field).or_insert(0) += count;
        }
    }

    /// Adds every counter of `other`.
    pub fn merge(&mut self, other: &ReportCounts) {
        for (field, count) in &other.fields {
            self.add(*field, *count);
        }
    }

    /// A counter (0 when never added to).
    #[must_use]
    pub fn get(&self, field: ReportField) -> u64 {
        self.fields.get(&field).copied().unwrap_or(0)
    }

    /// The histogram of waits or of estimates, bucket → count.
    #[must_use]
    pub fn histogram(&self, of: HistogramOf) -> BTreeMap<u16, u64> {
        self.fields
            .iter()
            .filter_map(|(field, count)| match (field, of) {
                (ReportField::Wait(bucket), HistogramOf::Waits)
                | (ReportField::Estimate(bucket), HistogramOf::Estimates) => Some((*bucket, *count)),
                _ => None,
            })
            .collect()
    }

    /// Nothing counted.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }
}

/// Which of a minute's two histograms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistogramOf {
    /// Actual waits of the members admitted.
    Waits,
    /// Their estimates at entry.
    Estimates,
}

/// Counts to add, per minute (Unix minute: ms / 60,000).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportDelta {
    /// Minute → counts.
    pub minutes: BTreeMap<i64, ReportCounts>,
}

impl ReportDelta {
    /// Adds `count` to `field` of `minute`.
    pub fn add(&mut self, minute: i64, field: ReportField, count: u64) {
        if count > 0 {
            self.minutes.entry(minute).or_default().add(field, count);
        }
    }

    /// Nothing to add.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.minutes.values().all(ReportCounts::is_empty)
    }

    /// Every minute's counts summed.
    #[must_use]
    pub fn totals(&self) -> ReportCounts {
        let mut totals = ReportCounts::default();
        for counts in self.minutes.values() {
            totals.merge(counts);
        }
        totals
    }
}

/// A report as stored: the kept minutes and the totals since the report began.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredReport {
    /// Minute → counts, the last [`REPORT_MINUTES_KEPT`] minutes at most.
    pub minutes: BTreeMap<i64, ReportCounts>,
    /// Every count ever added (minutes dropped by the bound included).
    pub totals: ReportCounts,
}

/// Where sale reports are kept, summed across instances.
#[async_trait]
pub trait ReportStore: Send + Sync + 'static {
    /// Adds `delta` to `queue`'s report (its minutes and its totals) and drops the minutes that fall
    /// [`REPORT_MINUTES_KEPT`] or more behind the newest; `now_ms` dates the write for
    /// [`ReportStore::drop_reports_beyond`].
    async fn add_to_report(
        &self,
        queue: &QueueName,
        delta: &ReportDelta,
        now_ms: i64,
    ) -> Result<(), StoreError>;

    /// The report of `queue`; `None` when nothing was ever added (or it was deleted).
    async fn read_report(&self, queue: &QueueName) -> Result<Option<StoredReport>, StoreError>;

    /// The totals of `queue`'s report alone (the admin view's `refused`); the default reads the whole
    /// report, a store that can read the totals apart overrides it.
    async fn read_report_totals(&self, queue: &QueueName) -> Result<Option<ReportCounts>, StoreError> {
        Ok(self.read_report(queue).await?.map(|report| report.totals))
    }

    /// Deletes `queue`'s report (the admin deleted the queue).
    async fn delete_report(&self, queue: &QueueName) -> Result<(), StoreError>;

    /// Keeps at most `max_reports` reports, deleting those written least recently; returns the queues
    /// whose reports went.
    async fn drop_reports_beyond(&self, max_reports: usize) -> Result<Vec<QueueName>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_codes_round_trip() {
        let mut fields = vec![
            ReportField::Arrivals,
            ReportField::Admitted,
            ReportField::Abandoned,
            ReportField::Orders,
            ReportField::Wait(0),
            ReportField::Wait(2_280),
            ReportField::Estimate(17),
        ];
        fields.extend(RefusalReason::ALL.map(ReportField::Refused));
        for field in fields {
            assert_eq!(ReportField::parse(&field.code()), Some(field), "{}", field.code());
        }
        assert_eq!(ReportField::parse("zz"), None);
        assert_eq!(ReportField::parse("r.bot"), None);
    }
}
