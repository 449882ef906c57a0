//! The verifiable pre-queue draw of a scheduled opening (SPEC 2.1, `opensAt`): a draw no insider can steer.
//!
//! Members who arrive before a queue's `opensAt` wait in a pre-queue. At the opening they are put in a
//! random order that nobody can steer, the operator included, and everybody can check:
//!
//! 1. **Commit to the seed.** When `opensAt` is set, the store picks a secret **seed** of 32 random bytes
//!    and publishes `drawCommitment = SHA-256(seed)` in lowercase hex. The seed stays secret until the draw.
//! 2. **Close and commit to the entrants.** At `opensAt` the pre-queue closes: later arrivals queue FIFO
//!    behind it and are not in the draw. Before anything is revealed, rankgate publishes
//!    `entrantsCommitment = SHA-256(d_1 ‖ d_2 ‖ … ‖ d_n)`, where the `d_i` are the raw 32-byte
//!    `SHA-256(memberId)` digests of the entrants, sorted by bytes ([`entrants_commitment`]). If the queue
//!    names `drawBeaconRound`, the draw now waits for that round of a public randomness beacon (drand, for
//!    example), which is published after the close, to be supplied by an admin; otherwise `beacon` is empty.
//! 3. **Draw.** `drawKey = HMAC-SHA-256(key = seed, message = entrantsCommitment bytes ‖ beacon bytes)`
//!    ([`draw_key`]); each entrant's **order key** is `HMAC-SHA-256(key = drawKey, message = memberId as
//!    UTF-8)` ([`member_order_key`]), and entrants are ordered by order key ascending, comparing bytes (a
//!    tie, which needs an HMAC collision, falls back to the member id's bytes). Then the seed is revealed.
//!    Anyone checks `SHA-256(seed) == drawCommitment`, recomputes `entrantsCommitment` from the published
//!    entrant list and the order from the seed and the beacon ([`verify_draw`]); a member checks their own
//!    place by computing their own order key.
//!
//! Why nobody can steer it: the seed was fixed (and committed) before anybody entered, so it cannot be picked
//! to favour somebody; the entrant set was fixed (and committed) before the seed was revealed, so nobody can
//! add or drop an entrant after seeing where they would land; and with a beacon, the order depends on a
//! value nobody knew when the entrant set was fixed, so even the operator, who knows the seed, could not
//! have computed any entrant's place in advance and shaped the entrant set (extra accounts, say) around it.
//! Without a beacon the order still depends on the whole entrant set. A fast connection or a bot refreshing
//! at 00:00:00.001 gains nothing either: arrival time inside the pre-queue does not enter the order.
//!
//! # Test vector
//! Computed independently with Python's `hashlib` and `hmac`, pinned in `the_documented_test_vector`:
//!
//! ```text
//! seed               000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
//! drawCommitment     630dcd2966c4336691125448bbb25b4ff412a49c732db2c8abc1b8581bd710dd
//! entrants           alice, bob, carol, dave
//! entrantsCommitment fc6f48550f6e5b338b968e20f923a6b9fb9ebbb8ed3de530e8c410f233dc972d
//! beacon             a3f1c2d4e5b60718293a4b5c6d7e8f90112233445566778899aabbccddeeff00
//! drawKey            5a856e6cc9c04df314bb7f20690a2c220eb3edf881d2b080e7b3d4a50c0b6877
//! order              carol  5de45f653d206622f022f7900968fb62746c935feb9bec2500c8ae97e3707916
//!                    bob    817b72a5e01d1d3abf0f5d9d3d93b27dfa4c3d6acc6ce75d1a1c0f46fec6ed62
//!                    dave   9f036790aab54e6b95e3f90a96d6c31b0f09f927ae75790820a58847e65a8ef1
//!                    alice  bb15240a7f5474775eec4846cda1032f2b5a3e1aeaa9775207cab7f44058199c
//! without a beacon   drawKey 62d366617effc5c3f73c0f2650ca1bc757d91e68f9bee74a56860f6817ad45cb,
//!                    order bob, alice, dave, carol
//! ```
//!
//! Draws finished before entrant commitments existed have no `entrantsCommitment`; their order key was
//! `HMAC-SHA-256(seed, memberId)`, which [`DrawKey::legacy`] keeps checkable.
//!
//! HMAC comes from the `hmac` crate over `sha2` and hex from the `hex` crate (both pure, no IO), so a
//! reviewer checks no hand-written cryptography; the RFC 4231 vectors and the fixed draws below pin the
//! output byte for byte.

use hmac::{Hmac, Mac as _};
use sha2::{Digest as _, Sha256};

/// The draw's secret: 32 random bytes chosen when `opensAt` is set.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DrawSeed(pub [u8; 32]);

impl std::fmt::Debug for DrawSeed {
    // The seed is a secret until the draw: never printed by accident.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DrawSeed(…)")
    }
}

/// The furthest ahead `opensAt` may be: a year (366 days). Further is a typo, and a pre-queue held that
/// long is an unbounded promise.
pub const MAX_OPENS_AT_AHEAD_MS: i64 = 366 * 24 * 3_600_000;

/// Default of `max_pre_queue`: most members a pre-queue holds (the draw sorts them in memory).
pub const DEFAULT_MAX_PRE_QUEUE: u64 = 1_000_000;

/// Where a queue's draw stands. Transitions: `Scheduled → Closing → (AwaitingBeacon →) Drawing → Done`,
/// and only forward; a new `opensAt` after `Done` starts a new `Scheduled` draw with a new seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrawPhase {
    /// `opensAt` is set and still ahead: every waiting member is in the pre-queue; nobody is admitted.
    Scheduled,
    /// `opensAt` passed: the pre-queue is closed and its entrant list is being recorded; the entrants
    /// commitment is not published yet. Nobody is admitted.
    Closing,
    /// The entrants commitment is published and the draw waits for `drawBeaconRound`'s value
    /// (`PUT /v1/admin/queues/{queue}/draw/beacon`). Nobody is admitted.
    AwaitingBeacon,
    /// The order is being written (in bounded chunks); still nobody is admitted.
    Drawing,
    /// Drawn: the seed is public and admission runs in the drawn order.
    Done,
}

impl DrawPhase {
    /// The one-letter code the stores keep.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            DrawPhase::Scheduled => "S",
            DrawPhase::Closing => "C",
            DrawPhase::AwaitingBeacon => "B",
            DrawPhase::Drawing => "D",
            DrawPhase::Done => "F",
        }
    }

    /// Parses [`DrawPhase::code`].
    #[must_use]
    pub fn from_code(code: &str) -> Option<DrawPhase> {
        match code {
            "S" => Some(DrawPhase::Scheduled),
            "C" => Some(DrawPhase::Closing),
            "B" => Some(DrawPhase::AwaitingBeacon),
            "D" => Some(DrawPhase::Drawing),
            "F" => Some(DrawPhase::Done),
            _ => None,
        }
    }

    /// Whether admission must wait (before and during the draw).
    #[must_use]
    pub fn holds_admission(self) -> bool {
        !matches!(self, DrawPhase::Done)
    }

    /// Whether the pre-queue has closed but its order is not written yet: every entrant still waits in the
    /// pre-queue.
    #[must_use]
    pub fn is_closed_before_the_order(self) -> bool {
        matches!(self, DrawPhase::Closing | DrawPhase::AwaitingBeacon)
    }

    /// The name the API shows (`drawPhase`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            DrawPhase::Scheduled => "scheduled",
            DrawPhase::Closing => "closing",
            DrawPhase::AwaitingBeacon => "awaitingBeacon",
            DrawPhase::Drawing => "drawing",
            DrawPhase::Done => "done",
        }
    }
}

/// `SHA-256(seed)`: what is published before the draw.
#[must_use]
pub fn commitment_of(seed: &DrawSeed) -> [u8; 32] {
    Sha256::digest(seed.0).into()
}

/// `HMAC-SHA-256(key, message)` (RFC 2104): the one HMAC of the project (draw keys here; entry tokens,
/// visitor cookies and webhook signatures through `rankgate_store::queue::token`).
#[must_use]
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    // HMAC takes a key of any length (a longer one is hashed first), so `new_from_slice` cannot fail.
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

/// `SHA-256(memberId)`: an entrant's digest, what the entrants commitment is made of.
#[must_use]
pub fn member_digest(member: &str) -> [u8; 32] {
    Sha256::digest(member.as_bytes()).into()
}

/// `entrantsCommitment`: SHA-256 over the entrants' `SHA-256(memberId)` digests, raw 32 bytes each,
/// sorted by bytes and concatenated. Sorting makes it a commitment to the *set*: it does not depend on the
/// order the store lists the entrants in. Duplicates are hashed as given (a store never holds one member
/// twice; [`verify_draw`] refuses a list that names one twice).
#[must_use]
pub fn entrants_commitment<S: AsRef<str>>(members: &[S]) -> [u8; 32] {
    let mut digests: Vec<[u8; 32]> = members.iter().map(|m| member_digest(m.as_ref())).collect();
    digests.sort_unstable();
    let mut hasher = Sha256::new();
    for digest in &digests {
        hasher.update(digest);
    }
    hasher.finalize().into()
}

/// The key the order is drawn with: [`draw_key`] of a draw, or the seed of a legacy one.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DrawKey(pub [u8; 32]);

impl std::fmt::Debug for DrawKey {
    // Whoever knows it knows the order: never printed by accident before the reveal.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DrawKey(…)")
    }
}

impl DrawKey {
    /// The key of a draw finished before entrant commitments existed: the seed itself (its order key was
    /// `HMAC-SHA-256(seed, memberId)`).
    #[must_use]
    pub fn legacy(seed: &DrawSeed) -> DrawKey {
        DrawKey(seed.0)
    }
}

/// `drawKey = HMAC-SHA-256(key = seed, message = entrantsCommitment ‖ beacon)`; `beacon` is empty when the
/// queue names no `drawBeaconRound`.
#[must_use]
pub fn draw_key(seed: &DrawSeed, entrants_commitment: &[u8; 32], beacon: &[u8]) -> DrawKey {
    let mut message = Vec::with_capacity(32 + beacon.len());
    message.extend_from_slice(entrants_commitment);
    message.extend_from_slice(beacon);
    DrawKey(hmac_sha256(&seed.0, &message))
}

/// A member's order key: `HMAC-SHA-256(key = drawKey, message = memberId)`; the draw sorts by it.
#[must_use]
pub fn member_order_key(key: &DrawKey, member: &str) -> [u8; 32] {
    hmac_sha256(&key.0, member.as_bytes())
}

/// Puts `members` in drawn order: by order key ascending (bytes), then by member id (bytes). Duplicates
/// are kept as given (a store never holds one member twice).
pub fn sort_in_draw_order<S: AsRef<str>>(key: &DrawKey, members: &mut Vec<S>) {
    let mut keyed: Vec<([u8; 32], S)> = members
        .drain(..)
        .map(|member| (member_order_key(key, member.as_ref()), member))
        .collect();
    keyed.sort_unstable_by(|(ka, a), (kb, b)| {
        ka.cmp(kb)
            .then_with(|| a.as_ref().as_bytes().cmp(b.as_ref().as_bytes()))
    });
    members.extend(keyed.into_iter().map(|(_, member)| member));
}

/// Most beacon hex digits `PUT …/draw/beacon` takes (512 bytes: a drand round's randomness is 32, its
/// signature 48 or 96).
pub const MAX_BEACON_HEX: usize = 1_024;

/// The largest `drawBeaconRound`: 2^53 − 1, so a JavaScript client reads it exactly.
pub const MAX_BEACON_ROUND: u64 = (1 << 53) - 1;

/// Why a beacon value is refused; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BeaconValueError {
    /// Not 2 to [`MAX_BEACON_HEX`] hex digits, an even number of them.
    #[error("value: must be 2 to 1024 hex digits, an even number of them (whole bytes)")]
    NotHex,
}

/// Parses a beacon value as supplied: hex, either case, whole bytes, 1 to 512 of them.
pub fn parse_beacon_value(raw: &str) -> Result<Vec<u8>, BeaconValueError> {
    if raw.is_empty() || raw.len() > MAX_BEACON_HEX || !raw.len().is_multiple_of(2) {
        return Err(BeaconValueError::NotHex);
    }
    hex::decode(raw).map_err(|_| BeaconValueError::NotHex)
}

/// Why a published draw does not check out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DrawMismatch {
    /// `SHA-256(seed)` is not the published commitment.
    #[error(
        "the seed does not match the commitment: SHA-256(seed) is {actual}, the commitment is {published}"
    )]
    Commitment {
        /// `SHA-256(seed)`, hex.
        actual: String,
        /// What was published, hex.
        published: String,
    },
    /// A member is listed twice.
    #[error("the entrant list names {member:?} twice")]
    Duplicate {
        /// The member listed twice.
        member: String,
    },
    /// The entrant list does not hash to the published entrants commitment.
    #[error(
        "the entrant list does not match entrantsCommitment: its {count} members hash to {actual}, the \
         published commitment is {published}"
    )]
    EntrantsCommitment {
        /// Members in the list.
        count: usize,
        /// Recomputed, hex.
        actual: String,
        /// What was published, hex.
        published: String,
    },
    /// The published order is not the recomputed one.
    #[error("the order differs at position {position}: published {published:?}, recomputed {expected:?}")]
    Order {
        /// 0-based position of the first difference.
        position: usize,
        /// The member published there.
        published: String,
        /// The member the draw key puts there.
        expected: String,
    },
}

/// A revealed draw as published, for [`verify_draw`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevealedDraw {
    /// The revealed seed.
    pub seed: DrawSeed,
    /// `drawCommitment`, published before anybody entered.
    pub commitment: [u8; 32],
    /// `entrantsCommitment`, published at the close; `None` for a draw from before entrant commitments.
    pub entrants_commitment: Option<[u8; 32]>,
    /// The beacon bytes (empty without `drawBeaconRound`).
    pub beacon: Vec<u8>,
    /// Every entrant, in the published order.
    pub order: Vec<String>,
}

impl RevealedDraw {
    /// The key the order was drawn with.
    #[must_use]
    pub fn draw_key(&self) -> DrawKey {
        match &self.entrants_commitment {
            Some(entrants) => draw_key(&self.seed, entrants, &self.beacon),
            None => DrawKey::legacy(&self.seed),
        }
    }
}

/// Checks a published draw: the seed against the commitment, the entrant list against the entrants
/// commitment (each member once), then the published order against the order the draw key gives.
pub fn verify_draw(draw: &RevealedDraw) -> Result<(), DrawMismatch> {
    let actual = commitment_of(&draw.seed);
    if actual != draw.commitment {
        return Err(DrawMismatch::Commitment {
            actual: hex::encode(actual),
            published: hex::encode(draw.commitment),
        });
    }
    let mut seen = std::collections::HashSet::with_capacity(draw.order.len());
    if let Some(member) = draw.order.iter().find(|m| !seen.insert(m.as_str())) {
        return Err(DrawMismatch::Duplicate {
            member: member.clone(),
        });
    }
    if let Some(published) = draw.entrants_commitment {
        let actual = entrants_commitment(&draw.order);
        if actual != published {
            return Err(DrawMismatch::EntrantsCommitment {
                count: draw.order.len(),
                actual: hex::encode(actual),
                published: hex::encode(published),
            });
        }
    }
    let mut expected: Vec<&str> = draw.order.iter().map(String::as_str).collect();
    sort_in_draw_order(&draw.draw_key(), &mut expected);
    for (position, (published, expected)) in draw.order.iter().zip(&expected).enumerate() {
        if published != expected {
            return Err(DrawMismatch::Order {
                position,
                published: published.clone(),
                expected: (*expected).to_string(),
            });
        }
    }
    Ok(())
}

/// Parses exactly 32 bytes of hex (either case), surrounding whitespace ignored: a seed or commitment
/// as published, pasted into `rankgate queue verify-draw` or read back from a store.
#[must_use]
pub fn from_hex_32(raw: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(raw.trim(), &mut out).ok()?;
    Some(out)
}

/// Why an `opensAt` is refused; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpensAtError {
    /// Not an RFC 3339 timestamp.
    #[error("opensAt: must be an RFC 3339 timestamp such as 2026-12-24T18:00:00Z, or null")]
    NotRfc3339,
    /// Not after the store's clock.
    #[error("opensAt: must be in the future")]
    InThePast,
    /// More than [`MAX_OPENS_AT_AHEAD_MS`] ahead.
    #[error("opensAt: must be at most 366 days ahead")]
    TooFarAhead,
}

/// Parses `opensAt` against `now_ms` (the store clock): RFC 3339, in the future, at most a year ahead.
/// Returns epoch milliseconds.
pub fn parse_opens_at(raw: &str, now_ms: i64) -> Result<i64, OpensAtError> {
    if raw.len() > 64 {
        return Err(OpensAtError::NotRfc3339);
    }
    let at: jiff::Timestamp = raw.parse().map_err(|_| OpensAtError::NotRfc3339)?;
    let ms = at.as_millisecond();
    if ms <= now_ms {
        return Err(OpensAtError::InThePast);
    }
    if ms - now_ms > MAX_OPENS_AT_AHEAD_MS {
        return Err(OpensAtError::TooFarAhead);
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231 test cases 1, 2 and 6 (a key longer than a block): our HMAC is HMAC.
    #[test]
    fn hmac_matches_rfc_4231() {
        assert_eq!(
            hex::encode(hmac_sha256(&[0x0b; 20], b"Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            hex::encode(hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex::encode(hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    /// The test vector of the module doc and README, computed independently with Python's `hashlib` and
    /// `hmac` (issue 28): any third-party checker must reproduce it byte for byte.
    #[test]
    fn the_documented_test_vector() {
        let seed = DrawSeed(std::array::from_fn(|i| i as u8));
        assert_eq!(
            hex::encode(commitment_of(&seed)),
            "630dcd2966c4336691125448bbb25b4ff412a49c732db2c8abc1b8581bd710dd"
        );
        let entrants = ["alice", "bob", "carol", "dave"];
        let entrants_hex = "fc6f48550f6e5b338b968e20f923a6b9fb9ebbb8ed3de530e8c410f233dc972d";
        assert_eq!(hex::encode(entrants_commitment(&entrants)), entrants_hex);
        let shuffled = ["dave", "alice", "carol", "bob"];
        assert_eq!(
            hex::encode(entrants_commitment(&shuffled)),
            entrants_hex,
            "a commitment to the set, not to a listing order"
        );
        let entrants_bytes = from_hex_32(entrants_hex).unwrap();
        let beacon = hex::decode("a3f1c2d4e5b60718293a4b5c6d7e8f90112233445566778899aabbccddeeff00").unwrap();
        let key = draw_key(&seed, &entrants_bytes, &beacon);
        assert_eq!(
            hex::encode(key.0),
            "5a856e6cc9c04df314bb7f20690a2c220eb3edf881d2b080e7b3d4a50c0b6877"
        );
        let mut order: Vec<&str> = entrants.to_vec();
        sort_in_draw_order(&key, &mut order);
        assert_eq!(order, ["carol", "bob", "dave", "alice"]);
        assert_eq!(
            order
                .iter()
                .map(|m| hex::encode(member_order_key(&key, m)))
                .collect::<Vec<_>>(),
            [
                "5de45f653d206622f022f7900968fb62746c935feb9bec2500c8ae97e3707916",
                "817b72a5e01d1d3abf0f5d9d3d93b27dfa4c3d6acc6ce75d1a1c0f46fec6ed62",
                "9f036790aab54e6b95e3f90a96d6c31b0f09f927ae75790820a58847e65a8ef1",
                "bb15240a7f5474775eec4846cda1032f2b5a3e1aeaa9775207cab7f44058199c",
            ]
        );
        let unbeaconed = draw_key(&seed, &entrants_bytes, &[]);
        assert_eq!(
            hex::encode(unbeaconed.0),
            "62d366617effc5c3f73c0f2650ca1bc757d91e68f9bee74a56860f6817ad45cb"
        );
        let mut order: Vec<&str> = entrants.to_vec();
        sort_in_draw_order(&unbeaconed, &mut order);
        assert_eq!(order, ["bob", "alice", "dave", "carol"]);
        let draw = RevealedDraw {
            seed,
            commitment: commitment_of(&seed),
            entrants_commitment: Some(entrants_bytes),
            beacon,
            order: ["carol", "bob", "dave", "alice"].map(String::from).to_vec(),
        };
        assert_eq!(verify_draw(&draw), Ok(()));
    }

    /// A draw finished before entrant commitments (no `entrantsCommitment`) was ordered by
    /// `HMAC-SHA-256(seed, memberId)`; its published vector still checks.
    #[test]
    fn a_legacy_draw_keeps_its_order_and_verifies() {
        let seed = DrawSeed(std::array::from_fn(|i| i as u8));
        let mut members: Vec<String> = (0..6).map(|i| format!("m-{i}")).collect();
        sort_in_draw_order(&DrawKey::legacy(&seed), &mut members);
        // Computed independently with Python's `hmac` and `hashlib` when the draw shipped.
        assert_eq!(members, ["m-3", "m-4", "m-2", "m-0", "m-5", "m-1"]);
        let draw = RevealedDraw {
            seed,
            commitment: commitment_of(&seed),
            entrants_commitment: None,
            beacon: Vec::new(),
            order: members,
        };
        assert_eq!(verify_draw(&draw), Ok(()));
    }

    fn drawn(seed: DrawSeed, count: usize, beacon: &[u8]) -> RevealedDraw {
        let mut order: Vec<String> = (0..count).map(|i| format!("member-{i}")).collect();
        let entrants = entrants_commitment(&order);
        sort_in_draw_order(&draw_key(&seed, &entrants, beacon), &mut order);
        RevealedDraw {
            seed,
            commitment: commitment_of(&seed),
            entrants_commitment: Some(entrants),
            beacon: beacon.to_vec(),
            order,
        }
    }

    #[test]
    fn verification_fails_on_a_tampered_order_seed_list_or_beacon() {
        let draw = drawn(DrawSeed([7; 32]), 50, b"beacon");
        assert_eq!(verify_draw(&draw), Ok(()));

        let mut swapped = draw.clone();
        swapped.order.swap(3, 4);
        assert!(matches!(
            verify_draw(&swapped),
            Err(DrawMismatch::Order { position: 3, .. })
        ));
        let mut other_seed = draw.clone();
        other_seed.seed = DrawSeed([8; 32]);
        assert!(matches!(
            verify_draw(&other_seed),
            Err(DrawMismatch::Commitment { .. })
        ));
        // A member slipped in after the close (even put in its right place), or one dropped.
        let mut added = draw.clone();
        added.order.push("insider".into());
        sort_in_draw_order(&added.draw_key(), &mut added.order);
        assert!(matches!(
            verify_draw(&added),
            Err(DrawMismatch::EntrantsCommitment { count: 51, .. })
        ));
        let mut dropped = draw.clone();
        dropped.order.remove(10);
        assert!(matches!(
            verify_draw(&dropped),
            Err(DrawMismatch::EntrantsCommitment { .. })
        ));
        let mut twice = draw.clone();
        twice.order[5] = twice.order[6].clone();
        assert!(matches!(verify_draw(&twice), Err(DrawMismatch::Duplicate { .. })));
        let mut other_beacon = draw.clone();
        other_beacon.beacon = b"beacom".to_vec();
        assert!(matches!(
            verify_draw(&other_beacon),
            Err(DrawMismatch::Order { .. })
        ));
        let mut no_beacon = draw;
        no_beacon.beacon.clear();
        assert!(matches!(verify_draw(&no_beacon), Err(DrawMismatch::Order { .. })));
    }

    #[test]
    fn beacon_values_are_whole_bytes_of_hex_and_bounded() {
        assert_eq!(parse_beacon_value("00ff"), Ok(vec![0, 255]));
        assert_eq!(parse_beacon_value("ABcd"), Ok(vec![0xab, 0xcd]));
        assert_eq!(
            parse_beacon_value(&"a".repeat(MAX_BEACON_HEX)).map(|v| v.len()),
            Ok(512)
        );
        for bad in ["", "0", "abc", "zz", "+f", " 00", "0x00", "éé"] {
            assert_eq!(parse_beacon_value(bad), Err(BeaconValueError::NotHex), "{bad:?}");
        }
        assert_eq!(
            parse_beacon_value(&"a".repeat(MAX_BEACON_HEX + 2)),
            Err(BeaconValueError::NotHex)
        );
    }

    #[test]
    fn opens_at_is_rfc3339_in_the_future_and_within_a_year() {
        // 2027-01-15T08:00:00Z is 1,800,000,000,000 ms; now is a day before.
        let now = 1_800_000_000_000 - 86_400_000;
        assert_eq!(parse_opens_at("2027-01-15T08:00:00Z", now), Ok(1_800_000_000_000));
        assert_eq!(
            parse_opens_at("2027-01-15T09:00:00+01:00", now),
            Ok(1_800_000_000_000)
        );
        for raw in ["tomorrow", "2027-01-15", "1800000000", "", "2027-13-01T00:00:00Z"] {
            assert_eq!(parse_opens_at(raw, now), Err(OpensAtError::NotRfc3339), "{raw}");
        }
        assert_eq!(
            parse_opens_at("2020-01-01T00:00:00Z", now),
            Err(OpensAtError::InThePast)
        );
        assert_eq!(
            parse_opens_at("2999-01-01T00:00:00Z", now),
            Err(OpensAtError::TooFarAhead)
        );
        assert_eq!(
            parse_opens_at(&"9".repeat(100), now),
            Err(OpensAtError::NotRfc3339)
        );
    }

    #[test]
    fn hex_round_trips() {
        let bytes: [u8; 32] = std::array::from_fn(|i| (i * 7) as u8);
        assert_eq!(from_hex_32(&hex::encode(bytes)), Some(bytes));
        assert_eq!(from_hex_32(&hex::encode(bytes).to_uppercase()), Some(bytes));
        assert_eq!(
            from_hex_32(&format!(" {}\n", hex::encode(bytes))),
            Some(bytes),
            "pasted"
        );
        assert_eq!(from_hex_32("zz"), None);
        assert_eq!(from_hex_32(&"+f".repeat(32)), None, "digits only, no sign");
        assert_eq!(from_hex_32(&"é".repeat(32)), None);
    }
}
