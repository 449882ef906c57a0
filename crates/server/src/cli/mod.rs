//! The command line: `rankgate serve | ingest | verify | rebuild | replay | demo | relay | catalog load |
//! queue verify-draw`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};

pub mod options;

use crate::app::{lock_data_dir, Application};
use crate::config::{Config, Overrides};
use crate::rankings::catalog::read_catalog_csv;
use crate::rankings::ingest::file::ingest_file;
use crate::rankings::replay::replay_metrics;
use crate::rankings::verify::{verify_data_dir, verify_progress};
use crate::rankings::RankingService;
use options::{RebuildOptions, ServeOptions, StoreOptions};

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
        options: ServeOptions,
    },
    /// Ingest an NDJSON file of events into the data dir, with a progress bar and a summary
    Ingest {
        /// NDJSON file, one event per line ("-" reads standard input)
        file: PathBuf,
        /// Events per transaction
        #[arg(long, default_value_t = 10_000)]
        batch_size: usize,
        #[command(flatten)]
        options: StoreOptions,
    },
    /// Recompute every ranking from the raw event log and compare; exits 1 on any mismatch
    Verify {
        /// Compare with what a running server serves (e.g. http://127.0.0.1:8080); without it, with a
        /// serving state rebuilt from the stored metrics
        #[arg(long)]
        url: Option<String>,
        #[command(flatten)]
        options: StoreOptions,
    },
    /// Rebuild serving state from the source of truth and check it against a batch recompute; with
    /// --redis, also rebuild the Redis serving store into a fresh generation of keys, check it and
    /// switch to it atomically (done by the running instance that publishes, or by this process)
    Rebuild {
        #[command(flatten)]
        options: RebuildOptions,
    },
    /// Rebuild the hourly metrics from the raw event log (after a bug fix in the metric path)
    Replay {
        #[command(flatten)]
        options: StoreOptions,
    },
    /// Run a generated shop's two weeks of events end to end, then a flash-sale waiting room; print top
    /// lists, verification and timings
    Demo {
        /// Data dir for the demo [default: a fresh temporary directory]
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Workload size (1.0 = 200,000 sales and 892,000 events in all)
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
        options: StoreOptions,
    },
    /// Relay a shop's transactional outbox table (PostgreSQL or MySQL/MariaDB) to Kafka or to a
    /// rankgate's POST /v1/events, marking rows published only once acknowledged
    Relay {
        #[command(flatten)]
        args: crate::rankings::relay::RelayArgs,
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
    /// Recompute a scheduled opening's draw: SHA-256(seed) must equal drawCommitment, the entrant list must
    /// hash to entrantsCommitment, the beacon must be the expected one, and the entrants must be in
    /// HMAC-SHA-256(drawKey, memberId) order, drawKey = HMAC-SHA-256(seed, entrantsCommitment ‖ beacon);
    /// exits 0 when all hold, 1 when not
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
        #[arg(long, conflicts_with = "url", requires_all = ["commitment", "entrants_commitment", "members"])]
        seed: Option<String>,
        /// The commitment published before the draw, 64 hex digits (without --url)
        #[arg(long, conflicts_with = "url")]
        commitment: Option<String>,
        /// The entrants commitment published at the close, 64 hex digits (without --url)
        #[arg(long, conflicts_with = "url")]
        entrants_commitment: Option<String>,
        /// A file of the entrants' member ids in the published order, one per line (without --url)
        #[arg(long, conflicts_with = "url")]
        members: Option<PathBuf>,
        /// The beacon round's value in hex, as fetched from the beacon network itself: the draw must have
        /// used exactly this (with --url: must equal the published beacon; without: the beacon to use,
        /// empty when the draw named no round)
        #[arg(long)]
        beacon: Option<String>,
        /// The beacon round the draw must name (with --url)
        #[arg(long, requires = "url")]
        beacon_round: Option<u64>,
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
        options: StoreOptions,
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
    // Colour only for a person at a terminal: a log file or a collector gets plain text (and NO_COLOR, see
    // no-color.org, turns it off there too).
    use std::io::IsTerminal as _;
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
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
        Command::Serve { options } => {
            let config = Config::load(&options.into_overrides()?)?;
            let admin_loopback_only = config.admin_keys.is_empty();
            runtime_with(config.worker_threads)?.block_on(async move {
                let app = Application::build(config).await?;
                tracing::info!(address = %app.local_addr(), "rankgate listening");
                if admin_loopback_only {
                    tracing::warn!("{}", crate::http::auth::ADMIN_LOOPBACK_ONLY);
                }
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
            options,
        } => {
            let config = Config::load(&options.into())?;
            let _lock = lock_data_dir(&config.data_dir)?;
            let (service, _writer) = RankingService::open(&config.rankings, &config.rankings_storage())?;
            let summary = ingest_file(&service, &file, batch_size, &config.rankings, true)?;
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
                    entrants_commitment,
                    members,
                    beacon,
                    beacon_round,
                },
        } => {
            use crate::waiting_room::draw_verify::{
                beacon_argument, check_and_report, fetch_published_draw, hex_argument, read_members_file,
                Expectations, PublishedDraw,
            };
            let beacon = beacon.map(|raw| beacon_argument("--beacon", &raw)).transpose()?;
            let published = match (url, seed, commitment, entrants_commitment, members) {
                (Some(url), _, _, _, _) => {
                    let queue = queue.context("--queue is required with --url")?;
                    runtime()?.block_on(fetch_published_draw(&url, &queue, key.as_deref()))?
                }
                (None, Some(seed), Some(commitment), Some(entrants_commitment), Some(members)) => {
                    PublishedDraw {
                        draw: rankgate_core::queue::draw::RevealedDraw {
                            seed: rankgate_core::queue::DrawSeed(hex_argument("--seed", &seed)?),
                            commitment: hex_argument("--commitment", &commitment)?,
                            entrants_commitment: Some(hex_argument(
                                "--entrants-commitment",
                                &entrants_commitment,
                            )?),
                            beacon: beacon.clone().unwrap_or_default(),
                            order: read_members_file(&members)?,
                        },
                        beacon_round: None,
                    }
                }
                _ => anyhow::bail!(
                    "give --url and --queue, or --seed, --commitment, --entrants-commitment and --members \
                     (and --beacon when the draw named a beacon round)"
                ),
            };
            let expected = Expectations { beacon, beacon_round };
            Ok(if check_and_report(&published, &expected) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Verify { url, options } => {
            let config = Config::load(&Overrides::from(options))?;
            let progress = verify_progress("verify");
            let report = match url {
                Some(url) => runtime()?.block_on(crate::rankings::verify::verify_server(
                    &config.rankings,
                    &config.rankings_storage(),
                    &url,
                    &progress,
                ))?,
                None => verify_data_dir(&config.rankings, &config.rankings_storage(), &progress)?,
            };
            progress.finish_and_clear();
            print_verify(&report);
            Ok(if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Rebuild { options } => {
            let config = Config::load(&Overrides::from(options))?;
            let _lock = lock_data_dir(&config.data_dir)?;
            let started = Instant::now();
            let (service, _writer) = RankingService::open(&config.rankings, &config.rankings_storage())?;
            let products = service.engine().read().product_count();
            println!(
                "rebuilt serving state for {products} products in {:.2}s",
                started.elapsed().as_secs_f64()
            );
            let progress = verify_progress("rebuild");
            let report = verify_data_dir(&config.rankings, &config.rankings_storage(), &progress)?;
            progress.finish_and_clear();
            print_verify(&report);
            if report.ok() && !config.redis.is_empty() {
                let generation = runtime()?.block_on(async {
                    let serving = crate::rankings::serving::Serving::connect(
                        &config.rankings,
                        &config.rankings_storage(),
                    )
                    .await?;
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
        Command::Replay { options } => {
            let config = Config::load(&Overrides::from(options))?;
            let _lock = lock_data_dir(&config.data_dir)?;
            let started = Instant::now();
            let rows = replay_metrics(&config.rankings, &config.rankings_storage())?;
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
                &rankgate_store::redis_sentinel::join_split_sentinel_url(redis),
                &mut std::io::stdout(),
            )?;
            Ok(if passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Migrate { options } => {
            let config = Config::load(&Overrides::from(options))?;
            let url = config
                .rankings
                .database
                .as_deref()
                .context("migrate needs --database postgres://… (SQLite migrates itself)")?;
            let mut source = rankgate_store::ranking::postgres::PostgresSource::connect(
                url,
                &config.rankings.database_schema,
            )?;
            let applied = source.migrate()?;
            println!(
                "schema `{}` is up to date (applied now: {applied:?})",
                config.rankings.database_schema
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Relay { args } => {
            let summary = runtime()?.block_on(crate::rankings::relay::run(args))?;
            println!(
                "relayed {} rows in {:.2}s ({:.0} rows/s)",
                summary.rows,
                summary.seconds,
                summary.rows as f64 / summary.seconds.max(1e-9)
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Catalog {
            command: CatalogCommand::Load { file, options },
        } => {
            let config = Config::load(&options.into())?;
            let _lock = lock_data_dir(&config.data_dir)?;
            let entries = read_catalog_csv(&file)?;
            let mut source = crate::rankings::open_source(&config.rankings, &config.rankings_storage())?;
            source.put_catalog(&entries)?;
            println!("loaded {} catalogue entries", entries.len());
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn print_verify(report: &crate::rankings::verify::VerifyReport) {
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
