//! Credentials out of messages and logs (issue 9, defect 9).
//!
//! Connection strings carry passwords: `redis://:password@host`, `postgres://user:password@host/db`,
//! `postgres://host/db?password=…`, and libpq keyword strings such as `host=h password='p w'`. Every
//! place where such a string can reach an error message or a log line passes it through [`redact_url`]
//! first; [`scrub_credentials`] additionally removes the password of a URL from text a library produced
//! (a driver's error that might quote what it was given).
//!
//! ```
//! use rankgate_store::redact::redact_url;
//! assert_eq!(redact_url("redis://:s3cret@127.0.0.1:6379/0"), "redis://***@127.0.0.1:6379/0");
//! assert_eq!(redact_url("host=db password='a b' user=u"), "host=db password=*** user=u");
//! ```

/// What a hidden credential is replaced with.
const HIDDEN: &str = "***";

/// `url` with its credentials hidden: the user-info of a URL (`user:password@` becomes `***@`) and the
/// value of every `…password=` parameter (URL query or libpq keyword form).
pub fn redact_url(url: &str) -> String {
    let without_userinfo = match url.find("://") {
        Some(scheme_end) => {
            let rest = &url[scheme_end + 3..];
            // The user-info ends at the last `@` before the query: a password may hold `/` or `@`
            // unencoded, and hiding a host by mistake is safer than showing a password.
            let head_end = rest.find(['?', '#']).unwrap_or(rest.len());
            match rest[..head_end].rfind('@') {
                Some(at) => format!("{}{HIDDEN}{}", &url[..scheme_end + 3], &rest[at..]),
                None => url.to_string(),
            }
        }
        None => url.to_string(),
    };
    redact_password_parameters(&without_userinfo)
}

/// `text` with the password of `url` (as written, and percent-decoded) replaced wherever it appears,
/// and any URL-shaped copy of `url` redacted.
pub fn scrub_credentials(text: &str, url: &str) -> String {
    let mut scrubbed = text.replace(url, &redact_url(url));
    for secret in secrets_of(url) {
        if secret.len() >= 3 {
            scrubbed = scrubbed.replace(&secret, HIDDEN);
        }
    }
    redact_password_parameters(&scrubbed)
}

/// The passwords `url` carries: in its user-info and in `password=` parameters, raw and decoded.
fn secrets_of(url: &str) -> Vec<String> {
    let mut secrets = Vec::new();
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        let head_end = rest.find(['?', '#']).unwrap_or(rest.len());
        if let Some(at) = rest[..head_end].rfind('@') {
            let userinfo = &rest[..at];
            if let Some((_, password)) = userinfo.split_once(':') {
                secrets.push(password.to_string());
            }
        }
    }
    for (start, end) in password_value_spans(url) {
        let value = url[start..end].trim_matches('\'');
        secrets.push(value.to_string());
    }
    let decoded: Vec<String> = secrets.iter().filter_map(|s| percent_decode(s)).collect();
    secrets.extend(decoded);
    secrets.retain(|s| !s.is_empty());
    secrets
}

/// Replaces the value of every `…password=value` (any case; `sslpassword` too) with [`HIDDEN`].
fn redact_password_parameters(text: &str) -> String {
    let spans = password_value_spans(text);
    if spans.is_empty() {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (start, end) in spans {
        out.push_str(&text[copied..start]);
        out.push_str(HIDDEN);
        copied = end;
    }
    out.push_str(&text[copied..]);
    out
}

/// Byte spans of the values of `password` parameters: `password = value` up to whitespace, `&`, `#` or
/// `;`, or a single-quoted value with `\'` escapes (libpq).
fn password_value_spans(text: &str) -> Vec<(usize, usize)> {
    let lower = text.to_ascii_lowercase();
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    let mut from = 0;
    while let Some(found) = lower[from..].find("password") {
        let mut i = from + found + "password".len();
        from = i;
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        if i >= bytes.len() || bytes[i] != b'=' {
            continue;
        }
        i += 1;
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        let start = i;
        if i < bytes.len() && bytes[i] == b'\'' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'\'' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(bytes.len());
        } else {
            while i < bytes.len() && !matches!(bytes[i], b' ' | b'\t' | b'\n' | b'&' | b'#' | b';') {
                i += 1;
            }
        }
        if i > start {
            spans.push((start, i));
        }
        from = i;
    }
    spans
}

/// Percent-decodes `s` when it holds an escape and decodes to UTF-8. (A `%` not followed by two hex
/// digits stays as it is, so a password such as `50%off%40` still yields its decoded form to hide.)
fn percent_decode(s: &str) -> Option<String> {
    if !s.contains('%') {
        return None;
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls_and_keyword_strings_are_hidden() {
        let cases = [
            ("redis://:s3cret@127.0.0.1:1", "redis://***@127.0.0.1:1"),
            ("redis://user:s3cret@h:6379/0", "redis://***@h:6379/0"),
            ("rediss://u:p%40ss@h/0?x=1", "rediss://***@h/0?x=1"),
            (
                "postgres://u:s3/cr@t@127.0.0.1:1/x",
                "postgres://***@127.0.0.1:1/x",
            ),
            (
                "postgres://h/db?user=u&password=s3cret&x=1",
                "postgres://h/db?user=u&password=***&x=1",
            ),
            (
                "host=h user=u password=s3cret dbname=x",
                "host=h user=u password=*** dbname=x",
            ),
            (
                "host=h password = 'a \\' b' dbname=x",
                "host=h password = *** dbname=x",
            ),
            ("host=h sslpassword=k", "host=h sslpassword=***"),
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("no url here", "no url here"),
        ];
        for (url, redacted) in cases {
            assert_eq!(redact_url(url), redacted, "{url}");
        }
    }

    #[test]
    fn a_library_message_quoting_the_password_is_scrubbed() {
        let url = "redis://:p%40ss-word@127.0.0.1:1";
        let message = format!("cannot connect to {url}: auth p@ss-word refused (p%40ss-word)");
        let scrubbed = scrub_credentials(&message, url);
        assert!(!scrubbed.contains("ss-word"), "{scrubbed}");
        assert!(scrubbed.contains("redis://***@127.0.0.1:1"), "{scrubbed}");
    }
}
