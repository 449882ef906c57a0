//! [`DeadlineIndex`]: when this instance next needs to visit each queue nobody waits in (issue 30).
//!
//! A queue with members waiting is visited by admission every tick. A queue holding only READY or CLAIMED
//! members (or remembered consumed ones) has nothing to do until its earliest deadline, a token or claim
//! expiry, so it is not polled: the store answers that deadline with every admission and expiry step
//! (`next_deadline_ms`), this index keeps it, and the expiry sweep visits only the queues whose deadline
//! passed. A thousand such queues then cost one map scan per sweep instead of a thousand store calls.
//!
//! The index is per instance, learned from this instance's own store answers: on Redis a cluster cannot
//! keep a global index updated from a queue's script (a script touches one slot), and separate calls
//! around it would race. What another instance changes is learned by the slow rescan
//! ([`super::scheduler`], every minute), which visits every queue once; so when the instance that admitted
//! a queue's members dies, another one expires their tokens at most a rescan period late. Changes this
//! instance makes (a claim: an earlier deadline) are noted at once.
//!
//! Deadlines are in store-clock milliseconds and compared with the room's clock: on Redis the two are
//! different machines' clocks, so a skew makes a visit early (it finds nothing due and learns the same
//! deadline again) or late by the skew (a token's slot is freed that much later; a claim is still checked
//! against the store's own clock).

use std::collections::HashMap;

use parking_lot::Mutex;
use rankgate_core::queue::QueueName;

/// Due now: a queue marked with this is visited by the next sweep.
const DUE_NOW: i64 = i64::MIN;

/// One queue's entry.
#[derive(Debug, Clone, Copy)]
struct Due {
    /// The earliest deadline known (store clock, ms).
    at_ms: i64,
    /// The [`DeadlineIndex::changes`] count of the last change noted for the queue, so that a visit that
    /// started before it cannot overwrite what it did not see.
    change: u64,
}

/// The earliest known deadline of each queue this instance has to visit (module docs).
#[derive(Debug, Default)]
pub(crate) struct DeadlineIndex {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    queues: HashMap<QueueName, Due>,
    /// Bumped by every noted change; visits remember it when they start.
    changes: u64,
}

/// What a visit saw when it started ([`DeadlineIndex::start_visit`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Visit(u64);

impl DeadlineIndex {
    /// Call before asking the store, and pass the result to [`DeadlineIndex::learn`] with its answer.
    pub(crate) fn start_visit(&self) -> Visit {
        Visit(self.inner.lock().changes)
    }

    /// The store answered `next` (the queue's earliest deadline, `None`: it has none) to a visit that
    /// started at `visit`. The answer replaces what was known, unless a change was noted since the visit
    /// started: then the earlier of the two is kept, so the change's deadline is not lost.
    pub(crate) fn learn(&self, queue: &QueueName, next: Option<i64>, visit: Visit) {
        let mut inner = self.inner.lock();
        let noted_since = inner.queues.get(queue).is_some_and(|due| due.change > visit.0);
        match (next, noted_since) {
            (_, true) => {
                if let (Some(next), Some(due)) = (next, inner.queues.get_mut(queue)) {
                    due.at_ms = due.at_ms.min(next);
                }
            }
            (Some(at_ms), false) => {
                // The change marker stays: a visit that started even earlier must still not overwrite.
                let change = inner.queues.get(queue).map_or(0, |due| due.change);
                inner.queues.insert(queue.clone(), Due { at_ms, change });
            }
            (None, false) => {
                inner.queues.remove(queue);
            }
        }
    }

    /// This instance gave `queue` a deadline at `at_ms` (a claim): visit it no later than then.
    pub(crate) fn note_deadline(&self, queue: &QueueName, at_ms: i64) {
        let mut inner = self.inner.lock();
        inner.changes += 1;
        let change = inner.changes;
        let due = inner.queues.entry(queue.clone()).or_insert(Due { at_ms, change });
        due.at_ms = due.at_ms.min(at_ms);
        due.change = change;
    }

    /// This instance changed `queue`'s members in a way whose deadline it was not told (a release): the
    /// next sweep visits it and learns the deadline.
    pub(crate) fn note_change(&self, queue: &QueueName) {
        self.note_deadline(queue, DUE_NOW);
    }

    /// The queues whose deadline is at or before `now_ms`, in name order.
    pub(crate) fn due(&self, now_ms: i64) -> Vec<QueueName> {
        let inner = self.inner.lock();
        let mut due: Vec<QueueName> = inner
            .queues
            .iter()
            .filter(|(_, due)| due.at_ms <= now_ms)
            .map(|(queue, _)| queue.clone())
            .collect();
        due.sort();
        due
    }

    /// The queue no longer exists here.
    pub(crate) fn forget(&self, queue: &QueueName) {
        self.inner.lock().queues.remove(queue);
    }

    /// How many queues the index holds (tests, telemetry).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().queues.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(name: &str) -> QueueName {
        QueueName::parse(name).unwrap()
    }

    #[test]
    fn a_queue_is_due_only_once_its_earliest_deadline_passed() {
        let index = DeadlineIndex::default();
        let (a, b) = (queue("a"), queue("b"));
        index.learn(&a, Some(1_000), index.start_visit());
        index.learn(&b, Some(5_000), index.start_visit());
        assert!(index.due(999).is_empty());
        assert_eq!(index.due(1_000), vec![a.clone()]);
        assert_eq!(index.due(5_000), vec![a.clone(), b.clone()]);
        // The visit found nothing left: the queue leaves the index.
        index.learn(&a, None, index.start_visit());
        assert_eq!(index.due(10_000), vec![b]);
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn a_claim_noted_during_a_visit_is_not_overwritten_by_the_visit_s_older_answer() {
        let index = DeadlineIndex::default();
        let q = queue("q");
        index.learn(&q, Some(600_000), index.start_visit());
        let visit = index.start_visit();
        // A claim answered meanwhile: it expires well before the token.
        index.note_deadline(&q, 60_000);
        // The visit's answer predates the claim.
        index.learn(&q, Some(600_000), visit);
        assert_eq!(index.due(60_000), vec![q.clone()], "the claim's expiry stays");
        // A visit that started after the claim is believed.
        index.learn(&q, Some(600_000), index.start_visit());
        assert!(index.due(60_000).is_empty());
    }

    #[test]
    fn a_noted_change_makes_the_queue_due_at_once() {
        let index = DeadlineIndex::default();
        let q = queue("q");
        index.note_change(&q);
        assert_eq!(index.due(i64::MIN + 1), vec![q.clone()]);
        index.forget(&q);
        assert!(index.due(i64::MAX).is_empty());
    }
}
