//! A waiting-room member's state machine (SPEC 2.1 and 2.4).
//!
//! ```text
//!  NOT_ENTERED ──enter──▶ WAITING ──admit──▶ READY ──claim──▶ CLAIMED ──consume──▶ CONSUMED
//!       ▲                    │                 │  ▲               │
//!       └──────leave─────────┘                 │  └──release / claim expiry (token still valid)
//!       ▲                                      │                  │
//!       └────── token expiry / leave ──────────┘◀─ release / claim expiry (token expired)
//! ```
//!
//! Every transition is a function from a state (and the current time, passed in) to a new state or a
//! typed rejection; no boolean ever stands for a state. Store backends call these inside their atomic
//! step, so every backend enforces the same rules and the property tests below cover them all.
//!
//! Only SHA-256 digests of entry tokens and claim ids are held here ([`Digest`]); the raw values never
//! enter the state, so nothing that persists or logs a state can leak a credential.

use std::fmt;

/// A SHA-256 digest of a credential (entry token or claim id). Compared in constant time.
#[derive(Clone, Copy)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// Compares two digests without an early exit, so the time taken says nothing about where they differ.
    #[must_use]
    pub fn matches(&self, other: &Digest) -> bool {
        let mut difference = 0u8;
        for (a, b) in self.0.iter().zip(other.0.iter()) {
            difference |= a ^ b;
        }
        // black_box keeps the optimiser from turning the fold back into a short-circuiting comparison.
        std::hint::black_box(difference) == 0
    }
}

impl fmt::Debug for Digest {
    // Only a prefix: enough to tell digests apart in a test failure, too little to be useful to anyone else.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({:02x}{:02x}…)", self.0[0], self.0[1])
    }
}

impl PartialEq for Digest {
    fn eq(&self, other: &Self) -> bool {
        self.matches(other)
    }
}

impl Eq for Digest {}

/// An entry token as the store knows it: its digest, the nonce it was derived from, and its lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IssuedToken {
    /// SHA-256 of the token.
    pub digest: Digest,
    /// Random per-issue input from which the serving layer re-derives the token for the member's polls.
    pub nonce: [u8; 16],
    /// When the token was issued (store clock, ms).
    pub issued_at_ms: i64,
    /// When it stops being valid (store clock, ms).
    pub expires_at_ms: i64,
}

impl IssuedToken {
    /// True while `now` is before the expiry.
    #[must_use]
    pub fn is_valid_at(&self, now_ms: i64) -> bool {
        now_ms < self.expires_at_ms
    }
}

/// A claim on a token: an order is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// SHA-256 of the claim id.
    pub digest: Digest,
    /// When the claim is released automatically (store clock, ms).
    pub expires_at_ms: i64,
}

/// One member's state in one queue. `NOT_ENTERED` is the absence of a record, modelled here so transitions
/// are total.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberState {
    /// Not in the queue and holding nothing.
    NotEntered,
    /// In line; `seq` is the store-side arrival sequence (strict FIFO, limitation 6).
    Waiting {
        /// Arrival sequence number, unique and increasing per queue.
        seq: u64,
    },
    /// Admitted and holding a token.
    Ready {
        /// The token.
        token: IssuedToken,
        /// The last claim on this token, ended unconsumed (released by the gate, or automatically after
        /// `claim_ttl`). A late consume for it is still honoured, so an order that did commit after all
        /// never lets the token buy a second one; a repeated release of it is a no-op. Any other claim id
        /// is unknown to both (defect 15: release used to accept any id here while consume refused it).
        ended_claim: Option<Digest>,
    },
    /// An order is in flight with this token.
    Claimed {
        /// The token.
        token: IssuedToken,
        /// The claim.
        claim: Claim,
    },
    /// The order committed. Reported as NOT_ENTERED with `lastOutcome: CONSUMED` while remembered.
    Consumed {
        /// The claim that consumed the token, so a repeated consume is idempotent.
        claim: Digest,
        /// When it was consumed (store clock, ms).
        at_ms: i64,
    },
}

/// The status a member sees (SPEC 2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MemberStatus {
    /// Not in the queue (including after a consumed order).
    NotEntered,
    /// In line.
    Waiting,
    /// Holding a token.
    Ready,
    /// An order is in flight.
    Claimed,
}

/// Why a claim was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClaimRejection {
    /// The member holds no token (not entered, waiting, or expired and cleaned up).
    #[error("no entry token is held by this member")]
    NoToken,
    /// The token does not match.
    #[error("the entry token is wrong")]
    WrongToken,
    /// The token's lifetime is over.
    #[error("the entry token has expired")]
    Expired,
    /// The token already bought an order.
    #[error("the entry token was already used")]
    AlreadyConsumed,
    /// Another claim holds the token right now.
    #[error("the entry token is already claimed")]
    AlreadyClaimed,
}

/// Why a consume was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConsumeRejection {
    /// No claim with this id holds, or last held, the member's token (also when the token was consumed
    /// by a different claim: an id that is not the claim's is unknown, for consume and release alike).
    #[error("no such claim")]
    UnknownClaim,
}

/// Why a release was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseRejection {
    /// No claim with this id holds the member's token.
    #[error("no such claim")]
    UnknownClaim,
    /// The order already committed; it cannot be released.
    #[error("the entry token was already consumed")]
    AlreadyConsumed,
}

/// Why a member cannot leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LeaveRejection {
    /// An order is in flight; it must be consumed or released first.
    #[error("an order is in flight; consume or release the claim first")]
    ClaimInFlight,
}

/// Where a released claim left the member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleasedTo {
    /// Back to READY: the token is still valid.
    Ready,
    /// The token had expired meanwhile, so the slot is freed.
    NotEntered,
    /// The claim was already released; nothing changed (release is idempotent).
    AlreadyReleased,
}

impl MemberState {
    /// The status reported to the member.
    #[must_use]
    pub fn status(&self) -> MemberStatus {
        match self {
            MemberState::NotEntered | MemberState::Consumed { .. } => MemberStatus::NotEntered,
            MemberState::Waiting { .. } => MemberStatus::Waiting,
            MemberState::Ready { .. } => MemberStatus::Ready,
            MemberState::Claimed { .. } => MemberStatus::Claimed,
        }
    }

    /// True for READY and CLAIMED: the states `max_active` bounds.
    #[must_use]
    pub fn is_outstanding(&self) -> bool {
        matches!(self, MemberState::Ready { .. } | MemberState::Claimed { .. })
    }

    /// Enter the queue. Idempotent: a member already WAITING, READY or CLAIMED keeps its state (and its
    /// position); only NOT_ENTERED or CONSUMED members take `next_seq`. Returns the new state and whether
    /// the sequence number was used.
    #[must_use]
    pub fn enter(&self, next_seq: u64) -> (MemberState, bool) {
        match self {
            MemberState::NotEntered | MemberState::Consumed { .. } => {
                (MemberState::Waiting { seq: next_seq }, true)
            }
            other => (other.clone(), false),
        }
    }

    /// Admit a WAITING member by giving it a token. Any other state is a bug in the caller, reported as
    /// `Err(self)` so the store can skip the member without losing it.
    pub fn admit(&self, token: IssuedToken) -> Result<MemberState, MemberState> {
        match self {
            MemberState::Waiting { .. } => Ok(MemberState::Ready {
                token,
                ended_claim: None,
            }),
            other => Err(other.clone()),
        }
    }

    /// Claim the token: READY with the right, unexpired token becomes CLAIMED.
    pub fn claim(
        &self,
        presented: &Digest,
        claim: Claim,
        now_ms: i64,
    ) -> Result<MemberState, ClaimRejection> {
        match self {
            MemberState::NotEntered | MemberState::Waiting { .. } => Err(ClaimRejection::NoToken),
            MemberState::Consumed { .. } => Err(ClaimRejection::AlreadyConsumed),
            MemberState::Ready { token, .. } => {
                if !token.digest.matches(presented) {
                    return Err(ClaimRejection::WrongToken);
                }
                if !token.is_valid_at(now_ms) {
                    return Err(ClaimRejection::Expired);
                }
                Ok(MemberState::Claimed { token: *token, claim })
            }
            MemberState::Claimed { token, .. } => {
                if token.digest.matches(presented) {
                    Err(ClaimRejection::AlreadyClaimed)
                } else {
                    Err(ClaimRejection::WrongToken)
                }
            }
        }
    }

    /// The order committed: CLAIMED becomes CONSUMED. Idempotent for the consuming claim. A consume for a
    /// claim that was auto-released while the order was still committing is honoured too, so the token
    /// cannot buy a second order.
    pub fn consume(
        &self,
        claim_digest: &Digest,
        now_ms: i64,
    ) -> Result<(MemberState, bool), ConsumeRejection> {
        match self {
            MemberState::Claimed { claim, .. } if claim.digest.matches(claim_digest) => Ok((
                MemberState::Consumed {
                    claim: *claim_digest,
                    at_ms: now_ms,
                },
                true,
            )),
            MemberState::Ready {
                ended_claim: Some(expired),
                ..
            } if expired.matches(claim_digest) => Ok((
                MemberState::Consumed {
                    claim: *claim_digest,
                    at_ms: now_ms,
                },
                true,
            )),
            MemberState::Consumed { claim, .. } if claim.matches(claim_digest) => Ok((self.clone(), false)),
            _ => Err(ConsumeRejection::UnknownClaim),
        }
    }

    /// The order failed: CLAIMED goes back to READY if the token is still valid, else to NOT_ENTERED.
    /// Releasing the claim that last ended on a READY token again is a no-op, so retries are safe; any
    /// other claim id is unknown, exactly as [`MemberState::consume`] sees it.
    pub fn release(
        &self,
        claim_digest: &Digest,
        now_ms: i64,
    ) -> Result<(MemberState, ReleasedTo), ReleaseRejection> {
        match self {
            MemberState::Claimed { token, claim } if claim.digest.matches(claim_digest) => {
                Ok(Self::after_release(token, Some(claim.digest), now_ms))
            }
            MemberState::Ready {
                ended_claim: Some(ended),
                ..
            } if ended.matches(claim_digest) => Ok((self.clone(), ReleasedTo::AlreadyReleased)),
            MemberState::Consumed { claim, .. } if claim.matches(claim_digest) => {
                Err(ReleaseRejection::AlreadyConsumed)
            }
            _ => Err(ReleaseRejection::UnknownClaim),
        }
    }

    fn after_release(
        token: &IssuedToken,
        ended_claim: Option<Digest>,
        now_ms: i64,
    ) -> (MemberState, ReleasedTo) {
        if token.is_valid_at(now_ms) {
            (
                MemberState::Ready {
                    token: *token,
                    ended_claim,
                },
                ReleasedTo::Ready,
            )
        } else {
            (MemberState::NotEntered, ReleasedTo::NotEntered)
        }
    }

    /// Automatic release of a claim whose `claim_ttl` is over. `None` when nothing is due.
    #[must_use]
    pub fn expire_claim(&self, now_ms: i64) -> Option<(MemberState, ReleasedTo)> {
        match self {
            MemberState::Claimed { token, claim } if claim.expires_at_ms <= now_ms => {
                Some(Self::after_release(token, Some(claim.digest), now_ms))
            }
            _ => None,
        }
    }

    /// An unused READY token past its lifetime frees its slot. `None` when nothing is due.
    #[must_use]
    pub fn expire_token(&self, now_ms: i64) -> Option<MemberState> {
        match self {
            MemberState::Ready { token, .. } if !token.is_valid_at(now_ms) => Some(MemberState::NotEntered),
            _ => None,
        }
    }

    /// Leave the queue (or give back a token). Refused while an order is in flight.
    pub fn leave(&self) -> Result<MemberState, LeaveRejection> {
        match self {
            MemberState::Claimed { .. } => Err(LeaveRejection::ClaimInFlight),
            MemberState::Consumed { .. } => Ok(self.clone()),
            _ => Ok(MemberState::NotEntered),
        }
    }

    /// The next moment this state changes by itself (token or claim expiry), if any.
    #[must_use]
    pub fn next_deadline_ms(&self) -> Option<i64> {
        match self {
            MemberState::Ready { token, .. } => Some(token.expires_at_ms),
            MemberState::Claimed { claim, .. } => Some(claim.expires_at_ms),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn digest(byte: u8) -> Digest {
        Digest([byte; 32])
    }

    fn token(byte: u8, expires_at_ms: i64) -> IssuedToken {
        IssuedToken {
            digest: digest(byte),
            nonce: [byte; 16],
            issued_at_ms: 0,
            expires_at_ms,
        }
    }

    #[test]
    fn entering_twice_keeps_the_first_position_and_ready_members_keep_their_token() {
        let (waiting, used) = MemberState::NotEntered.enter(7);
        assert!(used);
        assert_eq!(waiting, MemberState::Waiting { seq: 7 });
        assert_eq!(waiting.enter(8), (MemberState::Waiting { seq: 7 }, false));
        let ready = waiting.admit(token(1, 1000)).unwrap();
        assert_eq!(ready.enter(9).0, ready);
    }

    #[test]
    fn claim_rules_follow_spec_2_4() {
        let ready = MemberState::Waiting { seq: 0 }.admit(token(1, 1000)).unwrap();
        let claim = Claim {
            digest: digest(9),
            expires_at_ms: 500,
        };
        assert_eq!(
            ready.claim(&digest(2), claim, 10),
            Err(ClaimRejection::WrongToken)
        );
        assert_eq!(ready.claim(&digest(1), claim, 1000), Err(ClaimRejection::Expired));
        let claimed = ready.claim(&digest(1), claim, 10).unwrap();
        assert_eq!(claimed.status(), MemberStatus::Claimed);
        assert_eq!(
            claimed.claim(&digest(1), claim, 11),
            Err(ClaimRejection::AlreadyClaimed)
        );
        let (consumed, changed) = claimed.consume(&digest(9), 20).unwrap();
        assert!(changed);
        assert_eq!(consumed.status(), MemberStatus::NotEntered);
        assert!(
            !consumed.consume(&digest(9), 21).unwrap().1,
            "consume is idempotent"
        );
        assert_eq!(
            consumed.consume(&digest(8), 21),
            Err(ConsumeRejection::UnknownClaim)
        );
        assert_eq!(
            consumed.claim(&digest(1), claim, 22),
            Err(ClaimRejection::AlreadyConsumed)
        );
        assert_eq!(
            consumed.release(&digest(9), 22),
            Err(ReleaseRejection::AlreadyConsumed)
        );
    }

    #[test]
    fn release_returns_to_ready_or_frees_an_expired_token() {
        let claimed = MemberState::Claimed {
            token: token(1, 100),
            claim: Claim {
                digest: digest(9),
                expires_at_ms: 50,
            },
        };
        assert_eq!(
            claimed.release(&digest(8), 10),
            Err(ReleaseRejection::UnknownClaim)
        );
        let (ready, to) = claimed.release(&digest(9), 10).unwrap();
        assert_eq!(to, ReleasedTo::Ready);
        assert_eq!(ready.status(), MemberStatus::Ready);
        assert_eq!(
            ready.release(&digest(9), 11).unwrap().1,
            ReleasedTo::AlreadyReleased
        );
        assert_eq!(
            claimed.release(&digest(9), 100).unwrap(),
            (MemberState::NotEntered, ReleasedTo::NotEntered)
        );
    }

    #[test]
    fn an_abandoned_claim_expires_but_a_late_consume_is_still_honoured() {
        let claimed = MemberState::Claimed {
            token: token(1, 1000),
            claim: Claim {
                digest: digest(9),
                expires_at_ms: 50,
            },
        };
        assert_eq!(claimed.expire_claim(49), None);
        let (ready, to) = claimed.expire_claim(50).unwrap();
        assert_eq!(to, ReleasedTo::Ready);
        let (consumed, _) = ready.consume(&digest(9), 60).unwrap();
        assert!(matches!(consumed, MemberState::Consumed { .. }));
    }

    #[test]
    fn tokens_expire_and_leave_is_refused_only_in_flight() {
        let ready = MemberState::Ready {
            token: token(1, 100),
            ended_claim: None,
        };
        assert_eq!(ready.expire_token(99), None);
        assert_eq!(ready.expire_token(100), Some(MemberState::NotEntered));
        assert_eq!(ready.leave(), Ok(MemberState::NotEntered));
        let claimed = MemberState::Claimed {
            token: token(1, 100),
            claim: Claim {
                digest: digest(9),
                expires_at_ms: 50,
            },
        };
        assert_eq!(claimed.leave(), Err(LeaveRejection::ClaimInFlight));
    }

    /// Defect 15: release answered 204 for any claim id while READY, where consume with the same id gave
    /// 404. In every state, an id that is not the current (or last ended) claim is unknown to both.
    #[test]
    fn release_accepts_any_claim_id_while_ready_is_fixed_both_agree_in_every_state() {
        let token = token(1, 1000);
        let claim = Claim {
            digest: digest(9),
            expires_at_ms: 500,
        };
        let states = [
            MemberState::NotEntered,
            MemberState::Waiting { seq: 3 },
            MemberState::Ready {
                token,
                ended_claim: None,
            },
            MemberState::Ready {
                token,
                ended_claim: Some(digest(9)),
            },
            MemberState::Claimed { token, claim },
            MemberState::Consumed {
                claim: digest(9),
                at_ms: 10,
            },
        ];
        for state in &states {
            let stranger = digest(42);
            assert_eq!(
                state.release(&stranger, 10),
                Err(ReleaseRejection::UnknownClaim),
                "{state:?}"
            );
            assert_eq!(
                state.consume(&stranger, 10),
                Err(ConsumeRejection::UnknownClaim),
                "{state:?}"
            );
            // The claim the state knows is known to both.
            let known = digest(9);
            let release_knows = state.release(&known, 10) != Err(ReleaseRejection::UnknownClaim);
            let consume_knows = state.consume(&known, 10) != Err(ConsumeRejection::UnknownClaim);
            assert_eq!(release_knows, consume_knows, "{state:?}");
        }
        // A released claim's retry is a no-op, not a 404.
        let claimed = MemberState::Claimed { token, claim };
        let (ready, to) = claimed.release(&digest(9), 10).unwrap();
        assert_eq!(to, ReleasedTo::Ready);
        assert_eq!(
            ready.release(&digest(9), 11).unwrap().1,
            ReleasedTo::AlreadyReleased
        );
        assert_eq!(ready.release(&digest(8), 11), Err(ReleaseRejection::UnknownClaim));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Enter(usize),
        Admit,
        Claim(usize, bool),
        Consume(usize, bool),
        Release(usize, bool),
        Leave(usize),
        Advance(i64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..6usize).prop_map(Op::Enter),
            Just(Op::Admit),
            (0..6usize, any::<bool>()).prop_map(|(m, right)| Op::Claim(m, right)),
            (0..6usize, any::<bool>()).prop_map(|(m, right)| Op::Consume(m, right)),
            (0..6usize, any::<bool>()).prop_map(|(m, right)| Op::Release(m, right)),
            (0..6usize).prop_map(Op::Leave),
            (1..400i64).prop_map(Op::Advance),
        ]
    }

    proptest! {
        /// Random sequences over six members: states stay consistent (FIFO sequence numbers unique and
        /// increasing, tokens only in READY/CLAIMED, claims never outliving their token's holder) and the
        /// admission rule below never exceeds `max_active` outstanding tokens.
        #[test]
        fn random_operations_never_reach_an_invalid_state(ops in proptest::collection::vec(op(), 1..200)) {
            const MAX_ACTIVE: usize = 2;
            let mut states = vec![MemberState::NotEntered; 6];
            let mut next_seq = 0u64;
            let mut now = 0i64;
            let mut next_claim = 100u8;
            let mut last_claim: Vec<Option<Digest>> = vec![None; 6];
            for op in ops {
                match op {
                    Op::Enter(m) => {
                        let (next, used) = states[m].enter(next_seq);
                        if used { next_seq += 1; }
                        states[m] = next;
                    }
                    Op::Admit => {
                        for state in states.iter_mut() { if let Some(next) = state.expire_token(now) { *state = next; } }
                        let outstanding = states.iter().filter(|s| s.is_outstanding()).count();
                        let mut line: Vec<(u64, usize)> = states.iter().enumerate()
                            .filter_map(|(m, s)| match s { MemberState::Waiting { seq } => Some((*seq, m)), _ => None })
                            .collect();
                        line.sort();
                        for (_, m) in line.into_iter().take(MAX_ACTIVE.saturating_sub(outstanding)) {
                            states[m] = states[m].admit(token(m as u8, now + 300)).unwrap();
                        }
                    }
                    Op::Claim(m, right) => {
                        let presented = if right { digest(m as u8) } else { digest(200) };
                        next_claim = next_claim.wrapping_add(1).max(100);
                        let claim = Claim { digest: digest(next_claim), expires_at_ms: now + 100 };
                        if let Ok(next) = states[m].claim(&presented, claim, now) {
                            prop_assert!(right);
                            last_claim[m] = Some(claim.digest);
                            states[m] = next;
                        }
                    }
                    Op::Consume(m, right) => {
                        let presented = if right { last_claim[m].unwrap_or(digest(1)) } else { digest(99) };
                        if let Ok((next, _)) = states[m].consume(&presented, now) { states[m] = next; }
                    }
                    Op::Release(m, right) => {
                        let presented = if right { last_claim[m].unwrap_or(digest(1)) } else { digest(99) };
                        if let Ok((next, _)) = states[m].release(&presented, now) { states[m] = next; }
                    }
                    Op::Leave(m) => { if let Ok(next) = states[m].leave() { states[m] = next; } }
                    Op::Advance(ms) => {
                        now += ms;
                        for state in states.iter_mut() {
                            if let Some((next, _)) = state.expire_claim(now) { *state = next; }
                        }
                    }
                }
                let outstanding = states.iter().filter(|s| s.is_outstanding()).count();
                prop_assert!(outstanding <= MAX_ACTIVE, "outstanding {outstanding}");
                let mut seqs: Vec<u64> = states.iter().filter_map(|s| match s { MemberState::Waiting { seq } => Some(*seq), _ => None }).collect();
                let count = seqs.len();
                seqs.sort(); seqs.dedup();
                prop_assert_eq!(seqs.len(), count, "two waiting members share a sequence number");
                prop_assert!(seqs.iter().all(|s| *s < next_seq));
                for state in &states {
                    if let MemberState::Claimed { claim, .. } = state {
                        prop_assert!(claim.expires_at_ms > now, "a due claim was not expired");
                    }
                }
            }
        }
    }
}
