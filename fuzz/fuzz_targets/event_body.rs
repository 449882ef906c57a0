//! The ingest body parser (SPEC 1.1): a JSON array, a single JSON object, or NDJSON, through the public core
//! functions the `POST /v1/events` handler uses (`split_body`, then `RawItem::to_event` per item).
//!
//! The first input byte picks the layout (even: JSON, odd: NDJSON); the rest is the body. Properties:
//! nothing panics; every accepted event has ids that satisfy SPEC 1.1 (1–128 bytes, no control characters),
//! sorted unique categories, and a canonical JSON form (`write_json` = `to_json`) that parses back to the
//! same event; a rejection's reported id is at most 128 bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rankgate_core::event::{split_body, BodyFormat, Event, ParseLimits};

/// A fixed server clock (2026-12-01T00:00:00Z), so a run is reproducible.
const NOW_MILLIS: i64 = 1_796_083_200_000;

fn valid_id(id: &str) {
    assert!(
        (1..=128).contains(&id.len()),
        "accepted id of {} bytes: {id:?}",
        id.len()
    );
    // SPEC 1.1: an id holds no control characters. Event ids fail this until `EventId::parse` refuses them
    // (issue 9 defect 1, helper `ingest`/`durability`); product ids and categories already hold it.
    assert!(
        !id.chars().any(char::is_control),
        "accepted id with a control character: {id:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let format = if selector % 2 == 0 {
        BodyFormat::Json
    } else {
        BodyFormat::Ndjson
    };
    let Ok(items) = split_body(body, format) else {
        return;
    };
    let limits = ParseLimits::at(NOW_MILLIS);
    for item in &items {
        if let Some(id) = item.id() {
            assert!(id.len() <= 128, "reported id of {} bytes", id.len());
        }
        let Ok(event) = item.to_event(&limits) else {
            continue;
        };
        valid_id(event.id.as_str());
        valid_id(event.product.as_str());
        for category in &event.categories {
            assert!((1..=64).contains(&category.as_str().len()));
            assert_ne!(category.as_str(), "all");
        }
        assert!(
            event.categories.windows(2).all(|pair| pair[0] < pair[1]),
            "categories not sorted unique"
        );
        assert!(event.ts_millis >= 0 && event.ts_millis <= NOW_MILLIS + limits.max_future_millis);
        assert_eq!(event.payment.is_some(), event.kind.is_payment());

        let mut written = Vec::new();
        event.write_json(&mut written);
        let reparsed: serde_json::Value = serde_json::from_slice(&written).expect("write_json writes JSON");
        assert_eq!(reparsed, event.to_json(), "write_json and to_json disagree");
        let again = Event::from_json(&reparsed, &limits).expect("the canonical form parses");
        assert_eq!(again, event, "the canonical form parses to another event");
    }
});
