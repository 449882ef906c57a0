//! Entry tokens and claim ids: how they are made, derived and hashed (SPEC 2.3, 2.4).
//!
//! An entry token must be shown to the member on every poll while READY, by whichever instance answers the
//! poll, yet only a hash may be stored. So a token is derived, not stored: at admission the store records
//! a random 16-byte nonce (OS RNG) and `SHA-256(token)`, where
//! `token = HMAC-SHA256(secret, nonce)` — 32 bytes, URL-safe base64 without padding. Any instance holding
//! the deployment's secret re-derives the token from the nonce; someone holding only the store's data
//! (a backup, a Redis dump) holds nonces and hashes and can forge nothing. The secret itself is 32 bytes
//! from the OS RNG, kept outside the store (config or a 0600 file in the data directory).
//!
//! Claim ids are 16 bytes from the OS RNG, given once to the claimer, and stored only as a hash.
//! Presented credentials are hashed by the caller and compared with [`Digest::matches`], in constant time.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use rand::TryRngCore as _;
use rankgate_core::queue::Digest;
use sha2::{Digest as _, Sha256};

/// A deployment's token secret. `Debug` never prints it.
#[derive(Clone)]
pub struct TokenSecret([u8; 32]);

impl std::fmt::Debug for TokenSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenSecret(…)")
    }
}

/// A token the caller prepared for one admission: the store assigns it to whoever it pops.
#[derive(Debug, Clone, Copy)]
pub struct PreparedToken {
    /// Random per-token input.
    pub nonce: [u8; 16],
    /// `SHA-256` of the token.
    pub digest: Digest,
}

impl TokenSecret {
    /// A fresh secret from the OS RNG.
    pub fn generate() -> Result<TokenSecret, rand::rand_core::OsError> {
        let mut bytes = [0u8; 32];
        rand::rngs::OsRng.try_fill_bytes(&mut bytes)?;
        Ok(TokenSecret(bytes))
    }

    /// A secret from its bytes.
    #[must_use]
    pub fn from_bytes(bytes: [u8; 32]) -> TokenSecret {
        TokenSecret(bytes)
    }

    /// The raw bytes, for persisting the secret.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0
    }

    /// Derives the entry token for `nonce`, as the member sees it.
    #[must_use]
    pub fn token_for(&self, nonce: &[u8; 16]) -> String {
        URL_SAFE_NO_PAD.encode(hmac_sha256(&self.0, nonce))
    }

    /// Prepares a token with a fresh nonce from the OS RNG.
    pub fn prepare(&self) -> Result<PreparedToken, rand::rand_core::OsError> {
        let mut nonce = [0u8; 16];
        rand::rngs::OsRng.try_fill_bytes(&mut nonce)?;
        let token = self.token_for(&nonce);
        Ok(PreparedToken {
            nonce,
            digest: digest_of(&token),
        })
    }
}

/// `SHA-256` of a presented credential string.
#[must_use]
pub fn digest_of(credential: &str) -> Digest {
    Digest(Sha256::digest(credential.as_bytes()).into())
}

/// A new claim id (16 OS-random bytes, URL-safe base64) and its digest.
pub fn new_claim_id() -> Result<(String, Digest), rand::rand_core::OsError> {
    let mut bytes = [0u8; 16];
    rand::rngs::OsRng.try_fill_bytes(&mut bytes)?;
    let id = URL_SAFE_NO_PAD.encode(bytes);
    let digest = digest_of(&id);
    Ok((id, digest))
}

/// HMAC-SHA256 (RFC 2104), from core (the `hmac` crate underneath): used for entry tokens (32-byte keys),
/// visitor cookies and webhook signatures (operator-chosen secrets of any length: a key longer than
/// SHA-256's 64-byte block is hashed first, as the RFC says). Re-exported here so the server's callers of
/// tokens and signatures need not know the draw module.
pub use rankgate_core::queue::draw::hmac_sha256;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_case_2_shape_and_tokens_are_32_bytes() {
        // RFC 4231 test case 2 uses a 4-byte key; ours are 32, so check the construction with a known
        // 32-byte-key vector instead: HMAC-SHA256(key = 0x0b * 32, "Hi There").
        let mac = hmac_sha256(&[0x0b; 32], b"Hi There");
        assert_eq!(
            mac.iter().map(|b| format!("{b:02x}")).collect::<String>(),
            "198a607eb44bfbc69903a0f1cf2bbdc5ba0aa3f3d9ae3c1c7a3b1696a0b68cf7"
        );
        let secret = TokenSecret::generate().unwrap();
        let prepared = secret.prepare().unwrap();
        let token = secret.token_for(&prepared.nonce);
        assert_eq!(token.len(), 43, "32 bytes in unpadded base64");
        assert!(digest_of(&token).matches(&prepared.digest));
        assert_eq!(format!("{secret:?}"), "TokenSecret(…)");
    }

    #[test]
    fn hmac_matches_rfc_4231_for_short_and_long_keys() {
        let hex = |mac: [u8; 32]| mac.iter().map(|b| format!("{b:02x}")).collect::<String>();
        // RFC 4231 test case 2: a 4-byte key.
        assert_eq!(
            hex(hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // RFC 4231 test case 6: a 131-byte key, hashed first.
        assert_eq!(
            hex(hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }
}
