//! `naive-redis`: the naive per-event ranking design, measured against a real Redis.
//!
//! For every event, ONE `EVALSHA` of a Lua script that:
//! 1. `SADD`s the event id into a processed set and stops if it was already there (dedupe);
//! 2. `HINCRBY`s the event's metric(s) for (UTC day, product) (`views`, `likes`, or `units` and `sales`);
//! 3. reads the metrics back (`HMGET`) and recomputes the `popular` score
//!    `views*0.1 + likes*0.2 + ln(1+max(sales,0))*0.7`;
//! 4. `ZADD`s that score into the daily ranking key for `all` and for each of the event's categories.
//!
//! Each connection waits for the reply before sending the next event: no pipelining, which is the point.
//! The run reports events/s and the Redis commands executed per event (the `EVALSHA` plus the script's
//! `redis.call`s). For comparison it also runs a *coalesced* client on the same events: one pipeline per
//! micro-batch, with one `HINCRBY` per distinct (day, product, metric) and one `ZADD` member update per
//! distinct (ranking key, product), scores computed from a client-side copy of the metrics.
//!
//! ```text
//! naive-redis [--redis redis://127.0.0.1:6379] [--connections 1,8] [--events N] [--seed 42] [--scale 1.0]
//!             [--batches 1000,10000] [--flash-sale] [--no-coalesced]
//! ```
//!
//! Keys live under `naivebench:<pid>:<run>:` and are deleted after each run.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use rankgate_bench::coalesce::{self, KeyScope};
use rankgate_workload::{
    flash_sale, seed_lesson, Counts, Event, EventType, FlashSaleConfig, SeedLessonConfig, DAY_MS, HOUR_MS,
};
use redis::{Commands, Connection};

const SCRIPT: &str = r#"
if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 1 end
local n = 1
for i = 3, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1])
  n = n + 1
end
local m = redis.call('HMGET', KEYS[2], 'views', 'likes', 'sales')
n = n + 1
local v = tonumber(m[1]) or 0
local l = tonumber(m[2]) or 0
local s = tonumber(m[3]) or 0
if s < 0 then s = 0 end
local score = v * 0.1 + l * 0.2 + math.log(1 + s) * 0.7
for i = 3, #KEYS do
  redis.call('ZADD', KEYS[i], score, ARGV[2])
  n = n + 1
end
return n
"#;

#[derive(Parser)]
#[command(
    name = "naive-redis",
    about = "Measure the naive one-Lua-call-per-event Redis ranking design"
)]
struct Cli {
    /// Redis URL.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis: String,
    /// Parallel connections to measure, comma-separated; each is a separate run.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    connections: Vec<usize>,
    /// Use only the first N events of the workload.
    #[arg(long)]
    events: Option<usize>,
    /// Workload seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Seed-lesson volume factor (1.0 = 200,000 sales, ~1.46M events).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Micro-batch sizes for the coalescing counts and the coalesced run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    batches: Vec<usize>,
    /// Use the seed's 6.6 flash sale (100,000 sales, one hour, one category, 20 products) instead.
    #[arg(long)]
    flash_sale: bool,
    /// Skip the coalesced comparison runs.
    #[arg(long)]
    no_coalesced: bool,
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The Redis keys and arguments of one event.
struct Call {
    keys: Vec<String>,
    args: Vec<String>,
}

fn metric_deltas(e: &Event) -> Vec<(&'static str, i64)> {
    match e.kind {
        EventType::ProductViewed => vec![("views", 1)],
        EventType::ProductLiked => vec![("likes", 1)],
        EventType::ProductUnliked => vec![("likes", -1)],
        EventType::PaymentSucceeded | EventType::PaymentRefunded => {
            let sign = if e.kind == EventType::PaymentSucceeded {
                1
            } else {
                -1
            };
            vec![
                ("units", sign * i64::from(e.quantity.unwrap_or(0))),
                ("sales", e.sales_delta()),
            ]
        }
    }
}

fn ranking_keys(prefix: &str, e: &Event) -> Vec<String> {
    let day = e.ts.div_euclid(DAY_MS);
    std::iter::once("all".to_string())
        .chain(e.categories.names())
        .map(|c| format!("{prefix}r:popular:{day}:{c}"))
        .collect()
}

fn call(prefix: &str, e: &Event) -> Call {
    let day = e.ts.div_euclid(DAY_MS);
    let mut keys = vec![
        format!("{prefix}processed"),
        format!("{prefix}m:{day}:p{}", e.product),
    ];
    keys.extend(ranking_keys(prefix, e));
    let mut args = vec![e.id.to_string(), e.product_id()];
    for (field, delta) in metric_deltas(e) {
        args.push(field.to_string());
        args.push(delta.to_string());
    }
    Call { keys, args }
}

fn connect(url: &str) -> redis::RedisResult<Connection> {
    redis::Client::open(url)?.get_connection()
}

/// Deletes every key under `prefix`.
fn cleanup(con: &mut Connection, prefix: &str) -> redis::RedisResult<u64> {
    let keys: Vec<String> = con.scan_match::<_, String>(format!("{prefix}*"))?.collect();
    let mut n = 0;
    for chunk in keys.chunks(1000) {
        n += redis::cmd("UNLINK").arg(chunk).query::<u64>(con)?;
    }
    Ok(n)
}

struct NaiveResult {
    secs: f64,
    commands: u64,
    zadds: u64,
}

fn run_naive(
    url: &str,
    prefix: &str,
    events: &[Event],
    connections: usize,
) -> redis::RedisResult<NaiveResult> {
    let mut con = connect(url)?;
    let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(SCRIPT).query(&mut con)?;
    let commands = AtomicU64::new(0);
    let zadds = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|s| -> redis::RedisResult<()> {
        let handles: Vec<_> = (0..connections)
            .map(|t| {
                let (sha, commands, zadds) = (&sha, &commands, &zadds);
                s.spawn(move || -> redis::RedisResult<()> {
                    let mut con = connect(url)?;
                    let (mut cmds, mut z) = (0u64, 0u64);
                    for e in events.iter().skip(t).step_by(connections) {
                        let c = call(prefix, e);
                        let n: u64 = redis::cmd("EVALSHA")
                            .arg(sha)
                            .arg(c.keys.len())
                            .arg(&c.keys)
                            .arg(&c.args)
                            .query(&mut con)?;
                        cmds += n + 1;
                        z += c.keys.len() as u64 - 2;
                    }
                    commands.fetch_add(cmds, Ordering::Relaxed);
                    zadds.fetch_add(z, Ordering::Relaxed);
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("worker thread panicked")?;
        }
        Ok(())
    })?;
    let secs = started.elapsed().as_secs_f64();
    cleanup(&mut con, prefix)?;
    Ok(NaiveResult {
        secs,
        commands: commands.into_inner(),
        zadds: zadds.into_inner(),
    })
}

struct CoalescedResult {
    secs: f64,
    commands: u64,
    zset_member_writes: u64,
    round_trips: u64,
}

/// One pipeline per batch: SADD of the batch's ids, HINCRBY per distinct (day, product, metric), one ZADD
/// per ranking key with one member per distinct product; scores from a client-side metrics copy.
fn run_coalesced(
    url: &str,
    prefix: &str,
    events: &[Event],
    batch: usize,
) -> redis::RedisResult<CoalescedResult> {
    let mut con = connect(url)?;
    let mut metrics: HashMap<(i64, u32), [i64; 4]> = HashMap::new();
    let mut seen: HashSet<rankgate_workload::EventId> = HashSet::new();
    let (mut commands, mut members, mut round_trips) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    for chunk in events.chunks(batch) {
        let mut deltas: HashMap<(i64, u32), [i64; 4]> = HashMap::new();
        let mut touched: HashMap<String, HashSet<(i64, u32)>> = HashMap::new();
        let mut ids = Vec::with_capacity(chunk.len());
        for e in chunk {
            if !seen.insert(e.id) {
                continue;
            }
            ids.push(e.id.to_string());
            let day = e.ts.div_euclid(DAY_MS);
            let d = deltas.entry((day, e.product)).or_default();
            for (field, delta) in metric_deltas(e) {
                let i = ["views", "likes", "units", "sales"]
                    .iter()
                    .position(|f| *f == field)
                    .unwrap_or(0);
                d[i] += delta;
            }
            for key in ranking_keys(prefix, e) {
                touched.entry(key).or_default().insert((day, e.product));
            }
        }
        let mut pipe = redis::pipe();
        if !ids.is_empty() {
            pipe.cmd("SADD")
                .arg(format!("{prefix}processed"))
                .arg(&ids)
                .ignore();
            commands += 1;
        }
        for (&(day, product), d) in &deltas {
            let total = metrics.entry((day, product)).or_default();
            let key = format!("{prefix}m:{day}:p{product}");
            for (i, field) in ["views", "likes", "units", "sales"].iter().enumerate() {
                if d[i] != 0 {
                    total[i] += d[i];
                    pipe.cmd("HINCRBY").arg(&key).arg(*field).arg(d[i]).ignore();
                    commands += 1;
                }
            }
        }
        for (key, products) in &touched {
            let mut zadd = redis::cmd("ZADD");
            zadd.arg(key);
            for &(day, product) in products {
                let m = metrics.get(&(day, product)).copied().unwrap_or_default();
                let score = m[0] as f64 * 0.1 + m[1] as f64 * 0.2 + (m[3].max(0) as f64).ln_1p() * 0.7;
                zadd.arg(score).arg(format!("p{product}"));
                members += 1;
            }
            pipe.add_command(zadd).ignore();
            commands += 1;
        }
        pipe.query::<()>(&mut con)?;
        round_trips += 1;
    }
    let secs = started.elapsed().as_secs_f64();
    cleanup(&mut con, prefix)?;
    Ok(CoalescedResult {
        secs,
        commands,
        zset_member_writes: members,
        round_trips,
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let mut con = connect(&cli.redis)?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut con)?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_string();
    let (name, mut events) = if cli.flash_sale {
        let config = FlashSaleConfig {
            seed: cli.seed,
            // End on an hour boundary so the sale fills exactly one hourly bucket (and one day), as in the seed.
            end_millis: now_millis().div_euclid(HOUR_MS) * HOUR_MS,
            ..FlashSaleConfig::default()
        };
        ("flash sale (seed 6.6)", flash_sale(&config))
    } else {
        let config = SeedLessonConfig::new(cli.seed, now_millis()).with_scale(cli.scale);
        ("seed lesson", seed_lesson(&config))
    };
    if let Some(n) = cli.events {
        events.truncate(n);
    }
    println!("workload: {name}, {}", Counts::of(&events));
    println!("redis: {} (version {version})", cli.redis);

    println!("\n== ZSET writes, per event vs coalesced per batch (daily popular keys) ==");
    for (scope, label) in [
        (KeyScope::Categories, "category keys only (the seed's 6.6 count)"),
        (
            KeyScope::CategoriesAndAll,
            "category keys + `all` (what the naive design writes)",
        ),
    ] {
        println!("{label}:");
        for c in coalesce::compare(&events, &cli.batches, scope) {
            println!(
                "  batch {:>6}: {:>9} ZSET writes, reduction {:>7.1}x",
                c.batch, c.zset_writes, c.reduction
            );
        }
    }

    let pid = std::process::id();
    println!("\n== naive: one EVALSHA per event, no pipelining ==");
    for (run, &connections) in cli.connections.iter().enumerate() {
        let prefix = format!("naivebench:{pid}:{run}:");
        let r = run_naive(&cli.redis, &prefix, &events, connections.max(1))?;
        let n = events.len() as f64;
        println!(
            "naive connections={connections}: {} events in {:.2}s = {:.0} events/s; Redis commands/event {:.2} \
             (EVALSHA + {:.2} inside); ZSET writes/event {:.2}; round trips/event 1",
            events.len(),
            r.secs,
            n / r.secs,
            r.commands as f64 / n,
            r.commands as f64 / n - 1.0,
            r.zadds as f64 / n
        );
    }

    if !cli.no_coalesced {
        println!("\n== coalesced: one pipeline per micro-batch, one connection ==");
        for (i, &batch) in cli.batches.iter().enumerate() {
            let prefix = format!("naivebench:{pid}:c{i}:");
            let r = run_coalesced(&cli.redis, &prefix, &events, batch.max(1))?;
            let n = events.len() as f64;
            println!(
                "coalesced batch={batch}: {:.2}s = {:.0} events/s; Redis commands/event {:.3}; ZSET member \
                 writes {} ({:.3}/event); round trips {} (1 per batch)",
                r.secs,
                n / r.secs,
                r.commands as f64 / n,
                r.zset_member_writes,
                r.zset_member_writes as f64 / n,
                r.round_trips
            );
        }
    }
    Ok(())
}
