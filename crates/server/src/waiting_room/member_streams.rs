//! Member position streams: `GET /v1/queues/{queue}/entries/{memberId}/events` as Server-Sent Events
//! (SPEC 2.2), push instead of polling.
//!
//! A stream sends the position object the poll route answers (`event: position`), built by the same
//! [`WaitingRoom`] code from the same store read, so it works on every backend and through every instance:
//! when it opens, then whenever it changes, at most once per the member's polling tier (1 s below rank
//! 100, 3 s below 1,000, else 5 s: the cadence the poll answer advertises), with a `: heartbeat` comment
//! every heartbeat interval. One watcher per watched queue decides what to send and when; the stream
//! itself (bounded channel, slow clients dropped, a slot per stream under an instance limit) is
//! [`crate::http::sse`]'s, as every stream's is.
//!
//! ```text
//! GET …/events ─► parse ─► slot (max_member_streams, else 429) ─► first position read (errors are JSON)
//!     ─► subscribe to the queue's one QueueWatch on this instance
//! QueueWatch task (one per queue with streams here), every ROUND:
//!     one store call: the queue's summary (waiting, READY + CLAIMED) ─► moved? bump the generation
//!     due = woken by a local admission tick, or behind the generation and past its cadence,
//!           or silent for REFRESH ─► one position read each ─► changed? try_send
//!     every heartbeat interval ─► try_send a heartbeat to each stream; no stream left ─► the watch ends
//! Admission tick on this instance ─► wake(queue, admitted members): O(admitted), a map lookup each
//! ```
//!
//! # What "changed" means for a FIFO, and why the cadence bounds the work
//! When the head moves (an admission on any instance, a leave), everyone behind it moves; when somebody
//! enters, everyone's `currentTotalWaitingCount` moves. So in a moving queue *every* member's position
//! changes, and a push per change would be O(queue) per tick. Two things keep it bounded:
//! - **The tick's own fan-out is O(admitted members).** The admission step wakes only the members it
//!   admitted (a hash lookup each); it never walks the streams. Members admitted by another instance are
//!   found by their watcher on their next due read.
//! - **Everyone else is re-read at their cadence, only when the queue moved.** The watcher asks the store
//!   once per round for the queue's summary; when it did not change, nobody's rank can have changed
//!   (bar a leave and an entry in the same round, healed by REFRESH) and no member is read. When it did,
//!   each stream is re-read at most once per polling tier. A queue of 10,000 streamed members therefore
//!   costs at most `Σ 1/tier(rank)` reads per second (about 2,200 for ranks 0–9,999), the load the same
//!   members polling would cause, minus the HTTP requests, the rate limiter and the connections.
//!   Ranks are read, not derived from the head moving: a leave in the middle, or an admission on another
//!   instance, moves ranks in ways this instance cannot see, and the stream promises the poll route's
//!   exact object.
//! - **Holding a stream counts as polling.** Each read is the same store read a poll makes (it moves the
//!   member's abandonment deadline), and a stream is read at least every REFRESH (30 s, or a third of the
//!   queue's `abandonAfterSeconds` if shorter) even in a queue that does not move, so a member holding a
//!   stream is never dropped as abandoned.
//!
//! # Bounds
//! `max_member_streams` per instance (429 past it, naming the key); each stream has a channel of
//! [`BUFFER`] messages, and a client that lets it fill is dropped (slot freed at once, body ended with an
//! error). Memory per stream is its subscriber record here, its channel and the connection (measured by
//! `tests/api/member_streams.rs`, reported in BENCHMARKS.md).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::response::sse::Event;
use bytes::Bytes;
use futures_util::StreamExt as _;
use parking_lot::Mutex;
use rankgate_core::ids::MemberId;
use rankgate_core::queue::{polling_tier_seconds, QueueName};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::position::Position;
use super::service::WaitingRoom;
use crate::http::error::{ApiError, ApiResult};
use crate::http::sse::{Delivery, Outlet, Push, StreamShape, StreamSlots};

/// How often a watch looks at its queue's summary: a quarter of the fastest polling tier, so a change is
/// pushed within a quarter second of the member's cadence allowing it.
const ROUND: Duration = Duration::from_millis(250);
/// Longest a stream goes without a position read, whether or not the queue moved: heals the one change
/// the summary cannot see (a leave and an entry in the same round) and keeps a streaming member seen. A
/// queue whose `abandonAfterSeconds` is shorter refreshes at a third of it (see [`refresh_for`]).
const REFRESH: Duration = Duration::from_secs(30);

/// How often a quiet stream is re-read in a queue that drops members unseen for `abandon_after_seconds`:
/// three reads per period, so holding a stream always counts as polling.
fn refresh_for(abandon_after_seconds: u64) -> Duration {
    REFRESH.min(Duration::from_millis(abandon_after_seconds * 1000 / 3))
}
/// Messages queued per stream before a client that does not read is dropped. Positions supersede each
/// other, so a few suffice.
pub(crate) const BUFFER: usize = 4;
/// Streams one member may hold open on one instance (a few tabs): past it, 429. Without it one member id
/// could take every `max_member_streams` slot.
pub(crate) const MAX_STREAMS_PER_MEMBER: usize = 4;
/// Position reads one watch has in flight at once.
const READS_IN_FLIGHT: usize = 32;
/// Gauge of open member streams.
const OPEN_GAUGE: &str = "rankgate_member_streams_open";

/// How many streams, how often a heartbeat.
#[derive(Debug, Clone, Copy)]
pub struct MemberStreamLimits {
    /// `max_member_streams`: streams open at once on this instance.
    pub max_streams: usize,
    /// `member_stream_heartbeat_millis`: between heartbeat comments.
    pub heartbeat: Duration,
}

/// One open stream, as its watch sees it.
struct Subscriber {
    member: MemberId,
    outlet: Outlet,
    /// Fingerprint of the last position this stream got (see [`fingerprint`]).
    fingerprint: u64,
    /// When the stream was last read from the store.
    read_at: Instant,
    /// Not before this may it be read again: its polling tier after the last read.
    next_read_at: Instant,
    /// The queue summary generation the last read saw.
    generation: u64,
    /// A local admission tick admitted this member: read it as soon as its cadence allows.
    woken: bool,
}

/// The streams of one queue on this instance.
#[derive(Default)]
struct Subscribers {
    by_id: HashMap<u64, Subscriber>,
    /// Stream ids by member (a member may have several tabs open): the admission tick's wake is a lookup.
    by_member: HashMap<MemberId, Vec<u64>>,
}

/// The one watcher of a queue on this instance.
struct QueueWatch {
    queue: QueueName,
    subscribers: Mutex<Subscribers>,
    /// Wakes the watch task early when a local tick admitted one of its members.
    woken: Notify,
    /// Bumped each time the queue's summary changes. A stream opening takes the value from before its
    /// first read, so it is re-read only if the queue moved since (not 10,000 re-reads for 10,000 opens).
    generation: AtomicU64,
}

/// Every member stream of this instance.
pub(crate) struct MemberStreams {
    limits: MemberStreamLimits,
    slots: StreamSlots,
    watches: Mutex<HashMap<QueueName, Arc<QueueWatch>>>,
    next_id: AtomicU64,
    /// Cancelled at shutdown (by the workers' shutdown token): every stream ends.
    pub(crate) shutdown: CancellationToken,
}

impl MemberStreams {
    pub(crate) fn new(limits: MemberStreamLimits) -> MemberStreams {
        MemberStreams {
            slots: StreamSlots::new(
                limits.max_streams,
                OPEN_GAUGE,
                "rankgate_member_streams_dropped_total",
            ),
            limits,
            watches: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            shutdown: CancellationToken::new(),
        }
    }

    /// Streams open now.
    pub(crate) fn open_streams(&self) -> usize {
        self.slots.open_streams()
    }

    /// Marks the streams of `admitted` members of `queue` due: O(admitted), never a walk of the streams.
    pub(crate) fn wake(&self, queue: &QueueName, admitted: &[MemberId]) {
        if admitted.is_empty() {
            return;
        }
        let Some(watch) = self.watches.lock().get(queue).cloned() else {
            return;
        };
        let mut woke_any = false;
        {
            let mut subscribers = watch.subscribers.lock();
            let Subscribers { by_id, by_member } = &mut *subscribers;
            for member in admitted {
                for id in by_member.get(member).into_iter().flatten() {
                    if let Some(subscriber) = by_id.get_mut(id) {
                        subscriber.woken = true;
                        woke_any = true;
                    }
                }
            }
        }
        if woke_any {
            watch.woken.notify_one();
        }
    }
}

/// The first position, its fingerprint and the SSE body bytes.
fn encoded(position: &Position) -> (Bytes, u64) {
    let body = Bytes::from(serde_json::to_vec(position).expect("a position serializes"));
    (body, fingerprint(position))
}

/// A hash of a position without `pollingIntervalSeconds`, whose jitter differs on every read: two reads
/// that differ only there are the same position.
fn fingerprint(position: &Position) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut stable = position.clone();
    stable.polling_interval_seconds = 0.0;
    serde_json::to_vec(&stable)
        .expect("a position serializes")
        .hash(&mut hasher);
    hasher.finish()
}

fn cadence_of(position: &Position) -> Duration {
    Duration::from_secs(polling_tier_seconds(position.rank))
}

impl WaitingRoom {
    /// Opens `member`'s position stream in `queue`. The first item is the current position; a failing
    /// first read, or a full instance (`max_member_streams`), is an ordinary JSON error.
    pub async fn open_member_stream(
        self: &Arc<Self>,
        queue: QueueName,
        member: MemberId,
    ) -> ApiResult<impl futures_util::Stream<Item = Result<Event, std::io::Error>>> {
        let streams = &self.member_streams;
        let (outlet, inlet) = streams
            .slots
            .try_open(BUFFER)
            .ok_or_else(|| ApiError::TooManyRequests {
                message: format!(
                    "max_member_streams: this instance already serves its limit of {} member streams; poll \
                 GET /v1/queues/{{queue}}/entries/{{memberId}} instead, or retry later",
                    streams.limits.max_streams
                ),
                retry_after_secs: 5,
                headers: Vec::new(),
            })?;
        // Taken before the first read: a summary change the watch sees after it makes this stream due
        // again, so no change between the first read and the subscription is missed. (A watch that does
        // not exist yet starts at 0 and its first summary bumps it.)
        let generation_before_first_read = streams
            .watches
            .lock()
            .get(&queue)
            .map_or(0, |watch| watch.generation.load(Ordering::Acquire));
        // A failing first read drops the inlet, which frees the slot.
        let first = self.position(&queue, &member).await?;
        let (first_body, first_fingerprint) = encoded(&first);
        let id = streams.next_id.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let watch = 'subscribed: {
            let mut watches = streams.watches.lock();
            let watch = watches.entry(queue.clone()).or_insert_with(|| {
                let watch = Arc::new(QueueWatch {
                    queue: queue.clone(),
                    subscribers: Mutex::new(Subscribers::default()),
                    woken: Notify::new(),
                    generation: AtomicU64::new(0),
                });
                tokio::spawn(run_queue_watch_until_unwatched(
                    Arc::clone(self),
                    Arc::clone(&watch),
                ));
                watch
            });
            let mut subscribers = watch.subscribers.lock();
            let of_member = subscribers.by_member.entry(member.clone()).or_default();
            if of_member.len() >= MAX_STREAMS_PER_MEMBER {
                break 'subscribed None;
            }
            of_member.push(id);
            subscribers.by_id.insert(
                id,
                Subscriber {
                    member,
                    outlet,
                    fingerprint: first_fingerprint,
                    read_at: now,
                    next_read_at: now + cadence_of(&first),
                    generation: generation_before_first_read,
                    woken: false,
                },
            );
            drop(subscribers);
            Some(Arc::downgrade(watch))
        };
        let Some(watch) = watch else {
            // Dropping the inlet frees the slot.
            return Err(ApiError::TooManyRequests {
                message: format!(
                    "memberId: this member already holds {MAX_STREAMS_PER_MEMBER} streams on this \
                     instance, the most one member may; close one"
                ),
                retry_after_secs: 5,
                headers: Vec::new(),
            });
        };
        let shape = StreamShape {
            event: "position",
            dropped_message: "the client read too slowly; member stream dropped",
            shutdown: streams.shutdown.clone(),
        };
        Ok(inlet.into_events(first_body, shape, Subscription { watch, id }))
    }
}

/// A queue's summary (waiting, READY + CLAIMED): when it is unchanged between two rounds, no waiting
/// member's rank or count moved. With it, the queue's `abandon_after_seconds` (the refresh depends on it).
async fn queue_summary(room: &WaitingRoom, queue: &QueueName) -> Option<((u64, u64), Option<u64>)> {
    match room.queues.admission_preview(queue).await {
        Ok(preview) => Some(preview.map_or(((0, 0), None), |p| {
            ((p.waiting, p.outstanding), Some(p.settings.abandon_after_seconds))
        })),
        Err(error) => {
            tracing::warn!(error = %error, queue = %queue, "member streams: queue summary failed; will retry");
            None
        }
    }
}

/// Watches one queue for its streams on this instance until none is left (or shutdown).
async fn run_queue_watch_until_unwatched(room: Arc<WaitingRoom>, watch: Arc<QueueWatch>) {
    let streams = &room.member_streams;
    metrics::gauge!("rankgate_member_stream_watches").increment(1.0);
    let mut last_summary = None;
    let mut refresh = REFRESH;
    let mut heartbeat_due = Instant::now() + streams.limits.heartbeat;
    let mut ticker = tokio::time::interval(ROUND);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = streams.shutdown.cancelled() => break,
            _ = ticker.tick() => {}
            _ = watch.woken.notified() => {}
        }
        {
            // Under the registry lock, which `open` holds while subscribing: no stream joins a leaving watch.
            let mut watches = streams.watches.lock();
            if watch.subscribers.lock().by_id.is_empty() {
                watches.remove(&watch.queue);
                break;
            }
        }
        if let Some((summary, abandon_after_seconds)) = queue_summary(&room, &watch.queue).await {
            refresh = abandon_after_seconds.map_or(REFRESH, refresh_for);
            if last_summary != Some(summary) {
                last_summary = Some(summary);
                watch.generation.fetch_add(1, Ordering::AcqRel);
            }
        }
        let generation = watch.generation.load(Ordering::Acquire);
        let now = Instant::now();
        let due: Vec<MemberId> = {
            let subscribers = watch.subscribers.lock();
            let mut due: Vec<MemberId> = subscribers
                .by_id
                .values()
                .filter(|s| {
                    now >= s.next_read_at
                        && (s.woken || s.generation != generation || now >= s.read_at + refresh)
                })
                .map(|s| s.member.clone())
                .collect();
            due.sort_unstable();
            due.dedup();
            due
        };
        if !due.is_empty() {
            let reads = futures_util::stream::iter(due)
                .map(|member| {
                    let room = &room;
                    let queue = &watch.queue;
                    async move {
                        let position = room.position(queue, &member).await;
                        (member, position)
                    }
                })
                .buffer_unordered(READS_IN_FLIGHT)
                .collect::<Vec<_>>()
                .await;
            let read_at = Instant::now();
            for (member, position) in reads {
                let Ok(position) = position else {
                    // The store is down: try again next round (the stream keeps its heartbeat).
                    continue;
                };
                let (body, print) = encoded(&position);
                let cadence = cadence_of(&position);
                send_to_member(&watch, &member, |subscriber| {
                    subscriber.read_at = read_at;
                    subscriber.next_read_at = read_at + cadence;
                    subscriber.generation = generation;
                    subscriber.woken = false;
                    if subscriber.fingerprint == print {
                        return None;
                    }
                    subscriber.fingerprint = print;
                    Some(Push::Data(body.clone()))
                });
            }
        }
        if Instant::now() >= heartbeat_due {
            heartbeat_due = Instant::now() + streams.limits.heartbeat;
            let ids: Vec<u64> = watch.subscribers.lock().by_id.keys().copied().collect();
            send_to_ids(&watch, &ids, |_| Some(Push::Heartbeat));
        }
    }
    metrics::gauge!("rankgate_member_stream_watches").decrement(1.0);
}

/// Offers each stream of `member` the message `message_for` picks (if any).
fn send_to_member(
    watch: &QueueWatch,
    member: &MemberId,
    message_for: impl FnMut(&mut Subscriber) -> Option<Push>,
) {
    let ids = watch
        .subscribers
        .lock()
        .by_member
        .get(member)
        .cloned()
        .unwrap_or_default();
    send_to_ids(watch, &ids, message_for);
}

/// Offers each stream in `ids` the message `message_for` picks; a stream whose channel is full is dropped,
/// one whose receiver is gone is forgotten.
fn send_to_ids(
    watch: &QueueWatch,
    ids: &[u64],
    mut message_for: impl FnMut(&mut Subscriber) -> Option<Push>,
) {
    let mut subscribers = watch.subscribers.lock();
    let mut gone = Vec::new();
    for id in ids {
        let Some(subscriber) = subscribers.by_id.get_mut(id) else {
            continue;
        };
        let Some(message) = message_for(subscriber) else {
            continue;
        };
        if subscriber.outlet.offer(message) != Delivery::Sent {
            gone.push(*id);
        }
    }
    for id in gone {
        unsubscribe(&mut subscribers, id);
    }
}

fn unsubscribe(subscribers: &mut Subscribers, id: u64) {
    let Some(subscriber) = subscribers.by_id.remove(&id) else {
        return;
    };
    if let Some(ids) = subscribers.by_member.get_mut(&subscriber.member) {
        ids.retain(|other| *other != id);
        if ids.is_empty() {
            subscribers.by_member.remove(&subscriber.member);
        }
    }
}

/// Removes its stream from the watch when the stream ends (client gone, dropped, shutdown).
struct Subscription {
    watch: Weak<QueueWatch>,
    id: u64,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(watch) = self.watch.upgrade() {
            unsubscribe(&mut watch.subscribers.lock(), self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rankgate_core::queue::MemberStatus;

    fn waiting_at(rank: u64, polling: f64) -> Position {
        Position {
            status: MemberStatus::Waiting,
            rank: Some(rank),
            current_total_waiting_count: 10,
            estimated_wait_seconds: Some(3),
            estimated_wait_seconds_p90: Some(4),
            polling_interval_seconds: polling,
            entry_token: None,
            token_expires_at: None,
            last_outcome: None,
            pre_queue: None,
            opens_at: None,
            member_id: None,
            ticket: None,
        }
    }

    #[test]
    fn the_polling_jitter_alone_is_not_a_change_but_a_rank_is() {
        assert_eq!(
            fingerprint(&waiting_at(4, 1.0)),
            fingerprint(&waiting_at(4, 1.17))
        );
        assert_ne!(fingerprint(&waiting_at(4, 1.0)), fingerprint(&waiting_at(3, 1.0)));
    }

    #[test]
    fn a_quiet_stream_is_read_three_times_per_abandonment_period() {
        assert_eq!(refresh_for(300), REFRESH);
        assert_eq!(refresh_for(60), Duration::from_secs(20));
        assert_eq!(refresh_for(5), Duration::from_millis(1_666));
    }

    #[test]
    fn the_cadence_is_the_polling_tier() {
        assert_eq!(cadence_of(&waiting_at(5, 1.0)), Duration::from_secs(1));
        assert_eq!(cadence_of(&waiting_at(500, 3.0)), Duration::from_secs(3));
        assert_eq!(cadence_of(&waiting_at(5_000, 5.0)), Duration::from_secs(5));
    }
}
