//! `gen-workload`: writes rankgate benchmark workloads to NDJSON files (SPEC 1.1 events).
//!
//! ```text
//! gen-workload seed-lesson --out demo.ndjson [--seed 42] [--scale 1.0] [--days 14] [--end-millis MS]
//! gen-workload flash-sale  --out flash.ndjson [--seed 7] [--sales 100000] [--products 20] [--end-millis MS]
//! gen-workload queue-surge --out members.txt [--count 100000]
//! ```
//!
//! `--end-millis` defaults to the current time, so the events end "now" (for the flash sale, to the start
//! of the current UTC hour, so that it fills exactly one hourly bucket).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use rankgate_workload::{
    flash_sale, queue_surge, sales_shares, seed_lesson, write_ndjson, Counts, FlashSaleConfig,
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
        } => {
            let config = SeedLessonConfig::new(seed, end_millis.unwrap_or_else(now_millis))
                .with_scale(scale)
                .with_days(days);
            let events = seed_lesson(&config);
            let n = write_ndjson(&events, open(&out)?)?;
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
