//! The version rules of a ranker's policy (SPEC 1.3), as a pure state machine.
//!
//! A [`PolicyState`] is what every instance sharing one source of truth agrees on: the version reads are
//! served from (`active`), the one before the last switch (`previous`, for rollback), the version being
//! built (`building`), the newest version ever created (`latest_version`) and a change sequence (`seq`).
//! The source of truth runs each transition inside one transaction on the stored state (locked), so the
//! database decides the order of concurrent transitions and these rules decide what each one may do:
//!
//! - [`PolicyState::create`]: a PUT. Draws the next version (never reused, strictly increasing) and makes
//!   it the version being built. A version still building is **superseded**: the newest PUT wins.
//! - [`PolicyState::complete_build`]: the build of a version is done; switch to it. Only the version
//!   being built can be switched to; a superseded one is refused ([`PolicyError::Superseded`]). Any
//!   instance may complete a build (each builds its own copy of the rankings), so completing a version
//!   that is already active is an idempotent success ([`Switch::AlreadyActive`]), not an error.
//! - [`PolicyState::rollback_to`]: back to the previous version, which becomes active while the active
//!   one becomes previous, so a second rollback returns to where the first started. The caller names the
//!   version it built, and the rollback is refused when the stored previous version is another one
//!   (another instance switched or rolled back meanwhile).
//! - [`PolicyState::abandon`]: a build that cannot finish; `building` is cleared.
//! - [`PolicyState::require_active`]: the guard of a rebuild or an install: the version must still be
//!   the active one.
//! - [`PolicyState::observe`]: adopts a state read from the shared store, refusing one older than what
//!   this state already reflects (feeds and local commits may arrive out of order).
//!
//! Every transition that changes the state bumps `seq` by one; a refused one changes nothing.

use serde::{Deserialize, Serialize};

use crate::ranker::{Policy, PopularWeights, RankerName};

/// A ranker's policy versions, as stored in the source of truth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PolicyState {
    /// The version reads are served from.
    pub active: Policy,
    /// The version active before the last switch or rollback, kept for rollback.
    pub previous: Option<Policy>,
    /// The version being built, not switched to yet. Always the newest version created, when set.
    pub building: Option<Policy>,
    /// The newest version ever created (versions are never reused).
    pub latest_version: u32,
    /// Bumped by every transition, so a reader can tell a newer state from an older one.
    pub seq: u64,
}

impl Default for PolicyState {
    fn default() -> Self {
        PolicyState::initial()
    }
}

/// What [`PolicyState::complete_build`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    /// The version is now active (it was being built).
    Switched,
    /// The version was already active (another instance completed the same build first): nothing changed.
    AlreadyActive,
}

/// What [`PolicyState::observe`] found in a stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// The same state this one already reflects.
    Unchanged,
    /// A newer state, now adopted.
    Newer,
}

/// A transition the rules refuse. The state is left unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// `complete_build` of a version a newer PUT superseded (or that was abandoned).
    #[error("policy version {version} was superseded by version {latest}; it will not be switched to")]
    Superseded {
        /// The version whose build completed.
        version: u32,
        /// The newest version created.
        latest: u32,
    },
    /// `complete_build` or `abandon` of a version that is not being built and not active.
    #[error("policy version {version} is not being built")]
    NotBuilding {
        /// The version named.
        version: u32,
    },
    /// A rollback with no previous version.
    #[error("no previous version to roll back to")]
    NoPrevious,
    /// A rollback built for a previous version that another transition replaced meanwhile.
    #[error("the previous version is now {previous}, not {expected}; another instance changed the policy meanwhile, retry")]
    PreviousChanged {
        /// The version the caller built.
        expected: u32,
        /// The stored previous version.
        previous: u32,
    },
    /// A rebuild or install of a version that is no longer active.
    #[error("policy version {version} is not active (version {active} is); not installing it")]
    NotActive {
        /// The version named.
        version: u32,
        /// The active version.
        active: u32,
    },
    /// `create` after `u32::MAX` versions.
    #[error("every policy version number has been used")]
    VersionsExhausted,
    /// `observe` of a state older than this one.
    #[error("stored policy state {stored} is older than the state {seen} already seen")]
    Stale {
        /// This state's `seq`.
        seen: u64,
        /// The stored state's `seq`.
        stored: u64,
    },
    /// `observe` of a state with this `seq` but different content, or one that breaks the invariants.
    #[error("stored policy state {seq} is inconsistent: {what}")]
    Inconsistent {
        /// The stored state's `seq`.
        seq: u64,
        /// Which invariant fails.
        what: &'static str,
    },
}

impl PolicyState {
    /// `popular` never configured: version 1 with the default weights, nothing else.
    pub fn initial() -> PolicyState {
        PolicyState::initial_for(RankerName::Popular)
    }

    /// `ranker` never configured: version 1 with its default weights ([`Policy::initial_for`]).
    pub fn initial_for(ranker: RankerName) -> PolicyState {
        let active = Policy::initial_for(ranker);
        PolicyState {
            active,
            previous: None,
            building: None,
            latest_version: active.version,
            seq: 0,
        }
    }

    /// Creates the next version with `weights` and makes it the version being built (superseding any
    /// earlier one still building). Returns it.
    pub fn create(&mut self, weights: PopularWeights) -> Result<Policy, PolicyError> {
        let version = self
            .latest_version
            .checked_add(1)
            .ok_or(PolicyError::VersionsExhausted)?;
        let policy = Policy { version, weights };
        self.building = Some(policy);
        self.latest_version = version;
        self.seq += 1;
        Ok(policy)
    }

    /// The build of `version` completed: switch to it (see the module docs for what is refused).
    pub fn complete_build(&mut self, version: u32) -> Result<Switch, PolicyError> {
        match self.building {
            Some(building) if building.version == version => {
                self.previous = Some(self.active);
                self.active = building;
                self.building = None;
                self.seq += 1;
                Ok(Switch::Switched)
            }
            _ if self.active.version == version => Ok(Switch::AlreadyActive),
            _ if version < self.latest_version => Err(PolicyError::Superseded {
                version,
                latest: self.latest_version,
            }),
            _ => Err(PolicyError::NotBuilding { version }),
        }
    }

    /// Rolls back to the previous version, which must be `expected` (the version the caller built).
    /// Returns the version now active.
    pub fn rollback_to(&mut self, expected: u32) -> Result<Policy, PolicyError> {
        let previous = self.previous.ok_or(PolicyError::NoPrevious)?;
        if previous.version != expected {
            return Err(PolicyError::PreviousChanged {
                expected,
                previous: previous.version,
            });
        }
        self.previous = Some(self.active);
        self.active = previous;
        self.seq += 1;
        Ok(previous)
    }

    /// Gives up the build of `version` (it failed). The version stays used: it is never created again.
    pub fn abandon(&mut self, version: u32) -> Result<(), PolicyError> {
        match self.building {
            Some(building) if building.version == version => {
                self.building = None;
                self.seq += 1;
                Ok(())
            }
            _ => Err(PolicyError::NotBuilding { version }),
        }
    }

    /// Checks that `version` is still the active one (before installing a rebuild of it). Returns it.
    pub fn require_active(&self, version: u32) -> Result<Policy, PolicyError> {
        if self.active.version == version {
            Ok(self.active)
        } else {
            Err(PolicyError::NotActive {
                version,
                active: self.active.version,
            })
        }
    }

    /// Checks the invariants every reachable state keeps.
    pub fn check(&self) -> Result<(), PolicyError> {
        let fail = |what| Err(PolicyError::Inconsistent { seq: self.seq, what });
        if self.active.version == 0 || self.active.version > self.latest_version {
            return fail("the active version must be between 1 and the latest version");
        }
        if let Some(previous) = self.previous {
            if previous.version == 0 || previous.version > self.latest_version {
                return fail("the previous version must be between 1 and the latest version");
            }
        }
        if self.building.is_some_and(|b| b.version != self.latest_version) {
            return fail("the version being built must be the latest version");
        }
        Ok(())
    }

    /// Adopts `stored`, a state read from the shared store, unless it is older than this one.
    pub fn observe(&mut self, stored: &PolicyState) -> Result<Observed, PolicyError> {
        stored.check()?;
        if stored.seq < self.seq {
            return Err(PolicyError::Stale {
                seen: self.seq,
                stored: stored.seq,
            });
        }
        if stored.seq == self.seq {
            return if stored == self {
                Ok(Observed::Unchanged)
            } else {
                Err(PolicyError::Inconsistent {
                    seq: stored.seq,
                    what: "another state was seen with the same sequence number",
                })
            };
        }
        if stored.latest_version < self.latest_version {
            return Err(PolicyError::Inconsistent {
                seq: stored.seq,
                what: "the latest version went back",
            });
        }
        *self = *stored;
        Ok(Observed::Newer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn weights(view: f64) -> PopularWeights {
        PopularWeights {
            view,
            ..PopularWeights::default()
        }
    }

    #[test]
    fn a_put_builds_then_switches_and_a_rollback_returns() {
        let mut state = PolicyState::initial();
        let v2 = state.create(weights(2.0)).unwrap();
        assert_eq!(
            (v2.version, state.building, state.active.version),
            (2, Some(v2), 1)
        );
        assert_eq!(state.complete_build(2), Ok(Switch::Switched));
        assert_eq!(
            (state.active, state.previous.map(|p| p.version), state.building),
            (v2, Some(1), None)
        );
        assert_eq!(
            state.complete_build(2),
            Ok(Switch::AlreadyActive),
            "a second builder"
        );
        assert_eq!(state.rollback_to(1).unwrap().version, 1);
        assert_eq!(state.previous, Some(v2));
        assert_eq!(state.rollback_to(2).unwrap(), v2, "rollback of a rollback");
    }

    #[test]
    fn the_newest_put_wins_over_a_concurrent_one() {
        let mut state = PolicyState::initial();
        let first = state.create(weights(2.0)).unwrap();
        let second = state.create(weights(3.0)).unwrap();
        assert_eq!(
            state.complete_build(first.version),
            Err(PolicyError::Superseded {
                version: 2,
                latest: 3
            })
        );
        assert_eq!(state.complete_build(second.version), Ok(Switch::Switched));
        assert_eq!(
            state.previous.map(|p| p.version),
            Some(1),
            "the superseded version was never active"
        );
    }

    #[test]
    fn observing_refuses_older_states() {
        let mut seen = PolicyState::initial();
        let old = seen;
        seen.create(weights(2.0)).unwrap();
        let newer = seen;
        let mut follower = old;
        assert_eq!(follower.observe(&newer), Ok(Observed::Newer));
        assert_eq!(follower, newer);
        assert_eq!(follower.observe(&newer), Ok(Observed::Unchanged));
        assert_eq!(
            follower.observe(&old),
            Err(PolicyError::Stale { seen: 1, stored: 0 })
        );
    }

    /// One operation of a random sequence.
    #[derive(Debug, Clone)]
    enum Op {
        Create(u8),
        Complete(u32),
        CompleteBuilding,
        Rollback,
        RollbackTo(u32),
        Abandon(u32),
        AbandonBuilding,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..10).prop_map(Op::Create),
            (0u32..12).prop_map(Op::Complete),
            Just(Op::CompleteBuilding),
            Just(Op::Rollback),
            (0u32..12).prop_map(Op::RollbackTo),
            (0u32..12).prop_map(Op::Abandon),
            Just(Op::AbandonBuilding),
        ]
    }

    proptest! {
        #[test]
        fn random_sequences_keep_the_rules(ops in proptest::collection::vec(op(), 0..60)) {
            let mut state = PolicyState::initial();
            let mut created = vec![state.active];
            // Versions superseded or abandoned: never switched to afterwards.
            let mut dead: Vec<u32> = Vec::new();
            for op in ops {
                let before = state;
                let result: Result<(), PolicyError> = match op {
                    Op::Create(view) => match state.create(weights(f64::from(view))) {
                        Ok(policy) => {
                            prop_assert!(created.iter().all(|c| c.version < policy.version), "strictly increasing");
                            if let Some(superseded) = before.building {
                                dead.push(superseded.version);
                            }
                            created.push(policy);
                            Ok(())
                        }
                        Err(error) => Err(error),
                    },
                    Op::Complete(version) => match state.complete_build(version) {
                        Ok(switch) => {
                            prop_assert!(!dead.contains(&version) || switch == Switch::AlreadyActive, "a superseded or abandoned build is never switched to");
                            if switch == Switch::Switched {
                                prop_assert_eq!(state.previous, Some(before.active), "previous is the active before the switch");
                                prop_assert_eq!(Some(state.active), before.building);
                            }
                            Ok(())
                        }
                        Err(error) => Err(error),
                    },
                    Op::CompleteBuilding => {
                        if let Some(building) = before.building {
                            prop_assert_eq!(state.complete_build(building.version), Ok(Switch::Switched));
                        }
                        Ok(())
                    }
                    Op::Rollback => match before.previous {
                        Some(previous) => {
                            prop_assert_eq!(state.rollback_to(previous.version), Ok(previous));
                            // And back again: where it started.
                            let mut twice = state;
                            prop_assert_eq!(twice.rollback_to(before.active.version), Ok(before.active));
                            prop_assert_eq!((twice.active, twice.previous), (before.active, before.previous));
                            Ok(())
                        }
                        None => state.rollback_to(1).map(|_| ()),
                    },
                    Op::RollbackTo(version) => state.rollback_to(version).map(|_| ()),
                    Op::Abandon(version) => state.abandon(version).map(|()| dead.push(version)),
                    Op::AbandonBuilding => match before.building {
                        Some(building) => state.abandon(building.version).map(|()| dead.push(building.version)),
                        None => Ok(()),
                    },
                };
                match result {
                    Err(_) => prop_assert_eq!(state, before, "a refused transition changes nothing"),
                    Ok(()) if state != before => prop_assert_eq!(state.seq, before.seq + 1, "one step per change"),
                    Ok(()) => {}
                }
                prop_assert_eq!(state.check(), Ok(()));
                prop_assert!(created.contains(&state.active), "active is a created version");
                prop_assert!(state.previous.is_none_or(|p| created.contains(&p)));
                prop_assert!(state.latest_version >= before.latest_version);
                prop_assert_eq!(state.latest_version, created.last().unwrap().version);
                // A follower that saw the earlier state adopts this one, and refuses to go back.
                let mut follower = before;
                let observed = follower.observe(&state);
                prop_assert!(observed.is_ok());
                prop_assert_eq!(follower, state);
                if state.seq > before.seq {
                    let is_stale = matches!(follower.observe(&before), Err(PolicyError::Stale { .. }));
                    prop_assert!(is_stale);
                }
            }
        }
    }
}
