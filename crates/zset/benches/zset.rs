//! Hot paths of the sorted set at production sizes.
//!
//! ```text
//! cargo bench -p rankgate-zset --bench zset
//! ```
//!
//! The 1M-member set is built once; each benchmark mutates it in a way that keeps its size (score changes,
//! pop and re-add), so iterations measure a steady state. For reference, Redis 7 on this kind of machine
//! serves ~65k ZREVRANK/s and ~42k `ZREVRANGE 0 49`/s over the network
//! (bench/results/2026-11-30-issues2-3-4.md, section 3).

#![allow(missing_docs, reason = "criterion_group! generates an undocumented pub fn")]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rankgate_zset::{AddOptions, SortedSet};

const MILLION: u64 = 1_000_000;

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    fn score(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 1e6
    }
}

fn sku(number: u64) -> Vec<u8> {
    format!("sku-{number:07}").into_bytes()
}

fn build(members: u64, random: &mut XorShift) -> (SortedSet, Vec<Vec<u8>>) {
    let names: Vec<Vec<u8>> = (0..members).map(sku).collect();
    let mut set = SortedSet::new();
    for name in &names {
        set.insert(name, random.score()).unwrap();
    }
    (set, names)
}

fn million_member_commands(c: &mut Criterion) {
    let mut random = XorShift(0x2545_F491_4F6C_DD1D);
    let (mut set, names) = build(MILLION, &mut random);
    let mut group = c.benchmark_group("1M members");

    group.bench_function("zadd existing (score change)", |b| {
        b.iter(|| {
            let name = &names[random.below(MILLION) as usize];
            black_box(set.zadd(name, random.score(), AddOptions::default()).unwrap())
        })
    });
    group.bench_function("zincrby", |b| {
        b.iter(|| {
            let name = &names[random.below(MILLION) as usize];
            black_box(set.zincrby(name, 1.0).unwrap())
        })
    });
    group.bench_function("zrevrank", |b| {
        b.iter(|| {
            let name = &names[random.below(MILLION) as usize];
            black_box(set.zrevrank(name))
        })
    });
    group.bench_function("range_by_rank rev top 50", |b| {
        b.iter(|| black_box(set.range_by_rank(0, 49, true).len()))
    });
    group.bench_function("pop_min 50 + re-add", |b| {
        b.iter(|| {
            let popped = set.pop_min(50);
            for (member, _) in &popped {
                set.insert(member, random.score()).unwrap();
            }
            black_box(popped.len())
        })
    });
    group.finish();
}

fn zrank_by_size(c: &mut Criterion) {
    let mut group = c.benchmark_group("zrank");
    for members in [10_000, 100_000, MILLION] {
        let mut random = XorShift(0x9E37_79B9_7F4A_7C15);
        let (set, names) = build(members, &mut random);
        group.bench_with_input(BenchmarkId::from_parameter(members), &members, |b, &members| {
            b.iter(|| {
                let name = &names[random.below(members) as usize];
                black_box(set.zrank(name))
            })
        });
    }
    group.finish();
}

fn config() -> Criterion {
    // The machine is shared: shorter runs, still enough samples for stable medians of sub-µs operations.
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = million_member_commands, zrank_by_size
}
criterion_main!(benches);
