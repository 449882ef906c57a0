//! What an entry challenge costs the server (issue 28, SPEC 2.2 "Entry challenges"): issuing one (16
//! random bytes, an HMAC-SHA-256) and checking a solution (parsing, the HMAC, the expiry and one
//! SHA-256). Spending it once is a limiter call on the store and is measured with the store's benches.
//!
//! `cargo bench -p rankgate --bench entry_challenge`; figures in BENCHMARKS.md, "Entry challenges".

#![allow(missing_docs)] // criterion_group! makes an undocumented function

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rankgate::waiting_room::entry_guard::ChallengeKey;
use rankgate_core::queue::challenge::solve;
use rankgate_core::queue::QueueName;
use rankgate_store::queue::token::TokenSecret;

fn challenges(c: &mut Criterion) {
    let key = ChallengeKey::derived_from(&TokenSecret::from_bytes([7; 32]));
    let queue = QueueName::parse("summer-sale").unwrap();
    let now_ms = 1_800_000_000_000;
    c.bench_function("issue", |b| {
        b.iter(|| key.issue(black_box(&queue), black_box("203.0.113.9"), 18, now_ms))
    });
    let issued = key.issue(&queue, "203.0.113.9", 18, now_ms);
    let nonce = solve(&issued.challenge, 18).to_string();
    c.bench_function("check a solution (difficulty 18)", |b| {
        b.iter(|| {
            key.check(
                black_box(&issued.challenge),
                black_box(&nonce),
                &queue,
                "203.0.113.9",
                18,
                now_ms + 1000,
            )
            .unwrap()
        })
    });
    c.bench_function("refuse a foreign solution", |b| {
        b.iter(|| {
            key.check(
                black_box(&issued.challenge),
                black_box(&nonce),
                &queue,
                "203.0.113.10",
                18,
                now_ms + 1000,
            )
            .unwrap_err()
        })
    });
}

criterion_group!(benches, challenges);
criterion_main!(benches);
