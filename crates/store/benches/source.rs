//! Source-of-truth commit throughput (issue 3): 2,000-event micro-batches, as the ingest writer commits
//! them, into SQLite and into PostgreSQL (the machine's server, `RANKGATE_BENCH_POSTGRES` or
//! `postgres://postgres@127.0.0.1:5432/test`, in a throwaway schema). Criterion reports events/s.
//!
//! The workload is seed-lesson-like: events spread over 10,000 products, ids clustered by hour (each
//! batch is one hour's slice), one raw body of a realistic size per event. Batches are built outside the
//! timed section; every iteration commits fresh ids, so nothing is skipped as a duplicate.
//!
//! PostgreSQL runs twice: into an empty schema (`postgres_2000_events`), and into one pre-filled with 30
//! days of history (`postgres_2000_events_prefilled`: 1,000,000 processed ids with random-looking
//! values over 30 day partitions, and 720,000 hourly metric rows), because what a commit reads (the commit
//! feed, one probe per retained partition) and updates can grow with what is stored. The pre-filled ids
//! are written after the source connected, as another writer's would be: its first commit (in criterion's
//! warm-up) reads them all into its dedupe set.
#![allow(missing_docs)] // criterion_group! generates an undocumented public function.

use std::cell::Cell;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use rankgate_core::metrics::Metrics;
use rankgate_store::ranking::conformance::{batch_of, DAY0};
use rankgate_store::ranking::postgres::PostgresSource;
use rankgate_store::ranking::source::{CommitBatch, SourceOfTruth};
use rankgate_store::ranking::sqlite::SqliteSource;

const BATCH: usize = 2_000;
const PRODUCTS: u64 = 10_000;

fn make_batch(number: u64) -> CommitBatch {
    let hour = DAY0 + (number / 20) as i64; // ~20 batches per hour: ids cluster by hour
    let events: Vec<(i64, String, String, Metrics)> = (0..BATCH as u64)
        .map(|i| {
            let n = number * BATCH as u64 + i;
            let product = n.wrapping_mul(2_654_435_761) % PRODUCTS;
            let delta = if n.is_multiple_of(10) {
                Metrics {
                    units: 1,
                    sales: 1_999,
                    ..Metrics::default()
                }
            } else {
                Metrics {
                    views: 1,
                    ..Metrics::default()
                }
            };
            (
                hour,
                format!("ord-{hour}-{n:010}"),
                format!("sku-{product:05}"),
                delta,
            )
        })
        .collect();
    let refs: Vec<_> = events
        .iter()
        .map(|(h, id, p, m)| (*h, id.as_str(), p.as_str(), *m))
        .collect();
    let mut batch = batch_of(&refs);
    for (_, id, body) in &mut batch.events {
        *body = format!(
            r#"{{"id":"{id}","type":"product_viewed","ts":1780000000000,"product_id":"sku-00001","categories":["home","kitchen"]}}"#
        )
        .into_bytes();
    }
    batch.watermark_millis = Some(hour * 3_600_000);
    batch.ingested_at_millis = Some(hour * 3_600_000);
    batch
}

fn bench_commit(c: &mut Criterion, name: &str, source: &mut dyn SourceOfTruth) {
    let mut group = c.benchmark_group("source_commit");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.sample_size(20);
    let next = Cell::new(0u64);
    group.bench_function(name, |b| {
        b.iter_batched(
            || {
                next.set(next.get() + 1);
                make_batch(next.get())
            },
            |batch| {
                let counted = source.commit_deduped(&batch).expect("commit");
                assert!(counted.iter().all(|&new| new));
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

fn source_commit(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut sqlite = SqliteSource::open(dir.path()).expect("open sqlite");
    bench_commit(c, "sqlite_2000_events", &mut sqlite);

    let url = std::env::var("RANKGATE_BENCH_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = format!("rgbench_{}", std::process::id());
    let mut postgres = PostgresSource::connect(&url, &schema).expect("PostgreSQL must be reachable");
    bench_commit(c, "postgres_2000_events", &mut postgres);
    postgres.drop_schema().expect("drop bench schema");

    let schema = format!("rgbench_{}_prefilled", std::process::id());
    let mut postgres = PostgresSource::connect(&url, &schema).expect("PostgreSQL must be reachable");
    prefill(&url, &schema);
    bench_commit(c, "postgres_2000_events_prefilled", &mut postgres);
    postgres.drop_schema().expect("drop bench schema");
}

/// 30 days of history before [`DAY0`]: 1M processed ids (md5 strings, so index probes land anywhere)
/// and 1,000 products' hourly rows. Written with plain SQL, outside any timed section.
fn prefill(url: &str, schema: &str) {
    let first_day = DAY0 / 24 - 30;
    let mut client = postgres::Client::connect(url, postgres::NoTls).expect("connect for prefill");
    client
        .batch_execute(&format!(
            "SET search_path TO \"{schema}\";
             SELECT ensure_day_partitions(ARRAY(SELECT generate_series({first_day}::bigint, {first_day} + 29)));
             INSERT INTO processed (hour, id, batch)
                 SELECT {first_day} * 24 + g / 1389, md5(g::text), 0 FROM generate_series(0, 999999) g;
             INSERT INTO metrics_hourly (hour, product, views, likes, units, sales)
                 SELECT h, 'sku-' || lpad(p::text, 5, '0'), 1, 0, 0, 0
                 FROM generate_series({first_day} * 24, {first_day} * 24 + 719) h, generate_series(0, 999) p;
             ANALYZE processed; ANALYZE metrics_hourly;"
        ))
        .expect("prefill");
}

criterion_group!(benches, source_commit);
criterion_main!(benches);
