//! Behaviour events: how an ingest body becomes validated [`Event`]s (SPEC 1.1), and what each event does to
//! the metrics (SPEC 1.2).
//!
//! Ingest happens in two steps, so one bad event never sinks its batch:
//!
//! 1. [`split_body`] (or [`split_body_at_most`]) cuts a request body (a JSON array, a single JSON object,
//!    or NDJSON) into [`RawItem`]s, reading each element or line on its own ([`RawItem::parse`]), so an
//!    unreadable value (`NaN`, `Infinity`, a bad escape, too deep a nesting) or a key given twice spoils
//!    only its own item. Only a body whose structure cannot be followed fails as a whole
//!    ([`BodyError`], HTTP 400).
//! 2. [`RawItem::to_event`] (or [`Event::from_json`] for a `Value` in hand) parses one item into an
//!    [`Event`] or an [`EventError`] that names the offending field, e.g. `quantity: must be an integer
//!    between 1 and 10000`.
//!
//! The server clock enters as a value ([`ParseLimits::now_millis`]); nothing here reads a clock.

use std::fmt;

use jiff::Timestamp;
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use crate::ids::{Category, EventId, IdError, ProductId};
use crate::metrics::Metrics;
use crate::period::Hour;

mod plain;
mod split;

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
    /// Event time, epoch milliseconds (on arrival never before 2000-01-01, see
    /// [`ParseLimits::earliest_millis`]). Buckets follow this, not arrival time.
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
    /// The earliest `ts` accepted, epoch milliseconds: [`ParseLimits::EARLIEST_MILLIS`] (2000-01-01) on
    /// arrival (SPEC 1.1: an earlier value is almost always epoch *seconds*). Reading back a stored log
    /// uses 0, since events stored before that rule existed were valid then.
    pub earliest_millis: i64,
}

impl ParseLimits {
    /// The default tolerance for events stamped in the future: 5 minutes.
    pub const DEFAULT_MAX_FUTURE_MILLIS: i64 = 5 * 60 * 1000;
    /// 2000-01-01T00:00:00Z in epoch milliseconds: no event on arrival is older (SPEC 1.1).
    pub const EARLIEST_MILLIS: i64 = 946_684_800_000;

    /// Limits at server time `now_millis` with the default future tolerance and earliest time.
    #[must_use]
    pub fn at(now_millis: i64) -> ParseLimits {
        ParseLimits {
            now_millis,
            max_future_millis: Self::DEFAULT_MAX_FUTURE_MILLIS,
            earliest_millis: Self::EARLIEST_MILLIS,
        }
    }

    /// Limits for reading back stored events: they were validated on arrival, under the rules of their
    /// day, so neither today's clock nor a floor added later applies.
    #[must_use]
    pub fn for_stored_events() -> ParseLimits {
        ParseLimits {
            now_millis: i64::MAX / 4,
            max_future_millis: 0,
            earliest_millis: 0,
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

        let raw_id = required_string(object, "id")?;
        let id = EventId::parse(raw_id)
            .map_err(|error| EventError::new("id", describe_id_error(error, raw_id)))?;
        let kind = EventKind::parse(required_string(object, "type")?)?;
        let ts_millis = parse_ts(required(object, "ts")?, limits)?;
        let raw_product = required_string(object, "product_id")?;
        let product = ProductId::parse(raw_product)
            .map_err(|error| EventError::new("product_id", describe_id_error(error, raw_product)))?;
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
        use std::io::Write as _;
        fn string(out: &mut Vec<u8>, value: &str) {
            // serde_json escapes exactly `"`, `\\` and C0 controls; a string without them (almost every id)
            // is copied as it is, which is what serde_json would write.
            if !value
                .bytes()
                .any(|byte| byte == b'"' || byte == b'\\' || byte < 0x20)
            {
                out.push(b'"');
                out.extend_from_slice(value.as_bytes());
                out.push(b'"');
                return;
            }
            serde_json::to_writer(&mut *out, value).expect("writing to a Vec cannot fail");
        }
        out.extend_from_slice(b"{\"id\":");
        string(out, self.id.as_str());
        out.extend_from_slice(b",\"type\":\"");
        out.extend_from_slice(self.kind.as_str().as_bytes());
        out.extend_from_slice(b"\",\"ts\":");
        // `write!` into the Vec formats in place: no String per event.
        write!(out, "{}", self.ts_millis).expect("writing to a Vec cannot fail");
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
            write!(
                out,
                ",\"quantity\":{},\"price\":{}",
                payment.quantity, payment.price
            )
            .expect("writing to a Vec cannot fail");
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

/// An identifier's rule, plus what was wrong with this one when that is not obvious: the byte count of a
/// string that looks short enough in characters (`é` is two bytes), or where the control character is.
fn describe_id_error(error: IdError, raw: &str) -> String {
    match error {
        IdError::Length { .. } if !raw.is_empty() => {
            format!("{error} of UTF-8; this one is {} bytes", raw.len())
        }
        IdError::ControlCharacter => {
            let position = raw.chars().position(char::is_control).unwrap_or(0);
            format!("{error} (U+0000 to U+001F, U+007F to U+009F); character {position} is one")
        }
        _ => error.to_string(),
    }
}

/// How a `ts` was written, for the hint of a rejection.
#[derive(Copy, Clone, PartialEq, Eq)]
enum TsForm {
    Rfc3339,
    EpochMillis,
}

const TS_FORMAT_HINT: &str =
    "must be an RFC 3339 timestamp with an offset (e.g. 2026-07-17T13:05:02.123Z) or integer epoch milliseconds";
const TS_UNIT_HINT: &str = "ts is epoch milliseconds: is it in microseconds or nanoseconds?";

fn parse_ts(value: &Value, limits: &ParseLimits) -> Result<i64, EventError> {
    match value {
        Value::String(text) => check_ts_range(rfc3339_millis(text)?, TsForm::Rfc3339, limits),
        Value::Number(number) => match number.as_i64() {
            Some(millis) => check_ts_range(millis, TsForm::EpochMillis, limits),
            // A positive integer beyond i64: far in the future however it is read.
            None if number.is_u64() => Err(future_error(limits, TS_UNIT_HINT)),
            None => Err(EventError::new(
                "ts",
                describe_float_ts(number.as_f64().unwrap_or(f64::NAN)),
            )),
        },
        _ => Err(EventError::new("ts", TS_FORMAT_HINT)),
    }
}

/// An RFC 3339 `ts`, floored to whole epoch milliseconds (before the range check).
fn rfc3339_millis(text: &str) -> Result<i64, EventError> {
    let timestamp: Timestamp = text.parse().map_err(|_| {
        if text.trim().parse::<i64>().is_ok() {
            EventError::new(
                "ts",
                format!("{TS_FORMAT_HINT}; send epoch milliseconds as a JSON number, not a string"),
            )
        } else {
            EventError::new("ts", TS_FORMAT_HINT)
        }
    })?;
    // Floor to whole milliseconds; jiff's range keeps this far inside i64.
    i64::try_from(timestamp.as_nanosecond().div_euclid(1_000_000))
        .map_err(|_| EventError::new("ts", TS_FORMAT_HINT))
}

/// `ts_millis` if it lies between the earliest accepted time and the server clock plus the allowed future.
fn check_ts_range(ts_millis: i64, form: TsForm, limits: &ParseLimits) -> Result<i64, EventError> {
    if ts_millis < limits.earliest_millis.max(0) {
        return Err(too_early_error(ts_millis, form, limits));
    }
    if ts_millis > limits.now_millis.saturating_add(limits.max_future_millis) {
        let hint = match form {
            TsForm::Rfc3339 => "check the sender's clock and the timestamp's offset",
            TsForm::EpochMillis => TS_UNIT_HINT,
        };
        return Err(future_error(limits, hint));
    }
    Ok(ts_millis)
}

/// Why a `ts` written as a float (`1.5`, `1784293502123.0`, `1e30`) is refused: only integer epoch
/// milliseconds are, and a huge one is out of range rather than "a fraction".
fn describe_float_ts(float: f64) -> String {
    // 2^63: the first float past i64::MAX.
    if !float.is_finite() || float.abs() >= 2f64.powi(63) {
        "is out of range: must be an RFC 3339 timestamp or integer epoch milliseconds, between 2000-01-01 \
         and the server clock"
            .to_owned()
    } else if float.fract() != 0.0 {
        "must be whole epoch milliseconds, not a fraction".to_owned()
    } else {
        "must be integer epoch milliseconds written without a decimal point or exponent (e.g. 1784293502123)"
            .to_owned()
    }
}

fn too_early_error(ts_millis: i64, form: TsForm, limits: &ParseLimits) -> EventError {
    let earliest = Timestamp::from_millisecond(limits.earliest_millis.max(0))
        .map_or_else(|_| limits.earliest_millis.to_string(), |t| t.to_string());
    let latest = limits.now_millis.saturating_add(limits.max_future_millis);
    let hint = match ts_millis.checked_mul(1_000) {
        // 1764580000 read as seconds is a plausible time: the usual seconds/milliseconds mix-up.
        Some(as_seconds)
            if form == TsForm::EpochMillis && (limits.earliest_millis..=latest).contains(&as_seconds) =>
        {
            format!("; {ts_millis} looks like epoch seconds: send milliseconds ({as_seconds})")
        }
        _ if form == TsForm::EpochMillis => "; ts is epoch milliseconds".to_owned(),
        _ => String::new(),
    };
    EventError::new("ts", format!("must not be before {earliest}{hint}"))
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
        .ok_or_else(|| {
            EventError::new(
                "quantity",
                describe_integer_error(quantity, 1, u64::from(MAX_QUANTITY), QUANTITY_RULE),
            )
        })?;

    let price = price.ok_or_else(|| EventError::new("price", "is required for payment events"))?;
    let price = integer_between(price, 0, MAX_PRICE)
        .ok_or_else(|| EventError::new("price", describe_integer_error(price, 0, MAX_PRICE, PRICE_RULE)))?;

    Ok(Some(Payment { quantity, price }))
}

/// `rule`, plus what is wrong with this value: a fraction is "never a float", but a whole number too big
/// for 64 bits (which serde_json can only hold as a float) or a negative one is out of range.
fn describe_integer_error(value: &Value, min: u64, max: u64, rule: &str) -> String {
    match value {
        Value::Number(number) if number.is_f64() => {
            let float = number.as_f64().unwrap_or(f64::NAN);
            #[allow(clippy::cast_precision_loss)] // the bounds are far below 2^53
            let in_range = (min as f64..=max as f64).contains(&float);
            if float.fract() != 0.0 {
                format!("{rule}, never a float")
            } else if in_range {
                format!("{rule}, written without a decimal point or exponent")
            } else {
                format!("{rule}; this one is out of range")
            }
        }
        Value::Number(_) => format!("{rule}; this one is out of range"),
        Value::String(_) => format!("{rule}; send a JSON number, not a string"),
        _ => rule.to_owned(),
    }
}

/// A JSON integer (not a float such as `2.0` or `1e3`, not a string) in `min..=max`.
fn integer_between(value: &Value, min: u64, max: u64) -> Option<u64> {
    let number = value.as_u64()?;
    (min..=max).contains(&number).then_some(number)
}

/// One item of an ingest body: a parsed JSON value, or what the splitter already knows is wrong with it.
#[derive(Clone, Debug, PartialEq)]
pub enum RawItem {
    /// Parsed JSON, not yet validated as an event (it may not even be an object).
    Value(Value),
    /// An array element or NDJSON line that is not valid JSON (`NaN`, `Infinity`, a bad escape, invalid
    /// UTF-8, nesting deeper than 128), with the parser's message.
    Malformed(String),
    /// An object that gives `key` twice (SPEC 1.1 rejects it); `value` keeps the first occurrence.
    DuplicateKey {
        /// The object as read, for the best-effort `id` of the rejection.
        value: Value,
        /// The first key given twice.
        key: String,
    },
    /// An object whose value for one of SPEC 1.1's fields cannot be read (`NaN`, a number beyond f64 such
    /// as `1e400`, a bad escape, invalid UTF-8): rejected naming that field.
    MalformedField {
        /// The field whose value could not be read.
        field: &'static str,
        /// serde_json's description, with its position.
        message: String,
    },
}

/// The fields of SPEC 1.1, as the `'static` names an [`EventError`] carries.
const EVENT_FIELDS: [&str; 7] = [
    "id",
    "type",
    "ts",
    "product_id",
    "categories",
    "quantity",
    "price",
];

impl RawItem {
    /// Reads one event's JSON (exactly one value; surrounding whitespace allowed), noticing a key given
    /// twice. This is how every entry point (HTTP body elements, NDJSON lines, stream messages) reads an
    /// event, so they share one set of rules.
    #[must_use]
    pub fn parse(json: &[u8]) -> RawItem {
        RawItem::parse_described(json, serde_json::Error::to_string)
    }

    /// [`RawItem::parse`], with the message of a malformed item written by `describe`.
    fn parse_described(json: &[u8], describe: impl FnOnce(&serde_json::Error) -> String) -> RawItem {
        match split::parse_element(json) {
            Ok(split::Element {
                value,
                duplicate_key: None,
            }) => RawItem::Value(value),
            Ok(split::Element {
                value,
                duplicate_key: Some(key),
            }) => RawItem::DuplicateKey { value, key },
            Err(split::ElementError { error, key }) => {
                // An element cut short (EOF) is broken as a whole, not in one field.
                let field = key
                    .filter(|_| !error.is_eof())
                    .and_then(|key| EVENT_FIELDS.iter().copied().find(|field| *field == key));
                match field {
                    Some(field) => RawItem::MalformedField {
                        field,
                        message: describe(&error),
                    },
                    None => RawItem::Malformed(describe(&error)),
                }
            }
        }
    }

    /// Validates this item as an event. A malformed item is rejected with field `event`; a key given
    /// twice names that key (or `event`, with the key in the message, for a field SPEC 1.1 ignores).
    pub fn to_event(&self, limits: &ParseLimits) -> Result<Event, EventError> {
        match self {
            RawItem::Value(value) => Event::from_json(value, limits),
            RawItem::Malformed(message) => {
                Err(EventError::new("event", format!("is not valid JSON ({message})")))
            }
            RawItem::MalformedField { field, message } => Err(EventError::new(
                field,
                format!("is not a readable JSON value ({message}); send a plain number or string"),
            )),
            RawItem::DuplicateKey { key, .. } => {
                Err(match EVENT_FIELDS.iter().find(|field| **field == key) {
                    Some(field) => EventError::new(field, "is given twice; send each key once"),
                    None => EventError::new(
                        "event",
                        format!(
                            "key {:?} is given twice; send each key once",
                            cut_to_bytes(key, 64)
                        ),
                    ),
                })
            }
        }
    }

    /// Best-effort `id` for a rejection report; see [`raw_id`].
    #[must_use]
    pub fn id(&self) -> Option<String> {
        match self {
            RawItem::Value(value) | RawItem::DuplicateKey { value, .. } => raw_id(value),
            RawItem::Malformed(_) | RawItem::MalformedField { .. } => None,
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

/// A body that cannot be split into items at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The JSON body's structure cannot be followed, or it is neither an array nor an object (HTTP 400).
    #[error("{0}")]
    NotParseable(String),
    /// More items than the caller accepts (HTTP 413); the body was not read further.
    #[error("a batch holds at most {max} events, this one has more; split it")]
    TooManyItems {
        /// The caller's limit.
        max: usize,
    },
}

/// Splits an ingest body into items; [`split_body_at_most`] without a limit on their number.
pub fn split_body(body: &[u8], format: BodyFormat) -> Result<Vec<RawItem>, BodyError> {
    split_body_at_most(body, format, usize::MAX)
}

/// Splits an ingest body into at most `max_items` items, each read on its own by [`RawItem::parse`].
///
/// JSON: an array of objects or a single object. The array is cut into elements by following only its
/// structure (strings, brackets, commas), so an element that is not valid JSON (`NaN`, `Infinity`, a
/// bad escape) becomes [`RawItem::Malformed`] and the others still land. A body whose structure cannot be
/// followed (never closed, mismatched brackets, an empty element, bytes after the array), an empty body,
/// or one that is neither an array nor an object → [`BodyError::NotParseable`]. A single object that is
/// balanced but unreadable is one malformed item, like an array element.
///
/// NDJSON: one object per non-empty line; a line that is not valid JSON becomes [`RawItem::Malformed`].
/// Lines may end in `\r\n`; lines holding only whitespace are skipped and do not count as items, so item
/// indexes count events, not lines.
///
/// A leading UTF-8 byte order mark is ignored. More than `max_items` items → [`BodyError::TooManyItems`],
/// found before any item is parsed, so an oversized batch costs a scan, not a parse.
pub fn split_body_at_most(
    body: &[u8],
    format: BodyFormat,
    max_items: usize,
) -> Result<Vec<RawItem>, BodyError> {
    map_body_elements(
        body,
        format,
        max_items,
        |element, line_number| match line_number {
            None => RawItem::parse(element),
            Some(line_number) => {
                RawItem::parse_described(element, |error| describe_line_error(line_number, error))
            }
        },
    )
}

/// One event's JSON (a Kafka record's value, a stream entry's `event` field) validated as an event: the
/// same answer as [`RawItem::parse`] + [`RawItem::to_event`], through the plain fast path (see
/// `event/plain.rs`) when the event is written the plain way, as [`parse_body_at_most`] does for bodies.
pub fn parse_event(json: &[u8], limits: &ParseLimits) -> Result<Event, EventError> {
    if let Some(event) = plain::plain_event(json, limits) {
        return Ok(event);
    }
    RawItem::parse(json).to_event(limits)
}

/// One body item after validation: the event, or its best-effort id (see [`raw_id`]) and why it was refused.
pub type ParsedItem = Result<Event, (Option<String>, EventError)>;

/// [`split_body_at_most`] followed by [`RawItem::to_event`] on every item, with the same answers, but
/// without building a `serde_json::Value` for events written the plain way (see `event/plain.rs`): the
/// ingest hot path.
pub fn parse_body_at_most(
    body: &[u8],
    format: BodyFormat,
    max_items: usize,
    limits: &ParseLimits,
) -> Result<Vec<ParsedItem>, BodyError> {
    map_body_elements(body, format, max_items, |element, line_number| {
        if let Some(event) = plain::plain_event(element, limits) {
            return Ok(event);
        }
        let item = match line_number {
            None => RawItem::parse(element),
            Some(line_number) => {
                RawItem::parse_described(element, |error| describe_line_error(line_number, error))
            }
        };
        item.to_event(limits).map_err(|error| (item.id(), error))
    })
}

/// Cuts a body into its elements (see [`split_body_at_most`]) and maps each with `read`, which also gets
/// the element's 1-based line number in an NDJSON body.
fn map_body_elements<T>(
    body: &[u8],
    format: BodyFormat,
    max_items: usize,
    mut read: impl FnMut(&[u8], Option<usize>) -> T,
) -> Result<Vec<T>, BodyError> {
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    match format {
        BodyFormat::Json => {
            let not_parseable =
                |why: String| BodyError::NotParseable(format!("body is not valid JSON: {why}"));
            let start = split::skip_whitespace(body, 0);
            let (ranges, end) = match body.get(start) {
                None => {
                    return Err(BodyError::NotParseable(
                        "body is empty; send a JSON array of event objects or one event object".to_owned(),
                    ))
                }
                Some(b'[') => split::array_elements(body, start, max_items).map_err(|error| match error {
                    split::SplitError::Structure(why) => not_parseable(why),
                    split::SplitError::TooManyElements(max) => BodyError::TooManyItems { max },
                })?,
                Some(b'{') => {
                    let end = split::value_end(body, start).map_err(not_parseable)?;
                    if max_items == 0 {
                        return Err(BodyError::TooManyItems { max: 0 });
                    }
                    (std::iter::once(start..end).collect(), end)
                }
                Some(_) => {
                    return Err(BodyError::NotParseable(
                        "body must be a JSON array of event objects or a single event object".to_owned(),
                    ))
                }
            };
            let trailing = split::skip_whitespace(body, end);
            if trailing < body.len() {
                return Err(not_parseable(format!(
                    "unexpected bytes at byte {trailing}, after the body's single top-level value"
                )));
            }
            Ok(ranges.into_iter().map(|range| read(&body[range], None)).collect())
        }
        BodyFormat::Ndjson => {
            let lines: Vec<(usize, &[u8])> = body
                .split(|&byte| byte == b'\n')
                .enumerate()
                .filter(|(_, line)| !line.iter().all(|&byte| split::is_whitespace(byte)))
                .take(max_items.saturating_add(1))
                .collect();
            if lines.len() > max_items {
                return Err(BodyError::TooManyItems { max: max_items });
            }
            Ok(lines
                .into_iter()
                .map(|(line_index, line)| {
                    let line = line.strip_suffix(b"\r").unwrap_or(line);
                    read(line, Some(line_index + 1))
                })
                .collect())
        }
    }
}

/// `line 7, column 3: expected value`, with the body's line number instead of serde_json's (always 1).
fn describe_line_error(line_number: usize, error: &serde_json::Error) -> String {
    let text = error.to_string();
    let position = format!(" at line {} column {}", error.line(), error.column());
    let message = text.strip_suffix(&position).unwrap_or(&text);
    format!("line {line_number}, column {}: {message}", error.column())
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut_to_bytes(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Best-effort `id` string of a raw item, for the `rejected[].id` field in responses.
///
/// Only a string `id` is reported, cut to at most 128 bytes (on a character boundary) so an oversized id
/// cannot blow up the response.
#[must_use]
pub fn raw_id(item: &Value) -> Option<String> {
    let id = item.get("id")?.as_str()?;
    Some(cut_to_bytes(id, EventId::MAX_BYTES).to_owned())
}

#[cfg(test)]
mod write_json_tests {
    use super::*;

    #[test]
    fn write_json_equals_to_json() {
        let limits = ParseLimits::at(1_800_000_000_000);
        for raw in [
            serde_json::json!({"id": "a\"b\\c\u{a0}", "type": "payment_refunded", "ts": 1_700_000_000_123i64,
                "product_id": "p/ü", "categories": ["x", "y\"z"], "quantity": 3, "price": 0}),
            serde_json::json!({"id": "v", "type": "product_viewed", "ts": 946_684_800_000i64, "product_id": "p"}),
        ] {
            let event = Event::from_json(&raw, &limits).unwrap();
            let mut bytes = Vec::new();
            event.write_json(&mut bytes);
            let written: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(written, event.to_json());
        }
    }
}
