//! `rankgate verify`: recompute every ranking from the raw event log as a plain batch, and compare it with
//! what the service serves — the same products, the same order, the same metrics and scores.
//!
//! Two comparisons are made. The stored hourly metric rows must equal the raw log's sums (this checks
//! the ingest path and its transactions), and every ranking the engine builds from those rows must
//! equal the batch recompute (this checks the engine, carry chains included). Optionally the rankings of
//! a running server are fetched over HTTP and compared too.

use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use parking_lot::RwLock;

use rankgate_core::event::{Event, ParseLimits};
use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::period::{Hour, PeriodKey, PeriodKind, Span, WindowLen};
use rankgate_core::ranker::{Policy, RankerName};
use rankgate_store::clock::{Clock, SystemClock};
use rankgate_store::ranking::engine::{EngineConfig, RankedItem, RankingEngine, RankingQuery};
use rankgate_store::ranking::ingest::{IngestConfig, Ingestor};
use rankgate_store::ranking::recompute::BatchModel;
use rankgate_store::ranking::source::SourceOfTruth;

use super::config::RankingsConfig;
use super::{open_source, Storage};

/// The bar a verify run moves: the stage as its message, then one step per ranking compared. It draws on
/// standard error when that is a terminal and is hidden otherwise (a log or a pipe gets the summary only).
pub fn verify_progress(prefix: &'static str) -> ProgressBar {
    use std::io::IsTerminal as _;
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0).with_prefix(prefix);
    bar.set_style(
        ProgressStyle::with_template("{prefix}: [{elapsed_precise}] {msg} {wide_bar} {pos}/{len} ({eta})")
            .expect("valid template"),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

/// What a verification found.
#[derive(Debug, Default)]
pub struct VerifyReport {
    /// Raw events read from the log.
    pub events: usize,
    /// Hourly metric rows compared.
    pub hourly_rows: usize,
    /// Rankings compared.
    pub rankings: usize,
    /// Listed products compared across all rankings.
    pub items: usize,
    /// Human-readable differences; empty means everything matched.
    pub mismatches: Vec<String>,
}

impl VerifyReport {
    /// True when nothing differed.
    pub fn ok(&self) -> bool {
        self.mismatches.is_empty()
    }
}

/// Compares two full rankings, recording at most a few differences per ranking.
pub fn compare_rankings(
    label: &str,
    served: &[RankedItem],
    expected: &[RankedItem],
    mismatches: &mut Vec<String>,
) {
    if served.len() != expected.len() {
        mismatches.push(format!(
            "{label}: {} products served, {} expected",
            served.len(),
            expected.len()
        ));
    }
    let mut reported = 0;
    for (s, e) in served.iter().zip(expected) {
        let same = s.product == e.product
            && s.rank == e.rank
            && s.metrics == e.metrics
            && s.score.to_bits() == e.score.to_bits()
            && s.carry.to_bits() == e.carry.to_bits();
        if !same {
            mismatches.push(format!("{label}: rank {} served {s:?}, expected {e:?}", e.rank));
            reported += 1;
            if reported >= 3 {
                break;
            }
        }
    }
}

/// The spans verified: every day, ISO week, month and year touched by the log, hourly periods of the last
/// day, and each sliding window ending at the newest hour.
pub fn spans_to_verify(range: std::ops::Range<Hour>, zone: &rankgate_core::period::Zone) -> Vec<Span> {
    let mut spans = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut add = |span: Span| {
        if seen.insert(span) {
            spans.push(span);
        }
    };
    let mut hour = range.start;
    while hour < range.end {
        for kind in [
            PeriodKind::Daily,
            PeriodKind::Weekly,
            PeriodKind::Monthly,
            PeriodKind::Yearly,
        ] {
            add(Span::Period(PeriodKey::containing(kind, hour, zone)));
        }
        hour = hour.plus(1);
    }
    let last = Hour(range.end.0 - 1);
    for back in 0..24 {
        add(Span::Period(PeriodKey::containing(
            PeriodKind::Hourly,
            last.plus(-back),
            zone,
        )));
    }
    for len in [WindowLen::H1, WindowLen::D1, WindowLen::D7, WindowLen::D30] {
        add(Span::Window { len, end: last });
    }
    spans
}

/// `all` and every category the raw log names: the categories every ranking is verified in.
fn categories_of(model: &BatchModel) -> Vec<CategoryOrAll> {
    std::iter::once(CategoryOrAll::All)
        .chain(model.categories().into_iter().map(CategoryOrAll::Category))
        .collect()
}

/// The products the stored catalogue delists: the recompute leaves them out of every ranking, as the
/// service does.
fn delisted_products(source: &mut dyn SourceOfTruth) -> anyhow::Result<Vec<ProductId>> {
    Ok(source
        .load_catalog()?
        .into_iter()
        .filter(|(_, entry)| !entry.listed)
        .map(|(product, _)| product)
        .collect())
}

/// Reads every raw event of the log.
pub fn read_event_log(source: &mut dyn SourceOfTruth) -> anyhow::Result<Vec<Event>> {
    // Stored events were validated on arrival; don't re-apply the future check against today's clock.
    let limits = ParseLimits::for_stored_events();
    let mut events = Vec::new();
    let mut failure = None;
    source.scan_event_log(&mut |_, body| match serde_json::from_slice(body) {
        Ok(value) => match Event::from_json(&value, &limits) {
            Ok(event) => events.push(event),
            Err(error) => failure = Some(format!("stored event no longer parses: {error}")),
        },
        Err(error) => failure = Some(format!("stored event is not JSON: {error}")),
    })?;
    if let Some(failure) = failure {
        anyhow::bail!(failure);
    }
    Ok(events)
}

/// Verifies the data dir of `config` (a running server may keep serving meanwhile: SQLite WAL readers
/// do not block the writer).
pub fn verify_data_dir(
    config: &RankingsConfig,
    storage: &Storage,
    progress: &ProgressBar,
) -> anyhow::Result<VerifyReport> {
    let mut source = open_source(config, storage)?;
    let policy = active_policy(source.as_mut(), RankerName::Popular)?;
    let trending = active_policy(source.as_mut(), RankerName::Trending)?;
    let now = Hour::from_millis(SystemClock.now_millis());
    progress.set_message("reading the raw event log");
    let events = read_event_log(source.as_mut())?;
    let delisted = delisted_products(source.as_mut())?;
    let mut report = VerifyReport {
        events: events.len(),
        ..VerifyReport::default()
    };
    let model = BatchModel::from_accepted(events, config.zone.clone(), policy.weights)
        .with_trending(trending.weights)
        .at_hour(now)
        .with_delisted(delisted);

    progress.set_message("loading serving state from the stored metrics");
    let mut engine = RankingEngine::new(
        EngineConfig {
            zone: config.zone.clone(),
            max_cached_members: usize::MAX,
        },
        policy,
    );
    engine.set_trending_policy(trending);
    engine.advance_to_hour(now);
    let engine = Arc::new(RwLock::new(engine));
    let _ingestor = Ingestor::open(source, engine.clone(), IngestConfig::default())?;
    let mut engine = engine.write();

    progress.set_message("comparing hourly metric rows with the raw log");
    let expected_rows = model.hourly_rows();
    let log_start = expected_rows.first().map(|r| r.0);
    let mut stored_rows: Vec<_> = engine
        .hourly_rows()
        .filter(|(hour, _, m)| log_start.is_some_and(|start| *hour >= start) && !m.is_zero())
        .map(|(hour, product, m)| (hour, product.clone(), *m))
        .collect();
    stored_rows.sort_by(|a, b| (a.0, a.1.as_str()).cmp(&(b.0, b.1.as_str())));
    report.hourly_rows = expected_rows.len();
    if stored_rows != expected_rows {
        let first_difference = stored_rows.iter().zip(&expected_rows).find(|(a, b)| a != b);
        report.mismatches.push(format!(
            "hourly metrics: {} stored rows vs {} from the raw log; first difference: {first_difference:?}",
            stored_rows.len(),
            expected_rows.len()
        ));
    }

    let Some(range) = model.hour_range() else {
        return Ok(report);
    };
    let spans = spans_to_verify(range, &config.zone);
    let categories = categories_of(&model);
    let total = spans.len() * categories.len() * RankerName::ALL.len();
    progress.set_message("comparing rankings with the batch recompute");
    progress.set_length(total as u64);
    for span in &spans {
        for category in &categories {
            for ranker in RankerName::ALL {
                let query = RankingQuery {
                    ranker,
                    category: category.clone(),
                    span: *span,
                };
                let served = engine.full_ranking(&query);
                let expected = model.ranking(ranker, category, span);
                report.rankings += 1;
                progress.inc(1);
                report.items += expected.len();
                compare_rankings(
                    &format!("{ranker} {category} {span:?}"),
                    &served,
                    &expected,
                    &mut report.mismatches,
                );
            }
        }
        // Spans are compared one at a time; drop them so memory stays flat on big logs.
        engine.evict_cached_spans();
    }
    Ok(report)
}

/// `ranker`'s active policy in the source of truth (version 1 when it was never configured).
fn active_policy(source: &mut dyn SourceOfTruth, ranker: RankerName) -> anyhow::Result<Policy> {
    Ok(source
        .load_policies(ranker)?
        .map_or_else(|| Policy::initial_for(ranker), |state| state.active))
}

/// The query string that asks the HTTP API for `span`.
fn span_query(span: &Span, zone: &rankgate_core::period::Zone) -> String {
    match span {
        Span::Period(key) => format!("period={}&at={key}", key.kind().as_str()),
        Span::Window { len, end } => {
            format!(
                "window={}&at={}",
                len.as_str(),
                rankgate_core::period::format_hour_key(*end, zone)
            )
        }
    }
}

/// Compares what a running server at `base_url` serves with the batch recompute of the raw event log
/// (up to the API's deepest page, rank 10,000). The server may keep ingesting meanwhile; run it on a
/// quiet server for an exact answer.
pub async fn verify_server(
    config: &RankingsConfig,
    storage: &Storage,
    base_url: &str,
    progress: &ProgressBar,
) -> anyhow::Result<VerifyReport> {
    let (blocking_config, storage) = (config.clone(), storage.clone());
    // The blocking stores (the PostgreSQL client has its own runtime) are read off the async runtime.
    type Loaded = (Vec<Event>, Policy, Policy, Vec<ProductId>);
    let (events, policy, trending, delisted) =
        tokio::task::spawn_blocking(move || -> anyhow::Result<Loaded> {
            let mut source = open_source(&blocking_config, &storage)?;
            let policy = active_policy(source.as_mut(), RankerName::Popular)?;
            let trending = active_policy(source.as_mut(), RankerName::Trending)?;
            let events = read_event_log(source.as_mut())?;
            Ok((events, policy, trending, delisted_products(source.as_mut())?))
        })
        .await??;
    let mut report = VerifyReport {
        events: events.len(),
        ..VerifyReport::default()
    };
    // The server's `trending` ends running periods at its clock's hour: verify near an hour's turn
    // may see the other side of it.
    let model = BatchModel::from_accepted(events, config.zone.clone(), policy.weights)
        .with_trending(trending.weights)
        .at_hour(Hour::from_millis(SystemClock.now_millis()))
        .with_delisted(delisted);
    let Some(range) = model.hour_range() else {
        return Ok(report);
    };
    let spans = spans_to_verify(range, &config.zone);
    let categories = categories_of(&model);
    let total = spans.len() * categories.len() * RankerName::ALL.len();
    progress.set_message("comparing served rankings with the batch recompute");
    progress.set_length(total as u64);
    let client = reqwest::Client::new();
    let base = base_url.trim_end_matches('/');
    for span in &spans {
        for category in &categories {
            for ranker in RankerName::ALL {
                let expected = model.ranking(ranker, category, span);
                let mut served = Vec::new();
                let mut offset = 0;
                while offset < 10_000 {
                    let limit = 1000.min(10_000 - offset);
                    let url = format!(
                        "{base}/v1/categories/{category}/top?ranker={ranker}&{}&limit={limit}&offset={offset}",
                        span_query(span, &config.zone)
                    );
                    let page: serde_json::Value =
                        client.get(&url).send().await?.error_for_status()?.json().await?;
                    let items = page["items"].as_array().cloned().unwrap_or_default();
                    let count = items.len();
                    for item in items {
                        served.push(served_item(&item)?);
                    }
                    if count < limit {
                        break;
                    }
                    offset += limit;
                }
                let expected: Vec<RankedItem> = expected.into_iter().take(10_000).collect();
                report.rankings += 1;
                progress.inc(1);
                report.items += expected.len();
                compare_rankings(
                    &format!("{ranker} {category} {span:?}"),
                    &served,
                    &expected,
                    &mut report.mismatches,
                );
            }
        }
    }
    Ok(report)
}

fn served_item(item: &serde_json::Value) -> anyhow::Result<RankedItem> {
    let number = |value: &serde_json::Value| value.as_i64().unwrap_or_default();
    let metrics = &item["metrics"];
    Ok(RankedItem {
        rank: item["rank"].as_u64().unwrap_or_default() as usize,
        product: rankgate_core::ids::ProductId::parse(item["productId"].as_str().unwrap_or_default())
            .map_err(|e| anyhow::anyhow!("served productId: {e}"))?,
        score: item["score"].as_f64().unwrap_or(f64::NAN),
        metrics: rankgate_core::metrics::Metrics {
            views: number(&metrics["views"]),
            likes: number(&metrics["likes"]),
            units: number(&metrics["units"]),
            sales: number(&metrics["sales"]),
        },
        carry: item["carry"].as_f64().unwrap_or(f64::NAN),
    })
}
