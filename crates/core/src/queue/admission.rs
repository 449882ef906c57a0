//! The global admission budget: how many members one admission step may admit (SPEC 2.3, limitation 3).
//!
//! The seed ran `ZPOPMIN 50` on every instance every second, so four instances admitted 200 a second. Here
//! the budget lives *in the store*, next to the queue, and every admission step refills and spends it
//! inside the same atomic operation that pops members. However many schedulers tick, they share one budget.
//!
//! It is a token bucket counted in integer micro-members, so fractional rates (0.5/s) and odd ticks
//! (333 ms) lose nothing to rounding: `elapsed_ms × rate_milli` is exactly micro-members earned. The bucket
//! holds at most one tick's worth (and at least one member), so after a pause or an idle spell a queue
//! admits one tick's batch, never a flood; over any interval `T` at most `rate × T + one tick` are admitted.

use serde::{Deserialize, Serialize};

use super::settings::QueueSettings;

const MICRO: i64 = 1_000_000;

/// The stored budget of one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionBudget {
    /// Unspent admissions, in micro-members.
    pub credit_micro: i64,
    /// Store time of the last refill (ms). Never moves backwards (monotonic guard).
    pub refilled_at_ms: i64,
}

/// What one admission step may do, computed from the budget and the queue's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionPlan {
    /// Members to pop and issue tokens to now.
    pub admit: u64,
}

impl AdmissionBudget {
    /// A new queue's budget: a full tick's worth, so the first tick admits at once.
    #[must_use]
    pub fn new(settings: &QueueSettings, now_ms: i64) -> Self {
        AdmissionBudget {
            credit_micro: Self::capacity_micro(settings),
            refilled_at_ms: now_ms,
        }
    }

    /// The most the bucket holds: one tick's admissions, and at least one member.
    #[must_use]
    pub fn capacity_micro(settings: &QueueSettings) -> i64 {
        let per_tick = (settings.tick_millis as i64).saturating_mul(settings.admit_rate_milli() as i64);
        per_tick.max(MICRO)
    }

    /// Adds what was earned since the last refill. A clock that went backwards earns nothing.
    pub fn refill(&mut self, settings: &QueueSettings, now_ms: i64) {
        if now_ms <= self.refilled_at_ms {
            return;
        }
        let elapsed = now_ms - self.refilled_at_ms;
        let earned = elapsed.saturating_mul(settings.admit_rate_milli() as i64);
        self.credit_micro = self
            .credit_micro
            .saturating_add(earned)
            .min(Self::capacity_micro(settings));
        self.refilled_at_ms = now_ms;
    }

    /// Refills, then decides how many to admit given `waiting` members and `outstanding` tokens.
    /// The caller must [`spend`](Self::spend) what it actually admitted, in the same atomic step.
    pub fn plan(
        &mut self,
        settings: &QueueSettings,
        now_ms: i64,
        waiting: u64,
        outstanding: u64,
    ) -> AdmissionPlan {
        self.refill(settings, now_ms);
        if settings.paused {
            return AdmissionPlan { admit: 0 };
        }
        let affordable = (self.credit_micro / MICRO).max(0) as u64;
        let room = match settings.max_active {
            Some(cap) => cap.saturating_sub(outstanding),
            None => u64::MAX,
        };
        AdmissionPlan {
            admit: affordable.min(room).min(waiting),
        }
    }

    /// Spends `admitted` members' worth of credit.
    pub fn spend(&mut self, admitted: u64) {
        self.credit_micro -= admitted as i64 * MICRO;
        debug_assert!(self.credit_micro >= 0, "spent more than planned");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn settings(rate: f64, tick: u64) -> QueueSettings {
        QueueSettings {
            admit_per_second: rate,
            tick_millis: tick,
            ..QueueSettings::default()
        }
    }

    #[test]
    fn first_tick_admits_one_ticks_worth_then_the_rate() {
        let s = settings(50.0, 1000);
        let mut budget = AdmissionBudget::new(&s, 0);
        let plan = budget.plan(&s, 0, 1000, 0);
        assert_eq!(plan.admit, 50);
        budget.spend(50);
        assert_eq!(
            budget.plan(&s, 0, 1000, 0).admit,
            0,
            "a second scheduler at the same instant gets nothing"
        );
        assert_eq!(budget.plan(&s, 500, 1000, 0).admit, 25);
    }

    #[test]
    fn max_active_and_pause_bound_the_plan() {
        let mut s = settings(50.0, 1000);
        s.max_active = Some(10);
        let mut budget = AdmissionBudget::new(&s, 0);
        assert_eq!(budget.plan(&s, 0, 1000, 7).admit, 3);
        s.paused = true;
        assert_eq!(budget.plan(&s, 0, 1000, 0).admit, 0);
    }

    #[test]
    fn fractional_rates_accumulate_exactly() {
        let s = settings(0.5, 1000);
        let mut budget = AdmissionBudget::new(&s, 0);
        let mut admitted = 0;
        for now in (0..=20_000).step_by(1000) {
            let plan = budget.plan(&s, now, 100, 0);
            budget.spend(plan.admit);
            admitted += plan.admit;
        }
        // One at the start (the bucket holds at least one member), then one every two seconds.
        assert_eq!(admitted, 11);
    }

    proptest! {
        /// However many schedulers call in, at whatever moments, admissions over [0, T] never exceed
        /// rate × T plus one tick's worth.
        #[test]
        fn schedulers_together_never_exceed_the_rate(
            rate in 1u32..200, tick in 50u64..2000, calls in proptest::collection::vec(0i64..60_000, 1..300)
        ) {
            let s = settings(rate as f64, tick);
            let mut budget = AdmissionBudget::new(&s, 0);
            let mut calls = calls; calls.sort();
            let mut admitted = 0u64;
            for now in &calls {
                let plan = budget.plan(&s, *now, u64::MAX, 0);
                budget.spend(plan.admit);
                admitted += plan.admit;
            }
            let horizon = *calls.last().unwrap();
            let bound = ((rate as i64 * horizon * 1000 + AdmissionBudget::capacity_micro(&s)) / MICRO) as u64;
            prop_assert!(admitted <= bound, "admitted {admitted} > bound {bound}");
        }
    }
}
