//! The verifiable pre-queue draw of a scheduled opening (SPEC 2.1, `opensAt`).
//!
//! Members who arrive before a queue's `opensAt` wait in a pre-queue. At the opening they are put in a
//! random order that nobody can steer and everybody can check:
//!
//! 1. When `opensAt` is set, the store picks a secret **seed** of 32 random bytes and publishes its
//!    **commitment**, `SHA-256(seed)` in lowercase hex. The seed itself stays secret until the draw.
//! 2. At the draw, each pre-queue member's **draw key** is `HMAC-SHA-256(key = seed, message = memberId
//!    as UTF-8 bytes)`. Members are ordered by draw key, ascending, comparing bytes (a tie, which needs a
//!    SHA-256 collision, falls back to the member id's bytes). Later arrivals queue FIFO behind them all.
//! 3. After the draw the seed is revealed. Anyone checks `SHA-256(seed) == commitment` (the seed was fixed
//!    before anybody entered, so it could not have been picked to favour somebody) and recomputes the
//!    order; a member checks their own place by computing their own draw key.
//!
//! A fast connection or a bot refreshing at 00:00:00.001 gains nothing: arrival time inside the pre-queue
//! does not enter the order at all.
//!
//! HMAC comes from the `hmac` crate over `sha2` and hex from the `hex` crate (both pure, no IO), so a
//! reviewer checks no hand-written cryptography; the RFC 4231 vectors and the fixed draw below pin the
//! output, byte for byte, to what the hand-written versions gave.

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

/// Where a queue's draw stands. Transitions: `Scheduled → Drawing → Done`, and only forward; a new
/// `opensAt` after `Done` starts a new `Scheduled` draw with a new seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrawPhase {
    /// `opensAt` is set and has not been drawn: every waiting member is in the pre-queue; nobody is
    /// admitted.
    Scheduled,
    /// The draw is being written (in bounded chunks); still nobody is admitted.
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
            DrawPhase::Drawing => "D",
            DrawPhase::Done => "F",
        }
    }

    /// Parses [`DrawPhase::code`].
    #[must_use]
    pub fn from_code(code: &str) -> Option<DrawPhase> {
        match code {
            "S" => Some(DrawPhase::Scheduled),
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

    /// The name the API shows (`drawPhase`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            DrawPhase::Scheduled => "scheduled",
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

/// A member's draw key: `HMAC-SHA-256(seed, memberId)`.
#[must_use]
pub fn draw_key(seed: &DrawSeed, member: &str) -> [u8; 32] {
    hmac_sha256(&seed.0, member.as_bytes())
}

/// Puts `members` in drawn order: by draw key ascending (bytes), then by member id (bytes). Duplicates
/// are kept as given (a store never holds one member twice).
pub fn sort_in_draw_order<S: AsRef<str>>(seed: &DrawSeed, members: &mut Vec<S>) {
    let mut keyed: Vec<([u8; 32], S)> = members
        .drain(..)
        .map(|member| (draw_key(seed, member.as_ref()), member))
        .collect();
    keyed.sort_unstable_by(|(ka, a), (kb, b)| {
        ka.cmp(kb)
            .then_with(|| a.as_ref().as_bytes().cmp(b.as_ref().as_bytes()))
    });
    members.extend(keyed.into_iter().map(|(_, member)| member));
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
    /// The published order is not the recomputed one.
    #[error("the order differs at position {position}: published {published:?}, recomputed {expected:?}")]
    Order {
        /// 0-based position of the first difference.
        position: usize,
        /// The member published there.
        published: String,
        /// The member the seed puts there.
        expected: String,
    },
}

/// Checks a published draw: the seed against the commitment, then the published order against the order
/// the seed gives the same members.
pub fn verify_draw(
    seed: &DrawSeed,
    commitment: &[u8; 32],
    published_order: &[String],
) -> Result<(), DrawMismatch> {
    let actual = commitment_of(seed);
    if &actual != commitment {
        return Err(DrawMismatch::Commitment {
            actual: hex::encode(actual),
            published: hex::encode(commitment),
        });
    }
    let mut expected: Vec<&str> = published_order.iter().map(String::as_str).collect();
    sort_in_draw_order(seed, &mut expected);
    for (position, (published, expected)) in published_order.iter().zip(&expected).enumerate() {
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

    /// A fixed seed gives a fixed commitment and a fixed order: the vectors README documents, which
    /// `rankgate queue verify-draw` and any third-party checker must reproduce.
    #[test]
    fn a_fixed_seed_gives_a_fixed_commitment_and_order() {
        let seed = DrawSeed(std::array::from_fn(|i| i as u8));
        assert_eq!(
            hex::encode(commitment_of(&seed)),
            hex::encode(Sha256::digest(
                hex::decode("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f").unwrap()
            ))
        );
        assert_eq!(
            hex::encode(commitment_of(&seed)),
            "630dcd2966c4336691125448bbb25b4ff412a49c732db2c8abc1b8581bd710dd"
        );
        let mut members: Vec<String> = (0..6).map(|i| format!("m-{i}")).collect();
        sort_in_draw_order(&seed, &mut members);
        let keys: Vec<String> = members.iter().map(|m| hex::encode(draw_key(&seed, m))).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted, "ascending by draw key");
        assert_eq!(members, FIXED_ORDER, "the documented vector");
        assert_eq!(verify_draw(&seed, &commitment_of(&seed), &members), Ok(()));
    }

    /// Computed independently with Python's `hmac` and `hashlib`.
    const FIXED_ORDER: [&str; 6] = ["m-3", "m-4", "m-2", "m-0", "m-5", "m-1"];

    #[test]
    fn verification_fails_on_a_tampered_order_or_seed() {
        let seed = DrawSeed([7; 32]);
        let mut members: Vec<String> = (0..50).map(|i| format!("member-{i}")).collect();
        sort_in_draw_order(&seed, &mut members);
        let commitment = commitment_of(&seed);
        assert_eq!(verify_draw(&seed, &commitment, &members), Ok(()));
        let mut swapped = members.clone();
        swapped.swap(3, 4);
        assert!(matches!(
            verify_draw(&seed, &commitment, &swapped),
            Err(DrawMismatch::Order { position: 3, .. })
        ));
        let other = DrawSeed([8; 32]);
        assert!(matches!(
            verify_draw(&other, &commitment, &members),
            Err(DrawMismatch::Commitment { .. })
        ));
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
