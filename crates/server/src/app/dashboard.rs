//! The dashboard (issue 30): the page at `/` and `/dashboard`, and the history it draws,
//! `GET /v1/admin/dashboard/history?minutes=N` (admin).
//!
//! # History that is there when the page opens
//! A worker of this instance (the sampler, [`spawn_sampler`]) records one point a second from in-process
//! state only, so it costs no store call and holds whatever `/metrics` does:
//! - events/s: the events the rankings writer committed as accepted
//!   ([`WriterHandle::accepted_events`](crate::rankings::writer::WriterHandle::accepted_events));
//! - freshness lag: the server clock minus the engine's as-of (the newest ingest the served rankings
//!   include), as `rankgate_freshness_lag_seconds` reads it; `null` before the first ingest;
//! - per queue: members waiting, from the gauges worker's last round
//!   ([`WaitingRoom::dashboard_sample`](crate::waiting_room::WaitingRoom::dashboard_sample)); admissions,
//!   abandonment and refusals, from the sale report's counts on this instance.
//!
//! The counters are this instance's: with several instances on one store each dashboard shows the
//! events it ingested, the admissions its scheduler made and the entries it refused (waiting is the
//! store's, the same everywhere).
//!
//! Points go into two rings: [`FINE_POINTS`] one-second points (10 minutes) and [`COARSE_POINTS`]
//! ten-second points (an hour) made of them (counts summed; waiting the last known value; the lag the
//! worst). A window up to 10 minutes is answered from the first, a longer one from the second; each
//! answer says its `intervalSeconds`, and a rate times it is the count of its interval, so the rates of
//! a window times the interval sum to the counts. After a stall of the runtime the next point carries
//! the stall's counts.
//!
//! # Bounds
//! At most `min(max_queues, MAX_QUEUES_TRACKED)` queues are tracked, each from the first second it has
//! somebody waiting or moves (its points before are `null`). A queue that then stays idle for an hour
//! (the whole coarse ring) gives up its place to the next queue that needs one; while every place is
//! taken by a queue active within the hour, a further queue is not tracked, and the answer counts it in
//! `queuesNotTracked` (the page says so). Memory: under 3.5 MB at 100 queues.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::on;
use axum::{Json, Router};
use base64::Engine as _;
use parking_lot::Mutex;
use rankgate_core::queue::QueueName;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::AppState;
use crate::http::error::{ApiError, ApiResult};
use crate::http::route_table::{self, Endpoint};
use crate::waiting_room::dashboard_feed::QueueSample;

/// How often the sampler records a point.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// One-second points kept: 10 minutes.
pub const FINE_POINTS: usize = 600;
/// One-second points per coarse point.
pub const COARSE_EVERY: usize = 10;
/// Ten-second points kept: an hour.
pub const COARSE_POINTS: usize = 360;
/// Most queues tracked at once (fewer when `max_queues` is smaller).
pub const MAX_QUEUES_TRACKED: usize = 100;
/// Longest window `minutes` may ask for.
pub const MAX_MINUTES: u64 = 60;
/// The window when `minutes` is not given.
pub const DEFAULT_MINUTES: u64 = 10;

/// An idle tracked queue gives up its place after this many samples: once its coarse ring holds
/// nothing but idleness.
const IDLE_SAMPLES_BEFORE_EVICTION: u64 = (COARSE_POINTS * COARSE_EVERY) as u64;

/// One sample of the whole service, as the sampler reads it.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// When it was taken (Unix ms, wall clock: the sampler runs on real time).
    pub at_ms: i64,
    /// Events the writer accepted since the process started.
    pub events_total: u64,
    /// The freshness lag in ms (`None` before the first ingest).
    pub lag_ms: Option<i64>,
    /// The waiting room's part.
    pub queues: QueueSample,
}

/// The service-wide values of one point.
#[derive(Debug, Clone, Copy, Default)]
struct Point {
    events: u64,
    lag_ms: Option<i64>,
}

impl Point {
    fn absorb(&mut self, other: Point) {
        self.events += other.events;
        self.lag_ms = match (self.lag_ms, other.lag_ms) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

/// One queue's values of one point; counts of one interval, saturating (a `u32` keeps the rings small).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct QueuePoint {
    /// `None` when the gauges round was not fresh.
    waiting: Option<u64>,
    admitted: u32,
    abandoned: u32,
    refused: u32,
}

impl QueuePoint {
    fn is_idle(&self) -> bool {
        self.waiting.unwrap_or(0) == 0 && self.admitted == 0 && self.abandoned == 0 && self.refused == 0
    }

    fn absorb(&mut self, later: QueuePoint) {
        self.waiting = later.waiting.or(self.waiting);
        self.admitted = self.admitted.saturating_add(later.admitted);
        self.abandoned = self.abandoned.saturating_add(later.abandoned);
        self.refused = self.refused.saturating_add(later.refused);
    }
}

/// A ring of the service-wide points at one resolution, with their times.
#[derive(Debug)]
struct Tier {
    capacity: usize,
    times: VecDeque<i64>,
    points: VecDeque<Point>,
}

impl Tier {
    fn new(capacity: usize) -> Tier {
        Tier {
            capacity,
            times: VecDeque::with_capacity(capacity),
            points: VecDeque::with_capacity(capacity),
        }
    }

    fn push(&mut self, at_ms: i64, point: Point) {
        push_bounded(&mut self.times, at_ms, self.capacity);
        push_bounded(&mut self.points, point, self.capacity);
    }
}

fn push_bounded<T>(ring: &mut VecDeque<T>, value: T, capacity: usize) {
    if ring.len() == capacity {
        ring.pop_front();
    }
    ring.push_back(value);
}

/// One tracked queue's rings, aligned with the tiers' (`None`: not tracked then).
#[derive(Debug)]
struct TrackedQueue {
    fine: VecDeque<Option<QueuePoint>>,
    coarse: VecDeque<Option<QueuePoint>>,
    /// The coarse point being made.
    pending: Option<QueuePoint>,
    /// The sample number it last waited or moved at.
    last_busy: u64,
}

#[derive(Debug)]
struct Rings {
    fine: Tier,
    coarse: Tier,
    /// The coarse point being made, and how many fine points it holds.
    pending: Point,
    pending_points: usize,
    queues: BTreeMap<QueueName, TrackedQueue>,
    /// Samples recorded so far.
    samples: u64,
    /// The writer's count at the last sample.
    last_events_total: u64,
    /// Busy queues the last sample could not track.
    not_tracked: usize,
}

/// The dashboard's history (see the module doc).
#[derive(Debug)]
pub struct History {
    rings: Mutex<Rings>,
    max_queues: usize,
}

impl History {
    /// An empty history tracking at most `max_queues` queues (capped at [`MAX_QUEUES_TRACKED`]).
    pub fn new(max_queues: usize) -> History {
        History {
            rings: Mutex::new(Rings {
                fine: Tier::new(FINE_POINTS),
                coarse: Tier::new(COARSE_POINTS),
                pending: Point::default(),
                pending_points: 0,
                queues: BTreeMap::new(),
                samples: 0,
                last_events_total: 0,
                not_tracked: 0,
            }),
            max_queues: max_queues.clamp(1, MAX_QUEUES_TRACKED),
        }
    }

    /// Records one sample as the next point.
    pub fn record(&self, sample: Sample) {
        let mut rings = self.rings.lock();
        let rings = &mut *rings;
        rings.samples += 1;
        let now = rings.samples;
        let point = Point {
            events: sample.events_total.saturating_sub(rings.last_events_total),
            lag_ms: sample.lag_ms,
        };
        rings.last_events_total = sample.events_total;

        // This second's point of every queue that waited or moved.
        let known = sample.queues.waiting.is_some();
        let mut busy: BTreeMap<QueueName, QueuePoint> = BTreeMap::new();
        for (queue, waiting) in sample.queues.waiting.into_iter().flatten() {
            busy.entry(queue).or_default().waiting = Some(waiting);
        }
        for (queue, moved) in sample.queues.moved {
            let entry = busy.entry(queue).or_default();
            let clamp = |count: u64| u32::try_from(count).unwrap_or(u32::MAX);
            entry.admitted = clamp(moved.admitted);
            entry.abandoned = clamp(moved.abandoned);
            entry.refused = clamp(moved.refused);
        }
        busy.retain(|_, point| !point.is_idle());

        rings.not_tracked = 0;
        for queue in busy.keys() {
            if !rings.queues.contains_key(queue) && !self.make_room(rings, now) {
                rings.not_tracked += 1;
                continue;
            }
            if !rings.queues.contains_key(queue) {
                rings.queues.insert(
                    queue.clone(),
                    TrackedQueue {
                        fine: std::iter::repeat_n(None, rings.fine.times.len()).collect(),
                        coarse: std::iter::repeat_n(None, rings.coarse.times.len()).collect(),
                        pending: None,
                        last_busy: now,
                    },
                );
            }
        }

        rings.fine.push(sample.at_ms, point);
        rings.pending.absorb(point);
        rings.pending_points += 1;
        let coarse_due = rings.pending_points == COARSE_EVERY;
        if coarse_due {
            let pending = std::mem::take(&mut rings.pending);
            rings.coarse.push(sample.at_ms, pending);
            rings.pending_points = 0;
        }
        for (queue, tracked) in &mut rings.queues {
            let point = busy.get(queue).copied().unwrap_or(QueuePoint {
                // Not active: nobody waits (when the round is known at all).
                waiting: known.then_some(0),
                ..QueuePoint::default()
            });
            if !point.is_idle() {
                tracked.last_busy = now;
            }
            push_bounded(&mut tracked.fine, Some(point), FINE_POINTS);
            match &mut tracked.pending {
                Some(pending) => pending.absorb(point),
                None => tracked.pending = Some(point),
            }
            if coarse_due {
                push_bounded(&mut tracked.coarse, tracked.pending.take(), COARSE_POINTS);
            }
        }
    }

    /// Frees a place for a new queue when every place is taken: the queue idle longest, if idle for
    /// the whole coarse ring. Whether there is room now.
    fn make_room(&self, rings: &mut Rings, now: u64) -> bool {
        if rings.queues.len() < self.max_queues {
            return true;
        }
        let idlest = rings
            .queues
            .iter()
            .min_by_key(|(_, tracked)| tracked.last_busy)
            .filter(|(_, tracked)| now - tracked.last_busy > IDLE_SAMPLES_BEFORE_EVICTION)
            .map(|(queue, _)| queue.clone());
        match idlest {
            Some(queue) => {
                rings.queues.remove(&queue);
                true
            }
            None => false,
        }
    }

    /// The last `minutes` of history.
    pub fn view(&self, minutes: u64) -> HistoryView {
        let rings = self.rings.lock();
        let fine = minutes * 60 <= FINE_POINTS as u64;
        let (tier, interval) = if fine {
            (&rings.fine, 1)
        } else {
            (&rings.coarse, COARSE_EVERY as u64)
        };
        let wanted = (minutes * 60 / interval) as usize;
        let skip = tier.times.len().saturating_sub(wanted);
        let per_second = |count: u32| f64::from(count) / interval as f64;
        let queues = rings
            .queues
            .iter()
            .map(|(queue, tracked)| {
                let points: Vec<Option<QueuePoint>> = if fine { &tracked.fine } else { &tracked.coarse }
                    .iter()
                    .skip(skip)
                    .copied()
                    .collect();
                let series = |of: &dyn Fn(&QueuePoint) -> f64| -> Vec<Option<f64>> {
                    points.iter().map(|point| point.as_ref().map(of)).collect()
                };
                (
                    queue.to_string(),
                    QueueSeries {
                        waiting: points.iter().map(|point| point.and_then(|p| p.waiting)).collect(),
                        admitted_per_second: series(&|p| per_second(p.admitted)),
                        abandoned_per_second: series(&|p| per_second(p.abandoned)),
                        refused_per_second: series(&|p| per_second(p.refused)),
                    },
                )
            })
            .collect();
        HistoryView {
            minutes,
            interval_seconds: interval,
            times: tier.times.iter().skip(skip).copied().collect(),
            events_per_second: tier
                .points
                .iter()
                .skip(skip)
                .map(|point| point.events as f64 / interval as f64)
                .collect(),
            freshness_lag_seconds: tier
                .points
                .iter()
                .skip(skip)
                .map(|point| point.lag_ms.map(|ms| ms as f64 / 1000.0))
                .collect(),
            queues,
            max_queues_tracked: self.max_queues,
            queues_not_tracked: rings.not_tracked,
        }
    }
}

/// One queue's series in a [`HistoryView`], aligned with its `times`; `null` where the queue was not
/// tracked (or, for `waiting`, where the count was unknown).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueSeries {
    /// Members waiting at the point.
    pub waiting: Vec<Option<u64>>,
    /// Members given a token by this instance, per second over the interval.
    pub admitted_per_second: Vec<Option<f64>>,
    /// Waiting members dropped as abandoned, per second.
    pub abandoned_per_second: Vec<Option<f64>>,
    /// Entries this instance refused (every reason), per second.
    pub refused_per_second: Vec<Option<f64>>,
}

/// `GET /v1/admin/dashboard/history`: the series of the last `minutes`, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryView {
    /// The window asked for.
    pub minutes: u64,
    /// Seconds each point covers: 1 up to 10 minutes, 10 beyond.
    pub interval_seconds: u64,
    /// The end of each point's interval (Unix ms). Fewer than the window holds while the process is
    /// younger than the window.
    pub times: Vec<i64>,
    /// Events this instance accepted, per second.
    pub events_per_second: Vec<f64>,
    /// Seconds since the newest ingest the served rankings include (`null` before the first ingest).
    pub freshness_lag_seconds: Vec<Option<f64>>,
    /// Each tracked queue's series, by name.
    pub queues: BTreeMap<String, QueueSeries>,
    /// Most queues tracked at once.
    pub max_queues_tracked: usize,
    /// Queues that had somebody waiting or moved at the last point but are not tracked (every place
    /// taken by a queue busy within the hour).
    pub queues_not_tracked: usize,
}

/// Reads one [`Sample`] from the service's in-process state.
pub fn sample_now(state: &AppState) -> Sample {
    let service = &state.rankings.service;
    let as_of = service.engine().read().as_of_millis();
    let now = state.clock.now_millis();
    Sample {
        at_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as i64),
        events_total: service.writer().accepted_events(),
        lag_ms: as_of.map(|as_of| (now - as_of).max(0)),
        queues: state.waiting_room.dashboard_sample(),
    }
}

/// The sampler: a point every [`SAMPLE_EVERY`], the first at once, until `shutdown`.
pub fn spawn_sampler(state: AppState, shutdown: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(SAMPLE_EVERY);
        // After a stall one point carries the stall's counts (see the module doc), rather than a burst
        // of points a few microseconds apart.
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = interval.tick() => {}
            }
            state.dashboard.record(sample_now(&state));
        }
    })
}

/// The dashboard's admin routes (the caller adds authentication).
pub(crate) const ADMIN_ENDPOINTS: &[Endpoint<Arc<History>>] =
    &[Endpoint::new(Method::GET, "/v1/admin/dashboard/history", |m| {
        on(m, history)
    })];

/// [`ADMIN_ENDPOINTS`] as a router.
pub(crate) fn admin_routes(history: Arc<History>) -> Router {
    route_table::router_of(ADMIN_ENDPOINTS).with_state(history)
}

/// `minutes` of the query: 1..=60, [`DEFAULT_MINUTES`] when absent; other parameters are ignored.
fn parse_minutes(query: Option<&str>) -> ApiResult<u64> {
    let mut minutes = DEFAULT_MINUTES;
    for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if key == "minutes" {
            minutes = value
                .parse()
                .ok()
                .filter(|m| (1..=MAX_MINUTES).contains(m))
                .ok_or_else(|| {
                    ApiError::bad_field(
                        "minutes",
                        format!("must be a whole number from 1 to {MAX_MINUTES}"),
                    )
                })?;
        }
    }
    Ok(minutes)
}

async fn history(
    State(history): State<Arc<History>>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<HistoryView>> {
    let minutes = parse_minutes(query.as_deref())?;
    Ok(Json(history.view(minutes)))
}

/// The page: static HTML with one inline script.
const PAGE: &str = include_str!("../../dashboard.html");

/// The page's Content-Security-Policy: its one inline script by hash (so nothing injected would run),
/// calls to this origin only, nothing loaded from elsewhere.
fn page_csp() -> &'static HeaderValue {
    static CSP: OnceLock<HeaderValue> = OnceLock::new();
    CSP.get_or_init(|| {
        let script = inline_script(PAGE).expect("dashboard.html has one inline <script>");
        let hash = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(script.as_bytes()));
        HeaderValue::from_str(&format!(
            "default-src 'none'; script-src 'sha256-{hash}'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'"
        ))
        .expect("a CSP is a header value")
    })
}

/// The text of the page's one `<script>` element, as the browser hashes it.
fn inline_script(page: &str) -> Option<&str> {
    let start = page.find("<script>")? + "<script>".len();
    let end = start + page[start..].find("</script>")?;
    (page.matches("<script").count() == 1).then(|| &page[start..end])
}

/// `GET /` and `GET /dashboard`: the page (public: it holds no data; it asks for the admin key itself).
pub async fn page() -> Response {
    let mut response = axum::response::Html(PAGE).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, page_csp().clone());
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::waiting_room::dashboard_feed::MovedCounts;

    fn queue(name: &str) -> QueueName {
        QueueName::parse(name).unwrap()
    }

    fn sample(events_total: u64, waiting: &[(&str, u64)], moved: &[(&str, u64)]) -> Sample {
        Sample {
            at_ms: 0,
            events_total,
            lag_ms: Some(1500),
            queues: QueueSample {
                waiting: Some(waiting.iter().map(|(q, w)| (queue(q), *w)).collect()),
                moved: moved
                    .iter()
                    .map(|(q, admitted)| {
                        (
                            queue(q),
                            MovedCounts {
                                admitted: *admitted,
                                ..MovedCounts::default()
                            },
                        )
                    })
                    .collect(),
            },
        }
    }

    #[test]
    fn rates_times_the_interval_sum_to_the_counts_in_both_tiers() {
        let history = History::new(100);
        let mut total = 0;
        for second in 0..1_000u64 {
            total += second % 7;
            history.record(sample(total, &[("a", second % 3)], &[("a", second % 5)]));
        }
        let fine = history.view(10);
        assert_eq!(fine.times.len(), FINE_POINTS);
        let last_600: u64 = (400..1_000u64).map(|s| s % 7).sum();
        assert_eq!(fine.events_per_second.iter().sum::<f64>(), last_600 as f64);
        let hour = history.view(60);
        assert_eq!(hour.interval_seconds, 10);
        assert_eq!(hour.times.len(), 100, "1,000 seconds make 100 coarse points");
        let events: f64 = hour.events_per_second.iter().map(|rate| rate * 10.0).sum();
        assert_eq!(events.round() as u64, total);
        let admitted: f64 = hour.queues["a"]
            .admitted_per_second
            .iter()
            .map(|rate| rate.unwrap() * 10.0)
            .sum();
        assert_eq!(admitted.round() as u64, (0..1_000u64).map(|s| s % 5).sum::<u64>());
        assert_eq!(
            hour.queues["a"].waiting.last(),
            Some(&Some(999 % 3)),
            "a coarse point waits what its last second did"
        );
        assert_eq!(hour.freshness_lag_seconds.last(), Some(&Some(1.5)));
    }

    #[test]
    fn a_queue_is_tracked_from_its_first_busy_second_and_idle_ones_give_way() {
        let history = History::new(2);
        history.record(sample(0, &[], &[]));
        history.record(sample(0, &[("a", 4)], &[]));
        history.record(sample(0, &[("b", 1)], &[("c", 1)]));
        let view = history.view(1);
        assert_eq!(view.queues["a"].waiting, vec![None, Some(4), Some(0)]);
        assert_eq!(view.queues["b"].waiting, vec![None, None, Some(1)]);
        assert!(
            !view.queues.contains_key("c"),
            "two places, both busy within the hour"
        );
        assert_eq!(view.queues_not_tracked, 1);
        // An hour later "a" and "b" have been idle for the whole coarse ring: "c" takes a place.
        for _ in 0..IDLE_SAMPLES_BEFORE_EVICTION {
            history.record(sample(0, &[], &[]));
        }
        history.record(sample(0, &[], &[("c", 2)]));
        let view = history.view(1);
        assert!(view.queues.contains_key("c"));
        assert_eq!(view.queues.len(), 2);
        assert_eq!(view.queues_not_tracked, 0);
        assert_eq!(view.queues["c"].admitted_per_second.last(), Some(&Some(2.0)));
    }

    #[test]
    fn unknown_waiting_is_null_not_zero() {
        let history = History::new(10);
        history.record(sample(0, &[("a", 3)], &[]));
        let mut stale = sample(0, &[], &[]);
        stale.queues.waiting = None;
        history.record(stale);
        assert_eq!(history.view(1).queues["a"].waiting, vec![Some(3), None]);
    }

    #[test]
    fn minutes_is_checked() {
        assert_eq!(parse_minutes(None).unwrap(), DEFAULT_MINUTES);
        assert_eq!(parse_minutes(Some("minutes=60&x=1")).unwrap(), 60);
        for bad in [
            "minutes=0",
            "minutes=61",
            "minutes=",
            "minutes=ten",
            "minutes=-1",
            "minutes=1.5",
        ] {
            let error = parse_minutes(Some(bad)).unwrap_err().to_string();
            assert!(error.contains("minutes"), "{bad}: {error}");
        }
    }

    #[test]
    fn the_csp_hashes_the_pages_one_script() {
        let script = inline_script(PAGE).expect("one inline script");
        assert!(script.contains("fetch("), "the script is the page's own");
        assert!(
            !PAGE.contains(" onclick=") && !PAGE.contains(" onload="),
            "no inline handlers"
        );
        let csp = page_csp().to_str().unwrap();
        assert!(csp.contains("script-src 'sha256-"), "{csp}");
    }
}
