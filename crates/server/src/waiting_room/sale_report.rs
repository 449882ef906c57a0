//! The sale's report (SPEC 2.5, issue 28): what each instance counts, how it reaches the store, and the
//! JSON the admin reads (`GET /v1/admin/queues/{queue}/report`; the page is `report_page`).
//!
//! # Counting off the hot path
//! Entries and admissions are benchmarked, so nothing here adds a store call to them. Each instance
//! counts in memory, per queue and minute of its clock ([`SaleReports`]): an entry that made a member
//! is an arrival, an admission step's members are admissions with their waits, a step's dropped
//! members are abandonment, a consume is an order, a refused entry a refusal. A flush adds those counts
//! to the store ([`ReportStore::add_to_report`]) every second (the `sale report` worker), at shutdown,
//! and before every report read on this instance; adding is the only write, so the counts of all
//! instances sum, and a report read right after a flush is exact. A failed flush puts its counts back.
//! What a crash loses is the last second's counts of that instance.
//!
//! # Waits and estimates
//! The wait of an admitted member is the admission step's time minus its arrival, both the store's
//! (`AdmitOutcome::waits_ms`, from the queue's arrival checkpoints), so it is right whichever instance
//! admitted. Its estimate at entry is the `estimatedWaitSeconds` the entry answered: the instance that
//! answered keeps it in memory until the member is admitted (at most [`MAX_ESTIMATES_KEPT`] members,
//! each forgotten a day after entry). On several instances an admission step finds only the estimates
//! of members that entered through its own instance, so the estimate percentiles are those of that
//! sample (about 1/N of the members, not biased by position); a restart forgets the estimates of the
//! members still waiting. Both go in the histogram buckets of [`rankgate_core::queue::report`]: a
//! percentile is exact to the second below 10 minutes.

use std::collections::HashMap;

use parking_lot::Mutex;
use rankgate_core::ids::MemberId;
use rankgate_core::queue::report::{percentile_seconds, wait_bucket};
use rankgate_core::queue::{QueueName, RefusalReason};
use rankgate_store::queue::report::{
    HistogramOf, ReportCounts, ReportDelta, ReportField, ReportStore, StoredReport, REPORT_MINUTES_KEPT,
};
use rankgate_store::queue::{AdmitOutcome, StoreError};
use serde::Serialize;

use super::service::rfc3339;

/// Members whose estimate at entry an instance keeps at most; entries beyond it go unrecorded.
pub const MAX_ESTIMATES_KEPT: usize = 1_000_000;
/// How long an estimate is kept for a member never admitted (left, abandoned, or admitted elsewhere).
const ESTIMATE_KEPT_MINUTES: i64 = 24 * 60;

/// The Unix minute of a millisecond.
pub(crate) fn minute_of(ms: i64) -> i64 {
    ms.div_euclid(60_000)
}

/// One member's estimate at entry, kept until its admission.
#[derive(Debug, Clone, Copy)]
struct EstimateAtEntry {
    minute: i64,
    seconds: u64,
}

/// This instance's counts not yet in the store, and the estimates of the members it let in.
#[derive(Debug, Default)]
pub(crate) struct SaleReports {
    /// Counts since the last flush, per queue. A `parking_lot` mutex: held for a few map operations.
    pending: Mutex<HashMap<QueueName, ReportDelta>>,
    /// Queue → member → its estimate at entry.
    estimates: Mutex<Estimates>,
}

#[derive(Debug, Default)]
struct Estimates {
    by_queue: HashMap<QueueName, HashMap<Box<str>, EstimateAtEntry>>,
    kept: usize,
}

impl SaleReports {
    /// Adds `count` to `field` of `queue` at `now_ms`.
    pub(crate) fn count(&self, queue: &QueueName, now_ms: i64, field: ReportField, count: u64) {
        if count == 0 {
            return;
        }
        let mut pending = self.pending.lock();
        match pending.get_mut(queue) {
            Some(delta) => delta.add(minute_of(now_ms), field, count),
            None => {
                let mut delta = ReportDelta::default();
                delta.add(minute_of(now_ms), field, count);
                pending.insert(queue.clone(), delta);
            }
        }
    }

    /// An entry made `member`; `estimate` is the `estimatedWaitSeconds` it was answered.
    pub(crate) fn entered(&self, queue: &QueueName, member: &MemberId, now_ms: i64, estimate: Option<u64>) {
        self.count(queue, now_ms, ReportField::Arrivals, 1);
        let Some(seconds) = estimate else {
            return;
        };
        let mut estimates = self.estimates.lock();
        if estimates.kept >= MAX_ESTIMATES_KEPT {
            return;
        }
        let entry = EstimateAtEntry {
            minute: minute_of(now_ms),
            seconds,
        };
        // The queue's map is looked up before it is made: cloning the name on every entry would cost
        // an allocation on the hot path.
        if !estimates.by_queue.contains_key(queue) {
            estimates.by_queue.insert(queue.clone(), HashMap::new());
        }
        let added = estimates
            .by_queue
            .get_mut(queue)
            .is_some_and(|members| members.insert(member.as_str().into(), entry).is_none());
        if added {
            estimates.kept += 1;
        }
    }

    /// One admission step of `queue` at `now_ms`: its members (with their waits and, when this instance
    /// let them in, their estimates) and the members it dropped as abandoned.
    pub(crate) fn admitted(&self, queue: &QueueName, now_ms: i64, step: &AdmitOutcome) {
        self.count(queue, now_ms, ReportField::Abandoned, step.abandoned);
        if step.admitted.is_empty() {
            return;
        }
        let mut found = Vec::with_capacity(step.admitted.len());
        {
            let mut estimates = self.estimates.lock();
            let Estimates { by_queue, kept } = &mut *estimates;
            if let Some(members) = by_queue.get_mut(queue) {
                for member in &step.admitted {
                    if let Some(entry) = members.remove(member.as_str()) {
                        *kept -= 1;
                        found.push(entry.seconds);
                    }
                }
                if members.is_empty() {
                    by_queue.remove(queue);
                }
            }
        }
        let minute = minute_of(now_ms);
        let mut pending = self.pending.lock();
        let delta = pending.entry(queue.clone()).or_default();
        delta.add(minute, ReportField::Admitted, step.admitted.len() as u64);
        for waited in step.waits_ms.iter().flatten() {
            delta.add(minute, ReportField::Wait(wait_bucket(waited / 1000)), 1);
        }
        for seconds in found {
            delta.add(minute, ReportField::Estimate(wait_bucket(seconds)), 1);
        }
    }

    /// Forgets the estimates of members who entered more than a day before `now_ms`, and of `gone`'s.
    pub(crate) fn forget_old_estimates(&self, now_ms: i64, gone: Option<&QueueName>) {
        let oldest = minute_of(now_ms) - ESTIMATE_KEPT_MINUTES;
        let mut estimates = self.estimates.lock();
        let Estimates { by_queue, kept } = &mut *estimates;
        if let Some(queue) = gone {
            if let Some(members) = by_queue.remove(queue) {
                *kept -= members.len();
            }
        }
        by_queue.retain(|_, members| {
            let before = members.len();
            members.retain(|_, entry| entry.minute >= oldest);
            *kept -= before - members.len();
            !members.is_empty()
        });
    }

    /// Adds every pending count to `store`, then keeps at most `max_reports` reports. Counts a store
    /// refused are kept for the next flush.
    pub(crate) async fn flush(
        &self,
        store: &dyn ReportStore,
        now_ms: i64,
        max_reports: usize,
    ) -> Result<(), StoreError> {
        let pending = std::mem::take(&mut *self.pending.lock());
        if pending.is_empty() {
            return Ok(());
        }
        let mut failed: Option<StoreError> = None;
        let mut unsent = Vec::new();
        for (queue, delta) in pending {
            if failed.is_some() {
                unsent.push((queue, delta));
                continue;
            }
            if let Err(error) = store.add_to_report(&queue, &delta, now_ms).await {
                failed = Some(error);
                unsent.push((queue, delta));
            }
        }
        if !unsent.is_empty() {
            let mut pending = self.pending.lock();
            for (queue, delta) in unsent {
                let merged = pending.entry(queue).or_default();
                for (minute, counts) in delta.minutes {
                    for (field, count) in counts.fields {
                        merged.add(minute, field, count);
                    }
                }
            }
        }
        if let Some(error) = failed {
            return Err(error);
        }
        let dropped = store.drop_reports_beyond(max_reports).await?;
        if !dropped.is_empty() {
            tracing::info!(
                count = dropped.len(),
                "dropped the least recently written sale reports beyond max_queues"
            );
        }
        Ok(())
    }

    /// Drops what is pending for `queue` (it was deleted).
    pub(crate) fn forget_queue(&self, queue: &QueueName, now_ms: i64) {
        self.pending.lock().remove(queue);
        self.forget_old_estimates(now_ms, Some(queue));
    }
}

/// Entries refused, by reason (the admin view's `refused`, a report minute's and its totals').
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RefusedCounts {
    /// No valid proof-of-work solution.
    pub challenge: u64,
    /// Over the per-address budget.
    pub address: u64,
    /// No CAPTCHA token, or the provider refused it.
    pub captcha: u64,
}

impl RefusedCounts {
    pub(crate) fn of(counts: &ReportCounts) -> RefusedCounts {
        let get = |reason| counts.get(ReportField::Refused(reason));
        RefusedCounts {
            challenge: get(RefusalReason::Challenge),
            address: get(RefusalReason::Address),
            captcha: get(RefusalReason::Captcha),
        }
    }

    /// Every refusal.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.challenge + self.address + self.captcha
    }
}

/// One minute of the report (or, without `minute`, the totals' counts).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportMinute {
    /// The minute's start, RFC 3339.
    pub minute: String,
    /// Members that entered (new members only).
    pub arrivals: u64,
    /// Members given a token.
    pub admitted: u64,
    /// Waiting members dropped as abandoned.
    pub abandoned: u64,
    /// Entries refused before they made a member, by reason.
    pub refused: RefusedCounts,
    /// Tokens consumed.
    pub orders: u64,
    /// Median wait of the members admitted this minute (s, the lower edge of its histogram bucket).
    pub wait_seconds_p50: Option<u64>,
    /// Their 90th percentile wait.
    pub wait_seconds_p90: Option<u64>,
    /// Median of their estimates at entry (s).
    pub estimate_seconds_p50: Option<u64>,
    /// 90th percentile of their estimates at entry.
    pub estimate_seconds_p90: Option<u64>,
}

/// The report's totals: every count since the report began, minutes dropped by the bound included.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportTotals {
    /// Members that entered.
    pub arrivals: u64,
    /// Members given a token.
    pub admitted: u64,
    /// Waiting members dropped as abandoned.
    pub abandoned: u64,
    /// Entries refused, by reason.
    pub refused: RefusedCounts,
    /// Tokens consumed.
    pub orders: u64,
    /// Orders over admissions (`null` before the first admission).
    pub orders_per_admission: Option<f64>,
    /// Median wait of every member admitted (s).
    pub wait_seconds_p50: Option<u64>,
    /// 90th percentile wait.
    pub wait_seconds_p90: Option<u64>,
    /// Median estimate at entry of the members admitted whose estimate was known (s).
    pub estimate_seconds_p50: Option<u64>,
    /// 90th percentile of those estimates.
    pub estimate_seconds_p90: Option<u64>,
}

/// `GET /v1/admin/queues/{queue}/report`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SaleReport {
    /// The queue.
    pub queue: String,
    /// The first minute kept (RFC 3339, to the minute), `null` while nothing was counted.
    pub first_entry_at: Option<String>,
    /// When this report was read (RFC 3339).
    pub generated_at: String,
    /// Most minutes a report keeps (7 days); older ones are dropped, the totals keep their counts.
    pub minutes_kept: i64,
    /// Every minute from the first kept to the last counted, in order (quiet minutes as zeros).
    pub minutes: Vec<ReportMinute>,
    /// Every count since the report began.
    pub totals: ReportTotals,
}

fn minute_view(minute: i64, counts: &ReportCounts) -> ReportMinute {
    let waits = counts.histogram(HistogramOf::Waits);
    let estimates = counts.histogram(HistogramOf::Estimates);
    ReportMinute {
        minute: rfc3339(minute * 60_000),
        arrivals: counts.get(ReportField::Arrivals),
        admitted: counts.get(ReportField::Admitted),
        abandoned: counts.get(ReportField::Abandoned),
        refused: RefusedCounts::of(counts),
        orders: counts.get(ReportField::Orders),
        wait_seconds_p50: percentile_seconds(&waits, 0.5),
        wait_seconds_p90: percentile_seconds(&waits, 0.9),
        estimate_seconds_p50: percentile_seconds(&estimates, 0.5),
        estimate_seconds_p90: percentile_seconds(&estimates, 0.9),
    }
}

impl SaleReport {
    /// The report of `queue` from what the store holds (`None`: nothing counted yet), read at `now_ms`.
    pub(crate) fn from_stored(queue: &QueueName, stored: Option<&StoredReport>, now_ms: i64) -> SaleReport {
        let empty = StoredReport::default();
        let stored = stored.unwrap_or(&empty);
        let mut minutes = Vec::new();
        if let (Some(first), Some(last)) = (stored.minutes.keys().next(), stored.minutes.keys().next_back()) {
            let quiet = ReportCounts::default();
            for minute in *first..=*last {
                minutes.push(minute_view(minute, stored.minutes.get(&minute).unwrap_or(&quiet)));
            }
        }
        let totals = minute_view(0, &stored.totals);
        SaleReport {
            queue: queue.to_string(),
            first_entry_at: stored
                .minutes
                .keys()
                .next()
                .map(|minute| rfc3339(minute * 60_000)),
            generated_at: rfc3339(now_ms),
            minutes_kept: REPORT_MINUTES_KEPT,
            minutes,
            totals: ReportTotals {
                arrivals: totals.arrivals,
                admitted: totals.admitted,
                abandoned: totals.abandoned,
                refused: totals.refused,
                orders: totals.orders,
                orders_per_admission: (totals.admitted > 0)
                    .then(|| totals.orders as f64 / totals.admitted as f64),
                wait_seconds_p50: totals.wait_seconds_p50,
                wait_seconds_p90: totals.wait_seconds_p90,
                estimate_seconds_p50: totals.estimate_seconds_p50,
                estimate_seconds_p90: totals.estimate_seconds_p90,
            },
        }
    }
}

impl super::service::WaitingRoom {
    /// Adds this instance's pending report counts to the store (the `sale report` worker, every second;
    /// at shutdown; before each report read).
    pub async fn flush_sale_reports(&self) -> anyhow::Result<()> {
        Ok(self.flush_sale_reports_to_store().await?)
    }

    /// [`Self::flush_sale_reports`] with the store's error, which a handler answers as 503.
    async fn flush_sale_reports_to_store(&self) -> Result<(), StoreError> {
        let Some(store) = self.queues.reports() else {
            return Ok(());
        };
        let now_ms = self.clock.now_millis();
        self.sale_reports
            .flush(store, now_ms, self.config.max_queues)
            .await
    }

    /// The estimates of members who entered a day ago and were never admitted here are let go (the
    /// janitor's round).
    pub(crate) fn forget_old_entry_estimates(&self) {
        self.sale_reports
            .forget_old_estimates(self.clock.now_millis(), None);
    }

    /// `GET /v1/admin/queues/{queue}/report`: 404 when the queue neither exists nor has a report.
    pub async fn sale_report(&self, queue: &QueueName) -> crate::http::error::ApiResult<SaleReport> {
        use super::service::store_error;
        self.flush_sale_reports_to_store().await.map_err(store_error)?;
        let stored = match self.queues.reports() {
            Some(store) => store.read_report(queue).await.map_err(store_error)?,
            None => None,
        };
        if stored.is_none() && self.queues.settings(queue).await.map_err(store_error)?.is_none() {
            return Err(crate::http::error::ApiError::NotFound(format!(
                "queue: {queue} does not exist and has no report"
            )));
        }
        Ok(SaleReport::from_stored(
            queue,
            stored.as_ref(),
            self.clock.now_millis(),
        ))
    }

    /// The admin view's `refused`: every refusal since the queue's report began, across instances.
    pub async fn refused_counts(&self, queue: &QueueName) -> crate::http::error::ApiResult<RefusedCounts> {
        use super::service::store_error;
        self.flush_sale_reports_to_store().await.map_err(store_error)?;
        let Some(store) = self.queues.reports() else {
            return Ok(RefusedCounts::default());
        };
        let totals = store.read_report_totals(queue).await.map_err(store_error)?;
        Ok(totals.as_ref().map(RefusedCounts::of).unwrap_or_default())
    }

    /// Deletes `queue`'s report (with the queue, by the admin DELETE); whether there was one.
    pub(crate) async fn delete_sale_report(&self, queue: &QueueName) -> Result<bool, StoreError> {
        self.sale_reports.forget_queue(queue, self.clock.now_millis());
        let Some(store) = self.queues.reports() else {
            return Ok(false);
        };
        let existed = store.read_report_totals(queue).await?.is_some();
        store.delete_report(queue).await?;
        Ok(existed)
    }

    /// Counts a refused entry as the entry guards do (`count_refusal`), for tests of the report and the
    /// admin view that need refusals without driving a guard.
    #[doc(hidden)]
    pub async fn count_refusal_for_tests(&self, queue: &QueueName, reason: RefusalReason) {
        self.count_refusal(queue, reason).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> QueueName {
        QueueName::parse("sale").unwrap()
    }

    #[test]
    fn an_admission_counts_waits_and_the_estimates_this_instance_answered() {
        let reports = SaleReports::default();
        let q = queue();
        let (a, b) = (MemberId::parse("a").unwrap(), MemberId::parse("b").unwrap());
        reports.entered(&q, &a, 60_000, Some(30));
        reports.entered(&q, &b, 60_500, None);
        let step = AdmitOutcome {
            admitted: vec![a, b],
            waits_ms: vec![Some(65_000), None],
            abandoned: 2,
            ..AdmitOutcome::default()
        };
        reports.admitted(&q, 125_000, &step);
        let pending = reports.pending.lock();
        let delta = &pending[&q];
        assert_eq!(delta.minutes[&1].get(ReportField::Arrivals), 2);
        let admission_minute = &delta.minutes[&2];
        assert_eq!(admission_minute.get(ReportField::Admitted), 2);
        assert_eq!(admission_minute.get(ReportField::Abandoned), 2);
        assert_eq!(admission_minute.get(ReportField::Wait(wait_bucket(65))), 1);
        assert_eq!(admission_minute.get(ReportField::Estimate(wait_bucket(30))), 1);
        assert_eq!(
            reports.estimates.lock().kept,
            0,
            "admitted members' estimates are let go"
        );
    }

    #[test]
    fn quiet_minutes_are_listed_as_zeros_and_totals_carry_the_ratio() {
        let q = queue();
        let mut stored = StoredReport::default();
        let mut first = ReportCounts::default();
        first.add(ReportField::Arrivals, 4);
        let mut third = ReportCounts::default();
        third.add(ReportField::Admitted, 4);
        third.add(ReportField::Orders, 1);
        stored.minutes.insert(100, first.clone());
        stored.minutes.insert(102, third.clone());
        stored.totals.merge(&first);
        stored.totals.merge(&third);
        let report = SaleReport::from_stored(&q, Some(&stored), 6_200_000);
        assert_eq!(report.minutes.len(), 3);
        assert_eq!(report.minutes[1].arrivals + report.minutes[1].admitted, 0);
        assert_eq!(report.totals.orders_per_admission, Some(0.25));
        assert_eq!(report.first_entry_at.as_deref(), Some("1970-01-01T01:40:00Z"));
        let empty = SaleReport::from_stored(&q, None, 0);
        assert!(empty.minutes.is_empty() && empty.first_entry_at.is_none());
        assert_eq!(empty.totals.orders_per_admission, None);
    }
}
