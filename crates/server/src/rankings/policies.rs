//! Ranker policy versions (SPEC 1.3) as fleet state, and the policy driver that keeps this instance's
//! engine on them.
//!
//! Policy versions are fleet state, per configurable ranker (`popular`, `trending`:
//! [`RankerName::CONFIGURABLE`]). The rules are [`PolicyState`]'s (core); every transition is one
//! transaction in the source of truth ([`SourceOfTruth::transition_policies`], which PostgreSQL runs on
//! the locked row, so concurrent PUTs through several instances apply in one order), and the stored
//! state reaches every instance through the change feed ([`RankingService::observe_policies`]). One
//! policy driver per instance ([`RankingService::run_policy_driver`]) keeps the engine on that state:
//! every instance builds a version being built and tries to complete it (the first finisher switches
//! the shared state, the others find it active), and builds the active version when its engine serves
//! another (a rollback, or a switch it missed). Builds run off to the side; installs are atomic.
//!
//! [`SourceOfTruth::transition_policies`]: rankgate_store::ranking::source::SourceOfTruth::transition_policies

use std::sync::Arc;

use parking_lot::Mutex;

use rankgate_core::policy::{Observed, PolicyError, PolicyState};
use rankgate_core::ranker::{Policy, PopularWeights, RankerName};
use rankgate_store::ranking::engine::{RankingEngine, RebuiltSpans};
use rankgate_store::ranking::source::SourceError;

use super::service::configurable_index;
use super::RankingService;

/// Why a policy change through this instance did not happen.
#[derive(Debug, thiserror::Error)]
pub enum PolicyChangeError {
    /// The version rules refuse it in the shared state (409): no previous version, superseded, ...
    #[error(transparent)]
    Refused(PolicyError),
    /// The source of truth or the writer failed (500); nothing changed, or the change is retried.
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

impl RankingService {
    /// The shared state of `ranker`, one of [`RankerName::CONFIGURABLE`].
    fn policy_cell(&self, ranker: RankerName) -> &Mutex<PolicyState> {
        &self.policies[configurable_index(ranker)]
    }

    /// A configurable ranker's policy state shared by every instance (as this instance last saw it).
    pub fn policy_state(&self, ranker: RankerName) -> PolicyState {
        *self.policy_cell(ranker).lock()
    }

    /// Creates a new policy version of `ranker` (`popular` or `trending`) with `weights` in the shared
    /// state (building) and returns it at once. The policy driver of every instance builds it off to the
    /// side; the first to finish switches the shared state, and each installs its own build atomically
    /// (see [`RankingService::run_policy_driver`]).
    pub async fn change_weights(
        self: &Arc<Self>,
        ranker: RankerName,
        weights: PopularWeights,
    ) -> Result<u32, PolicyChangeError> {
        let state = self
            .transition(ranker, move |state| state.create(weights).map(|_| ()), None)
            .await?;
        self.policy_changed.notify_one();
        // The transaction that stored `state` created its latest version.
        Ok(state.latest_version)
    }

    /// Switches back to the previous version: builds it off to the side, then rolls the shared state
    /// back (refused if another instance changed the previous version meanwhile: then retried on the
    /// new state, a few times) and installs the build in the same writer turn. Returns the version now
    /// active. Other instances follow through the change feed.
    pub async fn rollback(self: &Arc<Self>, ranker: RankerName) -> Result<Policy, PolicyChangeError> {
        let service = Arc::clone(self);
        // A task of its own: a caller dropped mid-rollback (an HTTP client hanging up) cannot leave the
        // shared state saying one version while this engine serves another.
        tokio::spawn(async move {
            let _switching = service.switch_lock.lock().await;
            let mut attempts = 0;
            loop {
                attempts += 1;
                let previous = service
                    .policy_cell(ranker)
                    .lock()
                    .previous
                    .ok_or(PolicyChangeError::Refused(PolicyError::NoPrevious))?;
                let rebuilt = service.build(ranker, previous).await?;
                match service
                    .transition(
                        ranker,
                        move |state| state.rollback_to(previous.version).map(|_| ()),
                        Some(rebuilt),
                    )
                    .await
                {
                    Ok(_) => return Ok(previous),
                    Err(PolicyChangeError::Refused(PolicyError::PreviousChanged { .. })) if attempts < 3 => {}
                    Err(error) => return Err(error),
                }
            }
        })
        .await
        .map_err(|e| PolicyChangeError::Failed(e.into()))?
    }

    /// Rebuilds every cached ranking from the source of truth under the active policy, then installs it
    /// (unless another version became active meanwhile; the policy driver then follows that one).
    pub async fn rebuild(self: &Arc<Self>) -> anyhow::Result<u32> {
        let service = Arc::clone(self);
        tokio::spawn(async move {
            let _switching = service.switch_lock.lock().await;
            let active = service.policy_state(RankerName::Popular).active;
            let rebuilt = service.build(RankerName::Popular, active).await?;
            service.install_if_active_blocking(rebuilt).await?;
            Ok(active.version)
        })
        .await?
    }

    /// Adopts policy states read from the shared source of truth (the follower loop, every tick): a newer
    /// one wakes the policy driver, which builds and installs what it names.
    pub fn observe_policies(&self, stored: &[(RankerName, PolicyState)]) {
        for (ranker, state) in stored {
            if !ranker.is_configurable() {
                continue;
            }
            match self.policy_cell(*ranker).lock().observe(state) {
                Ok(Observed::Newer) => self.policy_changed.notify_one(),
                Ok(Observed::Unchanged) => {}
                // A transition committed here is newer than what this read saw.
                Err(PolicyError::Stale { .. }) => {}
                Err(error) => tracing::warn!(%error, %ranker, "ignoring a stored policy state"),
            }
        }
    }

    /// Keeps this instance's engine on the shared policy state until `shutdown`: builds the version
    /// being built (whoever created it) and completes it, or builds the active version when the engine
    /// serves another one (a switch or rollback made through another instance), each off to the side,
    /// installed atomically. Woken by local transitions and by the follower; failures are retried.
    pub async fn run_policy_driver(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        loop {
            match self.converge_once().await {
                Ok(true) => continue,
                Ok(false) => {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = self.policy_changed.notified() => {}
                    }
                }
                Err(error) => {
                    tracing::warn!(
                        error = format!("{error:#}"),
                        "following the shared policies failed; will retry"
                    );
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                    }
                }
            }
        }
    }

    /// One step towards the shared policy state. Returns whether it did anything (then the state may
    /// have moved again: call it again).
    async fn converge_once(self: &Arc<Self>) -> anyhow::Result<bool> {
        for ranker in RankerName::CONFIGURABLE {
            if self.converge_ranker_once(ranker).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// [`RankingService::converge_once`] for one ranker.
    async fn converge_ranker_once(self: &Arc<Self>, ranker: RankerName) -> anyhow::Result<bool> {
        let _switching = self.switch_lock.lock().await;
        let shared = self.policy_state(ranker);
        if let Some(building) = shared.building {
            // Every instance builds the version being built and tries to complete it: the first to
            // finish switches the shared state (so a builder killed mid-build delays nobody), the
            // others find it active and install their own build at once.
            let rebuilt = self.build(ranker, building).await?;
            return match self
                .transition(
                    ranker,
                    move |state| state.complete_build(building.version).map(|_| ()),
                    Some(rebuilt),
                )
                .await
            {
                Ok(_) => Ok(true),
                Err(PolicyChangeError::Refused(error)) => {
                    tracing::info!(%error, "discarding a policy build");
                    Ok(true)
                }
                Err(PolicyChangeError::Failed(error)) => Err(error),
            };
        }
        if self.engine.read().policy_of(ranker) != shared.active {
            let rebuilt = self.build(ranker, shared.active).await?;
            self.install_if_active_blocking(rebuilt).await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Builds every cached span under `policy` on the blocking pool, in short holds of the engine's shared
    /// lock ([`RankingEngine::rebuild_in_steps`]): reads and ingest go on, served from the installed
    /// version, until the install.
    async fn build(&self, ranker: RankerName, policy: Policy) -> anyhow::Result<RebuiltSpans> {
        let engine = self.engine.clone();
        let started = std::time::Instant::now();
        let rebuilt =
            tokio::task::spawn_blocking(move || RankingEngine::rebuild_in_steps(&engine, ranker, policy))
                .await?;
        let elapsed = started.elapsed();
        metrics::histogram!("rankgate_policy_build_seconds").record(elapsed.as_secs_f64());
        tracing::info!(
            %ranker,
            version = policy.version,
            elapsed_ms = elapsed.as_millis() as u64,
            "built policy version"
        );
        Ok(rebuilt)
    }

    /// Installs `rebuilt` if its policy is the shared active one; else drops it (the driver follows).
    fn install_if_active(&self, rebuilt: RebuiltSpans) {
        let ranker = rebuilt.ranker();
        let shared = self.policy_cell(ranker).lock();
        if shared.active == rebuilt.policy() {
            self.engine.write().install(rebuilt);
            tracing::info!(%ranker, version = shared.active.version, "now served from policy version");
        }
    }

    /// [`RankingService::install_if_active`] on the blocking pool (an install re-scores the spans that
    /// changed during the build, under the write lock).
    async fn install_if_active_blocking(self: &Arc<Self>, rebuilt: RebuiltSpans) -> anyhow::Result<()> {
        let service = Arc::clone(self);
        tokio::task::spawn_blocking(move || service.install_if_active(rebuilt)).await?;
        Ok(())
    }

    /// Runs `step` as one transition of `ranker`'s shared state (one transaction, on the writer
    /// thread), adopts the state it stored and, in the same writer turn, installs `rebuilt` when that
    /// state makes its policy active. A refused step adopts the stored state instead, so the next
    /// decision is made on it.
    async fn transition(
        self: &Arc<Self>,
        ranker: RankerName,
        mut step: impl FnMut(&mut PolicyState) -> Result<(), PolicyError> + Send + 'static,
        rebuilt: Option<RebuiltSpans>,
    ) -> Result<PolicyState, PolicyChangeError> {
        let service = Arc::clone(self);
        self.writer
            .run(move |ingestor| {
                let source = ingestor.source_mut();
                match source.transition_policies(ranker, &mut step) {
                    Ok(state) => {
                        service.adopt(ranker, &state);
                        if let Some(rebuilt) = rebuilt {
                            service.install_if_active(rebuilt);
                        }
                        Ok(state)
                    }
                    Err(SourceError::Policy(refused)) => {
                        if let Ok(Some(state)) = source.load_policies(ranker) {
                            service.adopt(ranker, &state);
                        }
                        Err(PolicyChangeError::Refused(refused))
                    }
                    Err(error) => Err(PolicyChangeError::Failed(
                        anyhow::Error::new(error).context(format!("storing the {ranker} policy transition")),
                    )),
                }
            })
            .await?
    }

    /// Adopts a state this instance read or stored, unless it has seen a newer one.
    fn adopt(&self, ranker: RankerName, state: &PolicyState) {
        match self.policy_cell(ranker).lock().observe(state) {
            Ok(_) | Err(PolicyError::Stale { .. }) => {}
            Err(error) => tracing::warn!(%error, %ranker, "ignoring a stored policy state"),
        }
    }
}
