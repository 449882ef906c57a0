//! Entity tags of cacheable reads (SPEC 1.5: "an `ETag` that changes exactly when the served data does")
//! and the `If-None-Match` test that turns a repeated read into a `304 Not Modified`.
//!
//! **The tag is a hash of the response body**, made once where the body is made (and cached beside it by
//! the reader's response cache), so it changes exactly when the bytes a client would get change — by
//! construction, whichever store answered and however the answer was routed. A tag derived from
//! generation counters instead would change on every ingest anywhere (the engine generation is global)
//! or miss a change (a catalogue edit, a stale flag), and would differ between instances serving the same
//! data; the body hash is equal on every instance that serves equal bytes, which is what a CDN in front of
//! several instances wants. (The body carries `asOf`, the time of the latest ingest the data includes, so
//! an answer's tag moves with `asOf` too: that is part of what is served.)
//!
//! The hash is **XXH3-64** (seed 0), whose output the xxHash specification fixes: every instance, whatever
//! Rust or crate version built it, gives a body the same tag, which is what lets a CDN revalidate against
//! any of them. (It was `std`'s `DefaultHasher`, whose algorithm Rust does not promise to keep across
//! releases, so two instances built differently could disagree.) It is also cheaper: a 355-byte rank
//! body's tag costs ~490 instructions against SipHash-1-3's ~1,100 (callgrind, release build, the hex
//! included; 60 bytes: 191 against 347; 3,000 bytes: 2,245 against 7,706), with no allocation. 64 bits
//! make an accidental collision between two versions of one URL's body vanishingly unlikely; a collision
//! needs no secrecy to be harmless to anyone but the client that asked for its own cached copy. The test
//! vectors below pin the algorithm: a change of hash changes every tag in the field, so it must be a
//! deliberate one.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue};

/// A strong entity tag: `"` + 16 lowercase hex digits + `"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EntityTag([u8; 18]);

/// The longest `If-None-Match` value looked at, in bytes. A client or CDN revalidating sends one tag (or a
/// few); a longer header is answered in full (200), never scanned further, so a hostile header costs at
/// most this much work on top of what the HTTP parser already bounds.
pub const MAX_IF_NONE_MATCH_BYTES: usize = 8 * 1024;

impl EntityTag {
    /// The tag of `body`.
    pub fn of_body(body: &[u8]) -> EntityTag {
        let hash = xxhash_rust::xxh3::xxh3_64(body);
        let mut tag = [b'"'; 18];
        hex::encode_to_slice(hash.to_be_bytes(), &mut tag[1..17]).expect("8 bytes are 16 hex digits");
        EntityTag(tag)
    }

    /// The header value, quotes included.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("quotes and hex digits are ASCII")
    }

    /// The opaque part, without the quotes.
    fn opaque(&self) -> &[u8] {
        &self.0[1..17]
    }

    /// Whether `If-None-Match` values (every header given, in order) match this tag, by the weak
    /// comparison RFC 9110 §13.1.2 prescribes for it: `*` matches, and so does any listed tag whose
    /// opaque part equals ours, `W/` prefix or not. Malformed list members are skipped; a header longer
    /// than [`MAX_IF_NONE_MATCH_BYTES`] (in all) is not read and matches nothing.
    pub fn matches_if_none_match<'a>(&self, values: impl IntoIterator<Item = &'a [u8]>) -> bool {
        let mut budget = MAX_IF_NONE_MATCH_BYTES;
        for value in values {
            let Some(rest) = budget.checked_sub(value.len()) else {
                return false;
            };
            budget = rest;
            if self.listed_in(value) {
                return true;
            }
        }
        false
    }

    /// One header value: `*`, or a comma-separated list of (possibly weak) quoted tags. One pass, no
    /// allocation.
    fn listed_in(&self, value: &[u8]) -> bool {
        let mut rest = value;
        loop {
            rest = trim_start(rest);
            if rest.is_empty() {
                return false;
            }
            if let Some(after) = rest.strip_prefix(b"*") {
                if trim_start(after).first().is_none_or(|b| *b == b',') {
                    return true;
                }
            }
            let unprefixed = rest.strip_prefix(b"W/").unwrap_or(rest);
            if let Some(quoted) = unprefixed.strip_prefix(b"\"") {
                if let Some(close) = quoted.iter().position(|b| *b == b'"') {
                    if &quoted[..close] == self.opaque() {
                        return true;
                    }
                    rest = &quoted[close + 1..];
                }
            }
            // On to the next member (also past anything malformed).
            match rest.iter().position(|b| *b == b',') {
                Some(comma) => rest = &rest[comma + 1..],
                None => return false,
            }
        }
    }
}

fn trim_start(bytes: &[u8]) -> &[u8] {
    let skip = bytes.iter().take_while(|b| matches!(b, b' ' | b'\t')).count();
    &bytes[skip..]
}

/// A request's `If-None-Match` values, in order. Extracted alone rather than as a whole `HeaderMap`,
/// which would copy every header of every read; without the header this allocates nothing.
pub struct IfNoneMatch(Vec<HeaderValue>);

impl IfNoneMatch {
    /// The `If-None-Match` values of `headers`.
    pub fn of(headers: &HeaderMap) -> IfNoneMatch {
        IfNoneMatch(headers.get_all(header::IF_NONE_MATCH).iter().cloned().collect())
    }

    /// No `If-None-Match` (the fast path leaves conditional requests to hyper and the router).
    pub const fn absent() -> IfNoneMatch {
        IfNoneMatch(Vec::new())
    }

    /// Whether the client already holds the body tagged `tag` (it matches one of the values).
    pub fn holds(&self, tag: &EntityTag) -> bool {
        tag.matches_if_none_match(self.0.iter().map(HeaderValue::as_bytes))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IfNoneMatch {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(IfNoneMatch::of(&parts.headers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(tag: &EntityTag, header: &str) -> bool {
        tag.matches_if_none_match([header.as_bytes()])
    }

    #[test]
    fn the_tag_is_a_quoted_hash_of_the_body_and_changes_with_it() {
        let tag = EntityTag::of_body(b"{\"rank\":1}");
        assert_eq!(tag, EntityTag::of_body(b"{\"rank\":1}"), "deterministic");
        assert_ne!(tag, EntityTag::of_body(b"{\"rank\":2}"));
        let text = tag.as_str();
        assert_eq!(text.len(), 18);
        assert!(text.starts_with('"') && text.ends_with('"'));
        assert!(text[1..17]
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }

    /// The algorithm is pinned: XXH3-64 with seed 0, the hash in big-endian hex. The empty body's value
    /// is the xxHash specification's own sanity vector; the rank body's was computed with the C reference
    /// implementation (`XXH3_64bits` of libxxhash 0.8.1). A body over 240 bytes takes XXH3's long-input
    /// path, a short one its 9-16-byte path.
    #[test]
    fn the_tag_is_xxh3_64_of_the_body_by_definition() {
        assert_eq!(EntityTag::of_body(b"").as_str(), "\"2d06800538d394c2\"");
        assert_eq!(
            EntityTag::of_body(b"{\"rank\":1}").as_str(),
            "\"904c1d389b3c093e\""
        );
        let rank_body = concat!(
            r#"{"asOf":"2026-07-10T12:00:00Z","at":"2026-07-10T12:00:05Z","carry":0.0,"category":"lamps","#,
            r#""metrics":{"views":120,"likes":8,"units":3,"sales":8997},"percentile":2.5,"period":"day","#,
            r#""periodEnd":"2026-07-11T00:00:00Z","periodStart":"2026-07-10T00:00:00Z","policyVersion":1,"#,
            r#""productId":"p-42","rank":3,"ranker":"popular","score":56.2,"stale":false,"total":120}"#
        );
        assert_eq!(rank_body.len(), 355);
        assert_eq!(
            EntityTag::of_body(rank_body.as_bytes()).as_str(),
            "\"c485cf5ece354d2c\""
        );
    }

    #[test]
    fn if_none_match_takes_star_lists_and_weak_tags() {
        let tag = EntityTag::of_body(b"body");
        let quoted = tag.as_str();
        let opaque = &quoted[1..17];
        assert!(matches(&tag, quoted));
        assert!(matches(&tag, &format!("W/{quoted}")), "weak comparison");
        assert!(matches(&tag, "*"));
        assert!(matches(&tag, " * "));
        assert!(matches(&tag, &format!("\"x\", W/\"y\" ,{quoted}")));
        assert!(
            matches(&tag, &format!("garbage, {quoted}")),
            "a malformed member is skipped"
        );
        assert!(!matches(&tag, "\"0000000000000000\""));
        assert!(!matches(&tag, opaque), "unquoted is not a tag");
        assert!(!matches(&tag, &format!("\"{opaque}x\"")));
        assert!(!matches(&tag, "*x"));
        assert!(!matches(&tag, ""));
        assert!(!matches(&tag, "\"unterminated"));
        assert!(
            tag.matches_if_none_match(["\"a\"".as_bytes(), quoted.as_bytes()]),
            "several headers are one list"
        );
    }

    #[test]
    fn a_huge_if_none_match_is_not_read() {
        let tag = EntityTag::of_body(b"body");
        let huge = format!("{}{}", "\"x\",".repeat(MAX_IF_NONE_MATCH_BYTES), tag.as_str());
        assert!(
            !matches(&tag, &huge),
            "past the bound: answered in full, not scanned"
        );
        let commas = ",".repeat(MAX_IF_NONE_MATCH_BYTES - 20);
        assert!(
            matches(&tag, &format!("{commas}{}", tag.as_str())),
            "within it: found"
        );
    }
}
