//! The orders this instance saw bought (SPEC 2.2, "Places that survive the store"; issue 29): when the
//! store loses a queue, its record of consumed members goes with it, and a member whose order was already
//! consumed could otherwise come back by ticket to a front place and buy again. The gate and the consume
//! endpoint record here every consume they answered, so the entry refuses a restore to those members (they
//! enter at the back like anybody new). Per instance and in memory: a consume answered by another instance,
//! or before a restart, is not known here; README says so.

use std::collections::{HashSet, VecDeque};

use parking_lot::Mutex;
use rankgate_core::ids::MemberId;
use rankgate_core::queue::QueueName;

/// Most consumes remembered; the oldest are forgotten first (a sale's worth: a queue admitting 1,000
/// members a second for a minute and a half).
pub const MAX_REMEMBERED_CONSUMES: usize = 100_000;

/// Consumed members, oldest first, bounded.
#[derive(Debug, Default)]
pub struct ConsumedLedger {
    inner: Mutex<Ledger>,
}

#[derive(Debug, Default)]
struct Ledger {
    order: VecDeque<(QueueName, MemberId)>,
    known: HashSet<(QueueName, MemberId)>,
}

impl ConsumedLedger {
    /// Records that `member`'s order in `queue` was consumed.
    pub fn record(&self, queue: &QueueName, member: &MemberId) {
        let mut ledger = self.inner.lock();
        let key = (queue.clone(), member.clone());
        if !ledger.known.insert(key.clone()) {
            return;
        }
        ledger.order.push_back(key);
        while ledger.order.len() > MAX_REMEMBERED_CONSUMES {
            if let Some(oldest) = ledger.order.pop_front() {
                ledger.known.remove(&oldest);
            }
        }
    }

    /// Whether this instance saw `member`'s order in `queue` consumed (and still remembers it).
    #[must_use]
    pub fn contains(&self, queue: &QueueName, member: &MemberId) -> bool {
        let ledger = self.inner.lock();
        ledger.known.contains(&(queue.clone(), member.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_remembers_consumes_up_to_its_bound() {
        let ledger = ConsumedLedger::default();
        let queue = QueueName::parse("sale").unwrap();
        let member = |i: usize| MemberId::parse(&format!("m{i}")).unwrap();
        ledger.record(&queue, &member(0));
        ledger.record(&queue, &member(0));
        assert!(ledger.contains(&queue, &member(0)));
        assert!(!ledger.contains(&QueueName::parse("other").unwrap(), &member(0)));
        for i in 1..=MAX_REMEMBERED_CONSUMES {
            ledger.record(&queue, &member(i));
        }
        assert!(!ledger.contains(&queue, &member(0)), "the oldest is forgotten first");
        assert!(ledger.contains(&queue, &member(MAX_REMEMBERED_CONSUMES)));
    }
}
