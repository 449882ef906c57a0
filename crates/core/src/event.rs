//! Behaviour events: how an ingest body becomes validated [`Event`]s (SPEC 1.1), and what each event does to
//! the metrics (SPEC 1.2).
//!
//! Ingest happens in two steps, so one bad event never sinks its batch:
//!
//! 1. [`split_body`] cuts a request body (a JSON array, a single JSON object, or NDJSON) into [`RawItem`]s.
//!    Only a JSON body that does not parse at all fails as a whole ([`BodyError`], HTTP 400).
//! 2. [`Event::from_json`] (or [`RawItem::to_event`]) parses one item into an [`Event`] or an
//!    [`EventError`] that names the offending field, e.g. `quantity: must be an integer between 1 and
//!    10000`.
//!
//! The server clock enters as a value ([`ParseLimits::now_millis`]); nothing here reads a clock.

use std::fmt;

use jiff::Timestamp;
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use crate::ids::{Category, EventId, ProductId};
use crate::metrics::Metrics;
use crate::period::Hour;

/// The most categories one event may list.
pub const MAX_CATEGORIES: usize = 16;
/// The largest `quantity` of a payment event.
pub const MAX_QUANTITY: u32 = 10_000;
/// The largest `price` of a payment event, in the currency's smallest unit.
pub const MAX_PRICE: u64 = 1_000_000_000;

/// What happened. The wire names are the `type` values of SPEC 1.1.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// `product_viewed`: views +1.
    ProductViewed,
    /// `product_liked`: likes +1.
    ProductLiked,
    /// `product_unliked`: likes −1.
    ProductUnliked,
    /// `payment_succeeded`: units +quantity, sales +price×quantity.
    PaymentSucceeded,
    /// `payment_refunded`: units −quantity, sales −price×quantity.
    PaymentRefunded,
}

impl EventKind {
    /// Every kind, in the order SPEC 1.1 lists them.
    pub const ALL: [EventKind; 5] = [
        EventKind::ProductViewed,
        EventKind::ProductLiked,
        EventKind::ProductUnliked,
        EventKind::PaymentSucceeded,
        EventKind::PaymentRefunded,
    ];

    /// Parses a wire name such as `payment_succeeded`. The error names the `type` field.
    pub fn parse(s: &str) -> Result<EventKind, EventError> {
        EventKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| {
                EventError::new(
                    "type",
                    "must be one of product_viewed, product_liked, product_unliked, payment_succeeded, \
                 payment_refunded",
                )
            })
    }

    /// The wire name, e.g. `product_viewed`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::ProductViewed => "product_viewed",
            EventKind::ProductLiked => "product_liked",
            EventKind::ProductUnliked => "product_unliked",
            EventKind::PaymentSucceeded => "payment_succeeded",
            EventKind::PaymentRefunded => "payment_refunded",
        }
    }

    /// True for the two payment kinds, which must carry `quantity` and `price` and are the only ones allowed
    /// to.
    #[must_use]
    pub fn is_payment(self) -> bool {
        matches!(self, EventKind::PaymentSucceeded | EventKind::PaymentRefunded)
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EventKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// The payment part of a `payment_succeeded` / `payment_refunded` event.
///
/// [`Event::from_json`] only builds values with `1 <= quantity <= 10000` and `price <= 1e9`, so
/// `price × quantity <= 1e13` always fits in an `i64`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Payment {
    /// Units paid or refunded, 1 to 10,000.
    pub quantity: u32,
    /// Unit price in the currency's smallest unit, 0 to 1,000,000,000.
    pub price: u64,
}

impl Payment {
    /// `price × quantity`, in the currency's smallest unit. Saturates instead of wrapping if a hand-built
    /// value breaks the documented ranges.
    #[must_use]
    pub fn amount(&self) -> i64 {
        let amount = u128::from(self.price) * u128::from(self.quantity);
        debug_assert!(amount <= u128::from(MAX_PRICE) * u128::from(MAX_QUANTITY));
        i64::try_from(amount).unwrap_or(i64::MAX)
    }
}

/// One validated behaviour event (SPEC 1.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Unique id; a repeat is a duplicate, counted once.
    pub id: EventId,
    /// What happened.
    pub kind: EventKind,
    /// Event time, epoch milliseconds (never before 1970). Buckets follow this, not arrival time.
    pub ts_millis: i64,
    /// The product it happened to.
    pub product: ProductId,
    /// The product's categories as this event states them: sorted by bytes, no duplicates.
    pub categories: Vec<Category>,
    /// `Some` exactly when `kind` is a payment kind.
    pub payment: Option<Payment>,
}

/// Why one event was rejected: the field at fault and what is wrong with it.
///
/// Displays as `field: message`, e.g. `quantity: must be an integer between 1 and 10000`. An item that is
/// not a JSON object at all names the field `event`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct EventError {
    /// The JSON field name (`id`, `type`, `ts`, `product_id`, `categories`, `quantity`, `price`), or `event`.
    pub field: &'static str,
    /// Lowercase, says what a valid value looks like.
    pub message: String,
}

impl EventError {
    fn new(field: &'static str, message: impl Into<String>) -> EventError {
        EventError {
            field,
            message: message.into(),
        }
    }
}

/// The server-side facts an event is checked against.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ParseLimits {
    /// The server clock, epoch milliseconds.
    pub now_millis: i64,
    /// How far past `now_millis` an event's `ts` may be (default 5 minutes).
    pub max_future_millis: i64,
}

impl ParseLimits {
    /// The default tolerance for events stamped in the future: 5 minutes.
    pub const DEFAULT_MAX_FUTURE_MILLIS: i64 = 5 * 60 * 1000;

    /// Limits at server time `now_millis` with the default future tolerance.
    #[must_use]
    pub fn at(now_millis: i64) -> ParseLimits {
        ParseLimits {
            now_millis,
            max_future_millis: Self::DEFAULT_MAX_FUTURE_MILLIS,
        }
    }
}

impl Event {
    /// Parses and validates one event object (SPEC 1.1).
    ///
    /// Fields are checked in the order of the spec's table and the first problem is reported. Unknown
    /// fields are ignored. A `null` optional field (`categories`, and `quantity` / `price` on non-payment
    /// events) counts as absent; a `null` required field counts as missing.
    pub fn from_json(value: &Value, limits: &ParseLimits) -> Result<Event, EventError> {
        let Some(object) = value.as_object() else {
            return Err(EventError::new("event", "must be a JSON object"));
        };

        let id = EventId::parse(required_string(object, "id")?)
            .map_err(|error| EventError::new("id", error.to_string()))?;
        let kind = EventKind::parse(required_string(object, "type")?)?;
        let ts_millis = parse_ts(required(object, "ts")?, limits)?;
        let product = ProductId::parse(required_string(object, "product_id")?)
            .map_err(|error| EventError::new("product_id", error.to_string()))?;
        let categories = parse_categories(optional(object, "categories"))?;
        let payment = parse_payment(object, kind)?;

        Ok(Event {
            id,
            kind,
            ts_millis,
            product,
            categories,
            payment,
        })
    }

    /// What this event adds to its (hour, product) metrics row (SPEC 1.2).
    #[must_use]
    pub fn metrics_delta(&self) -> Metrics {
        let (units, sales) = match self.payment {
            Some(payment) => (i64::from(payment.quantity), payment.amount()),
            None => (0, 0),
        };
        match self.kind {
            EventKind::ProductViewed => Metrics {
                views: 1,
                ..Metrics::default()
            },
            EventKind::ProductLiked => Metrics {
                likes: 1,
                ..Metrics::default()
            },
            EventKind::ProductUnliked => Metrics {
                likes: -1,
                ..Metrics::default()
            },
            EventKind::PaymentSucceeded => Metrics {
                units,
                sales,
                ..Metrics::default()
            },
            EventKind::PaymentRefunded => Metrics {
                units: -units,
                sales: -sales,
                ..Metrics::default()
            },
        }
    }

    /// The UTC hour bucket of the event time.
    #[must_use]
    pub fn hour(&self) -> Hour {
        Hour::from_millis(self.ts_millis)
    }

    /// The canonical JSON form, as kept in the raw event log: `ts` as integer milliseconds, `categories`
    /// always present, `quantity` and `price` only on payments. [`Event::from_json`] reads it back to an
    /// equal event.
    /// Appends the canonical JSON of [`Event::to_json`] to `out` without building a `Value`: the raw
    /// event log is written once per ingested event, so this is on the hot path.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        fn string(out: &mut Vec<u8>, value: &str) {
            serde_json::to_writer(&mut *out, value).expect("writing to a Vec cannot fail");
        }
        out.extend_from_slice(b"{\"id\":");
        string(out, self.id.as_str());
        out.extend_from_slice(b",\"type\":\"");
        out.extend_from_slice(self.kind.as_str().as_bytes());
        out.extend_from_slice(b"\",\"ts\":");
        out.extend_from_slice(self.ts_millis.to_string().as_bytes());
        out.extend_from_slice(b",\"product_id\":");
        string(out, self.product.as_str());
        out.extend_from_slice(b",\"categories\":[");
        for (i, category) in self.categories.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            string(out, category.as_str());
        }
        out.push(b']');
        if let Some(payment) = self.payment {
            out.extend_from_slice(
                format!(",\"quantity\":{},\"price\":{}", payment.quantity, payment.price).as_bytes(),
            );
        }
        out.push(b'}');
    }

    /// The canonical JSON form, which [`Event::from_json`] parses back to an equal event.
    #[must_use]
    pub fn to_json(&self) -> Value {
        let mut object = Map::new();
        object.insert("id".into(), Value::from(self.id.as_str()));
        object.insert("type".into(), Value::from(self.kind.as_str()));
        object.insert("ts".into(), Value::from(self.ts_millis));
        object.insert("product_id".into(), Value::from(self.product.as_str()));
        object.insert(
            "categories".into(),
            Value::Array(
                self.categories
                    .iter()
                    .map(|category| Value::from(category.as_str()))
                    .collect(),
            ),
        );
        if let Some(payment) = self.payment {
            object.insert("quantity".into(), Value::from(payment.quantity));
            object.insert("price".into(), Value::from(payment.price));
        }
        Value::Object(object)
    }
}

/// The field's value; a missing or `null` field is an error.
fn required<'a>(object: &'a Map<String, Value>, field: &'static str) -> Result<&'a Value, EventError> {
    optional(object, field).ok_or_else(|| EventError::new(field, "is required"))
}

/// The field's value, treating `null` as absent.
fn optional<'a>(object: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    object.get(field).filter(|value| !value.is_null())
}

fn required_string<'a>(object: &'a Map<String, Value>, field: &'static str) -> Result<&'a str, EventError> {
    required(object, field)?
        .as_str()
        .ok_or_else(|| EventError::new(field, "must be a string"))
}

fn parse_ts(value: &Value, limits: &ParseLimits) -> Result<i64, EventError> {
    const FORMAT_HINT: &str =
        "must be an RFC 3339 timestamp with an offset (e.g. 2026-07-17T13:05:02.123Z) or integer epoch milliseconds";
    let (ts_millis, future_hint) = match value {
        Value::String(text) => {
            let timestamp: Timestamp = text.parse().map_err(|_| EventError::new("ts", FORMAT_HINT))?;
            // Floor to whole milliseconds; jiff's range keeps this far inside i64.
            let millis = i64::try_from(timestamp.as_nanosecond().div_euclid(1_000_000))
                .map_err(|_| EventError::new("ts", FORMAT_HINT))?;
            (millis, "check the sender's clock and the timestamp's offset")
        }
        Value::Number(number) => {
            let Some(millis) = number.as_i64() else {
                return Err(if number.is_f64() {
                    EventError::new(
                        "ts",
                        "must be a whole number of epoch milliseconds, not a fraction",
                    )
                } else {
                    // A positive integer beyond i64: far in the future however it is read.
                    future_error(
                        limits,
                        "ts is epoch milliseconds: is it in microseconds or nanoseconds?",
                    )
                });
            };
            (
                millis,
                "ts is epoch milliseconds: is it in microseconds or nanoseconds?",
            )
        }
        _ => return Err(EventError::new("ts", FORMAT_HINT)),
    };
    if ts_millis < 0 {
        return Err(EventError::new("ts", "must not be before 1970-01-01T00:00:00Z"));
    }
    if ts_millis > limits.now_millis.saturating_add(limits.max_future_millis) {
        return Err(future_error(limits, future_hint));
    }
    Ok(ts_millis)
}

fn future_error(limits: &ParseLimits, hint: &str) -> EventError {
    EventError::new(
        "ts",
        format!(
            "is more than {} in the future of the server clock; {hint}",
            describe_duration(limits.max_future_millis)
        ),
    )
}

/// `5 minutes`, `1 minute`, `90 seconds`, `1500 milliseconds`.
fn describe_duration(millis: i64) -> String {
    let plural = |count: i64, unit: &str| {
        if count == 1 {
            format!("1 {unit}")
        } else {
            format!("{count} {unit}s")
        }
    };
    if millis % 60_000 == 0 {
        plural(millis / 60_000, "minute")
    } else if millis % 1_000 == 0 {
        plural(millis / 1_000, "second")
    } else {
        plural(millis, "millisecond")
    }
}

fn parse_categories(value: Option<&Value>) -> Result<Vec<Category>, EventError> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let Some(items) = value.as_array() else {
        return Err(EventError::new("categories", "must be an array of strings"));
    };
    if items.len() > MAX_CATEGORIES {
        return Err(EventError::new(
            "categories",
            format!("must have at most {MAX_CATEGORIES} entries"),
        ));
    }
    let mut categories = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let Some(text) = item.as_str() else {
            return Err(EventError::new(
                "categories",
                format!("entry {index} must be a string"),
            ));
        };
        let category = Category::parse(text)
            .map_err(|error| EventError::new("categories", format!("entry {index} {error}")))?;
        categories.push(category);
    }
    categories.sort_unstable();
    categories.dedup();
    Ok(categories)
}

fn parse_payment(object: &Map<String, Value>, kind: EventKind) -> Result<Option<Payment>, EventError> {
    const QUANTITY_RULE: &str = "must be an integer between 1 and 10000";
    const PRICE_RULE: &str = "must be an integer between 0 and 1000000000 (the currency's smallest unit)";

    let quantity = optional(object, "quantity");
    let price = optional(object, "price");
    if !kind.is_payment() {
        if quantity.is_some() {
            return Err(EventError::new("quantity", "is only allowed on payment events"));
        }
        if price.is_some() {
            return Err(EventError::new("price", "is only allowed on payment events"));
        }
        return Ok(None);
    }

    let quantity = quantity.ok_or_else(|| EventError::new("quantity", "is required for payment events"))?;
    let quantity = integer_between(quantity, 1, u64::from(MAX_QUANTITY))
        .and_then(|quantity| u32::try_from(quantity).ok())
        .ok_or_else(|| EventError::new("quantity", QUANTITY_RULE))?;

    let price = price.ok_or_else(|| EventError::new("price", "is required for payment events"))?;
    let price = integer_between(price, 0, MAX_PRICE).ok_or_else(|| {
        if price.is_f64() {
            EventError::new(
                "price",
                "must be an integer in the currency's smallest unit, never a float",
            )
        } else {
            EventError::new("price", PRICE_RULE)
        }
    })?;

    Ok(Some(Payment { quantity, price }))
}

/// A JSON integer (not a float such as `2.0` or `1e3`, not a string) in `min..=max`.
fn integer_between(value: &Value, min: u64, max: u64) -> Option<u64> {
    let number = value.as_u64()?;
    (min..=max).contains(&number).then_some(number)
}

/// One item of an ingest body: either a parsed JSON value or a line that was not valid JSON.
#[derive(Clone, Debug, PartialEq)]
pub enum RawItem {
    /// Parsed JSON, not yet validated as an event (it may not even be an object).
    Value(Value),
    /// An NDJSON line that is not valid JSON, with the parser's message.
    Malformed(String),
}

impl RawItem {
    /// Validates this item as an event. A malformed line is rejected with field `event`.
    pub fn to_event(&self, limits: &ParseLimits) -> Result<Event, EventError> {
        match self {
            RawItem::Value(value) => Event::from_json(value, limits),
            RawItem::Malformed(message) => {
                Err(EventError::new("event", format!("is not valid JSON ({message})")))
            }
        }
    }

    /// Best-effort `id` for a rejection report; see [`raw_id`].
    #[must_use]
    pub fn id(&self) -> Option<String> {
        match self {
            RawItem::Value(value) => raw_id(value),
            RawItem::Malformed(_) => None,
        }
    }
}

/// The layout of an ingest body.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum BodyFormat {
    /// `application/json`: an array of event objects, or one event object.
    Json,
    /// `application/x-ndjson`: one event object per line.
    Ndjson,
}

/// A body that cannot be split into items at all (HTTP 400).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The JSON body does not parse, or is neither an array nor an object.
    #[error("{0}")]
    NotParseable(String),
}

/// Splits an ingest body into items. JSON: an array of objects or a single object. NDJSON: one object per
/// non-empty line; a line that is not valid JSON becomes [`RawItem::Malformed`] (that item is rejected, the
/// rest still land). A JSON body that does not parse at all → [`BodyError`].
///
/// A leading UTF-8 byte order mark is ignored. NDJSON lines may end in `\r\n`; lines holding only
/// whitespace are skipped and do not count as items, so item indexes count events, not lines.
pub fn split_body(body: &[u8], format: BodyFormat) -> Result<Vec<RawItem>, BodyError> {
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    match format {
        BodyFormat::Json => {
            let value: Value = serde_json::from_slice(body)
                .map_err(|error| BodyError::NotParseable(format!("body is not valid JSON: {error}")))?;
            match value {
                Value::Array(items) => Ok(items.into_iter().map(RawItem::Value).collect()),
                object @ Value::Object(_) => Ok(vec![RawItem::Value(object)]),
                _ => Err(BodyError::NotParseable(
                    "body must be a JSON array of event objects or a single event object".to_owned(),
                )),
            }
        }
        BodyFormat::Ndjson => Ok(body
            .split(|&byte| byte == b'\n')
            .enumerate()
            .filter(|(_, line)| !line.iter().all(u8::is_ascii_whitespace))
            .map(|(line_index, line)| {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                match serde_json::from_slice::<Value>(line) {
                    Ok(value) => RawItem::Value(value),
                    Err(error) => RawItem::Malformed(describe_line_error(line_index + 1, &error)),
                }
            })
            .collect()),
    }
}

/// `line 7, column 3: expected value`, with the body's line number instead of serde_json's (always 1).
fn describe_line_error(line_number: usize, error: &serde_json::Error) -> String {
    let text = error.to_string();
    let position = format!(" at line {} column {}", error.line(), error.column());
    let message = text.strip_suffix(&position).unwrap_or(&text);
    format!("line {line_number}, column {}: {message}", error.column())
}

/// Best-effort `id` string of a raw item, for the `rejected[].id` field in responses.
///
/// Only a string `id` is reported, cut to at most 128 bytes (on a character boundary) so an oversized id
/// cannot blow up the response.
#[must_use]
pub fn raw_id(item: &Value) -> Option<String> {
    let id = item.get("id")?.as_str()?;
    let mut end = id.len().min(EventId::MAX_BYTES);
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    Some(id[..end].to_owned())
}

#[cfg(test)]
mod write_json_tests {
    use super::*;

    #[test]
    fn write_json_equals_to_json() {
        let limits = ParseLimits::at(1_800_000_000_000);
        for raw in [
            serde_json::json!({"id": "a\"b\\c\u{1}", "type": "payment_refunded", "ts": 1_700_000_000_123i64,
                "product_id": "p/ü", "categories": ["x", "y\"z"], "quantity": 3, "price": 0}),
            serde_json::json!({"id": "v", "type": "product_viewed", "ts": 5, "product_id": "p"}),
        ] {
            let event = Event::from_json(&raw, &limits).unwrap();
            let mut bytes = Vec::new();
            event.write_json(&mut bytes);
            let written: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(written, event.to_json());
        }
    }
}
