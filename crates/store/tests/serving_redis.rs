//! The Redis serving store against (1) the Redis at 127.0.0.1:6379 and (2) a 3-node Redis Cluster this
//! binary starts itself: whatever the engine publishes, Redis answers exactly (same products, order,
//! scores bit for bit, metrics, carry, totals), in full and Top-N-only mode, batch after batch of
//! coalesced changes; with PostgreSQL as the source of truth the served rankings equal the plain batch
//! recompute; lost data is detected instead of patched; the pointer is fenced by the lease.
//!
//! Isolation: a key prefix per test (deleted by a guard, even after a panic) and a schema per PostgreSQL case.

#[path = "support/workload.rs"]
mod workload;

use std::sync::Arc;

use parking_lot::RwLock;
use proptest::prelude::*;

use rankgate_core::event::Event;
use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::period::{Hour, PeriodKey, PeriodKind, Span, WindowLen, Zone};
use rankgate_core::ranker::{PopularWeights, RankerName};
use rankgate_store::ranking::engine::{RankedItem, RankingEngine, RankingQuery};
use rankgate_store::ranking::publication::{take_publication, PublicationScope, SpanPublication};
use rankgate_store::ranking::recompute::BatchModel;
use rankgate_store::ranking::redis_serving::{
    demand_member, span_group, Active, Published, RedisServing, ServingOptions, StampKind, Stamped,
    PUBLISHED_RANKERS, SPAN_GROUPS,
};
use rankgate_store::ranking::sqlite::SqliteSource;
use rankgate_testkit::postgres_schemas::{postgres_url, SchemaGuard};
use rankgate_testkit::redis_servers::{cluster, standalone_url, unique_prefix, KeyCleanup};
use workload::{assert_same, categories, ingestor_over, raw_event, to_event, RawEvent, BASE, HOUR};

/// The spans published in these tests: every kind, including days with carry.
fn spans(zone: &Zone) -> Vec<Span> {
    let mut spans: Vec<Span> = (-1..4)
        .map(|day| {
            Span::Period(PeriodKey::containing(
                PeriodKind::Daily,
                Hour::from_millis(BASE + day * 24 * HOUR),
                zone,
            ))
        })
        .collect();
    for (kind, hour) in [
        (PeriodKind::Hourly, 5),
        (PeriodKind::Weekly, 50),
        (PeriodKind::Monthly, 50),
    ] {
        spans.push(Span::Period(PeriodKey::containing(
            kind,
            Hour::from_millis(BASE + hour * HOUR),
            zone,
        )));
    }
    for len in WindowLen::ALL {
        spans.push(Span::Window {
            len,
            end: Hour::from_millis(BASE + 95 * HOUR),
        });
    }
    spans
}

fn requests(zone: &Zone) -> Vec<(CategoryOrAll, Span)> {
    categories()
        .into_iter()
        .flat_map(|c| spans(zone).into_iter().map(move |s| (c.clone(), s)))
        .collect()
}

/// An ingestor over a SQLite source of truth in `dir`, default weights, 35 days' lateness.
fn sqlite_ingestor(
    dir: &std::path::Path,
) -> (
    rankgate_store::ranking::ingest::Ingestor,
    Arc<RwLock<RankingEngine>>,
) {
    ingestor_over(
        Box::new(SqliteSource::open(dir).unwrap()),
        PopularWeights::default(),
        35 * 24 * HOUR,
    )
}

async fn connect(urls: &[String], prefix: &str) -> Arc<RedisServing> {
    connect_chunked(urls, prefix, ServingOptions::default().max_writes_per_call).await
}

/// A store whose publish calls carry at most `max_writes_per_call` member writes each.
async fn connect_chunked(urls: &[String], prefix: &str, max_writes_per_call: usize) -> Arc<RedisServing> {
    RedisServing::connect(
        urls,
        ServingOptions {
            prefix: prefix.to_string(),
            max_writes_per_call,
            ..ServingOptions::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("connecting to redis at {urls:?}: {e}"))
}

/// Publishes what changed in the engine since the last call (everything on the first).
async fn publish(
    store: &RedisServing,
    engine: &RwLock<RankingEngine>,
    generation: u64,
    depth: Option<usize>,
    everything: bool,
) -> Published {
    let zone = Zone::utc();
    let scope = if everything {
        PublicationScope::Everything
    } else {
        PublicationScope::Changes
    };
    let publications = take_publication(&mut engine.write(), &requests(&zone), depth, scope);
    store
        .publish(generation, &publications, &zone, BASE)
        .await
        .expect("redis answers")
}

/// Every published ranking read back from Redis equals `expected` (the engine's or the recompute's),
/// truncated to `depth` in Top-N-only mode; rank lookups agree for every product. `trending` is not
/// published ([`PUBLISHED_RANKERS`]): Redis declines it.
async fn check_served(
    store: &RedisServing,
    generation: u64,
    depth: Option<usize>,
    expected: &mut dyn FnMut(&RankingQuery) -> Vec<RankedItem>,
) -> Result<(), TestCaseError> {
    let zone = Zone::utc();
    for (category, span) in requests(&zone) {
        let declined = store
            .top(generation, RankerName::Trending, &category, &span, 0, 10)
            .await
            .expect("redis answers");
        prop_assert!(declined.is_none(), "redis serves no trending ranking");
        for ranker in PUBLISHED_RANKERS {
            let query = RankingQuery {
                ranker,
                category: category.clone(),
                span,
            };
            let label = format!("{ranker} {category} {span:?}");
            let want = expected(&query);
            let shown = depth.unwrap_or(usize::MAX).min(want.len());
            let page = store
                .top(generation, ranker, &category, &span, 0, 1000)
                .await
                .expect("redis answers");
            let Some(page) = page else {
                // A category the engine never saw (no events yet) is not published.
                prop_assert!(want.is_empty(), "{}: not served but {} listed", label, want.len());
                continue;
            };
            prop_assert_eq!(page.total, want.len(), "{}: total", label);
            assert_same(&label, &page.items, &want[..shown])?;
            // A page from the middle, as the read API asks for it.
            if shown > 2 {
                let middle = store
                    .top(generation, ranker, &category, &span, 1, 2)
                    .await
                    .expect("redis answers")
                    .expect("served");
                assert_same(&format!("{label} page 2"), &middle.items, &want[1..3])?;
            }
            for product in (0..12).map(|p| ProductId::parse(&format!("p{p}")).unwrap()) {
                let served = store
                    .rank(generation, ranker, &category, &span, &product)
                    .await
                    .expect("redis answers")
                    .expect("served");
                let position = want[..shown].iter().position(|item| item.product == product);
                prop_assert_eq!(
                    served.rank,
                    position.map(|p| p + 1),
                    "{}: rank of {}",
                    label,
                    product
                );
                if let Some(p) = position {
                    prop_assert_eq!(served.score.map(f64::to_bits), Some(want[p].score.to_bits()));
                    prop_assert_eq!(served.metrics, want[p].metrics);
                    prop_assert_eq!(served.carry.to_bits(), want[p].carry.to_bits());
                }
            }
        }
    }
    Ok(())
}

fn from_engine(engine: &RwLock<RankingEngine>) -> impl FnMut(&RankingQuery) -> Vec<RankedItem> + '_ {
    move |query| engine.write().full_ranking(query)
}

/// Ingests `events` in batches of `batch` through an SQLite-backed ingestor, publishing the coalesced
/// changes after each batch and checking every served ranking against the engine.
async fn served_follows_the_engine(urls: Vec<String>, depth: Option<usize>) {
    served_follows_the_engine_in_calls_of(urls, depth, ServingOptions::default().max_writes_per_call).await;
}

/// [`served_follows_the_engine`] with publish calls of at most `chunk` member writes; with a chunk smaller
/// than a span, also checks that no call carried more, and that a replace over served spans (a second
/// full publication) and a rebuild into a fresh generation serve the same.
async fn served_follows_the_engine_in_calls_of(urls: Vec<String>, depth: Option<usize>, chunk: usize) {
    let prefix = unique_prefix();
    let _cleanup = KeyCleanup {
        nodes: urls.clone(),
        prefix: prefix.clone(),
    };
    let store = connect_chunked(&urls, &prefix, chunk).await;
    assert_eq!(store.is_cluster(), urls.len() > 1, "the intended topology");
    let dir = tempfile::tempdir().unwrap();
    let (mut ingestor, engine) = sqlite_ingestor(dir.path());
    let raw: Vec<RawEvent> = (0..600)
        .map(|i| RawEvent {
            id: i * 7 % 500, // some duplicates
            kind: (i % 5) as u8,
            hour_offset: (i as i64 * 13) % 96 - if i % 11 == 0 { 30 } else { 0 }, // some late
            minute: (i % 60) as i64,
            product: (i * 5 % 12) as u8,
            categories: vec![(i % 4) as u8],
            quantity: 1 + i % 3,
            price: 100 + (i as u64 * 37) % 900,
        })
        .collect();
    let events: Vec<Event> = raw.iter().map(to_event).collect();
    let generation = store.new_generation().await.unwrap();
    let mut first = true;
    for batch in events.chunks(97) {
        ingestor.ingest(batch, BASE).unwrap();
        let published = publish(&store, &engine, generation, depth, first).await;
        assert!(matches!(published, Published::Applied { .. }), "{published:?}");
        first = false;
        check_served(&store, generation, depth, &mut from_engine(&engine))
            .await
            .unwrap();
    }
    // Nothing changed: nothing to write.
    assert_eq!(
        take_publication(
            &mut engine.write(),
            &requests(&Zone::utc()),
            depth,
            PublicationScope::Changes
        ),
        Vec::new()
    );
    let largest_span = take_publication(
        &mut engine.write(),
        &requests(&Zone::utc()),
        depth,
        PublicationScope::Everything,
    )
    .iter()
    .map(|p| p.writes())
    .max()
    .unwrap();
    if largest_span > chunk {
        // The full publication just computed, replayed over the served spans (built beside them and
        // switched by each span's last call), then as a rebuild into a fresh generation.
        let published = publish(&store, &engine, generation, depth, true).await;
        let Published::Applied { calls, .. } = published else {
            panic!("{published:?}")
        };
        assert!(
            calls as usize > categories().len(),
            "a span bigger than a call takes several: {calls}"
        );
        check_served(&store, generation, depth, &mut from_engine(&engine))
            .await
            .unwrap();
        let rebuilt = store.new_generation().await.unwrap();
        let published = publish(&store, &engine, rebuilt, depth, true).await;
        assert!(matches!(published, Published::Applied { .. }), "{published:?}");
        check_served(&store, rebuilt, depth, &mut from_engine(&engine))
            .await
            .unwrap();
        // Every span was written in full, and totals match, as the rebuild's check before a switch reads them.
        for category in categories() {
            let totals = store.totals(&category, rebuilt).await.unwrap();
            for publication in take_publication(
                &mut engine.write(),
                &requests(&Zone::utc()),
                depth,
                PublicationScope::Everything,
            )
            .iter()
            .filter(|p| p.category == category)
            {
                let field = rankgate_store::ranking::redis_serving::span_field(&publication.span);
                assert_eq!(
                    totals.get(&field),
                    Some(&publication.totals),
                    "{category}/{field}"
                );
            }
        }
        let largest = store.largest_call_writes();
        assert!(
            largest as usize <= chunk,
            "a call carried {largest} writes, over {chunk}"
        );
        assert!(largest > 0);
    }

    // Losing a category's data is detected by the next change-only publication, which writes nothing.
    let lost_key = format!("{prefix}{{rk:all}}:totals:v{generation}");
    let mut connection = redis::Client::open(urls[0].as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    if urls.len() == 1 {
        let _: i64 = redis::cmd("DEL")
            .arg(&lost_key)
            .query_async(&mut connection)
            .await
            .unwrap();
    } else {
        // In a cluster the key lives on one node: ask the cluster client to delete it.
        let client = redis::cluster::ClusterClient::new(urls.clone()).unwrap();
        let mut cluster = client.get_async_connection().await.unwrap();
        let _: i64 = redis::cmd("DEL")
            .arg(&lost_key)
            .query_async(&mut cluster)
            .await
            .unwrap();
    }
    let more: Vec<Event> = (0..40)
        .map(|i| {
            to_event(&RawEvent {
                id: 10_000 + i,
                kind: 3,
                hour_offset: 95,
                minute: 1,
                product: (i % 12) as u8,
                categories: vec![],
                quantity: 1,
                price: 500,
            })
        })
        .collect();
    ingestor.ingest(&more, BASE).unwrap();
    assert_eq!(
        publish(&store, &engine, generation, depth, false).await,
        Published::Lost
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_serves_exactly_what_the_engine_ranks() {
    served_follows_the_engine(vec![standalone_url()], None).await;
}

// Defect 17 of issue 9: a publication as big as a whole span ran as one script, blocking a Redis that
// also serves the waiting room. With calls of at most 7 member writes every span here (12 products, up
// to 48 writes) is split: the served state is the same, and no call carries more than 7.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_span_publication_is_chunked_and_serves_the_same() {
    served_follows_the_engine_in_calls_of(vec![standalone_url()], None, 7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_top_n_span_publication_is_chunked_and_serves_the_same() {
    served_follows_the_engine_in_calls_of(vec![standalone_url()], Some(3), 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_span_publication_is_chunked_and_serves_the_same() {
    served_follows_the_engine_in_calls_of(cluster().urls.clone(), None, 7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_top_n_only_serves_the_top_k_and_full_totals() {
    served_follows_the_engine(vec![standalone_url()], Some(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_serves_exactly_what_the_engine_ranks() {
    served_follows_the_engine(cluster().urls.clone(), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_top_n_only_serves_the_top_k_and_full_totals() {
    served_follows_the_engine(cluster().urls.clone(), Some(3)).await;
}

/// A fresh key prefix on the standalone Redis, its cleanup guard, and a raw connection to it.
async fn standalone_with_prefix() -> (String, KeyCleanup, redis::aio::MultiplexedConnection) {
    let prefix = unique_prefix();
    let cleanup = KeyCleanup {
        nodes: vec![standalone_url()],
        prefix: prefix.clone(),
    };
    let connection = redis::Client::open(standalone_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    (prefix, cleanup, connection)
}

/// The pointer moves only for the lease holder; a stamp for a generation that is not current (or a
/// pointer that vanished) says so instead of recreating it.
async fn the_pointer_is_fenced_by_the_lease(urls: Vec<String>) {
    let prefix = unique_prefix();
    let _cleanup = KeyCleanup {
        nodes: urls.clone(),
        prefix: prefix.clone(),
    };
    let a = connect(&urls, &prefix).await;
    let b = connect(&urls, &prefix).await;
    let c = connect(&urls, &prefix).await;
    let every: Vec<usize> = (0..SPAN_GROUPS).collect();
    assert_eq!(
        a.hold_groups("a", 60_000).await.unwrap(),
        every,
        "alone: every group"
    );
    // A second publisher joins: the groups are dealt again, but a group still leased to `a` is not
    // taken until `a` gives it up at its next call.
    assert_eq!(b.hold_groups("b", 60_000).await.unwrap(), Vec::<usize>::new());
    let of_a = a.hold_groups("a", 60_000).await.unwrap();
    let of_b = b.hold_groups("b", 60_000).await.unwrap();
    assert_eq!(
        of_a.len() + of_b.len(),
        SPAN_GROUPS,
        "every group held once: {of_a:?} {of_b:?}"
    );
    assert!(of_a.iter().all(|g| !of_b.contains(g)), "no group held twice");
    assert_eq!(of_a.len(), SPAN_GROUPS / 2, "with no costs measured, half each");
    assert_eq!(a.live_publishers().await.unwrap(), 2);

    let first = Active {
        generation: a.new_generation().await.unwrap(),
        seq: 0,
        as_of_millis: Some(BASE),
        popular_version: 3,
        depth: Some(100),
        rebuild_requested: false,
    };
    assert_eq!(
        b.stamp("b", &of_a, &first, 0, StampKind::SwitchGeneration)
            .await
            .unwrap(),
        Stamped::NotLeader,
        "only the holder of every group named switches it"
    );
    assert!(b.pointer().await.unwrap().is_none());
    let Stamped::Done(seq) = a
        .stamp("a", &of_a, &first, 0, StampKind::SwitchGeneration)
        .await
        .unwrap()
    else {
        panic!("the holder switches");
    };
    let pointer = b
        .pointer()
        .await
        .unwrap()
        .expect("every instance sees the pointer");
    assert_eq!(pointer.active(of_a[0]), Some(Active { seq, ..first.clone() }));
    assert_eq!(pointer.active(of_b[0]), None, "b's groups are not published yet");
    let other = Active {
        generation: first.generation + 1,
        ..first.clone()
    };
    assert_eq!(
        a.stamp("a", &of_a, &other, 0, StampKind::NewerDataInCurrent)
            .await
            .unwrap(),
        Stamped::Lost,
        "not the current generation"
    );
    assert_eq!(
        b.stamp("b", &of_b, &first, 0, StampKind::NewerDataInCurrent)
            .await
            .unwrap(),
        Stamped::Lost,
        "a group never switched has no data to be newer than"
    );
    assert!(matches!(
        a.stamp("a", &of_a, &first, 0, StampKind::NewerDataInCurrent).await.unwrap(),
        Stamped::Done(n) if n > seq
    ));
    let request = b.request_rebuild().await.unwrap();
    assert!(
        a.pointer()
            .await
            .unwrap()
            .unwrap()
            .active(of_a[0])
            .unwrap()
            .rebuild_requested,
        "any instance may ask"
    );
    a.stamp("a", &of_a, &first, 0, StampKind::NewerDataInCurrent)
        .await
        .unwrap();
    assert!(
        a.pointer()
            .await
            .unwrap()
            .unwrap()
            .active(of_a[0])
            .unwrap()
            .rebuild_requested,
        "newer data is not a rebuild"
    );
    a.stamp("a", &of_a, &first, request, StampKind::SwitchGeneration)
        .await
        .unwrap();
    assert!(
        !a.pointer()
            .await
            .unwrap()
            .unwrap()
            .active(of_a[0])
            .unwrap()
            .rebuild_requested,
        "a switch answers the request"
    );

    // `a` leaves: `b` takes every group at its next call; a third joins and gets a share.
    a.leave_groups("a").await.unwrap();
    assert_eq!(
        b.hold_groups("b", 60_000).await.unwrap(),
        every,
        "a left group is taken over"
    );
    assert_eq!(
        a.stamp("a", &of_a, &first, 0, StampKind::NewerDataInCurrent)
            .await
            .unwrap(),
        Stamped::NotLeader,
        "a publisher that left cannot stamp"
    );
    c.hold_groups("c", 60_000).await.unwrap();
    b.hold_groups("b", 60_000).await.unwrap();
    assert_eq!(c.hold_groups("c", 60_000).await.unwrap().len(), SPAN_GROUPS / 2);

    // A publisher that stops renewing: its groups are taken over once its lease runs out.
    let of_c = c.hold_groups("c", 300).await.unwrap();
    assert!(!of_c.is_empty());
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(
        b.hold_groups("b", 60_000).await.unwrap(),
        every,
        "a dead publisher's groups are taken over within its lease time"
    );
}

/// Span groups: `all`'s nine hot spans each in a group of their own, a category's spread, and the same
/// group whatever the date.
#[test]
fn span_groups_spread_all_and_stay_put_as_periods_turn() {
    let zone = Zone::utc();
    let now = Hour::from_millis(BASE);
    let spans = rankgate_store::ranking::redis_serving::hot_spans(now, &zone);
    let mut of_all: Vec<usize> = spans
        .iter()
        .map(|span| span_group(&CategoryOrAll::All, span))
        .collect();
    of_all.sort_unstable();
    assert_eq!(of_all, (0..9).collect::<Vec<_>>());
    let later = rankgate_store::ranking::redis_serving::hot_spans(now.plus(24 * 40), &zone);
    for category in categories() {
        for (span, later) in spans.iter().zip(&later) {
            assert_eq!(
                span_group(&category, span),
                span_group(&category, later),
                "{category} {span:?}"
            );
            assert!(span_group(&category, span) < SPAN_GROUPS);
        }
    }
    let toys = CategoryOrAll::Category(rankgate_core::ids::Category::parse("toys").unwrap());
    let mut of_toys: Vec<usize> = spans.iter().map(|span| span_group(&toys, span)).collect();
    of_toys.sort_unstable();
    of_toys.dedup();
    assert!(
        of_toys.len() >= 5,
        "a category's spans spread over groups: {of_toys:?}"
    );
    assert!(of_toys.iter().all(|group| *group >= 9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_pointer_is_fenced_by_the_lease() {
    the_pointer_is_fenced_by_the_lease(vec![standalone_url()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_pointer_is_fenced_by_the_lease() {
    the_pointer_is_fenced_by_the_lease(cluster().urls.clone()).await;
}

/// The deal weighs span groups by their measured cost (`P{rk}:group-cost`): once the costs settle, and
/// again each time they double, a new deal is made and kept when it lightens the heaviest publisher by a
/// tenth, so a group found heavy late does not leave one publisher with most of the work for the ten
/// minutes until the periodic deal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deal_follows_the_measured_costs_as_they_grow() {
    let (prefix, _cleanup, mut connection) = standalone_with_prefix().await;
    let urls = vec![standalone_url()];
    let costs = format!("{prefix}{{rk}}:group-cost");
    let mut add_cost = async |groups: std::ops::Range<usize>, cost: u64| {
        let mut pipeline = redis::pipe();
        for group in groups {
            pipeline
                .cmd("HINCRBY")
                .arg(&costs)
                .arg(format!("g{group}"))
                .arg(cost)
                .ignore();
        }
        let () = pipeline.query_async(&mut connection).await.unwrap();
    };
    let a = connect(&urls, &prefix).await;
    let b = connect(&urls, &prefix).await;
    // Two calls each: a group moved by a new deal is taken once its former holder let it go.
    let settle = async || {
        let mut held = (Vec::new(), Vec::new());
        for _ in 0..2 {
            held = (
                a.hold_groups("a", 60_000).await.unwrap(),
                b.hold_groups("b", 60_000).await.unwrap(),
            );
        }
        assert_eq!(
            held.0.len() + held.1.len(),
            SPAN_GROUPS,
            "every group held: {held:?}"
        );
        held
    };
    let (of_a, of_b) = settle().await;
    assert_eq!((of_a.len(), of_b.len()), (18, 18), "no costs yet: half each");

    // Even costs past the settling threshold: a deal by cost, still half each.
    add_cost(0..SPAN_GROUPS, 5_000).await;
    let (of_a, of_b) = settle().await;
    assert_eq!((of_a.len(), of_b.len()), (18, 18), "even costs: half each");

    // A little more is no reason to move anything.
    add_cost(5..6, 1_000).await;
    assert_eq!(
        settle().await,
        (of_a.clone(), of_b.clone()),
        "costs grew by far less than double"
    );

    // Group 0 turns out to weigh more than all the others together: the costs more than doubled,
    // and a deal that gives it a publisher of its own lightens the heaviest by more than a tenth.
    add_cost(0..1, 400_000).await;
    let (of_a, of_b) = settle().await;
    let (alone, others) = if of_a.contains(&0) {
        (of_a, of_b)
    } else {
        (of_b, of_a)
    };
    assert_eq!(alone, vec![0], "the heavy group's publisher holds it alone");
    assert_eq!(others.len(), SPAN_GROUPS - 1);
}

/// A group's measured cost grows by what each of its spans' publications cost the publisher: the engine's
/// time on it plus a microsecond per member write, for spans published before only (a first, whole
/// publication is a one-off the deal should not balance).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_costs_add_the_engine_time_and_writes_of_spans_published_before() {
    let (prefix, _cleanup, mut connection) = standalone_with_prefix().await;
    let store = connect(&[standalone_url()], &prefix).await;
    let zone = Zone::utc();
    let span = spans(&zone)[0];
    let publication = |existing: bool, build_micros: u64, products: &[&str]| SpanPublication {
        category: CategoryOrAll::All,
        span,
        replace: !existing,
        existing,
        rankings: [
            products
                .iter()
                .map(|p| (ProductId::parse(p).unwrap(), Some(1.0)))
                .collect(),
            Vec::new(),
            Vec::new(),
        ],
        totals: [products.len(); 3],
        details: Vec::new(),
        build_micros,
    };
    let steady = publication(true, 700, &["p1", "p2"]);
    assert_eq!(steady.publisher_cost(), 702);
    store
        .add_group_costs(&[steady, publication(false, 50_000, &["p3"])])
        .await
        .unwrap();
    let cost: Option<u64> = redis::cmd("HGET")
        .arg(format!("{prefix}{{rk}}:group-cost"))
        .arg(format!("g{}", span_group(&CategoryOrAll::All, &span)))
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(cost, Some(702), "only the span published before counts");
}

/// Publication by demand (issue 27): the demand set keeps what was read since a time and drops the rest;
/// an unpublished span is declined by reads while the others stay served; once the engine forgot it, its
/// next publication goes out whole and serves the engine's ranking again.
async fn spans_leave_and_rejoin_by_demand(urls: Vec<String>) {
    let prefix = unique_prefix();
    let _cleanup = KeyCleanup {
        nodes: urls.clone(),
        prefix: prefix.clone(),
    };
    let store = connect(&urls, &prefix).await;
    let zone = Zone::utc();

    let day = Span::Period(PeriodKey::containing(
        PeriodKind::Daily,
        Hour::from_millis(BASE),
        &zone,
    ));
    let week = Span::Window {
        len: WindowLen::D7,
        end: Hour::from_millis(BASE),
    };
    let all_day = demand_member(&CategoryOrAll::All, &day);
    let all_week = demand_member(&CategoryOrAll::All, &week);
    assert_ne!(all_day, all_week);
    store
        .note_demand(&[all_day.clone(), all_week.clone()], 1_000, 60_000)
        .await
        .unwrap();
    store
        .note_demand(std::slice::from_ref(&all_week), 2_000, 60_000)
        .await
        .unwrap();
    let since = |set: std::collections::HashSet<String>| {
        let mut members: Vec<String> = set.into_iter().collect();
        members.sort();
        members
    };
    assert_eq!(
        since(store.demand_since(1_500).await.unwrap()),
        std::slice::from_ref(&all_week)
    );
    assert_eq!(
        since(store.demand_since(0).await.unwrap()),
        std::slice::from_ref(&all_week),
        "entries read before the idle time were dropped"
    );

    let dir = tempfile::tempdir().unwrap();
    let (mut ingestor, engine) = sqlite_ingestor(dir.path());
    let raw: Vec<RawEvent> = (0..200)
        .map(|i| RawEvent {
            id: i,
            kind: (i % 5) as u8,
            hour_offset: (i as i64 * 13) % 48,
            minute: (i % 60) as i64,
            product: (i * 5 % 12) as u8,
            categories: vec![(i % 4) as u8],
            quantity: 1 + i % 3,
            price: 100 + (i as u64 * 37) % 900,
        })
        .collect();
    let events: Vec<Event> = raw.iter().map(to_event).collect();
    ingestor.ingest(&events[..100], BASE).unwrap();
    let generation = store.new_generation().await.unwrap();
    publish(&store, &engine, generation, None, true).await;

    let category = categories().into_iter().nth(1).expect("a category");
    let gone = (category.clone(), spans(&zone)[1]);
    store
        .unpublish(generation, std::slice::from_ref(&gone))
        .await
        .unwrap();
    engine.write().forget_span(&gone.0, gone.1);
    for ranker in PUBLISHED_RANKERS {
        let page = store
            .top(generation, ranker, &gone.0, &gone.1, 0, 10)
            .await
            .unwrap();
        assert!(page.is_none(), "{ranker}: an unpublished span is declined");
    }
    assert!(
        !store
            .totals(&gone.0, generation)
            .await
            .unwrap()
            .contains_key(&rankgate_store::ranking::redis_serving::span_field(&gone.1)),
        "its totals field is gone"
    );
    // The others are still served, and follow the engine; the unpublished one rejoins whole.
    ingestor.ingest(&events[100..], BASE).unwrap();
    let publications = take_publication(
        &mut engine.write(),
        &requests(&zone),
        None,
        PublicationScope::Changes,
    );
    let rejoined = publications
        .iter()
        .find(|p| p.category == gone.0 && p.span == gone.1)
        .expect("the forgotten span is published again");
    assert!(rejoined.replace && !rejoined.existing, "whole, as a new span");
    let published = store
        .publish(generation, &publications, &zone, BASE)
        .await
        .unwrap();
    assert!(matches!(published, Published::Applied { .. }), "{published:?}");
    check_served(&store, generation, None, &mut from_engine(&engine))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_spans_leave_and_rejoin_by_demand() {
    spans_leave_and_rejoin_by_demand(vec![standalone_url()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_spans_leave_and_rejoin_by_demand() {
    spans_leave_and_rejoin_by_demand(cluster().urls.clone()).await;
}

// ---------------------------------------------------------------------------------------------------
// Incremental equals recompute with PostgreSQL as the source of truth and Redis serving: random
// workloads (duplicates, out-of-order and late events, refunds, unlikes) in random micro-batches, each
// followed by a publication of the coalesced changes; what Redis serves must equal the batch recompute.

proptest! {
    #![proptest_config(ProptestConfig { cases: 5, .. ProptestConfig::default() })]

    #[test]
    fn incremental_equals_recompute_on_postgres_and_redis(
        raw in proptest::collection::vec(raw_event(), 1..250),
        batch_sizes in proptest::collection::vec(1usize..60, 1..12),
        carry_top_n in 1u32..6,
        depth in prop_oneof![Just(None), (1usize..6).prop_map(Some)],
    ) {
        let weights = PopularWeights { carry_top_n, ..PopularWeights::default() };
        let lateness = 72 * HOUR;
        let schema = SchemaGuard::unique("rgrecompute");
        let prefix = unique_prefix();
        let _cleanup = KeyCleanup { nodes: vec![standalone_url()], prefix: prefix.clone() };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let store = runtime.block_on(connect(&[standalone_url()], &prefix));
        // The PostgreSQL client is blocking: it runs outside the runtime, only Redis calls inside it.
        let source = rankgate_store::ranking::postgres::PostgresSource::connect(&postgres_url(), &schema.0)
            .unwrap_or_else(|e| panic!("PostgreSQL at {} must be reachable: {e}", postgres_url()));
        let (mut ingestor, engine) = ingestor_over(Box::new(source), weights, lateness);
        let events: Vec<Event> = raw.iter().map(to_event).collect();
        let generation = runtime.block_on(store.new_generation()).unwrap();
        let mut rest = &events[..];
        let mut sizes = batch_sizes.iter().cycle();
        let mut first = true;
        while !rest.is_empty() {
            let size = (*sizes.next().unwrap()).min(rest.len());
            let (batch, tail) = rest.split_at(size);
            ingestor.ingest(batch, BASE).unwrap();
            rest = tail;
            let published = runtime.block_on(publish(&store, &engine, generation, depth, first));
            prop_assert!(matches!(published, Published::Applied { .. }), "{:?}", published);
            first = false;
        }
        let (model, _) = BatchModel::from_stream(events.clone(), lateness, Zone::utc(), weights);
        runtime.block_on(check_served(&store, generation, depth, &mut |query| {
            model.ranking(query.ranker, &query.category, &query.span)
        }))?;
    }
}

/// The last call of a span built over several calls moves the staging keys over the served span only
/// when they hold what the earlier calls wrote: if Redis lost them in between (restart, flush,
/// eviction), the call answers LOST and leaves the served span and its totals alone, so the rebuild's
/// totals check cannot pass on a half-built span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_span_build_that_lost_its_staged_part_is_lost_and_leaves_the_served_span() {
    let (prefix, _cleanup, mut connection) = standalone_with_prefix().await;
    let base = format!("{prefix}{{rk:all}}");
    let totals = format!("{base}:totals:v1");
    let live: Vec<String> = ["popular", "units", "revenue", "detail"]
        .iter()
        .map(|name| format!("{base}:{name}:1h:9:v1"))
        .collect();
    let staging: Vec<String> = live.iter().map(|key| format!("{key}:build")).collect();
    let () = redis::pipe()
        .cmd("HSET")
        .arg(&totals)
        .arg("1h:9")
        .arg("1 0 0")
        .ignore()
        .cmd("ZADD")
        .arg(&live[0])
        .arg(-1)
        .arg("old")
        .ignore()
        .query_async(&mut connection)
        .await
        .unwrap();
    // The last piece of a replace (mode 1, stage l) whose earlier pieces staged 5 popular entries, which
    // are gone: one entry of its own.
    let script = redis::Script::new(include_str!("../src/ranking/lua/serving_publish.lua"));
    let mut call = script.prepare_invoke();
    call.key(&totals);
    for key in live.iter().chain(&staging) {
        call.key(key);
    }
    call.arg(1)
        .arg("1h:9")
        .arg("1")
        .arg(60_000)
        .arg(6)
        .arg(0)
        .arg(0)
        .arg(1)
        .arg(0)
        .arg(0)
        .arg(0)
        .arg("l")
        .arg(5)
        .arg(0)
        .arg(0)
        .arg(0)
        .arg("new")
        .arg("-2");
    let reply: String = call.invoke_async(&mut connection).await.unwrap();
    assert_eq!(reply, "LOST");
    let served: Vec<String> = redis::cmd("ZRANGE")
        .arg(&live[0])
        .arg(0)
        .arg(-1)
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(served, vec!["old".to_string()], "the served span is untouched");
    let stored: String = redis::cmd("HGET")
        .arg(&totals)
        .arg("1h:9")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(stored, "1 0 0", "the totals still describe the served span");
}
