//! Deterministic workload generators in the exact SPEC 1.1 event format.
//!
//! A crate of its own so that `rankgate demo` (in the server) and the benchmark tools (`rankgate-bench`)
//! share one generator, while the production binary depends on no benchmark code.
//!
//! - [`seed_lesson`]: the seed lesson's demo (SPEC Part 4). 200,000 sales over 14 days across 50
//!   categories (`cat0`..`cat49`) and 20,000 products (`p0`..`p19999`) with Zipf-like popularity, so `p0`
//!   sells most. 40% of sales fall in the hot category `cat0` and 20% of sales list two categories. Views
//!   (~3 per sale), likes (~0.4), unlikes (~0.05, each of an earlier like) and refunds (~1% of sales) are
//!   added on top, and a few percent of events arrive out of order by up to an hour.
//! - [`flash_sale`]: the seed's section 6.6 burst: 100,000 sales in one hour, one category, 20 products.
//! - [`queue_surge`]: member ids `m-000001`… for a waiting-room burst.
//! - [`write_ndjson`]: one JSON object per line.
//!
//! Everything is a pure function of its config: the same seed gives the same events, byte for byte.
//! Events are compact ([`Event`] is `Copy`); they serialize (serde) to exactly the SPEC 1.1 JSON:
//!
//! ```json
//! {"id":"s-000001","type":"payment_succeeded","ts":1767139200123,"product_id":"p0",
//!  "categories":["cat0","cat7"],"quantity":2,"price":12990}
//! ```
//!
//! `quantity` and `price` appear on payment types only. `ts` is integer epoch milliseconds.

use std::fmt;
use std::io::{self, Write};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

/// Milliseconds in one hour.
pub const HOUR_MS: i64 = 3_600_000;
/// Milliseconds in one day.
pub const DAY_MS: i64 = 24 * HOUR_MS;

/// Sales in the full-size (scale 1.0) 14-day seed-lesson workload.
pub const SEED_LESSON_SALES: u64 = 200_000;
/// Days the full-size seed-lesson workload spans.
pub const SEED_LESSON_DAYS: u32 = 14;
/// Number of categories in the seed-lesson workload (`cat0`..`cat49`).
pub const SEED_LESSON_CATEGORIES: u16 = 50;
/// Number of products in the seed-lesson workload (`p0`..`p19999`).
pub const SEED_LESSON_PRODUCTS: u32 = 20_000;
/// Share of sales whose product is in the hot category `cat0`.
pub const HOT_CATEGORY_SHARE: f64 = 0.40;
/// Share of sales whose product lists two categories.
pub const TWO_CATEGORY_SHARE: f64 = 0.20;
/// Exponent of the Zipf-like product popularity (weight of product `i` is `1 / (i + 1)^s`).
///
/// 0.75 makes `p0` about 2% of all sales and `p0` about 8× `p15`, close to the seed's own demo output.
pub const ZIPF_EXPONENT: f64 = 0.75;
/// `product_viewed` events per sale.
pub const VIEWS_PER_SALE: f64 = 3.0;
/// `product_liked` events per sale.
pub const LIKES_PER_SALE: f64 = 0.4;
/// `product_unliked` events per sale (each one undoes an earlier like).
pub const UNLIKES_PER_SALE: f64 = 0.05;
/// `payment_refunded` events per sale.
pub const REFUNDS_PER_SALE: f64 = 0.01;
/// Share of events that arrive late, out of order.
pub const DISORDER_SHARE: f64 = 0.03;
/// The most an out-of-order event arrives after its own time.
pub const MAX_DISORDER_MS: i64 = HOUR_MS;
/// Lowest product price, in the currency's smallest unit.
pub const MIN_PRICE: i64 = 500;
/// Highest product price, in the currency's smallest unit.
pub const MAX_PRICE: i64 = 200_000;

/// The five event types of SPEC 1.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventType {
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

impl EventType {
    /// Every event type, in declaration order.
    pub const ALL: [EventType; 5] = [
        EventType::ProductViewed,
        EventType::ProductLiked,
        EventType::ProductUnliked,
        EventType::PaymentSucceeded,
        EventType::PaymentRefunded,
    ];

    /// The wire name, e.g. `payment_succeeded`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::ProductViewed => "product_viewed",
            EventType::ProductLiked => "product_liked",
            EventType::ProductUnliked => "product_unliked",
            EventType::PaymentSucceeded => "payment_succeeded",
            EventType::PaymentRefunded => "payment_refunded",
        }
    }

    /// Whether events of this type carry `quantity` and `price`.
    pub fn is_payment(self) -> bool {
        matches!(self, EventType::PaymentSucceeded | EventType::PaymentRefunded)
    }

    /// The id prefix the seed-lesson generator uses for this type (`v`, `l`, `u`, `s`, `r`).
    pub fn id_prefix(self) -> char {
        match self {
            EventType::ProductViewed => 'v',
            EventType::ProductLiked => 'l',
            EventType::ProductUnliked => 'u',
            EventType::PaymentSucceeded => 's',
            EventType::PaymentRefunded => 'r',
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A compact event id: a one-letter prefix and a sequence number, shown as `s-000001`.
///
/// Sequence numbers start at 1 and are at least six digits wide (wider when they need to be).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId {
    /// The prefix letter, e.g. `s` for sales.
    pub prefix: char,
    /// The sequence number, from 1.
    pub seq: u32,
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{:06}", self.prefix, self.seq)
    }
}

/// The 0–2 categories a product belongs to, as indices `n` of the names `cat{n}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CategorySet {
    len: u8,
    ids: [u16; 2],
}

impl CategorySet {
    /// No categories.
    pub const EMPTY: CategorySet = CategorySet { len: 0, ids: [0, 0] };

    /// One category, `cat{a}`.
    pub fn one(a: u16) -> Self {
        CategorySet { len: 1, ids: [a, 0] }
    }

    /// Two categories, `cat{a}` and `cat{b}`, in that order. They must differ.
    pub fn two(a: u16, b: u16) -> Self {
        assert_ne!(a, b, "a product's two categories must differ");
        CategorySet { len: 2, ids: [a, b] }
    }

    /// How many categories there are (0–2).
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether there are no categories.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The category indices, in order.
    pub fn indices(&self) -> &[u16] {
        &self.ids[..self.len()]
    }

    /// Whether `cat{index}` is one of them.
    pub fn contains(&self, index: u16) -> bool {
        self.indices().contains(&index)
    }

    /// The category names, e.g. `["cat0", "cat7"]`.
    pub fn names(&self) -> Vec<String> {
        self.indices().iter().map(|&c| category_name(c)).collect()
    }
}

/// The name of category index `n`: `cat{n}`.
pub fn category_name(n: u16) -> String {
    format!("cat{n}")
}

/// The id of product index `n`: `p{n}`.
pub fn product_id(n: u32) -> String {
    format!("p{n}")
}

/// One behaviour event. Serializes to exactly the SPEC 1.1 JSON object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// The unique event id.
    pub id: EventId,
    /// The event type.
    pub kind: EventType,
    /// Event time, epoch milliseconds.
    pub ts: i64,
    /// Product index `n`; the product id is `p{n}`.
    pub product: u32,
    /// The product's categories (the same on every event of the product).
    pub categories: CategorySet,
    /// Units, on payment types only.
    pub quantity: Option<u32>,
    /// Unit price in the currency's smallest unit, on payment types only.
    pub price: Option<i64>,
}

impl Event {
    /// The product id, `p{n}`.
    pub fn product_id(&self) -> String {
        product_id(self.product)
    }

    /// The event as a `serde_json::Value` in the SPEC 1.1 format.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("an Event always serializes")
    }

    /// `price × quantity` for payment types (negated for refunds), 0 otherwise: the event's change to the
    /// `sales` metric.
    pub fn sales_delta(&self) -> i64 {
        let amount = self.price.unwrap_or(0) * i64::from(self.quantity.unwrap_or(0));
        match self.kind {
            EventType::PaymentSucceeded => amount,
            EventType::PaymentRefunded => -amount,
            _ => 0,
        }
    }
}

struct Names<'a>(&'a CategorySet);

impl Serialize for Names<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct Cat(u16);
        impl Serialize for Cat {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(&format_args!("cat{}", self.0))
            }
        }
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for &c in self.0.indices() {
            seq.serialize_element(&Cat(c))?;
        }
        seq.end()
    }
}

struct Collect<T>(T);

impl<T: fmt::Display> Serialize for Collect<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let payment = self.kind.is_payment();
        let mut map = serializer.serialize_map(Some(if payment { 7 } else { 5 }))?;
        map.serialize_entry("id", &Collect(self.id))?;
        map.serialize_entry("type", self.kind.as_str())?;
        map.serialize_entry("ts", &self.ts)?;
        map.serialize_entry("product_id", &Collect(format_args!("p{}", self.product)))?;
        map.serialize_entry("categories", &Names(&self.categories))?;
        if payment {
            map.serialize_entry("quantity", &self.quantity.unwrap_or(1))?;
            map.serialize_entry("price", &self.price.unwrap_or(0))?;
        }
        map.end()
    }
}

/// Configuration of [`seed_lesson`].
#[derive(Debug, Clone, PartialEq)]
pub struct SeedLessonConfig {
    /// RNG seed. The same config always gives the same events.
    pub seed: u64,
    /// Exclusive end of the event-time range, epoch milliseconds (callers usually pass "now").
    pub end_millis: i64,
    /// Volume factor: 1.0 is the full 200,000 sales per 14 days; tests use 0.01. The catalogue
    /// (products, categories) does not scale.
    pub scale: f64,
    /// Days the events span: `[end_millis - days, end_millis)`. Sales scale with it at a constant daily
    /// rate (200,000 × scale × days / 14).
    pub days: u32,
    /// Number of products, `p0`..
    pub products: u32,
    /// Number of categories, `cat0`.. (`cat0` is the hot one). At least 3.
    pub categories: u16,
}

impl Default for SeedLessonConfig {
    /// Seed 42, full size, 14 days ending at 2026-01-01T00:00:00Z.
    fn default() -> Self {
        SeedLessonConfig {
            seed: 42,
            end_millis: 1_767_225_600_000,
            scale: 1.0,
            days: SEED_LESSON_DAYS,
            products: SEED_LESSON_PRODUCTS,
            categories: SEED_LESSON_CATEGORIES,
        }
    }
}

impl SeedLessonConfig {
    /// The full-size workload for `seed`, ending at `end_millis`.
    pub fn new(seed: u64, end_millis: i64) -> Self {
        SeedLessonConfig {
            seed,
            end_millis,
            ..Self::default()
        }
    }

    /// The same config with a different volume factor.
    pub fn with_scale(mut self, scale: f64) -> Self {
        self.scale = scale;
        self
    }

    /// The same config spanning a different number of days.
    pub fn with_days(mut self, days: u32) -> Self {
        self.days = days;
        self
    }

    /// The inclusive start of the event-time range.
    pub fn start_millis(&self) -> i64 {
        self.end_millis - i64::from(self.days) * DAY_MS
    }

    /// The number of `payment_succeeded` events this config generates.
    pub fn sales(&self) -> usize {
        let per_day = SEED_LESSON_SALES as f64 / f64::from(SEED_LESSON_DAYS);
        (per_day * f64::from(self.days) * self.scale).round().max(0.0) as usize
    }
}

/// One product of a generated catalogue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Product {
    /// The product's fixed categories.
    pub categories: CategorySet,
    /// The product's unit price.
    pub price: i64,
    /// Its share of sales (and of views and likes), summing to 1 over the catalogue.
    pub popularity: f64,
}

/// The seed-lesson catalogue for `config`: product `n` is `p{n}`, in popularity order.
///
/// Categories are assigned by error diffusion in popularity order, so that the *expected* share of sales
/// in `cat0` is [`HOT_CATEGORY_SHARE`] and the expected share of sales listing two categories is
/// [`TWO_CATEGORY_SHARE`], whatever the skew. Other categories are drawn uniformly from `cat1`... A
/// product in `cat0` with two categories also lists one other category. [`seed_lesson`] uses exactly this
/// catalogue.
pub fn seed_lesson_catalog(config: &SeedLessonConfig) -> Vec<Product> {
    let mut rng = StdRng::seed_from_u64(config.seed ^ 0xC47A_1065);
    catalog(&mut rng, config)
}

fn catalog(rng: &mut StdRng, config: &SeedLessonConfig) -> Vec<Product> {
    assert!(config.products > 0, "at least one product");
    assert!(config.categories >= 3, "at least 3 categories");
    let weights: Vec<f64> = (0..config.products)
        .map(|i| 1.0 / f64::from(i + 1).powf(ZIPF_EXPONENT))
        .collect();
    let total: f64 = weights.iter().sum();
    let (mut seen, mut hot, mut two) = (0.0f64, 0.0f64, 0.0f64);
    let (lo, hi) = ((MIN_PRICE as f64).ln(), (MAX_PRICE as f64).ln());
    let others = config.categories - 1;
    weights
        .iter()
        .map(|&w| {
            let share = w / total;
            // Join when the running share is below target (error diffusion; the first product joins).
            let is_hot = hot < HOT_CATEGORY_SHARE * seen || seen == 0.0;
            let is_two = two < TWO_CATEGORY_SHARE * seen || seen == 0.0;
            seen += share;
            if is_hot {
                hot += share;
            }
            if is_two {
                two += share;
            }
            let a = 1 + rng.random_range(0..others);
            let categories = match (is_hot, is_two) {
                (true, false) => CategorySet::one(0),
                (true, true) => CategorySet::two(0, a),
                (false, false) => CategorySet::one(a),
                (false, true) => {
                    let mut b = 1 + rng.random_range(0..others - 1);
                    if b >= a {
                        b += 1;
                    }
                    CategorySet::two(a, b)
                }
            };
            let price =
                ((rng.random_range(lo..hi).exp() / 10.0).round() as i64 * 10).clamp(MIN_PRICE, MAX_PRICE);
            Product {
                categories,
                price,
                popularity: share,
            }
        })
        .collect()
}

/// Samples product indices with the catalogue's popularity.
struct Popularity {
    cumulative: Vec<f64>,
}

impl Popularity {
    fn new(products: &[Product]) -> Self {
        let mut acc = 0.0;
        let cumulative = products
            .iter()
            .map(|p| {
                acc += p.popularity;
                acc
            })
            .collect();
        Popularity { cumulative }
    }

    fn sample(&self, rng: &mut StdRng) -> u32 {
        let total = *self.cumulative.last().expect("non-empty catalogue");
        let u = rng.random::<f64>() * total;
        let i = self.cumulative.partition_point(|&c| c <= u);
        i.min(self.cumulative.len() - 1) as u32
    }
}

/// A time in `[start, end)` with a mild day/night cycle (peak in the evening, UTC).
fn sample_ts(rng: &mut StdRng, start: i64, end: i64) -> i64 {
    loop {
        let ts = rng.random_range(start..end);
        let hour = (ts.rem_euclid(DAY_MS)) as f64 / HOUR_MS as f64;
        let intensity = 1.0 + 0.5 * ((hour - 13.0) / 24.0 * std::f64::consts::TAU).sin();
        if rng.random::<f64>() * 1.5 < intensity {
            return ts;
        }
    }
}

fn sample_quantity(rng: &mut StdRng) -> u32 {
    match rng.random_range(0..100) {
        0..70 => 1,
        70..88 => 2,
        88..98 => 3,
        _ => rng.random_range(4..=10),
    }
}

/// A time strictly after `after` and before `end`, at most `max_delay` later; `None` if there is no room.
fn sample_after(rng: &mut StdRng, after: i64, end: i64, min_delay: i64, max_delay: i64) -> Option<i64> {
    let room = end - 1 - after;
    if room < 1 {
        return None;
    }
    let hi = room.min(max_delay);
    let lo = min_delay.clamp(1, hi);
    Some(after + rng.random_range(lo..=hi))
}

/// Sorts events by time, numbers them `{prefix}-000001`… in that order.
fn number(events: &mut [Event], prefix: char) {
    events.sort_by_key(|e| e.ts);
    for (i, e) in events.iter_mut().enumerate() {
        e.id = EventId {
            prefix,
            seq: (i + 1) as u32,
        };
    }
}

/// Orders events by arrival: by time, except that [`DISORDER_SHARE`] of them arrive up to
/// [`MAX_DISORDER_MS`] late.
fn arrival_order(rng: &mut StdRng, events: Vec<Event>) -> Vec<Event> {
    let mut keyed: Vec<(i64, Event)> = events
        .into_iter()
        .map(|e| {
            let late = if rng.random::<f64>() < DISORDER_SHARE {
                rng.random_range(1..=MAX_DISORDER_MS)
            } else {
                0
            };
            (e.ts + late, e)
        })
        .collect();
    keyed.sort_unstable_by_key(|(arrival, e)| (*arrival, e.ts, e.id));
    keyed.into_iter().map(|(_, e)| e).collect()
}

fn round_count(n: usize, per: f64) -> usize {
    (n as f64 * per).round() as usize
}

/// The seed lesson's demo workload (SPEC Part 4), in arrival order.
///
/// With the default config: 200,000 `payment_succeeded` (`s-000001`…), about 600,000 `product_viewed`
/// (`v-…`), 80,000 `product_liked` (`l-…`), 10,000 `product_unliked` (`u-…`, each for a product liked
/// earlier, after that like) and 2,000 `payment_refunded` (`r-…`, after its sale, same product, price and
/// quantity), all in `[end_millis - 14 days, end_millis)`. Ids within a type are numbered in time order.
/// The output is sorted by time except that a few percent of events arrive up to an hour late.
pub fn seed_lesson(config: &SeedLessonConfig) -> Vec<Event> {
    let mut rng = StdRng::seed_from_u64(config.seed);
    let products = seed_lesson_catalog(config);
    let popularity = Popularity::new(&products);
    let (start, end) = (config.start_millis(), config.end_millis);
    assert!(end > start, "the workload needs a non-empty time range");

    let event = |kind: EventType, ts: i64, product: u32, quantity: Option<u32>| {
        let p = &products[product as usize];
        Event {
            id: EventId {
                prefix: kind.id_prefix(),
                seq: 0,
            },
            kind,
            ts,
            product,
            categories: p.categories,
            quantity,
            price: quantity.map(|_| p.price),
        }
    };

    let n_sales = config.sales();
    let mut sales: Vec<Event> = (0..n_sales)
        .map(|_| {
            let product = popularity.sample(&mut rng);
            let ts = sample_ts(&mut rng, start, end);
            let quantity = sample_quantity(&mut rng);
            event(EventType::PaymentSucceeded, ts, product, Some(quantity))
        })
        .collect();
    number(&mut sales, 's');

    let mut refunds = Vec::new();
    for i in rand::seq::index::sample(
        &mut rng,
        n_sales,
        round_count(n_sales, REFUNDS_PER_SALE).min(n_sales),
    ) {
        let sale = sales[i];
        if let Some(ts) = sample_after(&mut rng, sale.ts, end, 60_000, 3 * DAY_MS) {
            refunds.push(Event {
                kind: EventType::PaymentRefunded,
                ts,
                ..sale
            });
        }
    }
    number(&mut refunds, 'r');

    let mut plain = |kind: EventType, n: usize| -> Vec<Event> {
        let mut out: Vec<Event> = (0..n)
            .map(|_| {
                let product = popularity.sample(&mut rng);
                let ts = sample_ts(&mut rng, start, end);
                event(kind, ts, product, None)
            })
            .collect();
        number(&mut out, kind.id_prefix());
        out
    };
    let views = plain(EventType::ProductViewed, round_count(n_sales, VIEWS_PER_SALE));
    let likes = plain(EventType::ProductLiked, round_count(n_sales, LIKES_PER_SALE));

    let mut unlikes = Vec::new();
    let n_unlikes = round_count(n_sales, UNLIKES_PER_SALE).min(likes.len());
    for i in rand::seq::index::sample(&mut rng, likes.len(), n_unlikes) {
        let like = likes[i];
        if let Some(ts) = sample_after(&mut rng, like.ts, end, 1_000, 3 * DAY_MS) {
            unlikes.push(Event {
                kind: EventType::ProductUnliked,
                ts,
                ..like
            });
        }
    }
    number(&mut unlikes, 'u');

    let mut all = Vec::with_capacity(sales.len() + refunds.len() + views.len() + likes.len() + unlikes.len());
    all.extend(sales);
    all.extend(refunds);
    all.extend(views);
    all.extend(likes);
    all.extend(unlikes);
    arrival_order(&mut rng, all)
}

/// Configuration of [`flash_sale`].
#[derive(Debug, Clone, PartialEq)]
pub struct FlashSaleConfig {
    /// RNG seed.
    pub seed: u64,
    /// Exclusive end of the sale, epoch milliseconds; it starts `duration_ms` earlier.
    pub end_millis: i64,
    /// Number of `payment_succeeded` events (`f-000001`…).
    pub sales: usize,
    /// Number of products, `p0`.. `p{products-1}`, equally popular.
    pub products: u32,
    /// The one category index; every event lists only `cat{category}`.
    pub category: u16,
    /// Length of the sale.
    pub duration_ms: i64,
}

impl Default for FlashSaleConfig {
    /// The seed's 6.6 flash sale: 100,000 sales in one hour, in `cat0`, over 20 products, ending at
    /// 2026-01-01T00:00:00Z.
    fn default() -> Self {
        FlashSaleConfig {
            seed: 7,
            end_millis: 1_767_225_600_000,
            sales: 100_000,
            products: 20,
            category: 0,
            duration_ms: HOUR_MS,
        }
    }
}

/// The flash sale of the seed's section 6.6, sorted by time (ids `f-000001`… in time order).
///
/// Quantities are 1–3; each product has one fixed price.
pub fn flash_sale(config: &FlashSaleConfig) -> Vec<Event> {
    assert!(config.products > 0 && config.duration_ms > 0);
    let mut rng = StdRng::seed_from_u64(config.seed);
    let prices: Vec<i64> = (0..config.products)
        .map(|_| rng.random_range(10..=500) * 100)
        .collect();
    let start = config.end_millis - config.duration_ms;
    let mut events: Vec<Event> = (0..config.sales)
        .map(|_| {
            let product = rng.random_range(0..config.products);
            Event {
                id: EventId { prefix: 'f', seq: 0 },
                kind: EventType::PaymentSucceeded,
                ts: rng.random_range(start..config.end_millis),
                product,
                categories: CategorySet::one(config.category),
                quantity: Some(rng.random_range(1..=3)),
                price: Some(prices[product as usize]),
            }
        })
        .collect();
    number(&mut events, 'f');
    events
}

/// The id of waiting-room member `n` (from 1): `m-000001`.
pub fn member_id(n: usize) -> String {
    format!("m-{n:06}")
}

/// `n` waiting-room member ids, `m-000001` … in arrival order, for a queue surge.
pub fn queue_surge(n: usize) -> Vec<String> {
    (1..=n).map(member_id).collect()
}

/// Writes each item as one line of JSON; returns the number of lines written.
///
/// Works for [`Event`]s, `serde_json::Value`s or anything else that serializes. Wrap an unbuffered
/// writer (a `File`) in a `BufWriter` first; this function does not buffer, but it does flush.
pub fn write_ndjson<I, W>(events: I, mut writer: W) -> io::Result<u64>
where
    I: IntoIterator,
    I::Item: Serialize,
    W: Write,
{
    let mut n = 0;
    for event in events {
        serde_json::to_writer(&mut writer, &event)?;
        writer.write_all(b"\n")?;
        n += 1;
    }
    writer.flush()?;
    Ok(n)
}

/// Counts of events by type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// `product_viewed` events.
    pub views: u64,
    /// `product_liked` events.
    pub likes: u64,
    /// `product_unliked` events.
    pub unlikes: u64,
    /// `payment_succeeded` events.
    pub sales: u64,
    /// `payment_refunded` events.
    pub refunds: u64,
}

impl Counts {
    /// Counts `events` by type.
    pub fn of<'a>(events: impl IntoIterator<Item = &'a Event>) -> Self {
        let mut c = Counts::default();
        for e in events {
            match e.kind {
                EventType::ProductViewed => c.views += 1,
                EventType::ProductLiked => c.likes += 1,
                EventType::ProductUnliked => c.unlikes += 1,
                EventType::PaymentSucceeded => c.sales += 1,
                EventType::PaymentRefunded => c.refunds += 1,
            }
        }
        c
    }

    /// All events.
    pub fn total(&self) -> u64 {
        self.views + self.likes + self.unlikes + self.sales + self.refunds
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} events: {} sales, {} refunds, {} views, {} likes, {} unlikes",
            self.total(),
            self.sales,
            self.refunds,
            self.views,
            self.likes,
            self.unlikes
        )
    }
}

/// Shares of `payment_succeeded` events: in category `cat{hot}`, and listing two categories.
///
/// Returns `(hot_share, two_category_share)`, each in 0..=1 (0 when there are no sales).
pub fn sales_shares(events: &[Event], hot: u16) -> (f64, f64) {
    let (mut n, mut in_hot, mut two) = (0u64, 0u64, 0u64);
    for e in events.iter().filter(|e| e.kind == EventType::PaymentSucceeded) {
        n += 1;
        in_hot += u64::from(e.categories.contains(hot));
        two += u64::from(e.categories.len() == 2);
    }
    if n == 0 {
        return (0.0, 0.0);
    }
    (in_hot as f64 / n as f64, two as f64 / n as f64)
}
