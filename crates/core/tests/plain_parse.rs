//! `parse_body_at_most` (the ingest hot path, which reads plainly written events without a
//! `serde_json::Value`) and `parse_event` (one event: a Kafka record, a stream entry) answer exactly what
//! `split_body_at_most` / `RawItem::parse` + `RawItem::to_event` answer, event by event and error by error, for bodies mixing plain events with every way an event can be written
//! unusually: escapes, repeated or unknown keys, `null`s, floats, strings for numbers, out-of-range values.

use proptest::prelude::*;
use rankgate_core::event::{
    parse_body_at_most, parse_event, split_body_at_most, BodyFormat, ParseLimits, ParsedItem, RawItem,
};

/// 2026-07-17T13:05:02.123Z.
const NOW: i64 = 1_784_293_502_123;

fn limits() -> ParseLimits {
    ParseLimits::at(NOW)
}

/// The reference answer: the full path on every item.
fn full_path(body: &[u8], format: BodyFormat, max: usize) -> Result<Vec<ParsedItem>, String> {
    split_body_at_most(body, format, max)
        .map(|items| {
            items
                .iter()
                .map(|item| item.to_event(&limits()).map_err(|error| (item.id(), error)))
                .collect()
        })
        .map_err(|error| format!("{error:?}"))
}

fn fast_path(body: &[u8], format: BodyFormat, max: usize) -> Result<Vec<ParsedItem>, String> {
    parse_body_at_most(body, format, max, &limits()).map_err(|error| format!("{error:?}"))
}

fn assert_same(events: &[String]) {
    for event in events {
        assert_eq!(
            parse_event(event.as_bytes(), &limits()),
            RawItem::parse(event.as_bytes()).to_event(&limits()),
            "{event}"
        );
    }
    let array = format!("[{}]", events.join(","));
    assert_eq!(
        fast_path(array.as_bytes(), BodyFormat::Json, 64),
        full_path(array.as_bytes(), BodyFormat::Json, 64),
        "{array}"
    );
    let lines = events.join("\r\n");
    assert_eq!(
        fast_path(lines.as_bytes(), BodyFormat::Ndjson, 64),
        full_path(lines.as_bytes(), BodyFormat::Ndjson, 64),
        "{lines}"
    );
}

/// Values each field may take: valid ones, near misses and wrong types.
fn value_for(field: &str) -> BoxedStrategy<String> {
    let common = prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("{}".to_owned()),
        Just("[]".to_owned()),
        Just("1.5".to_owned()),
        Just("-1".to_owned()),
        Just("\"\"".to_owned()),
    ];
    let specific = match field {
        "id" | "product_id" => prop_oneof![
            Just("\"e-1\"".to_owned()),
            Just("\"p1\"".to_owned()),
            Just("\"p\\u002d1\"".to_owned()),
            Just("\"caf\u{e9}\"".to_owned()),
            Just(format!("\"{}\"", "x".repeat(128))),
            Just(format!("\"{}\"", "x".repeat(129))),
            Just("\"a\\nb\"".to_owned()),
            Just("7".to_owned()),
        ]
        .boxed(),
        "type" => prop_oneof![
            Just("\"product_viewed\"".to_owned()),
            Just("\"product_liked\"".to_owned()),
            Just("\"product_unliked\"".to_owned()),
            Just("\"payment_succeeded\"".to_owned()),
            Just("\"payment_refunded\"".to_owned()),
            Just("\"product_viewed \"".to_owned()),
            Just("\"payment\\u005fsucceeded\"".to_owned()),
        ]
        .boxed(),
        "ts" => prop_oneof![
            Just((NOW - 1_000).to_string()),
            Just((NOW - 40 * 86_400_000).to_string()),
            Just((NOW + 3_600_000_000).to_string()),
            Just("946684800000".to_owned()),
            Just("946684799999".to_owned()),
            Just("1784293501123.0".to_owned()),
            Just("1.784293501123e12".to_owned()),
            Just("99999999999999999999".to_owned()),
            Just("\"2026-07-17T13:05:01Z\"".to_owned()),
            Just("\"2026-07-17T22:05:01.123456+09:00\"".to_owned()),
            Just("\"2026-07-17T13:05:01\"".to_owned()),
            Just("\"2099-07-17T13:05:01Z\"".to_owned()),
            Just("\"1999-12-31T23:59:59.999Z\"".to_owned()),
            Just("\"2026-07-17T13:05:01\\u005a\"".to_owned()),
            Just(format!("\"{}\"", NOW - 1_000)),
        ]
        .boxed(),
        "categories" => prop_oneof![
            Just("[\"toys\"]".to_owned()),
            Just("[\"b\",\"a\",\"b\"]".to_owned()),
            Just("[\"to\\u0079s\"]".to_owned()),
            Just("[1]".to_owned()),
            Just("[\"\"]".to_owned()),
            Just(format!("[{}]", vec!["\"c\""; 17].join(","))),
            Just(format!(
                "[{}]",
                (0..16).map(|i| format!("\"c{i}\"")).collect::<Vec<_>>().join(",")
            )),
            Just("\"toys\"".to_owned()),
        ]
        .boxed(),
        "quantity" => prop_oneof![
            Just("1".to_owned()),
            Just("10000".to_owned()),
            Just("10001".to_owned()),
            Just("0".to_owned()),
            Just("2.0".to_owned()),
            Just("\"2\"".to_owned()),
        ]
        .boxed(),
        "price" => prop_oneof![
            Just("0".to_owned()),
            Just("1500".to_owned()),
            Just("1000000000".to_owned()),
            Just("1000000001".to_owned()),
            Just("1e3".to_owned()),
            Just("18446744073709551616".to_owned()),
        ]
        .boxed(),
        _ => prop_oneof![Just("1".to_owned()), Just("{\"a\":[1,{\"b\":null}]}".to_owned())].boxed(),
    };
    prop_oneof![4 => specific, 1 => common].boxed()
}

/// One event object as text: mostly the seven fields once, sometimes with a field dropped, repeated, an
/// unknown key added, or a key written with an escape.
fn event_text() -> impl Strategy<Value = String> {
    let keys = prop_oneof![
        8 => Just(vec!["id", "type", "ts", "product_id", "categories", "quantity", "price"]),
        4 => Just(vec!["id", "type", "ts", "product_id", "categories"]),
        2 => Just(vec!["id", "type", "ts", "product_id"]),
        1 => Just(vec!["id", "type", "ts", "product_id", "extra"]),
        1 => Just(vec!["id", "type", "ts", "product_id", "id"]),
        1 => Just(vec!["id", "type", "ts", "product_id", "extra", "extra"]),
        1 => Just(vec!["\\u0069d", "type", "ts", "product_id"]),
        1 => Just(vec!["type", "ts", "product_id"]),
    ];
    keys.prop_flat_map(|keys| {
        let values: Vec<BoxedStrategy<String>> = keys
            .iter()
            .map(|key| value_for(if *key == "\\u0069d" { "id" } else { key }))
            .collect();
        (Just(keys), values)
    })
    .prop_map(|(keys, values)| {
        let fields: Vec<String> = keys
            .iter()
            .zip(values)
            .map(|(key, value)| format!("\"{key}\":{value}"))
            .collect();
        format!("{{{}}}", fields.join(","))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn the_fast_path_answers_as_the_full_path(events in prop::collection::vec(event_text(), 1..6)) {
        assert_same(&events);
    }
}

#[test]
fn plain_events_and_their_near_misses_answer_the_same() {
    let now = NOW - 1_000;
    assert_same(&[
        format!(
            r#"{{"id":"v-1","type":"product_viewed","ts":{now},"product_id":"p1","categories":["cat0"]}}"#
        ),
        format!(
            r#"{{"id":"s-1","type":"payment_succeeded","ts":{now},"product_id":"p2","categories":["b","a"],"quantity":2,"price":2980}}"#
        ),
        format!(
            r#"{{"id":"s-1","type":"payment_succeeded","ts":{now},"product_id":"p2","quantity":2,"price":2980}}"#
        ),
        format!(
            r#"{{"id":"v-2","type":"product_viewed","ts":{now},"product_id":"p1","quantity":null,"price":null,"categories":null}}"#
        ),
        format!(r#"{{"id":"v-3","type":"product_viewed","ts":{now},"product_id":"p1","quantity":1}}"#),
        format!(r#"{{"id":"v-4","type":"product_viewed","ts":{now},"product_id":"p1","id":"v-5"}}"#),
        format!(r#"{{"id":"v-6","type":"product_viewed","ts":{now},"product_id":"p1","x":1,"x":2}}"#),
        format!(r#"  {{"id":"v-7","type":"product_viewed","ts":{now},"product_id":"p1"}}  "#),
        format!(r#"{{"id":"r-1","type":"payment_refunded","ts":{now},"product_id":"p1"}}"#),
        r#"{"id":"v-8","type":"product_viewed","ts":NaN,"product_id":"p1"}"#.to_owned(),
        r#"[1,2]"#.to_owned(),
    ]);
}
