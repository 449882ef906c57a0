//! Policies: the `popular` and `trending` weights the engine scores with, and a policy switch.
//!
//! A running engine switches a policy in two moves, so reads never wait for the whole build:
//! [`RankingEngine::rebuild_in_steps`] rebuilds every cached span under the new policy off to the side,
//! in short holds of the shared lock, and [`RankingEngine::install`] swaps the result in under one write
//! hold, rebuilding there any span that changed in between (so no batch applied meanwhile is lost).
//! [`RankingEngine::policy_epoch`] moves with every install, so a reader can tell scores of two installs
//! apart even when a rollback returns to an earlier version number.

use hashbrown::HashMap;

use rankgate_core::ranker::{Policy, RankerName};

use super::carry::CarryCache;
use super::scoring::Inputs;
use super::span_cache::{SpanKey, SpanState};
use super::RankingEngine;

/// Spans rebuilt under a new policy of one ranker, off to the side, ready for [`RankingEngine::install`].
#[derive(Debug)]
pub struct RebuiltSpans {
    ranker: RankerName,
    /// The `popular` and `trending` policies the spans were scored under (one of them the new one).
    policies: (Policy, Policy),
    spans: HashMap<SpanKey, SpanState>,
    carry_cache: CarryCache,
    /// [`RankingEngine::listing_epoch`] when the rebuild started.
    listing_epoch: u64,
}

impl RebuiltSpans {
    /// The ranker whose policy was rebuilt.
    pub fn ranker(&self) -> RankerName {
        self.ranker
    }

    /// The policy of [`RebuiltSpans::ranker`] these spans were scored under.
    pub fn policy(&self) -> Policy {
        match self.ranker {
            RankerName::Trending => self.policies.1,
            RankerName::Popular | RankerName::Units | RankerName::Revenue => self.policies.0,
        }
    }
}

impl RankingEngine {
    /// Caps the spans one step of [`RankingEngine::rebuild_in_steps`] builds (tests: 1).
    pub fn set_rebuild_spans_per_step(&mut self, spans: usize) {
        self.rebuild_spans_per_step = spans.max(1);
    }

    /// The active `popular` policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The active policy of a configurable ranker (`popular` or `trending`; `popular`'s for the others).
    pub fn policy_of(&self, ranker: RankerName) -> Policy {
        match ranker {
            RankerName::Trending => self.trending_policy,
            RankerName::Popular | RankerName::Units | RankerName::Revenue => self.policy,
        }
    }

    /// Starts the engine on `policy` for `trending` (before any span is cached: a running engine
    /// changes policies with [`RankingEngine::rebuild_in_steps`] and [`RankingEngine::install`]).
    pub fn set_trending_policy(&mut self, policy: Policy) {
        self.trending_policy = policy;
        self.spans.clear();
        self.spans_by_category.clear();
        self.builds.clear();
        self.generation += 1;
    }

    /// Changes with every [`RankingEngine::install`] (a policy switch, a rollback or a rebuild): scores
    /// read under two different epochs may come from different policies.
    pub fn policy_epoch(&self) -> u64 {
        self.policy_epoch
    }

    /// Rebuilds every cached span under `policy` without touching the served state, in short holds of the
    /// shared lock, a few spans (≤ ~5 ms of work) at a time, so a policy switch never makes reads wait for
    /// the whole build. One long shared hold would: the lock is fair to writers, so once an ingest or the
    /// refresher queues behind the build, every new reader queues behind it too (4.2 s stalls with 30 days
    /// retained). Blocking: call it off the async runtime.
    ///
    /// Batches land between steps; that is safe for the same reason it is between a one-hold build and its
    /// install: [`RankingEngine::install`] (which switches to the result atomically) rebuilds every span
    /// whose metrics moved meanwhile (and any span cached meanwhile) and rechecks every carry chain. Spans
    /// evicted meanwhile are skipped.
    pub fn rebuild_in_steps(
        engine: &parking_lot::RwLock<RankingEngine>,
        ranker: RankerName,
        policy: Policy,
    ) -> RebuiltSpans {
        Self::rebuild_in_steps_observed(engine, ranker, policy, || {})
    }

    /// [`RankingEngine::rebuild_in_steps`], calling `between_steps` with no lock held after each step:
    /// tests use it to apply batches in the middle of a rebuild.
    pub fn rebuild_in_steps_observed(
        engine: &parking_lot::RwLock<RankingEngine>,
        ranker: RankerName,
        policy: Policy,
        mut between_steps: impl FnMut(),
    ) -> RebuiltSpans {
        const STEP: std::time::Duration = std::time::Duration::from_millis(5);
        let (keys, mut policies, listing_epoch) = {
            let engine = engine.read();
            let keys: Vec<SpanKey> = engine.spans.keys().copied().collect();
            (
                keys,
                (engine.policy, engine.trending_policy),
                engine.listing_epoch,
            )
        };
        match ranker {
            RankerName::Trending => policies.1 = policy,
            RankerName::Popular | RankerName::Units | RankerName::Revenue => policies.0 = policy,
        }
        let mut carry_cache = CarryCache::new();
        let mut spans = HashMap::with_capacity(keys.len());
        let mut keys = keys.into_iter().peekable();
        while keys.peek().is_some() {
            {
                let engine = engine.read();
                let inputs = Inputs {
                    policy: &policies.0,
                    trending: &policies.1,
                    ..engine.inputs()
                };
                let started = std::time::Instant::now();
                let mut built = 0;
                for key in keys.by_ref() {
                    if let Some(served) = engine.spans.get(&key) {
                        let mut state = inputs.build_span(&mut carry_cache, key);
                        state.applied = served.applied;
                        spans.insert(key, state);
                        built += 1;
                    }
                    if built >= engine.rebuild_spans_per_step || started.elapsed() >= STEP {
                        break;
                    }
                }
            }
            between_steps();
        }
        RebuiltSpans {
            ranker,
            policies,
            spans,
            carry_cache,
            listing_epoch,
        }
    }

    /// Switches to spans built by [`RankingEngine::rebuild_in_steps`]. Spans that changed since the build
    /// started (new batches) are rebuilt here, so nothing applied in between is lost.
    ///
    /// Only the rebuilt ranker's policy changes; spans built under another policy of the other ranker
    /// (installed meanwhile) are rebuilt here too, as are spans whose E moved.
    pub fn install(&mut self, rebuilt: RebuiltSpans) {
        self.generation += 1;
        self.policy_epoch += 1;
        let built_under = rebuilt.policies;
        match rebuilt.ranker {
            RankerName::Trending => self.trending_policy = rebuilt.policies.1,
            RankerName::Popular | RankerName::Units | RankerName::Revenue => self.policy = rebuilt.policies.0,
        }
        let same_policies = built_under == (self.policy, self.trending_policy);
        // The rebuilt carry may predate batches applied during the build; recompute it lazily instead.
        drop(rebuilt.carry_cache);
        let keys: Vec<SpanKey> = self.spans.keys().copied().collect();
        // A listing flag changed during the build: any rebuilt span may rank that product wrongly.
        let mut fresh = if rebuilt.listing_epoch == self.listing_epoch {
            rebuilt.spans
        } else {
            HashMap::new()
        };
        let mut cache = CarryCache::new();
        let mut spans = HashMap::new();
        for key in keys {
            let served = &self.spans[&key];
            let state = match fresh.remove(&key) {
                Some(state)
                    if same_policies
                        && served.applied == state.applied
                        && served.trending_end == state.trending_end =>
                {
                    state
                }
                _ => {
                    let mut state = self.inputs().build_span(&mut cache, key);
                    state.applied = self.generation;
                    state
                }
            };
            spans.insert(key, state);
        }
        self.carry_cache = cache;
        self.spans = spans;
        // Carry chains depend on day totals which may have moved during the build: recheck lazily.
        for state in self.spans.values_mut() {
            state.carry_stale |= state.day_start.is_some();
        }
    }
}
