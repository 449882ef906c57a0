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

#[cfg(test)]
mod tests {
    use parking_lot::RwLock;
    use rankgate_core::ranker::PopularWeights;

    use super::super::test_support::{
        apply_events, apply_in_batches, assert_all_match_model, engine, engine_with, hour, model_of, product,
        queries_over, workload, workload_spans,
    };
    use super::*;

    fn new_popular() -> Policy {
        Policy {
            version: 2,
            weights: PopularWeights {
                view: 0.3,
                like: 0.05,
                sales: 1.1,
                carry_ratio: 0.2,
                carry_top_n: 5,
                ..PopularWeights::default()
            },
        }
    }

    fn new_trending() -> Policy {
        Policy {
            version: 2,
            weights: PopularWeights {
                view: 0.5,
                like: 0.1,
                sales: 0.9,
                half_life_hours: 6.0,
                ..PopularWeights::trending_default()
            },
        }
    }

    /// An engine of `events` with every workload query's span cached, its clock at hour 50.
    fn served(events: &[rankgate_core::event::Event]) -> RankingEngine {
        let mut engine = engine();
        apply_in_batches(&mut engine, events, 100);
        engine.advance_to_hour(hour(50));
        for q in queries_over(&workload_spans()) {
            engine.top(&q, 0, 1);
        }
        engine
    }

    /// Asserts `engine` serves every workload query exactly as `fresh` does.
    fn assert_serves_like(engine: &mut RankingEngine, fresh: &mut RankingEngine) {
        for q in queries_over(&workload_spans()) {
            assert_eq!(engine.full_ranking(&q), fresh.full_ranking(&q), "{q:?}");
        }
    }

    #[test]
    fn a_new_popular_policy_rebuilt_and_installed_equals_a_fresh_engine_with_it() {
        let events = workload(61, 900, 72);
        let engine = RwLock::new(served(&events));
        let rebuilt = RankingEngine::rebuild_in_steps(&engine, RankerName::Popular, new_popular());
        assert_eq!(
            (rebuilt.ranker(), rebuilt.policy()),
            (RankerName::Popular, new_popular())
        );
        let mut engine = engine.into_inner();
        assert_eq!(
            engine.policy_version(RankerName::Popular),
            1,
            "nothing served changes before install"
        );
        let epoch = engine.policy_epoch();

        engine.install(rebuilt);

        assert_eq!(engine.policy_epoch(), epoch + 1);
        assert_eq!(engine.policy(), new_popular());
        assert_eq!(engine.policy_of(RankerName::Popular), new_popular());
        assert_eq!(
            engine.policy_of(RankerName::Trending),
            Policy::initial_for(RankerName::Trending)
        );
        assert_eq!(engine.policy_version(RankerName::Popular), 2);
        let mut fresh = engine_with(new_popular(), 1_000_000);
        apply_events(&mut fresh, &events);
        fresh.advance_to_hour(hour(50));
        assert_serves_like(&mut engine, &mut fresh);
        let model = model_of(&events, new_popular().weights).at_hour(hour(50));
        assert!(assert_all_match_model(&mut engine, &model, &queries_over(&workload_spans())) > 1_000);
    }

    #[test]
    fn a_new_trending_policy_rebuilt_and_installed_equals_a_fresh_engine_with_it() {
        let events = workload(62, 900, 72);
        let engine = RwLock::new(served(&events));
        let rebuilt = RankingEngine::rebuild_in_steps(&engine, RankerName::Trending, new_trending());
        assert_eq!(rebuilt.policy(), new_trending());
        let mut engine = engine.into_inner();
        engine.install(rebuilt);

        assert_eq!(engine.policy_of(RankerName::Trending), new_trending());
        assert_eq!(engine.policy(), Policy::default(), "popular's policy stays");
        assert_eq!(engine.policy_version(RankerName::Trending), 2);
        let mut fresh = super::super::test_support::engine();
        fresh.set_trending_policy(new_trending());
        apply_events(&mut fresh, &events);
        fresh.advance_to_hour(hour(50));
        assert_serves_like(&mut engine, &mut fresh);
        let model = model_of(&events, PopularWeights::default())
            .with_trending(new_trending().weights)
            .at_hour(hour(50));
        assert!(assert_all_match_model(&mut engine, &model, &queries_over(&workload_spans())) > 1_000);
    }

    /// Rebuilds `popular` under [`new_popular`], one span per step, calling `between` after each step
    /// with the engine's write lock; returns the engine with the rebuild installed.
    fn rebuild_one_span_per_step(
        engine: RankingEngine,
        mut between: impl FnMut(&mut RankingEngine, usize),
    ) -> RankingEngine {
        let engine = RwLock::new(engine);
        engine.write().set_rebuild_spans_per_step(1);
        let spans = engine.read().cached_span_count();
        let mut steps = 0;
        let rebuilt =
            RankingEngine::rebuild_in_steps_observed(&engine, RankerName::Popular, new_popular(), || {
                between(&mut engine.write(), steps);
                steps += 1;
            });
        assert_eq!(steps, spans, "one step per span");
        let mut engine = engine.into_inner();
        engine.install(rebuilt);
        engine
    }

    fn fresh_under_new_popular(events: &[rankgate_core::event::Event]) -> RankingEngine {
        let mut fresh = engine_with(new_popular(), 1_000_000);
        apply_events(&mut fresh, events);
        fresh.advance_to_hour(hour(50));
        fresh
    }

    #[test]
    fn batches_that_land_during_a_rebuild_are_kept_at_install() {
        let events = workload(63, 1_000, 72);
        let (before, during) = events.split_at(400);
        let batches: Vec<_> = during.chunks(30).collect();
        let served = served(before);
        assert!(
            served.cached_span_count() > batches.len(),
            "every batch lands during the rebuild"
        );
        let mut engine = rebuild_one_span_per_step(served, |engine, step| {
            if let Some(batch) = batches.get(step) {
                apply_events(engine, batch);
            }
        });
        assert_serves_like(&mut engine, &mut fresh_under_new_popular(&events));
    }

    #[test]
    fn a_listing_flip_during_a_rebuild_is_honoured_at_install() {
        let events = workload(64, 800, 72);
        let mut engine = rebuild_one_span_per_step(served(&events), |engine, step| {
            if step == 3 {
                engine.set_listed(&[(product("p4"), false)]);
            }
        });
        assert!(engine.is_delisted(&product("p4")));
        let mut fresh = fresh_under_new_popular(&events);
        fresh.set_listed(&[(product("p4"), false)]);
        assert_serves_like(&mut engine, &mut fresh);
    }
}
