//! One queue's in-memory state in the embedded store, and the transitions applied to it.
//!
//! Memory layout, chosen for the ≤ 100 bytes per waiting member target:
//! - waiting members live **only** in a `rankgate_zset::SortedSet` (member → sequence), about 50 bytes each;
//! - their arrival times are not stored per member: arrivals are monotone in sequence, so a short list of
//!   `(first sequence, millisecond)` checkpoints, one per distinct millisecond, answers "how long has the
//!   head waited" exactly;
//! - READY, CLAIMED and remembered CONSUMED members (a few per admitted member, bounded by the admission
//!   rate times the TTLs) sit in a hash map, with their next deadline in a second sorted set so expiry pops
//!   due members in O(log n) each.

use std::collections::VecDeque;

use hashbrown::HashMap;
use rankgate_core::ids::MemberId;
use rankgate_core::queue::{
    AdmissionBudget, Claim, Digest, IssuedToken, MemberState, MemberStatus, QueueName, QueueSettings,
    ThroughputEstimator,
};
use rankgate_zset::{ScoreBound, SortedSet};

use super::persist::{MemberRow, QueueRow, Write};
use crate::queue::draw::DrawRecord;
use crate::queue::waiting::{ExpiryOutcome, LastOutcome, MemberView, Placement};

/// Most deadlines handled per step, so one step never holds the queue's lock for long (the store's
/// `expire_due` loops, taking the lock anew for each step, until nothing due is left).
pub(crate) const MAX_EXPIRIES_PER_STEP: usize = 1_000;

/// One queue.
pub(crate) struct QueueState {
    pub name: QueueName,
    pub settings: QueueSettings,
    /// Next arrival sequence; strictly increasing, never reused while a smaller one waits.
    pub next_seq: u64,
    /// Waiting members scored by sequence.
    pub waiting: SortedSet,
    /// `(first sequence, arrival ms)` per distinct arrival millisecond, oldest first.
    pub arrivals: VecDeque<(u64, i64)>,
    /// READY, CLAIMED and remembered CONSUMED members.
    pub holders: HashMap<Box<str>, MemberState>,
    /// Member → its next deadline (token expiry, claim expiry, forgetting a consumed member, or a waiting
    /// member counting as abandoned: last seen + `abandon_after_seconds`). Waiting members being here
    /// too is what makes abandonment O(abandoned) per step (about 50 more bytes per waiting member).
    pub deadlines: SortedSet,
    /// Waiting members dropped as abandoned since the queue was made (stored in its row, so a restart
    /// keeps it, as a Redis queue's counter lives with its keys).
    pub abandoned: u64,
    pub ready: u64,
    pub claimed: u64,
    pub budget: AdmissionBudget,
    pub estimator: ThroughputEstimator,
    /// Monotonic guard over the store clock.
    pub last_now_ms: i64,
    /// How long a consumed member is remembered.
    pub consumed_memory_ms: i64,
    /// Configured by an admin PUT: never forgotten when idle.
    pub managed: bool,
    /// Set under the lock when the queue is deleted or forgotten; an operation that got hold of this state
    /// just before then must treat the queue as gone, or it would write rows for a queue that no longer is.
    pub deleted: bool,
    /// The scheduled opening and its draw, if `opensAt` is set (see `crate::queue::draw`).
    pub draw: Option<DrawRecord>,
    /// The published drawn list, in drawn order (as long as the draw's `drawn`, at most `K0`).
    pub drawn: Vec<Box<str>>,
    /// The entrant list of a closed pre-queue, from the close to the end of the draw (then empty).
    pub entrants: Vec<Box<str>>,
    /// The queue's epoch ([`Placement::epoch`]): drawn when the queue is made, kept in its row. This store
    /// never loses a queue, so it changes only when the queue is deleted (or forgotten) and made again.
    pub epoch: u64,
}

impl QueueState {
    pub(crate) fn new(
        name: QueueName,
        settings: QueueSettings,
        now_ms: i64,
        consumed_memory_ms: i64,
    ) -> Self {
        let budget = AdmissionBudget::new(&settings, now_ms);
        QueueState {
            name,
            settings,
            next_seq: 0,
            waiting: SortedSet::new(),
            arrivals: VecDeque::new(),
            holders: HashMap::new(),
            deadlines: SortedSet::new(),
            abandoned: 0,
            ready: 0,
            claimed: 0,
            budget,
            estimator: ThroughputEstimator::default(),
            last_now_ms: now_ms,
            consumed_memory_ms,
            managed: false,
            deleted: false,
            draw: None,
            drawn: Vec::new(),
            entrants: Vec::new(),
            epoch: new_epoch(),
        }
    }

    /// Where `member` stands, for its ticket: its arrival key while waiting, the front while it holds a
    /// token; `None` otherwise.
    pub(crate) fn placement_of(&self, member: &str) -> Option<Placement> {
        let place = match self.state_of(member) {
            MemberState::Waiting { .. } => self.waiting.zscore(member.as_bytes())? as i64,
            MemberState::Ready { .. } | MemberState::Claimed { .. } => Placement::ADMITTED,
            MemberState::Consumed { .. } | MemberState::NotEntered => return None,
        };
        Some(Placement {
            epoch: self.epoch,
            place,
        })
    }

    /// Somebody waiting or a token outstanding: the queue is in use and not to be forgotten.
    pub(crate) fn is_active(&self) -> bool {
        !self.waiting.is_empty() || self.ready + self.claimed > 0
    }

    /// Somebody waiting: admission must visit this queue every tick ([`crate::queue::QueueStore::active_queues`]).
    pub(crate) fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// The earliest deadline of any member (see `deadlines`), for schedulers that visit a queue nobody
    /// waits in only when it is due.
    pub(crate) fn next_deadline_ms(&self) -> Option<i64> {
        self.deadlines
            .range_by_rank(0, 0, false)
            .first()
            .map(|(_, deadline)| *deadline as i64)
    }

    /// The store clock through the monotonic guard, recorded: for every step that changes the queue.
    pub(crate) fn observe_now(&mut self, clock_ms: i64) -> i64 {
        self.last_now_ms = self.last_now_ms.max(clock_ms);
        self.last_now_ms
    }

    /// The store clock for a read of `member` in `state` (a position, a re-entry of a waiting member):
    /// guarded, but recorded only when the answer depends on a token's expiry (READY, CLAIMED), so a later
    /// claim can never run on an earlier clock than this answer did. Any other read leaves the guard (and
    /// the queue's last activity) as it was: the Redis store's rule (`member_position` in
    /// `queue_base.lua`), which keeps its hot poll free of writes.
    pub(crate) fn read_now(&mut self, clock_ms: i64, state: &MemberState) -> i64 {
        if state.is_outstanding() {
            self.observe_now(clock_ms)
        } else {
            self.last_now_ms.max(clock_ms)
        }
    }

    pub(crate) fn state_of(&self, member: &str) -> MemberState {
        if let Some(seq) = self.waiting.zscore(member.as_bytes()) {
            return MemberState::Waiting { seq: seq as u64 };
        }
        self.holders
            .get(member)
            .cloned()
            .unwrap_or(MemberState::NotEntered)
    }

    /// Whether admission holds for a scheduled opening (before and during its draw).
    pub(crate) fn draw_holds_admission(&self) -> bool {
        self.draw.as_ref().is_some_and(|d| d.phase.holds_admission())
    }

    /// The draw row, written whenever the draw record changes.
    pub(crate) fn draw_write(&self) -> Write {
        Write::Draw {
            queue: self.name.as_str().to_string(),
            record: self
                .draw
                .as_ref()
                .map(|d| serde_json::to_string(d).unwrap_or_default()),
        }
    }

    /// The queue row, written whenever settings, sequence, budget, estimator or the abandoned count change.
    pub(crate) fn queue_write(&self) -> Write {
        Write::Queue {
            name: self.name.as_str().to_string(),
            row: Box::new(QueueRow {
                settings: self.settings.clone(),
                next_seq: self.next_seq as i64,
                budget: self.budget,
                estimator: self.estimator.clone(),
                managed: self.managed,
                abandoned: self.abandoned,
                epoch: self.epoch,
            }),
        }
    }

    /// Replaces `member`'s state, keeping every index and counter in step, and records the row change.
    pub(crate) fn set_state(
        &mut self,
        member: &str,
        old: &MemberState,
        new: MemberState,
        now_ms: i64,
        writes: &mut Vec<Write>,
    ) {
        match old {
            MemberState::Waiting { .. } => {
                self.waiting.zrem(member.as_bytes());
                self.deadlines.zrem(member.as_bytes());
            }
            MemberState::NotEntered => {}
            _ => {
                self.holders.remove(member);
                self.deadlines.zrem(member.as_bytes());
            }
        }
        match old.status() {
            MemberStatus::Ready => self.ready -= 1,
            MemberStatus::Claimed => self.claimed -= 1,
            _ => {}
        }
        match new.status() {
            MemberStatus::Ready => self.ready += 1,
            MemberStatus::Claimed => self.claimed += 1,
            _ => {}
        }
        let queue = self.name.as_str().to_string();
        let row = match &new {
            MemberState::NotEntered => {
                writes.push(Write::DeleteMember {
                    queue,
                    member: member.to_string(),
                });
                return;
            }
            MemberState::Waiting { seq } => {
                // Entering at `now`: the NX insert cannot fail for a member known not to be waiting.
                let _ = self.waiting.insert(member.as_bytes(), *seq as f64);
                self.set_abandon_deadline(member, now_ms);
                if self.arrivals.back().is_none_or(|(_, ms)| *ms != now_ms) {
                    self.arrivals.push_back((*seq, now_ms));
                }
                MemberRow {
                    kind: 0,
                    seq: *seq as i64,
                    at_ms: now_ms,
                    ..MemberRow::default()
                }
            }
            MemberState::Ready { token, ended_claim } => MemberRow {
                kind: 1,
                at_ms: token.issued_at_ms,
                digest: Some(token.digest.0.to_vec()),
                nonce: Some(token.nonce.to_vec()),
                expires_ms: token.expires_at_ms,
                claim_digest: ended_claim.map(|d| d.0.to_vec()),
                ..MemberRow::default()
            },
            MemberState::Claimed { token, claim } => MemberRow {
                kind: 2,
                at_ms: token.issued_at_ms,
                digest: Some(token.digest.0.to_vec()),
                nonce: Some(token.nonce.to_vec()),
                expires_ms: token.expires_at_ms,
                claim_digest: Some(claim.digest.0.to_vec()),
                claim_expires_ms: claim.expires_at_ms,
                ..MemberRow::default()
            },
            MemberState::Consumed { claim, at_ms } => MemberRow {
                kind: 3,
                at_ms: *at_ms,
                digest: Some(claim.0.to_vec()),
                ..MemberRow::default()
            },
        };
        self.track_holder(member, new);
        writes.push(Write::Member {
            queue,
            member: member.to_string(),
            row,
        });
    }

    /// A waiting member was seen at `now_ms` (polled, read by its stream, entered again): it counts as
    /// abandoned no sooner than `abandon_after_seconds` later. The deadline moves only when it would fall
    /// short of that, and then by the slack too ([`QueueSettings::abandon_slack_millis`]; `touch_waiting`
    /// in `queue_base.lua` is the same rule), so most polls write nothing.
    pub(crate) fn touch_waiting(&mut self, member: &str, now_ms: i64) {
        let seen_until = now_ms + self.settings.abandon_after_millis();
        if self
            .deadlines
            .zscore(member.as_bytes())
            .is_none_or(|deadline| deadline < seen_until as f64)
        {
            self.set_abandon_deadline(member, now_ms);
        }
    }

    /// A member starts waiting at `now_ms`: its abandonment deadline, `abandon_after_seconds` and the
    /// slack from now (`abandon_deadline` in `queue_base.lua`).
    fn set_abandon_deadline(&mut self, member: &str, now_ms: i64) {
        let deadline = now_ms + self.settings.abandon_after_millis() + self.settings.abandon_slack_millis();
        let _ = self.deadlines.insert(member.as_bytes(), deadline as f64);
    }

    /// Puts a non-waiting state in the holder map and its deadline in the deadline set.
    pub(crate) fn track_holder(&mut self, member: &str, state: MemberState) {
        let deadline = match &state {
            MemberState::Consumed { at_ms, .. } => Some(at_ms + self.consumed_memory_ms),
            other => other.next_deadline_ms(),
        };
        if let Some(deadline) = deadline {
            let _ = self.deadlines.insert(member.as_bytes(), deadline as f64);
        }
        if !matches!(state, MemberState::Waiting { .. } | MemberState::NotEntered) {
            self.holders.insert(member.into(), state);
        }
    }

    /// Processes due deadlines, at most [`MAX_EXPIRIES_PER_STEP`]: expired tokens free their slots, expired
    /// claims are released, consumed members are forgotten, abandoned waiting members are dropped.
    /// `outcome.more_due` says whether some are left.
    pub(crate) fn expire_due(&mut self, now_ms: i64, writes: &mut Vec<Write>) -> ExpiryOutcome {
        let mut outcome = ExpiryOutcome::default();
        let abandoned_before = self.abandoned;
        let due: Vec<Vec<u8>> = self
            .deadlines
            .range_by_score(
                ScoreBound::Inclusive(f64::NEG_INFINITY),
                ScoreBound::Inclusive(now_ms as f64),
                false,
                Some((0, MAX_EXPIRIES_PER_STEP as i64)),
            )
            .into_iter()
            .map(|(member, _)| member.to_vec())
            .collect();
        outcome.more_due = due.len() == MAX_EXPIRIES_PER_STEP;
        for member_bytes in due {
            let Ok(member) = std::str::from_utf8(&member_bytes) else {
                self.deadlines.zrem(&member_bytes);
                continue;
            };
            let member = member.to_string();
            let state = self.state_of(&member);
            let next = match &state {
                MemberState::Ready { .. } => state
                    .expire_token(now_ms)
                    .inspect(|_| outcome.tokens_expired += 1),
                MemberState::Claimed { .. } => state
                    .expire_claim(now_ms)
                    .map(|(next, _)| next)
                    .inspect(|_| outcome.claims_expired += 1),
                MemberState::Consumed { .. } => Some(MemberState::NotEntered),
                // Unseen for abandon_after_seconds: dropped before admission can give it a token.
                MemberState::Waiting { .. } => {
                    self.abandoned += 1;
                    outcome.abandoned += 1;
                    Some(MemberState::NotEntered)
                }
                MemberState::NotEntered => None,
            };
            match next {
                Some(next) => self.set_state(&member, &state, next, now_ms, writes),
                // Not due after all (a stale deadline): drop it; set_state re-adds live ones.
                None => {
                    self.deadlines.zrem(&member_bytes);
                    if let Some(deadline) = state.next_deadline_ms() {
                        let _ = self.deadlines.insert(&member_bytes, deadline as f64);
                    }
                }
            }
        }
        if self.abandoned != abandoned_before {
            // In the same unit as the member rows it counts, so the two never disagree on disk.
            writes.push(self.queue_write());
        }
        outcome
    }

    /// How long a member admitted at `now_ms` with arrival sequence `seq` waited (ms), from the arrival
    /// checkpoint that covers it; `None` when none does. Exact for every waiting member: checkpoints are
    /// dropped only wholly before the head of the line.
    pub(crate) fn waited_ms(&self, seq: f64, now_ms: i64) -> Option<u64> {
        if seq < 0.0 {
            return None;
        }
        let seq = seq as u64;
        let covering = self.arrivals.partition_point(|(first, _)| *first <= seq);
        let (_, arrived_ms) = self.arrivals.get(covering.checked_sub(1)?)?;
        Some((now_ms - arrived_ms).max(0) as u64)
    }

    /// How long the head of the line has waited (ms).
    pub(crate) fn oldest_wait_ms(&mut self, now_ms: i64) -> i64 {
        let Some(head_seq) = self
            .waiting
            .range_by_rank(0, 0, false)
            .first()
            .map(|(_, s)| *s as u64)
        else {
            self.arrivals.clear();
            return 0;
        };
        // Drop checkpoints wholly before the head, keeping the one that covers it.
        while self.arrivals.len() >= 2 && self.arrivals[1].0 <= head_seq {
            self.arrivals.pop_front();
        }
        let arrived = self.arrivals.front().map_or(now_ms, |(_, ms)| *ms);
        (now_ms - arrived).max(0)
    }

    /// The member's position view.
    pub(crate) fn view(&self, member: &str, now_ms: i64) -> MemberView {
        let state = self.state_of(member);
        let waiting_count = self.waiting.len() as u64;
        let mut view = MemberView {
            status: state.status(),
            rank: None,
            waiting_count,
            token: None,
            last_outcome: None,
            estimated_wait_seconds: None,
            estimated_wait_p90_seconds: None,
            now_ms,
            placement: None,
        };
        match &state {
            MemberState::Waiting { .. } => {
                let rank = self.waiting.zrank(member.as_bytes()).unwrap_or(0) as u64;
                view.rank = Some(rank);
                view.estimated_wait_seconds = self.estimator.estimate_wait_seconds(rank, &self.settings);
                view.estimated_wait_p90_seconds =
                    self.estimator.estimate_wait_p90_seconds(rank, &self.settings);
            }
            MemberState::Ready { token, .. } => {
                if token.is_valid_at(now_ms) {
                    view.token = Some((token.nonce, token.expires_at_ms));
                } else {
                    // Expired but not yet swept: already reported as gone.
                    view.status = MemberStatus::NotEntered;
                }
            }
            MemberState::Claimed { token, .. } => view.token = Some((token.nonce, token.expires_at_ms)),
            MemberState::Consumed { .. } => view.last_outcome = Some(LastOutcome::Consumed),
            MemberState::NotEntered => {}
        }
        view
    }

    /// Rebuilds a member from its row at startup.
    pub(crate) fn restore_member(&mut self, member: &str, row: &MemberRow) -> Result<(), String> {
        let digest = |bytes: &Option<Vec<u8>>| -> Result<Digest, String> {
            let bytes = bytes.as_deref().ok_or("missing digest")?;
            Ok(Digest(bytes.try_into().map_err(|_| "digest is not 32 bytes")?))
        };
        let token = || -> Result<IssuedToken, String> {
            let nonce: [u8; 16] = row
                .nonce
                .as_deref()
                .ok_or("missing nonce")?
                .try_into()
                .map_err(|_| "nonce is not 16 bytes")?;
            Ok(IssuedToken {
                digest: digest(&row.digest)?,
                nonce,
                issued_at_ms: row.at_ms,
                expires_at_ms: row.expires_ms,
            })
        };
        let state = match row.kind {
            0 => {
                let seq = row.seq as u64;
                let _ = self.waiting.insert(member.as_bytes(), seq as f64);
                self.next_seq = self.next_seq.max(seq + 1);
                // Last seen is not stored: a restart counts as everyone seen when the queue last moved.
                self.set_abandon_deadline(member, self.last_now_ms.max(row.at_ms));
                return Ok(());
            }
            1 => MemberState::Ready {
                token: token()?,
                ended_claim: row
                    .claim_digest
                    .as_ref()
                    .map(|_| digest(&row.claim_digest))
                    .transpose()?,
            },
            2 => MemberState::Claimed {
                token: token()?,
                claim: Claim {
                    digest: digest(&row.claim_digest)?,
                    expires_at_ms: row.claim_expires_ms,
                },
            },
            3 => MemberState::Consumed {
                claim: digest(&row.digest)?,
                at_ms: row.at_ms,
            },
            other => return Err(format!("unknown member kind {other}")),
        };
        match state.status() {
            MemberStatus::Ready => self.ready += 1,
            MemberStatus::Claimed => self.claimed += 1,
            _ => {}
        }
        self.track_holder(member, state);
        Ok(())
    }
}

/// A fresh epoch: random, below 2^53 so that JSON readers of any language read it exactly, and never 0
/// (the epoch of every queue stored before epochs existed).
fn new_epoch() -> u64 {
    (rand::random::<u64>() >> 11).max(1)
}

/// Parses a stored member id (it was valid when written).
pub(crate) fn member_id_of(raw: &str) -> Option<MemberId> {
    MemberId::parse(raw).ok()
}
