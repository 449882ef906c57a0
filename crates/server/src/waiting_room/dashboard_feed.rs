//! What the dashboard (`app::dashboard`, issue 30) samples from the waiting room once a second, without a
//! store call of its own: the waiting count of each active queue as the gauges worker last read it (one
//! stats call per active queue per second, which it makes for `/metrics` anyway), and the admissions,
//! abandonment and refusals the sale report counted on this instance since the last sample.
//!
//! A queue that is not active has nobody waiting (that is what active means), so a queue missing from
//! the gauges round waits 0. When the gauges worker has not finished a round for [`GAUGES_FRESH_FOR`]
//! (the store is down, or the service just started) the waiting counts are unknown, not zero.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rankgate_core::queue::QueueName;

pub use super::sale_report::MovedCounts;
use super::service::WaitingRoom;

/// A gauges round older than this is not used: the worker runs every second, so an older one means it
/// is failing or stuck.
pub const GAUGES_FRESH_FOR: Duration = Duration::from_secs(5);

/// The waiting counts of one finished gauges round.
#[derive(Debug, Clone)]
pub(crate) struct GaugedWaiting {
    /// When the round finished.
    at: Instant,
    /// Each active queue's waiting members.
    waiting: Vec<(QueueName, u64)>,
}

/// One second of the waiting room, as the dashboard samples it.
#[derive(Debug, Clone, Default)]
pub struct QueueSample {
    /// Members waiting per active queue (queues not listed wait 0); `None` when unknown (no fresh
    /// gauges round).
    pub waiting: Option<Vec<(QueueName, u64)>>,
    /// What each queue did on this instance since the last sample (queues not listed did nothing).
    pub moved: HashMap<QueueName, MovedCounts>,
}

impl WaitingRoom {
    /// Keeps the waiting counts of a finished gauges round for the dashboard.
    pub(crate) fn gauges_round_done(&self, waiting: Vec<(QueueName, u64)>) {
        *self.gauged_waiting.lock() = Some(GaugedWaiting {
            at: Instant::now(),
            waiting,
        });
    }

    /// The dashboard's sample: the last fresh gauges round's waiting counts, and the moves since the last
    /// call (taken: each is in exactly one sample).
    pub fn dashboard_sample(&self) -> QueueSample {
        let waiting = self
            .gauged_waiting
            .lock()
            .as_ref()
            .filter(|round| round.at.elapsed() <= GAUGES_FRESH_FOR)
            .map(|round| round.waiting.clone());
        QueueSample {
            waiting,
            moved: self.sale_reports.take_moved(),
        }
    }
}
