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
