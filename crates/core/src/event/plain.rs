//! The fast path of event parsing: an event written the plain way (the seven SPEC 1.1 fields and nothing
//! else, each key once, strings without escapes, `ts` as integer milliseconds or an RFC 3339 string) is
//! read straight into an
//! [`Event`] without building a `serde_json::Value`.
//!
//! Ingest profiles showed the `Value` route allocating a map, its keys and every string of every event
//! before validation copied them again. A serde derive over borrowed strings removed those, but still
//! spent ~4,600 instructions per event in serde_json's generic machinery (key identifiers through a
//! visitor, UTF-8 checks of every key, a `Vec` for the categories); callgrind, `bench/ingest_callgrind.sh`.
//! So the plain shape is read here by a small scanner that knows exactly that shape: keys are compared as
//! bytes against the seven names, strings are borrowed from the body, and only the event's own fields are
//! allocated.
//!
//! This path only ever says yes or "not sure": anything it does not accept (an unknown or repeated key, an
//! escaped string, a control character or invalid UTF-8 inside a string, a float, a leading zero, a
//! number out of range, any validation failure) returns `None`, and the caller runs the
//! full path ([`super::RawItem::parse`] + [`super::RawItem::to_event`]), which gives the exact answer and
//! the exact error. So the rules stay in one place; what this module must guarantee is that an event it
//! returns is the one the full path would return. Debug builds check that on every event, and
//! `tests/plain_parse.rs` compares the two paths on generated bodies.

use super::{
    check_ts_range, rfc3339_millis, Event, EventKind, ParseLimits, Payment, TsForm, MAX_CATEGORIES,
    MAX_PRICE, MAX_QUANTITY,
};
use crate::ids::{Category, EventId, ProductId};

/// The fields of one plainly written event, borrowed from its JSON.
#[derive(Default)]
struct PlainEvent<'a> {
    id: Option<&'a str>,
    kind: Option<&'a str>,
    ts: Option<PlainTs<'a>>,
    product_id: Option<&'a str>,
    /// At most [`MAX_CATEGORIES`] names; more sends the event to the full path.
    categories: [&'a str; MAX_CATEGORIES],
    category_count: usize,
    quantity: Option<u64>,
    price: Option<u64>,
}

/// The event in `json` when it is written the plain way and valid; `None` means "ask the full path".
pub(super) fn plain_event(json: &[u8], limits: &ParseLimits) -> Option<Event> {
    // One UTF-8 check of the whole element instead of one per string (each call has a fixed cost that
    // was most of the check). Invalid UTF-8 anywhere fails the event on the full path too.
    let text = std::str::from_utf8(json).ok()?;
    let plain = Scanner { text, at: 0 }.read_event()?;
    let event = validate(&plain, limits)?;
    debug_assert_eq!(
        Some(&event),
        super::RawItem::parse(json).to_event(limits).ok().as_ref(),
        "the plain path disagrees with the full path on {}",
        String::from_utf8_lossy(json)
    );
    Some(event)
}

/// A `ts` as written: integer epoch milliseconds, or an RFC 3339 string (most producers' loggers write
/// one; parsed by the same function as on the full path).
#[derive(Clone, Copy)]
enum PlainTs<'a> {
    Millis(i64),
    Rfc3339(&'a str),
}

/// Which of the seven keys an object gave, as bits, so a repeated key is noticed.
const ID: u8 = 1;
const TYPE: u8 = 1 << 1;
const TS: u8 = 1 << 2;
const PRODUCT_ID: u8 = 1 << 3;
const CATEGORIES: u8 = 1 << 4;
const QUANTITY: u8 = 1 << 5;
const PRICE: u8 = 1 << 6;

/// A cursor over one element's bytes. Every method returns `None` at the first thing outside the plain
/// shape.
struct Scanner<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scanner<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn read_event(mut self) -> Option<PlainEvent<'a>> {
        let mut event = PlainEvent::default();
        let mut seen = 0u8;
        self.skip_whitespace();
        self.expect(b'{')?;
        loop {
            self.skip_whitespace();
            let key = self.string()?;
            let bit = match key.as_bytes() {
                b"id" => ID,
                b"type" => TYPE,
                b"ts" => TS,
                b"product_id" => PRODUCT_ID,
                b"categories" => CATEGORIES,
                b"quantity" => QUANTITY,
                b"price" => PRICE,
                _ => return None,
            };
            if seen & bit != 0 {
                return None;
            }
            seen |= bit;
            self.skip_whitespace();
            self.expect(b':')?;
            self.skip_whitespace();
            match bit {
                ID => event.id = Some(self.string()?),
                TYPE => event.kind = Some(self.string()?),
                TS => {
                    event.ts = Some(if self.bytes().get(self.at) == Some(&b'"') {
                        PlainTs::Rfc3339(self.string()?)
                    } else {
                        PlainTs::Millis(self.integer_i64()?)
                    });
                }
                PRODUCT_ID => event.product_id = Some(self.string()?),
                CATEGORIES => {
                    if !self.null() {
                        self.categories(&mut event)?;
                    }
                }
                QUANTITY => event.quantity = self.optional_u64()?,
                _ => event.price = self.optional_u64()?,
            }
            self.skip_whitespace();
            match self.next_byte()? {
                b',' => {}
                b'}' => break,
                _ => return None,
            }
        }
        self.skip_whitespace();
        (self.at == self.text.len()).then_some(event)
    }

    fn next_byte(&mut self) -> Option<u8> {
        let byte = *self.bytes().get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next_byte()? == byte).then_some(())
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes().get(self.at) {
            self.at += 1;
        }
    }

    /// A string without escapes or control characters (which JSON forbids raw), borrowed.
    fn string(&mut self) -> Option<&'a str> {
        self.expect(b'"')?;
        let start = self.at;
        let length = self.bytes()[start..]
            .iter()
            .position(|&byte| byte == b'"' || byte == b'\\' || byte < 0x20)?;
        let end = start + length;
        if self.bytes()[end] != b'"' {
            return None;
        }
        self.at = end + 1;
        // Both ends are ASCII quotes, so on character boundaries.
        self.text.get(start..end)
    }

    /// `null`, consumed.
    fn null(&mut self) -> bool {
        let is_null = self.bytes()[self.at..].starts_with(b"null");
        if is_null {
            self.at += 4;
        }
        is_null
    }

    /// An array of at most [`MAX_CATEGORIES`] plain strings.
    fn categories(&mut self, event: &mut PlainEvent<'a>) -> Option<()> {
        self.expect(b'[')?;
        self.skip_whitespace();
        if self.bytes().get(self.at) == Some(&b']') {
            self.at += 1;
            return Some(());
        }
        loop {
            self.skip_whitespace();
            let name = self.string()?;
            *event.categories.get_mut(event.category_count)? = name;
            event.category_count += 1;
            self.skip_whitespace();
            match self.next_byte()? {
                b',' => {}
                b']' => return Some(()),
                _ => return None,
            }
        }
    }

    /// The digits of a JSON integer without sign: no leading zero (JSON forbids one), not followed by a
    /// fraction or exponent (a float), at most `u64`.
    fn digits_u64(&mut self) -> Option<u64> {
        let start = self.at;
        let mut value: u64 = 0;
        while let Some(&byte @ b'0'..=b'9') = self.bytes().get(self.at) {
            value = value.checked_mul(10)?.checked_add(u64::from(byte - b'0'))?;
            self.at += 1;
        }
        let length = self.at - start;
        if length == 0 || (length > 1 && self.bytes()[start] == b'0') {
            return None;
        }
        match self.bytes().get(self.at) {
            Some(b'.' | b'e' | b'E') => None,
            _ => Some(value),
        }
    }

    /// A JSON integer that fits an `i64` (the `ts` field).
    fn integer_i64(&mut self) -> Option<i64> {
        let negative = self.bytes().get(self.at) == Some(&b'-');
        if negative {
            self.at += 1;
        }
        let magnitude = self.digits_u64()?;
        if negative {
            0i64.checked_sub_unsigned(magnitude)
        } else {
            i64::try_from(magnitude).ok()
        }
    }

    /// `null` (as absent) or a JSON integer that fits a `u64` (`quantity`, `price`).
    fn optional_u64(&mut self) -> Option<Option<u64>> {
        if self.null() {
            return Some(None);
        }
        self.digits_u64().map(Some)
    }
}

/// The same checks as [`Event::from_json`], each failure a `None`.
fn validate(plain: &PlainEvent<'_>, limits: &ParseLimits) -> Option<Event> {
    let id = EventId::parse(plain.id?).ok()?;
    let kind = EventKind::parse(plain.kind?).ok()?;
    let ts_millis = match plain.ts? {
        PlainTs::Millis(millis) => check_ts_range(millis, TsForm::EpochMillis, limits),
        PlainTs::Rfc3339(text) => check_ts_range(rfc3339_millis(text).ok()?, TsForm::Rfc3339, limits),
    }
    .ok()?;
    let product = ProductId::parse(plain.product_id?).ok()?;
    let names = &plain.categories[..plain.category_count];
    let mut categories = Vec::with_capacity(names.len());
    for name in names {
        categories.push(Category::parse(name).ok()?);
    }
    categories.sort_unstable();
    categories.dedup();
    let payment = if kind.is_payment() {
        let quantity = plain
            .quantity
            .filter(|quantity| (1..=u64::from(MAX_QUANTITY)).contains(quantity))?;
        let price = plain.price.filter(|price| *price <= MAX_PRICE)?;
        Some(Payment {
            quantity: u32::try_from(quantity).ok()?,
            price,
        })
    } else {
        if plain.quantity.is_some() || plain.price.is_some() {
            return None;
        }
        None
    };
    Some(Event {
        id,
        kind,
        ts_millis,
        product,
        categories,
        payment,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_784_293_502_123;

    fn plain(json: &str) -> Option<Event> {
        plain_event(json.as_bytes(), &ParseLimits::at(NOW))
    }

    #[test]
    fn reads_the_plain_shape_with_whitespace_anywhere_json_allows_it() {
        let event = plain(
            " {\n\"id\" : \"s-1\",\t\"type\":\"payment_succeeded\" ,\"ts\":1784293501123,\r\n\
             \"product_id\":\"p\u{e9}\", \"categories\" : [ \"b\" , \"a\",\"b\" ] ,\"quantity\":2,\"price\":0 } ",
        )
        .expect("plain");
        assert_eq!(event.id.as_str(), "s-1");
        assert_eq!(event.product.as_str(), "p\u{e9}");
        let names: Vec<&str> = event.categories.iter().map(Category::as_str).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(
            event.payment,
            Some(Payment {
                quantity: 2,
                price: 0
            })
        );
        assert!(plain(
            r#"{"id":"v","type":"product_viewed","ts":1784293501123,"product_id":"p","categories":[],"quantity":null,"price":null}"#
        )
        .is_some());
    }

    /// Producers' loggers write RFC 3339: those events stay on the plain path, with the full path's value.
    #[test]
    fn reads_rfc3339_timestamps_as_the_full_path_does() {
        for (ts, millis) in [
            ("2026-07-17T13:05:01.123Z", 1_784_293_501_123),
            ("2026-07-17T22:05:01.123456+09:00", 1_784_293_501_123),
            ("2026-07-17T13:05:01Z", 1_784_293_501_000),
            ("2026-07-17t13:05:01.1239z", 1_784_293_501_123),
        ] {
            let json = format!(
                r#"{{"id":"v","type":"product_viewed","ts":"{ts}","product_id":"p","categories":["a"]}}"#
            );
            let event = plain(&json).unwrap_or_else(|| panic!("plain: {json}"));
            assert_eq!(event.ts_millis, millis, "{json}");
            let full = super::super::RawItem::parse(json.as_bytes())
                .to_event(&ParseLimits::at(NOW))
                .expect("full path");
            assert_eq!(event, full, "{json}");
        }
        // Without an offset, past the clock, or not a timestamp: the full path answers, with its error.
        for ts in [
            "2026-07-17T13:05:01",
            "2027-07-17T13:05:01Z",
            "1784293501123",
            "",
            "2026-07-17T13:05:01\\u005a",
        ] {
            let json = format!(r#"{{"id":"v","type":"product_viewed","ts":"{ts}","product_id":"p"}}"#);
            assert_eq!(plain(&json), None, "{json}");
        }
    }

    /// Each of these is either invalid JSON or outside the plain shape: the full path must answer.
    #[test]
    fn anything_unusual_is_left_to_the_full_path() {
        let head = r#""id":"v","type":"product_viewed","product_id":"p""#;
        for tail in [
            r#""ts":01784293501123"#,
            r#""ts":1784293501123.0"#,
            r#""ts":1784293501123e0"#,
            r#""ts":-0"#,
            r#""ts":+1784293501123"#,
            r#""ts":99999999999999999999"#,
            r#""ts":1784293501123x"#,
            r#""ts":"1784293501123""#,
            r#""ts":1784293501123,"categories":["a\u0062"]"#,
            "\"ts\":1784293501123,\"categories\":[\"a\tb\"]",
            r#""ts":1784293501123,"categories":["a",]"#,
            r#""ts":1784293501123,"categories":"a""#,
            r#""ts":1784293501123,"ts":1784293501123"#,
            r#""ts":1784293501123,"other":1"#,
            r#""ts":1784293501123,"quantity":-1"#,
            r#""ts":1784293501123,"price":nul"#,
            r#""ts":1784293501123,"#,
        ] {
            let json = format!("{{{head},{tail}}}");
            assert_eq!(plain(&json), None, "{json}");
        }
        assert_eq!(
            plain_event(
                b"{\"id\":\"\xff\",\"type\":\"product_viewed\",\"ts\":1784293501123,\"product_id\":\"p\"}",
                &ParseLimits::at(NOW)
            ),
            None
        );
        assert_eq!(
            plain(r#"{"id":"v","type":"product_viewed","ts":1784293501123,"product_id":"p"} x"#),
            None
        );
        assert_eq!(plain(r#"{}"#), None);
        let seventeen = vec!["\"c\""; 17].join(",");
        assert_eq!(
            plain(&format!(
                r#"{{{head},"ts":1784293501123,"categories":[{seventeen}]}}"#
            )),
            None
        );
    }
}
