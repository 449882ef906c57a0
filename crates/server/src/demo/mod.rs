//! `rankgate demo`: a generated shop's two weeks of events end to end on embedded defaults (the workload of
//! the design document rankgate grew from, `rankgate_workload::seed_lesson`), then the flash-sale waiting
//! room. Prints top lists, the verification result and timings.
//!
//! - this module: the rankings' scene (the shop's events ingested, top lists, verify);
//! - [`flash_sale`]: the waiting room's scene (a surge through the queue and the gate);
//! - [`adaptive_admission`]: the order service degrades mid-sale and admission follows it.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use rankgate_core::event::{Event, ParseLimits};
use rankgate_core::ids::{Category, CategoryOrAll};
use rankgate_core::period::{Hour, PeriodKey, PeriodKind, Span, WindowLen};
use rankgate_core::ranker::RankerName;
use rankgate_store::ranking::engine::RankingQuery;
use rankgate_workload::{seed_lesson, SeedLessonConfig};

use crate::config::Config;
use crate::rankings::verify::{verify_data_dir, verify_progress};
use crate::rankings::{IngestCounts, RankingService};

pub mod adaptive_admission;
pub mod flash_sale;

/// Events per ingest call: the HTTP batch size the targets are stated for.
const BATCH: usize = 2_000;

/// Runs the demo; returns whether verification passed.
pub fn run_demo(
    data_dir: Option<PathBuf>,
    scale: f64,
    flash_sale_members: usize,
    redis: &[String],
    out: &mut (dyn Write + Send),
) -> anyhow::Result<bool> {
    let temporary = tempfile::tempdir()?;
    let data_dir = data_dir.unwrap_or_else(|| temporary.path().to_path_buf());
    let config = Config::for_data_dir(&data_dir);
    let now = jiff::Timestamp::now().as_millisecond();

    writeln!(
        out,
        "rankgate demo — a generated shop's last two weeks of events, on embedded defaults (data dir {})",
        data_dir.display()
    )?;
    let started = Instant::now();
    let workload = seed_lesson(&SeedLessonConfig::new(42, now - 60_000).with_scale(scale));
    let limits = ParseLimits {
        max_future_millis: config.rankings.max_future_millis,
        ..ParseLimits::at(now)
    };
    let events: Vec<Event> = workload
        .iter()
        .map(|e| Event::from_json(&e.to_json(), &limits))
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("the generated workload is invalid: {e}"))?;
    let sales = events.iter().filter(|e| e.payment.is_some()).count();
    writeln!(
        out,
        "generated {} events ({} payments) over 14 days, 50 categories, 20,000 products in {:.2}s",
        events.len(),
        sales,
        started.elapsed().as_secs_f64()
    )?;

    let (service, writer_thread) = RankingService::open(&config.rankings, &config.rankings_storage())?;
    let started = Instant::now();
    let mut counts = IngestCounts::default();
    for batch in events.chunks(BATCH) {
        for outcome in service.writer().ingest_blocking(batch.to_vec(), now)? {
            counts.count(&outcome);
        }
    }
    let ingest_seconds = started.elapsed().as_secs_f64();
    writeln!(
        out,
        "ingested in batches of {BATCH}: {:.2}s, {:.0} events/s durable (accepted {}, duplicates {}, tooOld {}, rejected {})",
        ingest_seconds,
        events.len() as f64 / ingest_seconds,
        counts.accepted,
        counts.duplicates,
        counts.too_old,
        counts.rejected
    )?;

    let zone = config.rankings.zone.clone();
    let now_hour = Hour::from_millis(now);
    let today = PeriodKey::containing(PeriodKind::Daily, now_hour, &zone);
    let yesterday = today.prev(&zone);
    let hot = CategoryOrAll::Category(Category::parse("cat0")?);
    let cat7 = CategoryOrAll::Category(Category::parse("cat7")?);
    let lists = [
        (
            "cat0 (hot), units, last 7 days",
            RankerName::Units,
            hot.clone(),
            Span::Window {
                len: WindowLen::D7,
                end: now_hour,
            },
            5,
        ),
        (
            "cat7, units, last 7 days",
            RankerName::Units,
            cat7,
            Span::Window {
                len: WindowLen::D7,
                end: now_hour,
            },
            3,
        ),
        (
            "cat0, popular, yesterday",
            RankerName::Popular,
            hot.clone(),
            Span::Period(yesterday),
            5,
        ),
        (
            "cat0, popular, today (with carry)",
            RankerName::Popular,
            hot,
            Span::Period(today),
            5,
        ),
        (
            "all, revenue in currency units, last 30 days",
            RankerName::Revenue,
            CategoryOrAll::All,
            Span::Window {
                len: WindowLen::D30,
                end: now_hour,
            },
            5,
        ),
    ];
    for (title, ranker, category, span, limit) in lists {
        let query = RankingQuery {
            ranker,
            category,
            span,
        };
        let started = Instant::now();
        let page = service.top(&query, 0, limit);
        let first_read = started.elapsed();
        let started = Instant::now();
        let cached = service.top(&query, 0, limit);
        let cached_read = started.elapsed();
        debug_assert_eq!(cached, page);
        let items: Vec<String> = page
            .items
            .iter()
            .map(|i| match ranker {
                // Revenue is kept in the currency's smallest unit (cents): shown in whole units.
                RankerName::Revenue => format!("{} {}", i.product, money(i.score)),
                _ => format!("{} {}", i.product, trim_score(i.score)),
            })
            .collect();
        writeln!(
            out,
            "{title} ({} listed; first read {:.1} ms, cached {:.1} µs): {}",
            page.total,
            first_read.as_secs_f64() * 1e3,
            cached_read.as_secs_f64() * 1e6,
            items.join(", ")
        )?;
    }

    // Restart: a new process rebuilds serving state from the source of truth.
    drop(service);
    let _ = writer_thread.join();
    let started = Instant::now();
    let (restarted, restarted_writer) = RankingService::open(&config.rankings, &config.rankings_storage())?;
    writeln!(
        out,
        "restart: serving state for {} products rebuilt from SQLite in {:.2}s",
        restarted.engine().read().product_count(),
        started.elapsed().as_secs_f64()
    )?;
    drop(restarted);
    let _ = restarted_writer.join();

    let started = Instant::now();
    let progress = verify_progress("verify");
    let report = verify_data_dir(&config.rankings, &config.rankings_storage(), &progress)?;
    progress.finish_and_clear();
    writeln!(
        out,
        "verify: {} rankings ({} ranked items) recomputed from {} raw events in {:.2}s: {}",
        report.rankings,
        report.items,
        report.events,
        started.elapsed().as_secs_f64(),
        if report.ok() {
            "incremental equals batch recompute".to_string()
        } else {
            format!("{} MISMATCHES", report.mismatches.len())
        }
    )?;
    for mismatch in report.mismatches.iter().take(10) {
        writeln!(out, "  {mismatch}")?;
    }

    if flash_sale_members > 0 {
        writeln!(out)?;
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        let flash_dir = data_dir.join("flash-sale");
        runtime.block_on(flash_sale::run_flash_sale_demo(
            &flash_dir,
            flash_sale_members,
            redis,
            out,
        ))?;
        // Issue 12: the order service degrades mid-sale; adaptive admission follows it.
        writeln!(out)?;
        runtime.block_on(adaptive_admission::run_adaptive_admission_demo(
            &data_dir.join("adaptive-sale"),
            redis,
            out,
        ))?;
    }
    Ok(report.ok())
}

/// An amount in the currency's smallest unit as whole units with two decimals and thousands separators:
/// 123456789 → "1,234,567.89".
fn money(cents: f64) -> String {
    let cents = cents.round() as i64;
    let (sign, cents) = if cents < 0 { ("-", -cents) } else { ("", cents) };
    let units = (cents / 100).to_string();
    let mut grouped = String::new();
    for (i, digit) in units.chars().enumerate() {
        if i > 0 && (units.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    format!("{sign}{grouped}.{:02}", cents % 100)
}

fn trim_score(score: f64) -> String {
    if score.fract() == 0.0 {
        format!("{score:.0}")
    } else {
        format!("{score:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::money;

    #[test]
    fn money_is_shown_in_whole_units_with_separators() {
        assert_eq!(money(0.0), "0.00");
        assert_eq!(money(5.0), "0.05");
        assert_eq!(money(3998.0), "39.98");
        assert_eq!(money(123_456_789.0), "1,234,567.89");
        assert_eq!(money(100_000.0), "1,000.00");
        assert_eq!(money(-250.0), "-2.50");
    }
}
