//! Group commit for the hot path: concurrent entries (and polls) share one script call.
//!
//! Under a surge, thousands of members enter and poll at once, and each request used to be its own `EVALSHA`:
//! Redis pays its per-script cost (argument parsing, Lua set-up, the meta-hash read) once per member, and
//! this process one round trip per member. A [`Coalescer`] is a lane with one driver task: a request drops
//! its item in, the driver takes **everything that is waiting** (up to [`MAX_BATCH`]), groups it by queue,
//! runs one batch script per queue (all of a queue's keys share its hash tag, so a batch is legal on a
//! Cluster), and hands every caller its own answer. While a round is at Redis the next one fills up, so
//! batches grow with load by themselves and a lone request is sent at once, never held back for a timer.
//!
//! Rounds run one at a time, and a batch script is atomic and treats its members one after another in
//! arrival order, so a member's decision is the one the same calls one at a time would have got: a member
//! named twice is entered once, the later of two polls sees the earlier in its log, and sequences follow
//! arrival order (the answers of one batch share one clock reading and the waiting count after the batch).
//! A caller that gave up before its round is formed (a client that went away) is left out of it.
//!
//! Each caller gets its own result: one member's failure (a record this version cannot read) is that
//! member's error. When the round itself cannot reach Redis, everyone already queued behind it is answered
//! with the same error at once (fail closed, quickly) rather than each round waiting out its own response
//! timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use futures_util::future::{join_all, BoxFuture};
use parking_lot::Mutex;
use rankgate_core::queue::QueueName;
use tokio::sync::{mpsc, oneshot};

use super::RedisStore;
use crate::queue::StoreError;

/// The most members one script call answers: bounds the script's time on Redis's one thread (3–9 µs per
/// member measured, so about a millisecond at most) and the reply's size.
pub(super) const MAX_BATCH: usize = 128;

/// Runs one queue's batch: one answer per item, in order; `Err` when the batch as a whole failed.
pub(super) type RunBatch<I, O> = for<'a> fn(
    &'a RedisStore,
    &'a QueueName,
    Vec<I>,
) -> BoxFuture<'a, Result<Vec<Result<O, StoreError>>, StoreError>>;

type Answer<O> = oneshot::Sender<Result<O, StoreError>>;
type Waiter<I, O> = (QueueName, I, Answer<O>);

/// One lane of coalesced calls (the store has one for entries and one for polls).
pub(super) struct Coalescer<I, O> {
    lane: Mutex<Option<mpsc::UnboundedSender<Waiter<I, O>>>>,
    run: RunBatch<I, O>,
    counts: Arc<Counts>,
}

/// How much coalescing happened: script calls made and items they answered.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) calls: AtomicU64,
    pub(super) items: AtomicU64,
}

impl<I: Send + 'static, O: Send + 'static> Coalescer<I, O> {
    pub(super) fn new(run: RunBatch<I, O>) -> Coalescer<I, O> {
        Coalescer {
            lane: Mutex::new(None),
            run,
            counts: Arc::default(),
        }
    }

    /// `(script calls, items answered)` so far.
    pub(super) fn counts(&self) -> (u64, u64) {
        (
            self.counts.calls.load(Ordering::Relaxed),
            self.counts.items.load(Ordering::Relaxed),
        )
    }

    /// Queues `item` for the next round and waits for its own answer.
    pub(super) async fn call(
        &self,
        store: &Weak<RedisStore>,
        queue: &QueueName,
        item: I,
    ) -> Result<O, StoreError> {
        let (answer, answered) = oneshot::channel();
        let mut waiter = (queue.clone(), item, answer);
        // Twice at most: a second failure means our own runtime is shutting down.
        for _ in 0..2 {
            let lane = self
                .lane
                .lock()
                .get_or_insert_with(|| self.spawn(store.clone()))
                .clone();
            match lane.send(waiter) {
                Ok(()) => {
                    return answered.await.unwrap_or_else(|_| {
                        Err(StoreError::Unavailable("the redis batch was dropped".into()))
                    })
                }
                // The driver is gone (the runtime it ran on shut down): start a new one on ours.
                Err(mpsc::error::SendError(returned)) => {
                    waiter = returned;
                    let mut current = self.lane.lock();
                    if current.as_ref().is_some_and(|l| l.same_channel(&lane)) {
                        *current = None;
                    }
                }
            }
        }
        Err(StoreError::Unavailable(
            "the redis batch lane cannot start: the runtime is shutting down".into(),
        ))
    }

    fn spawn(&self, store: Weak<RedisStore>) -> mpsc::UnboundedSender<Waiter<I, O>> {
        let (lane, waiters) = mpsc::unbounded_channel();
        tokio::spawn(drive(store, waiters, self.run, self.counts.clone()));
        lane
    }
}

/// The driver: one round at a time, each everything that queued up while the previous one ran.
async fn drive<I: Send, O: Send>(
    store: Weak<RedisStore>,
    mut waiters: mpsc::UnboundedReceiver<Waiter<I, O>>,
    run: RunBatch<I, O>,
    counts: Arc<Counts>,
) {
    let mut round = Vec::new();
    while waiters.recv_many(&mut round, MAX_BATCH).await > 0 {
        // The store owns the lane, so while a waiter exists the store does too.
        let Some(store) = store.upgrade() else { return };
        if let Err(error) = run_round(&store, std::mem::take(&mut round), run, &counts).await {
            // Redis failed the round (down, or answering too slowly): everyone queued behind it would
            // wait out the same timeout a round at a time, so answer them all now (fail closed).
            while let Ok((_, _, answer)) = waiters.try_recv() {
                let _ = answer.send(Err(error.clone()));
            }
        }
    }
}

/// One round: one batch script per queue, every caller answered. Reports a batch that failed as a whole
/// because Redis could not be reached.
async fn run_round<I, O>(
    store: &RedisStore,
    round: Vec<Waiter<I, O>>,
    run: RunBatch<I, O>,
    counts: &Counts,
) -> Result<(), StoreError> {
    let mut by_queue: HashMap<QueueName, (Vec<I>, Vec<Answer<O>>)> = HashMap::new();
    let mut items_sent = 0;
    for (queue, item, answer) in round {
        if answer.is_closed() {
            continue;
        }
        let (items, answers) = by_queue.entry(queue).or_default();
        items.push(item);
        answers.push(answer);
        items_sent += 1;
    }
    counts.calls.fetch_add(by_queue.len() as u64, Ordering::Relaxed);
    counts.items.fetch_add(items_sent, Ordering::Relaxed);
    let failures = join_all(by_queue.into_iter().map(|(queue, (items, answers))| async move {
        let expected = items.len();
        let result = run(store, &queue, items).await.and_then(|outputs| {
            if outputs.len() == expected {
                Ok(outputs)
            } else {
                Err(StoreError::Corrupt(format!(
                    "a batch of {expected} got {} answers",
                    outputs.len()
                )))
            }
        });
        match result {
            Ok(outputs) => {
                for (answer, output) in answers.into_iter().zip(outputs) {
                    let _ = answer.send(output);
                }
                None
            }
            Err(error) => {
                for answer in answers {
                    let _ = answer.send(Err(error.clone()));
                }
                matches!(error, StoreError::Unavailable(_)).then_some(error)
            }
        }
    }))
    .await;
    failures.into_iter().flatten().next().map_or(Ok(()), Err)
}
