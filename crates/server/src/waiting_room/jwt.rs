//! `member_auth = "jwt"` (SPEC 2.2, "Member identity"): the member is the `sub` of a JWT the shop signed,
//! sent as `Authorization: Bearer <JWT>`.
//!
//! [`JwtVerifier::load`] reads `[waiting_room.jwt]` once at start (errors name the key, never a secret):
//! the accepted `algorithms` (HS256, RS256, ES256, EdDSA), exactly one key source (`secret`,
//! `secret_file`, `public_key_file` or `jwks_file`), `issuer`, `audience` and `leeway_seconds`.
//! [`JwtVerifier::verify`] then checks a token: its header's `alg` must be one of `algorithms` (so
//! `alg: none` and an HS256 token against a public key are refused before any key is tried), its
//! signature one of the keys' (a JWKS key by `kid` when the token names one), `exp` must be present and
//! in the future, `nbf` (when present) past, `iss` / `aud` equal to the configured ones (required when
//! configured), all within `leeway_seconds`; the member id is `sub`.
//!
//! Keys rotate without a restart: a key file is stat'ed again at most once a second (the first request
//! after the second has passed does it; the others do not wait for it) and re-read when its modification
//! time or length changed. A file that no longer parses keeps the keys that worked, and the start's log
//! line says so: a half-written JWKS must not lock every member out.
//!
//! The crate is `jsonwebtoken` with its pure-Rust RustCrypto backend (ARCHITECTURE.md says why).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::RwLock;
use serde::Deserialize;

use crate::config::bounded;

/// Default `leeway_seconds`: clock skew tolerated on `exp` and `nbf`.
pub const DEFAULT_LEEWAY_SECONDS: u64 = 60;
/// Shortest HS256 secret: RFC 7518 3.2 asks for a key at least as long as the hash (256 bits).
pub const MIN_SECRET_BYTES: usize = 32;
/// How often a key file is looked at again (ms).
const RECHECK_MILLIS: u64 = 1000;

/// `[waiting_room.jwt]` as the file gives it. A key it does not know is refused: a misspelt `issuer`
/// would silently accept every issuer. `Debug` never shows the secret.
#[derive(Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtFile {
    /// Accepted `alg`s: a subset of `HS256`, `RS256`, `ES256`, `EdDSA`.
    pub algorithms: Vec<String>,
    /// The HS256 secret itself (prefer `secret_file`).
    pub secret: Option<String>,
    /// A file holding the HS256 secret (surrounding whitespace ignored).
    pub secret_file: Option<PathBuf>,
    /// A PEM public key (RSA, P-256 or Ed25519; PKCS#8 / SPKI).
    pub public_key_file: Option<PathBuf>,
    /// A JWKS (JSON Web Key Set) file, e.g. the shop's `/.well-known/jwks.json` saved by a sidecar.
    pub jwks_file: Option<PathBuf>,
    /// The `iss` every token must carry; unchecked when absent.
    pub issuer: Option<String>,
    /// The `aud` every token must carry; unchecked when absent.
    pub audience: Option<String>,
    /// Clock skew tolerated on `exp` and `nbf` (s, 0..=600).
    pub leeway_seconds: Option<u64>,
}

impl std::fmt::Debug for JwtFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtFile")
            .field("algorithms", &self.algorithms)
            .field("secret", &self.secret.as_ref().map(|_| "(hidden)"))
            .field("secret_file", &self.secret_file)
            .field("public_key_file", &self.public_key_file)
            .field("jwks_file", &self.jwks_file)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("leeway_seconds", &self.leeway_seconds)
            .finish()
    }
}

/// Why a token proves nobody; each is a 401 whose message starts with `Authorization:` and never
/// repeats the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JwtRefusal {
    /// Not three base64url parts with a JSON header, or an `alg` rankgate does not know (`none`).
    Malformed,
    /// An `alg` outside `algorithms`.
    AlgorithmNotAccepted,
    /// No configured key has the token's `kid` (and `alg`).
    UnknownKey,
    /// No configured key made this signature.
    BadSignature,
    /// `exp` is past (beyond the leeway).
    Expired,
    /// `nbf` is still ahead (beyond the leeway).
    NotYetValid,
    /// `iss` is not the configured issuer.
    WrongIssuer,
    /// `aud` is not the configured audience.
    WrongAudience,
    /// A required claim (`exp`, `sub`, and `iss` / `aud` when configured) is missing or not of its type.
    MissingClaim,
}

impl JwtRefusal {
    /// The 401's message.
    #[must_use]
    pub fn message(self) -> &'static str {
        match self {
            JwtRefusal::Malformed => {
                "Authorization: the bearer credential is not a JWT this waiting room accepts (malformed, or \
                 an alg such as none); send `Authorization: Bearer <JWT>` signed by the shop"
            }
            JwtRefusal::AlgorithmNotAccepted => {
                "Authorization: the JWT's alg is not one of waiting_room.jwt.algorithms"
            }
            JwtRefusal::UnknownKey => "Authorization: the JWT names a key (kid) or alg no configured key has",
            JwtRefusal::BadSignature => {
                "Authorization: the JWT's signature is not the shop's (wrong key, or tampered with)"
            }
            JwtRefusal::Expired => "Authorization: the JWT has expired (exp); get a fresh one from the shop",
            JwtRefusal::NotYetValid => "Authorization: the JWT is not valid yet (nbf)",
            JwtRefusal::WrongIssuer => "Authorization: the JWT's iss is not waiting_room.jwt.issuer",
            JwtRefusal::WrongAudience => "Authorization: the JWT's aud is not waiting_room.jwt.audience",
            JwtRefusal::MissingClaim => {
                "Authorization: the JWT lacks a required claim (exp, sub, and iss / aud when configured) or \
                 has one of the wrong type"
            }
        }
    }
}

/// One verifying key, with the `kid` and `alg` it answers to.
#[derive(Clone)]
struct VerifyingKey {
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

/// The keys of one load, and what the file looked like then.
struct LoadedKeys {
    keys: Vec<VerifyingKey>,
    stamp: Option<FileStamp>,
}

/// A key file's modification time and length: a change of either means it was rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
}

impl FileStamp {
    fn of(path: &Path) -> std::io::Result<FileStamp> {
        let metadata = std::fs::metadata(path)?;
        Ok(FileStamp {
            modified: metadata.modified().ok(),
            len: metadata.len(),
        })
    }
}

/// Where the keys come from.
#[derive(Debug, Clone)]
enum KeySource {
    /// `secret`: fixed for the process's life.
    InlineSecret,
    /// `secret_file`.
    SecretFile(PathBuf),
    /// `public_key_file`, holding a key of the one asymmetric algorithm configured.
    PublicKeyFile(PathBuf),
    /// `jwks_file`.
    JwksFile(PathBuf),
}

impl KeySource {
    fn file(&self) -> Option<&Path> {
        match self {
            KeySource::InlineSecret => None,
            KeySource::SecretFile(path) | KeySource::PublicKeyFile(path) | KeySource::JwksFile(path) => {
                Some(path)
            }
        }
    }

    /// The config key naming this source, for messages.
    fn key_name(&self) -> &'static str {
        match self {
            KeySource::InlineSecret => "waiting_room.jwt.secret",
            KeySource::SecretFile(_) => "waiting_room.jwt.secret_file",
            KeySource::PublicKeyFile(_) => "waiting_room.jwt.public_key_file",
            KeySource::JwksFile(_) => "waiting_room.jwt.jwks_file",
        }
    }
}

/// Checks members' JWTs against the shop's keys (module docs). `Debug` shows where the keys come from and
/// how many there are, never a key.
pub struct JwtVerifier {
    algorithms: Vec<Algorithm>,
    issuer: Option<String>,
    audience: Option<String>,
    leeway_seconds: u64,
    source: KeySource,
    /// Swapped whole when the file changes: a request holds the read lock only to pick its keys'
    /// `Arc`, never while verifying.
    keys: RwLock<Arc<LoadedKeys>>,
    /// When the key file is next looked at, in ms since `started`: an atomic so that between checks a
    /// verification costs one load, and exactly one request wins each second's check.
    next_check_ms: AtomicU64,
    started: Instant,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("algorithms", &self.algorithms)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("leeway_seconds", &self.leeway_seconds)
            .field("source", &self.source.key_name())
            .field("file", &self.source.file())
            .field("keys", &self.keys.read().keys.len())
            .finish()
    }
}

/// A configured algorithm by its JOSE name.
fn algorithm_named(name: &str) -> Option<Algorithm> {
    match name {
        "HS256" => Some(Algorithm::HS256),
        "RS256" => Some(Algorithm::RS256),
        "ES256" => Some(Algorithm::ES256),
        "EdDSA" => Some(Algorithm::EdDSA),
        _ => None,
    }
}

impl JwtVerifier {
    /// Reads and checks `[waiting_room.jwt]` and its key file; errors name the key.
    pub fn load(file: &JwtFile) -> anyhow::Result<JwtVerifier> {
        anyhow::ensure!(
            !file.algorithms.is_empty(),
            "waiting_room.jwt.algorithms: required; list the algorithms the shop signs with, from \
             \"HS256\", \"RS256\", \"ES256\", \"EdDSA\""
        );
        let mut algorithms = Vec::new();
        for (index, name) in file.algorithms.iter().enumerate() {
            let algorithm = algorithm_named(name).ok_or_else(|| {
                anyhow::anyhow!(
                    "waiting_room.jwt.algorithms[{index}]: {name:?} is not one of \"HS256\", \"RS256\", \
                     \"ES256\", \"EdDSA\""
                )
            })?;
            if !algorithms.contains(&algorithm) {
                algorithms.push(algorithm);
            }
        }
        let sources = [
            file.secret.as_ref().map(|_| KeySource::InlineSecret),
            file.secret_file.clone().map(KeySource::SecretFile),
            file.public_key_file.clone().map(KeySource::PublicKeyFile),
            file.jwks_file.clone().map(KeySource::JwksFile),
        ];
        let mut sources = sources.into_iter().flatten();
        let source = match (sources.next(), sources.next()) {
            (Some(source), None) => source,
            (None, _) => anyhow::bail!(
                "waiting_room.jwt: no key; set one of secret / secret_file (HS256), public_key_file (a PEM \
                 public key) or jwks_file (a JWKS)"
            ),
            (Some(first), Some(second)) => anyhow::bail!(
                "waiting_room.jwt: {} and {} both given; set exactly one key source",
                first.key_name(),
                second.key_name()
            ),
        };
        let hmac = matches!(source, KeySource::InlineSecret | KeySource::SecretFile(_));
        if hmac {
            anyhow::ensure!(
                algorithms == [Algorithm::HS256],
                "waiting_room.jwt.algorithms: with {} the only algorithm is \"HS256\" (a secret cannot check \
                 RS256, ES256 or EdDSA signatures)",
                source.key_name()
            );
        } else {
            anyhow::ensure!(
                !algorithms.contains(&Algorithm::HS256),
                "waiting_room.jwt.algorithms: \"HS256\" needs secret or secret_file, not {} (accepting HS256 \
                 with a public key would let anyone who has the public key sign)",
                source.key_name()
            );
        }
        if let KeySource::PublicKeyFile(_) = source {
            anyhow::ensure!(
                algorithms.len() == 1,
                "waiting_room.jwt.algorithms: public_key_file holds one key of one algorithm; list that one \
                 (or use jwks_file for several)"
            );
        }
        let leeway_seconds = bounded(
            "waiting_room.jwt.leeway_seconds",
            file.leeway_seconds.unwrap_or(DEFAULT_LEEWAY_SECONDS),
            0..=600,
        )?;
        for (key, value) in [
            ("waiting_room.jwt.issuer", &file.issuer),
            ("waiting_room.jwt.audience", &file.audience),
        ] {
            match value {
                Some(value) => anyhow::ensure!(!value.trim().is_empty(), "{key}: must not be empty"),
                None => tracing::warn!(
                    key,
                    "member_auth = \"jwt\" without {key}: tokens are accepted whatever that claim says"
                ),
            }
        }
        let keys = load_keys(&source, file.secret.as_deref(), &algorithms)?;
        Ok(JwtVerifier {
            algorithms,
            issuer: file.issuer.clone(),
            audience: file.audience.clone(),
            leeway_seconds,
            source,
            keys: RwLock::new(Arc::new(keys)),
            next_check_ms: AtomicU64::new(RECHECK_MILLIS),
            started: Instant::now(),
        })
    }

    /// The member id (`sub`) of a token that verifies, or why it does not.
    pub fn verify(&self, token: &str) -> Result<String, JwtRefusal> {
        self.reload_if_changed();
        let header = jsonwebtoken::decode_header(token).map_err(|_| JwtRefusal::Malformed)?;
        if !self.algorithms.contains(&header.alg) {
            return Err(JwtRefusal::AlgorithmNotAccepted);
        }
        let keys = Arc::clone(&self.keys.read());
        let candidates: Vec<&VerifyingKey> = keys
            .keys
            .iter()
            .filter(|key| key.algorithm == header.alg)
            .filter(|key| match (&header.kid, &key.kid) {
                (Some(wanted), Some(kid)) => wanted == kid,
                _ => true,
            })
            .collect();
        if candidates.is_empty() {
            return Err(JwtRefusal::UnknownKey);
        }
        let validation = self.validation(header.alg);
        let mut refusal = JwtRefusal::BadSignature;
        for candidate in candidates {
            match jsonwebtoken::decode::<Claims>(token, &candidate.key, &validation) {
                Ok(data) => return Ok(data.claims.sub),
                Err(error) => {
                    refusal = refusal_of(error.kind());
                    // Any other refusal came after the signature verified: this was the key.
                    if refusal != JwtRefusal::BadSignature {
                        break;
                    }
                }
            }
        }
        Err(refusal)
    }

    fn validation(&self, algorithm: Algorithm) -> Validation {
        let mut validation = Validation::new(algorithm);
        validation.leeway = self.leeway_seconds;
        validation.validate_nbf = true;
        let mut required = vec!["exp", "sub"];
        match &self.issuer {
            Some(issuer) => {
                validation.set_issuer(&[issuer]);
                required.push("iss");
            }
            None => validation.iss = None,
        }
        match &self.audience {
            Some(audience) => {
                validation.set_audience(&[audience]);
                required.push("aud");
            }
            // Without a configured audience a token's `aud` is not judged (jsonwebtoken would refuse
            // every token that carries one).
            None => validation.validate_aud = false,
        }
        validation.set_required_spec_claims(&required);
        validation
    }

    /// Re-reads the key file when a second has passed since the last look and it changed (module docs).
    /// The stat is a blocking call on an async worker, once a second per instance: microseconds, not
    /// worth a thread hop.
    fn reload_if_changed(&self) {
        let Some(path) = self.source.file() else {
            return;
        };
        let now_ms = self.started.elapsed().as_millis() as u64;
        let due = self.next_check_ms.load(Ordering::Relaxed);
        if now_ms < due
            || self
                .next_check_ms
                .compare_exchange(due, now_ms + RECHECK_MILLIS, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let stamp = FileStamp::of(path).ok();
        if stamp.is_none() || stamp == self.keys.read().stamp {
            return;
        }
        match load_keys(&self.source, None, &self.algorithms) {
            Ok(keys) => {
                tracing::info!(
                    key = self.source.key_name(),
                    file = %path.display(),
                    keys = keys.keys.len(),
                    "member JWT keys reloaded"
                );
                *self.keys.write() = Arc::new(keys);
            }
            Err(error) => {
                // Remember the new stamp anyway, so a broken file is reported once, not every second.
                let mut current = self.keys.write();
                let kept = LoadedKeys {
                    keys: current.keys.clone(),
                    stamp,
                };
                *current = Arc::new(kept);
                tracing::error!(
                    error = %format!("{error:#}"),
                    "member JWT keys not reloaded; the previous keys stay in use"
                );
            }
        }
    }
}

/// The claims rankgate reads; jsonwebtoken checks `exp`, `nbf`, `iss` and `aud` itself.
#[derive(Deserialize)]
struct Claims {
    sub: String,
}

fn refusal_of(kind: &jsonwebtoken::errors::ErrorKind) -> JwtRefusal {
    use jsonwebtoken::errors::ErrorKind;
    match kind {
        ErrorKind::InvalidSignature
        | ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidEddsaKey
        | ErrorKind::InvalidRsaKey(_)
        | ErrorKind::InvalidKeyFormat => JwtRefusal::BadSignature,
        ErrorKind::ExpiredSignature => JwtRefusal::Expired,
        ErrorKind::ImmatureSignature => JwtRefusal::NotYetValid,
        ErrorKind::InvalidIssuer => JwtRefusal::WrongIssuer,
        ErrorKind::InvalidAudience => JwtRefusal::WrongAudience,
        ErrorKind::MissingRequiredClaim(_) | ErrorKind::InvalidClaimFormat(_) | ErrorKind::Json(_) => {
            JwtRefusal::MissingClaim
        }
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => JwtRefusal::AlgorithmNotAccepted,
        _ => JwtRefusal::Malformed,
    }
}

/// The keys of `source`: `secret` is the inline secret (only for [`KeySource::InlineSecret`], only at
/// start). Errors name the config key and never show key material.
fn load_keys(
    source: &KeySource,
    secret: Option<&str>,
    algorithms: &[Algorithm],
) -> anyhow::Result<LoadedKeys> {
    let key_name = source.key_name();
    let (stamp, bytes) = match source.file() {
        None => (None, Vec::new()),
        Some(path) => {
            let stamp = FileStamp::of(path)
                .map_err(|error| anyhow::anyhow!("{key_name}: {}: {error}", path.display()))?;
            let bytes = std::fs::read(path)
                .map_err(|error| anyhow::anyhow!("{key_name}: reading {}: {error}", path.display()))?;
            (Some(stamp), bytes)
        }
    };
    let keys = match source {
        KeySource::InlineSecret | KeySource::SecretFile(_) => {
            let text = match source {
                KeySource::InlineSecret => secret.unwrap_or_default().to_owned(),
                _ => String::from_utf8(bytes)
                    .map_err(|_| anyhow::anyhow!("{key_name}: the file is not UTF-8 text"))?,
            };
            let secret = text.trim();
            anyhow::ensure!(
                secret.len() >= MIN_SECRET_BYTES,
                "{key_name}: the secret must be at least {MIN_SECRET_BYTES} bytes (RFC 7518 3.2), got {}",
                secret.len()
            );
            vec![VerifyingKey {
                kid: None,
                algorithm: Algorithm::HS256,
                key: DecodingKey::from_secret(secret.as_bytes()),
            }]
        }
        KeySource::PublicKeyFile(_) => {
            let algorithm = algorithms[0];
            let key = match algorithm {
                Algorithm::RS256 => DecodingKey::from_rsa_pem(&bytes),
                Algorithm::ES256 => DecodingKey::from_ec_pem(&bytes),
                _ => DecodingKey::from_ed_pem(&bytes),
            }
            .map_err(|_| {
                anyhow::anyhow!(
                    "{key_name}: not a PEM public key for {algorithm:?} (waiting_room.jwt.algorithms); give the \
                     public key (\"-----BEGIN PUBLIC KEY-----\") of the key the shop signs with"
                )
            })?;
            vec![VerifyingKey {
                kid: None,
                algorithm,
                key,
            }]
        }
        KeySource::JwksFile(_) => jwks_keys(key_name, &bytes, algorithms)?,
    };
    Ok(LoadedKeys { keys, stamp })
}

/// The keys of a JWKS usable with `algorithms`; keys of other algorithms are skipped, none left is an
/// error.
fn jwks_keys(key_name: &str, bytes: &[u8], algorithms: &[Algorithm]) -> anyhow::Result<Vec<VerifyingKey>> {
    // serde_json's error gives a line and column, never the file's content.
    let set: JwkSet = serde_json::from_slice(bytes)
        .map_err(|error| anyhow::anyhow!("{key_name}: not a JWKS ({{\"keys\": [...]}}): {error}"))?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        let inferred = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
            AlgorithmParameters::EllipticCurve(params) if params.curve == EllipticCurve::P256 => {
                Some(Algorithm::ES256)
            }
            AlgorithmParameters::OctetKeyPair(params) if params.curve == EllipticCurve::Ed25519 => {
                Some(Algorithm::EdDSA)
            }
            _ => None,
        };
        let declared = match jwk.common.key_algorithm {
            Some(KeyAlgorithm::RS256) => Some(Algorithm::RS256),
            Some(KeyAlgorithm::ES256) => Some(Algorithm::ES256),
            Some(KeyAlgorithm::EdDSA) => Some(Algorithm::EdDSA),
            Some(_) => None,
            None => inferred,
        };
        let Some(algorithm) = declared.filter(|algorithm| Some(*algorithm) == inferred) else {
            continue;
        };
        if !algorithms.contains(&algorithm) {
            continue;
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|_| {
            anyhow::anyhow!(
                "{key_name}: key {} is not a valid {algorithm:?} public key",
                jwk.common.key_id.as_deref().unwrap_or("(no kid)")
            )
        })?;
        keys.push(VerifyingKey {
            kid: jwk.common.key_id.clone(),
            algorithm,
            key,
        });
    }
    anyhow::ensure!(
        !keys.is_empty(),
        "{key_name}: no key in the set is usable with waiting_room.jwt.algorithms {algorithms:?}"
    );
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::{json, Value};

    use super::*;

    const SECRET: &str = "a-shop-secret-that-is-32-bytes-long!";
    /// In the table below: the token verifies (an `exp` within the leeway).
    const VERIFIES: Option<JwtRefusal> = None;

    fn verifier(issuer: Option<&str>, audience: Option<&str>) -> JwtVerifier {
        JwtVerifier::load(&JwtFile {
            algorithms: vec!["HS256".into()],
            secret: Some(SECRET.into()),
            issuer: issuer.map(str::to_owned),
            audience: audience.map(str::to_owned),
            leeway_seconds: Some(5),
            ..JwtFile::default()
        })
        .unwrap()
    }

    fn now() -> i64 {
        jiff::Timestamp::now().as_second()
    }

    fn signed(secret: &str, claims: &Value) -> String {
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    #[test]
    fn each_way_a_token_fails_has_its_own_refusal() {
        let checked = verifier(Some("shop"), Some("rankgate"));
        let good = json!({ "sub": "m-1", "exp": now() + 60, "iss": "shop", "aud": "rankgate" });
        assert_eq!(checked.verify(&signed(SECRET, &good)).as_deref(), Ok("m-1"));
        let with = |key: &str, value: Value| {
            let mut claims = good.clone();
            claims[key] = value;
            signed(SECRET, &claims)
        };
        let without = |key: &str| {
            let mut claims = good.clone();
            claims.as_object_mut().unwrap().remove(key);
            signed(SECRET, &claims)
        };
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(good.to_string())
        );
        let hs384 = jsonwebtoken::encode(
            &Header::new(Algorithm::HS384),
            &good,
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap();
        for (token, refusal) in [
            (with("exp", json!(now() - 60)), Some(JwtRefusal::Expired)),
            (with("exp", json!(now() - 3)), VERIFIES),
            (with("nbf", json!(now() + 60)), Some(JwtRefusal::NotYetValid)),
            (with("iss", json!("evil")), Some(JwtRefusal::WrongIssuer)),
            (with("aud", json!("other")), Some(JwtRefusal::WrongAudience)),
            (with("sub", json!(7)), Some(JwtRefusal::MissingClaim)),
            (without("exp"), Some(JwtRefusal::MissingClaim)),
            (without("sub"), Some(JwtRefusal::MissingClaim)),
            (without("iss"), Some(JwtRefusal::MissingClaim)),
            (
                signed("another-secret-that-is-32-bytes-long", &good),
                Some(JwtRefusal::BadSignature),
            ),
            (none, Some(JwtRefusal::Malformed)),
            (hs384, Some(JwtRefusal::AlgorithmNotAccepted)),
            ("garbage".to_owned(), Some(JwtRefusal::Malformed)),
        ] {
            match (checked.verify(&token), refusal) {
                (Ok(_), VERIFIES) => {}
                (Err(got), expected) => {
                    assert_eq!(Some(got), expected, "{token}");
                    assert!(got.message().starts_with("Authorization: "));
                    assert!(!got.message().contains(&token));
                }
                (Ok(sub), expected) => panic!("{token} verified as {sub}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn without_issuer_and_audience_those_claims_are_not_judged() {
        let open = verifier(None, None);
        let claims = json!({ "sub": "m-1", "exp": now() + 60, "iss": "anyone", "aud": "anything" });
        assert_eq!(open.verify(&signed(SECRET, &claims)).as_deref(), Ok("m-1"));
    }
}
