//! Queue benchmarks on Redis (issue 4 targets), against the Redis at `RANKGATE_BENCH_REDIS` (default
//! `redis://127.0.0.1:6379`): one admission tick with 1,000,000 waiting (one script: pop 50 + issue 50
//! token hashes), position lookup at 10k / 100k / 1M waiting, and Redis's bytes per waiting member
//! (`MEMORY USAGE` of the waiting set) beside the embedded figure from the `queue` bench.
//!
//! Setup enters members through the store itself (the same `enter` script as production, pipelined over one
//! multiplexed connection). Time is an injected manual clock so each tick has a fresh budget. Keys live
//! under a per-run prefix that is deleted at the end.
#![allow(missing_docs)] // criterion_group! generates an undocumented public function.

#[path = "support/fill.rs"]
mod fill;

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use rankgate_core::ids::MemberId;
use rankgate_core::queue::QueueName;
use rankgate_store::clock::ManualClock;
use rankgate_store::queue::redis::{RedisOptions, RedisStore, RedisTime};
use rankgate_store::queue::token::TokenSecret;
use rankgate_store::queue::QueueStore;

use fill::fill_queue;

struct Filled {
    store: Arc<RedisStore>,
    clock: ManualClock,
    queue: QueueName,
}

fn url() -> String {
    std::env::var("RANKGATE_BENCH_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

fn fill(runtime: &tokio::runtime::Runtime, waiting: usize) -> Filled {
    let clock = ManualClock::new(1_780_000_000_000);
    let options = RedisOptions {
        prefix: format!("rgbench:{}:{waiting}:", std::process::id()),
        time: RedisTime::Injected(Arc::new(clock.clone())),
        ..RedisOptions::default()
    };
    let queue = QueueName::parse("bench").expect("queue");
    let store = runtime
        .block_on(RedisStore::connect(&[url()], options))
        .expect("redis for the bench");
    runtime.block_on(fill_queue(&store, &queue, waiting, 20_000));
    Filled { store, clock, queue }
}

fn redis_queue(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let million = fill(&runtime, 1_000_000);
    let bytes = runtime
        .block_on(million.store.waiting_memory_bytes(&million.queue))
        .expect("memory usage");
    println!(
        "bytes per waiting member (redis waiting zset, MEMORY USAGE): {:.1}",
        bytes as f64 / 1_000_000.0
    );

    let mut position = c.benchmark_group("redis_position");
    let smaller: Vec<Filled> = [10_000usize, 100_000]
        .iter()
        .map(|n| fill(&runtime, *n))
        .collect();
    for (waiting, filled) in [
        (10_000usize, &smaller[0]),
        (100_000, &smaller[1]),
        (1_000_000, &million),
    ] {
        let probe = MemberId::parse(&format!("member-{:08}", waiting / 2)).expect("member");
        position.bench_function(format!("rank_at_{waiting}_waiting"), |b| {
            b.iter(|| {
                let view = runtime
                    .block_on(filled.store.position(&filled.queue, &probe))
                    .expect("position");
                assert!(view.rank.is_some());
            })
        });
    }
    position.finish();

    let secret = TokenSecret::generate().expect("secret");
    let mut admission = c.benchmark_group("redis_admission");
    admission.sample_size(30);
    admission.bench_function("tick_pop_50_issue_50_at_1m_waiting", |b| {
        b.iter_batched(
            || {
                million.clock.advance(1_000);
                (0..50)
                    .map(|_| secret.prepare().expect("token"))
                    .collect::<Vec<_>>()
            },
            |tokens| {
                let outcome = runtime
                    .block_on(million.store.admit(&million.queue, tokens))
                    .expect("admit");
                assert_eq!(outcome.admitted.len(), 50);
            },
            BatchSize::SmallInput,
        )
    });
    admission.finish();

    for filled in smaller.iter().chain([&million]) {
        runtime.block_on(filled.store.purge_prefix()).expect("cleanup");
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default();
    targets = redis_queue
}
criterion_main!(benches);
