//! Tests of the workload generators: determinism, the seed lesson's shares, and SPEC 1.1 validity.

use std::collections::{HashMap, HashSet};

use rankgate_workload::{
    flash_sale, queue_surge, sales_shares, seed_lesson, seed_lesson_catalog, write_ndjson, Counts, Event,
    EventType, FlashSaleConfig, SeedLessonConfig, DAY_MS, HOUR_MS, MAX_DISORDER_MS,
};
use serde_json::Value;

const END: i64 = 1_767_225_600_000;

fn small(seed: u64) -> SeedLessonConfig {
    SeedLessonConfig::new(seed, END).with_scale(0.01)
}

fn ndjson(events: &[Event]) -> Vec<u8> {
    let mut out = Vec::new();
    write_ndjson(events, &mut out).unwrap();
    out
}

#[test]
fn same_seed_same_events_different_seed_different_events() {
    let a = seed_lesson(&small(1));
    let b = seed_lesson(&small(1));
    let c = seed_lesson(&small(2));
    assert_eq!(a, b);
    assert_eq!(ndjson(&a), ndjson(&b));
    assert_ne!(ndjson(&a), ndjson(&c));
    assert_eq!(
        flash_sale(&FlashSaleConfig::default()),
        flash_sale(&FlashSaleConfig::default())
    );
}

#[test]
fn volumes_match_the_seed_lesson() {
    let events = seed_lesson(&small(3));
    let c = Counts::of(&events);
    println!("scale 0.01: {c}");
    assert_eq!(c.sales, 2_000);
    assert_eq!(c.views, 6_000);
    assert_eq!(c.likes, 800);
    assert!((95..=100).contains(&c.unlikes), "unlikes {}", c.unlikes);
    assert!((18..=20).contains(&c.refunds), "refunds {}", c.refunds);
}

#[test]
fn sales_shares_hot_category_and_two_categories() {
    for (seed, scale) in [(4, 0.01), (5, 0.01), (6, 0.1)] {
        let events = seed_lesson(&SeedLessonConfig::new(seed, END).with_scale(scale));
        let (hot, two) = sales_shares(&events, 0);
        println!(
            "seed {seed} scale {scale}: cat0 share of sales {:.1}%, two-category share {:.1}%",
            hot * 100.0,
            two * 100.0
        );
        assert!((hot - 0.40).abs() <= 0.03, "hot share {hot}");
        assert!((two - 0.20).abs() <= 0.03, "two-category share {two}");
    }
    // Expected shares of the catalogue itself are on target, and p0 is in the hot category.
    let catalog = seed_lesson_catalog(&small(4));
    let hot: f64 = catalog
        .iter()
        .filter(|p| p.categories.contains(0))
        .map(|p| p.popularity)
        .sum();
    let two: f64 = catalog
        .iter()
        .filter(|p| p.categories.len() == 2)
        .map(|p| p.popularity)
        .sum();
    println!(
        "catalogue: expected cat0 share {:.2}%, two-category {:.2}%",
        hot * 100.0,
        two * 100.0
    );
    assert!((hot - 0.40).abs() < 0.002 && (two - 0.20).abs() < 0.002);
    assert!(catalog[0].categories.contains(0));
}

#[test]
fn p0_is_the_top_seller() {
    let events = seed_lesson(&SeedLessonConfig::new(8, END).with_scale(0.1));
    let mut sales: HashMap<u32, u64> = HashMap::new();
    for e in events.iter().filter(|e| e.kind == EventType::PaymentSucceeded) {
        *sales.entry(e.product).or_default() += 1;
    }
    let top = sales
        .iter()
        .max_by_key(|(p, n)| (**n, std::cmp::Reverse(**p)))
        .unwrap();
    assert_eq!(*top.0, 0, "top seller {top:?}");
}

#[test]
fn ids_are_unique_and_shaped_by_type() {
    let events = seed_lesson(&small(9));
    let mut seen = HashSet::new();
    for e in &events {
        let id = e.id.to_string();
        assert!(id.starts_with(e.kind.id_prefix()), "{id} for {}", e.kind);
        assert!(seen.insert(id.clone()), "duplicate id {id}");
    }
    assert!(seen.contains("s-000001") && seen.contains("v-000001"));
    let flash = flash_sale(&FlashSaleConfig::default());
    let ids: HashSet<String> = flash.iter().map(|e| e.id.to_string()).collect();
    assert_eq!(ids.len(), 100_000);
    let members = queue_surge(3);
    assert_eq!(members, ["m-000001", "m-000002", "m-000003"]);
}

/// Checks one event object against SPEC 1.1.
fn check_spec_1_1(v: &Value, start: i64, end: i64) {
    let o = v.as_object().expect("an object");
    let id = o["id"].as_str().expect("id is a string");
    assert!((1..=128).contains(&id.len()));
    let kind = o["type"].as_str().expect("type is a string");
    assert!(EventType::ALL.iter().any(|t| t.as_str() == kind), "type {kind}");
    let ts = o["ts"].as_i64().expect("ts is an integer");
    assert!(
        o["ts"].is_i64() && (start..end).contains(&ts),
        "ts {ts} outside [{start}, {end})"
    );
    let product = o["product_id"].as_str().expect("product_id is a string");
    assert!((1..=128).contains(&product.len()) && !product.chars().any(char::is_control));
    let cats = o["categories"].as_array().expect("categories is an array");
    assert!(cats.len() <= 16);
    for c in cats {
        let c = c.as_str().expect("category is a string");
        assert!((1..=64).contains(&c.len()) && c != "all");
    }
    let payment = kind.starts_with("payment_");
    assert_eq!(o.contains_key("quantity"), payment, "{v}");
    assert_eq!(o.contains_key("price"), payment, "{v}");
    if payment {
        let q = o["quantity"].as_u64().expect("integer quantity");
        assert!((1..=10_000).contains(&q));
        assert!(o["price"].is_u64(), "price must be an integer, not a float: {v}");
        assert!((0..=1_000_000_000).contains(&o["price"].as_u64().unwrap()));
    }
    let expected = if payment { 7 } else { 5 };
    assert_eq!(o.len(), expected, "unexpected fields in {v}");
}

#[test]
fn every_event_is_valid_spec_1_1_json() {
    let config = small(10);
    let events = seed_lesson(&config);
    let text = String::from_utf8(ndjson(&events)).unwrap();
    assert_eq!(text.lines().count(), events.len());
    for (line, e) in text.lines().zip(&events) {
        let v: Value = serde_json::from_str(line).unwrap();
        check_spec_1_1(&v, config.start_millis(), config.end_millis);
        assert_eq!(v, e.to_json());
    }
    let fc = FlashSaleConfig::default();
    for e in flash_sale(&fc) {
        check_spec_1_1(&e.to_json(), fc.end_millis - fc.duration_ms, fc.end_millis);
    }
    let first = &events
        .iter()
        .find(|e| e.kind == EventType::PaymentSucceeded)
        .unwrap()
        .to_json();
    println!("example sale: {first}");
}

#[test]
fn a_products_categories_and_price_never_change() {
    let events = seed_lesson(&small(11));
    let mut cats = HashMap::new();
    let mut prices = HashMap::new();
    for e in &events {
        assert_eq!(
            *cats.entry(e.product).or_insert(e.categories),
            e.categories,
            "p{}",
            e.product
        );
        if let Some(price) = e.price {
            assert_eq!(*prices.entry(e.product).or_insert(price), price);
        }
        assert!((1..=2).contains(&e.categories.len()));
    }
}

#[test]
fn unlikes_follow_likes_and_refunds_follow_sales() {
    let events = seed_lesson(&small(12));
    let first_like: HashMap<u32, i64> =
        events
            .iter()
            .filter(|e| e.kind == EventType::ProductLiked)
            .fold(HashMap::new(), |mut m, e| {
                let t = m.entry(e.product).or_insert(e.ts);
                *t = (*t).min(e.ts);
                m
            });
    let mut likes: HashMap<u32, i64> = HashMap::new();
    for e in &events {
        match e.kind {
            EventType::ProductLiked => *likes.entry(e.product).or_default() += 1,
            EventType::ProductUnliked => *likes.entry(e.product).or_default() -= 1,
            _ => {}
        }
    }
    assert!(
        likes.values().all(|&n| n >= 0),
        "more unlikes than likes for some product"
    );
    let mut sales_by_product: HashMap<(u32, u32, i64), Vec<i64>> = HashMap::new();
    for e in events.iter().filter(|e| e.kind == EventType::PaymentSucceeded) {
        sales_by_product
            .entry((e.product, e.quantity.unwrap(), e.price.unwrap()))
            .or_default()
            .push(e.ts);
    }
    for e in &events {
        match e.kind {
            EventType::ProductUnliked => {
                let liked = first_like
                    .get(&e.product)
                    .expect("unlike of a product never liked");
                assert!(*liked < e.ts, "unlike before the first like");
            }
            EventType::PaymentRefunded => {
                let sales = &sales_by_product[&(e.product, e.quantity.unwrap(), e.price.unwrap())];
                assert!(
                    sales.iter().any(|&t| t < e.ts),
                    "refund without an earlier matching sale"
                );
            }
            _ => {}
        }
    }
}

#[test]
fn arrival_order_is_mostly_sorted_with_bounded_disorder() {
    let events = seed_lesson(&small(13));
    let mut max_seen = i64::MIN;
    let mut out_of_order = 0usize;
    for e in &events {
        if e.ts < max_seen {
            out_of_order += 1;
            assert!(max_seen - e.ts <= MAX_DISORDER_MS, "disorder beyond an hour");
        }
        max_seen = max_seen.max(e.ts);
    }
    let share = out_of_order as f64 / events.len() as f64;
    println!(
        "out of order: {out_of_order} of {} ({:.2}%)",
        events.len(),
        share * 100.0
    );
    assert!((0.005..0.10).contains(&share), "share out of order {share}");
}

#[test]
fn events_span_the_whole_range() {
    let config = small(14);
    let events = seed_lesson(&config);
    let min = events.iter().map(|e| e.ts).min().unwrap();
    let max = events.iter().map(|e| e.ts).max().unwrap();
    assert!(min < config.start_millis() + HOUR_MS * 2);
    assert!(max > config.end_millis - HOUR_MS * 2);
    assert_eq!(config.end_millis - config.start_millis(), 14 * DAY_MS);
}
