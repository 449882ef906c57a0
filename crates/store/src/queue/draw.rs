//! Scheduled openings: the pre-queue and its draw, as every queue backend stores them, and
//! [`run_draw`], the one driver that performs a draw on any backend through its [`DrawStore`] steps.
//!
//! # The draw, step by step (each step one atomic store operation)
//! 1. **Schedule** ([`DrawStore::schedule_opening`]): `opensAt` and a fresh secret seed are stored (a
//!    queue already `Scheduled` keeps its seed, so the commitment a member noted stays valid when an admin
//!    moves the time); [`DrawStore::set_beacon_round`] names or clears `drawBeaconRound` while scheduled.
//!    From then on every waiting member is in the pre-queue and admission holds.
//! 2. **Close** ([`DrawStore::begin_draw`], at the first admission tick at or after `opensAt`): the store
//!    freezes the pre-queue: `B` = the next arrival sequence, `K0` = members waiting (all have a sequence
//!    below `B`), and moves the queue's next sequence to `L = B + K0`, so every later arrival queues behind
//!    whatever the draw writes and is not an entrant. Phase `Closing`, with a **lease** to one drawer: the
//!    store's atomic step decides who draws, once across instances.
//! 3. **Record the entrants**: the drawer reads the waiting members scored below `L`
//!    ([`DrawStore::pre_queue_page`], bounded pages keyed by score), appends them to the entrant list
//!    ([`DrawStore::write_entrants_chunk`], chunks of [`DRAW_WRITE_CHUNK`]) and seals it
//!    ([`DrawStore::seal_entrants`]) with `entrantsCommitment` computed in Rust (Redis Lua has no
//!    SHA-256). Sealing publishes the commitment, the first thing revealed after the close; the phase
//!    becomes `AwaitingBeacon` when the queue names `drawBeaconRound`, else `Drawing`.
//! 4. **Beacon** ([`DrawStore::supply_beacon`], an admin's `PUT …/draw/beacon`): only in
//!    `AwaitingBeacon` and only for the named round; the phase becomes `Drawing`.
//! 5. **Order**: a `Drawing` pass (leased like the close) reads the sealed entrant list
//!    ([`DrawStore::entrants`]), sorts it by `HMAC-SHA-256(drawKey, memberId)` in the drawer's memory, and
//!    writes it ([`DrawStore::write_draw_chunk`]) in chunks: drawn position `i` gets the sequence `B + i`
//!    (still below `L`) and the chunk is appended to the published drawn list. A chunk is applied at most
//!    once (the list's length is its idempotency key) and only by the lease holder; an entrant who left
//!    meanwhile stays in the published list (it is the committed set) but is not put back in line, and
//!    one who came back since (a sequence ≥ `L`) is not moved.
//! 6. **Finish** ([`DrawStore::finish_draw`]): refused while any member is still scored below `B` (a pass
//!    that missed somebody); otherwise `Done`, the seed becomes public, the entrant list (now the drawn
//!    list, reordered) is dropped and admission resumes.
//!
//! # Why a crash mid-draw loses and duplicates nobody
//! Writes only ever change the score of a member that is still waiting (never add or remove one), so the
//! waiting set keeps exactly the members it had. A drawer that dies leaves a lease that expires; the next
//! begin grants a new pass, which clears the list it writes (the entrant list before the seal, the drawn
//! list after it) and rewrites it whole, so no half-written list survives; once sealed, the entrant set
//! never changes. Scores of a dead pass may tie with the new pass's while it runs; finish checks nobody
//! was left below `B`.

use std::collections::HashSet;

use rankgate_core::queue::draw::{commitment_of, draw_key, entrants_commitment, sort_in_draw_order, DrawKey};
use rankgate_core::queue::{DrawPhase, DrawSeed, QueueName};

use async_trait::async_trait;

use super::StoreError;

/// Members per pre-queue read page.
pub const DRAW_READ_PAGE: usize = 5_000;
/// Members per write chunk: one short script on Redis (well inside Lua's `unpack` limit), one short lock
/// hold in the embedded store.
pub const DRAW_WRITE_CHUNK: usize = 1_000;
/// How long a drawer's lease lasts without progress; every chunk extends it.
pub const DRAW_LEASE_MS: i64 = 15_000;

/// A queue's scheduled opening and its draw, as stored.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DrawRecord {
    /// `opensAt`, epoch ms.
    pub opens_at_ms: i64,
    /// Where the draw stands (stored as [`DrawPhase::code`]).
    #[serde(with = "phase_code")]
    pub phase: DrawPhase,
    /// The secret seed. Shown only once `phase` is `Done` ([`DrawRecord::revealed_seed`]).
    #[serde(with = "seed_hex")]
    pub seed: DrawSeed,
    /// Members waiting when the draw began (`K0`); 0 while scheduled.
    pub pre_queue_size: u64,
    /// Members in the published drawn list.
    pub drawn: u64,
    /// `B`: pre-queue members had sequences below it.
    pub boundary: u64,
    /// `L = B + K0`: the first sequence of the later arrivals.
    pub late_from: u64,
    /// The drawer holding the lease while drawing.
    #[serde(default)]
    pub owner: String,
    /// When that lease ends (store ms).
    #[serde(default)]
    pub lease_until_ms: i64,
    /// `drawBeaconRound`: the public beacon round the draw waits for after the close, if any.
    #[serde(default)]
    pub beacon_round: Option<u64>,
    /// `entrantsCommitment`, once the entrant list is sealed (`None` before, and on draws finished before
    /// entrant commitments existed).
    #[serde(default, with = "optional_hex_32")]
    pub entrants_commitment: Option<[u8; 32]>,
    /// Members in the sealed entrant list.
    #[serde(default)]
    pub entrant_count: u64,
    /// The beacon round's value, once an admin supplied it.
    #[serde(default, with = "optional_hex")]
    pub beacon: Option<Vec<u8>>,
}

impl std::fmt::Debug for DrawRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrawRecord")
            .field("opens_at_ms", &self.opens_at_ms)
            .field("phase", &self.phase)
            .field("pre_queue_size", &self.pre_queue_size)
            .field("drawn", &self.drawn)
            .field("beacon_round", &self.beacon_round)
            .field("entrants_commitment", &self.entrants_commitment.map(hex::encode))
            .field("entrant_count", &self.entrant_count)
            .field("beacon", &self.beacon.as_ref().map(hex::encode))
            .finish_non_exhaustive()
    }
}

impl DrawRecord {
    /// A new scheduled draw.
    #[must_use]
    pub fn scheduled(opens_at_ms: i64, seed: DrawSeed) -> DrawRecord {
        DrawRecord {
            opens_at_ms,
            phase: DrawPhase::Scheduled,
            seed,
            pre_queue_size: 0,
            drawn: 0,
            boundary: 0,
            late_from: 0,
            owner: String::new(),
            lease_until_ms: 0,
            beacon_round: None,
            entrants_commitment: None,
            entrant_count: 0,
            beacon: None,
        }
    }

    /// `SHA-256(seed)`, published from the start.
    #[must_use]
    pub fn commitment(&self) -> [u8; 32] {
        commitment_of(&self.seed)
    }

    /// The seed, once the draw is done.
    #[must_use]
    pub fn revealed_seed(&self) -> Option<DrawSeed> {
        (self.phase == DrawPhase::Done).then_some(self.seed)
    }

    /// The beacon bytes the order uses: empty without `drawBeaconRound`, `None` while the round's value
    /// is awaited.
    #[must_use]
    pub fn beacon_bytes(&self) -> Option<&[u8]> {
        match (&self.beacon, self.beacon_round) {
            (Some(beacon), _) => Some(beacon),
            (None, None) => Some(&[]),
            (None, Some(_)) => None,
        }
    }

    /// The key the order is drawn with, once the draw is done (a legacy draw, without an entrants
    /// commitment, was drawn with its seed).
    #[must_use]
    pub fn revealed_draw_key(&self) -> Option<DrawKey> {
        let seed = self.revealed_seed()?;
        Some(match self.entrants_commitment {
            Some(entrants) => draw_key(&seed, &entrants, self.beacon_bytes().unwrap_or_default()),
            None => DrawKey::legacy(&seed),
        })
    }

    /// Whether a waiting member at 0-based `rank` is in the pre-queue (not yet placed by a finished draw).
    /// After the close, pre-queue members are the first `K0` ranks at most (leavers make it fewer); later
    /// arrivals rank behind them.
    #[must_use]
    pub fn holds_in_pre_queue(&self, rank: Option<u64>) -> bool {
        match self.phase {
            DrawPhase::Scheduled => true,
            DrawPhase::Closing | DrawPhase::AwaitingBeacon | DrawPhase::Drawing => {
                rank.is_some_and(|rank| rank < self.pre_queue_size)
            }
            DrawPhase::Done => false,
        }
    }
}

mod phase_code {
    use rankgate_core::queue::DrawPhase;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(phase: &DrawPhase, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(phase.code())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DrawPhase, D::Error> {
        let code = String::deserialize(d)?;
        DrawPhase::from_code(&code).ok_or_else(|| serde::de::Error::custom("unknown draw phase"))
    }
}

mod seed_hex {
    use rankgate_core::queue::draw::from_hex_32;
    use rankgate_core::queue::DrawSeed;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(seed: &DrawSeed, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(seed.0))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DrawSeed, D::Error> {
        let raw = String::deserialize(d)?;
        from_hex_32(&raw)
            .map(DrawSeed)
            .ok_or_else(|| serde::de::Error::custom("bad draw seed"))
    }
}

mod optional_hex_32 {
    use rankgate_core::queue::draw::from_hex_32;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<[u8; 32]>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(bytes) => s.serialize_some(&hex::encode(bytes)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<[u8; 32]>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|raw| from_hex_32(&raw).ok_or_else(|| serde::de::Error::custom("bad entrants commitment")))
            .transpose()
    }
}

mod optional_hex {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(bytes) => s.serialize_some(&hex::encode(bytes)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|raw| hex::decode(raw).map_err(|_| serde::de::Error::custom("bad beacon")))
            .transpose()
    }
}

/// The storage of scheduled openings: a queue's `opensAt`, its secret seed and the steps of its draw
/// (module doc), each one atomic step on the store with the store's clock, like [`QueueStore`]'s.
///
/// Apart from [`QueueStore`] because it is a capability of its own, with its own conformance suite
/// (`draw_conformance`), that most callers of the waiting room never touch. Yet on every backend it
/// lives in the same store as the queue (the draw rescores waiting members, and admission holds while
/// a draw is pending), so it is reached from the queue store through [`QueueStore::draws`] rather than
/// built and passed around as a second handle that could name another store.
///
/// [`QueueStore`]: super::QueueStore
/// [`QueueStore::draws`]: super::QueueStore::draws
#[async_trait]
pub trait DrawStore: Send + Sync + 'static {
    /// Sets (`Some`, epoch ms, validated by the caller) or clears (`None`) the queue's `opensAt`, creating
    /// the queue (as admin-configured) if needed. `fresh_seed` is used unless the queue is already
    /// scheduled (its seed, and so its commitment, stay).
    async fn schedule_opening(
        &self,
        queue: &QueueName,
        opens_at_ms: Option<i64>,
        fresh_seed: DrawSeed,
    ) -> Result<ScheduleOutcome, StoreError>;

    /// Names (`Some`) or clears (`None`) the queue's `drawBeaconRound`; only while its opening is
    /// `Scheduled` (the round is part of what the close fixes).
    async fn set_beacon_round(
        &self,
        queue: &QueueName,
        round: Option<u64>,
    ) -> Result<BeaconRoundOutcome, StoreError>;

    /// The queue's draw record; `None` when it has no `opensAt` (or does not exist).
    async fn draw_record(&self, queue: &QueueName) -> Result<Option<DrawRecord>, StoreError>;

    /// Step 2 of the draw: when due, freeze the pre-queue and lease the draw to `owner` for `lease_ms`.
    async fn begin_draw(
        &self,
        queue: &QueueName,
        owner: &str,
        lease_ms: i64,
    ) -> Result<BeginDraw, StoreError>;

    /// Step 3: up to `limit` waiting members scored in `[from_score, below)`, by score then member bytes.
    async fn pre_queue_page(
        &self,
        queue: &QueueName,
        from_score: u64,
        below: u64,
        limit: usize,
    ) -> Result<Vec<(String, u64)>, StoreError>;

    /// Step 3: appends `members` (entrant list positions `first_index..`) to the entrant list; only the
    /// lease holder of a `Closing` pass, at most once per position.
    async fn write_entrants_chunk(
        &self,
        queue: &QueueName,
        owner: &str,
        lease_ms: i64,
        first_index: u64,
        members: &[String],
    ) -> Result<DrawStep, StoreError>;

    /// Step 3's end: stores `entrantsCommitment` (computed by the drawer over the entrant list as written)
    /// and moves on to `AwaitingBeacon` or `Drawing` (the lease kept, so the same drawer goes on).
    async fn seal_entrants(
        &self,
        queue: &QueueName,
        owner: &str,
        commitment: [u8; 32],
    ) -> Result<SealEntrants, StoreError>;

    /// Step 4: the value of the queue's `drawBeaconRound`.
    async fn supply_beacon(
        &self,
        queue: &QueueName,
        round: u64,
        value: &[u8],
    ) -> Result<SupplyBeacon, StoreError>;

    /// The sealed entrant list, `offset..offset + limit` (empty once the draw is done: the drawn list
    /// holds the same members).
    async fn entrants(&self, queue: &QueueName, offset: u64, limit: usize)
        -> Result<Vec<String>, StoreError>;

    /// Step 5: places `members` (drawn positions `first_index..`) and appends them to the drawn list.
    async fn write_draw_chunk(
        &self,
        queue: &QueueName,
        owner: &str,
        lease_ms: i64,
        first_index: u64,
        members: &[String],
    ) -> Result<DrawStep, StoreError>;

    /// Step 6: completes the draw if every pre-queue member was placed.
    async fn finish_draw(&self, queue: &QueueName, owner: &str) -> Result<FinishDraw, StoreError>;

    /// The published drawn list (pre-queue member ids in drawn order), `offset..offset + limit`.
    async fn drawn_members(
        &self,
        queue: &QueueName,
        offset: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError>;
}

/// Result of [`DrawStore::schedule_opening`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleOutcome {
    /// Scheduled (or moved); the record as stored.
    Scheduled(DrawRecord),
    /// `opensAt` removed: the queue is an ordinary FIFO queue again, members keep their arrival order.
    Cleared,
    /// There was nothing to clear.
    NothingToClear,
    /// The pre-queue has closed and is not drawn yet (closing, awaiting the beacon or drawing): the opening
    /// cannot be moved or cleared until the draw is done.
    DrawRunning,
}

/// Result of [`DrawStore::set_beacon_round`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeaconRoundOutcome {
    /// Set (or cleared); the record as stored.
    Set(DrawRecord),
    /// The queue has no `opensAt`.
    NoOpening,
    /// The pre-queue has closed (or been drawn): the round can no longer change.
    Closed,
}

/// Result of [`DrawStore::seal_entrants`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealEntrants {
    /// Sealed; the draw waits for the beacon round's value.
    AwaitingBeacon,
    /// Sealed; the order can be drawn now (by the same lease holder).
    ReadyToDraw,
    /// This drawer no longer holds the lease.
    LostLease,
}

/// Result of [`DrawStore::supply_beacon`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SupplyBeacon {
    /// Accepted: the draw goes on.
    Accepted,
    /// This very value was accepted before (a retried PUT).
    AlreadyAccepted,
    /// Another value was accepted before: the draw's beacon never changes.
    DifferentValueAccepted,
    /// The round is not the queue's `drawBeaconRound` (`None`: it names none).
    WrongRound {
        /// The queue's `drawBeaconRound`.
        expected: Option<u64>,
    },
    /// No draw awaits a beacon (no opening, not closed yet, or not sealed yet).
    NotAwaiting,
}

/// Result of [`DrawStore::begin_draw`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeginDraw {
    /// No `opensAt` on this queue (or no queue).
    NotScheduled,
    /// `opensAt` is still ahead.
    NotDue,
    /// Another drawer holds a live lease.
    HeldElsewhere,
    /// The entrants are sealed and the draw waits for the beacon round's value.
    AwaitingBeacon,
    /// Already drawn.
    Done,
    /// This drawer holds the lease: run a full pass of the stage the draw is at.
    Begun(DrawPass),
}

/// What a drawer needs for one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrawPass {
    /// The secret seed.
    pub seed: DrawSeed,
    /// `B`.
    pub boundary: u64,
    /// `L`.
    pub late_from: u64,
    /// Which list this pass writes.
    pub stage: DrawStage,
}

/// The two kinds of pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrawStage {
    /// `Closing`: read the pre-queue, write the entrant list, seal it.
    RecordEntrants,
    /// `Drawing`: order the sealed entrant list and write it.
    WriteOrder {
        /// The sealed `entrantsCommitment`.
        entrants_commitment: [u8; 32],
        /// The beacon bytes (empty without `drawBeaconRound`).
        beacon: Vec<u8>,
    },
}

/// Result of [`DrawStore::write_draw_chunk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrawStep {
    /// Applied (or already applied by an earlier try of the same call).
    Written,
    /// This drawer no longer holds the lease (or chunks came out of order): stop; another pass decides.
    LostLease,
}

/// Result of [`DrawStore::finish_draw`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishDraw {
    /// Done; this many members were drawn.
    Done {
        /// Length of the drawn list.
        drawn: u64,
    },
    /// Some pre-queue member was not placed by this pass: run another.
    Incomplete,
    /// This drawer no longer holds the lease.
    LostLease,
}

/// What [`run_draw`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrawRun {
    /// Nothing to do (no `opensAt`, not due, or somebody else is drawing).
    Idle,
    /// The entrants are sealed (`entrantsCommitment` published); the draw waits for the beacon.
    AwaitingBeacon,
    /// The draw is done (by this call or before); this many members were drawn (`None`: not by this call).
    Done(Option<u64>),
    /// This drawer lost its lease mid-way; another instance carries on.
    Interrupted,
}

/// Passes one [`run_draw`] call tries before leaving the draw to the next tick (a close and an order pass
/// make two).
const PASSES_PER_RUN: usize = 4;

/// Performs a due draw on `queue`: close, record and seal the entrants, then (once the beacon is in, if
/// the queue names one) order, write in chunks and finish. Safe to call from every instance at every
/// tick: the store grants one drawer at a time, and any pass can be cut off at any point without losing
/// or duplicating a member (module doc). `owner` must be unique per call site (a random id per instance).
pub async fn run_draw(store: &dyn DrawStore, queue: &QueueName, owner: &str) -> Result<DrawRun, StoreError> {
    for _ in 0..PASSES_PER_RUN {
        let pass = match store.begin_draw(queue, owner, DRAW_LEASE_MS).await? {
            BeginDraw::NotScheduled | BeginDraw::NotDue | BeginDraw::HeldElsewhere => {
                return Ok(DrawRun::Idle)
            }
            BeginDraw::AwaitingBeacon => return Ok(DrawRun::AwaitingBeacon),
            BeginDraw::Done => return Ok(DrawRun::Done(None)),
            BeginDraw::Begun(pass) => pass,
        };
        match pass.stage {
            DrawStage::RecordEntrants => {
                let entrants = read_pre_queue(store, queue, pass.late_from).await?;
                let mut first_index = 0u64;
                for chunk in entrants.chunks(DRAW_WRITE_CHUNK) {
                    if store
                        .write_entrants_chunk(queue, owner, DRAW_LEASE_MS, first_index, chunk)
                        .await?
                        == DrawStep::LostLease
                    {
                        return Ok(DrawRun::Interrupted);
                    }
                    first_index += chunk.len() as u64;
                }
                match store
                    .seal_entrants(queue, owner, entrants_commitment(&entrants))
                    .await?
                {
                    SealEntrants::AwaitingBeacon => return Ok(DrawRun::AwaitingBeacon),
                    SealEntrants::ReadyToDraw => continue,
                    SealEntrants::LostLease => return Ok(DrawRun::Interrupted),
                }
            }
            DrawStage::WriteOrder {
                entrants_commitment,
                beacon,
            } => {
                let mut members = read_entrants(store, queue).await?;
                sort_in_draw_order(&draw_key(&pass.seed, &entrants_commitment, &beacon), &mut members);
                let mut first_index = 0u64;
                for chunk in members.chunks(DRAW_WRITE_CHUNK) {
                    if store
                        .write_draw_chunk(queue, owner, DRAW_LEASE_MS, first_index, chunk)
                        .await?
                        == DrawStep::LostLease
                    {
                        return Ok(DrawRun::Interrupted);
                    }
                    first_index += chunk.len() as u64;
                }
                match store.finish_draw(queue, owner).await? {
                    FinishDraw::Done { drawn } => return Ok(DrawRun::Done(Some(drawn))),
                    FinishDraw::LostLease => return Ok(DrawRun::Interrupted),
                    FinishDraw::Incomplete => continue,
                }
            }
        }
    }
    Ok(DrawRun::Interrupted)
}

/// The whole sealed entrant list, page by page.
async fn read_entrants(store: &dyn DrawStore, queue: &QueueName) -> Result<Vec<String>, StoreError> {
    let mut members: Vec<String> = Vec::new();
    loop {
        let page = store
            .entrants(queue, members.len() as u64, DRAW_READ_PAGE)
            .await?;
        let full = page.len() == DRAW_READ_PAGE;
        members.extend(page);
        if !full {
            return Ok(members);
        }
    }
}

/// Every waiting member scored below `late_from`, in pages keyed by score. Pages start at the last score
/// seen, inclusive, skipping the members already read at that score: scores left by a dead pass may tie,
/// and an exclusive start would skip the second of a tie.
async fn read_pre_queue(
    store: &dyn DrawStore,
    queue: &QueueName,
    late_from: u64,
) -> Result<Vec<String>, StoreError> {
    let mut members = Vec::new();
    let mut from_score = 0u64;
    let mut seen_at_from: HashSet<String> = HashSet::new();
    loop {
        let page = store
            .pre_queue_page(queue, from_score, late_from, DRAW_READ_PAGE)
            .await?;
        let full = page.len() == DRAW_READ_PAGE;
        let mut progressed = false;
        for (member, score) in page {
            if score == from_score && seen_at_from.contains(&member) {
                continue;
            }
            progressed = true;
            if score != from_score {
                from_score = score;
                seen_at_from.clear();
            }
            seen_at_from.insert(member.clone());
            members.push(member);
        }
        if !full || !progressed {
            return Ok(members);
        }
    }
}
