//! Cutting an ingest body into one byte range per event, then reading each range on its own.
//!
//! Why not `serde_json::from_slice::<Value>(body)`: one unreadable value anywhere (a `NaN`, an `Infinity`,
//! a bad escape, invalid UTF-8, a nesting deeper than serde_json's recursion limit) would fail the whole
//! batch, where SPEC 1.1 says a bad value rejects *that event*. So the body is first cut by a small
//! scanner that only knows JSON's structure: strings (with their escapes), brackets, commas and
//! whitespace. It never recurses (a bracket stack on the heap, bounded by the body) and never decodes a
//! value. Each element's bytes are then parsed alone, so a bad literal fails only its element. Only a
//! body whose structure cannot be followed (a bracket or string never closed, a mismatched bracket, an
//! empty element, bytes after the array) is unparseable as a whole.
//!
//! Each element is parsed with [`parse_element`], which also notices a key given twice in the event
//! object (serde_json's `Value` keeps the last one silently).

use std::cell::RefCell;
use std::ops::Range;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Why a body's structure cannot be followed. Lowercase; positions are byte offsets into the body.
pub(super) type StructureError = String;

/// Why an array body was not cut into elements.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SplitError {
    /// Its structure cannot be followed.
    Structure(StructureError),
    /// It has more elements than the caller accepts (the number given); scanning stopped there.
    TooManyElements(usize),
}

impl From<StructureError> for SplitError {
    fn from(error: StructureError) -> SplitError {
        SplitError::Structure(error)
    }
}

/// The byte ranges of the elements of the array that opens at `body[open]` (a `[`), and the offset just
/// past its closing `]`. Stops as soon as there are more than `max_elements`, so a huge array of tiny
/// elements costs no more memory than the caller's limit allows.
pub(super) fn array_elements(
    body: &[u8],
    open: usize,
    max_elements: usize,
) -> Result<(Vec<Range<usize>>, usize), SplitError> {
    debug_assert_eq!(body.get(open), Some(&b'['));
    let mut elements = Vec::new();
    let mut at = skip_whitespace(body, open + 1);
    if body.get(at) == Some(&b']') {
        return Ok((elements, at + 1));
    }
    loop {
        let end = value_end(body, at)?;
        if elements.len() == max_elements {
            return Err(SplitError::TooManyElements(max_elements));
        }
        elements.push(at..end);
        at = skip_whitespace(body, end);
        match body.get(at) {
            Some(b',') => {
                at = skip_whitespace(body, at + 1);
                if matches!(body.get(at), Some(b']')) {
                    return Err(format!("a trailing comma before the array's `]` at byte {at}").into());
                }
            }
            Some(b']') => return Ok((elements, at + 1)),
            Some(_) => {
                return Err(format!(
                    "expected `,` or `]` after element {} at byte {at}",
                    elements.len() - 1
                )
                .into())
            }
            None => return Err("the array is never closed (no final `]`)".to_owned().into()),
        }
    }
}

/// The offset just past the JSON value that starts at `body[start]`, following only its structure.
pub(super) fn value_end(body: &[u8], start: usize) -> Result<usize, StructureError> {
    match body.get(start) {
        None => Err("the body ends where a value was expected".to_owned()),
        Some(b'"') => string_end(body, start),
        Some(b'{' | b'[') => composite_end(body, start),
        Some(&byte @ (b',' | b']' | b'}' | b':')) => Err(format!(
            "expected a value at byte {start}, found `{}`",
            char::from(byte)
        )),
        // A scalar (number, literal, or a bare word such as NaN): it is read, and judged, with its element.
        Some(_) => Ok(body[start..]
            .iter()
            .position(|&byte| is_whitespace(byte) || b",:[]{}\"".contains(&byte))
            .map_or(body.len(), |length| start + length)),
    }
}

/// The offset just past the string whose opening quote is at `body[start]`.
fn string_end(body: &[u8], start: usize) -> Result<usize, StructureError> {
    let mut at = start + 1;
    while let Some(&byte) = body.get(at) {
        match byte {
            b'\\' => at += 2,
            b'"' => return Ok(at + 1),
            _ => at += 1,
        }
    }
    Err(format!("the string that starts at byte {start} is never closed"))
}

/// The offset just past the object or array that opens at `body[start]`; brackets must match.
fn composite_end(body: &[u8], start: usize) -> Result<usize, StructureError> {
    let mut expected_closers = CloserStack::default();
    expected_closers.push(closer_of(body[start]));
    let mut at = start + 1;
    while let Some(&byte) = body.get(at) {
        match byte {
            b'"' => {
                at = string_end(body, at)?;
                continue;
            }
            b'{' | b'[' => expected_closers.push(closer_of(byte)),
            b'}' | b']' => {
                if expected_closers.pop() != Some(byte) {
                    return Err(format!("a mismatched `{}` at byte {at}", char::from(byte)));
                }
                if expected_closers.is_empty() {
                    return Ok(at + 1);
                }
            }
            _ => {}
        }
        at += 1;
    }
    Err(format!(
        "the {} that opens at byte {start} is never closed",
        if body[start] == b'{' { "object" } else { "array" }
    ))
}

/// The closing brackets still expected, innermost last. An event nests two deep, so the first
/// [`CloserStack::INLINE`] levels live inline: the scan of an element allocates nothing (it did, once per
/// element, in ingest profiles). Deeper nesting spills to the heap, bounded by the body.
#[derive(Default)]
struct CloserStack {
    inline: [u8; CloserStack::INLINE],
    depth: usize,
    spilled: Vec<u8>,
}

impl CloserStack {
    const INLINE: usize = 16;

    fn push(&mut self, closer: u8) {
        if self.depth < Self::INLINE {
            self.inline[self.depth] = closer;
        } else {
            self.spilled.push(closer);
        }
        self.depth += 1;
    }

    fn pop(&mut self) -> Option<u8> {
        self.depth = self.depth.checked_sub(1)?;
        if self.depth < Self::INLINE {
            Some(self.inline[self.depth])
        } else {
            self.spilled.pop()
        }
    }

    fn is_empty(&self) -> bool {
        self.depth == 0
    }
}

fn closer_of(opener: u8) -> u8 {
    if opener == b'{' {
        b'}'
    } else {
        b']'
    }
}

/// JSON's four whitespace bytes.
pub(super) fn is_whitespace(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// The first offset at or after `at` that is not JSON whitespace.
pub(super) fn skip_whitespace(body: &[u8], at: usize) -> usize {
    body[at.min(body.len())..]
        .iter()
        .position(|&byte| !is_whitespace(byte))
        .map_or(body.len(), |offset| at + offset)
}

/// One element read on its own: its value, and the first key its top-level object gives twice.
pub(super) struct Element {
    pub(super) value: Value,
    pub(super) duplicate_key: Option<String>,
}

/// Parses one element's bytes (exactly one JSON value, surrounding whitespace allowed).
pub(super) fn parse_element(bytes: &[u8]) -> Result<Element, ElementError> {
    let failing_key = RefCell::new(None);
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    ElementSeed {
        failing_key: &failing_key,
    }
    .deserialize(&mut deserializer)
    .and_then(|element| deserializer.end().map(|()| element))
    .map_err(|error| ElementError {
        error,
        key: failing_key.into_inner(),
    })
}

/// Why an element could not be read, and the top-level key whose value could not be (a `NaN`, a number
/// past f64, a bad escape), so the rejection can name that field instead of the whole event.
#[derive(Debug)]
pub(super) struct ElementError {
    pub(super) error: serde_json::Error,
    pub(super) key: Option<String>,
}

/// Deserializes an [`Element`], recording in `failing_key` the top-level key being read when reading fails.
struct ElementSeed<'a> {
    failing_key: &'a RefCell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for ElementSeed<'_> {
    type Value = Element;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Element, D::Error> {
        deserializer.deserialize_any(ElementVisitor {
            failing_key: self.failing_key,
        })
    }
}

/// Builds the same `Value` serde_json would, except that the top-level object remembers a repeated key
/// (the first occurrence is kept). Nested objects belong to ignored fields and keep serde_json's rule.
struct ElementVisitor<'a> {
    failing_key: &'a RefCell<Option<String>>,
}

impl ElementVisitor<'_> {
    fn plain<E>(value: Value) -> Result<Element, E> {
        Ok(Element {
            value,
            duplicate_key: None,
        })
    }
}

impl<'de> Visitor<'de> for ElementVisitor<'_> {
    type Value = Element;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Element, E> {
        Self::plain(Value::Bool(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Element, E> {
        Self::plain(Value::from(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Element, E> {
        Self::plain(Value::from(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Element, E> {
        Self::plain(Value::from(value))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Element, E> {
        Self::plain(Value::from(value))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Element, E> {
        Self::plain(Value::String(value))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Element, E> {
        Self::plain(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Element, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element::<Value>()? {
            items.push(item);
        }
        Self::plain(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Element, A::Error> {
        let mut object = Map::new();
        let mut duplicate_key = None;
        while let Some(key) = map.next_key::<String>()? {
            let value: Value = match map.next_value() {
                Ok(value) => value,
                Err(error) => {
                    *self.failing_key.borrow_mut() = Some(key);
                    return Err(error);
                }
            };
            match object.entry(key) {
                serde_json::map::Entry::Vacant(slot) => {
                    slot.insert(value);
                }
                serde_json::map::Entry::Occupied(slot) => {
                    duplicate_key.get_or_insert_with(|| slot.key().clone());
                }
            }
        }
        Ok(Element {
            value: Value::Object(object),
            duplicate_key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elements(body: &str) -> Result<Vec<&str>, SplitError> {
        let open = skip_whitespace(body.as_bytes(), 0);
        let (ranges, end) = array_elements(body.as_bytes(), open, usize::MAX)?;
        assert_eq!(skip_whitespace(body.as_bytes(), end), body.len(), "{body}");
        Ok(ranges.into_iter().map(|range| &body[range]).collect())
    }

    #[test]
    fn the_scanner_follows_strings_escapes_and_nesting() {
        assert_eq!(elements("[]").unwrap(), Vec::<&str>::new());
        assert_eq!(
            elements(" [ 1 , NaN,\t-Infinity ] ").unwrap(),
            ["1", "NaN", "-Infinity"]
        );
        assert_eq!(
            elements(r#"[{"a":"],\"}"}, [1,[2]], "x\\", {"b":{"c":[]}}]"#).unwrap(),
            [r#"{"a":"],\"}"}"#, "[1,[2]]", r#""x\\""#, r#"{"b":{"c":[]}}"#]
        );
    }

    #[test]
    fn the_scanner_refuses_what_it_cannot_follow() {
        for body in [
            "[",
            "[1",
            "[1,",
            "[1,]",
            "[,1]",
            "[1 2]",
            "[{]",
            "[{\"a\":1]",
            "[\"abc]",
            "[{}}]",
        ] {
            assert!(elements(body).is_err(), "{body}");
        }
    }

    #[test]
    fn the_scanner_stops_past_the_element_limit() {
        assert_eq!(
            array_elements(b"[1,2,3]", 0, 2),
            Err(SplitError::TooManyElements(2))
        );
        assert!(array_elements(b"[1,2]", 0, 2).is_ok());
    }

    #[test]
    fn a_repeated_top_level_key_is_noticed_and_the_first_value_kept() {
        let element = parse_element(br#"{"type":"a","x":{"k":1,"k":2},"type":"b"}"#).unwrap();
        assert_eq!(element.duplicate_key.as_deref(), Some("type"));
        assert_eq!(element.value["type"], "a");
        // An escape spelling the same key is the same key.
        let element = parse_element(br#"{"id":"a","\u0069d":"b"}"#).unwrap();
        assert_eq!(element.duplicate_key.as_deref(), Some("id"));
        let element = parse_element(br#" [1, {"a": 1}] "#).unwrap();
        assert_eq!(element.value, serde_json::json!([1, {"a": 1}]));
        assert!(parse_element(b"NaN").is_err());
        assert!(parse_element(b"{} {}").is_err());
    }
}
