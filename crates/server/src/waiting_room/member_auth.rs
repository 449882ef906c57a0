//! `[waiting_room] member_auth` and its modes' settings (SPEC 2.2, "Member identity"): what the file
//! says ([`MemberAuthFile`]) and what a running room uses ([`MemberAuth`]), resolved once at start by
//! [`MemberAuth::from_file`]: key files read, gateway keys hashed (the plain keys are dropped from the
//! config), CIDRs parsed, JWT keys loaded. Every error names its key and never shows a secret.
//!
//! ```toml
//! [waiting_room]
//! member_auth = "gateway"                  # "ticket" (default), "gateway" or "jwt"
//! gateway_keys = ["<key>"]                 # gateway: Authorization: Bearer <key> vouches for memberId
//! gateway_key_files = ["/etc/rankgate/gateway-keys"]   # one key per line; blank lines ignored
//! trusted_proxies = ["10.0.0.0/8", "192.0.2.7"]        # gateway: these peers vouch for memberId
//!
//! [waiting_room.jwt]                       # member_auth = "jwt": see `jwt`
//! algorithms = ["EdDSA"]
//! jwks_file = "/etc/rankgate/shop-jwks.json"
//! issuer = "https://shop.example"
//! audience = "rankgate"
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;

use super::jwt::{JwtFile, JwtVerifier};
use crate::http::auth::BearerKeys;
use crate::http::peer::TrustedProxies;

/// The member-identity keys of `[waiting_room]`, as the file gives them. [`MemberAuth::from_file`]
/// takes the secrets out. `Debug` never shows a key.
#[derive(Clone, Default, Deserialize)]
#[serde(default)]
pub struct MemberAuthFile {
    /// `member_auth`: `"ticket"`, `"gateway"` or `"jwt"`; read as text so that a wrong one is refused
    /// naming the key (serde's error for a flattened enum would not).
    pub member_auth: Option<String>,
    /// `gateway_keys`: bearer keys of the shop's gateway.
    pub gateway_keys: Vec<String>,
    /// `gateway_key_files`: files of gateway keys, one per line.
    pub gateway_key_files: Vec<PathBuf>,
    /// `trusted_proxies`: CIDRs (or bare addresses) of the shop's gateways.
    pub trusted_proxies: Vec<String>,
    /// `[waiting_room.jwt]`.
    pub jwt: Option<JwtFile>,
}

impl std::fmt::Debug for MemberAuthFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberAuthFile")
            .field("member_auth", &self.member_auth)
            .field("gateway_keys", &self.gateway_keys.len())
            .field("gateway_key_files", &self.gateway_key_files)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("jwt", &self.jwt)
            .finish()
    }
}

/// How a request proves which member it speaks for: `[waiting_room] member_auth` with its settings. In
/// every mode the member's entry ticket (`X-Queue-Ticket`) and the waiting page's visitor cookie prove
/// the member too (see `identity`).
#[derive(Clone, Default)]
pub enum MemberAuth {
    /// `"ticket"`: only the entry ticket or the visitor cookie.
    #[default]
    Ticket,
    /// `"gateway"`: the shop's gateway vouches for the member id it sends.
    Gateway(GatewayAuth),
    /// `"jwt"`: the `sub` of a JWT the shop signed.
    Jwt(Arc<JwtVerifier>),
}

impl std::fmt::Debug for MemberAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemberAuth::Ticket => f.write_str("Ticket"),
            MemberAuth::Gateway(gateway) => f
                .debug_struct("Gateway")
                .field("gateway_keys", &gateway.keys.len())
                .field("trusted_proxies", &gateway.proxies.len())
                .finish(),
            MemberAuth::Jwt(verifier) => f.debug_tuple("Jwt").field(verifier).finish(),
        }
    }
}

/// `member_auth = "gateway"`'s settings: at least one gateway key or trusted proxy (else every member
/// call would be refused, or worse, a typo would leave ids unchecked).
#[derive(Clone)]
pub struct GatewayAuth {
    keys: BearerKeys,
    proxies: TrustedProxies,
}

impl GatewayAuth {
    /// The settings, or an error naming the keys when both are empty.
    pub fn new(keys: BearerKeys, proxies: TrustedProxies) -> anyhow::Result<GatewayAuth> {
        anyhow::ensure!(
            !keys.is_empty() || !proxies.is_empty(),
            "waiting_room.member_auth = \"gateway\" needs waiting_room.gateway_keys, \
             waiting_room.gateway_key_files or waiting_room.trusted_proxies: with none of them no request \
             could prove a member"
        );
        Ok(GatewayAuth { keys, proxies })
    }

    /// Whether `key` (an `Authorization: Bearer` credential) is a gateway key.
    #[must_use]
    pub fn accepts_key(&self, key: &str) -> bool {
        !self.keys.is_empty() && self.keys.accepts(key)
    }

    /// Whether requests from `peer` come from a trusted proxy.
    #[must_use]
    pub fn trusts(&self, peer: std::net::IpAddr) -> bool {
        self.proxies.contains(peer)
    }
}

impl MemberAuth {
    /// The settings `file` describes; takes its secrets (gateway keys, the JWT secret) out of it, so the
    /// config keeps only hashes and parsed keys.
    pub fn from_file(file: &mut MemberAuthFile) -> anyhow::Result<MemberAuth> {
        let mode = file.member_auth.as_deref().unwrap_or("ticket");
        let gateway_keys = std::mem::take(&mut file.gateway_keys);
        let jwt_secret = file.jwt.as_mut().and_then(|jwt| jwt.secret.take());
        let proxies = TrustedProxies::parse("waiting_room.trusted_proxies", &file.trusted_proxies)?;
        match mode {
            "ticket" => Ok(MemberAuth::Ticket),
            "gateway" => {
                let mut keys = gateway_keys;
                for (index, path) in file.gateway_key_files.iter().enumerate() {
                    let text = std::fs::read_to_string(path).map_err(|error| {
                        anyhow::anyhow!(
                            "waiting_room.gateway_key_files[{index}]: reading {}: {error}",
                            path.display()
                        )
                    })?;
                    let before = keys.len();
                    keys.extend(
                        text.lines()
                            .map(str::trim)
                            .filter(|line| !line.is_empty())
                            .map(str::to_owned),
                    );
                    anyhow::ensure!(
                        keys.len() > before,
                        "waiting_room.gateway_key_files[{index}]: {} holds no key (one key per line)",
                        path.display()
                    );
                }
                Ok(MemberAuth::Gateway(GatewayAuth::new(
                    BearerKeys::from_plain(&keys),
                    proxies,
                )?))
            }
            "jwt" => {
                let Some(jwt) = file.jwt.as_ref() else {
                    anyhow::bail!(
                        "waiting_room.member_auth = \"jwt\" needs a [waiting_room.jwt] table (algorithms and \
                         a key)"
                    );
                };
                let mut jwt = jwt.clone();
                jwt.secret = jwt_secret;
                Ok(MemberAuth::Jwt(Arc::new(JwtVerifier::load(&jwt)?)))
            }
            other => anyhow::bail!(
                "waiting_room.member_auth: {other:?} is not a mode; use \"ticket\", \"gateway\" or \"jwt\""
            ),
        }
    }

    /// The mode's name as the config spells it.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            MemberAuth::Ticket => "ticket",
            MemberAuth::Gateway(_) => "gateway",
            MemberAuth::Jwt(_) => "jwt",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn resolve(text: &str) -> anyhow::Result<MemberAuth> {
        let mut file: MemberAuthFile = toml::from_str(text).expect("valid TOML");
        MemberAuth::from_file(&mut file)
    }

    fn error_of(text: &str) -> String {
        format!("{:#}", resolve(text).expect_err(text))
    }

    const SECRET: &str = "0123456789abcdef0123456789abcdef-secret";

    #[test]
    fn ticket_is_the_default_and_an_unknown_mode_is_refused_naming_the_key() {
        assert_eq!(resolve("").unwrap().name(), "ticket");
        assert_eq!(resolve("member_auth = \"ticket\"").unwrap().name(), "ticket");
        for mode in ["none", "Gateway", ""] {
            let error = error_of(&format!("member_auth = \"{mode}\""));
            assert!(error.starts_with("waiting_room.member_auth: "), "{error}");
        }
    }

    #[test]
    fn gateway_needs_a_key_or_a_proxy_and_names_the_keys() {
        let error = error_of("member_auth = \"gateway\"");
        for key in ["gateway_keys", "gateway_key_files", "trusted_proxies"] {
            assert!(error.contains(key), "{error}");
        }
        let MemberAuth::Gateway(gateway) =
            resolve("member_auth = \"gateway\"\ngateway_keys = [\"gw-1\"]").unwrap()
        else {
            panic!("gateway")
        };
        assert!(gateway.accepts_key("gw-1") && !gateway.accepts_key("gw-2"));
        assert!(!gateway.trusts("127.0.0.1".parse().unwrap()));
        let MemberAuth::Gateway(gateway) =
            resolve("member_auth = \"gateway\"\ntrusted_proxies = [\"10.0.0.0/8\"]").unwrap()
        else {
            panic!("gateway")
        };
        assert!(gateway.trusts("10.9.9.9".parse().unwrap()));
        assert!(!gateway.accepts_key(""), "no key configured accepts nothing");
        let error = error_of("member_auth = \"gateway\"\ntrusted_proxies = [\"10.0.0.0/8\", \"nope\"]");
        assert!(error.starts_with("waiting_room.trusted_proxies[1]: "), "{error}");
    }

    #[test]
    fn gateway_key_files_hold_one_key_per_line_and_a_missing_one_is_named() {
        let mut keys = tempfile::NamedTempFile::new().unwrap();
        writeln!(keys, "  gw-a \n\n gw-b").unwrap();
        let text = format!(
            "member_auth = \"gateway\"\ngateway_key_files = [{:?}]",
            keys.path()
        );
        let mut file: MemberAuthFile = toml::from_str(&text).unwrap();
        let MemberAuth::Gateway(gateway) = MemberAuth::from_file(&mut file).unwrap() else {
            panic!("gateway")
        };
        assert!(gateway.accepts_key("gw-a") && gateway.accepts_key("gw-b"));
        let error = error_of("member_auth = \"gateway\"\ngateway_key_files = [\"/nonexistent/keys\"]");
        assert!(
            error.starts_with("waiting_room.gateway_key_files[0]: "),
            "{error}"
        );
        let empty = tempfile::NamedTempFile::new().unwrap();
        let error = error_of(&format!(
            "member_auth = \"gateway\"\ngateway_key_files = [{:?}]",
            empty.path()
        ));
        assert!(error.contains("no key"), "{error}");
    }

    #[test]
    fn the_plain_secrets_leave_the_config_and_never_show_in_debug() {
        let mut file: MemberAuthFile = toml::from_str(&format!(
            "member_auth = \"gateway\"\ngateway_keys = [\"gw-topsecret\"]\n[jwt]\nsecret = \"{SECRET}\""
        ))
        .unwrap();
        assert!(!format!("{file:?}").contains("topsecret"));
        assert!(!format!("{file:?}").contains(SECRET));
        let auth = MemberAuth::from_file(&mut file).unwrap();
        assert!(file.gateway_keys.is_empty(), "hashed, then dropped");
        assert!(file.jwt.as_ref().unwrap().secret.is_none());
        assert!(!format!("{auth:?}").contains("topsecret"));

        let auth = resolve(&format!(
            "member_auth = \"jwt\"\n[jwt]\nalgorithms = [\"HS256\"]\nsecret = \"{SECRET}\""
        ))
        .unwrap();
        assert!(!format!("{auth:?}").contains(SECRET), "{auth:?}");
    }

    #[test]
    fn jwt_settings_are_checked_naming_the_key_and_never_the_secret() {
        let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jwt");
        let ed_public = format!("{fixtures}/ed25519-a.pub.pem");
        let cases: Vec<(String, &str)> = vec![
            (
                "member_auth = \"jwt\"".into(),
                "waiting_room.member_auth = \"jwt\" needs a [waiting_room.jwt] table",
            ),
            (
                format!("member_auth = \"jwt\"\n[jwt]\nsecret = \"{SECRET}\""),
                "waiting_room.jwt.algorithms: required",
            ),
            (
                format!("member_auth = \"jwt\"\n[jwt]\nalgorithms = [\"HS512\"]\nsecret = \"{SECRET}\""),
                "waiting_room.jwt.algorithms[0]: ",
            ),
            (
                "member_auth = \"jwt\"\n[jwt]\nalgorithms = [\"HS256\"]".into(),
                "waiting_room.jwt: no key",
            ),
            (
                format!(
                    "member_auth = \"jwt\"\n[jwt]\nalgorithms = [\"HS256\"]\nsecret = \"{SECRET}\"\n\
                     jwks_file = \"/x\""
                ),
                "waiting_room.jwt: waiting_room.jwt.secret and waiting_room.jwt.jwks_file both given",
            ),
            (
                "member_auth = \"jwt\"\n[jwt]\nalgorithms = [\"HS256\"]\nsecret = \"short-secret\"".into(),
                "waiting_room.jwt.secret: the secret must be at least 32 bytes",
            ),
            (
                format!("member_auth = \"jwt\"\n[jwt]\nalgorithms = [\"RS256\"]\nsecret = \"{SECRET}\""),
                "waiting_room.jwt.algorithms: with waiting_room.jwt.secret",
            ),
            (
                format!("member_auth = \"jwt\"\n[jwt]\nalgorithms = [\"HS256\", \"EdDSA\"]\npublic_key_file = {ed_public:?}"),
                "waiting_room.jwt.algorithms: \"HS256\" needs secret",
            ),
            (
                format!("member_auth = \"jwt\"\n[jwt]\nalgorithms = [\"RS256\"]\npublic_key_file = {ed_public:?}"),
                "waiting_room.jwt.public_key_file: not a PEM public key for RS256",
            ),
            (
                "member_auth = \"jwt\"\n[jwt]\nalgorithms = [\"EdDSA\"]\njwks_file = \"/nonexistent/jwks.json\""
                    .into(),
                "waiting_room.jwt.jwks_file: ",
            ),
            (
                "member_auth = \"jwt\"\n[jwt]\nalgorithms = [\"HS256\"]\nsecret_file = \"/nonexistent/secret\""
                    .into(),
                "waiting_room.jwt.secret_file: ",
            ),
            (
                format!(
                    "member_auth = \"jwt\"\n[jwt]\nalgorithms = [\"HS256\"]\nsecret = \"{SECRET}\"\n\
                     leeway_seconds = 601"
                ),
                "waiting_room.jwt.leeway_seconds must be 0 to 600",
            ),
            (
                format!(
                    "member_auth = \"jwt\"\n[jwt]\nalgorithms = [\"HS256\"]\nsecret = \"{SECRET}\"\nissuer = \" \""
                ),
                "waiting_room.jwt.issuer: must not be empty",
            ),
        ];
        for (text, expected) in cases {
            let error = error_of(&text);
            assert!(error.starts_with(expected), "{text}\n=> {error}");
            assert!(!error.contains(SECRET), "{error}");
        }
        // A misspelt key in the table is refused rather than leaving a check off.
        let misspelt = toml::from_str::<MemberAuthFile>("[jwt]\nissuers = \"x\"");
        assert!(misspelt.is_err());
        // Each accepted algorithm with its key kind.
        for (algorithm, key) in [("EdDSA", "ed25519-a.pub.pem"), ("ES256", "es256.pub.pem")] {
            let auth = resolve(&format!(
                "member_auth = \"jwt\"\n[jwt]\nalgorithms = [\"{algorithm}\"]\npublic_key_file = \
                 \"{fixtures}/{key}\"\nissuer = \"shop\"\naudience = \"rankgate\""
            ));
            assert_eq!(auth.map(|auth| auth.name()).unwrap(), "jwt", "{algorithm}");
        }
    }
}
