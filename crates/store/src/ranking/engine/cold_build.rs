//! Cold builds in steps: a span nobody has cached is built in short holds of the write lock, so ingest
//! and other reads go on while it is built ([`RankingEngine::build_span_in_steps`]).
//!
//! A build reads the span's hours a slice at a time, then walks the carry chain a couple of days at a
//! time, then scores every product with no lock held, and installs the sorted sets with whatever was
//! applied meanwhile re-scored. `apply` feeds the hours a build already read ([`SpanBuild`]), so the
//! installed span equals a build in one hold. A build that ingest or eviction keeps undoing finishes in
//! one hold after a bound, rather than never.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

use hashbrown::{HashMap, HashSet};

use rankgate_core::ids::ProductId;
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{Hour, PeriodKey, PeriodKind, Span};
use rankgate_core::ranker::{Decayed, Policy, ScoreInputs};
use rankgate_zset::SortedSet;

use super::interning::ProductIdx;
use super::scoring::insert_scores;
use super::span_cache::{SpanKey, SpanState};
use super::{RankingEngine, RankingQuery, RANKERS};

/// Hourly cells a cold build reads per hold of the engine lock: ingest waits at most this long for one.
pub(super) const BUILD_CELLS_PER_STEP: usize = 32_768;
/// Carry days a cold build computes per hold of the engine lock.
const BUILD_CARRY_DAYS_PER_STEP: usize = 2;

/// A span being built in steps, each under a short hold of the write lock, so ingest runs in between.
///
/// Exactness: hours before `scanned_until` are folded into `metrics`, and [`RankingEngine::apply`] adds
/// every later change of those hours here too; hours from `scanned_until` on are read from the hourly table
/// when the build gets to them, changes included. So each change is counted exactly once.
#[derive(Debug)]
pub(super) struct SpanBuild {
    pub(super) hours: Range<Hour>,
    /// The daily period for daily spans: only these get carry.
    pub(super) day: Option<PeriodKey>,
    pub(super) scanned_until: Hour,
    pub(super) metrics: HashMap<ProductIdx, Metrics>,
    /// `trending`'s end hour E this build decays for; the engine drops the build when E moves.
    pub(super) trending_end: Hour,
    /// Decayed metrics of the hours scanned so far, summed hour by hour in ascending order.
    pub(super) decayed: HashMap<ProductIdx, Decayed>,
    /// Products whose cells in already scanned hours changed (a late event, a new membership): their
    /// running sum is no longer in ascending order, so it is recomputed from their hours before scoring.
    pub(super) decayed_stale: HashSet<ProductIdx>,
    /// Set once the span is being scored off the lock: the scorer holds a clone, so a build whose scorer
    /// went away (strong count 1) can be taken over.
    pub(super) scoring: Option<Arc<()>>,
    /// Carry the scorer used; set with `scoring`.
    pub(super) carry: Arc<HashMap<ProductIdx, f64>>,
    /// The `popular` and `trending` policies the scorer used; set with `scoring`.
    scored_policies: Option<(Policy, Policy)>,
    /// Products whose metrics changed since scoring started: re-scored when the span is installed.
    pub(super) changed: HashSet<ProductIdx>,
    /// The carry the scorer used went stale during scoring.
    pub(super) carry_stale: bool,
}

impl SpanBuild {
    /// Whether the build already read `hour`, so a change to it must be added here, not read later.
    pub(super) fn has_scanned(&self, hour: Hour) -> bool {
        self.hours.start <= hour && hour < self.scanned_until
    }

    /// Once scoring has started off the lock, a change to `product` must be re-scored at install.
    pub(super) fn note_changed(&mut self, product: ProductIdx) {
        if self.scoring.is_some() {
            self.changed.insert(product);
        }
    }
}

/// What a cold build scores off the lock: every product of the span with its score inputs.
struct ScoringInput {
    key: SpanKey,
    entries: Vec<(ProductId, ScoreInputs)>,
    /// The `popular` and `trending` policies.
    policies: (Policy, Policy),
    token: Arc<()>,
}

impl ScoringInput {
    /// The sorted sets, built with no lock held: the costly part of a cold build.
    pub(super) fn score(&self) -> [SortedSet; RANKERS] {
        let mut rankings: [SortedSet; RANKERS] = Default::default();
        for (product, inputs) in &self.entries {
            insert_scores(&mut rankings, product, inputs, &self.policies);
        }
        rankings
    }
}

/// How much of a cold build one step may do under the write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BuildPace {
    /// One slice of hours or a couple of carry days, so ingest waits for no more than that.
    InSteps,
    /// The whole span at once: the fallback for a build that keeps being restarted or undone, which would
    /// otherwise never finish.
    InOneHold,
}

/// Where a cold build stands after one step; see [`RankingEngine::build_span_in_steps`].
enum BuildStep {
    /// The span is cached: answer from it.
    Cached,
    /// More to do: take the lock again.
    Continue,
    /// Another reader is scoring this span: wait for it to install.
    Wait,
    /// Score this off the lock, then install it.
    Score(ScoringInput),
}

/// What a cold build is doing when [`RankingEngine::build_span_in_steps_observed`] calls its observer,
/// always with no lock held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildPhase {
    /// Between two steps that read hours or compute carry.
    Between,
    /// Scoring the span's products off the lock, before installing it.
    Scoring,
}

impl RankingEngine {
    /// Sets how many hourly cells one step of a cold build reads under the lock (at least one hour is read
    /// per step whatever the value). Tests set it to 1, so batches land between every hour of a build.
    pub fn set_build_cells_per_step(&mut self, cells: usize) {
        self.build_cells_per_step = cells;
    }

    /// Builds `query`'s span if it is not cached, in steps that each hold the write lock only briefly, so
    /// ingest ([`RankingEngine::apply`]) and other reads go on while a cold span is built: hours are read a
    /// slice at a time ([`BUILD_CELLS_PER_STEP`] cells), carry a couple of days at a time, and the sorted
    /// sets are built with no lock held, then installed with whatever was applied meanwhile re-scored.
    /// The result equals a build from scratch. Concurrent cold reads of one span share one build.
    ///
    /// Blocking: call it off the async runtime. On return the span is usually cached (a flood of other
    /// builds may have evicted it again; the caller's read then builds it in one hold).
    pub fn build_span_in_steps(engine: &parking_lot::RwLock<RankingEngine>, query: &RankingQuery) {
        Self::build_span_in_steps_observed(engine, query, |_| {});
    }

    /// [`RankingEngine::build_span_in_steps`], calling `observe` between steps, always with no lock
    /// held: tests use it to apply batches in the middle of a build.
    pub fn build_span_in_steps_observed(
        engine: &parking_lot::RwLock<RankingEngine>,
        query: &RankingQuery,
        mut observe: impl FnMut(BuildPhase),
    ) {
        /// Restarts allowed when retention or eviction drops a build midway, before building in one hold.
        const MAX_RESTARTS: usize = 8;
        /// Steps allowed before building in one hold: reading a month of hours takes at most 744 and the
        /// carry chain of a year's retention about 200, so only a build that ingest keeps undoing (late
        /// events invalidating the carry it just computed, batch after batch) gets there; it then finishes
        /// in one hold rather than never.
        const MAX_STEPS: usize = 4_096;
        let Some(key) = engine.read().span_key(query) else {
            return;
        };
        let (mut restarts, mut steps) = (0, 0);
        loop {
            let pace = if restarts >= MAX_RESTARTS || steps > MAX_STEPS {
                BuildPace::InOneHold
            } else {
                BuildPace::InSteps
            };
            let step = engine.write().build_step(key, pace);
            match step {
                BuildStep::Cached => return,
                BuildStep::Continue => {
                    steps += 1;
                    observe(BuildPhase::Between);
                }
                BuildStep::Wait => {
                    observe(BuildPhase::Between);
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                BuildStep::Score(input) => {
                    let rankings = input.score();
                    observe(BuildPhase::Scoring);
                    if !engine.write().install_build(input, rankings) {
                        restarts += 1;
                    }
                }
            }
        }
    }

    /// One step of a cold build, under the write lock; [`BuildPace::InOneHold`] finishes the span at once.
    fn build_step(&mut self, key: SpanKey, pace: BuildPace) -> BuildStep {
        if self.spans.contains_key(&key) {
            self.builds.remove(&key);
            return BuildStep::Cached;
        }
        if pace == BuildPace::InOneHold {
            self.builds.remove(&key);
            self.ensure_span(key);
            return BuildStep::Cached;
        }
        let zone = self.config.zone.clone();
        let now = self.current_hour;
        let build = self.builds.entry(key).or_insert_with(|| {
            let hours = key.span.hours(&zone);
            SpanBuild {
                day: match key.span {
                    Span::Period(period) if period.kind() == PeriodKind::Daily => Some(period),
                    _ => None,
                },
                scanned_until: hours.start,
                hours,
                metrics: HashMap::new(),
                trending_end: key.span.trending_end(&zone, now),
                decayed: HashMap::new(),
                decayed_stale: HashSet::new(),
                scoring: None,
                carry: Arc::default(),
                scored_policies: None,
                changed: HashSet::new(),
                carry_stale: false,
            }
        });
        if let Some(token) = &build.scoring {
            if Arc::strong_count(token) > 1 {
                return BuildStep::Wait;
            }
            // Its scorer went away without installing: score it again from here.
            build.scoring = None;
            build.changed.clear();
        }
        if build.scanned_until < build.hours.end {
            let (from, end, trending_end) = (build.scanned_until, build.hours.end, build.trending_end);
            let mut metrics = std::mem::take(&mut build.metrics);
            let mut decayed = std::mem::take(&mut build.decayed);
            let scanned_until = self.inputs().aggregate_into(
                &mut metrics,
                &mut decayed,
                trending_end,
                key.category,
                from..end,
                self.build_cells_per_step,
            );
            let build = self.builds.get_mut(&key).expect("build registered");
            build.metrics = metrics;
            build.decayed = decayed;
            build.scanned_until = scanned_until;
            return BuildStep::Continue;
        }
        let day = build.day;
        let carry = match day {
            Some(day) => {
                let mut cache = std::mem::take(&mut self.carry_cache);
                let carry =
                    self.inputs()
                        .carry_for_within(&mut cache, key.category, day, BUILD_CARRY_DAYS_PER_STEP);
                self.carry_cache = cache;
                match carry {
                    Some(carry) => carry,
                    None => return BuildStep::Continue,
                }
            }
            None => Arc::default(),
        };
        let token = Arc::new(());
        let mut build = self.builds.remove(&key).expect("build registered");
        // Products changed in hours already scanned: their sums start again from all their hours, in
        // ascending order. As many as ingest touched during the build, like the re-scores at install.
        let inputs = self.inputs();
        for product in std::mem::take(&mut build.decayed_stale) {
            let decayed = inputs.decayed_of(product, build.hours.clone(), build.trending_end);
            build.decayed.insert(product, decayed);
        }
        build.scoring = Some(token.clone());
        build.carry = carry.clone();
        build.scored_policies = Some((self.policy, self.trending_policy));
        build.changed.clear();
        build.carry_stale = false;
        let products: HashSet<ProductIdx> = build
            .metrics
            .keys()
            .chain(build.decayed.keys())
            .chain(carry.keys())
            .copied()
            .collect();
        // Delisted products keep their metrics in the span but are scored into no ranking; a flag
        // changed while scoring runs marks them changed, so the install re-scores them.
        let entries = products
            .into_iter()
            .filter(|p| self.products.is_shown(*p))
            .map(|p| {
                let inputs = ScoreInputs {
                    metrics: build.metrics.get(&p).copied().unwrap_or_default(),
                    carry: carry.get(&p).copied().unwrap_or(0.0),
                    decayed: build.decayed.get(&p).copied().unwrap_or_default(),
                };
                (self.products.ids[p as usize].clone(), inputs)
            })
            .collect();
        self.builds.insert(key, build);
        BuildStep::Score(ScoringInput {
            key,
            entries,
            policies: (self.policy, self.trending_policy),
            token,
        })
    }

    /// Installs a span scored off the lock, re-scoring what changed meanwhile. `false` when the build was
    /// dropped in between (retention, or a rebuild), so the caller starts over.
    fn install_build(&mut self, input: ScoringInput, rankings: [SortedSet; RANKERS]) -> bool {
        let key = input.key;
        if self.spans.contains_key(&key) {
            self.builds.remove(&key);
            return true;
        }
        let still_ours = self
            .builds
            .get(&key)
            .and_then(|build| build.scoring.as_ref())
            .is_some_and(|token| Arc::ptr_eq(token, &input.token));
        if !still_ours {
            return false;
        }
        let build = self.builds.remove(&key).expect("build checked");
        let mut dirty = build.changed;
        let policy_switched = build.scored_policies != Some((self.policy, self.trending_policy));
        if policy_switched {
            // Scored under a policy that has since been switched: re-score everyone.
            dirty.extend(
                build
                    .metrics
                    .keys()
                    .chain(build.decayed.keys())
                    .chain(build.carry.keys())
                    .copied(),
            );
        }
        let state = SpanState {
            day_start: build.day.map(|d| d.hours(&self.config.zone).start),
            hours: build.hours,
            metrics: build.metrics,
            carry: build.carry,
            trending_end: build.trending_end,
            applied: self.generation,
            rankings,
            dirty,
            carry_stale: build.day.is_some() && (build.carry_stale || policy_switched),
            last_used: Arc::new(AtomicU64::new(0)),
            change_log: None,
        };
        self.spans.insert(key, state);
        self.spans_by_category
            .entry(key.category)
            .or_default()
            .push(key.span);
        self.spans[&key].last_used.store(
            self.lru_clock.fetch_add(1, AtomicOrdering::Relaxed),
            AtomicOrdering::Relaxed,
        );
        self.evict_least_recently_used(key);
        true
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use parking_lot::RwLock;
    use rankgate_core::ids::CategoryOrAll;
    use rankgate_core::ranker::{PopularWeights, RankerName};

    use super::super::test_support::{
        apply_events, apply_in_batches, assert_all_match_model, cached_by_ids, day, engine, hour, model_of,
        product, queries_over, query, workload, workload_spans,
    };
    use super::*;

    /// The (category, span) pairs of the workload's queries, once each.
    fn spans_to_build() -> Vec<RankingQuery> {
        let mut seen = BTreeSet::new();
        queries_over(&workload_spans())
            .into_iter()
            .filter(|q| seen.insert(format!("{} {:?}", q.category, q.span)))
            .collect()
    }

    #[test]
    fn a_build_in_steps_equals_a_build_in_one_hold() {
        let events = workload(41, 900, 72);
        let (mut stepwise, mut one_hold) = (engine(), engine());
        for engine in [&mut stepwise, &mut one_hold] {
            apply_in_batches(engine, &events, 100);
            engine.advance_to_hour(hour(50));
        }
        stepwise.set_build_cells_per_step(1);
        let stepwise = RwLock::new(stepwise);
        let mut steps = 0;
        for q in spans_to_build() {
            RankingEngine::build_span_in_steps_observed(&stepwise, &q, |phase| {
                if phase == BuildPhase::Between {
                    steps += 1;
                }
            });
            one_hold.top(&q, 0, 1);
            let stepwise = stepwise.read();
            assert_eq!(
                cached_by_ids(&stepwise, &q.category, q.span),
                cached_by_ids(&one_hold, &q.category, q.span),
                "{} {:?}",
                q.category,
                q.span
            );
            assert!(stepwise.builds.is_empty());
        }
        assert!(steps > 200, "one hour per step: {steps} steps");
    }

    #[test]
    fn a_build_in_steps_with_batches_landing_between_steps_equals_a_build_in_one_hold_of_everything() {
        let events = workload(42, 1_000, 72);
        let (before, during) = events.split_at(300);
        let batches: Vec<&[rankgate_core::event::Event]> = during.chunks(20).collect();
        let delisted = product("p2");
        let stepwise = RwLock::new(engine());
        {
            let mut engine = stepwise.write();
            apply_events(&mut engine, before);
            engine.advance_to_hour(hour(50));
            engine.set_build_cells_per_step(1);
        }
        // Every step lets one batch land (late events, new memberships and all), and one a listing flip.
        let mut landed = 0;
        let mut land_next = |_: BuildPhase| {
            let mut engine = stepwise.write();
            if landed == 7 {
                engine.set_listed(&[(delisted.clone(), false)]);
            }
            if let Some(batch) = batches.get(landed) {
                apply_events(&mut engine, batch);
            }
            landed += 1;
        };
        for q in spans_to_build() {
            RankingEngine::build_span_in_steps_observed(&stepwise, &q, &mut land_next);
        }
        assert!(
            landed > batches.len(),
            "every batch landed during a build ({landed} steps)"
        );

        let mut one_hold = engine();
        apply_events(&mut one_hold, &events);
        one_hold.set_listed(&[(delisted.clone(), false)]);
        one_hold.advance_to_hour(hour(50));
        let mut stepwise = stepwise.into_inner();
        stepwise.flush_all();
        for q in spans_to_build() {
            one_hold.top(&q, 0, 1);
            assert_eq!(
                cached_by_ids(&stepwise, &q.category, q.span),
                cached_by_ids(&one_hold, &q.category, q.span),
                "{} {:?}",
                q.category,
                q.span
            );
        }
        let model = model_of(&events, PopularWeights::default())
            .at_hour(hour(50))
            .with_delisted([delisted]);
        assert!(assert_all_match_model(&mut stepwise, &model, &queries_over(&workload_spans())) > 1_000);
    }

    #[test]
    fn a_step_at_the_in_one_hold_pace_finishes_the_span() {
        let events = workload(43, 400, 24);
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 100);
        engine.set_build_cells_per_step(1);
        let q = query(RankerName::Popular, CategoryOrAll::All, day(0));
        let key = engine.span_key(&q).unwrap();

        assert!(matches!(
            engine.build_step(key, BuildPace::InSteps),
            BuildStep::Continue
        ));
        assert!(!engine.is_span_cached(&q.category, q.span));
        assert_eq!(engine.builds[&key].scanned_until, hour(1), "one hour read");

        assert!(matches!(
            engine.build_step(key, BuildPace::InOneHold),
            BuildStep::Cached
        ));
        assert!(engine.is_span_cached(&q.category, q.span));
        assert!(engine.builds.is_empty(), "the partial build is superseded");
        let mut fresh = super::super::test_support::engine();
        apply_in_batches(&mut fresh, &events, 100);
        fresh.top(&q, 0, 1);
        assert_eq!(
            cached_by_ids(&engine, &q.category, q.span),
            cached_by_ids(&fresh, &q.category, q.span)
        );
    }

    #[test]
    fn a_build_dropped_while_it_is_scored_starts_over_and_still_equals_a_build_in_one_hold() {
        let events = workload(44, 600, 72);
        let stepwise = RwLock::new(engine());
        apply_in_batches(&mut stepwise.write(), &events, 100);
        stepwise.write().set_build_cells_per_step(8);
        let q = query(RankerName::Trending, CategoryOrAll::All, day(1));
        let mut scorings = 0;
        RankingEngine::build_span_in_steps_observed(&stepwise, &q, |phase| {
            if phase == BuildPhase::Scoring {
                scorings += 1;
                if scorings == 1 {
                    // What retention or a policy rebuild does to a build in progress.
                    stepwise.write().evict_cached_spans();
                }
            }
        });
        assert_eq!(
            scorings, 2,
            "the first scoring was dropped, the build started over"
        );
        let mut one_hold = engine();
        apply_in_batches(&mut one_hold, &events, 100);
        one_hold.top(&q, 0, 1);
        assert_eq!(
            cached_by_ids(&stepwise.read(), &q.category, q.span),
            cached_by_ids(&one_hold, &q.category, q.span)
        );
    }

    #[test]
    fn a_batch_that_lands_while_the_span_is_scored_is_rescored_at_install() {
        let events = workload(45, 500, 48);
        let (before, during) = events.split_at(450);
        let stepwise = RwLock::new(engine());
        apply_events(&mut stepwise.write(), before);
        let q = query(RankerName::Popular, CategoryOrAll::All, day(1));
        let mut scorings = 0;
        RankingEngine::build_span_in_steps_observed(&stepwise, &q, |phase| {
            if phase == BuildPhase::Scoring {
                scorings += 1;
                apply_events(&mut stepwise.write(), during);
            }
        });
        assert_eq!(scorings, 1);
        let mut stepwise = stepwise.into_inner();
        stepwise.flush_all();
        let mut one_hold = engine();
        apply_events(&mut one_hold, &events);
        one_hold.top(&q, 0, 1);
        assert_eq!(
            cached_by_ids(&stepwise, &q.category, q.span),
            cached_by_ids(&one_hold, &q.category, q.span)
        );
    }
}
