//! `[[waiting_room.page]]`: how the waiting page of a queue looks and where it continues to, validated at
//! config load so a typo in a colour or a URL stops the start with a message naming the key, instead of
//! shipping a broken or unsafe page on the day of a sale.
//!
//! ```toml
//! [[waiting_room.page]]            # the default page: no `queue`
//! title = "Example Shop"
//! continue_url = "/checkout"
//!
//! [[waiting_room.page]]            # one queue's page; keys it leaves out take the built-in defaults
//! queue = "summer-sale"
//! title = "Summer sale"
//! logo_url = "https://shop.example/logo.svg"
//! continue_url = "https://shop.example/sale/checkout"
//! background = "#ffffff"           # colours are #rrggbb; text on background and accent_text on accent
//! text = "#1a1a1a"                 # must reach WCAG AA contrast (4.5:1), or the start fails
//! accent = "#0b57d0"
//! accent_text = "#ffffff"
//! continue_delay_seconds = 2       # how long the admitted page shows before it continues by itself
//! ```
//!
//! Texts (each 1–500 bytes, no control characters; `{…}` placeholders are filled in): `intro`,
//! `position_text` (`{position}`), `ahead_text` (`{ahead}`), `estimate_text` (`{estimate}`),
//! `estimate_range_text` (`{estimate}`, `{p90}`), `paused_text`, `updated_text` (`{time}`),
//! `keep_open_text`, `refresh_text`, `admitted_text`, `moving_on_text` (`{seconds}`), `held_until_text`
//! (`{time}`), `return_text`, `continue_text`, `lang` (a BCP 47 tag).
//!
//! Without a `continue_url` (own or default entry), an admitted shopper continues to the path of the
//! queue's first `[[gate]]` GET route, the shop page the gate lets them into; with no such route, the
//! admitted page has no link and says `return_text`. Never to `/`: that is rankgate's own dashboard.
//!
//! Every string is still HTML-escaped when the page is rendered: validation is for the operator's sake,
//! escaping is what keeps the page safe.

use rankgate_core::queue::QueueName;
use serde::Deserialize;

use crate::waiting_room::config::GateConfig;

/// Most `[[waiting_room.page]]` entries: a page per queue of a large deployment, bounded like `max_queues`.
pub const MAX_PAGES: usize = 1_000;
/// Longest configured text or URL, in bytes.
pub const MAX_TEXT_BYTES: usize = 500;
/// Longest `continue_delay_seconds`.
pub const MAX_CONTINUE_DELAY_SECONDS: u64 = 30;
/// Contrast a page's colour pairs must reach: WCAG 2.x level AA for normal text.
pub const MIN_CONTRAST: f64 = 4.5;

/// When the page's cookies (visitor id, entry token) carry `Secure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CookieSecure {
    /// When the request came over TLS: an `https` request URI, or `X-Forwarded-Proto: https` from the
    /// proxy in front. Trusting that header is safe here: a client that forges it only gets a `Secure`
    /// cookie its own plain-HTTP connection will not send back.
    #[default]
    Auto,
    /// Always (a TLS proxy in front that does not send `X-Forwarded-Proto`).
    Always,
    /// Never (plain-HTTP development setups; browsers drop `Secure` cookies set over plain HTTP).
    Never,
}

/// One `[[waiting_room.page]]` entry as written; absent keys take [`PageLook::default`]'s values.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageConfig {
    /// The queue this page is for; absent: the default page of every other queue.
    pub queue: Option<String>,
    /// The page title and heading.
    pub title: Option<String>,
    /// A logo shown above the title (`https://…`, `http://…` or a path on this host).
    pub logo_url: Option<String>,
    /// Where an admitted member continues to (`https://…`, `http://…` or a path on this host).
    pub continue_url: Option<String>,
    /// Page background (`#rrggbb`).
    pub background: Option<String>,
    /// Text colour (`#rrggbb`).
    pub text: Option<String>,
    /// Progress bar and button colour (`#rrggbb`).
    pub accent: Option<String>,
    /// Text on the accent colour (`#rrggbb`).
    pub accent_text: Option<String>,
    /// Seconds the admitted page shows before it continues by itself.
    pub continue_delay_seconds: Option<u64>,
    /// The page's language (`<html lang>`).
    pub lang: Option<String>,
    /// Under the title.
    pub intro: Option<String>,
    /// `{position}`: rank + 1.
    pub position_text: Option<String>,
    /// `{ahead}`: members ahead (the rank).
    pub ahead_text: Option<String>,
    /// `{estimate}`.
    pub estimate_text: Option<String>,
    /// `{estimate}` and `{p90}`, used when the position has `estimatedWaitSecondsP90`.
    pub estimate_range_text: Option<String>,
    /// Shown instead of an estimate while the queue is paused.
    pub paused_text: Option<String>,
    /// `{time}`: when the position was last read.
    pub updated_text: Option<String>,
    /// "Keep this tab open, you keep your place."
    pub keep_open_text: Option<String>,
    /// The waiting page's link that reloads it.
    pub refresh_text: Option<String>,
    /// Heading of the admitted page.
    pub admitted_text: Option<String>,
    /// The admitted page's note that it continues by itself (`{seconds}`).
    pub moving_on_text: Option<String>,
    /// The admitted page's note of how long the turn stays valid (`{time}`).
    pub held_until_text: Option<String>,
    /// The admitted page's words when there is no `continue_url` to go to.
    pub return_text: Option<String>,
    /// The admitted page's continue link.
    pub continue_text: Option<String>,
}

/// A page ready to render: every value present and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct PageLook {
    pub title: String,
    pub logo_url: Option<String>,
    /// Where the admitted page continues to: the configured `continue_url`, else the path of the
    /// queue's first `[[gate]]` GET route, else nowhere (the page says to go back to the shop).
    pub continue_url: Option<String>,
    pub background: String,
    pub text: String,
    pub accent: String,
    pub accent_text: String,
    pub continue_delay_seconds: u64,
    pub lang: String,
    pub intro: String,
    pub position_text: String,
    pub ahead_text: String,
    pub estimate_text: String,
    pub estimate_range_text: String,
    pub paused_text: String,
    pub updated_text: String,
    pub keep_open_text: String,
    pub refresh_text: String,
    pub admitted_text: String,
    pub moving_on_text: String,
    pub held_until_text: String,
    pub return_text: String,
    pub continue_text: String,
}

impl Default for PageLook {
    fn default() -> Self {
        PageLook {
            title: "Waiting room".into(),
            logo_url: None,
            continue_url: None,
            background: "#ffffff".into(),
            text: "#1a1a1a".into(),
            accent: "#0b57d0".into(),
            accent_text: "#ffffff".into(),
            continue_delay_seconds: 2,
            lang: "en".into(),
            intro: "You are in the queue. We let people in in the order they arrived.".into(),
            position_text: "You are number {position} in line".into(),
            ahead_text: "People ahead of you: {ahead}".into(),
            estimate_text: "Estimated wait: {estimate}".into(),
            estimate_range_text: "Estimated wait: {estimate} (9 in 10 people wait less than {p90})".into(),
            paused_text: "The queue is paused for a moment; your place is kept.".into(),
            updated_text: "Last update: {time}".into(),
            keep_open_text: "Keep this tab open, you keep your place.".into(),
            refresh_text: "Check my place now".into(),
            admitted_text: "It is your turn!".into(),
            return_text: "Go back to the shop's page to continue.".into(),
            moving_on_text: "Taking you to the shop in {seconds} s.".into(),
            held_until_text: "Your turn is held for you until {time}.".into(),
            continue_text: "Continue to the shop".into(),
        }
    }
}

/// The pages of a deployment, looked up by queue.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pages {
    default: PageLook,
    by_queue: std::collections::HashMap<String, PageLook>,
}

impl Pages {
    /// Validates `[[waiting_room.page]]`; errors name the entry and the key. `gates` give the
    /// continue URL of a queue whose page has none.
    pub fn from_config(entries: &[PageConfig], gates: &[GateConfig]) -> anyhow::Result<Pages> {
        anyhow::ensure!(
            entries.len() <= MAX_PAGES,
            "waiting_room.page: {} entries, at most {MAX_PAGES} are allowed",
            entries.len()
        );
        let defaults: Vec<&PageConfig> = entries.iter().filter(|e| e.queue.is_none()).collect();
        anyhow::ensure!(
            defaults.len() <= 1,
            "waiting_room.page: {} entries without `queue`; at most one default page is allowed",
            defaults.len()
        );
        let base = match defaults.first() {
            Some(entry) => look_of(entry, &PageLook::default(), "waiting_room.page (default)")?,
            None => PageLook::default(),
        };
        let mut by_queue = std::collections::HashMap::new();
        for entry in entries {
            let Some(queue) = &entry.queue else { continue };
            QueueName::parse(queue)
                .map_err(|e| anyhow::anyhow!("waiting_room.page: queue {:?}: {e}", truncated(queue)))?;
            let look = look_of(entry, &base, &format!("waiting_room.page (queue {queue})"))?;
            anyhow::ensure!(
                by_queue.insert(queue.clone(), look).is_none(),
                "waiting_room.page: queue {queue} has two entries; keep one"
            );
        }
        for gate in gates {
            let Some(route) = gate
                .routes
                .iter()
                .find(|route| route.method.eq_ignore_ascii_case("GET") && !route.prefix)
            else {
                continue;
            };
            let look = by_queue.entry(gate.queue.clone()).or_insert_with(|| base.clone());
            look.continue_url.get_or_insert_with(|| route.path.clone());
        }
        Ok(Pages {
            default: base,
            by_queue,
        })
    }

    /// The page of `queue`: its own entry, else the default entry, else the built-in defaults.
    #[must_use]
    pub fn for_queue(&self, queue: &str) -> &PageLook {
        self.by_queue.get(queue).unwrap_or(&self.default)
    }
}

fn truncated(raw: &str) -> String {
    raw.chars().take(80).collect()
}

fn look_of(entry: &PageConfig, base: &PageLook, at: &str) -> anyhow::Result<PageLook> {
    let text = |key: &str, value: &Option<String>, fallback: &String| -> anyhow::Result<String> {
        match value {
            None => Ok(fallback.clone()),
            Some(value) => {
                check_text(value).map_err(|e| anyhow::anyhow!("{at}: {key}: {e}"))?;
                Ok(value.clone())
            }
        }
    };
    let colour = |key: &str, value: &Option<String>, fallback: &String| -> anyhow::Result<String> {
        match value {
            None => Ok(fallback.clone()),
            Some(value) => {
                parse_colour(value).map_err(|e| anyhow::anyhow!("{at}: {key}: {e}"))?;
                Ok(value.to_ascii_lowercase())
            }
        }
    };
    let url = |key: &str, value: &str| -> anyhow::Result<()> {
        check_url(value).map_err(|e| anyhow::anyhow!("{at}: {key}: {e}"))
    };
    let look = PageLook {
        title: text("title", &entry.title, &base.title)?,
        logo_url: match &entry.logo_url {
            Some(value) => {
                url("logo_url", value)?;
                Some(value.clone())
            }
            None => base.logo_url.clone(),
        },
        continue_url: match &entry.continue_url {
            Some(value) => {
                url("continue_url", value)?;
                Some(value.clone())
            }
            None => base.continue_url.clone(),
        },
        background: colour("background", &entry.background, &base.background)?,
        text: colour("text", &entry.text, &base.text)?,
        accent: colour("accent", &entry.accent, &base.accent)?,
        accent_text: colour("accent_text", &entry.accent_text, &base.accent_text)?,
        continue_delay_seconds: match entry.continue_delay_seconds {
            Some(seconds) if seconds > MAX_CONTINUE_DELAY_SECONDS => anyhow::bail!(
                "{at}: continue_delay_seconds: at most {MAX_CONTINUE_DELAY_SECONDS}, got {seconds}"
            ),
            Some(seconds) => seconds,
            None => base.continue_delay_seconds,
        },
        lang: match &entry.lang {
            Some(lang) => {
                let valid = !lang.is_empty()
                    && lang.len() <= 35
                    && lang.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
                anyhow::ensure!(
                    valid,
                    "{at}: lang: a language tag such as \"en\" or \"pt-BR\" (letters, digits and -)"
                );
                lang.clone()
            }
            None => base.lang.clone(),
        },
        intro: text("intro", &entry.intro, &base.intro)?,
        position_text: text("position_text", &entry.position_text, &base.position_text)?,
        ahead_text: text("ahead_text", &entry.ahead_text, &base.ahead_text)?,
        estimate_text: text("estimate_text", &entry.estimate_text, &base.estimate_text)?,
        estimate_range_text: text(
            "estimate_range_text",
            &entry.estimate_range_text,
            &base.estimate_range_text,
        )?,
        paused_text: text("paused_text", &entry.paused_text, &base.paused_text)?,
        updated_text: text("updated_text", &entry.updated_text, &base.updated_text)?,
        keep_open_text: text("keep_open_text", &entry.keep_open_text, &base.keep_open_text)?,
        refresh_text: text("refresh_text", &entry.refresh_text, &base.refresh_text)?,
        admitted_text: text("admitted_text", &entry.admitted_text, &base.admitted_text)?,
        moving_on_text: text("moving_on_text", &entry.moving_on_text, &base.moving_on_text)?,
        held_until_text: text("held_until_text", &entry.held_until_text, &base.held_until_text)?,
        return_text: text("return_text", &entry.return_text, &base.return_text)?,
        continue_text: text("continue_text", &entry.continue_text, &base.continue_text)?,
    };
    for (pair, foreground, background) in [
        ("text on background", &look.text, &look.background),
        ("accent_text on accent", &look.accent_text, &look.accent),
    ] {
        let ratio = contrast_ratio(parse_colour(foreground)?, parse_colour(background)?);
        anyhow::ensure!(
            ratio >= MIN_CONTRAST,
            "{at}: {pair}: contrast {ratio:.2}:1 ({foreground} on {background}) is below {MIN_CONTRAST}:1 \
             (WCAG AA); pick colours further apart"
        );
    }
    Ok(look)
}

fn check_text(value: &str) -> Result<(), String> {
    if value.trim().is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > MAX_TEXT_BYTES {
        return Err(format!("at most {MAX_TEXT_BYTES} bytes, got {}", value.len()));
    }
    if value.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

/// A `#rrggbb` colour as its three channels.
pub fn parse_colour(value: &str) -> anyhow::Result<[u8; 3]> {
    let mut channels = [0u8; 3];
    value
        .strip_prefix('#')
        .and_then(|digits| hex::decode_to_slice(digits, &mut channels).ok())
        .ok_or_else(|| anyhow::anyhow!("{:?} is not a #rrggbb colour", truncated(value)))?;
    Ok(channels)
}

/// WCAG 2.x contrast ratio of two sRGB colours, 1 to 21.
#[must_use]
pub fn contrast_ratio(a: [u8; 3], b: [u8; 3]) -> f64 {
    fn luminance(rgb: [u8; 3]) -> f64 {
        let linear = |c: u8| {
            let c = f64::from(c) / 255.0;
            if c <= 0.039_28 {
                c / 12.92
            } else {
                ((c + 0.055) / 1.055).powf(2.4)
            }
        };
        0.2126 * linear(rgb[0]) + 0.7152 * linear(rgb[1]) + 0.0722 * linear(rgb[2])
    }
    let (la, lb) = (luminance(a), luminance(b));
    let (hi, lo) = if la >= lb { (la, lb) } else { (lb, la) };
    (hi + 0.05) / (lo + 0.05)
}

/// A URL the page may link to or load: `https://host/…`, `http://host/…`, or a path on this host
/// (`/…`, not `//…`, which would be another host). No whitespace, quotes, angle brackets or backslashes,
/// so it reads the same in an attribute, a `Refresh` value and a browser (defence in depth: it is
/// escaped anyway).
pub fn check_url(value: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !value.is_empty() && value.len() <= MAX_TEXT_BYTES,
        "must be 1 to {MAX_TEXT_BYTES} bytes"
    );
    let bad =
        |c: char| c.is_control() || c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '\\' | '`');
    anyhow::ensure!(
        !value.chars().any(bad),
        "{:?}: must not contain whitespace, quotes, angle brackets or backslashes",
        truncated(value)
    );
    let lower = value.to_ascii_lowercase();
    let absolute = ["https://", "http://"]
        .iter()
        .find_map(|scheme| lower.strip_prefix(scheme));
    match absolute {
        Some(rest) => {
            let host = rest.split(['/', '?', '#']).next().unwrap_or("");
            anyhow::ensure!(
                !host.is_empty() && !host.contains('@'),
                "{:?}: an http(s) URL needs a host (and no user@ part)",
                truncated(value)
            );
        }
        None => anyhow::ensure!(
            value.starts_with('/') && !value.starts_with("//"),
            "{:?}: must be an https:// or http:// URL, or a path on this host starting with a single /",
            truncated(value)
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(toml_text: &str) -> anyhow::Result<Pages> {
        #[derive(Deserialize)]
        struct File {
            page: Vec<PageConfig>,
        }
        let file: File = toml::from_str(toml_text)?;
        Pages::from_config(&file.page, &[])
    }

    #[test]
    fn without_a_continue_url_a_queue_continues_to_its_gate_s_get_route() {
        let gate = |queue: &str, routes: &[(&str, &str, bool)]| GateConfig {
            queue: queue.into(),
            upstream: "http://127.0.0.1:9".into(),
            routes: routes
                .iter()
                .map(|&(method, path, prefix)| crate::waiting_room::config::GateRoute {
                    method: method.into(),
                    path: path.into(),
                    prefix,
                })
                .collect(),
            timeout_millis: 1_000,
            max_body_bytes: 1_024,
        };
        let gates = [
            gate(
                "sale",
                &[("POST", "/orders", false), ("GET", "/shop/checkout", false)],
            ),
            gate(
                "posts-only",
                &[("POST", "/orders", false), ("GET", "/shop", true)],
            ),
            gate("configured", &[("GET", "/shop/checkout", false)]),
        ];
        let file: Vec<PageConfig> =
            vec![
                toml::from_str("queue = \"configured\"\ncontinue_url = \"https://shop.example/go\"\n")
                    .unwrap(),
            ];
        let pages = Pages::from_config(&file, &gates).unwrap();
        assert_eq!(
            pages.for_queue("sale").continue_url.as_deref(),
            Some("/shop/checkout")
        );
        assert_eq!(pages.for_queue("posts-only").continue_url, None);
        assert_eq!(
            pages.for_queue("configured").continue_url.as_deref(),
            Some("https://shop.example/go"),
            "a configured URL wins"
        );
        assert_eq!(pages.for_queue("no-gate").continue_url, None);
    }

    #[test]
    fn pages_fall_back_from_queue_to_default_to_built_in() {
        let pages =
            entry("[[page]]\ntitle = \"Shop\"\n[[page]]\nqueue = \"sale\"\ncontinue_url = \"/checkout\"\n")
                .unwrap();
        assert_eq!(pages.for_queue("sale").title, "Shop");
        assert_eq!(pages.for_queue("sale").continue_url.as_deref(), Some("/checkout"));
        assert_eq!(
            pages.for_queue("other").continue_url,
            None,
            "never rankgate's own `/`"
        );
        assert_eq!(pages.for_queue("other").title, "Shop");
        assert_eq!(
            Pages::from_config(&[], &[]).unwrap().for_queue("x").title,
            "Waiting room"
        );
    }

    #[test]
    fn hostile_config_strings_are_refused_with_the_key_named() {
        for (text, key) in [
            ("background = \"red\"", "background"),
            ("background = \"#12345\"", "background"),
            ("text = \"#ffffff\"", "text on background"),
            ("accent = \"#ffffff\"", "accent_text on accent"),
            ("continue_url = \"javascript:alert(1)\"", "continue_url"),
            ("continue_url = \"//evil.example/\"", "continue_url"),
            ("continue_url = \"/a\\\"onload=x\"", "continue_url"),
            ("logo_url = \"data:image/svg+xml,<svg>\"", "logo_url"),
            ("logo_url = \"https://user@evil/\"", "logo_url"),
            ("title = \"\"", "title"),
            ("title = \"a\\u0007b\"", "title"),
            ("lang = \"en\\\" onload=\\\"x\"", "lang"),
            ("continue_delay_seconds = 31", "continue_delay_seconds"),
            ("queue = \"bad name\"", "queue"),
            ("unknown_key = 1", "unknown field"),
        ] {
            let error = entry(&format!("[[page]]\n{text}\n")).unwrap_err();
            assert!(format!("{error:#}").contains(key), "{text}: {error:#}");
        }
        let long = "x".repeat(MAX_TEXT_BYTES + 1);
        assert!(entry(&format!("[[page]]\nintro = \"{long}\"\n")).is_err());
        assert!(entry("[[page]]\n[[page]]\n").is_err(), "two default pages");
        assert!(entry("[[page]]\nqueue = \"a\"\n[[page]]\nqueue = \"a\"\n").is_err());
    }

    #[test]
    fn contrast_follows_wcag() {
        assert!((contrast_ratio([0, 0, 0], [255, 255, 255]) - 21.0).abs() < 1e-9);
        assert!((contrast_ratio([9, 9, 9], [9, 9, 9]) - 1.0).abs() < 1e-9);
        let look = PageLook::default();
        assert!(
            contrast_ratio(
                parse_colour(&look.text).unwrap(),
                parse_colour(&look.background).unwrap()
            ) >= MIN_CONTRAST
        );
    }
}
