//! The [`ServingStore`] conformance suite (`support/serving_conformance.rs`) on every store that answers
//! ranking reads: the in-process engine, Redis standalone (127.0.0.1:6379, a key prefix per test, deleted
//! by a guard even after a panic) and a 3-node Redis Cluster this binary starts itself, in full and
//! Top-N-only serving. Redis is filled the way the server's publisher fills it: the engine computes
//! (`publication::take_publication`), [`RedisServing::publish`] writes a fresh generation, the lease holder moves
//! the pointer, and reads go through the pointer read back from Redis. A second batch then travels as
//! coalesced changes, and the suite runs again; so do a delisting of the leader and of another product
//! (SPEC 1.5), and the leader's relisting.

#[path = "support/serving_conformance.rs"]
mod serving_conformance;
#[path = "support/workload.rs"]
mod workload;

use rankgate_core::period::Zone;
use rankgate_store::ranking::publication::{take_publication, PublicationScope};
use rankgate_store::ranking::redis_serving::{
    Active, Published, RedisServing, ServingOptions, StampKind, Stamped, SPAN_GROUPS,
};
use rankgate_store::ranking::serving_store::{EngineServing, ServingStore};
use rankgate_testkit::redis_servers::{cluster, standalone_url, unique_prefix, KeyCleanup};
use serving_conformance::{check_store, requests, ServingFixture};
use workload::BASE;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_answers_what_the_recompute_ranks() {
    let mut fixture = ServingFixture::new();
    let store = EngineServing::new(fixture.engine.clone());
    assert_eq!(store.depth(), None);
    // Cold spans first (built on the blocking pool), then the same reads warm (answered inline).
    // The engine serves every ranker, `trending` included.
    assert_eq!(check_store(&store, &fixture).await, vec![]);
    check_store(&store, &fixture).await;
    fixture.ingest_batch(1);
    assert_eq!(check_store(&store, &fixture).await, vec![]);
    let leader = fixture.leader();
    fixture.set_listed(leader, false);
    fixture.set_listed(7, false);
    assert_eq!(check_store(&store, &fixture).await, vec![]);
    fixture.set_listed(leader, true);
    assert_eq!(check_store(&store, &fixture).await, vec![]);
}

/// Publishes everything or what changed (`scope`) since the last publication of `fixture`'s engine
/// into `generation`, and stamps the pointer as the lease holder `owner` does; returns the pointer as
/// Redis now holds it.
async fn publish_and_point(
    store: &RedisServing,
    fixture: &ServingFixture,
    owner: &str,
    generation: u64,
    depth: Option<usize>,
    scope: PublicationScope,
) -> Active {
    // A round of everything goes into a fresh generation, which the pointer then switches to; a round of
    // changes updates the generation already pointed at.
    let stamp_kind = match scope {
        PublicationScope::Everything => StampKind::SwitchGeneration,
        PublicationScope::Changes => StampKind::NewerDataInCurrent,
    };
    let zone = Zone::utc();
    let (publications, as_of, popular_version) = {
        let mut engine = fixture.engine.write();
        let publications = take_publication(&mut engine, &requests(&zone), depth, scope);
        (publications, engine.as_of_millis(), engine.policy().version)
    };
    let published = store
        .publish(generation, &publications, &zone, BASE)
        .await
        .expect("redis answers");
    assert!(matches!(published, Published::Applied { .. }), "{published:?}");
    // Alone, `owner` holds every span group; one stamp points them all at `generation`.
    let groups = store.hold_groups(owner, 60_000).await.expect("redis answers");
    assert_eq!(groups.len(), SPAN_GROUPS);
    let active = Active {
        generation,
        seq: 0,
        as_of_millis: as_of,
        popular_version,
        depth,
        rebuild_requested: false,
    };
    let stamped = store
        .stamp(owner, &groups, &active, 0, stamp_kind)
        .await
        .expect("redis answers");
    assert!(matches!(stamped, Stamped::Done(_)), "{stamped:?}");
    let pointer = store
        .pointer()
        .await
        .expect("redis answers")
        .expect("the pointer was just stamped");
    let active = pointer.active(0).expect("group 0 was stamped");
    assert!(
        groups
            .iter()
            .all(|group| pointer.active(*group).as_ref() == Some(&active)),
        "every group points at the same generation"
    );
    active
}

async fn redis_answers_what_the_recompute_ranks(urls: Vec<String>, depth: Option<usize>) {
    let prefix = unique_prefix();
    let _cleanup = KeyCleanup {
        nodes: urls.clone(),
        prefix: prefix.clone(),
    };
    let store = RedisServing::connect(
        &urls,
        ServingOptions {
            prefix: prefix.clone(),
            ..ServingOptions::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("connecting to redis at {urls:?}: {e}"));
    assert_eq!(store.is_cluster(), urls.len() > 1, "the intended topology");
    let mut fixture = ServingFixture::new();
    let generation = store.new_generation().await.expect("redis answers");
    let active = publish_and_point(
        &store,
        &fixture,
        "suite",
        generation,
        depth,
        PublicationScope::Everything,
    )
    .await;
    assert_eq!(active.depth, depth);
    // Redis declines `trending` (not published: each engine answers it), and serves the rest.
    let trending = vec![rankgate_core::ranker::RankerName::Trending];
    assert_eq!(check_store(&store.at(&active), &fixture).await, trending);
    fixture.ingest_batch(1);
    let active = publish_and_point(
        &store,
        &fixture,
        "suite",
        generation,
        depth,
        PublicationScope::Changes,
    )
    .await;
    assert_eq!(check_store(&store.at(&active), &fixture).await, trending);
    // A delisting travels as changes too: removed members, forgotten details, the next product moved
    // into a Top-N cut.
    let leader = fixture.leader();
    fixture.set_listed(leader, false);
    fixture.set_listed(7, false);
    let active = publish_and_point(
        &store,
        &fixture,
        "suite",
        generation,
        depth,
        PublicationScope::Changes,
    )
    .await;
    assert_eq!(check_store(&store.at(&active), &fixture).await, trending);
    fixture.set_listed(leader, true);
    let active = publish_and_point(
        &store,
        &fixture,
        "suite",
        generation,
        depth,
        PublicationScope::Changes,
    )
    .await;
    assert_eq!(check_store(&store.at(&active), &fixture).await, trending);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_redis_answers_what_the_recompute_ranks() {
    redis_answers_what_the_recompute_ranks(vec![standalone_url()], None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_redis_top_n_only_answers_the_top_k_with_full_totals() {
    redis_answers_what_the_recompute_ranks(vec![standalone_url()], Some(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_master_answers_what_the_recompute_ranks() {
    let url = rankgate_testkit::redis_servers::sentinel().url();
    redis_answers_what_the_recompute_ranks(vec![url], None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_answers_what_the_recompute_ranks() {
    redis_answers_what_the_recompute_ranks(cluster().urls.clone(), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_top_n_only_answers_the_top_k_with_full_totals() {
    redis_answers_what_the_recompute_ranks(cluster().urls.clone(), Some(3)).await;
}

/// A generation that serves nothing (never published into) declines every read rather than answering
/// an empty ranking, so the reader can send the read to the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_declines_rankings_it_does_not_serve() {
    let prefix = unique_prefix();
    let _cleanup = KeyCleanup {
        nodes: vec![standalone_url()],
        prefix: prefix.clone(),
    };
    let store = RedisServing::connect(
        &[standalone_url()],
        ServingOptions {
            prefix,
            ..ServingOptions::default()
        },
    )
    .await
    .expect("the shared Redis");
    let active = Active {
        generation: 7,
        seq: 0,
        as_of_millis: Some(BASE),
        popular_version: 2,
        depth: None,
        rebuild_requested: false,
    };
    let (category, span) = requests(&Zone::utc()).remove(0);
    let query = rankgate_store::ranking::engine::RankingQuery {
        ranker: rankgate_core::ranker::RankerName::Popular,
        category,
        span,
    };
    let served = store.at(&active);
    assert_eq!(served.top_page(&query, 0, 10).await.expect("redis answers"), None);
    let product = rankgate_core::ids::ProductId::parse("p1").unwrap();
    assert_eq!(
        served.rank_of(&query, &product).await.expect("redis answers"),
        None
    );
    assert_eq!(
        served
            .sort_products(&query, &[product])
            .await
            .expect("redis answers"),
        None
    );
}
