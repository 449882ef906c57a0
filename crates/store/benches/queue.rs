//! Queue benchmarks (issue 4 targets): one admission tick at 1,000,000 waiting (pop 50 + issue 50 tokens,
//! including its group commit), position lookup at 10k / 100k / 1M waiting, and bytes per waiting member.
//!
//! Setup fills the embedded store directly (not over HTTP) so the numbers isolate the store. The memory
//! figure is printed once: the waiting set's heap bytes divided by the members waiting.
#![allow(missing_docs)] // criterion_group! generates an undocumented public function.

#[path = "support/fill.rs"]
mod fill;

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use rankgate_core::ids::MemberId;
use rankgate_core::queue::QueueName;
use rankgate_store::clock::ManualClock;
use rankgate_store::queue::embedded::{EmbeddedOptions, EmbeddedStore};
use rankgate_store::queue::token::TokenSecret;
use rankgate_store::queue::QueueStore;

use fill::fill_queue;

struct Filled {
    store: Arc<EmbeddedStore>,
    clock: ManualClock,
    queue: QueueName,
    _dir: tempfile::TempDir,
}

fn fill(runtime: &tokio::runtime::Runtime, waiting: usize) -> Filled {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = ManualClock::new(1_780_000_000_000);
    let store =
        EmbeddedStore::open(dir.path(), Arc::new(clock.clone()), EmbeddedOptions::default()).expect("open");
    let queue = QueueName::parse("bench").expect("queue");
    runtime.block_on(fill_queue(&store, &queue, waiting, 10_000));
    Filled {
        store,
        clock,
        queue,
        _dir: dir,
    }
}

fn admission_tick(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let filled = fill(&runtime, 1_000_000);
    let secret = TokenSecret::generate().expect("secret");
    println!(
        "bytes per waiting member (embedded waiting set): {:.1}",
        filled.store.waiting_heap_bytes(&filled.queue) as f64 / 1_000_000.0
    );
    let mut group = c.benchmark_group("admission");
    group.sample_size(30);
    group.bench_function("tick_pop_50_issue_50_at_1m_waiting", |b| {
        b.iter_batched(
            || {
                filled.clock.advance(1_000);
                (0..50)
                    .map(|_| secret.prepare().expect("token"))
                    .collect::<Vec<_>>()
            },
            |tokens| {
                let outcome = runtime
                    .block_on(filled.store.admit(&filled.queue, tokens))
                    .expect("admit");
                assert_eq!(outcome.admitted.len(), 50);
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn position_lookup(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("position");
    for waiting in [10_000usize, 100_000, 1_000_000] {
        let filled = fill(&runtime, waiting);
        let probe = MemberId::parse(&format!("member-{:08}", waiting / 2)).expect("member");
        group.bench_function(format!("rank_at_{waiting}_waiting"), |b| {
            b.iter(|| {
                let view = runtime
                    .block_on(filled.store.position(&filled.queue, &probe))
                    .expect("position");
                assert!(view.rank.is_some());
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default();
    targets = admission_tick, position_lookup
}
criterion_main!(benches);
