//! Scheduled openings (SPEC 2.1 `opensAt`): what the service adds around the store's draw steps.
//!
//! - **Positions.** A member waiting before the draw is in the pre-queue: the position says
//!   `"preQueue": true` and `opensAt`, its `rank` and estimate are `null` (every pre-queue member has the
//!   same chance, so no rank means anything yet), and `currentTotalWaitingCount` counts the pre-queue.
//! - **The draw.** The admission tick of a queue whose opening is due runs
//!   [`rankgate_store::queue::draw::run_draw`] (each instance tries; the store's lease lets one draw): it
//!   closes the pre-queue, publishes `entrantsCommitment`, and, unless the queue names `drawBeaconRound`,
//!   draws at once. With a beacon round the queue stays closed (nobody admitted, entrants keep their
//!   `preQueue` position) until an admin supplies the round's value (`PUT
//!   /v1/admin/queues/{queue}/draw/beacon`, [`WaitingRoom::supply_beacon`]); the next tick then draws.
//! - **Publication.** `GET /v1/queues/{queue}/draw` is public: `opensAt`, `drawCommitment` and
//!   `drawBeaconRound` from the start, `entrantsCommitment` from the close, and after the draw `drawSeed`,
//!   `beacon`, `drawKey` and the drawn order as **draw keys** (each entrant's order key
//!   `HMAC-SHA-256(drawKey, memberId)`, hex), paged, so nobody learns other members' ids, yet each member
//!   can compute their own key and find their place, and anyone can check the keys are ascending and the
//!   seed matches the commitment. The admin twin `GET /v1/admin/queues/{queue}/draw` lists the member ids
//!   too, which is what `rankgate queue verify-draw --url` recomputes the entrants commitment and the order
//!   from.
//!
//! The draw record is read through a small per-instance cache ([`OPENING_CACHE_MS`]), so a poll of a
//! queue without an opening costs no second store call in the common case.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rankgate_core::ids::MemberId;
use rankgate_core::queue::draw::{member_order_key, parse_beacon_value, parse_opens_at, MAX_BEACON_ROUND};
use rankgate_core::queue::{DrawPhase, DrawSeed, MemberStatus, QueueName};
use rankgate_store::queue::draw::{
    run_draw, BeaconRoundOutcome, DrawRecord, DrawRun, ScheduleOutcome, SupplyBeacon,
};
use rankgate_store::queue::MemberView;
use serde::Serialize;
use serde_json::Value;

use super::errors::store_error;
use super::position::Position;
use super::service::{rfc3339, WaitingRoom};
use crate::http::error::{ApiError, ApiResult};

/// How long an instance trusts a draw record it read. A position read just after the draw may still say
/// `preQueue` for this long; admission never relies on it (the store checks the phase in its own step).
pub(crate) const OPENING_CACHE_MS: u64 = 250;

/// Most draw entries one page of `GET …/draw` returns.
pub(crate) const MAX_DRAW_PAGE: usize = 10_000;

/// Recently read draw records, per queue.
#[derive(Default)]
pub(crate) struct OpeningCache {
    records: Mutex<HashMap<QueueName, (Instant, Option<DrawRecord>)>>,
    /// This instance's drawer id (the store's lease names it).
    drawer: std::sync::OnceLock<String>,
}

impl OpeningCache {
    pub(crate) fn forget(&self, queue: &QueueName) {
        self.records.lock().remove(queue);
    }

    fn drawer(&self) -> &str {
        self.drawer
            .get_or_init(|| format!("drawer-{}", hex::encode(rand::random::<[u8; 12]>())))
    }
}

/// A scheduled opening as the admin view and the public draw read show it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OpeningView {
    /// RFC 3339.
    pub opens_at: String,
    /// `scheduled`, `closing`, `awaitingBeacon`, `drawing` or `done`.
    pub draw_phase: &'static str,
    /// Hex SHA-256 of the seed.
    pub draw_commitment: String,
    /// The public beacon round the draw waits for after the close, if any.
    pub draw_beacon_round: Option<u64>,
    /// Hex SHA-256 over the sorted SHA-256(memberId) digests of the entrants, from the close on.
    pub entrants_commitment: Option<String>,
    /// Members the entrants commitment covers (0 before the close).
    pub entrant_count: u64,
    /// The beacon's value in hex once supplied; `""` in a done draw without a beacon round.
    pub beacon: Option<String>,
    /// Hex seed, once the draw is done.
    pub draw_seed: Option<String>,
    /// Hex `HMAC-SHA-256(seed, entrantsCommitment ‖ beacon)`, once the draw is done: each member's order
    /// key is `HMAC-SHA-256(drawKey, memberId)`.
    pub draw_key: Option<String>,
    /// Members in the pre-queue when it closed (0 before).
    pub pre_queue_size: u64,
    /// Members in the published drawn order.
    pub drawn_count: u64,
}

impl OpeningView {
    fn of(record: &DrawRecord) -> OpeningView {
        let done = record.revealed_seed().is_some();
        OpeningView {
            opens_at: rfc3339(record.opens_at_ms),
            draw_phase: record.phase.as_str(),
            draw_commitment: hex::encode(record.commitment()),
            draw_beacon_round: record.beacon_round,
            entrants_commitment: record.entrants_commitment.map(hex::encode),
            entrant_count: record.entrant_count,
            beacon: match (&record.beacon, done) {
                (Some(beacon), _) => Some(hex::encode(beacon)),
                (None, true) => Some(String::new()),
                (None, false) => None,
            },
            draw_seed: record.revealed_seed().map(|seed| hex::encode(seed.0)),
            draw_key: record.revealed_draw_key().map(|key| hex::encode(key.0)),
            pre_queue_size: record.pre_queue_size,
            drawn_count: record.drawn,
        }
    }
}

/// One page of a published draw.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DrawPage {
    pub queue: String,
    #[serde(flatten)]
    pub opening: OpeningView,
    /// Position of the first entry of this page in the drawn order.
    pub offset: u64,
    /// Each entrant's order key `HMAC-SHA-256(drawKey, memberId)` in hex, in drawn order (after the draw;
    /// empty before).
    pub draw_keys: Vec<String>,
    /// Member ids in drawn order: admin read only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<String>>,
}

/// Who reads a published draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrawReader {
    /// Anybody: draw keys only.
    Public,
    /// An admin: member ids too.
    Admin,
}

impl WaitingRoom {
    /// The queue's draw record, through the cache.
    pub(crate) async fn opening(&self, queue: &QueueName) -> ApiResult<Option<DrawRecord>> {
        if let Some((at, record)) = self.openings.records.lock().get(queue) {
            if at.elapsed() < Duration::from_millis(OPENING_CACHE_MS) {
                return Ok(record.clone());
            }
        }
        let record = self
            .queues
            .draws()
            .draw_record(queue)
            .await
            .map_err(store_error)?;
        let mut records = self.openings.records.lock();
        // Bounded like the queues themselves: one entry per queue this instance was asked about.
        if records.len() > self.config.max_queues.saturating_mul(2) {
            records.clear();
        }
        records.insert(queue.clone(), (Instant::now(), record.clone()));
        Ok(record)
    }

    /// The queue's draw record, fresh from the store (admin reads, and right after a change).
    async fn opening_fresh(&self, queue: &QueueName) -> ApiResult<Option<DrawRecord>> {
        self.openings.forget(queue);
        self.opening(queue).await
    }

    /// Marks a waiting member of a pre-queue: `preQueue`, `opensAt`, and no rank or estimate yet.
    pub(crate) async fn mark_pre_queue(&self, queue: &QueueName, position: &mut Position) -> ApiResult<()> {
        if position.status != MemberStatus::Waiting {
            return Ok(());
        }
        let Some(record) = self.opening(queue).await? else {
            return Ok(());
        };
        if !record.holds_in_pre_queue(position.rank) {
            return Ok(());
        }
        position.pre_queue = Some(true);
        position.opens_at = Some(rfc3339(record.opens_at_ms));
        position.rank = None;
        position.estimated_wait_seconds = None;
        Ok(())
    }

    /// `max_pre_queue`: an entry that made a scheduled pre-queue longer than the limit is taken back and
    /// refused with 429 (the draw sorts the pre-queue in memory, so it is bounded).
    pub(crate) async fn refuse_entry_beyond_max_pre_queue(
        &self,
        queue: &QueueName,
        member: &MemberId,
        view: &MemberView,
    ) -> ApiResult<()> {
        if view.waiting_count <= self.config.max_pre_queue {
            return Ok(());
        }
        let Some(record) = self.opening(queue).await? else {
            return Ok(());
        };
        if record.phase != DrawPhase::Scheduled {
            return Ok(());
        }
        self.queues.leave(queue, member).await.map_err(store_error)?;
        Err(ApiError::TooManyRequests {
            message: format!(
                "max_pre_queue: the pre-queue of {queue} already holds {} members; try again after the \
                 opening at {}",
                self.config.max_pre_queue,
                rfc3339(record.opens_at_ms)
            ),
            retry_after_secs: 60,
            headers: Vec::new(),
        })
    }

    /// Whether admission holds for `queue`'s opening this tick, running its draw first if it is due.
    /// Reads the record through the cache: a stale answer only delays admission by the cache's life,
    /// never admits early, since the store's own admission step checks the phase.
    pub(crate) async fn draw_if_due(&self, queue: &QueueName) -> anyhow::Result<bool> {
        let record = self
            .opening(queue)
            .await
            .map_err(|e| anyhow::anyhow!("reading the draw record of {queue}: {e:?}"))?;
        let Some(record) = record else {
            return Ok(false);
        };
        if !record.phase.holds_admission() {
            return Ok(false);
        }
        if record.phase == DrawPhase::Scheduled && self.clock.now_millis() < record.opens_at_ms {
            return Ok(true);
        }
        // Nothing to do but wait for an admin's beacon (its PUT drops the cached record).
        if record.phase == DrawPhase::AwaitingBeacon {
            return Ok(true);
        }
        let started = Instant::now();
        let run = run_draw(self.queues.draws(), queue, self.openings.drawer()).await?;
        match run {
            DrawRun::Done(Some(drawn)) => tracing::info!(
                queue = %queue,
                drawn,
                millis = started.elapsed().as_millis() as u64,
                "pre-queue drawn"
            ),
            DrawRun::AwaitingBeacon => {
                if let Ok(Some(record)) = self.opening_fresh(queue).await {
                    tracing::info!(
                        queue = %queue,
                        entrants = record.entrant_count,
                        entrants_commitment = %record.entrants_commitment.map(hex::encode).unwrap_or_default(),
                        beacon_round = record.beacon_round.unwrap_or_default(),
                        "pre-queue closed; the draw waits for the beacon"
                    );
                }
            }
            _ => {}
        }
        self.openings.forget(queue);
        Ok(!matches!(run, DrawRun::Done(_)))
    }

    /// `opensAt` of a PUT: an RFC 3339 string (in the future, at most 366 days ahead) sets it, `null`
    /// clears it. Validated against the store's clock before anything changes.
    pub(crate) fn parse_opens_at_field(&self, value: &Value) -> ApiResult<Option<i64>> {
        match value {
            Value::Null => Ok(None),
            Value::String(raw) => parse_opens_at(raw, self.clock.now_millis())
                .map(Some)
                .map_err(|e| ApiError::BadRequest(e.to_string())),
            _ => Err(ApiError::bad_field(
                "opensAt",
                "must be an RFC 3339 timestamp string, or null",
            )),
        }
    }

    /// `drawBeaconRound` of a PUT: a positive whole number (at most 2^53 − 1) names the round, `null` clears
    /// it.
    pub(crate) fn parse_beacon_round_field(value: &Value) -> ApiResult<Option<u64>> {
        match value {
            Value::Null => Ok(None),
            _ => value
                .as_u64()
                .filter(|round| (1..=MAX_BEACON_ROUND).contains(round))
                .map(Some)
                .ok_or_else(|| {
                    ApiError::bad_field(
                        "drawBeaconRound",
                        "must be a positive whole number up to 9007199254740991, or null",
                    )
                }),
        }
    }

    /// Refuses, before anything changes, a `drawBeaconRound` that cannot apply: naming a round needs an
    /// opening (set in this PUT or scheduled already), and the round is fixed once the pre-queue closed.
    pub(crate) async fn check_beacon_round_applies(
        &self,
        queue: &QueueName,
        round: Option<u64>,
        opens_at: Option<Option<i64>>,
    ) -> ApiResult<()> {
        match opens_at {
            Some(Some(_)) => Ok(()),
            Some(None) if round.is_none() => Ok(()),
            Some(None) => Err(ApiError::bad_field(
                "drawBeaconRound",
                "needs opensAt; this PUT clears opensAt",
            )),
            None => match self.opening_fresh(queue).await? {
                Some(record) if record.phase == DrawPhase::Scheduled => Ok(()),
                Some(record) if record.phase != DrawPhase::Done => Err(beacon_round_fixed(&record)),
                _ if round.is_none() => Ok(()),
                _ => Err(ApiError::bad_field(
                    "drawBeaconRound",
                    "the queue has no scheduled opening; give opensAt in the same PUT",
                )),
            },
        }
    }

    /// Names or clears the queue's `drawBeaconRound` (after [`WaitingRoom::check_beacon_round_applies`]).
    pub(crate) async fn set_beacon_round(&self, queue: &QueueName, round: Option<u64>) -> ApiResult<()> {
        let outcome = self
            .queues
            .draws()
            .set_beacon_round(queue, round)
            .await
            .map_err(store_error)?;
        self.openings.forget(queue);
        match outcome {
            BeaconRoundOutcome::Set(_) => Ok(()),
            // Cleared together with opensAt, or cleared on a queue that never had one: nothing to keep.
            BeaconRoundOutcome::NoOpening if round.is_none() => Ok(()),
            BeaconRoundOutcome::NoOpening => Err(ApiError::bad_field(
                "drawBeaconRound",
                "the queue has no scheduled opening; give opensAt in the same PUT",
            )),
            // The close happened between the check and this write.
            BeaconRoundOutcome::Closed => match self.opening_fresh(queue).await? {
                Some(record) => Err(beacon_round_fixed(&record)),
                None => Err(ApiError::Conflict(
                    "drawBeaconRound: the opening changed meanwhile; read it and try again".into(),
                )),
            },
        }
    }

    /// `PUT /v1/admin/queues/{queue}/draw/beacon {"round": R, "value": "<hex>"}`: the value of the queue's
    /// `drawBeaconRound`, once its pre-queue closed and its entrants commitment is published. A retry with
    /// the same value answers as the first did; another value never replaces an accepted one.
    pub(crate) async fn supply_beacon(
        &self,
        queue: &QueueName,
        round: u64,
        value: &[u8],
    ) -> ApiResult<OpeningView> {
        let outcome = self
            .queues
            .draws()
            .supply_beacon(queue, round, value)
            .await
            .map_err(store_error)?;
        self.openings.forget(queue);
        match outcome {
            SupplyBeacon::Accepted => tracing::info!(
                queue = %queue,
                round,
                beacon = %hex::encode(value),
                "draw beacon accepted"
            ),
            SupplyBeacon::AlreadyAccepted => {}
            SupplyBeacon::DifferentValueAccepted => {
                return Err(ApiError::Conflict(format!(
                    "value: round {round} already has another value for this draw; a draw's beacon never \
                     changes"
                )))
            }
            SupplyBeacon::WrongRound {
                expected: Some(expected),
            } => {
                return Err(ApiError::bad_field(
                    "round",
                    format!("this queue's draw waits for drawBeaconRound {expected}"),
                ))
            }
            SupplyBeacon::WrongRound { expected: None } | SupplyBeacon::NotAwaiting => {
                let why = match self.opening_fresh(queue).await? {
                    None => "it has no scheduled opening".to_string(),
                    Some(record) if record.beacon_round.is_none() => {
                        "its draw names no drawBeaconRound".into()
                    }
                    Some(record) => format!(
                        "its pre-queue closes at {} and the beacon is taken only once the entrants \
                         commitment is published",
                        rfc3339(record.opens_at_ms)
                    ),
                };
                return Err(ApiError::Conflict(format!(
                    "no draw of {queue} awaits a beacon: {why}"
                )));
            }
        }
        Ok(OpeningView::of(&self.opening_fresh(queue).await?.ok_or_else(
            || ApiError::Conflict(format!("the opening of {queue} was cleared meanwhile")),
        )?))
    }

    /// Sets or clears the queue's opening (a fresh seed from the OS generator when a new draw starts).
    pub(crate) async fn schedule_opening(
        &self,
        queue: &QueueName,
        opens_at_ms: Option<i64>,
    ) -> ApiResult<()> {
        let mut seed = [0u8; 32];
        getrandom_seed(&mut seed)?;
        let outcome = self
            .queues
            .draws()
            .schedule_opening(queue, opens_at_ms, DrawSeed(seed))
            .await
            .map_err(store_error)?;
        self.openings.forget(queue);
        match outcome {
            ScheduleOutcome::DrawRunning => Err(ApiError::Conflict(
                "opensAt: the pre-queue has closed and is being drawn; change it once the draw is done"
                    .into(),
            )),
            ScheduleOutcome::Scheduled(record) => {
                tracing::info!(
                    queue = %queue,
                    opens_at = %rfc3339(record.opens_at_ms),
                    commitment = %hex::encode(record.commitment()),
                    "opening scheduled"
                );
                Ok(())
            }
            ScheduleOutcome::Cleared | ScheduleOutcome::NothingToClear => Ok(()),
        }
    }

    /// The opening fields of the admin view, if the queue has `opensAt`.
    pub(crate) async fn opening_view(&self, queue: &QueueName) -> ApiResult<Option<OpeningView>> {
        Ok(self.opening_fresh(queue).await?.as_ref().map(OpeningView::of))
    }

    /// `GET /v1/queues/{queue}/draw` (public) and `GET /v1/admin/queues/{queue}/draw` (admin).
    pub(crate) async fn draw_page(
        &self,
        queue: &QueueName,
        offset: u64,
        limit: usize,
        reader: DrawReader,
    ) -> ApiResult<DrawPage> {
        let record = self
            .opening_fresh(queue)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("queue: {queue} has no scheduled opening")))?;
        let (draw_keys, members) = match record.revealed_draw_key() {
            None => (Vec::new(), Vec::new()),
            Some(key) => {
                let members = self
                    .queues
                    .draws()
                    .drawn_members(queue, offset, limit)
                    .await
                    .map_err(store_error)?;
                let keys = members
                    .iter()
                    .map(|m| hex::encode(member_order_key(&key, m)))
                    .collect();
                (keys, members)
            }
        };
        Ok(DrawPage {
            queue: queue.to_string(),
            opening: OpeningView::of(&record),
            offset,
            draw_keys,
            members: (reader == DrawReader::Admin).then_some(members),
        })
    }
}

/// 409 for a `drawBeaconRound` change after the close: the round is part of what the close fixed.
fn beacon_round_fixed(record: &DrawRecord) -> ApiError {
    ApiError::Conflict(format!(
        "drawBeaconRound: the pre-queue closed at {} (draw {}); the beacon round is fixed",
        rfc3339(record.opens_at_ms),
        record.phase.as_str()
    ))
}

/// Parses the body of `PUT …/draw/beacon`, naming the field at fault: `round` a positive whole number,
/// `value` 1 to 512 bytes of hex. Other fields are ignored.
pub(crate) fn parse_beacon_body(object: &serde_json::Map<String, Value>) -> ApiResult<(u64, Vec<u8>)> {
    let round = object
        .get("round")
        .and_then(Value::as_u64)
        .filter(|round| (1..=MAX_BEACON_ROUND).contains(round))
        .ok_or_else(|| {
            ApiError::bad_field("round", "must be a positive whole number up to 9007199254740991")
        })?;
    let value = object
        .get("value")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_field("value", "must be a string of hex digits"))?;
    let value = parse_beacon_value(value).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    Ok((round, value))
}

fn getrandom_seed(seed: &mut [u8; 32]) -> ApiResult<()> {
    use rand::TryRngCore as _;
    rand::rngs::OsRng
        .try_fill_bytes(seed)
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("OS random number generator: {e}")))
}

/// Parses `offset` (default 0) and `limit` (default 1,000, at most [`MAX_DRAW_PAGE`]) of a draw read.
pub(crate) fn parse_draw_page_query(query: Option<&str>) -> ApiResult<(u64, usize)> {
    let (mut offset, mut limit) = (0u64, 1_000usize);
    for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match key.as_ref() {
            "offset" => {
                offset =
                    value.parse().ok().filter(|o| *o <= 100_000_000).ok_or_else(|| {
                        ApiError::bad_field("offset", "must be a whole number up to 100000000")
                    })?
            }
            "limit" => {
                limit = value
                    .parse()
                    .ok()
                    .filter(|l| (1..=MAX_DRAW_PAGE).contains(l))
                    .ok_or_else(|| ApiError::bad_field("limit", "must be between 1 and 10000"))?
            }
            _ => {}
        }
    }
    Ok((offset, limit))
}
