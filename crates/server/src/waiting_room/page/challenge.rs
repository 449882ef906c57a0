//! The waiting page's entry challenges (issue 28): what a browser sees before it has a place, when the
//! queue asks new members for a proof of work or a CAPTCHA, or when its address spent its budget.
//!
//! ```text
//! GET /wait/{queue} (no place yet) ─► pow:     428 page; a Web Worker (/wait-assets/pow-worker.js)
//!                                              finds the nonce while a progress bar moves, then the
//!                                              page POSTs {challenge, nonce} to /wait/{queue}
//!                                  ─► captcha: 428 page with the provider's widget in a form; its
//!                                              callback POSTs the token to /wait/{queue}
//! POST /wait/{queue} ─► guards pass: enter, set the cookies, 303 to GET /wait/{queue} (a reload never
//!                       re-posts) ─► refused: the challenge page again, with a fresh challenge
//! ```
//!
//! Both need scripts; with scripts off the page says so (`<noscript>`), and that it can do nothing
//! else: the queue asks for them. The worker is plain JavaScript with its own SHA-256 (see the file);
//! its output is checked against `rankgate_core::queue::challenge::solve` by the browser tests.

use std::fmt::Write as _;

use super::config::PageLook;
use super::html::{escape, head, logo};
use crate::waiting_room::captcha::Captcha;
use crate::waiting_room::entry_guard::IssuedChallenge;

/// The proof-of-work worker's path.
pub const POW_WORKER_PATH: &str = "/wait-assets/pow-worker.js";
/// The proof-of-work worker.
pub const POW_WORKER_JS: &str = include_str!("pow-worker.js");

/// What the challenge page asks for.
pub enum Asked<'a> {
    /// A proof of work.
    Pow(&'a IssuedChallenge),
    /// The provider's CAPTCHA.
    Captcha(&'a Captcha),
}

/// The page that asks the browser for a proof of work or a CAPTCHA before it gets a place; `problem`
/// says why the last try was refused, if it was.
#[must_use]
pub fn challenge_page(
    look: &PageLook,
    queue: &str,
    asked: &Asked<'_>,
    problem: Option<&str>,
    nonce: &str,
) -> String {
    let mut out = String::with_capacity(4 * 1024);
    head(&mut out, look, &look.title, None);
    out.push_str("<body>\n<main>\n");
    logo(&mut out, look);
    let action = format!("/wait/{queue}");
    let _ = write!(
        out,
        "<h1>{title}</h1>\n<noscript><p id=\"needs-scripts\" class=\"keep-open\">This queue checks that \
         visitors are people before giving them a place, and that check needs JavaScript. Please turn \
         scripts on for this site and reload the page.</p></noscript>\n",
        title = escape(&look.title),
    );
    if let Some(problem) = problem {
        let _ = writeln!(out, "<p class=\"small\" id=\"problem\">{}</p>", escape(problem));
    }
    match asked {
        Asked::Pow(issued) => {
            let _ = write!(
                out,
                "<p id=\"checking\">Checking your browser before you join the line: this takes a few \
                 seconds, and keeps bots from taking places ahead of you.</p>\n\
                 <progress id=\"work\" max=\"100\" value=\"0\" aria-label=\"Browser check\"></progress>\n\
                 <p class=\"small\" id=\"work-status\" role=\"status\" aria-live=\"polite\"></p>\n\
                 <form id=\"entry\" method=\"post\" action=\"{action}\" data-challenge=\"{challenge}\" \
                 data-difficulty=\"{difficulty}\" data-worker=\"{worker}\">\n\
                 <input type=\"hidden\" name=\"challenge\" value=\"{challenge}\">\n\
                 <input type=\"hidden\" name=\"nonce\" value=\"\">\n</form>\n\
                 <script nonce=\"{nonce}\">{script}</script>\n",
                action = escape(&action),
                challenge = escape(&issued.challenge),
                difficulty = issued.difficulty,
                worker = POW_WORKER_PATH,
                nonce = escape(nonce),
                script = POW_SCRIPT,
            );
        }
        Asked::Captcha(captcha) => {
            let _ = write!(
                out,
                "<p id=\"checking\">Please confirm you are a person to join the line.</p>\n\
                 <form id=\"entry\" method=\"post\" action=\"{action}\">\n\
                 <div class=\"{class}\" data-sitekey=\"{site_key}\" data-callback=\"rankgateCaptchaDone\"></div>\n\
                 <input type=\"hidden\" name=\"captchaToken\" value=\"\">\n</form>\n\
                 <script nonce=\"{nonce}\">{script}</script>\n\
                 <script nonce=\"{nonce}\" src=\"{src}\" async defer></script>\n",
                action = escape(&action),
                class = captcha.provider.widget_class(),
                site_key = escape(&captcha.site_key),
                nonce = escape(nonce),
                script = CAPTCHA_SCRIPT,
                src = escape(captcha.script_url.as_str()),
            );
        }
    }
    out.push_str("</main>\n</body>\n</html>\n");
    out
}

/// The page for an address that spent its budget of new members (429).
#[must_use]
pub fn budget_page(look: &PageLook, queue: &str, retry_after_seconds: u64) -> String {
    let mut out = String::with_capacity(2 * 1024);
    head(&mut out, look, &look.title, None);
    out.push_str("<body>\n<main>\n");
    logo(&mut out, look);
    let _ = write!(
        out,
        "<h1 id=\"refused\">Too many new visitors from your network</h1>\n<p>This queue takes a limited \
         number of new visitors from one network each minute, so that nobody can fill the line with \
         scripts. Please try again in {seconds} seconds.</p>\n\
         <p><a id=\"rejoin\" class=\"button\" href=\"/wait/{queue}\">Try again</a></p>\n</main>\n</body>\n</html>\n",
        seconds = retry_after_seconds,
        queue = escape(queue),
    );
    out
}

/// The Content-Security-Policy of a challenge page: its inline script by nonce, the worker from this
/// origin, and for a CAPTCHA the provider's script, frames and calls.
#[must_use]
pub fn challenge_csp(script_nonce: &str, captcha: Option<&Captcha>) -> String {
    let provider = captcha.map(|captcha| {
        let origin = captcha.script_origin();
        let extra = match captcha.provider {
            super::super::captcha::Provider::Turnstile => "",
            super::super::captcha::Provider::Hcaptcha => " https://*.hcaptcha.com",
            super::super::captcha::Provider::Recaptcha => " https://www.google.com https://www.gstatic.com",
        };
        format!(" {origin}{extra}")
    });
    let provider = provider.as_deref().unwrap_or("");
    format!(
        "default-src 'none'; script-src 'nonce-{script_nonce}'{provider}; worker-src 'self'; \
         frame-src {frame}; style-src 'unsafe-inline'{provider}; img-src 'self' https: http:; \
         connect-src 'self'{provider}; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
        frame = if provider.is_empty() {
            "'none'"
        } else {
            provider.trim_start()
        },
    )
}

/// Runs the worker, moves the progress bar (expected work is 2^difficulty hashes), posts the solution.
const POW_SCRIPT: &str = r#"
(function () {
  var form = document.getElementById('entry');
  var bar = document.getElementById('work');
  var status = document.getElementById('work-status');
  var expected = Math.pow(2, Number(form.dataset.difficulty));
  var worker = new Worker(form.dataset.worker);
  worker.onmessage = function (event) {
    var done = event.data.hashes || 0;
    bar.value = Math.min(99, Math.round(100 * (1 - Math.exp(-done / expected))));
    if (event.data.nonce !== undefined) {
      bar.value = 100;
      status.textContent = 'Done: joining the line…';
      form.elements.nonce.value = event.data.nonce;
      form.dataset.millis = event.data.millis;
      form.submit();
    }
  };
  worker.onerror = function () {
    status.textContent = 'Your browser could not run the check. Please reload the page.';
  };
  worker.postMessage({ challenge: form.dataset.challenge, difficulty: Number(form.dataset.difficulty) });
})();
"#;

/// The CAPTCHA widget's callback: posts its token.
const CAPTCHA_SCRIPT: &str = r#"
window.rankgateCaptchaDone = function (token) {
  var form = document.getElementById('entry');
  form.elements.captchaToken.value = token;
  form.submit();
};
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pow_page_carries_the_challenge_escaped_and_explains_scripts() {
        let look = PageLook::default();
        let issued = IssuedChallenge {
            challenge: "1.18.99.ab\"<x>.cd".into(),
            difficulty: 18,
            expires_at_ms: 0,
        };
        let html = challenge_page(
            &look,
            "drop",
            &Asked::Pow(&issued),
            Some("expired <again>"),
            "n0nce",
        );
        assert!(
            html.contains("data-challenge=\"1.18.99.ab&quot;&lt;x&gt;.cd\""),
            "{html}"
        );
        assert!(html.contains("data-difficulty=\"18\""));
        assert!(html.contains("<noscript><p id=\"needs-scripts\""));
        assert!(html.contains("expired &lt;again&gt;"));
        assert!(html.contains("<script nonce=\"n0nce\">"));
        assert!(!html.contains("<x>"));
    }

    #[test]
    fn the_csp_allows_the_worker_and_only_the_providers_origins() {
        let csp = challenge_csp("abc", None);
        assert!(csp.contains("script-src 'nonce-abc';"), "{csp}");
        assert!(csp.contains("worker-src 'self'"));
        assert!(csp.contains("frame-src 'none'"));
    }
}
