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
//! What a crash loses is the last second's counts of that instance. A flush already under way when an
//! admin deletes the queue may write its counts after the delete, starting a small report anew (one
//! flush's worth, deleted again by the next DELETE or dropped by the `max_queues` bound).
//!
//! The same counts feed this instance's dashboard (`app::dashboard`, issue 30): admissions, abandonment
//! and refusals are also added to [`MovedCounts`] per queue, which the dashboard's sampler takes once a
//! second ([`SaleReports::take_moved`]). Not entries: their path is the benchmarked one.
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

/// Queues whose moves are kept for the dashboard's next sample at most (it takes them every second,
/// so this only bounds a room whose dashboard sampler is not running); moves of further queues are not
/// kept.
const MAX_QUEUES_MOVED_KEPT: usize = 10_000;

/// What one queue did on this instance since the dashboard's last sample ([`SaleReports::take_moved`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MovedCounts {
    /// Members given a token.
    pub admitted: u64,
    /// Waiting members dropped as abandoned.
    pub abandoned: u64,
    /// Entries refused before they made a member (every reason).
    pub refused: u64,
}

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

/// A hasher for keys that are hashes already (seeded XXH3 of a member id): it passes them through.
#[derive(Debug, Default, Clone, Copy)]
struct PreHashed(u64);

impl std::hash::Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; anything else still hashes, just not cheaply.
        self.0 = xxhash_rust::xxh3::xxh3_64_with_seed(bytes, self.0);
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

/// One queue's counts on this instance.
#[derive(Debug, Default)]
struct QueueCounts {
    /// Counts since the last flush.
    delta: ReportDelta,
    /// The arrivals of `arrivals_minute` not yet in `delta`: an entry, the one call per member that is
    /// benchmarked, only compares the minute and adds one; they join `delta` when the minute turns or
    /// at the flush.
    arrivals_minute: i64,
    arrivals: u64,
    /// Member (its id's seeded XXH3, so no allocation per entry) → its estimate at entry.
    estimates: HashMap<u64, EstimateAtEntry, std::hash::BuildHasherDefault<PreHashed>>,
}

impl QueueCounts {
    fn fold_arrivals(&mut self) {
        if self.arrivals > 0 {
            self.delta
                .add(self.arrivals_minute, ReportField::Arrivals, self.arrivals);
            self.arrivals = 0;
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    by_queue: HashMap<QueueName, QueueCounts>,
    /// Estimates kept over every queue (bounded by [`MAX_ESTIMATES_KEPT`]).
    estimates_kept: usize,
    /// Per queue, since the dashboard's last sample (bounded by [`MAX_QUEUES_MOVED_KEPT`]).
    moved: HashMap<QueueName, MovedCounts>,
}

impl Counts {
    /// The queue's counts; the name is cloned only when the queue is new here.
    fn of(&mut self, queue: &QueueName) -> &mut QueueCounts {
        if !self.by_queue.contains_key(queue) {
            self.by_queue.insert(queue.clone(), QueueCounts::default());
        }
        self.by_queue.get_mut(queue).expect("inserted above")
    }

    /// `change` applied to the queue's counts with one lookup when the queue is known here (the entry's
    /// path: returning the reference of a `get_mut` conditionally is what the borrow checker refuses).
    fn with_queue<R>(&mut self, queue: &QueueName, change: impl FnOnce(&mut QueueCounts) -> R) -> R {
        if let Some(of_queue) = self.by_queue.get_mut(queue) {
            return change(of_queue);
        }
        change(self.by_queue.entry(queue.clone()).or_default())
    }

    /// Adds to `queue`'s moves for the dashboard, unless the map is full and the queue not in it.
    fn moved(&mut self, queue: &QueueName, add: impl FnOnce(&mut MovedCounts)) {
        if let Some(moved) = self.moved.get_mut(queue) {
            add(moved);
        } else if self.moved.len() < MAX_QUEUES_MOVED_KEPT {
            add(self.moved.entry(queue.clone()).or_default());
        }
    }
}

/// This instance's counts not yet in the store, and the estimates of the members it let in.
#[derive(Debug)]
pub(crate) struct SaleReports {
    /// Per queue. A `parking_lot` mutex: held for a few map operations, never across an await.
    counts: Mutex<Counts>,
    /// The seed of the member-id hashes: random, so nobody can pick ids that collide.
    seed: u64,
}

impl Default for SaleReports {
    fn default() -> Self {
        SaleReports {
            counts: Mutex::new(Counts::default()),
            seed: rand::random(),
        }
    }
}

impl SaleReports {
    fn member_key(&self, member: &MemberId) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(member.as_str().as_bytes(), self.seed)
    }

    /// Adds `count` to `field` of `queue` at `now_ms`.
    pub(crate) fn count(&self, queue: &QueueName, now_ms: i64, field: ReportField, count: u64) {
        if count == 0 {
            return;
        }
        let mut counts = self.counts.lock();
        counts.with_queue(queue, |of_queue| {
            of_queue.delta.add(minute_of(now_ms), field, count)
        });
        match field {
            ReportField::Admitted => counts.moved(queue, |moved| moved.admitted += count),
            ReportField::Abandoned => counts.moved(queue, |moved| moved.abandoned += count),
            ReportField::Refused(_) => counts.moved(queue, |moved| moved.refused += count),
            _ => {}
        }
    }

    /// Every queue's admissions, abandonment and refusals since the last call (the dashboard's sampler).
    pub(crate) fn take_moved(&self) -> HashMap<QueueName, MovedCounts> {
        std::mem::take(&mut self.counts.lock().moved)
    }

    /// An entry made `member`; `estimate` is the `estimatedWaitSeconds` it was answered.
    pub(crate) fn entered(&self, queue: &QueueName, member: &MemberId, now_ms: i64, estimate: Option<u64>) {
        let minute = minute_of(now_ms);
        let key = self.member_key(member);
        let mut counts = self.counts.lock();
        let room_for_estimates = counts.estimates_kept < MAX_ESTIMATES_KEPT;
        let kept_one_more = counts.with_queue(queue, |of_queue| {
            if of_queue.arrivals_minute != minute {
                of_queue.fold_arrivals();
                of_queue.arrivals_minute = minute;
            }
            of_queue.arrivals += 1;
            estimate.filter(|_| room_for_estimates).is_some_and(|seconds| {
                of_queue
                    .estimates
                    .insert(key, EstimateAtEntry { minute, seconds })
                    .is_none()
            })
        });
        if kept_one_more {
            counts.estimates_kept += 1;
        }
    }

    /// One admission step of `queue` at `now_ms`: its members (with their waits and, when this instance
    /// let them in, their estimates) and the members it dropped as abandoned.
    pub(crate) fn admitted(&self, queue: &QueueName, now_ms: i64, step: &AdmitOutcome) {
        if step.admitted.is_empty() && step.abandoned == 0 {
            return;
        }
        let minute = minute_of(now_ms);
        let keys: Vec<u64> = step.admitted.iter().map(|m| self.member_key(m)).collect();
        let mut counts = self.counts.lock();
        counts.moved(queue, |moved| {
            moved.admitted += step.admitted.len() as u64;
            moved.abandoned += step.abandoned;
        });
        let of_queue = counts.of(queue);
        let delta = &mut of_queue.delta;
        delta.add(minute, ReportField::Abandoned, step.abandoned);
        delta.add(minute, ReportField::Admitted, step.admitted.len() as u64);
        for waited in step.waits_ms.iter().flatten() {
            delta.add(minute, ReportField::Wait(wait_bucket(waited / 1000)), 1);
        }
        let mut found = 0;
        for key in keys {
            if let Some(entry) = of_queue.estimates.remove(&key) {
                found += 1;
                of_queue
                    .delta
                    .add(minute, ReportField::Estimate(wait_bucket(entry.seconds)), 1);
            }
        }
        counts.estimates_kept -= found;
    }

    /// Forgets the estimates of members who entered more than a day before `now_ms`.
    pub(crate) fn forget_old_estimates(&self, now_ms: i64) {
        let oldest = minute_of(now_ms) - ESTIMATE_KEPT_MINUTES;
        let mut counts = self.counts.lock();
        let mut forgotten = 0;
        for of_queue in counts.by_queue.values_mut() {
            let before = of_queue.estimates.len();
            of_queue.estimates.retain(|_, entry| entry.minute >= oldest);
            forgotten += before - of_queue.estimates.len();
        }
        counts.estimates_kept -= forgotten;
    }

    /// Every queue's counts since the last flush (queues with nothing left here are let go).
    fn take_pending(&self) -> Vec<(QueueName, ReportDelta)> {
        let mut counts = self.counts.lock();
        let mut pending = Vec::new();
        counts.by_queue.retain(|queue, of_queue| {
            of_queue.fold_arrivals();
            if !of_queue.delta.is_empty() {
                pending.push((queue.clone(), std::mem::take(&mut of_queue.delta)));
            }
            !of_queue.estimates.is_empty()
        });
        pending
    }

    /// Puts back counts a flush could not store.
    fn put_back(&self, unsent: Vec<(QueueName, ReportDelta)>) {
        let mut counts = self.counts.lock();
        for (queue, delta) in unsent {
            let merged = &mut counts.of(&queue).delta;
            for (minute, minute_counts) in delta.minutes {
                for (field, count) in minute_counts.fields {
                    merged.add(minute, field, count);
                }
            }
        }
    }

    /// Adds every pending count to `store`, then keeps at most `max_reports` reports. Counts a store
    /// refused are kept for the next flush.
    pub(crate) async fn flush(
        &self,
        store: &dyn ReportStore,
        now_ms: i64,
        max_reports: usize,
    ) -> Result<(), StoreError> {
        let pending = self.take_pending();
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
        if let Some(error) = failed {
            self.put_back(unsent);
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

    /// Drops what is kept for `queue` (it was deleted).
    pub(crate) fn forget_queue(&self, queue: &QueueName) {
        let mut counts = self.counts.lock();
        if let Some(of_queue) = counts.by_queue.remove(queue) {
            counts.estimates_kept -= of_queue.estimates.len();
        }
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
        self.sale_reports.forget_old_estimates(self.clock.now_millis());
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
        self.sale_reports.forget_queue(queue);
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
        assert_eq!(
            reports.counts.lock().estimates_kept,
            0,
            "admitted members' estimates are let go"
        );
        let pending = reports.take_pending();
        let (_, delta) = &pending[0];
        assert_eq!(delta.minutes[&1].get(ReportField::Arrivals), 2);
        let admission_minute = &delta.minutes[&2];
        assert_eq!(admission_minute.get(ReportField::Admitted), 2);
        assert_eq!(admission_minute.get(ReportField::Abandoned), 2);
        assert_eq!(admission_minute.get(ReportField::Wait(wait_bucket(65))), 1);
        assert_eq!(admission_minute.get(ReportField::Estimate(wait_bucket(30))), 1);
        assert!(reports.take_pending().is_empty(), "taken once");
        assert!(
            reports.counts.lock().by_queue.is_empty(),
            "nothing left for the queue"
        );
    }

    #[test]
    fn the_dashboard_takes_admissions_abandonment_and_refusals_once() {
        let reports = SaleReports::default();
        let q = queue();
        reports.entered(&q, &MemberId::parse("a").unwrap(), 1_000, None);
        let step = AdmitOutcome {
            admitted: vec![MemberId::parse("a").unwrap()],
            waits_ms: vec![Some(1_000)],
            abandoned: 2,
            ..AdmitOutcome::default()
        };
        reports.admitted(&q, 2_000, &step);
        reports.count(&q, 3_000, ReportField::Abandoned, 3);
        reports.count(&q, 3_000, ReportField::Refused(RefusalReason::Address), 1);
        reports.count(&q, 3_000, ReportField::Refused(RefusalReason::Challenge), 4);
        reports.count(&q, 3_000, ReportField::Orders, 1);
        let moved = reports.take_moved();
        assert_eq!(
            moved[&q],
            MovedCounts {
                admitted: 1,
                abandoned: 5,
                refused: 5
            }
        );
        assert!(reports.take_moved().is_empty(), "taken once");
        assert_eq!(
            reports.take_pending()[0].1.minutes[&0].get(ReportField::Abandoned),
            5,
            "the report keeps its own counts"
        );
    }

    #[test]
    fn arrivals_of_each_minute_stay_apart() {
        let reports = SaleReports::default();
        let q = queue();
        for (i, at) in [59_000, 60_000, 61_000, 200_000].into_iter().enumerate() {
            reports.entered(&q, &MemberId::parse(&format!("m{i}")).unwrap(), at, Some(1));
        }
        let pending = reports.take_pending();
        let arrivals: Vec<(i64, u64)> = pending[0]
            .1
            .minutes
            .iter()
            .map(|(minute, counts)| (*minute, counts.get(ReportField::Arrivals)))
            .collect();
        assert_eq!(arrivals, vec![(0, 1), (1, 2), (3, 1)]);
        reports.forget_old_estimates(200_000 + 24 * 3_600_000);
        assert_eq!(
            reports.counts.lock().estimates_kept,
            1,
            "the last one entered within a day"
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
