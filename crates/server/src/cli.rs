//! The command line: `rankgate serve | ingest | verify | rebuild | replay | demo | relay | catalog load |
//! queue verify-draw`.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use rankgate_core::event::{split_body, BodyFormat, Event, ParseLimits};
use rankgate_core::ids::ProductId;
use rankgate_core::period::Hour;
use rankgate_store::ranking::recompute::BatchModel;

use crate::app::Application;
use crate::config::{Config, Overrides};
use crate::rankings::{lock_data_dir, IngestCounts, RankingService};
use crate::verify::{read_event_log, verify_data_dir};

/// rankgate: exact, fresh product rankings and a fair waiting room, in one service.
///
/// Runs on embedded defaults (SQLite + an in-process sorted-set engine) with nothing else installed.
#[derive(Debug, Parser)]
#[command(name = "rankgate", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP API (rankings, ingest, waiting room, gate, /metrics, /openapi.json, dashboard)
    Serve {
        #[command(flatten)]
        overrides: Overrides,
    },
    /// Ingest an NDJSON file of events into the data dir, with a progress bar and a summary
    Ingest {
        /// NDJSON file, one event per line ("-" reads standard input)
        file: PathBuf,
        /// Events per transaction
        #[arg(long, default_value_t = 10_000)]
        batch_size: usize,
        #[command(flatten)]
        overrides: Overrides,
    },
    /// Recompute every ranking from the raw event log and compare; exits 1 on any mismatch
    Verify {
        /// Compare with what a running server serves (e.g. http://127.0.0.1:8080); without it, with a
        /// serving state rebuilt from the stored metrics
        #[arg(long)]
        url: Option<String>,
        #[command(flatten)]
        overrides: Overrides,
    },
    /// Rebuild serving state from the source of truth and check it against a batch recompute; with
    /// --redis, also rebuild the Redis serving store into a fresh generation of keys, check it and
    /// switch to it atomically (done by the running instance that publishes, or by this process)
    Rebuild {
        #[command(flatten)]
        overrides: Overrides,
    },
    /// Rebuild the hourly metrics from the raw event log (after a bug fix in the metric path)
    Replay {
        #[command(flatten)]
        overrides: Overrides,
    },
    /// Run the seed lesson's workload end to end and the flash-sale waiting room; print top lists,
    /// verification and timings
    Demo {
        /// Data dir for the demo [default: a fresh temporary directory]
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Workload size relative to the seed lesson (1.0 = 200,000 sales)
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Members queued in the flash-sale scene
        #[arg(long, default_value_t = 100_000)]
        flash_sale_members: usize,
        /// Run the flash-sale scene's waiting room on this Redis (several comma-separated URLs for a
        /// Cluster) instead of the embedded store; its keys get a prefix of their own, deleted at the end
        #[arg(long, value_delimiter = ',')]
        redis: Vec<String>,
    },
    /// Create or upgrade the PostgreSQL schema of --database (also done on every start)
    Migrate {
        #[command(flatten)]
        overrides: Overrides,
    },
    /// Relay a shop's transactional outbox table (PostgreSQL or MySQL/MariaDB) to Kafka or to a
    /// rankgate's POST /v1/events, marking rows published only once acknowledged
    Relay {
        #[command(flatten)]
        args: crate::relay::RelayArgs,
    },
    /// Catalogue enrichment
    Catalog {
        #[command(subcommand)]
        command: CatalogCommand,
    },
    /// Waiting-room tools
    Queue {
        #[command(subcommand)]
        command: QueueCommand,
    },
}

#[derive(Debug, Subcommand)]
enum QueueCommand {
    /// Recompute a scheduled opening's draw: SHA-256(seed) must equal the commitment and the members must
    /// be in HMAC-SHA-256(seed, memberId) order; exits 0 when both hold, 1 when not
    VerifyDraw {
        /// A running rankgate to read the finished draw from (its admin draw read)
        #[arg(long, requires = "queue")]
        url: Option<String>,
        /// The queue, with --url
        #[arg(long)]
        queue: Option<String>,
        /// The admin key for --url (sent as a bearer token)
        #[arg(long, env = "RANKGATE_ADMIN_KEY", hide_env_values = true)]
        key: Option<String>,
        /// The revealed seed, 64 hex digits (without --url)
        #[arg(long, conflicts_with = "url", requires_all = ["commitment", "members"])]
        seed: Option<String>,
        /// The commitment published before the draw, 64 hex digits (without --url)
        #[arg(long, conflicts_with = "url")]
        commitment: Option<String>,
        /// A file of the pre-queue member ids in the published order, one per line (without --url)
        #[arg(long, conflicts_with = "url")]
        members: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum CatalogCommand {
    /// Load a CSV with a header: id (or product_id), name, brand, price, image, and optionally listed
    /// (true/false; an empty cell keeps the stored flag). Rows are merged into the stored entries.
    Load {
        /// The CSV file
        file: PathBuf,
        #[command(flatten)]
        overrides: Overrides,
    },
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(matches!(cli.command, Command::Serve { .. }));
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn init_tracing(serving: bool) {
    let default = if serving { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("RANKGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    runtime_with(None)
}

/// A multi-thread runtime with `workers` worker threads (`None`: one per core).
fn runtime_with(workers: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = workers {
        builder.worker_threads(workers);
    }
    Ok(builder.enable_all().build()?)
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve { overrides } => {
            let config = Config::load(&overrides)?;
            runtime_with(config.worker_threads)?.block_on(async move {
                let app = Application::build(config).await?;
                tracing::info!(address = %app.local_addr(), "rankgate listening");
                // On stdout too, so scripts that asked for port 0 learn the real one.
                println!("rankgate listening on http://{}", app.local_addr());
                use std::io::Write as _;
                let _ = std::io::stdout().flush();
                app.run_until_stopped().await
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Ingest {
            file,
            batch_size,
            overrides,
        } => {
            let config = Config::load(&overrides)?;
            let _lock = lock_data_dir(&config.data_dir)?;
            let (service, _writer) = RankingService::open(&config)?;
            let summary = ingest_file(&service, &file, batch_size, &config, true)?;
            println!(
                "ingested {} lines in {:.2}s ({:.0} events/s): accepted {}, duplicates {}, tooOld {}, rejected {}",
                summary.lines,
                summary.seconds,
                summary.lines as f64 / summary.seconds.max(1e-9),
                summary.counts.accepted,
                summary.counts.duplicates,
                summary.counts.too_old,
                summary.counts.rejected
            );
            for line in summary.first_rejections {
                println!("  rejected {line}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Queue {
            command:
                QueueCommand::VerifyDraw {
                    url,
                    queue,
                    key,
                    seed,
                    commitment,
                    members,
                },
        } => {
            use crate::draw_verify::{
                check_and_report, fetch_published_draw, hex_argument, read_members_file,
            };
            let draw = match (url, seed, commitment, members) {
                (Some(url), _, _, _) => {
                    let queue = queue.context("--queue is required with --url")?;
                    runtime()?.block_on(fetch_published_draw(&url, &queue, key.as_deref()))?
                }
                (None, Some(seed), Some(commitment), Some(members)) => crate::draw_verify::PublishedDraw {
                    seed: rankgate_core::queue::DrawSeed(hex_argument("--seed", &seed)?),
                    commitment: hex_argument("--commitment", &commitment)?,
                    members: read_members_file(&members)?,
                },
                _ => anyhow::bail!("give --url and --queue, or --seed, --commitment and --members"),
            };
            Ok(if check_and_report(&draw) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Verify { url, overrides } => {
            let config = Config::load(&overrides)?;
            let report = match url {
                Some(url) => runtime()?.block_on(crate::verify::verify_server(&config, &url, &|step| {
                    eprintln!("verify: {step}")
                }))?,
                None => verify_data_dir(&config, &|step| eprintln!("verify: {step}"))?,
            };
            print_verify(&report);
            Ok(if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Rebuild { overrides } => {
            let config = Config::load(&overrides)?;
            let _lock = lock_data_dir(&config.data_dir)?;
            let started = Instant::now();
            let (service, _writer) = RankingService::open(&config)?;
            let products = service.engine().read().product_count();
            println!(
                "rebuilt serving state for {products} products in {:.2}s",
                started.elapsed().as_secs_f64()
            );
            let report = verify_data_dir(&config, &|step| eprintln!("rebuild: {step}"))?;
            print_verify(&report);
            if report.ok() && !config.redis.is_empty() {
                let generation = runtime()?.block_on(async {
                    let serving = crate::rankings::serving::Serving::connect(&config).await?;
                    crate::rankings::serving::rebuild_now(
                        &service,
                        &serving,
                        &rankgate_store::clock::SystemClock,
                    )
                    .await
                })?;
                println!("redis serving store rebuilt, checked and switched to generation {generation}");
            }
            drop(service);
            Ok(if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Replay { overrides } => {
            let config = Config::load(&overrides)?;
            let _lock = lock_data_dir(&config.data_dir)?;
            let started = Instant::now();
            let rows = replay_metrics(&config)?;
            println!(
                "replayed the raw event log into {rows} hourly metric rows in {:.2}s",
                started.elapsed().as_secs_f64()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo {
            data_dir,
            scale,
            flash_sale_members,
            redis,
        } => {
            let passed = crate::demo::run_demo(
                data_dir,
                scale,
                flash_sale_members,
                &redis,
                &mut std::io::stdout(),
            )?;
            Ok(if passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Migrate { overrides } => {
            let config = Config::load(&overrides)?;
            let url = config
                .database
                .as_deref()
                .context("migrate needs --database postgres://… (SQLite migrates itself)")?;
            let mut source =
                rankgate_store::ranking::postgres::PostgresSource::connect(url, &config.database_schema)?;
            let applied = source.migrate()?;
            println!(
                "schema `{}` is up to date (applied now: {applied:?})",
                config.database_schema
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Relay { args } => {
            let summary = runtime()?.block_on(crate::relay::run(args))?;
            println!(
                "relayed {} rows in {:.2}s ({:.0} rows/s)",
                summary.rows,
                summary.seconds,
                summary.rows as f64 / summary.seconds.max(1e-9)
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Catalog {
            command: CatalogCommand::Load { file, overrides },
        } => {
            let config = Config::load(&overrides)?;
            let _lock = lock_data_dir(&config.data_dir)?;
            let entries = read_catalog_csv(&file)?;
            let mut source = crate::rankings::open_source(&config)?;
            source.put_catalog(&entries)?;
            println!("loaded {} catalogue entries", entries.len());
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn print_verify(report: &crate::verify::VerifyReport) {
    println!(
        "verify: {} raw events, {} hourly rows, {} rankings, {} ranked items compared",
        report.events, report.hourly_rows, report.rankings, report.items
    );
    if report.ok() {
        println!("verify: OK — every ranking equals the batch recompute");
    } else {
        println!("verify: {} MISMATCHES", report.mismatches.len());
        for mismatch in report.mismatches.iter().take(50) {
            println!("  {mismatch}");
        }
    }
}

/// What `rankgate ingest` did.
#[derive(Debug, Default)]
pub struct IngestSummary {
    /// Lines read.
    pub lines: usize,
    /// Outcomes.
    pub counts: IngestCounts,
    /// Wall time.
    pub seconds: f64,
    /// The first few rejections, with line numbers.
    pub first_rejections: Vec<String>,
}

/// Streams an NDJSON file through the ingest pipeline in batches, validating like `POST /v1/events`.
pub fn ingest_file(
    service: &RankingService,
    file: &std::path::Path,
    batch_size: usize,
    config: &Config,
    show_progress: bool,
) -> anyhow::Result<IngestSummary> {
    let (reader, total_bytes): (Box<dyn Read>, u64) = if file.as_os_str() == "-" {
        (Box::new(std::io::stdin()), 0)
    } else {
        let opened = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
        let size = opened.metadata().map(|m| m.len()).unwrap_or(0);
        (Box::new(opened), size)
    };
    let progress = if show_progress && total_bytes > 0 {
        let bar = ProgressBar::new(total_bytes);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({eta}) {msg}",
            )
            .expect("valid template"),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut reader = BufReader::with_capacity(1 << 20, progress.wrap_read(reader));
    let started = Instant::now();
    let mut summary = IngestSummary::default();
    let mut chunk = Vec::with_capacity(batch_size * 160);
    let mut chunk_lines = 0;
    let mut first_line_of_chunk = 1;
    let mut line = Vec::new();
    // One batch commits on the writer thread while the next one is parsed here.
    let mut in_flight: Option<crate::rankings::writer::PendingOutcomes> = None;
    loop {
        line.clear();
        let read = reader.read_until(b'\n', &mut line)?;
        if read > 0 {
            chunk.extend_from_slice(&line);
            if !line.ends_with(b"\n") {
                chunk.push(b'\n');
            }
            chunk_lines += 1;
        }
        if chunk_lines >= batch_size || (read == 0 && chunk_lines > 0) {
            let pending = submit_chunk(service, &chunk, first_line_of_chunk, config, &mut summary)?;
            if let Some(previous) = in_flight.replace(pending) {
                previous
                    .wait()?
                    .iter()
                    .for_each(|outcome| summary.counts.count(outcome));
            }
            summary.lines += chunk_lines;
            first_line_of_chunk += chunk_lines;
            progress.set_message(format!("{} accepted", summary.counts.accepted));
            chunk.clear();
            chunk_lines = 0;
        }
        if read == 0 {
            break;
        }
    }
    if let Some(last) = in_flight {
        last.wait()?
            .iter()
            .for_each(|outcome| summary.counts.count(outcome));
    }
    progress.finish_and_clear();
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

fn submit_chunk(
    service: &RankingService,
    chunk: &[u8],
    first_line: usize,
    config: &Config,
    summary: &mut IngestSummary,
) -> anyhow::Result<crate::rankings::writer::PendingOutcomes> {
    let now = jiff::Timestamp::now().as_millisecond();
    let limits = ParseLimits {
        max_future_millis: config.max_future_millis,
        ..ParseLimits::at(now)
    };
    let items = split_body(chunk, BodyFormat::Ndjson).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut events: Vec<Event> = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        match item.to_event(&limits) {
            Ok(event) => events.push(event),
            Err(error) => {
                summary.counts.rejected += 1;
                if summary.first_rejections.len() < 10 {
                    summary
                        .first_rejections
                        .push(format!("event {}: {error}", first_line + index));
                }
            }
        }
    }
    service.writer().submit(events, now)
}

/// Recomputes every hourly metric row from the raw event log and replaces the stored rows.
pub fn replay_metrics(config: &Config) -> anyhow::Result<usize> {
    let mut source = crate::rankings::open_source(config)?;
    let policy = source
        .load_policies(rankgate_core::ranker::RankerName::Popular)?
        .map(|p| p.active)
        .unwrap_or_default();
    let events = read_event_log(source.as_mut())?;
    let model = BatchModel::from_accepted(events, config.zone.clone(), policy.weights);
    let rows: Vec<(Hour, ProductId, rankgate_core::metrics::Metrics)> = model.hourly_rows();
    source.replace_metrics(&rows)?;
    Ok(rows.len())
}

fn read_catalog_csv(
    file: &std::path::Path,
) -> anyhow::Result<Vec<(ProductId, rankgate_store::ranking::catalog::CatalogUpdate)>> {
    let mut reader = csv::Reader::from_path(file).with_context(|| format!("opening {}", file.display()))?;
    let headers = reader.headers()?.clone();
    let id_column = headers
        .iter()
        .position(|h| h == "id" || h == "product_id" || h == "productId")
        .context("the CSV needs an `id` (or `product_id`) column")?;
    let mut entries = Vec::new();
    for (line, record) in reader.records().enumerate() {
        let record = record.with_context(|| format!("reading CSV record {}", line + 2))?;
        let product = ProductId::parse(record.get(id_column).unwrap_or(""))
            .map_err(|e| anyhow::anyhow!("line {}: id: {e}", line + 2))?;
        let mut entry = serde_json::Map::new();
        for (i, header) in headers.iter().enumerate() {
            if i == id_column {
                continue;
            }
            let value = record.get(i).unwrap_or("");
            let value = match header {
                "price" if !value.is_empty() => serde_json::Value::from(
                    value
                        .parse::<u64>()
                        .map_err(|_| anyhow::anyhow!("line {}: price: must be an integer", line + 2))?,
                ),
                // An optional column: an empty cell leaves the flag as stored (a new product is listed).
                "listed" if value.is_empty() => continue,
                "listed" => match value.to_ascii_lowercase().as_str() {
                    "true" | "1" | "yes" => serde_json::Value::Bool(true),
                    "false" | "0" | "no" => serde_json::Value::Bool(false),
                    _ => anyhow::bail!(
                        "line {}: listed: must be true or false (or 1/0, yes/no), got {value:?}",
                        line + 2
                    ),
                },
                _ => serde_json::Value::from(value),
            };
            entry.insert(header.to_string(), value);
        }
        let entry = crate::routes::catalog::parse_update(&serde_json::Value::Object(entry))
            .map_err(|e| anyhow::anyhow!("line {}: {e}", line + 2))?;
        entries.push((product, entry));
    }
    Ok(entries)
}
