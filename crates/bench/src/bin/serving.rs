//! `serving-bench`: the Redis serving store measured on a real Redis (and PostgreSQL).
//!
//! ```text
//! serving-bench coalesce [--flash-sale] [--batch 2000]       writes to Redis per batch vs per event
//! serving-bench ingest   [--events N] [--batch 2000] [--serving-depth N]   PostgreSQL + Redis ingest rate, end to end
//! serving-bench rebuild  [--events 1000000]                  raw log in PostgreSQL → fresh Redis generation
//!               [--redis redis://127.0.0.1:6379] [--postgres postgres://postgres@127.0.0.1:5432/test]
//! ```
//!
//! Every mode drives the production code: the `Ingestor` over the source of truth, the in-process
//! engine, `publication::take_publication` (coalesced changes per span) and `RedisServing::publish`
//! (bounded Lua calls, categories in parallel). The hot spans are those `rankgate serve` publishes: the
//! current hour, day, ISO week and month and the four windows ending at the current hour, for `all` and
//! every category, with
//! "now" at the workload's last event.
//!
//! - `coalesce` counts member writes (sorted-set entries and detail entries) and script calls, and
//!   compares them with per-event updates of the same keys: an event touching k hot (category, span)
//!   pairs costs 4k writes (three rankers and the detail) for a payment, 2k (`popular` and the detail)
//!   for a view, like or unlike, when each event is written on its own.
//! - `ingest` reports events/s with each 2,000-event batch committed to PostgreSQL and published to Redis
//!   before the next one starts, Redis commands per event and round trips per batch.
//! - `rebuild` ingests N events once (not timed), then times the rebuild path: read the raw event log
//!   back from PostgreSQL, parse and coalesce it into a fresh engine, and publish every hot span into a
//!   fresh generation of versioned Redis keys, then switch the pointer.
//!
//! Keys live under `servingbench:<pid>:` and PostgreSQL data in schema `servingbench_<pid>`; both are
//! deleted at the end.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use parking_lot::RwLock;

use rankgate_core::event::{Event, ParseLimits};
use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{Hour, Span, Zone};
use rankgate_core::ranker::Policy;
use rankgate_store::ranking::engine::{EngineConfig, RankingEngine};
use rankgate_store::ranking::ingest::{IngestConfig, Ingestor};
use rankgate_store::ranking::postgres::PostgresSource;
use rankgate_store::ranking::publication::{
    hot_requests, take_publication, take_publication_in_slices, PublicationScope,
};
use rankgate_store::ranking::redis_serving::{
    Active, Published, RedisServing, ServingOptions, StampKind, Stamped,
};
use rankgate_store::ranking::source::SourceOfTruth;
use rankgate_store::ranking::sqlite::SqliteSource;
use rankgate_workload::{flash_sale, seed_lesson, FlashSaleConfig, SeedLessonConfig, DAY_MS};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    Coalesce,
    Ingest,
    Rebuild,
}

#[derive(Debug, Parser)]
#[command(about = "Measures rankgate's Redis serving store (coalescing, PG + Redis ingest, rebuild)")]
struct Args {
    /// What to measure.
    mode: Mode,
    /// Redis URL.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis: String,
    /// PostgreSQL URL (ingest and rebuild).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    postgres: String,
    /// Use the seed's flash sale (100,000 sales, one hour, one category, 20 products) instead of the
    /// seed lesson's spread-out demo workload.
    #[arg(long)]
    flash_sale: bool,
    /// Events per micro-batch.
    #[arg(long, default_value_t = 2000)]
    batch: usize,
    /// Number of events (seed-lesson workload truncated or scaled up to this many; with --flash-sale, the
    /// number of sales in its one hour).
    #[arg(long)]
    events: Option<usize>,
    /// `ingest` without the Redis publisher: the PostgreSQL-only figure, to see what publishing costs.
    #[arg(long)]
    no_publish: bool,
    /// `ingest` publishing only the top N members of each span (the server's `serving_depth`, Top-N-only
    /// serving); every member when left out.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    serving_depth: Option<u64>,
}

fn workload(args: &Args) -> Vec<Event> {
    let raw = if args.flash_sale {
        // `--events` scales the sale (same hour, category and 20 products); the seed's is 100,000.
        let defaults = FlashSaleConfig::default();
        flash_sale(&FlashSaleConfig {
            sales: args.events.unwrap_or(defaults.sales),
            ..defaults
        })
    } else {
        let end = 1_783_641_600_000; // 2026-07-10T00:00:00Z
        let base = SeedLessonConfig::new(42, end);
        let wanted = args.events.unwrap_or(0);
        let natural = seed_lesson(&base).len();
        let scale = (wanted as f64 / natural as f64).max(1.0) * 1.05;
        let mut events = seed_lesson(&base.with_scale(scale));
        if wanted > 0 {
            events.truncate(wanted);
        }
        events
    };
    let limits = ParseLimits::at(i64::MAX / 2);
    raw.iter()
        .map(|e| Event::from_json(&e.to_json(), &limits).expect("workload events are valid"))
        .collect()
}

/// The first round of a run publishes every span whole, the later ones what changed.
fn scope_of(first: bool) -> PublicationScope {
    if first {
        PublicationScope::Everything
    } else {
        PublicationScope::Changes
    }
}

fn new_engine() -> Arc<RwLock<RankingEngine>> {
    Arc::new(RwLock::new(RankingEngine::new(
        EngineConfig {
            zone: Zone::utc(),
            max_cached_members: 50_000_000,
        },
        Policy::default(),
    )))
}

fn ingestor(source: Box<dyn SourceOfTruth>) -> (Ingestor, Arc<RwLock<RankingEngine>>) {
    let engine = new_engine();
    let ingestor = Ingestor::open(
        source,
        engine.clone(),
        IngestConfig {
            max_lateness_millis: 400 * DAY_MS,
        },
    )
    .expect("the source of truth opens");
    (ingestor, engine)
}

fn last_hour(events: &[Event]) -> Hour {
    Hour::from_millis(events.iter().map(|e| e.ts_millis).max().expect("events"))
}

async fn connect(url: &str, prefix: &str) -> Arc<RedisServing> {
    RedisServing::connect(
        &[url.to_string()],
        ServingOptions {
            prefix: prefix.to_string(),
            ..ServingOptions::default()
        },
    )
    .await
    .expect("redis reachable")
}

/// Writes an event would cost on its own, per hot (category, span) it touches: a payment moves all three
/// rankers and the detail (4 writes); a view, like or unlike moves `popular` and the detail (2).
fn per_event_writes(events: &[Event], requests: &[(CategoryOrAll, Span)], zone: &Zone) -> u64 {
    let mut spans_by_category: HashMap<&CategoryOrAll, Vec<&Span>> = HashMap::new();
    for (category, span) in requests {
        spans_by_category.entry(category).or_default().push(span);
    }
    events
        .iter()
        .map(|event| {
            let hour = event.hour();
            let categories = std::iter::once(CategoryOrAll::All)
                .chain(event.categories.iter().cloned().map(CategoryOrAll::Category));
            categories
                .map(|c| {
                    spans_by_category
                        .get(&c)
                        .map_or(0, |spans| spans.iter().filter(|s| s.contains(hour, zone)).count())
                })
                .sum::<usize>() as u64
                * if event.kind.is_payment() { 4 } else { 2 }
        })
        .sum()
}

async fn coalesce(args: &Args, prefix: &str) -> anyhow::Result<()> {
    let zone = Zone::utc();
    let events = workload(args);
    let now_hour = last_hour(&events);
    let dir = tempfile::tempdir()?;
    let (mut ingestor, engine) = ingestor(Box::new(SqliteSource::open(dir.path())?));
    let store = connect(&args.redis, prefix).await;
    let generation = store.new_generation().await?;
    let mut first = true;
    let mut batches = 0;
    for batch in events.chunks(args.batch) {
        ingestor.ingest(batch, batch.iter().map(|e| e.ts_millis).max().unwrap_or(0))?;
        let publications = {
            let mut engine = engine.write();
            let requests = hot_requests(&engine, now_hour, &zone);
            take_publication(&mut engine, &requests, None, scope_of(first))
        };
        first = false;
        batches += 1;
        let published = store
            .publish(generation, &publications, &zone, now_hour.start_millis())
            .await?;
        anyhow::ensure!(matches!(published, Published::Applied { .. }), "{published:?}");
    }
    let requests = hot_requests(&engine.read(), now_hour, &zone);
    let naive = per_event_writes(&events, &requests, &zone);
    let (calls, writes) = store.publish_counters();
    println!(
        "workload: {} ({} events, {} batches of {}), hot (category, span) pairs: {}",
        if args.flash_sale {
            "flash sale"
        } else {
            "seed lesson"
        },
        events.len(),
        batches,
        args.batch,
        requests.len()
    );
    println!("per-event updates: {naive} member writes in {naive} commands");
    println!("coalesced:         {writes} member writes in {calls} script calls");
    println!(
        "reduction:         {:.1}x fewer member writes, {:.0}x fewer commands",
        naive as f64 / writes.max(1) as f64,
        naive as f64 / calls.max(1) as f64
    );
    Ok(())
}

fn schema_name() -> String {
    format!("servingbench_{}", std::process::id())
}

/// Drops the bench's schema (the PostgreSQL client is blocking: off the async runtime).
async fn drop_schema(url: &str, schema: &str) {
    let (url, schema) = (url.to_string(), schema.to_string());
    let _ = tokio::task::spawn_blocking(move || {
        if let Ok(mut client) = ::postgres::Client::connect(&url, ::postgres::NoTls) {
            let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"));
        }
    })
    .await;
}

async fn ingest(args: &Args, prefix: &str) -> anyhow::Result<()> {
    let zone = Zone::utc();
    let events = workload(args);
    let now_hour = last_hour(&events);
    let schema = schema_name();
    let url = args.postgres.clone();
    let (mut ingestor, engine) = {
        let schema = schema.clone();
        tokio::task::spawn_blocking(move || {
            ingestor(Box::new(PostgresSource::connect(&url, &schema).unwrap()))
        })
        .await?
    };
    let store = connect(&args.redis, prefix).await;
    let generation = store.new_generation().await?;
    // The publisher runs beside the writer, as in `rankgate serve`: each round publishes everything
    // committed since the previous round, so Redis work is coalesced across batches and never holds up
    // a commit. The run ends when the last batch is committed AND published.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = {
        let (engine, store, done, zone) = (engine.clone(), store.clone(), done.clone(), zone.clone());
        let no_publish = args.no_publish;
        let depth = args.serving_depth.map(|depth| depth as usize);
        tokio::spawn(async move {
            let mut first = true;
            let mut rounds = 0u64;
            let (mut in_engine, mut in_redis) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
            // The server's cadence: a round every freshness / 4 (250 ms by default), or back to back
            // when a round takes longer.
            let mut ticker = tokio::time::interval(std::time::Duration::from_millis(250));
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let finished = done.load(std::sync::atomic::Ordering::Acquire);
                if no_publish {
                    if finished {
                        return 0;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    continue;
                }
                if !finished {
                    ticker.tick().await;
                }
                let started = Instant::now();
                let requests = hot_requests(&engine.read(), now_hour, &zone);
                let publications = take_publication_in_slices(&engine, &requests, depth, scope_of(first));
                in_engine += started.elapsed();
                first = false;
                if !publications.is_empty() {
                    rounds += 1;
                    let started = Instant::now();
                    store
                        .publish(generation, &publications, &zone, now_hour.start_millis())
                        .await
                        .expect("redis publish");
                    in_redis += started.elapsed();
                }
                if finished {
                    println!(
                        "publisher: {:.2} s collecting changes from the engine (write lock held one category at a time), {:.2} s in Redis calls",
                        in_engine.as_secs_f64(),
                        in_redis.as_secs_f64()
                    );
                    return rounds;
                }
            }
        })
    };
    let started = Instant::now();
    let cpu_before = rankgate_bench::process_cpu_seconds();
    let batches = tokio::task::spawn_blocking({
        let (events, batch, done) = (events.clone(), args.batch, done.clone());
        move || -> anyhow::Result<(Ingestor, u64, std::time::Duration)> {
            let mut batches = 0;
            for chunk in events.chunks(batch) {
                ingestor.ingest(chunk, chunk.iter().map(|e| e.ts_millis).max().unwrap_or(0))?;
                batches += 1;
            }
            let committed = started.elapsed();
            done.store(true, std::sync::atomic::Ordering::Release);
            Ok((ingestor, batches, committed))
        }
    })
    .await??;
    let (ingestor, batches, committed) = batches;
    let rounds = publisher.await?;
    let elapsed = started.elapsed();
    let cpu_after = rankgate_bench::process_cpu_seconds();
    let (calls, writes) = store.publish_counters();
    println!(
        "PostgreSQL + Redis ingest: {} events in {:.2} s = {:.0} events/s ({} batches of {}; all committed to PostgreSQL after {:.2} s, Redis caught up {:.2} s later)",
        events.len(),
        elapsed.as_secs_f64(),
        events.len() as f64 / elapsed.as_secs_f64(),
        batches,
        args.batch,
        committed.as_secs_f64(),
        (elapsed - committed).as_secs_f64()
    );
    println!(
        "Redis: {:.4} commands per event, {:.1} round trips per batch ({rounds} publication rounds), {:.2} member writes per event",
        calls as f64 / events.len() as f64,
        calls as f64 / batches as f64,
        writes as f64 / events.len() as f64
    );
    // The timed part only: building the workload and connecting are left out.
    if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
        println!(
            "serving-bench CPU over the timed run: {:.2} µs per event",
            (after - before) * 1e6 / events.len() as f64
        );
    }
    tokio::task::spawn_blocking(move || drop(ingestor)).await?;
    drop_schema(&args.postgres, &schema).await;
    Ok(())
}

async fn rebuild(args: &Args, prefix: &str) -> anyhow::Result<()> {
    let zone = Zone::utc();
    let events = workload(args);
    let now_hour = last_hour(&events);
    let schema = schema_name();
    let url = args.postgres.clone();
    {
        let (schema, events, batch) = (schema.clone(), events.clone(), args.batch);
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let (mut ingestor, _) = ingestor(Box::new(PostgresSource::connect(&url, &schema)?));
            for chunk in events.chunks(batch) {
                ingestor.ingest(chunk, chunk.iter().map(|e| e.ts_millis).max().unwrap_or(0))?;
            }
            Ok(())
        })
        .await??;
    }
    println!("loaded {} raw events into PostgreSQL (not timed)", events.len());
    let store = connect(&args.redis, prefix).await;
    let started = Instant::now();
    // 1. Read the raw event log back and coalesce it into hourly rows and memberships.
    let (url, schema2) = (args.postgres.clone(), schema.clone());
    let (rows, memberships, replayed) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let mut source = PostgresSource::connect(&url, &schema2)?;
        let mut hourly: HashMap<(Hour, ProductId), Metrics> = HashMap::new();
        let mut memberships = std::collections::HashSet::new();
        let mut replayed = 0usize;
        let limits = ParseLimits::at(i64::MAX / 2);
        source.scan_event_log(&mut |hour, body| {
            for line in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                let value: serde_json::Value = serde_json::from_slice(line).expect("stored events are JSON");
                let event = Event::from_json(&value, &limits).expect("stored events are valid");
                let cell = hourly.entry((hour, event.product.clone())).or_default();
                *cell = cell.checked_add(&event.metrics_delta()).expect("no overflow");
                for category in &event.categories {
                    memberships.insert((event.product.clone(), category.clone()));
                }
                replayed += 1;
            }
        })?;
        let rows: Vec<(Hour, ProductId, Metrics)> = hourly.into_iter().map(|((h, p), m)| (h, p, m)).collect();
        Ok((rows, memberships.into_iter().collect::<Vec<_>>(), replayed))
    })
    .await??;
    let read = started.elapsed();
    // 2. A fresh engine, every hot span built and published whole into a fresh generation.
    let engine = new_engine();
    let publications = {
        let mut engine = engine.write();
        engine.apply(&[], &memberships, None);
        engine.apply(&rows, &[], None);
        let requests = hot_requests(&engine, now_hour, &zone);
        take_publication(&mut engine, &requests, None, PublicationScope::Everything)
    };
    let built = started.elapsed();
    let generation = store.new_generation().await?;
    store
        .publish(generation, &publications, &zone, now_hour.start_millis())
        .await?;
    let groups = store.hold_groups("servingbench", 60_000).await?;
    anyhow::ensure!(
        !groups.is_empty(),
        "no span group free (is a server publishing to this Redis?)"
    );
    let active = Active {
        generation,
        seq: 0,
        as_of_millis: None,
        popular_version: 1,
        depth: None,
        rebuild_requested: false,
    };
    anyhow::ensure!(matches!(
        store
            .stamp("servingbench", &groups, &active, 0, StampKind::SwitchGeneration)
            .await?,
        Stamped::Done(_)
    ));
    store.leave_groups("servingbench").await?;
    let elapsed = started.elapsed();
    let (calls, writes) = store.publish_counters();
    println!(
        "rebuild of {replayed} raw events: {:.2} s = {:.0} events/s (read + parse {:.2} s, engine {:.2} s, Redis {:.2} s; {} spans, {writes} member writes in {calls} calls)",
        elapsed.as_secs_f64(),
        replayed as f64 / elapsed.as_secs_f64(),
        read.as_secs_f64(),
        (built - read).as_secs_f64(),
        (elapsed - built).as_secs_f64(),
        publications.len()
    );
    println!(
        "seed lesson: 200,000 events in 762 ms = 262,467 events/s; ratio {:.2}x",
        replayed as f64 / elapsed.as_secs_f64() / 262_467.0
    );
    drop_schema(&args.postgres, &schema).await;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let prefix = format!("servingbench:{}:", std::process::id());
    let result = match args.mode {
        Mode::Coalesce => coalesce(&args, &prefix).await,
        Mode::Ingest => ingest(&args, &prefix).await,
        Mode::Rebuild => rebuild(&args, &prefix).await,
    };
    let client = redis::Client::open(args.redis.as_str())?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut connection)
        .await?;
    for chunk in keys.chunks(500) {
        let _: i64 = redis::cmd("UNLINK")
            .arg(chunk)
            .query_async(&mut connection)
            .await?;
    }
    result
}
