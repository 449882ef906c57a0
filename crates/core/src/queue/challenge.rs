//! Entry challenges (SPEC 2.2, "Entry challenges"): the per-queue settings and the proof-of-work rule.
//!
//! A queue may ask every entry that would make a new member to prove some work first (`"pow"`) or to pass
//! a CAPTCHA (`"captcha"`). The proof of work is the hashcash rule: a `nonce`, a decimal string of at
//! most 20 digits, such that `SHA-256(challenge ‖ ":" ‖ nonce)` starts with `difficulty` zero bits. A
//! browser finds one in about `2^difficulty` hashes; the server checks it with one.
//!
//! Issuing and checking the challenge string itself (signed, expiring, bound to the queue and the
//! client's address) is the server's (`waiting_room::entry_guard`), because its key is the server's.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// What an entry that would make a new member must show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryChallenge {
    /// Nothing (the default).
    #[default]
    None,
    /// A proof-of-work solution to a challenge from `GET /v1/queues/{queue}/challenge`.
    Pow,
    /// A CAPTCHA token the configured provider accepts.
    Captcha,
}

impl EntryChallenge {
    /// The JSON name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            EntryChallenge::None => "none",
            EntryChallenge::Pow => "pow",
            EntryChallenge::Captcha => "captcha",
        }
    }
}

/// `entryChallenge` and `powDifficulty`, flattened into a queue's settings JSON. Settings stored before
/// they existed read `none` and the default difficulty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryChallengeSettings {
    /// What a new member's entry must show.
    #[serde(default)]
    pub entry_challenge: EntryChallenge,
    /// Leading zero bits a proof-of-work solution needs (0–32).
    #[serde(default = "default_pow_difficulty")]
    pub pow_difficulty: u32,
}

impl Default for EntryChallengeSettings {
    fn default() -> Self {
        EntryChallengeSettings {
            entry_challenge: EntryChallenge::None,
            pow_difficulty: default_pow_difficulty(),
        }
    }
}

/// The default `powDifficulty`: 18 bits, about a quarter of a million hashes, under a second in a
/// browser's Web Worker on this project's reference machine (BENCHMARKS.md, "Entry challenges").
pub const DEFAULT_POW_DIFFICULTY: u32 = 18;

/// Allowed `powDifficulty`.
pub const POW_DIFFICULTY: std::ops::RangeInclusive<u32> = 0..=32;

/// Most digits a nonce may have (a `u64` in decimal).
pub const MAX_NONCE_DIGITS: usize = 20;

fn default_pow_difficulty() -> u32 {
    DEFAULT_POW_DIFFICULTY
}

/// The number of leading zero bits of `digest`.
#[must_use]
pub fn leading_zero_bits(digest: &[u8]) -> u32 {
    let mut bits = 0;
    for &byte in digest {
        if byte == 0 {
            bits += 8;
        } else {
            return bits + byte.leading_zeros();
        }
    }
    bits
}

/// Whether `nonce` is well formed: 1–20 ASCII digits.
#[must_use]
pub fn nonce_is_well_formed(nonce: &str) -> bool {
    (1..=MAX_NONCE_DIGITS).contains(&nonce.len()) && nonce.bytes().all(|byte| byte.is_ascii_digit())
}

/// Whether `nonce` solves `challenge` at `difficulty`: well formed, and `SHA-256(challenge ":" nonce)`
/// starts with at least `difficulty` zero bits. One hash: the server's whole cost of the work check.
#[must_use]
pub fn solves(challenge: &str, nonce: &str, difficulty: u32) -> bool {
    if !nonce_is_well_formed(nonce) {
        return false;
    }
    let digest = Sha256::new()
        .chain_update(challenge.as_bytes())
        .chain_update(b":")
        .chain_update(nonce.as_bytes())
        .finalize();
    leading_zero_bits(&digest) >= difficulty
}

/// Finds the smallest nonce that solves `challenge` at `difficulty`, counting from 0: what a client does
/// (the waiting page's worker, tests, the load tools). About `2^difficulty` hashes on average.
#[must_use]
pub fn solve(challenge: &str, difficulty: u32) -> u64 {
    let mut prefix = Sha256::new();
    prefix.update(challenge.as_bytes());
    prefix.update(b":");
    let mut buffer = itoa_buffer();
    (0u64..)
        .find(|nonce| {
            let digits = write_decimal(&mut buffer, *nonce);
            leading_zero_bits(&prefix.clone().chain_update(digits).finalize()) >= difficulty
        })
        .unwrap_or(u64::MAX)
}

fn itoa_buffer() -> [u8; MAX_NONCE_DIGITS] {
    [0; MAX_NONCE_DIGITS]
}

/// `value` in decimal, written at the end of `buffer`.
fn write_decimal(buffer: &mut [u8; MAX_NONCE_DIGITS], mut value: u64) -> &[u8] {
    let mut at = buffer.len();
    loop {
        at -= 1;
        buffer[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            return &buffer[at..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_zero_bits_counts_across_bytes() {
        assert_eq!(leading_zero_bits(&[0x80, 0]), 0);
        assert_eq!(leading_zero_bits(&[0x01, 0xff]), 7);
        assert_eq!(leading_zero_bits(&[0, 0, 0x10]), 19);
        assert_eq!(leading_zero_bits(&[0; 4]), 32);
    }

    #[test]
    fn a_found_nonce_solves_and_its_predecessors_do_not() {
        let challenge = "1-test-challenge";
        for difficulty in [0, 1, 4, 8, 12] {
            let nonce = solve(challenge, difficulty);
            assert!(solves(challenge, &nonce.to_string(), difficulty), "{difficulty}");
            for earlier in 0..nonce.min(200) {
                assert!(!solves(challenge, &earlier.to_string(), difficulty));
            }
        }
    }

    #[test]
    fn the_rule_is_sha256_of_challenge_colon_nonce() {
        // Computed independently with Python's hashlib, so the page's worker, the tools and this agree:
        // SHA-256("abc:0") = 5f36… (one leading zero bit); the first nonces of "rankgate" at 8 and 12 bits
        // are 110 (0090ead6…) and 2284 (000160f6…).
        assert_eq!(leading_zero_bits(&Sha256::digest(b"abc:0")), 1);
        assert_eq!(solve("rankgate", 8), 110);
        assert_eq!(solve("rankgate", 12), 2284);
        assert!(solves("rankgate", "2284", 15));
        assert!(!solves("rankgate", "2284", 16));
    }

    #[test]
    fn malformed_nonces_never_solve() {
        for nonce in ["", "-1", "1.0", " 1", "01a", "123456789012345678901", "１"] {
            assert!(!solves("c", nonce, 0), "{nonce:?}");
        }
        assert!(solves("c", "12345678901234567890", 0));
    }

    #[test]
    fn old_settings_read_the_defaults() {
        let settings: EntryChallengeSettings = serde_json::from_str("{}").unwrap();
        assert_eq!(settings, EntryChallengeSettings::default());
        assert_eq!(settings.pow_difficulty, 18);
        let json = serde_json::to_value(EntryChallengeSettings {
            entry_challenge: EntryChallenge::Pow,
            pow_difficulty: 16,
        })
        .unwrap();
        assert_eq!(
            json,
            serde_json::json!({"entryChallenge": "pow", "powDifficulty": 16})
        );
    }
}
