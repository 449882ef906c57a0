//! The fast path of event parsing: an event written the plain way (the seven SPEC 1.1 fields and nothing
//! else, each key once, strings without escapes, `ts` as integer milliseconds) is read straight into an
//! [`Event`] without building a `serde_json::Value`.
//!
//! Ingest profiles showed the `Value` route allocating a map, its keys and every string of every event
//! before validation copied them again. Here the keys are matched by serde's derive, strings are
//! borrowed from the body, and only the event's own fields are allocated.
//!
//! This path only ever says yes or "not sure": anything it does not accept (an unknown or repeated key, an
//! escaped string, a float or string `ts`, any validation failure) returns `None`, and the caller runs the
//! full path ([`super::RawItem::parse`] + [`super::RawItem::to_event`]), which gives the exact answer and
//! the exact error. So the rules stay in one place; what this module must guarantee is that an event it
//! returns is the one the full path would return. Debug builds check that on every event.

use serde::Deserialize;
use serde_json::Value;

use super::{parse_ts, Event, EventKind, ParseLimits, Payment, MAX_CATEGORIES, MAX_PRICE, MAX_QUANTITY};
use crate::ids::{Category, EventId, ProductId};

/// The plain shape. `deny_unknown_fields` sends any other key to the full path, which alone knows how to
/// treat repeated unknown keys; a repeated known key is an error here too.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlainEvent<'a> {
    #[serde(borrow)]
    id: &'a str,
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    ts: i64,
    #[serde(borrow)]
    product_id: &'a str,
    /// `null` and absent are the same, as in the full path.
    #[serde(default, borrow)]
    categories: Option<Vec<&'a str>>,
    #[serde(default)]
    quantity: Option<u64>,
    #[serde(default)]
    price: Option<u64>,
}

/// The event in `json` when it is written the plain way and valid; `None` means "ask the full path".
pub(super) fn plain_event(json: &[u8], limits: &ParseLimits) -> Option<Event> {
    let plain: PlainEvent<'_> = serde_json::from_slice(json).ok()?;
    let event = validate(&plain, limits)?;
    debug_assert_eq!(
        Some(&event),
        super::RawItem::parse(json).to_event(limits).ok().as_ref(),
        "the plain path disagrees with the full path on {}",
        String::from_utf8_lossy(json)
    );
    Some(event)
}

/// The same checks as [`Event::from_json`], each failure a `None`.
fn validate(plain: &PlainEvent<'_>, limits: &ParseLimits) -> Option<Event> {
    let id = EventId::parse(plain.id).ok()?;
    let kind = EventKind::parse(plain.kind).ok()?;
    let ts_millis = parse_ts(&Value::from(plain.ts), limits).ok()?;
    let product = ProductId::parse(plain.product_id).ok()?;
    let mut categories = Vec::new();
    if let Some(names) = &plain.categories {
        if names.len() > MAX_CATEGORIES {
            return None;
        }
        categories.reserve_exact(names.len());
        for name in names {
            categories.push(Category::parse(name).ok()?);
        }
        categories.sort_unstable();
        categories.dedup();
    }
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
