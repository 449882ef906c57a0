//! Ranking change streams: `GET /v1/categories/{category}/top/events` as Server-Sent Events.
//!
//! A stream sends the top page — the very JSON object `GET …/top` answers, from the same
//! [`RankingsReader`], so it works on every backend and every instance — when it opens and whenever it
//! changes, at most once per freshness interval, and a `: heartbeat` comment every heartbeat interval.
//!
//! ```text
//! GET …/top/events ─► parse (the `…/top` parser) ─► slot (max_top_streams, else 429)
//!     ─► first read through the reader (a bad request or a failing read is an ordinary JSON error)
//!     ─► subscribe to the ranking's one Watcher, keyed by (category, ranker, span as asked, offset, limit)
//! Watcher task (one per watched ranking, however many streams): every freshness interval
//!     reader.top ─► changed? (the bytes, then the content without `asOf`) ─► try_send to each stream
//!     whose last message is older than it and at least one freshness interval old
//!     every heartbeat interval ─► try_send a heartbeat to each stream
//!     no stream left ─► the watcher ends
//! ```
//!
//! - **Shared work.** Many streams on one ranking cost one read per freshness interval, and that read is
//!   usually a response-cache hit: the reader caches top pages until the data moves. Fan-out touches
//!   streams only on a change (or while a stream waits out its spacing), so its cost is O(streams that
//!   change), never a timer per stream doing a read.
//! - **What counts as a change.** Anything in the object except `asOf`: `asOf` moves with every ingest
//!   anywhere, and a stream re-sending an unchanged list for each of them would be noise.
//! - **Spacing.** Each stream remembers when it last got a page, so the page it got on opening and the
//!   watcher's next change are a freshness interval apart, too.
//! - **Following the clock.** A stream without `at` follows the current period or window: the watcher
//!   re-resolves the request against the clock on every read, so tonight's "today" becomes tomorrow.
//! - **Bounds.** `max_top_streams` per instance; each stream has a channel of `top_stream_buffer`
//!   messages. A client that stops reading stops draining its channel; when a message does not fit, the
//!   stream is dropped (its slot freed at once, its body ended with an error so the connection is closed
//!   rather than flushed), never buffered for. Heartbeats go through the same channel, so a client that
//!   stops reading a ranking that never changes is found too. Shutdown ends every stream.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::response::sse::Event;
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use rankgate_core::ids::CategoryOrAll;
use rankgate_core::period::{format_hour_key, Span, Zone};
use rankgate_core::read::{parse_read_query, ReadContext, ReadEndpoint, ReadRequest};
use rankgate_store::clock::Clock;
use rankgate_store::ranking::engine::RankingQuery;

use super::reader::{RankingsReader, ReadError, TopRequest};
use crate::http::sse::{Delivery, Outlet, Push, StreamShape, StreamSlots};

/// How many streams, how much buffer, how often.
#[derive(Debug, Clone, Copy)]
pub struct TopStreamLimits {
    /// Streams open at once on this instance (`max_top_streams`).
    pub max_streams: usize,
    /// Messages queued per stream before a client that does not read is dropped (`top_stream_buffer`).
    pub buffer: usize,
    /// Between heartbeat comments (`top_stream_heartbeat_millis`).
    pub heartbeat: Duration,
    /// Between reads of a watched ranking, and between two pages on one stream (`freshness_millis`).
    pub freshness: Duration,
}

/// Why a stream could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Every slot is taken.
    #[error("max_top_streams: this instance already serves its limit of {0} ranking streams; retry later")]
    Full(usize),
    /// The first read failed.
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// A watched ranking as the client asked for it: `at` absent means "the current one", so the key keeps
/// the canonical query (re-parsed on every read) rather than a resolved span.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct WatchKey {
    category: CategoryOrAll,
    /// `ranker=…&period=…[&at=…]&offset=…&limit=…`, in a fixed order.
    query: String,
}

/// One subscribed stream, as its watcher sees it.
struct Subscriber {
    id: u64,
    outlet: Outlet,
    /// Fingerprint of the last page this stream got.
    fingerprint: u64,
    /// When it got it.
    sent_at: Instant,
}

/// The one reader of a watched ranking, and its streams.
struct Watcher {
    key: WatchKey,
    subscribers: Mutex<Vec<Subscriber>>,
}

/// Every stream of this instance.
pub struct TopStreams {
    inner: Arc<Inner>,
}

struct Inner {
    reader: Arc<RankingsReader>,
    clock: Arc<dyn Clock>,
    zone: Zone,
    metric_retention_millis: i64,
    limits: TopStreamLimits,
    slots: StreamSlots,
    watchers: Mutex<HashMap<WatchKey, Arc<Watcher>>>,
    next_id: AtomicU64,
    shutdown: CancellationToken,
}

impl TopStreams {
    /// Streams over `reader`, ended when `shutdown` is cancelled.
    pub fn new(
        reader: Arc<RankingsReader>,
        clock: Arc<dyn Clock>,
        zone: Zone,
        metric_retention_millis: i64,
        limits: TopStreamLimits,
        shutdown: CancellationToken,
    ) -> TopStreams {
        TopStreams {
            inner: Arc::new(Inner {
                reader,
                clock,
                zone,
                metric_retention_millis,
                slots: StreamSlots::new(
                    limits.max_streams,
                    "rankgate_top_streams_open",
                    "rankgate_top_streams_dropped_total",
                ),
                limits,
                watchers: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(0),
                shutdown,
            }),
        }
    }

    /// Streams open now.
    pub fn open_streams(&self) -> usize {
        self.inner.slots.open_streams()
    }

    /// Rankings watched now (one watcher each, however many streams).
    pub fn watchers(&self) -> usize {
        self.inner.watchers.lock().len()
    }

    /// Opens a stream of `category`'s top page as `parsed` asks (`at_given`: whether the query named
    /// `at`; without it the stream follows the current span). The first item is the current page.
    pub async fn open(
        &self,
        category: CategoryOrAll,
        parsed: &ReadRequest,
        at_given: bool,
    ) -> Result<impl futures_util::Stream<Item = Result<Event, std::io::Error>>, OpenError> {
        let inner = &self.inner;
        let (outlet, inlet) = inner
            .slots
            .try_open(inner.limits.buffer)
            .ok_or(OpenError::Full(inner.limits.max_streams))?;
        let key = WatchKey {
            query: canonical_query(parsed, at_given, &inner.zone),
            category,
        };
        let request = top_request(&key.category, parsed);
        // A failing first read drops the inlet, which frees the slot.
        let first = inner.reader.top(&request).await?;
        // Parsed outside the registry lock: a 1,000-item page takes about a millisecond.
        let first_fingerprint = fingerprint(&first);
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let watcher = {
            let mut watchers = inner.watchers.lock();
            let watcher = watchers.entry(key.clone()).or_insert_with(|| {
                let watcher = Arc::new(Watcher {
                    key: key.clone(),
                    subscribers: Mutex::new(Vec::new()),
                });
                tokio::spawn(run_watcher_until_unwatched(
                    Arc::clone(inner),
                    Arc::clone(&watcher),
                    first.clone(),
                ));
                watcher
            });
            watcher.subscribers.lock().push(Subscriber {
                id,
                outlet,
                fingerprint: first_fingerprint,
                sent_at: Instant::now(),
            });
            Arc::downgrade(watcher)
        };
        let shape = StreamShape {
            event: "top",
            dropped_message: "the client read too slowly (top_stream_buffer); stream dropped",
            shutdown: inner.shutdown.clone(),
        };
        Ok(inlet.into_events(first, shape, Subscription { watcher, id }))
    }
}

/// The top request a parsed read asks for.
fn top_request(category: &CategoryOrAll, parsed: &ReadRequest) -> TopRequest {
    TopRequest {
        query: RankingQuery {
            ranker: parsed.ranker,
            category: category.clone(),
            span: parsed.span,
        },
        offset: parsed.offset,
        limit: parsed.limit,
    }
}

/// The query a watcher re-parses on every read: the parsed request written out in a fixed order, with
/// `at` only when the client gave one.
fn canonical_query(parsed: &ReadRequest, at_given: bool, zone: &Zone) -> String {
    let (kind, name, at) = match parsed.span {
        Span::Period(key) => ("period", key.kind().as_str(), key.to_string()),
        Span::Window { len, end } => ("window", len.as_str(), format_hour_key(end, zone)),
    };
    let at = if at_given {
        format!("&at={at}")
    } else {
        String::new()
    };
    format!(
        "ranker={}&{kind}={name}{at}&offset={}&limit={}",
        parsed.ranker.as_str(),
        parsed.offset,
        parsed.limit
    )
}

/// A hash of a top page without `asOf` (see the module doc: what counts as a change).
fn fingerprint(body: &[u8]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(mut fields)) => {
            fields.remove("asOf");
            serde_json::to_vec(&fields)
                .expect("a JSON value serializes")
                .hash(&mut hasher);
        }
        _ => body.hash(&mut hasher),
    }
    hasher.finish()
}

/// Reads the watched ranking every freshness interval and fans changes and heartbeats out, until no
/// stream is left (or shutdown).
async fn run_watcher_until_unwatched(inner: Arc<Inner>, watcher: Arc<Watcher>, first: Bytes) {
    metrics::gauge!("rankgate_top_stream_watchers").increment(1.0);
    let mut latest = first;
    let mut latest_fingerprint = fingerprint(&latest);
    // Streams that missed the latest page only because of their spacing: visited again next round.
    let mut waiting = false;
    let mut ticker = tokio::time::interval(inner.limits.freshness);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heartbeat_due = Instant::now() + inner.limits.heartbeat;
    loop {
        tokio::select! {
            _ = inner.shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        {
            // Under the registry lock, which `open` holds while subscribing: no stream can join a
            // watcher that is leaving.
            let mut watchers = inner.watchers.lock();
            if watcher.subscribers.lock().is_empty() {
                watchers.remove(&watcher.key);
                break;
            }
        }
        let mut changed = false;
        match read_watched(&inner, &watcher.key).await {
            Err(WatchError::OutOfRange(error)) => {
                // An `at` the clock has left behind (older than metric_retention): nothing more will
                // come; end the streams rather than read a ranking that cannot be read.
                tracing::info!(error = %error, "a watched ranking is out of range; its streams end");
                let mut watchers = inner.watchers.lock();
                watchers.remove(&watcher.key);
                watcher.subscribers.lock().clear();
                break;
            }
            Ok(body) if body != latest => {
                let print = fingerprint(&body);
                changed = print != latest_fingerprint;
                latest = body;
                latest_fingerprint = print;
            }
            Ok(_) => {}
            Err(WatchError::Read(error)) => {
                tracing::warn!(error = %error, "a watched ranking could not be read; will retry")
            }
        }
        if changed || waiting {
            waiting = fan_out(&watcher, &latest, latest_fingerprint, inner.limits.freshness);
        }
        if Instant::now() >= heartbeat_due {
            heartbeat_due = Instant::now() + inner.limits.heartbeat;
            send_to_all(&watcher, |_| Some(Push::Heartbeat));
        }
    }
    metrics::gauge!("rankgate_top_stream_watchers").decrement(1.0);
}

/// Why a watched ranking was not read.
#[derive(Debug, thiserror::Error)]
enum WatchError {
    /// The request no longer parses against the clock (its `at` fell out of retention).
    #[error(transparent)]
    OutOfRange(#[from] rankgate_core::read::ReadParamError),
    /// The read failed; the next round tries again.
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// The watched ranking's current page, resolved against the clock now.
async fn read_watched(inner: &Inner, key: &WatchKey) -> Result<Bytes, WatchError> {
    let context = ReadContext {
        zone: &inner.zone,
        now_millis: inner.clock.now_millis(),
        metric_retention_millis: inner.metric_retention_millis,
    };
    let parsed = parse_read_query(ReadEndpoint::Top, &key.query, &context)?;
    Ok(inner.reader.top(&top_request(&key.category, &parsed)).await?)
}

/// Sends `latest` to every stream that has not got it and got its last page a freshness interval ago or
/// more. Returns whether some stream still waits for its spacing.
fn fan_out(watcher: &Watcher, latest: &Bytes, latest_fingerprint: u64, spacing: Duration) -> bool {
    let now = Instant::now();
    let mut waiting = false;
    send_to_all(watcher, |subscriber| {
        if subscriber.fingerprint == latest_fingerprint {
            return None;
        }
        if now.duration_since(subscriber.sent_at) < spacing {
            waiting = true;
            return None;
        }
        subscriber.fingerprint = latest_fingerprint;
        subscriber.sent_at = now;
        Some(Push::Data(latest.clone()))
    });
    waiting
}

/// Offers each stream the message `message_for` picks (if any); a stream dropped for its full buffer,
/// or whose client is gone, is forgotten.
fn send_to_all(watcher: &Watcher, mut message_for: impl FnMut(&mut Subscriber) -> Option<Push>) {
    watcher.subscribers.lock().retain_mut(|subscriber| {
        let Some(push) = message_for(subscriber) else {
            return true;
        };
        subscriber.outlet.offer(push) == Delivery::Sent
    });
}

/// Removes its stream from the watcher when the stream ends (client gone, dropped, shutdown).
struct Subscription {
    watcher: Weak<Watcher>,
    id: u64,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(watcher) = self.watcher.upgrade() {
            watcher.subscribers.lock().retain(|s| s.id != self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_of_as_of_alone_is_not_a_change() {
        let a = br#"{"asOf":"2026-07-17T13:05:02.123Z","items":[{"productId":"p1","rank":1}],"total":1}"#;
        let b = br#"{"asOf":"2026-07-17T13:05:03.000Z","items":[{"productId":"p1","rank":1}],"total":1}"#;
        let c = br#"{"asOf":"2026-07-17T13:05:03.000Z","items":[{"productId":"p2","rank":1}],"total":1}"#;
        assert_eq!(fingerprint(a), fingerprint(b));
        assert_ne!(fingerprint(b), fingerprint(c));
    }
}
