//! `[[webhook]]` tables: parsed and checked once, at start, with errors that name the key.
//!
//! ```toml
//! [[webhook]]
//! name = "toys-top-10"                 # 1–64 of [A-Za-z0-9_-]; unique; part of every delivery id
//! url = "https://shop.example/hooks/rankings"   # http or https, no user:password@
//! secret = "…"                         # 16–512 bytes; signs every delivery (or secret_file = "/path");
//!                                      # `whsec_<base64>` (Standard Webhooks) signs with the decoded bytes
//! ranker = "popular"                   # the watched ranking, as `GET …/top` takes it:
//! category = "toys"                    #   category or "all"
//! period = "daily"                     #   or window = "7d"; always the current period / window
//! limit = 10                           #   the top N watched, 1–1000
//! events = ["entered", "left", "moved"]  # which kinds are posted (default: all three)
//! timeout_millis = 5000                # per attempt, 100–60000
//! max_attempts = 8                     # 1–100, then the delivery is dead-lettered
//! retry_base_millis = 1000             # capped exponential backoff with jitter: base × 2^(n−1) …
//! retry_max_millis = 300000            # … up to this
//! ```
//!
//! The secret never leaves this module in readable form except to sign: `Debug` hides it, errors never
//! quote it (nor a decoder's message, which would name a byte of it), and it is not written to any store
//! (deliveries are signed when they are sent).
//!
//! **Two keys from one secret.** The Standard Webhooks signature (`webhook-signature`) is keyed as the
//! standard says: a `whsec_<base64>` secret by its decoded bytes, so the receiver can hand the same string
//! to any Standard Webhooks library; any other secret by its UTF-8 bytes (a library's `from_bytes`). The
//! older `X-Rankgate-Signature` stays keyed by the secret as written, whatever its form, so receivers that
//! check it today keep working unchanged.

use std::path::PathBuf;

use serde::Deserialize;

use rankgate_core::ids::CategoryOrAll;
use rankgate_core::job::RetryPolicy;
use rankgate_core::period::Zone;
use rankgate_core::read::{parse_read_query, ReadContext, ReadEndpoint};

/// A kind of change in a watched top N.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    /// A product is in the top N now and was not before.
    Entered,
    /// A product was in the top N and is not any more.
    Left,
    /// A product is in the top N before and after, at another rank.
    Moved,
}

impl ChangeKind {
    fn parse(raw: &str) -> Option<ChangeKind> {
        match raw {
            "entered" => Some(ChangeKind::Entered),
            "left" => Some(ChangeKind::Left),
            "moved" => Some(ChangeKind::Moved),
            _ => None,
        }
    }
}

/// One `[[webhook]]` table as written (every key checked by [`WebhookConfig::from_file`]).
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookFile {
    name: Option<String>,
    url: Option<String>,
    secret: Option<String>,
    secret_file: Option<PathBuf>,
    ranker: Option<String>,
    category: Option<String>,
    period: Option<String>,
    window: Option<String>,
    limit: Option<u64>,
    events: Option<Vec<String>>,
    timeout_millis: Option<u64>,
    max_attempts: Option<u32>,
    retry_base_millis: Option<u64>,
    retry_max_millis: Option<u64>,
}

impl std::fmt::Debug for WebhookFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookFile")
            .field("name", &self.name)
            .field("secret", &self.secret.as_ref().map(|_| "(hidden)"))
            .finish_non_exhaustive()
    }
}

/// A checked webhook.
#[derive(Clone)]
pub struct WebhookConfig {
    /// Unique name; the prefix of every delivery id.
    pub name: String,
    /// Where deliveries are posted.
    pub url: reqwest::Url,
    /// The secret as written: the key of `X-Rankgate-Signature` (never shown).
    secret: Vec<u8>,
    /// The Standard Webhooks key: a `whsec_` secret's decoded bytes, else the secret as written.
    standard_key: Vec<u8>,
    /// The watched category.
    pub category: CategoryOrAll,
    /// The watched ranking as a `GET …/top` query (`ranker=…&period=…&limit=…`), re-parsed against the
    /// clock every round so it follows the current period or window.
    pub query: String,
    /// The top N watched.
    pub limit: usize,
    /// Kinds posted.
    pub events: Vec<ChangeKind>,
    /// Per attempt.
    pub timeout: std::time::Duration,
    /// Retries and dead-lettering.
    pub retry: RetryPolicy,
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("name", &self.name)
            .field("url", &self.url.as_str())
            .field("secret", &"(hidden)")
            .field("category", &self.category.as_str())
            .field("query", &self.query)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

/// Largest signing secret accepted.
const MAX_SECRET_BYTES: usize = 512;
/// Smallest: a shorter secret is guessable.
const MIN_SECRET_BYTES: usize = 16;
/// The prefix of a Standard Webhooks secret, followed by the key in standard base64.
pub const STANDARD_SECRET_PREFIX: &str = "whsec_";
/// Most `[[webhook]]` tables: each is one read per freshness interval on the lease holder.
pub const MAX_WEBHOOKS: usize = 100;

impl WebhookConfig {
    /// The secret as written: the key of `X-Rankgate-Signature`.
    pub fn secret(&self) -> &[u8] {
        &self.secret
    }

    /// The Standard Webhooks key: the key of `webhook-signature`.
    pub fn standard_key(&self) -> &[u8] {
        &self.standard_key
    }

    /// Checks table number `index` (0-based) of the file; errors start with `webhook[index].<key>`.
    pub fn from_file(
        index: usize,
        file: WebhookFile,
        zone: &Zone,
        metric_retention_millis: i64,
    ) -> anyhow::Result<WebhookConfig> {
        let key = |name: &str| format!("webhook[{index}].{name}");
        let name = file
            .name
            .ok_or_else(|| anyhow::anyhow!("{}: is required", key("name")))?;
        anyhow::ensure!(
            !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "{}: must be 1 to 64 of A-Z, a-z, 0-9, '-' and '_'",
            key("name")
        );
        let raw_url = file
            .url
            .ok_or_else(|| anyhow::anyhow!("{}: is required", key("url")))?;
        let url =
            reqwest::Url::parse(&raw_url).map_err(|e| anyhow::anyhow!("{}: not a URL ({e})", key("url")))?;
        anyhow::ensure!(
            matches!(url.scheme(), "http" | "https"),
            "{}: the scheme must be http or https",
            key("url")
        );
        anyhow::ensure!(url.host().is_some(), "{}: must name a host", key("url"));
        anyhow::ensure!(
            url.username().is_empty() && url.password().is_none(),
            "{}: must not carry credentials (user:password@); receivers check the signature instead",
            key("url")
        );
        let (secret, secret_key) = match (file.secret, file.secret_file) {
            (Some(_), Some(_)) => {
                anyhow::bail!("{}: give secret or secret_file, not both", key("secret"))
            }
            (Some(secret), None) => (secret.into_bytes(), key("secret")),
            (None, Some(path)) => (
                std::fs::read_to_string(&path)
                    .map_err(|e| {
                        anyhow::anyhow!("{}: cannot read {} ({e})", key("secret_file"), path.display())
                    })?
                    .trim()
                    .as_bytes()
                    .to_vec(),
                key("secret_file"),
            ),
            (None, None) => anyhow::bail!("{}: is required (or secret_file)", key("secret")),
        };
        anyhow::ensure!(
            (MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&secret.len()),
            "{secret_key}: must be {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes, got {}",
            secret.len()
        );
        let standard_key = standard_key_of(&secret).map_err(|why| anyhow::anyhow!("{secret_key}: {why}"))?;
        let category =
            CategoryOrAll::parse(file.category.as_deref().ok_or_else(|| {
                anyhow::anyhow!("{}: is required (a category or \"all\")", key("category"))
            })?)
            .map_err(|e| anyhow::anyhow!("{}: {e}", key("category")))?;
        let limit = file.limit.unwrap_or(10);
        anyhow::ensure!(
            (1..=rankgate_core::read::MAX_LIMIT as u64).contains(&limit),
            "{}: must be 1 to {}, got {limit}",
            key("limit"),
            rankgate_core::read::MAX_LIMIT
        );
        // The ranking's keys are checked by the one read-parameter parser, as `GET …/top` checks them.
        let mut query = form_urlencoded::Serializer::new(String::new());
        query.append_pair("ranker", file.ranker.as_deref().unwrap_or("popular"));
        if let Some(period) = &file.period {
            query.append_pair("period", period);
        }
        if let Some(window) = &file.window {
            query.append_pair("window", window);
        }
        query.append_pair("limit", &limit.to_string());
        let query = query.finish();
        let now_millis = jiff::Timestamp::now().as_millisecond();
        let context = ReadContext {
            zone,
            now_millis,
            metric_retention_millis,
        };
        parse_read_query(ReadEndpoint::Top, &query, &context).map_err(|e| {
            // The parser names the parameter first (`period: …`); the config key is the same word.
            anyhow::anyhow!("webhook[{index}].{e}")
        })?;
        let events = match file.events {
            None => vec![ChangeKind::Entered, ChangeKind::Left, ChangeKind::Moved],
            Some(raw) => {
                anyhow::ensure!(
                    !raw.is_empty(),
                    "{}: name at least one of entered, left, moved",
                    key("events")
                );
                let mut kinds = Vec::new();
                for kind in &raw {
                    let parsed = ChangeKind::parse(kind).ok_or_else(|| {
                        anyhow::anyhow!(
                            "{}: unknown kind {kind:?}; use entered, left or moved",
                            key("events")
                        )
                    })?;
                    if !kinds.contains(&parsed) {
                        kinds.push(parsed);
                    }
                }
                kinds
            }
        };
        let timeout_millis = file.timeout_millis.unwrap_or(5_000);
        anyhow::ensure!(
            (100..=60_000).contains(&timeout_millis),
            "{}: must be 100 to 60000, got {timeout_millis}",
            key("timeout_millis")
        );
        let max_attempts = file.max_attempts.unwrap_or(8);
        anyhow::ensure!(
            (1..=100).contains(&max_attempts),
            "{}: must be 1 to 100, got {max_attempts}",
            key("max_attempts")
        );
        let base = file.retry_base_millis.unwrap_or(1_000);
        anyhow::ensure!(
            (10..=3_600_000).contains(&base),
            "{}: must be 10 to 3600000, got {base}",
            key("retry_base_millis")
        );
        let max_delay = file.retry_max_millis.unwrap_or(300_000);
        anyhow::ensure!(
            (base..=86_400_000).contains(&max_delay),
            "{}: must be retry_base_millis ({base}) to 86400000, got {max_delay}",
            key("retry_max_millis")
        );
        Ok(WebhookConfig {
            name,
            url,
            secret,
            standard_key,
            category,
            query,
            limit: limit as usize,
            events,
            timeout: std::time::Duration::from_millis(timeout_millis),
            retry: RetryPolicy {
                base_delay_ms: base,
                max_delay_ms: max_delay,
                max_attempts,
            },
        })
    }
}

/// The Standard Webhooks key of `secret`: after `whsec_`, the standard base64 (with its padding, as the
/// libraries decode it) of at least [`MIN_SECRET_BYTES`]; any other secret is its own bytes. The error
/// never quotes the secret or the decoder's message (which names an offending byte).
fn standard_key_of(secret: &[u8]) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    let Some(encoded) = secret.strip_prefix(STANDARD_SECRET_PREFIX.as_bytes()) else {
        return Ok(secret.to_vec());
    };
    let key = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| {
            format!(
                "a {STANDARD_SECRET_PREFIX} secret must be standard base64 (A-Z a-z 0-9 + /, padded with =) \
                 after the prefix, as Standard Webhooks libraries generate it; this one is not"
            )
        })?;
    if key.len() < MIN_SECRET_BYTES {
        return Err(format!(
            "a {STANDARD_SECRET_PREFIX} secret must encode at least {MIN_SECRET_BYTES} bytes, this one \
             encodes {}",
            key.len()
        ));
    }
    Ok(key)
}

/// Checks every table; names must be unique and there may be at most [`MAX_WEBHOOKS`].
pub fn webhooks_from_file(
    files: Vec<WebhookFile>,
    zone: &Zone,
    metric_retention_millis: i64,
) -> anyhow::Result<Vec<WebhookConfig>> {
    anyhow::ensure!(
        files.len() <= MAX_WEBHOOKS,
        "webhook: at most {MAX_WEBHOOKS} [[webhook]] tables, got {}",
        files.len()
    );
    let mut webhooks: Vec<WebhookConfig> = Vec::with_capacity(files.len());
    for (index, file) in files.into_iter().enumerate() {
        let webhook = WebhookConfig::from_file(index, file, zone, metric_retention_millis)?;
        anyhow::ensure!(
            webhooks.iter().all(|other| other.name != webhook.name),
            "webhook[{index}].name: {:?} is used by another [[webhook]]",
            webhook.name
        );
        webhooks.push(webhook);
    }
    Ok(webhooks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> anyhow::Result<Vec<WebhookConfig>> {
        #[derive(Deserialize)]
        struct File {
            webhook: Vec<WebhookFile>,
        }
        let file: File = toml::from_str(toml_text)?;
        webhooks_from_file(file.webhook, &Zone::parse("UTC").unwrap(), 400 * 86_400_000)
    }

    const GOOD: &str = "name = \"toys\"\nurl = \"https://shop.example/hook\"\nsecret = \"0123456789abcdef-secret\"\ncategory = \"toys\"\nperiod = \"daily\"\nlimit = 5\n";

    #[test]
    fn a_good_table_is_accepted_with_defaults() {
        let hooks = parse(&format!("[[webhook]]\n{GOOD}")).unwrap();
        let hook = &hooks[0];
        assert_eq!(hook.limit, 5);
        assert_eq!(hook.events.len(), 3);
        assert_eq!(hook.retry.max_attempts, 8);
        assert_eq!(hook.query, "ranker=popular&period=daily&limit=5");
        assert!(
            !format!("{hook:?}").contains("0123456789abcdef"),
            "Debug hides the secret"
        );
    }

    #[test]
    fn a_whsec_secret_signs_with_its_decoded_bytes_and_any_other_with_its_own() {
        // base64("0123456789abcdef01234567") = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3"
        let standard = GOOD.replace(
            "0123456789abcdef-secret",
            "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3",
        );
        let hook = &parse(&format!("[[webhook]]\n{standard}")).unwrap()[0];
        assert_eq!(hook.standard_key(), b"0123456789abcdef01234567");
        assert_eq!(
            hook.secret(),
            b"whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3",
            "X-Rankgate-Signature keeps the secret as written"
        );
        let plain = &parse(&format!("[[webhook]]\n{GOOD}")).unwrap()[0];
        assert_eq!(plain.standard_key(), b"0123456789abcdef-secret");
        assert!(!format!("{hook:?}").contains("MDEy"), "Debug hides both keys");
    }

    #[test]
    fn every_bad_field_is_refused_naming_its_key_and_never_quoting_the_secret() {
        let cases = [
            (
                "url = \"https://shop.example/hook\"",
                "url = \"ftp://shop.example/hook\"",
                "webhook[0].url",
            ),
            (
                "url = \"https://shop.example/hook\"",
                "url = \"https://u:p@shop.example/hook\"",
                "webhook[0].url",
            ),
            (
                "secret = \"0123456789abcdef-secret\"",
                "secret = \"short\"",
                "webhook[0].secret",
            ),
            ("category = \"toys\"", "category = \"\"", "webhook[0].category"),
            (
                "period = \"daily\"",
                "period = \"fortnightly\"",
                "webhook[0].period",
            ),
            ("limit = 5", "limit = 1001", "webhook[0].limit"),
            ("limit = 5", "limit = 0", "webhook[0].limit"),
            ("name = \"toys\"", "name = \"to ys\"", "webhook[0].name"),
            (
                "limit = 5",
                "limit = 5\nevents = [\"jumped\"]",
                "webhook[0].events",
            ),
            ("limit = 5", "limit = 5\nevents = []", "webhook[0].events"),
            (
                "limit = 5",
                "limit = 5\nmax_attempts = 0",
                "webhook[0].max_attempts",
            ),
            (
                "limit = 5",
                "limit = 5\ntimeout_millis = 1",
                "webhook[0].timeout_millis",
            ),
            (
                "limit = 5",
                "limit = 5\nretry_base_millis = 5",
                "webhook[0].retry_base_millis",
            ),
            (
                "limit = 5",
                "limit = 5\nretry_base_millis = 1000\nretry_max_millis = 10",
                "webhook[0].retry_max_millis",
            ),
        ];
        for (from, to, key) in cases {
            let text = format!("[[webhook]]\n{}", GOOD.replace(from, to));
            let error = format!("{:#}", parse(&text).unwrap_err());
            assert!(error.starts_with(key), "{to}: {error}");
            assert!(!error.contains("0123456789abcdef"), "{to}: {error}");
        }
        // A whsec_ secret that is not base64 (a '-' and '!'), unpadded, or too short once decoded: refused
        // naming the key, without quoting the secret or the decoder's byte.
        for bad in [
            "whsec_0123456789abcdef-sec!et+/AAA=",
            "whsec_MDEyMzQ1Njc4OWFiY2RlZg",
            "whsec_MDEyMzQ1Njc4OWE=",
        ] {
            let text = format!("[[webhook]]\n{}", GOOD.replace("0123456789abcdef-secret", bad));
            let error = format!("{:#}", parse(&text).unwrap_err());
            assert!(
                error.starts_with("webhook[0].secret: a whsec_ secret"),
                "{bad}: {error}"
            );
            assert!(!error.contains(&bad[6..]), "{bad}: {error}");
            assert!(
                !error.contains("offset"),
                "the decoder's message names a byte: {bad}: {error}"
            );
        }
        let twice = format!("[[webhook]]\n{GOOD}[[webhook]]\n{GOOD}");
        let error = format!("{:#}", parse(&twice).unwrap_err());
        assert!(error.starts_with("webhook[1].name"), "{error}");
        let unknown = format!("[[webhook]]\n{GOOD}colour = \"red\"\n");
        assert!(
            parse(&unknown).is_err(),
            "an unknown key in a webhook table is refused"
        );
    }
}
