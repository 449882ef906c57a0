//! The CAPTCHA hook (SPEC 2.2, "Entry challenges", `entryChallenge = "captcha"`): `[waiting_room.captcha]`
//! and the provider's standard siteverify request.
//!
//! ```toml
//! [waiting_room.captcha]
//! provider = "turnstile"          # or "hcaptcha", "recaptcha"
//! site_key = "0x4AAAAAAA…"        # public: the waiting page renders the widget with it
//! secret_file = "/etc/rankgate/captcha-secret"   # or secret = "…" (never logged or shown)
//! # verify_url = "https://challenges.cloudflare.com/turnstile/v0/siteverify"  # the provider's by default
//! # script_url = "https://challenges.cloudflare.com/turnstile/v0/api.js"      # the widget's script
//! timeout_millis = 3000           # a verification's bound; past it the verifier counts as unreachable
//! # fail_mode = "closed"          # unreachable verifier: "closed" (503) or "open" (let the entry in);
//!                                 # absent: the queue's failMode
//! ```
//!
//! The three providers speak one protocol: `POST verify_url` with the form fields `secret`, `response`
//! (the token the widget gave the browser) and `remoteip`, answered by JSON whose `success` says yes or
//! no. The answer is read up to [`MAX_VERIFY_ANSWER_BYTES`] within `timeout_millis`; anything else (no
//! connection, a timeout, a non-2xx status, an answer that is not that JSON) is an unreachable verifier.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use rankgate_core::queue::FailMode;
use serde::Deserialize;

/// Longest CAPTCHA token accepted from a client (the providers' are about 2 KB).
pub const MAX_CAPTCHA_TOKEN_BYTES: usize = 4096;
/// Most bytes of a siteverify answer read.
pub const MAX_VERIFY_ANSWER_BYTES: usize = 64 * 1024;
/// Allowed `timeout_millis`.
pub const TIMEOUT_MILLIS: std::ops::RangeInclusive<u64> = 100..=30_000;

/// A CAPTCHA provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// Cloudflare Turnstile.
    Turnstile,
    /// hCaptcha.
    Hcaptcha,
    /// Google reCAPTCHA (v2 checkbox).
    Recaptcha,
}

impl Provider {
    fn parse(raw: &str) -> Option<Provider> {
        match raw {
            "turnstile" => Some(Provider::Turnstile),
            "hcaptcha" => Some(Provider::Hcaptcha),
            "recaptcha" => Some(Provider::Recaptcha),
            _ => None,
        }
    }

    /// The JSON and config name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Provider::Turnstile => "turnstile",
            Provider::Hcaptcha => "hcaptcha",
            Provider::Recaptcha => "recaptcha",
        }
    }

    fn default_verify_url(self) -> &'static str {
        match self {
            Provider::Turnstile => "https://challenges.cloudflare.com/turnstile/v0/siteverify",
            Provider::Hcaptcha => "https://api.hcaptcha.com/siteverify",
            Provider::Recaptcha => "https://www.google.com/recaptcha/api/siteverify",
        }
    }

    fn default_script_url(self) -> &'static str {
        match self {
            Provider::Turnstile => "https://challenges.cloudflare.com/turnstile/v0/api.js",
            Provider::Hcaptcha => "https://js.hcaptcha.com/1/api.js",
            Provider::Recaptcha => "https://www.google.com/recaptcha/api.js",
        }
    }

    /// The element class the provider's script turns into a widget (its implicit rendering).
    #[must_use]
    pub fn widget_class(self) -> &'static str {
        match self {
            Provider::Turnstile => "cf-turnstile",
            Provider::Hcaptcha => "h-captcha",
            Provider::Recaptcha => "g-recaptcha",
        }
    }
}

/// `[waiting_room.captcha]` as the file gives it. `Debug` never shows the secret.
#[derive(Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CaptchaFile {
    /// `provider`.
    pub provider: Option<String>,
    /// `site_key`: public.
    pub site_key: Option<String>,
    /// `secret`: the provider's secret key (prefer `secret_file`).
    pub secret: Option<String>,
    /// `secret_file`: a file holding the secret.
    pub secret_file: Option<PathBuf>,
    /// `verify_url`: the siteverify endpoint (the provider's by default).
    pub verify_url: Option<String>,
    /// `script_url`: the widget's script (the provider's by default).
    pub script_url: Option<String>,
    /// `timeout_millis` (default 3000).
    pub timeout_millis: Option<u64>,
    /// `fail_mode` when the verifier is unreachable; absent: the queue's `failMode`.
    pub fail_mode: Option<FailMode>,
}

impl std::fmt::Debug for CaptchaFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptchaFile")
            .field("provider", &self.provider)
            .field("site_key", &self.site_key)
            .field("secret", &self.secret.as_ref().map(|_| "(hidden)"))
            .field("secret_file", &self.secret_file)
            .field("verify_url", &self.verify_url)
            .finish_non_exhaustive()
    }
}

/// A resolved CAPTCHA hook: what the page shows and how an entry's token is verified.
#[derive(Clone)]
pub struct Captcha {
    /// The provider.
    pub provider: Provider,
    /// The public site key the widget is rendered with.
    pub site_key: String,
    secret: String,
    verify_url: reqwest::Url,
    /// The widget's script.
    pub script_url: reqwest::Url,
    timeout: Duration,
    /// What an unreachable verifier means; `None`: the queue's `failMode`.
    pub fail_mode: Option<FailMode>,
}

impl std::fmt::Debug for Captcha {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Captcha")
            .field("provider", &self.provider)
            .field("site_key", &self.site_key)
            .field("verify_url", &self.verify_url.as_str())
            .finish_non_exhaustive()
    }
}

/// What the provider said of a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A person, says the provider.
    Passed,
    /// Refused (a wrong, used or expired token).
    Failed,
    /// The verifier could not be asked or gave no usable answer in time.
    Unreachable,
}

impl Captcha {
    /// The hook `file` describes, or `None` when the file has no `[waiting_room.captcha]`; takes the
    /// secret out of `file`. Errors name the key and never show the secret.
    pub fn from_file(file: Option<&mut CaptchaFile>) -> anyhow::Result<Option<Captcha>> {
        let Some(file) = file else {
            return Ok(None);
        };
        let key = |name: &str| format!("waiting_room.captcha.{name}");
        let provider = file
            .provider
            .as_deref()
            .map(|raw| {
                Provider::parse(raw).ok_or_else(|| {
                    anyhow::anyhow!(
                        "{}: must be \"turnstile\", \"hcaptcha\" or \"recaptcha\"",
                        key("provider")
                    )
                })
            })
            .transpose()?
            .ok_or_else(|| anyhow::anyhow!("{}: missing; name the CAPTCHA provider", key("provider")))?;
        let site_key = file
            .site_key
            .clone()
            .filter(|site_key| !site_key.trim().is_empty() && site_key.len() <= 256)
            .ok_or_else(|| anyhow::anyhow!("{}: missing; the provider's public site key", key("site_key")))?;
        let secret = match (file.secret.take(), &file.secret_file) {
            (Some(_), Some(_)) => {
                anyhow::bail!("{} and {}: give one of them", key("secret"), key("secret_file"))
            }
            (Some(secret), None) => secret,
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|error| {
                    anyhow::anyhow!("{}: reading {}: {error}", key("secret_file"), path.display())
                })?
                .trim()
                .to_owned(),
            (None, None) => anyhow::bail!("{}: missing; give secret_file (or secret)", key("secret_file")),
        };
        anyhow::ensure!(!secret.is_empty(), "{}: the secret is empty", key("secret"));
        let url = |name: &str, given: &Option<String>, default: &str| -> anyhow::Result<reqwest::Url> {
            let raw = given.as_deref().unwrap_or(default);
            let url = reqwest::Url::parse(raw).map_err(|error| anyhow::anyhow!("{}: {error}", key(name)))?;
            anyhow::ensure!(
                matches!(url.scheme(), "http" | "https") && url.host().is_some(),
                "{}: must be an http(s) URL",
                key(name)
            );
            Ok(url)
        };
        let verify_url = url("verify_url", &file.verify_url, provider.default_verify_url())?;
        let script_url = url("script_url", &file.script_url, provider.default_script_url())?;
        let timeout_millis = file.timeout_millis.unwrap_or(3000);
        anyhow::ensure!(
            TIMEOUT_MILLIS.contains(&timeout_millis),
            "{}: must be between 100 and 30000",
            key("timeout_millis")
        );
        Ok(Some(Captcha {
            provider,
            site_key,
            secret,
            verify_url,
            script_url,
            timeout: Duration::from_millis(timeout_millis),
            fail_mode: file.fail_mode,
        }))
    }

    /// The origin of the widget's script, for the page's Content-Security-Policy.
    #[must_use]
    pub fn script_origin(&self) -> String {
        self.script_url.origin().ascii_serialization()
    }

    /// Asks the provider about `token`, sent from `remote`, within the configured bound.
    pub async fn verify(&self, http: &reqwest::Client, token: &str, remote: Option<IpAddr>) -> Verdict {
        let remote = remote.map(|address| address.to_string()).unwrap_or_default();
        let mut form = vec![("secret", self.secret.as_str()), ("response", token)];
        if !remote.is_empty() {
            form.push(("remoteip", remote.as_str()));
        }
        let asked = async {
            let mut answer = http.post(self.verify_url.clone()).form(&form).send().await.ok()?;
            if !answer.status().is_success() {
                return None;
            }
            let mut body = Vec::new();
            while let Some(chunk) = answer.chunk().await.ok()? {
                if body.len() + chunk.len() > MAX_VERIFY_ANSWER_BYTES {
                    return None;
                }
                body.extend_from_slice(&chunk);
            }
            #[derive(Deserialize)]
            struct Answer {
                success: bool,
            }
            serde_json::from_slice::<Answer>(&body)
                .ok()
                .map(|answer| answer.success)
        };
        match tokio::time::timeout(self.timeout, asked).await {
            Ok(Some(true)) => Verdict::Passed,
            Ok(Some(false)) => Verdict::Failed,
            Ok(None) | Err(_) => Verdict::Unreachable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(text: &str) -> anyhow::Result<Option<Captcha>> {
        let mut file: CaptchaFile = toml::from_str(text)?;
        Captcha::from_file(Some(&mut file))
    }

    #[test]
    fn a_complete_hook_resolves_with_the_providers_defaults() {
        let captcha = resolve("provider = \"hcaptcha\"\nsite_key = \"site\"\nsecret = \"topsecret\"")
            .unwrap()
            .unwrap();
        assert_eq!(captcha.provider, Provider::Hcaptcha);
        assert_eq!(captcha.verify_url.as_str(), "https://api.hcaptcha.com/siteverify");
        assert_eq!(captcha.script_origin(), "https://js.hcaptcha.com");
        assert!(!format!("{captcha:?}").contains("topsecret"));
    }

    #[test]
    fn every_error_names_its_key_and_hides_the_secret() {
        for (text, key) in [
            ("site_key = \"s\"\nsecret = \"topsecret\"", "provider"),
            ("provider = \"friendlycaptcha\"\nsite_key = \"s\"\nsecret = \"topsecret\"", "provider"),
            ("provider = \"turnstile\"\nsecret = \"topsecret\"", "site_key"),
            ("provider = \"turnstile\"\nsite_key = \"s\"", "secret_file"),
            (
                "provider = \"turnstile\"\nsite_key = \"s\"\nsecret = \"topsecret\"\nverify_url = \"ftp://x\"",
                "verify_url",
            ),
            (
                "provider = \"turnstile\"\nsite_key = \"s\"\nsecret = \"topsecret\"\ntimeout_millis = 0",
                "timeout_millis",
            ),
        ] {
            let error = resolve(text).unwrap_err().to_string();
            assert!(error.contains(&format!("waiting_room.captcha.{key}")), "{text}: {error}");
            assert!(!error.contains("topsecret"), "{error}");
        }
    }
}
