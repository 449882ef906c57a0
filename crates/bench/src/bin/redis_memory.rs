//! `redis-memory`: what Redis needs to hold a 1,000,000-member sorted set.
//!
//! Two sets, each loaded with pipelined `ZADD`s into a fresh key, measured, then deleted:
//! - a ranking: members `sku-0000001`… with random scores;
//! - a waiting queue: members `m-0000001`… with increasing scores (arrival times).
//!
//! For each it prints `MEMORY USAGE key` (default sampling and `SAMPLES 0`, i.e. exact) per member, and
//! the `used_memory` delta (from `INFO memory`) per member, both on load and on delete. `used_memory` is
//! server-wide, so other clients writing at the same time skew the deltas; `MEMORY USAGE` is per key.
//!
//! ```text
//! redis-memory [--redis redis://127.0.0.1:6379] [--members 1000000] [--seed 1]
//! ```

use std::time::Instant;

use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::Connection;

#[derive(Parser)]
#[command(name = "redis-memory", about = "Measure Redis memory per sorted-set member")]
struct Cli {
    /// Redis URL.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis: String,
    /// Members per set.
    #[arg(long, default_value_t = 1_000_000)]
    members: usize,
    /// Seed for the random ranking scores.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn used_memory(con: &mut Connection) -> redis::RedisResult<i64> {
    let info: String = redis::cmd("INFO").arg("memory").query(con)?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0))
}

/// Loads `members` (score, member) pairs into `key`: 1,000 members per ZADD, 10 ZADDs per round trip.
fn load(
    con: &mut Connection,
    key: &str,
    members: impl Iterator<Item = (f64, String)>,
) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    let mut zadd = redis::cmd("ZADD");
    zadd.arg(key);
    let (mut in_cmd, mut in_pipe) = (0, 0);
    for (score, member) in members {
        zadd.arg(score).arg(member);
        in_cmd += 1;
        if in_cmd == 1_000 {
            pipe.add_command(std::mem::replace(&mut zadd, redis::cmd("ZADD")))
                .ignore();
            zadd.arg(key);
            in_cmd = 0;
            in_pipe += 1;
            if in_pipe == 10 {
                pipe.query::<()>(con)?;
                pipe.clear();
                in_pipe = 0;
            }
        }
    }
    if in_cmd > 0 {
        pipe.add_command(zadd).ignore();
    }
    pipe.query::<()>(con)?;
    Ok(())
}

fn measure(
    con: &mut Connection,
    label: &str,
    key: &str,
    n: usize,
    members: impl Iterator<Item = (f64, String)>,
) -> redis::RedisResult<()> {
    redis::cmd("DEL").arg(key).query::<()>(con)?;
    let before = used_memory(con)?;
    let started = Instant::now();
    load(con, key, members)?;
    let load_secs = started.elapsed().as_secs_f64();
    let after = used_memory(con)?;
    let card: usize = redis::cmd("ZCARD").arg(key).query(con)?;
    let sampled: i64 = redis::cmd("MEMORY").arg("USAGE").arg(key).query(con)?;
    let exact: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query(con)?;
    let encoding: String = redis::cmd("OBJECT").arg("ENCODING").arg(key).query(con)?;
    redis::cmd("DEL").arg(key).query::<()>(con)?;
    let freed = after - used_memory(con)?;
    let per = |bytes: i64| bytes as f64 / card.max(1) as f64;
    println!("{label}: {card} members (of {n}), encoding {encoding}, loaded in {load_secs:.2}s");
    println!(
        "  MEMORY USAGE (default samples): {sampled} B = {:.1} B/member",
        per(sampled)
    );
    println!(
        "  MEMORY USAGE SAMPLES 0 (exact): {exact} B = {:.1} B/member",
        per(exact)
    );
    println!(
        "  used_memory delta on load:      {} B = {:.1} B/member",
        after - before,
        per(after - before)
    );
    println!(
        "  used_memory freed by DEL:       {freed} B = {:.1} B/member",
        per(freed)
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let mut con = redis::Client::open(cli.redis.as_str())?.get_connection()?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut con)?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim();
    println!("redis {} (version {version})", cli.redis);
    let pid = std::process::id();
    let n = cli.members;

    let mut rng = StdRng::seed_from_u64(cli.seed);
    let ranking = (1..=n).map(move |i| (rng.random::<f64>() * 1e6, format!("sku-{i:07}")));
    measure(
        &mut con,
        "ranking ZSET (sku-0000001…, random scores)",
        &format!("rgmem:{pid}:ranking"),
        n,
        ranking,
    )?;

    let base = 1_767_225_600_000f64;
    let queue = (1..=n).map(move |i| (base + i as f64, format!("m-{i:07}")));
    measure(
        &mut con,
        "queue ZSET (m-0000001…, increasing scores)",
        &format!("rgmem:{pid}:queue"),
        n,
        queue,
    )?;
    Ok(())
}
