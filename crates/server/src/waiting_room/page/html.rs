//! The waiting page's HTML: rendered on the server with the current position, so it is complete with
//! scripts off; a small inline script then follows the member's position stream (polling when the stream
//! fails) and updates the same elements.
//!
//! Every configured and every request-derived string goes through [`escape`] on its way into the page
//! (text and attribute values alike); the script reads its inputs from `data-` attributes, never from
//! markup spliced into JavaScript, and writes only with `textContent`. The response's
//! Content-Security-Policy allows only this script (by nonce), so an injection that slipped past the
//! escaping still could not run.
//!
//! Scripts off: a `<meta http-equiv="refresh">` inside `<noscript>` (with scripts on, a browser parses
//! `<noscript>` as text, so the script's own updates are not cut short by reloads) reloads the page at the
//! polling interval, carrying the first rank seen in `?first=` for the progress bar.

use std::fmt::Write as _;

use rankgate_core::queue::ClaimRejection;

use super::config::PageLook;

/// `&`, `<`, `>`, `"` and `'` as character references: safe in element text and in quoted attributes.
#[must_use]
pub fn escape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len() + 8);
    for c in raw.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `template` with `{name}` replaced by `value` (both still raw: escape the result).
#[must_use]
pub fn fill(template: &str, name: &str, value: &str) -> String {
    template.replace(&format!("{{{name}}}"), value)
}

/// A wait in words; the script's `words` does the same.
#[must_use]
pub fn duration_words(seconds: u64) -> String {
    match seconds {
        0..=59 => "less than a minute".into(),
        60..=3599 => {
            let minutes = seconds.div_ceil(60);
            format!("about {minutes} minute{}", if minutes == 1 { "" } else { "s" })
        }
        _ => {
            let minutes = seconds.div_ceil(60);
            format!("about {} h {} min", minutes / 60, minutes % 60)
        }
    }
}

/// The wait most people stay under, in words that follow "less than" in `estimate_range_text` (the
/// default "9 in 10 people wait less than {p90}"): "a minute" under a minute, so the page never reads
/// "less than less than a minute"; otherwise [`duration_words`]. The script's `bound` does the same.
#[must_use]
pub fn bound_words(seconds: u64) -> String {
    if seconds < 60 {
        "a minute".into()
    } else {
        duration_words(seconds)
    }
}

/// What the waiting page shows.
#[derive(Debug, Clone)]
pub struct Waiting<'a> {
    pub queue: &'a str,
    pub member: &'a str,
    /// 0-based rank (`None` when the store had no rank to give).
    pub rank: Option<u64>,
    /// The rank at the member's first view, for the progress bar.
    pub first_rank: u64,
    pub estimate_seconds: Option<u64>,
    pub estimate_p90_seconds: Option<u64>,
    pub polling_interval_seconds: f64,
    /// When the position was read, already formatted (`HH:MM:SS UTC`) and as RFC 3339.
    pub updated: (String, String),
    /// The CSP nonce of the inline script.
    pub nonce: &'a str,
}

pub(super) fn head(out: &mut String, look: &PageLook, title: &str, refresh: Option<(u64, &str, bool)>) {
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"{lang}\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"robots\" content=\"noindex\">\n<title>{title}</title>\n",
        lang = escape(&look.lang),
        title = escape(title),
    );
    if let Some((seconds, url, scripts_off_only)) = refresh {
        let meta = format!(
            "<meta http-equiv=\"refresh\" content=\"{seconds};url={}\">",
            escape(url)
        );
        if scripts_off_only {
            let _ = writeln!(out, "<noscript>{meta}</noscript>");
        } else {
            let _ = writeln!(out, "{meta}");
        }
    }
    let _ = write!(
        out,
        "<style>\n\
         :root{{--bg:{bg};--fg:{fg};--accent:{accent};--on-accent:{on_accent}}}\n\
         *{{box-sizing:border-box}}\n\
         body{{margin:0;background:var(--bg);color:var(--fg);font:1rem/1.5 system-ui,-apple-system,\"Segoe UI\",Roboto,sans-serif}}\n\
         main{{max-width:36rem;margin:0 auto;padding:1.25rem 1rem 2rem}}\n\
         .logo{{display:block;max-width:100%;max-height:3.5rem;margin-bottom:1rem}}\n\
         h1{{font-size:1.5rem;line-height:1.25;margin:0 0 .5rem}}\n\
         .position{{font-size:1.375rem;font-weight:700;margin:1.25rem 0 .25rem}}\n\
         progress{{width:100%;height:1rem;accent-color:var(--accent)}}\n\
         .keep-open{{font-weight:600;border-left:.25rem solid var(--accent);padding-left:.75rem}}\n\
         .button{{display:inline-block;background:var(--accent);color:var(--on-accent);padding:.75rem 1.25rem;\
         border-radius:.375rem;font-weight:700;text-decoration:none;max-width:100%}}\n\
         a{{color:inherit}}\n\
         a:focus-visible{{outline:.2rem solid var(--fg);outline-offset:.2rem}}\n\
         .small{{font-size:.875rem}}\n\
         </style>\n</head>\n",
        bg = look.background,
        fg = look.text,
        accent = look.accent,
        on_accent = look.accent_text,
    );
}

pub(super) fn logo(out: &mut String, look: &PageLook) {
    if let Some(url) = &look.logo_url {
        let _ = writeln!(
            out,
            "<img class=\"logo\" src=\"{}\" alt=\"{}\">",
            escape(url),
            escape(&look.title)
        );
    }
}

/// The waiting page.
#[must_use]
pub fn waiting_page(look: &PageLook, page: &Waiting<'_>) -> String {
    let mut out = String::with_capacity(8 * 1024);
    // The meta refresh waits at least the polling interval, rounded up, so scripts-off reloads are polls
    // at the advertised cadence.
    let refresh_seconds = page.polling_interval_seconds.ceil().max(1.0) as u64;
    let refresh_url = format!("?first={}", page.first_rank);
    head(
        &mut out,
        look,
        &look.title,
        Some((refresh_seconds, &refresh_url, true)),
    );
    let progress = match page.rank {
        // u128: `first` comes from the query string, and 100 × a hostile u64 must not overflow.
        Some(rank) if page.first_rank > 0 => {
            let first = u128::from(page.first_rank);
            100 * (first - u128::from(rank.min(page.first_rank))) / first
        }
        Some(_) => 100,
        None => 0,
    };
    let (position, ahead) = match page.rank {
        Some(rank) => (
            fill(&look.position_text, "position", &(rank + 1).to_string()),
            fill(&look.ahead_text, "ahead", &rank.to_string()),
        ),
        None => (look.intro.clone(), String::new()),
    };
    let estimate = match (page.estimate_seconds, page.estimate_p90_seconds) {
        (None, _) => look.paused_text.clone(),
        (Some(median), Some(p90)) => fill(
            &fill(&look.estimate_range_text, "estimate", &duration_words(median)),
            "p90",
            &bound_words(p90),
        ),
        (Some(median), None) => fill(&look.estimate_text, "estimate", &duration_words(median)),
    };
    let _ = write!(
        out,
        "<body data-queue=\"{queue}\" data-member=\"{member}\" data-first-rank=\"{first}\" \
         data-interval=\"{interval}\" data-t-position=\"{t_position}\" data-t-ahead=\"{t_ahead}\" \
         data-t-estimate=\"{t_estimate}\" data-t-range=\"{t_range}\" data-t-paused=\"{t_paused}\" \
         data-t-updated=\"{t_updated}\">\n<main>\n",
        queue = escape(page.queue),
        member = escape(page.member),
        first = page.first_rank,
        interval = page.polling_interval_seconds,
        t_position = escape(&look.position_text),
        t_ahead = escape(&look.ahead_text),
        t_estimate = escape(&look.estimate_text),
        t_range = escape(&look.estimate_range_text),
        t_paused = escape(&look.paused_text),
        t_updated = escape(&look.updated_text),
    );
    logo(&mut out, look);
    let _ = write!(
        out,
        "<h1>{title}</h1>\n<p>{intro}</p>\n\
         <div id=\"status\" role=\"status\" aria-live=\"polite\" aria-atomic=\"true\">\n\
         <p class=\"position\" id=\"position\" data-rank=\"{rank}\">{position}</p>\n\
         <p id=\"ahead\">{ahead}</p>\n</div>\n\
         <progress id=\"progress\" max=\"100\" value=\"{progress}\" aria-label=\"Progress to the front of the line\">{progress}%</progress>\n\
         <p id=\"estimate\">{estimate}</p>\n\
         <p class=\"small\" id=\"updated\">{updated}</p>\n\
         <p class=\"keep-open\" id=\"keep-open\">{keep_open}</p>\n\
         <p><a id=\"refresh\" href=\"{refresh_url}\">{refresh_text}</a></p>\n\
         </main>\n<script nonce=\"{nonce}\">{script}</script>\n</body>\n</html>\n",
        title = escape(&look.title),
        intro = escape(&look.intro),
        rank = page.rank.map_or(String::new(), |r| r.to_string()),
        position = escape(&position),
        ahead = escape(&ahead),
        estimate = escape(&estimate),
        updated = time_html(&look.updated_text, &page.updated),
        keep_open = escape(&look.keep_open_text),
        refresh_url = escape(&refresh_url),
        refresh_text = escape(&look.refresh_text),
        nonce = escape(page.nonce),
        script = SCRIPT,
    );
    out
}

/// `template` (`updated_text`, `held_until_text`) with `{time}` as a `<time>` element; each piece escaped.
fn time_html(template: &str, (time, rfc3339): &(String, String)) -> String {
    let time = format!("<time datetime=\"{}\">{}</time>", escape(rfc3339), escape(time));
    template
        .split("{time}")
        .map(escape)
        .collect::<Vec<_>>()
        .join(&time)
}

/// Which admitted page to show.
#[derive(Debug, Clone)]
pub enum Admitted {
    /// READY: the page continues by itself after `continue_delay_seconds`, and says until when the turn
    /// is held: `(HH:MM:SS UTC, RFC 3339)` of the token's expiry, when known.
    Ready { held_until: Option<(String, String)> },
    /// CLAIMED: an order is in flight; the page does not send the shopper on again by itself.
    InProgress,
}

/// The admitted page: the continue link, focused, and (READY) a refresh that continues by itself, with
/// `moving_on_text` saying so and `held_until_text` saying how long the turn stays valid. Without a
/// continue URL (see `PageLook::continue_url`) it has neither link nor refresh and says `return_text`.
#[must_use]
pub fn admitted_page(look: &PageLook, admitted: &Admitted) -> String {
    let mut out = String::with_capacity(4 * 1024);
    let ready = matches!(admitted, Admitted::Ready { .. });
    // A member whose order is already in flight (CLAIMED) is not sent on again by itself: that navigation
    // would be a second order attempt; the link stays for them to use.
    let refresh = look
        .continue_url
        .as_deref()
        .filter(|_| ready)
        .map(|url| (look.continue_delay_seconds, url, false));
    head(&mut out, look, &look.admitted_text, refresh);
    out.push_str("<body>\n<main>\n");
    logo(&mut out, look);
    let _ = write!(
        out,
        "<h1 id=\"admitted\">{admitted}</h1>\n<p>{title}</p>\n",
        admitted = escape(&look.admitted_text),
        title = escape(&look.title),
    );
    if refresh.is_some() {
        let seconds = look.continue_delay_seconds.to_string();
        let _ = writeln!(
            out,
            "<p id=\"moving-on\">{}</p>",
            escape(&fill(&look.moving_on_text, "seconds", &seconds))
        );
    }
    if let Admitted::Ready {
        held_until: Some(held_until),
    } = admitted
    {
        let _ = writeln!(
            out,
            "<p id=\"held-until\">{}</p>",
            time_html(&look.held_until_text, held_until)
        );
    }
    match &look.continue_url {
        Some(url) => {
            let _ = writeln!(
                out,
                "<p><a id=\"continue\" class=\"button\" href=\"{url}\" autofocus>{text}</a></p>",
                url = escape(url),
                text = escape(&look.continue_text),
            );
        }
        None => {
            let _ = writeln!(out, "<p id=\"return\">{}</p>", escape(&look.return_text));
        }
    }
    out.push_str("</main>\n</body>\n</html>\n");
    out
}

/// What a browser sees when the gate refuses its request (`Accept: text/html`): the waiting room's
/// look, what happened (`message`, the JSON answer's `error`) and what to do next, with a link back
/// into the queue's waiting page where joining again helps.
#[must_use]
pub fn gate_refusal_page(look: &PageLook, queue: &str, status: u16, message: &str) -> String {
    let rejected = |rejection: ClaimRejection| message.ends_with(&rejection.to_string());
    let (heading, advice, rejoin) = match status {
        401 if rejected(ClaimRejection::AlreadyConsumed) => (
            "This turn was already used",
            "An order was already placed with this turn, and a turn buys one order. Check your orders \
             or confirmation email before trying again; to order again, join the queue again.",
            true,
        ),
        401 if rejected(ClaimRejection::Expired) => (
            "Your turn has expired",
            "A turn is held for a limited time, and this one is over. Join the queue again.",
            true,
        ),
        401 | 403 => (
            "You need a turn first",
            "This page is protected by the waiting room: join the queue and you will be sent here \
             when it is your turn.",
            true,
        ),
        409 => (
            "Your order is being placed",
            "An order with this turn is in progress right now, and a turn buys one order. Wait for \
             its confirmation rather than sending it again.",
            false,
        ),
        503 | 504 => (
            "The shop is busy",
            "Your turn was not used. Please try again in a moment: reload this page.",
            false,
        ),
        _ => (
            "This request could not be completed",
            "Your turn was not used. Go back and try again.",
            false,
        ),
    };
    let mut out = String::with_capacity(4 * 1024);
    head(&mut out, look, heading, None);
    out.push_str("<body>\n<main>\n");
    logo(&mut out, look);
    let _ = write!(
        out,
        "<h1 id=\"refused\">{heading}</h1>\n<p>{advice}</p>\n<p class=\"small\" id=\"reason\">{message} \
         ({status})</p>\n",
        heading = escape(heading),
        advice = escape(advice),
        message = escape(message),
    );
    if rejoin {
        let _ = writeln!(
            out,
            "<p><a id=\"rejoin\" class=\"button\" href=\"/wait/{}\" autofocus>Join the queue</a></p>",
            escape(queue)
        );
    }
    out.push_str("</main>\n</body>\n</html>\n");
    out
}

/// The waiting page's script (no build step, no dependencies). It reads its inputs from the body's
/// `data-` attributes and writes with `textContent` only.
const SCRIPT: &str = r#"
(function () {
  "use strict";
  var d = document.body.dataset;
  var api = "/v1/queues/" + encodeURIComponent(d.queue) + "/entries/" + encodeURIComponent(d.member);
  var key = "rankgate:first:" + d.queue + ":" + d.member;
  var interval = parseFloat(d.interval) || 1;
  var first = NaN;
  try { first = parseInt(sessionStorage.getItem(key), 10); } catch (e) {}
  if (isNaN(first)) { first = parseInt(d.firstRank, 10) || 0; }
  function remember() { try { sessionStorage.setItem(key, String(first)); } catch (e) {} }
  remember();
  function $(id) { return document.getElementById(id); }
  function fill(template, name, value) { return template.split("{" + name + "}").join(String(value)); }
  function words(s) {
    if (s < 60) { return "less than a minute"; }
    var m = Math.ceil(s / 60);
    if (m < 60) { return "about " + m + " minute" + (m === 1 ? "" : "s"); }
    return "about " + Math.floor(m / 60) + " h " + (m % 60) + " min";
  }
  function bound(s) { return s < 60 ? "a minute" : words(s); }
  var leaving = false;
  function show(p) {
    if (p.status !== "WAITING") {
      // READY: the server side sets the gate's cookie (HttpOnly) and continues; anything else: it re-enters.
      leaving = true;
      location.replace(location.pathname);
      return;
    }
    interval = p.pollingIntervalSeconds || interval;
    if (typeof p.rank !== "number") { return; }
    if (p.rank > first) { first = p.rank; remember(); }
    $("position").textContent = fill(d.tPosition, "position", p.rank + 1);
    $("position").setAttribute("data-rank", String(p.rank));
    $("ahead").textContent = fill(d.tAhead, "ahead", p.rank);
    var progress = first > 0 ? Math.round(100 * (first - p.rank) / first) : 100;
    $("progress").value = progress;
    $("progress").textContent = progress + "%";
    var e = p.estimatedWaitSeconds, p90 = p.estimatedWaitSecondsP90;
    $("estimate").textContent = (e === null || e === undefined) ? d.tPaused
      : (typeof p90 === "number" ? fill(fill(d.tRange, "estimate", words(e)), "p90", bound(p90))
                                 : fill(d.tEstimate, "estimate", words(e)));
    var now = new Date();
    var time = document.createElement("time");
    time.setAttribute("datetime", now.toISOString());
    // The same "HH:MM:SS UTC" the server writes with scripts off, whatever the browser's locale.
    time.textContent = now.toISOString().slice(11, 19) + " UTC";
    var parts = d.tUpdated.split("{time}");
    var updated = $("updated");
    updated.textContent = parts[0];
    updated.appendChild(time);
    updated.appendChild(document.createTextNode(parts.slice(1).join("{time}")));
  }
  var timer = null;
  function later(seconds) {
    if (leaving) { return; }
    clearTimeout(timer);
    timer = setTimeout(poll, Math.max(1, seconds) * 1000);
  }
  function poll() {
    fetch(api, { headers: { "Accept": "application/json" }, credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.status === 429) { later(parseInt(r.headers.get("Retry-After"), 10) || interval); return; }
        if (!r.ok) { later(interval * 2); return; }
        return r.json().then(function (p) { show(p); later(interval); });
      })
      .catch(function () { later(interval * 2); });
  }
  function stream() {
    var source = new EventSource(api + "/events");
    var failures = 0;
    source.addEventListener("position", function (event) {
      failures = 0;
      try { show(JSON.parse(event.data)); } catch (e) {}
    });
    source.onerror = function () {
      failures += 1;
      // The browser retries a dropped stream by itself; a refused or repeatedly failing one means polling.
      if (source.readyState === 2 || failures >= 2) { source.close(); later(interval); }
    };
  }
  if (window.EventSource) { stream(); } else { later(interval); }
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_covers_the_five_characters() {
        assert_eq!(
            escape("<a href=\"x\" title='y'>&</a>"),
            "&lt;a href=&quot;x&quot; title=&#39;y&#39;&gt;&amp;&lt;/a&gt;"
        );
    }

    fn waiting<'a>(rank: u64, first_rank: u64, p90: Option<u64>) -> Waiting<'a> {
        Waiting {
            queue: "sale",
            member: "m-1",
            rank: Some(rank),
            first_rank,
            estimate_seconds: Some(30),
            estimate_p90_seconds: p90,
            polling_interval_seconds: 1.15,
            updated: ("12:00:00 UTC".into(), "2026-12-01T12:00:00Z".into()),
            nonce: "n0nce",
        }
    }

    #[test]
    fn the_page_shows_the_range_when_the_position_has_a_p90_and_progress_from_the_first_rank() {
        let look = PageLook::default();
        let html = waiting_page(&look, &waiting(9, 19, Some(150)));
        assert!(html.contains("You are number 10 in line"), "{html}");
        assert!(html.contains("People ahead of you: 9"));
        assert!(html.contains("less than a minute (9 in 10 people wait less than about 3 minutes)"));
        assert!(html.contains("value=\"52\""), "(19 - 9) / 19 of the way: {html}");
        assert!(
            html.contains("<noscript><meta http-equiv=\"refresh\" content=\"2;url=?first=19\"></noscript>")
        );
        assert!(html.contains("<time datetime=\"2026-12-01T12:00:00Z\">12:00:00 UTC</time>"));
        let without = waiting_page(&look, &waiting(9, 19, None));
        assert!(
            without.contains("Estimated wait: less than a minute</p>"),
            "{without}"
        );
        let hostile_first = waiting_page(&look, &waiting(0, u64::MAX, None));
        assert!(hostile_first.contains("value=\"100\""));
    }

    #[test]
    fn the_admitted_page_says_it_moves_on_and_until_when_the_turn_is_held() {
        let look = PageLook {
            continue_url: Some("/shop/checkout".into()),
            ..PageLook::default()
        };
        let held_until = Some(("12:05:00 UTC".to_owned(), "2026-12-01T12:05:00Z".to_owned()));
        let ready = admitted_page(&look, &Admitted::Ready { held_until });
        assert!(ready.contains("content=\"2;url=/shop/checkout\""), "{ready}");
        assert!(ready.contains("Taking you to the shop in 2 s."), "{ready}");
        assert!(ready.contains(
            "Your turn is held for you until <time datetime=\"2026-12-01T12:05:00Z\">12:05:00 UTC</time>."
        ));
        assert!(ready.contains("href=\"/shop/checkout\""));
        let in_progress = admitted_page(&look, &Admitted::InProgress);
        assert!(
            !in_progress.contains("http-equiv=\"refresh\""),
            "no second order attempt by itself"
        );
        assert!(!in_progress.contains("Taking you"));
        assert!(in_progress.contains("href=\"/shop/checkout\""));
        let nowhere = admitted_page(&PageLook::default(), &Admitted::Ready { held_until: None });
        assert!(!nowhere.contains("http-equiv=\"refresh\""), "{nowhere}");
        assert!(!nowhere.contains("href=\"/\""), "never rankgate's own dashboard");
        assert!(nowhere.contains("Go back to the shop&#39;s page to continue."));
    }

    #[test]
    fn a_gate_refusal_says_what_happened_and_what_to_do() {
        let look = PageLook::default();
        let used = gate_refusal_page(&look, "sale", 401, "token: the entry token was already used");
        assert!(used.contains("This turn was already used"), "{used}");
        assert!(used.contains("token: the entry token was already used (401)"));
        assert!(used.contains("href=\"/wait/sale\""));
        let in_flight = gate_refusal_page(&look, "sale", 409, "already claimed by an order in flight");
        assert!(in_flight.contains("Your order is being placed"), "{in_flight}");
        let expired = gate_refusal_page(&look, "sale", 401, "token: the entry token has expired");
        assert!(expired.contains("Your turn has expired"), "{expired}");
        let none = gate_refusal_page(&look, "sale", 401, "X-Entry-Token: missing entry token");
        assert!(none.contains("You need a turn first"), "{none}");
        let busy = gate_refusal_page(&look, "sale", 503, "queue store unavailable");
        assert!(busy.contains("try again in a moment"));
        assert!(
            !busy.contains("/wait/sale"),
            "rejoining does not help a busy shop"
        );
        let hostile = gate_refusal_page(&look, "sale", 401, "<script>x</script>");
        assert!(!hostile.contains("<script>x"), "{hostile}");
    }

    #[test]
    fn a_p90_under_a_minute_reads_once_as_less_than_a_minute() {
        let html = waiting_page(&PageLook::default(), &waiting(0, 0, Some(30)));
        assert!(
            html.contains("less than a minute (9 in 10 people wait less than a minute)"),
            "{html}"
        );
        assert!(!html.contains("less than less than"));
        assert_eq!(bound_words(59), "a minute");
        assert_eq!(bound_words(60), "about 1 minute");
    }

    #[test]
    fn durations_read_as_words() {
        assert_eq!(duration_words(0), "less than a minute");
        assert_eq!(duration_words(60), "about 1 minute");
        assert_eq!(duration_words(61), "about 2 minutes");
        assert_eq!(duration_words(3600), "about 1 h 0 min");
    }
}
