//! `gen-workload`: writes rankgate benchmark workloads to NDJSON files (SPEC 1.1 events).
//!
//! ```text
//! gen-workload seed-lesson --out demo.ndjson [--seed 42] [--scale 1.0] [--days 14] [--end-millis MS]
//!                          [--rfc3339-share 0.3] [--uncategorized-share 0.1]
//! gen-workload flash-sale  --out flash.ndjson [--seed 7] [--sales 100000] [--products 20] [--end-millis MS]
//! gen-workload queue-surge --out members.txt [--count 100000]
//! ```
//!
//! `--end-millis` defaults to the current time, so the events end "now" (for the flash sale, to the start
//! of the current UTC hour, so that it fills exactly one hourly bucket).
//!
//! `--rfc3339-share` and `--uncategorized-share` write the seed lesson the way many real producers do
//! (issue 27): that share of `ts` values as RFC 3339 strings (half in UTC with milliseconds, half with a
//! `+09:00` offset), and that share of events without their `categories` field. The events are the same;
//! only how they are written changes, so rankings equal the plain file's.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rankgate_workload::{
    flash_sale, queue_surge, sales_shares, seed_lesson, write_ndjson, Counts, Event, FlashSaleConfig,
    SeedLessonConfig, HOUR_MS,
};

#[derive(Parser)]
#[command(name = "gen-workload", about = "Write rankgate benchmark workloads as NDJSON")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The seed lesson's demo: 200,000 sales over 14 days, 50 categories, 20,000 products (at scale 1).
    SeedLesson {
        /// Output file ("-" for stdout).
        #[arg(long)]
        out: PathBuf,
        /// RNG seed.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Volume factor (1.0 = 200,000 sales).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Days to span (sales scale with it at a constant daily rate).
        #[arg(long, default_value_t = 14)]
        days: u32,
        /// Exclusive end of the event times, epoch milliseconds (default: now).
        #[arg(long)]
        end_millis: Option<i64>,
        /// Share of events whose `ts` is written as an RFC 3339 string instead of epoch milliseconds.
        #[arg(long, default_value_t = 0.0)]
        rfc3339_share: f64,
        /// Share of events written without their `categories` field.
        #[arg(long, default_value_t = 0.0)]
        uncategorized_share: f64,
    },
    /// The seed's 6.6 flash sale: 100,000 sales in one hour in one category over 20 products.
    FlashSale {
        /// Output file ("-" for stdout).
        #[arg(long)]
        out: PathBuf,
        /// RNG seed.
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// Number of sales.
        #[arg(long, default_value_t = 100_000)]
        sales: usize,
        /// Number of products.
        #[arg(long, default_value_t = 20)]
        products: u32,
        /// Exclusive end of the sale, epoch milliseconds (default: the start of the current UTC hour, so
        /// the sale fills exactly one hourly bucket).
        #[arg(long)]
        end_millis: Option<i64>,
    },
    /// Waiting-room member ids m-000001…, one per line.
    QueueSurge {
        /// Output file ("-" for stdout).
        #[arg(long)]
        out: PathBuf,
        /// Number of members.
        #[arg(long, default_value_t = 100_000)]
        count: usize,
    },
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `event` as a producer might write it: its `ts` as an RFC 3339 string with probability `rfc3339_share`
/// (alternately `Z` with milliseconds and `+09:00`), without `categories` with `uncategorized_share`.
fn as_producers_write(
    event: &Event,
    rng: &mut StdRng,
    rfc3339_share: f64,
    uncategorized_share: f64,
) -> serde_json::Value {
    let mut json = event.to_json();
    let object = json.as_object_mut().expect("an event is an object");
    if rng.random_bool(rfc3339_share.clamp(0.0, 1.0)) {
        let timestamp = jiff::Timestamp::from_millisecond(event.ts).expect("workload times are in range");
        let text = if event.id.seq.is_multiple_of(2) {
            format!("{timestamp:.3}")
        } else {
            let offset = jiff::tz::TimeZone::fixed(jiff::tz::offset(9));
            timestamp
                .to_zoned(offset)
                .strftime("%Y-%m-%dT%H:%M:%S%.f%:z")
                .to_string()
        };
        object.insert("ts".into(), text.into());
    }
    if rng.random_bool(uncategorized_share.clamp(0.0, 1.0)) {
        object.remove("categories");
    }
    json
}

fn open(out: &PathBuf) -> std::io::Result<Box<dyn Write>> {
    Ok(if out.as_os_str() == "-" {
        Box::new(BufWriter::with_capacity(1 << 20, std::io::stdout().lock()))
    } else {
        Box::new(BufWriter::with_capacity(1 << 20, File::create(out)?))
    })
}

fn main() -> std::io::Result<()> {
    let cli = Cli::parse();
    let started = Instant::now();
    match cli.command {
        Command::SeedLesson {
            out,
            seed,
            scale,
            days,
            end_millis,
            rfc3339_share,
            uncategorized_share,
        } => {
            let config = SeedLessonConfig::new(seed, end_millis.unwrap_or_else(now_millis))
                .with_scale(scale)
                .with_days(days);
            let events = seed_lesson(&config);
            let n = if rfc3339_share > 0.0 || uncategorized_share > 0.0 {
                let mut rng = StdRng::seed_from_u64(seed ^ 0x5_0D0C_E125);
                let shaped = events
                    .iter()
                    .map(|event| as_producers_write(event, &mut rng, rfc3339_share, uncategorized_share));
                write_ndjson(shaped, open(&out)?)?
            } else {
                write_ndjson(&events, open(&out)?)?
            };
            let (hot, two) = sales_shares(&events, 0);
            eprintln!(
                "seed-lesson → {}: {} ({n} lines), ts [{}, {}), cat0 {:.1}% of sales, two categories {:.1}% \
                 of sales, {:.2}s",
                out.display(),
                Counts::of(&events),
                config.start_millis(),
                config.end_millis,
                hot * 100.0,
                two * 100.0,
                started.elapsed().as_secs_f64()
            );
        }
        Command::FlashSale {
            out,
            seed,
            sales,
            products,
            end_millis,
        } => {
            let config = FlashSaleConfig {
                seed,
                sales,
                products,
                end_millis: end_millis.unwrap_or_else(|| now_millis().div_euclid(HOUR_MS) * HOUR_MS),
                ..FlashSaleConfig::default()
            };
            let events = flash_sale(&config);
            let n = write_ndjson(&events, open(&out)?)?;
            eprintln!(
                "flash-sale → {}: {} ({n} lines) in cat{} over {} products, ts [{}, {}), {:.2}s",
                out.display(),
                Counts::of(&events),
                config.category,
                config.products,
                config.end_millis - config.duration_ms,
                config.end_millis,
                started.elapsed().as_secs_f64()
            );
        }
        Command::QueueSurge { out, count } => {
            let mut w = open(&out)?;
            for m in queue_surge(count) {
                writeln!(w, "{m}")?;
            }
            w.flush()?;
            eprintln!("queue-surge → {}: {count} members", out.display());
        }
    }
    Ok(())
}
