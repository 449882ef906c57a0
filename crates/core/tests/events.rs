//! Event parsing and validation (SPEC 1.1), metric deltas (SPEC 1.2) and ingest body splitting (SPEC 1.6).
//!
//! Each rule of the SPEC 1.1 table is tested from both sides: a value just inside is accepted, one just
//! outside is rejected with a message that names the field.

use proptest::prelude::*;
use rankgate_core::event::{
    raw_id, split_body, split_body_at_most, BodyError, BodyFormat, Event, EventError, EventKind, ParseLimits,
    Payment, RawItem,
};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::Hour;
use serde_json::{json, Value};

/// 2026-07-17T13:05:02.123Z, the server clock in these tests.
const NOW: i64 = 1_784_293_502_123;

fn limits() -> ParseLimits {
    ParseLimits::at(NOW)
}

fn view() -> Value {
    json!({ "id": "e-1", "type": "product_viewed", "ts": NOW - 1_000, "product_id": "p-1" })
}

fn payment() -> Value {
    json!({ "id": "e-2", "type": "payment_succeeded", "ts": NOW - 1_000, "product_id": "p-1",
            "categories": ["toys"], "quantity": 2, "price": 1_500 })
}

fn with(mut event: Value, field: &str, value: Value) -> Value {
    event.as_object_mut().unwrap().insert(field.to_owned(), value);
    event
}

fn without(mut event: Value, field: &str) -> Value {
    event.as_object_mut().unwrap().remove(field);
    event
}

fn parse(event: &Value) -> Result<Event, EventError> {
    Event::from_json(event, &limits())
}

fn rejected_field(event: &Value) -> &'static str {
    match parse(event) {
        Ok(parsed) => panic!("expected a rejection, got {parsed:?}"),
        Err(error) => error.field,
    }
}

#[track_caller]
fn assert_rejects(event: Value, field: &str) {
    let error = parse(&event).expect_err("expected a rejection");
    assert_eq!(error.field, field, "{error}");
    assert!(error.to_string().starts_with(&format!("{field}: ")), "{error}");
    assert!(!error.message.is_empty());
}

#[test]
fn a_minimal_view_parses() {
    let event = parse(&view()).unwrap();
    assert_eq!(event.id.as_str(), "e-1");
    assert_eq!(event.kind, EventKind::ProductViewed);
    assert_eq!(event.ts_millis, NOW - 1_000);
    assert_eq!(event.product.as_str(), "p-1");
    assert!(event.categories.is_empty());
    assert_eq!(event.payment, None);
}

#[test]
fn a_payment_parses_with_its_quantity_and_price() {
    let event = parse(&payment()).unwrap();
    assert_eq!(event.kind, EventKind::PaymentSucceeded);
    assert_eq!(
        event.payment,
        Some(Payment {
            quantity: 2,
            price: 1_500
        })
    );
    assert_eq!(event.categories.len(), 1);
}

#[test]
fn a_non_object_item_is_rejected_as_event() {
    for item in [json!([]), json!("e-1"), json!(17), json!(null), json!(true)] {
        assert_rejects(item, "event");
    }
}

#[test]
fn unknown_fields_are_ignored() {
    let event = with(
        with(view(), "session", json!({ "nested": [1, 2] })),
        "price_hint",
        json!(1.5),
    );
    assert!(parse(&event).is_ok());
}

#[test]
fn id_is_a_required_string_of_1_to_128_bytes() {
    assert!(parse(&with(view(), "id", json!("x".repeat(128)))).is_ok());
    assert_rejects(with(view(), "id", json!("x".repeat(129))), "id");
    assert_rejects(with(view(), "id", json!("")), "id");
    assert_rejects(with(view(), "id", json!(17)), "id");
    assert_rejects(with(view(), "id", json!(null)), "id");
    assert_rejects(without(view(), "id"), "id");
    assert_eq!(
        parse(&without(view(), "id")).unwrap_err().to_string(),
        "id: is required"
    );
    assert_eq!(
        parse(&with(view(), "id", json!(""))).unwrap_err().to_string(),
        "id: must be 1 to 128 bytes"
    );
}

#[test]
fn type_is_one_of_the_five_kinds() {
    for kind in EventKind::ALL {
        let mut event = with(view(), "type", json!(kind.as_str()));
        if kind.is_payment() {
            event = with(with(event, "quantity", json!(1)), "price", json!(0));
        }
        assert_eq!(parse(&event).unwrap().kind, kind);
        assert_eq!(EventKind::parse(kind.as_str()).unwrap(), kind);
    }
    assert_rejects(with(view(), "type", json!("product_purchased")), "type");
    assert_rejects(with(view(), "type", json!("PRODUCT_VIEWED")), "type");
    assert_rejects(with(view(), "type", json!(1)), "type");
    assert_rejects(without(view(), "type"), "type");
}

#[test]
fn ts_accepts_rfc3339_with_an_offset() {
    let event = parse(&with(view(), "ts", json!("2026-07-17T13:05:02.123Z"))).unwrap();
    assert_eq!(event.ts_millis, NOW);
    let offset = parse(&with(view(), "ts", json!("2026-07-17T15:05:02.123+02:00"))).unwrap();
    assert_eq!(offset.ts_millis, NOW);
    // Sub-millisecond precision is floored.
    let fine = parse(&with(view(), "ts", json!("2026-07-17T13:05:02.123999Z"))).unwrap();
    assert_eq!(fine.ts_millis, NOW);
    assert!(parse(&with(view(), "ts", json!("2000-01-01T00:00:00Z"))).is_ok());
}

#[test]
fn ts_rejects_strings_that_are_not_rfc3339_instants() {
    for text in [
        "2026-07-17T13:05:02",
        "2026-07-17",
        "yesterday",
        "",
        "1784293502123",
        "NaN",
        "2026-13-01T00:00:00Z",
    ] {
        assert_rejects(with(view(), "ts", json!(text)), "ts");
    }
}

#[test]
fn ts_accepts_integer_epoch_milliseconds() {
    assert_eq!(parse(&with(view(), "ts", json!(NOW))).unwrap().ts_millis, NOW);
    let earliest = ParseLimits::EARLIEST_MILLIS;
    assert_eq!(
        parse(&with(view(), "ts", json!(earliest))).unwrap().ts_millis,
        earliest
    );
}

#[test]
fn ts_rejects_fractions_negatives_other_types_and_absence() {
    assert_rejects(with(view(), "ts", json!(1.5)), "ts");
    assert_rejects(with(view(), "ts", json!(1_784_293_502_123.0)), "ts");
    assert_rejects(with(view(), "ts", json!(-1)), "ts");
    assert_rejects(with(view(), "ts", json!(i64::MIN)), "ts");
    assert_rejects(with(view(), "ts", json!(u64::MAX)), "ts");
    assert_rejects(with(view(), "ts", json!(true)), "ts");
    assert_rejects(with(view(), "ts", json!([NOW])), "ts");
    assert_rejects(with(view(), "ts", json!(null)), "ts");
    assert_rejects(without(view(), "ts"), "ts");
    let before_1970 = parse(&with(view(), "ts", json!("1969-12-31T23:59:59Z"))).unwrap_err();
    assert_eq!(before_1970.field, "ts");
}

#[test]
fn ts_more_than_five_minutes_in_the_future_is_rejected_with_a_unit_hint() {
    let limit = NOW + 5 * 60 * 1000;
    assert!(parse(&with(view(), "ts", json!(limit))).is_ok());
    let error = parse(&with(view(), "ts", json!(limit + 1))).unwrap_err();
    assert_eq!(error.field, "ts");
    assert!(
        error
            .message
            .starts_with("is more than 5 minutes in the future of the server clock; "),
        "{error}"
    );
    // Microseconds by mistake.
    let micros = parse(&with(view(), "ts", json!(NOW * 1_000))).unwrap_err();
    assert!(micros.message.contains("microseconds"), "{micros}");
    let string = parse(&with(view(), "ts", json!("2026-07-17T14:00:00Z"))).unwrap_err();
    assert!(
        string.message.starts_with("is more than 5 minutes in the future"),
        "{string}"
    );
    // The tolerance is configurable and the message follows it.
    let strict = ParseLimits {
        max_future_millis: 60_000,
        ..ParseLimits::at(NOW)
    };
    let error = Event::from_json(&with(view(), "ts", json!(NOW + 60_001)), &strict).unwrap_err();
    assert!(
        error.message.starts_with("is more than 1 minute in the future"),
        "{error}"
    );
}

#[test]
fn product_id_is_1_to_128_bytes_without_control_characters() {
    assert!(parse(&with(view(), "product_id", json!("p".repeat(128)))).is_ok());
    assert!(parse(&with(view(), "product_id", json!("jouet à 20 €"))).is_ok());
    assert_rejects(with(view(), "product_id", json!("p".repeat(129))), "product_id");
    assert_rejects(with(view(), "product_id", json!("")), "product_id");
    assert_rejects(with(view(), "product_id", json!("p\u{0}1")), "product_id");
    assert_rejects(with(view(), "product_id", json!("p\n1")), "product_id");
    assert_rejects(with(view(), "product_id", json!(42)), "product_id");
    assert_rejects(without(view(), "product_id"), "product_id");
}

#[test]
fn categories_are_optional_and_collapse_duplicates() {
    assert!(parse(&with(view(), "categories", json!([])))
        .unwrap()
        .categories
        .is_empty());
    assert!(parse(&with(view(), "categories", json!(null)))
        .unwrap()
        .categories
        .is_empty());
    let event = parse(&with(
        view(),
        "categories",
        json!(["toys", "books", "toys", "Books"]),
    ))
    .unwrap();
    let names: Vec<&str> = event
        .categories
        .iter()
        .map(|category| category.as_str())
        .collect();
    assert_eq!(names, ["Books", "books", "toys"]);
}

#[test]
fn categories_allow_16_entries_of_1_to_64_bytes_but_never_all() {
    let sixteen: Vec<String> = (0..16).map(|index| format!("c{index}")).collect();
    assert_eq!(
        parse(&with(view(), "categories", json!(sixteen)))
            .unwrap()
            .categories
            .len(),
        16
    );
    let seventeen: Vec<String> = (0..17).map(|index| format!("c{index}")).collect();
    assert_rejects(with(view(), "categories", json!(seventeen)), "categories");
    // Seventeen entries are too many even when they collapse to one.
    assert_rejects(with(view(), "categories", json!(vec!["toys"; 17])), "categories");
    assert!(parse(&with(view(), "categories", json!(["c".repeat(64)]))).is_ok());
    assert_rejects(with(view(), "categories", json!(["c".repeat(65)])), "categories");
    assert_rejects(with(view(), "categories", json!([""])), "categories");
    assert_rejects(with(view(), "categories", json!(["toys", "all"])), "categories");
    assert_eq!(
        parse(&with(view(), "categories", json!(["toys", "all"])))
            .unwrap_err()
            .to_string(),
        "categories: entry 1 `all` is reserved"
    );
    assert_rejects(with(view(), "categories", json!("toys")), "categories");
    assert_rejects(with(view(), "categories", json!([1])), "categories");
    assert_rejects(with(view(), "categories", json!({ "toys": true })), "categories");
}

#[test]
fn quantity_is_an_integer_from_1_to_10000() {
    assert!(parse(&with(payment(), "quantity", json!(1))).is_ok());
    assert!(parse(&with(payment(), "quantity", json!(10_000))).is_ok());
    for bad in [
        json!(0),
        json!(10_001),
        json!(-1),
        json!(2.0),
        json!(2.5),
        json!(1e3),
        json!("2"),
        json!(true),
    ] {
        let error = parse(&with(payment(), "quantity", bad)).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("quantity: must be an integer between 1 and 10000"),
            "{error}"
        );
    }
}

#[test]
fn price_is_an_integer_from_0_to_a_billion_never_a_float() {
    assert!(parse(&with(payment(), "price", json!(0))).is_ok());
    assert!(parse(&with(payment(), "price", json!(1_000_000_000))).is_ok());
    for bad in [
        json!(1_000_000_001),
        json!(-1),
        json!(9.99),
        json!(10.0),
        json!("100"),
        json!([100]),
    ] {
        assert_rejects(with(payment(), "price", bad), "price");
    }
    assert!(parse(&with(payment(), "price", json!(9.99)))
        .unwrap_err()
        .message
        .contains("never a float"));
}

#[test]
fn quantity_and_price_are_required_on_payments() {
    for kind in ["payment_succeeded", "payment_refunded"] {
        let event = with(payment(), "type", json!(kind));
        assert!(parse(&event).is_ok());
        assert_eq!(rejected_field(&without(event.clone(), "quantity")), "quantity");
        assert_eq!(rejected_field(&without(event.clone(), "price")), "price");
        assert_eq!(
            rejected_field(&with(event.clone(), "quantity", json!(null))),
            "quantity"
        );
    }
}

#[test]
fn quantity_and_price_are_forbidden_on_other_events() {
    for kind in ["product_viewed", "product_liked", "product_unliked"] {
        let event = with(view(), "type", json!(kind));
        assert!(parse(&event).is_ok());
        assert_eq!(
            parse(&with(event.clone(), "quantity", json!(1)))
                .unwrap_err()
                .to_string(),
            "quantity: is only allowed on payment events"
        );
        assert_eq!(rejected_field(&with(event.clone(), "price", json!(100))), "price");
        // An explicit null is the same as leaving the field out.
        assert!(parse(&with(event, "quantity", json!(null))).is_ok());
    }
}

#[test]
fn the_first_invalid_field_in_spec_order_is_reported() {
    let event = json!({ "id": "", "type": "nope", "ts": "nope", "product_id": "" });
    assert_eq!(rejected_field(&event), "id");
    let event = json!({ "id": "e", "type": "nope", "ts": "nope", "product_id": "" });
    assert_eq!(rejected_field(&event), "type");
}

#[test]
fn metric_deltas_follow_spec_1_2() {
    let delta = |event: Value| parse(&event).unwrap().metrics_delta();
    assert_eq!(
        delta(view()),
        Metrics {
            views: 1,
            ..Metrics::default()
        }
    );
    assert_eq!(
        delta(with(view(), "type", json!("product_liked"))),
        Metrics {
            likes: 1,
            ..Metrics::default()
        }
    );
    assert_eq!(
        delta(with(view(), "type", json!("product_unliked"))),
        Metrics {
            likes: -1,
            ..Metrics::default()
        }
    );
    assert_eq!(
        delta(payment()),
        Metrics {
            units: 2,
            sales: 3_000,
            ..Metrics::default()
        }
    );
    assert_eq!(
        delta(with(payment(), "type", json!("payment_refunded"))),
        Metrics {
            units: -2,
            sales: -3_000,
            ..Metrics::default()
        }
    );
    let largest = with(
        with(payment(), "quantity", json!(10_000)),
        "price",
        json!(1_000_000_000),
    );
    assert_eq!(delta(largest).sales, 10_000_000_000_000);
}

#[test]
fn events_bucket_into_their_utc_hour() {
    let event = parse(&with(view(), "ts", json!("2026-07-17T12:59:59.999Z"))).unwrap();
    let start = parse(&with(view(), "ts", json!("2026-07-17T12:00:00Z"))).unwrap();
    assert_eq!(event.hour(), start.hour());
    assert_eq!(start.hour(), Hour(start.ts_millis / 3_600_000));
    assert_eq!(start.hour().start_millis(), start.ts_millis);
}

#[test]
fn to_json_is_canonical_and_round_trips() {
    let event = parse(&with(payment(), "ts", json!("2026-07-17T15:05:02.123+02:00"))).unwrap();
    let canonical = event.to_json();
    assert_eq!(
        canonical,
        json!({ "id": "e-2", "type": "payment_succeeded", "ts": NOW, "product_id": "p-1",
                "categories": ["toys"], "quantity": 2, "price": 1_500 })
    );
    assert_eq!(parse(&canonical).unwrap(), event);
    let view = parse(&view()).unwrap();
    assert_eq!(
        view.to_json(),
        json!({ "id": "e-1", "type": "product_viewed", "ts": NOW - 1_000,
                                        "product_id": "p-1", "categories": [] })
    );
}

#[test]
fn a_json_array_body_splits_into_items_and_bad_items_fail_alone() {
    let body = serde_json::to_vec(&json!([
        view(),
        with(payment(), "quantity", json!(0)),
        42,
        with(view(), "categories", json!(["all"])),
        with(payment(), "id", json!("e-5")),
    ]))
    .unwrap();
    let items = split_body(&body, BodyFormat::Json).unwrap();
    assert_eq!(items.len(), 5);
    let outcomes: Vec<Result<Event, EventError>> =
        items.iter().map(|item| item.to_event(&limits())).collect();
    assert!(outcomes[0].is_ok());
    assert_eq!(outcomes[1].as_ref().unwrap_err().field, "quantity");
    assert_eq!(outcomes[2].as_ref().unwrap_err().field, "event");
    assert_eq!(outcomes[3].as_ref().unwrap_err().field, "categories");
    assert!(outcomes[4].is_ok());
    let ids: Vec<Option<String>> = items.iter().map(RawItem::id).collect();
    assert_eq!(
        ids,
        [
            Some("e-1".into()),
            Some("e-2".into()),
            None,
            Some("e-1".into()),
            Some("e-5".into())
        ]
    );
}

#[test]
fn a_single_json_object_body_is_one_item() {
    let body = serde_json::to_vec(&payment()).unwrap();
    let items = split_body(&body, BodyFormat::Json).unwrap();
    assert_eq!(items, [RawItem::Value(payment())]);
    assert!(split_body(b"[]", BodyFormat::Json).unwrap().is_empty());
}

#[test]
fn a_json_body_that_does_not_parse_fails_as_a_whole() {
    for body in [
        &b""[..],
        b"   ",
        b"[{\"id\": 1}",
        b"not json",
        b"[1,]",
        b"{} {}",
        b"[{}] x",
        b"[{\"a\": 1}}, {}]",
    ] {
        assert!(
            matches!(
                split_body(body, BodyFormat::Json),
                Err(BodyError::NotParseable(_))
            ),
            "{body:?}"
        );
    }
    // Valid JSON that is neither an array nor an object is no event body either.
    for body in [&b"42"[..], b"\"event\"", b"null"] {
        assert!(split_body(body, BodyFormat::Json).is_err());
    }
    // A byte order mark is not an error.
    let mut with_bom = b"\xEF\xBB\xBF".to_vec();
    with_bom.extend(serde_json::to_vec(&view()).unwrap());
    assert_eq!(split_body(&with_bom, BodyFormat::Json).unwrap().len(), 1);
}

#[test]
fn an_ndjson_body_has_one_item_per_non_empty_line_and_bad_lines_fail_alone() {
    let body = format!(
        "{}\n\n{}\r\n   \n{{\"id\": \"e-3\", \"type\": \n{}\n[1]\n",
        view(),
        with(payment(), "price", json!(-5)),
        with(view(), "id", json!("e-4")),
    );
    let items = split_body(body.as_bytes(), BodyFormat::Ndjson).unwrap();
    assert_eq!(items.len(), 5);
    assert!(items[0].to_event(&limits()).is_ok());
    assert_eq!(items[1].to_event(&limits()).unwrap_err().field, "price");
    let RawItem::Malformed(message) = &items[2] else {
        panic!("expected a malformed line, got {:?}", items[2])
    };
    assert!(message.starts_with("line 5, column "), "{message}");
    let error = items[2].to_event(&limits()).unwrap_err();
    assert_eq!(error.field, "event");
    assert!(error.message.starts_with("is not valid JSON"), "{error}");
    assert_eq!(items[2].id(), None);
    assert_eq!(items[3].to_event(&limits()).unwrap().id.as_str(), "e-4");
    assert_eq!(items[4].to_event(&limits()).unwrap_err().field, "event");
}

#[test]
fn an_ndjson_body_without_a_final_newline_or_events_is_fine() {
    let body = format!("{}\n{}", view(), payment());
    assert_eq!(split_body(body.as_bytes(), BodyFormat::Ndjson).unwrap().len(), 2);
    assert!(split_body(b"", BodyFormat::Ndjson).unwrap().is_empty());
    assert!(split_body(b"\n\r\n  \n", BodyFormat::Ndjson).unwrap().is_empty());
    // Invalid UTF-8 on a line spoils that line only.
    let mut body = b"{\"id\": \"\xFF\"}\n".to_vec();
    body.extend(serde_json::to_vec(&view()).unwrap());
    let items = split_body(&body, BodyFormat::Ndjson).unwrap();
    assert!(matches!(items[0], RawItem::MalformedField { field: "id", .. }));
    assert!(items[1].to_event(&limits()).is_ok());
}

#[test]
fn raw_ids_are_best_effort_strings() {
    assert_eq!(
        raw_id(&json!({ "id": "e-17", "type": 5 })),
        Some("e-17".to_owned())
    );
    assert_eq!(raw_id(&json!({ "id": 17 })), None);
    assert_eq!(raw_id(&json!(["e-17"])), None);
    assert_eq!(raw_id(&json!({ "id": "€".repeat(100) })).unwrap().len(), 126);
}

proptest! {
    #[test]
    fn valid_payments_round_trip_and_their_deltas_fit(
        quantity in 1_u32..=10_000,
        price in 0_u64..=1_000_000_000,
        ts in ParseLimits::EARLIEST_MILLIS..=NOW,
        refund in any::<bool>(),
        // `all` is the reserved name of the whole catalogue, never a category.
        categories in prop::collection::vec("[a-z]{1,8}".prop_filter("`all` is reserved", |c| c != "all"), 0..=16),
    ) {
        let kind = if refund { "payment_refunded" } else { "payment_succeeded" };
        let raw = json!({ "id": "e", "type": kind, "ts": ts, "product_id": "p",
                          "categories": categories, "quantity": quantity, "price": price });
        let event = parse(&raw).unwrap();
        prop_assert_eq!(parse(&event.to_json()).unwrap(), event.clone());
        let delta = event.metrics_delta();
        let sign = if refund { -1 } else { 1 };
        prop_assert_eq!(delta.units, sign * i64::from(quantity));
        prop_assert_eq!(delta.sales, sign * i64::try_from(u128::from(price) * u128::from(quantity)).unwrap());
        prop_assert!(event.categories.windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn arbitrary_json_never_panics(text in ".{0,200}") {
        let _ = split_body(text.as_bytes(), BodyFormat::Json);
        for item in split_body(text.as_bytes(), BodyFormat::Ndjson).unwrap() {
            let _ = item.to_event(&limits());
        }
    }
}

// ---- issue 9: hostile and careless input, one rejected event at a time ----

/// Splits a JSON body and validates every item, as `POST /v1/events` does.
fn outcomes(body: &[u8], format: BodyFormat) -> Vec<Result<Event, EventError>> {
    split_body(body, format)
        .expect("the body's structure is readable")
        .iter()
        .map(|item| item.to_event(&limits()))
        .collect()
}

#[test]
fn event_id_with_newline_or_control_character_is_rejected_naming_id() {
    for hostile in [
        "a\nb",
        "x\n",
        "\r",
        "nul\u{0}",
        "\u{1b}[31m",
        "del\u{7f}",
        "c1\u{85}",
    ] {
        let error = parse(&with(view(), "id", json!(hostile))).unwrap_err();
        assert_eq!(error.field, "id", "{hostile:?}");
        assert!(error.message.contains("control characters"), "{error}");
    }
    // What is not a control character stays a valid id.
    assert!(parse(&with(view(), "id", json!("order 17 / line 2 · ü"))).is_ok());
}

#[test]
fn an_id_of_128_multibyte_characters_is_rejected_with_its_byte_count() {
    let error = parse(&with(view(), "id", json!("é".repeat(128)))).unwrap_err();
    assert_eq!(
        error.to_string(),
        "id: must be 1 to 128 bytes of UTF-8; this one is 256 bytes"
    );
    assert!(parse(&with(view(), "id", json!("é".repeat(64)))).is_ok());
    let error = parse(&with(view(), "product_id", json!("é".repeat(65)))).unwrap_err();
    assert_eq!(error.field, "product_id");
    assert!(error.message.ends_with("this one is 130 bytes"), "{error}");
}

#[test]
fn categories_with_control_characters_or_too_many_entries_are_rejected() {
    let error = parse(&with(view(), "categories", json!(["toys", "a\nb"]))).unwrap_err();
    assert_eq!(error.field, "categories");
    assert!(
        error
            .message
            .starts_with("entry 1 must not contain control characters"),
        "{error}"
    );
    let many: Vec<String> = (0..100_000).map(|i| format!("c{i}")).collect();
    let error = parse(&with(view(), "categories", json!(many))).unwrap_err();
    assert_eq!(error.to_string(), "categories: must have at most 16 entries");
}

#[test]
fn ts_before_2000_is_rejected_with_a_hint_that_it_looks_like_seconds() {
    // Epoch seconds by mistake: 2025-12-01 in seconds is 1970-01-21 in milliseconds.
    let error = parse(&with(view(), "ts", json!(1_764_580_000))).unwrap_err();
    assert_eq!(
        error.to_string(),
        "ts: must not be before 2000-01-01T00:00:00Z; 1764580000 looks like epoch seconds: send milliseconds \
         (1764580000000)"
    );
    let just_before = parse(&with(view(), "ts", json!(ParseLimits::EARLIEST_MILLIS - 1))).unwrap_err();
    assert_eq!(just_before.field, "ts");
    assert!(
        just_before.message.ends_with("ts is epoch milliseconds"),
        "{just_before}"
    );
    let text = parse(&with(view(), "ts", json!("1999-12-31T23:59:59Z"))).unwrap_err();
    assert_eq!(text.to_string(), "ts: must not be before 2000-01-01T00:00:00Z");
    assert!(parse(&with(view(), "ts", json!("2000-01-01T00:00:00Z"))).is_ok());
    // Stored events are read back without the floor: they were valid when they arrived.
    let stored = Event::from_json(&with(view(), "ts", json!(5)), &ParseLimits::for_stored_events()).unwrap();
    assert_eq!(stored.ts_millis, 5);
}

#[test]
fn a_huge_integer_price_is_out_of_range_not_a_float() {
    for huge in [
        "100000000000000000000",
        "18446744073709551616",
        "1e30",
        "1000000001",
        "-1",
    ] {
        let body = format!(
            r#"{{"id":"e","type":"payment_succeeded","ts":{},"product_id":"p","quantity":1,"price":{huge}}}"#,
            NOW - 1000
        );
        let error = outcomes(body.as_bytes(), BodyFormat::Json).remove(0).unwrap_err();
        assert_eq!(error.field, "price", "{huge}");
        assert!(
            error.message.ends_with("this one is out of range"),
            "{huge}: {error}"
        );
        assert!(!error.message.contains("float"), "{huge}: {error}");
    }
    let fraction = parse(&with(payment(), "price", json!(12.5))).unwrap_err();
    assert!(fraction.message.ends_with("never a float"), "{fraction}");
    let exponent = parse(&with(payment(), "price", json!(1e3))).unwrap_err();
    assert!(
        exponent
            .message
            .ends_with("written without a decimal point or exponent"),
        "{exponent}"
    );
    let string = parse(&with(payment(), "quantity", json!("2"))).unwrap_err();
    assert!(
        string.message.ends_with("send a JSON number, not a string"),
        "{string}"
    );
    let huge_quantity = parse(&with(payment(), "quantity", json!(1e25))).unwrap_err();
    assert!(
        huge_quantity.message.ends_with("this one is out of range"),
        "{huge_quantity}"
    );
}

#[test]
fn ts_1e30_is_out_of_range_not_a_fraction() {
    let error = parse(&with(view(), "ts", json!(1e30))).unwrap_err();
    assert_eq!(error.field, "ts");
    assert!(error.message.starts_with("is out of range"), "{error}");
    assert!(!error.message.contains("fraction"), "{error}");
    let float = parse(&with(view(), "ts", json!(1_784_293_502_123.0))).unwrap_err();
    assert!(
        float.message.contains("without a decimal point or exponent"),
        "{float}"
    );
    let fraction = parse(&with(view(), "ts", json!(1_784_293_502_123.5))).unwrap_err();
    assert!(fraction.message.contains("not a fraction"), "{fraction}");
    let quoted = parse(&with(view(), "ts", json!("1784293502123"))).unwrap_err();
    assert!(quoted.message.ends_with("not a string"), "{quoted}");
}

#[test]
fn a_key_given_twice_rejects_that_event_naming_the_key() {
    let twice = format!(
        r#"[{{"id":"e-1","type":"product_viewed","type":"product_liked","ts":{ts},"product_id":"p"}},
            {{"id":"e-2","type":"product_viewed","ts":{ts},"product_id":"p","note":1,"note":2}},
            {{"id":"e-3","type":"product_viewed","ts":{ts},"product_id":"p"}}]"#,
        ts = NOW - 1000
    );
    let items = split_body(twice.as_bytes(), BodyFormat::Json).unwrap();
    let outcomes: Vec<_> = items.iter().map(|item| item.to_event(&limits())).collect();
    assert_eq!(
        outcomes[0].as_ref().unwrap_err().to_string(),
        "type: is given twice; send each key once"
    );
    assert_eq!(items[0].id().as_deref(), Some("e-1"));
    assert_eq!(
        outcomes[1].as_ref().unwrap_err().to_string(),
        r#"event: key "note" is given twice; send each key once"#
    );
    assert_eq!(outcomes[2].as_ref().unwrap().id.as_str(), "e-3");
    // The same in NDJSON, and a key spelled with an escape is the same key.
    let line = format!(
        r#"{{"id":"e-4","\u0069d":"e-5","type":"product_viewed","ts":{},"product_id":"p"}}"#,
        NOW
    );
    let error = outcomes_of_ndjson(&line).remove(0).unwrap_err();
    assert_eq!(error.field, "id");
}

fn outcomes_of_ndjson(body: &str) -> Vec<Result<Event, EventError>> {
    outcomes(body.as_bytes(), BodyFormat::Ndjson)
}

#[test]
fn a_nan_or_infinity_in_an_array_rejects_only_that_event() {
    let good = |id: &str| {
        format!(
            r#"{{"id":"{id}","type":"product_viewed","ts":{},"product_id":"p"}}"#,
            NOW - 1000
        )
    };
    let body = format!(
        r#"[{}, {{"id":"bad-1","type":"payment_succeeded","ts":{ts},"product_id":"p","quantity":1,"price":NaN}},
            {}, {{"id":"bad-2","ts":Infinity}}, -Infinity, {{"id":"bad-3","s":"\x"}}, {}]"#,
        good("a"),
        good("b"),
        good("c"),
        ts = NOW - 1000
    );
    let outcomes = outcomes(body.as_bytes(), BodyFormat::Json);
    assert_eq!(outcomes.len(), 7);
    let ok: Vec<&str> = outcomes
        .iter()
        .filter_map(|o| o.as_ref().ok())
        .map(|e| e.id.as_str())
        .collect();
    assert_eq!(ok, ["a", "b", "c"]);
    // A known field's unreadable value is named; a bare literal or an ignored field spoils the event.
    for (index, field) in [(1, "price"), (3, "ts"), (4, "event"), (5, "event")] {
        let error = outcomes[index].as_ref().unwrap_err();
        assert_eq!(error.field, field, "{error}");
        assert!(
            error.message.starts_with("is not valid JSON")
                || error.message.starts_with("is not a readable JSON value"),
            "{error}"
        );
    }
    // NDJSON: the same, line by line.
    let ndjson = format!("{}\n{{\"id\":\"x\",\"price\":NaN}}\r\n{}\n", good("a"), good("b"));
    let lines = outcomes_of_ndjson(&ndjson);
    assert!(lines[0].is_ok() && lines[1].is_err() && lines[2].is_ok());
    // A single object with a bad literal is one rejected event, not an unreadable body.
    let single = split_body(br#"{"id":"e","price":NaN}"#, BodyFormat::Json).unwrap()[0].to_event(&limits());
    assert_eq!(single.unwrap_err().field, "price");
}

#[test]
fn deeply_nested_json_rejects_only_its_event_at_bounded_cost() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let body = format!(r#"[{deep}, {{"id":"x","nested":{deep}}}, {}]"#, view());
    let outcomes = outcomes(body.as_bytes(), BodyFormat::Json);
    assert_eq!(outcomes.len(), 3);
    assert_eq!(outcomes[0].as_ref().unwrap_err().field, "event");
    let error = outcomes[1].as_ref().unwrap_err();
    assert!(error.message.contains("recursion limit"), "{error}");
    assert!(outcomes[2].is_ok());
    // Never closed: the body as a whole cannot be read.
    assert!(split_body("[".repeat(1_000_000).as_bytes(), BodyFormat::Json).is_err());
}

#[test]
fn a_body_that_is_empty_a_string_or_a_number_is_refused_with_a_clear_message() {
    for (body, expected) in [
        (&b""[..], "body is empty"),
        (b" \r\n", "body is empty"),
        (b"\xEF\xBB\xBF", "body is empty"),
        (
            b"\"events\"",
            "body must be a JSON array of event objects or a single event object",
        ),
        (b"42", "body must be a JSON array"),
        (b"null", "body must be a JSON array"),
    ] {
        let Err(BodyError::NotParseable(message)) = split_body(body, BodyFormat::Json) else {
            panic!("{body:?} should not parse");
        };
        assert!(message.starts_with(expected), "{body:?}: {message}");
    }
}

#[test]
fn a_batch_over_the_limit_is_refused_before_any_event_is_parsed() {
    let body = format!("[{}]", ["1"; 11].join(","));
    assert_eq!(
        split_body_at_most(body.as_bytes(), BodyFormat::Json, 10),
        Err(BodyError::TooManyItems { max: 10 })
    );
    assert_eq!(
        split_body_at_most(body.as_bytes(), BodyFormat::Json, 11)
            .unwrap()
            .len(),
        11
    );
    let ndjson = "{}\n\n{}\r\n{}\n";
    assert_eq!(
        split_body_at_most(ndjson.as_bytes(), BodyFormat::Ndjson, 2),
        Err(BodyError::TooManyItems { max: 2 })
    );
    assert_eq!(
        split_body_at_most(ndjson.as_bytes(), BodyFormat::Ndjson, 3)
            .unwrap()
            .len(),
        3
    );
}

proptest! {
    /// Whatever surrounds it, a good event in an array is read as the same event, and a value spoiled by
    /// a non-JSON literal is rejected on its own.
    #[test]
    fn good_events_survive_any_bad_neighbours(
        bad in prop::sample::select(vec!["NaN", "Infinity", "-Infinity", "nan", "0x10", "01", "1.", "\"\\q\"", "tru"]),
        before in 0_usize..3,
        after in 0_usize..3,
    ) {
        let mut elements: Vec<String> = Vec::new();
        for i in 0..before { elements.push(with(view(), "id", json!(format!("b{i}"))).to_string()); }
        elements.push(format!(r#"{{"id":"bad","ts":{bad}}}"#));
        for i in 0..after { elements.push(with(view(), "id", json!(format!("a{i}"))).to_string()); }
        let body = format!("[{}]", elements.join(","));
        let outcomes = outcomes(body.as_bytes(), BodyFormat::Json);
        prop_assert_eq!(outcomes.len(), before + after + 1);
        prop_assert!(outcomes[before].is_err());
        prop_assert_eq!(outcomes.iter().filter(|o| o.is_ok()).count(), before + after);
    }
}

/// Issue 9, defect 14 (found by the hostile restart test): a number no f64 holds (`1e400`) or a `NaN` as a
/// field's value made the whole event "not valid JSON"; the rejection now names that field, and the other
/// events of the array still land.
#[test]
fn an_unreadable_value_of_a_known_field_is_rejected_naming_that_field() {
    let good = serde_json::to_string(&view()).unwrap();
    let body = format!(
        r#"[{good},{{"id":"big","type":"payment_succeeded","ts":1764580000000,"product_id":"p1","quantity":2,"price":1e400}},{{"id":"nan","type":"product_viewed","ts":NaN,"product_id":"p1"}},{{"id":"x","type":"product_viewed","ts":1764580000000,"product_id":"p1","note":NaN}}]"#
    );
    let items = split_body(body.as_bytes(), BodyFormat::Json).unwrap();
    assert_eq!(items.len(), 4);
    assert!(items[0].to_event(&limits()).is_ok());
    assert_eq!(items[1].to_event(&limits()).unwrap_err().field, "price");
    assert_eq!(items[2].to_event(&limits()).unwrap_err().field, "ts");
    // An ignored field that cannot be read still spoils the event, which is named as a whole.
    assert_eq!(items[3].to_event(&limits()).unwrap_err().field, "event");
}
