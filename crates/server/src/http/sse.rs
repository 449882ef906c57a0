//! Server-Sent Event streams: the one mechanism behind every stream rankgate offers (a ranking's top
//! page, a member's position).
//!
//! A product keeps one watcher per watched thing, which decides *what* to send and *when*; this module
//! owns what every stream needs whatever it carries:
//!
//! ```text
//! StreamSlots::try_open ─► Slot (the instance limit, else None: the product answers 429)
//!                       ─► Outlet (the watcher's end)  +  Inlet (the client's end)
//! watcher ─► Outlet::offer(Push) ─► Sent | Dropped (the client let its buffer fill: slot freed at once,
//!                                   the stream ends with an error) | Gone (the client left)
//! Inlet::into_events(first body, event name, guard) ─► the SSE body: the first item, then what the
//!     watcher pushes, `: heartbeat` comments, the end at shutdown; dropping it frees the slot and the
//!     product's guard (which unsubscribes it from its watcher)
//! ```
//!
//! - **Bounded.** Each stream has a channel of a fixed number of messages and a slot under an instance
//!   limit. A client that stops reading stops draining its channel; when a message does not fit, the
//!   stream is dropped, never buffered for. Heartbeats take the same channel, so a client that stops
//!   reading a stream that never changes is found too.
//! - **A dropped stream ends with an error**, so hyper closes the connection instead of trying to flush
//!   it to a client that does not read.
//! - **Counted.** `open_gauge` counts the open streams, `dropped_counter{reason="slow_client"}` the
//!   dropped ones.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::response::sse::Event;
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// What a watcher sends a stream.
#[derive(Debug, Clone)]
pub enum Push {
    /// A changed body (compact JSON: one `data:` line), sent under the stream's event name.
    Data(Bytes),
    /// Nothing changed for a heartbeat interval: a `: heartbeat` comment.
    Heartbeat,
}

/// What became of a [`Push`] offered to a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Queued for the client.
    Sent,
    /// The client let its buffer fill: the stream is dropped (its slot freed now, its body ended with an
    /// error). The watcher forgets it.
    Dropped,
    /// The client is gone (its body was dropped). The watcher forgets it.
    Gone,
}

/// The streams one kind may hold open on this instance, and the series that count them.
pub struct StreamSlots {
    slots: Arc<Semaphore>,
    max: usize,
    open_gauge: &'static str,
    dropped_counter: &'static str,
}

impl StreamSlots {
    /// At most `max` streams at once; `open_gauge` counts the open ones, `dropped_counter` the slow
    /// clients dropped.
    pub fn new(max: usize, open_gauge: &'static str, dropped_counter: &'static str) -> StreamSlots {
        StreamSlots {
            slots: Arc::new(Semaphore::new(max)),
            max,
            open_gauge,
            dropped_counter,
        }
    }

    /// The limit.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Streams open now.
    pub fn open_streams(&self) -> usize {
        self.max - self.slots.available_permits()
    }

    /// A new stream with a channel of `buffer` messages, or `None` when every slot is taken.
    pub fn try_open(&self, buffer: usize) -> Option<(Outlet, Inlet)> {
        let permit = Arc::clone(&self.slots).try_acquire_owned().ok()?;
        metrics::gauge!(self.open_gauge).increment(1.0);
        let slot = Arc::new(Slot {
            permit: Mutex::new(Some(permit)),
            gauge: self.open_gauge,
        });
        let (sender, receiver) = mpsc::channel(buffer.max(1));
        let dropped = Arc::new(AtomicBool::new(false));
        let outlet = Outlet {
            sender,
            dropped: Arc::clone(&dropped),
            slot: Arc::clone(&slot),
            dropped_counter: self.dropped_counter,
        };
        let inlet = Inlet {
            receiver,
            dropped,
            slot,
        };
        Some((outlet, inlet))
    }
}

/// A stream's place under its instance limit, given back by whichever comes first: the stream ending,
/// or its watcher dropping it.
struct Slot {
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    gauge: &'static str,
}

impl Slot {
    /// Gives the place back (once; later calls do nothing).
    fn free(&self) {
        if self.permit.lock().take().is_some() {
            metrics::gauge!(self.gauge).decrement(1.0);
        }
    }
}

/// The watcher's end of one stream.
pub struct Outlet {
    sender: mpsc::Sender<Push>,
    /// Set when this end drops the stream, so the client's end ends at its next poll.
    dropped: Arc<AtomicBool>,
    slot: Arc<Slot>,
    dropped_counter: &'static str,
}

impl Outlet {
    /// Offers `push` to the stream without waiting (see [`Delivery`]).
    pub fn offer(&self, push: Push) -> Delivery {
        match self.sender.try_send(push) {
            Ok(()) => Delivery::Sent,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.dropped.store(true, Ordering::Release);
                self.slot.free();
                metrics::counter!(self.dropped_counter, "reason" => "slow_client").increment(1);
                Delivery::Dropped
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Delivery::Gone,
        }
    }
}

/// The client's end of one stream, before it becomes the SSE body. Dropped unused (the first read
/// failed), it frees its slot.
pub struct Inlet {
    receiver: mpsc::Receiver<Push>,
    dropped: Arc<AtomicBool>,
    slot: Arc<Slot>,
}

impl Drop for Inlet {
    fn drop(&mut self) {
        self.slot.free();
    }
}

/// How a stream's items are named and how it ends.
#[derive(Debug, Clone)]
pub struct StreamShape {
    /// The `event:` of each data item (`top`, `position`).
    pub event: &'static str,
    /// The error a dropped stream ends with (it closes the connection; the client sees the cut).
    pub dropped_message: &'static str,
    /// Cancelled at shutdown: every stream ends.
    pub shutdown: CancellationToken,
}

impl Inlet {
    /// The SSE body: `first`, then what the watcher pushes, until the client goes, the watcher drops
    /// it, or shutdown. `guard` lives as long as the body (a product's subscription, which unsubscribes
    /// the stream from its watcher when dropped).
    pub fn into_events<G: Send + 'static>(
        self,
        first: Bytes,
        shape: StreamShape,
        guard: G,
    ) -> impl futures_util::Stream<Item = Result<Event, std::io::Error>> + Send + 'static {
        let state = StreamState {
            first: Some(first),
            inlet: self,
            ended: false,
            shape,
            _guard: guard,
        };
        futures_util::stream::unfold(state, next_event)
    }
}

/// What the stream holds between items.
struct StreamState<G> {
    first: Option<Bytes>,
    inlet: Inlet,
    /// Set after the error that ends a dropped stream.
    ended: bool,
    shape: StreamShape,
    _guard: G,
}

/// The next SSE item: the first body, then what the watcher sends; an error when the watcher dropped
/// the stream (hyper then closes the connection instead of flushing it); the end at shutdown.
async fn next_event<G>(mut state: StreamState<G>) -> Option<(Result<Event, std::io::Error>, StreamState<G>)> {
    if let Some(first) = state.first.take() {
        let event = data_event(state.shape.event, &first);
        return Some((Ok(event), state));
    }
    if state.ended {
        return None;
    }
    let push = tokio::select! {
        _ = state.shape.shutdown.cancelled() => return None,
        push = state.inlet.receiver.recv() => push,
    };
    if state.inlet.dropped.load(Ordering::Acquire) {
        state.ended = true;
        let error = std::io::Error::other(state.shape.dropped_message);
        return Some((Err(error), state));
    }
    let event = match push? {
        Push::Data(body) => data_event(state.shape.event, &body),
        Push::Heartbeat => Event::default().comment("heartbeat"),
    };
    Some((Ok(event), state))
}

fn data_event(name: &'static str, body: &Bytes) -> Event {
    // Bodies are compact JSON: never a newline, so one `data:` line.
    Event::default().event(name).data(String::from_utf8_lossy(body))
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt as _;

    use super::*;

    fn shape(shutdown: &CancellationToken) -> StreamShape {
        StreamShape {
            event: "top",
            dropped_message: "too slow",
            shutdown: shutdown.clone(),
        }
    }

    #[tokio::test]
    async fn the_first_body_comes_first_then_what_the_watcher_pushes() {
        let slots = StreamSlots::new(2, "test_sse_open", "test_sse_dropped_total");
        let (outlet, inlet) = slots.try_open(4).expect("a free slot");
        let shutdown = CancellationToken::new();
        let mut events = Box::pin(inlet.into_events(Bytes::from_static(b"{\"a\":1}"), shape(&shutdown), ()));
        assert_eq!(
            outlet.offer(Push::Data(Bytes::from_static(b"{\"a\":2}"))),
            Delivery::Sent
        );
        assert_eq!(outlet.offer(Push::Heartbeat), Delivery::Sent);
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(format!(
                "{:?}",
                events.next().await.expect("an item").expect("not an error")
            ));
        }
        assert!(seen[0].contains("a\\\":1"), "{seen:?}");
        assert!(seen[1].contains("a\\\":2"), "{seen:?}");
        assert!(seen[2].contains("heartbeat"), "{seen:?}");
        shutdown.cancel();
        assert!(events.next().await.is_none(), "shutdown ends the stream");
    }

    #[tokio::test]
    async fn a_full_buffer_drops_the_stream_frees_its_slot_and_ends_it_with_an_error() {
        let slots = StreamSlots::new(1, "test_sse_open", "test_sse_dropped_total");
        let (outlet, inlet) = slots.try_open(1).expect("a free slot");
        assert!(slots.try_open(1).is_none(), "the only slot is taken");
        let shutdown = CancellationToken::new();
        let mut events = Box::pin(inlet.into_events(Bytes::from_static(b"{}"), shape(&shutdown), ()));
        assert_eq!(outlet.offer(Push::Heartbeat), Delivery::Sent);
        assert_eq!(outlet.offer(Push::Heartbeat), Delivery::Dropped);
        assert_eq!(
            slots.open_streams(),
            0,
            "the slot is free before the client reads again"
        );
        assert!(events.next().await.expect("first").is_ok());
        let ended = events.next().await.expect("the error item");
        assert_eq!(
            ended
                .expect_err("a dropped stream ends with an error")
                .to_string(),
            "too slow"
        );
        assert!(events.next().await.is_none());
    }

    #[tokio::test]
    async fn a_client_gone_is_gone_and_an_unused_inlet_frees_its_slot() {
        let slots = StreamSlots::new(1, "test_sse_open", "test_sse_dropped_total");
        let (outlet, inlet) = slots.try_open(2).expect("a free slot");
        drop(inlet);
        assert_eq!(slots.open_streams(), 0);
        assert_eq!(outlet.offer(Push::Heartbeat), Delivery::Gone);
        let (_outlet, inlet) = slots.try_open(2).expect("the slot came back");
        let events = inlet.into_events(Bytes::new(), shape(&CancellationToken::new()), ());
        assert_eq!(slots.open_streams(), 1);
        drop(events);
        assert_eq!(slots.open_streams(), 0, "a stream's end frees its slot");
    }
}
