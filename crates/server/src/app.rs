//! Startup you can test: [`Application::build`] opens the stores, binds the listener (port 0 in tests)
//! and assembles the router; [`Application::run_until_stopped`] serves until shutdown.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::http::Method;
use axum::routing::on;
use axum::{middleware, Router};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::trace::TraceLayer;

use rankgate_core::period::Hour;
use rankgate_store::clock::{Clock, SystemClock};
use rankgate_store::ranking::engine::RankingEngine;

use crate::auth::{require_admin, require_ingest};
use crate::config::Config;
use crate::edge::{self, HttpLimits};
use crate::kafka::consumer::KafkaConsumer;
use crate::rankings::reader::RankingsReader;
use crate::rankings::serving::{self, Serving};
use crate::rankings::top_streams::{TopStreamLimits, TopStreams};
use crate::rankings::{lock_data_dir, RankingService};
use crate::route_table::{self, Endpoint};
use crate::routes::{admin, catalog, events, ops, rankings};
use crate::stream::{StreamConfig, StreamConsumer};
use crate::waiting_room::{self, WaitingRoom};
use crate::webhooks::Webhooks;

/// Everything a handler can reach.
#[derive(Clone)]
pub struct AppState {
    /// Merged configuration.
    pub config: Arc<Config>,
    /// The rankings service.
    pub rankings: Arc<RankingService>,
    /// Answers ranking reads (routing, fallback, staleness, response cache).
    pub reader: Arc<RankingsReader>,
    /// `Cache-Control` of cacheable ranking reads, made once from `cache_max_age_seconds`.
    pub cache_control: axum::http::HeaderValue,
    /// The waiting room.
    pub waiting_room: Arc<WaitingRoom>,
    /// Server clock (a manual one in tests).
    pub clock: Arc<dyn Clock>,
    /// Renders `/metrics`.
    pub prometheus: PrometheusHandle,
    /// Ranking change streams (`GET …/top/events`): one watcher per watched ranking.
    pub top_streams: Arc<TopStreams>,
    /// `[[webhook]]`: change detection and delivery.
    pub webhooks: Arc<Webhooks>,
    /// The Kafka consumer's assignment and lag (`--kafka`), for `/readyz`.
    pub kafka: Option<Arc<crate::kafka::status::KafkaStatus>>,
}

/// The process-wide Prometheus recorder; installed once even when tests start many apps.
pub fn prometheus_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            // Series idle this long are dropped, so those of deleted and forgotten queues do not pile up
            // (defect 4; see waiting_room::telemetry).
            let recorder = PrometheusBuilder::new()
                .idle_timeout(
                    metrics_util::MetricKindMask::ALL,
                    Some(waiting_room::SERIES_IDLE_TIMEOUT),
                )
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (e.g. by an embedding test); keep serving ours.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// Admin routes on the application state (behind the admin token, with the waiting room's admin routes).
const ADMIN_ENDPOINTS: &[Endpoint<AppState>] = &[
    Endpoint::new(Method::GET, "/v1/admin/rankers/{name}", |m| {
        on(m, admin::get_ranker)
    }),
    Endpoint::new(Method::PUT, "/v1/admin/rankers/{name}", |m| {
        on(m, admin::put_ranker)
    }),
    Endpoint::new(Method::POST, "/v1/admin/rankers/{name}/rollback", |m| {
        on(m, admin::rollback_ranker)
    }),
    Endpoint::new(Method::POST, "/v1/admin/rebuild", |m| on(m, admin::rebuild)),
    Endpoint::new(Method::GET, "/v1/admin/webhooks", |m| on(m, admin::get_webhooks)),
    Endpoint::new(Method::POST, "/v1/admin/webhooks/dead/{id}/replay", |m| {
        on(m, admin::replay_webhook_delivery)
    }),
    Endpoint::new(Method::PUT, "/v1/products/{product_id}", |m| {
        on(m, catalog::put_product)
    }),
    Endpoint::new(Method::GET, "/v1/products/{product_id}", |m| {
        on(m, catalog::get_product)
    }),
];

/// Ingest (behind the ingest token).
const INGEST_ENDPOINTS: &[Endpoint<AppState>] = &[Endpoint::new(Method::POST, "/v1/events", |m| {
    on(m, events::post_events)
})];

/// Reads and operations, open to anyone.
const PUBLIC_ENDPOINTS: &[Endpoint<AppState>] = &[
    Endpoint::new(Method::GET, "/v1/categories/{category}/top", |m| {
        on(m, rankings::top)
    }),
    Endpoint::new(Method::GET, "/v1/categories/{category}/top/events", |m| {
        on(m, rankings::top_events)
    }),
    Endpoint::new(Method::GET, "/v1/products/{product_id}/rank", |m| {
        on(m, rankings::rank)
    }),
    Endpoint::new(Method::GET, "/v1/products/{product_id}/ranks", |m| {
        on(m, rankings::ranks)
    }),
    Endpoint::new(Method::POST, "/v1/rankings/sort", |m| on(m, rankings::sort)),
    Endpoint::new(Method::GET, "/healthz", |m| on(m, ops::healthz)),
    Endpoint::new(Method::GET, "/readyz", |m| on(m, ops::readyz)),
    Endpoint::new(Method::GET, "/metrics", |m| on(m, ops::metrics)),
    Endpoint::new(Method::GET, "/openapi.json", |m| on(m, ops::openapi)),
    Endpoint::new(Method::GET, "/", |m| on(m, ops::dashboard)),
    Endpoint::new(Method::GET, "/dashboard", |m| on(m, ops::dashboard)),
];

/// Every (method, path) [`router`] serves, from the same tables it is built from (the `[[gate]]` paths
/// aside: see [`crate::route_table`]). The OpenAPI test compares this with `openapi.json`.
pub fn endpoints() -> Vec<(Method, &'static str)> {
    route_table::methods_and_paths(ADMIN_ENDPOINTS)
        .chain(route_table::methods_and_paths(INGEST_ENDPOINTS))
        .chain(route_table::methods_and_paths(PUBLIC_ENDPOINTS))
        .chain(waiting_room::endpoints())
        .collect()
}

/// The router with every route group, auth and limits, inside the [`edge::Edge`].
pub fn router(state: AppState) -> edge::Edge {
    let admin_routes = route_table::router_of(ADMIN_ENDPOINTS)
        .with_state(state.clone())
        .merge(waiting_room::admin_routes(state.waiting_room.clone()))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_admin));
    let ingest_routes = route_table::router_of(INGEST_ENDPOINTS)
        .route_layer(middleware::from_fn_with_state(state.clone(), require_ingest))
        .with_state(state.clone());
    let public_routes = route_table::router_of(PUBLIC_ENDPOINTS).with_state(state.clone());
    let mut app = Router::new()
        .merge(public_routes)
        .merge(ingest_routes)
        .merge(admin_routes)
        .merge(waiting_room::member_routes(state.waiting_room.clone()));
    if let Some(gate) = waiting_room::gate_routes(state.waiting_room.clone()) {
        app = app.merge(gate);
    }
    let app = app
        .fallback(edge::unknown_route)
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes));
    // The per-request spans and events of `TraceLayer::new_for_http` are DEBUG: leave the layer out unless
    // that level is on (decided once, at start), as it costs ~10% of a cheap request for records nobody
    // receives. Its one louder record, an ERROR line per 5xx answer, goes with it: internal errors are
    // still logged by `ApiError`, while a store outage (503s) shows in `/readyz`, in the background
    // workers' warnings and in the gate's outcome counters rather than as one line per refused request.
    let traced = tracing::enabled!(target: "tower_http::trace", tracing::Level::DEBUG);
    let app = if traced {
        app.layer(TraceLayer::new_for_http())
    } else {
        app
    };
    // The edge wraps the router as one service rather than each route (`Router::layer`): it must see the
    // answers the router makes itself, such as a 405 with its `Allow` header.
    let edge = edge::Edge::new(
        app,
        Duration::from_millis(state.config.http.body_timeout_millis.max(1)),
        state.config.max_body_bytes,
    );
    // Rank reads skip the router (see `edge`), unless it is traced: then every request must pass the layer.
    if traced {
        edge
    } else {
        edge.with_direct_reads(state)
    }
}

/// A built, bound, not yet serving rankgate.
pub struct Application {
    listener: TcpListener,
    router: edge::Edge,
    state: AppState,
    shutdown: CancellationToken,
    workers: Vec<tokio::task::JoinHandle<()>>,
    _data_dir_lock: std::fs::File,
}

impl Application {
    /// Opens the embedded stores under `config.data_dir`, restores their state, and binds `config.listen`.
    pub async fn build(config: Config) -> anyhow::Result<Application> {
        Application::build_with_clock(config, Arc::new(SystemClock)).await
    }

    /// [`Application::build`] with a chosen clock.
    pub async fn build_with_clock(config: Config, clock: Arc<dyn Clock>) -> anyhow::Result<Application> {
        let lock = lock_data_dir(&config.data_dir)?;
        let started = std::time::Instant::now();
        let rankings_config = config.clone();
        let (rankings, _writer_thread) =
            tokio::task::spawn_blocking(move || RankingService::open(&rankings_config)).await??;
        // `trending` ends running periods at the current hour of this server's clock.
        rankings
            .engine()
            .write()
            .advance_to_hour(Hour::from_millis(clock.now_millis()));
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "rankings restored from the source of truth"
        );
        let waiting_room = if config.redis.is_empty() {
            WaitingRoom::open_embedded(&config.data_dir, config.waiting_room.clone(), clock.clone()).await?
        } else {
            WaitingRoom::open_redis(
                &config.redis,
                &config.redis_prefix,
                config.waiting_room.clone(),
                clock.clone(),
            )
            .await
            .context("opening the waiting room on Redis (check --redis)")?
        };
        if !config.redis.is_empty() {
            let serving = Serving::connect(&config)
                .await
                .context("opening the rankings serving store on Redis (check --redis)")?;
            rankings.attach_serving(serving);
        }
        let listener = TcpListener::bind(config.listen).await.with_context(|| {
            format!(
                "binding {}; is another process using that address?",
                config.listen
            )
        })?;
        let reader = Arc::new(RankingsReader::new(
            rankings.clone(),
            clock.clone(),
            config.zone.clone(),
            config.freshness_millis,
        ));
        let shutdown = CancellationToken::new();
        let top_streams = Arc::new(TopStreams::new(
            reader.clone(),
            clock.clone(),
            config.zone.clone(),
            config.metric_retention_millis,
            TopStreamLimits {
                max_streams: config.top_streams.max_streams,
                buffer: config.top_streams.buffer,
                heartbeat: Duration::from_millis(config.top_streams.heartbeat_millis),
                freshness: Duration::from_millis(config.freshness_millis.max(1)),
            },
            shutdown.clone(),
        ));
        let webhooks = Arc::new(open_webhooks(&config, &reader, &waiting_room, &clock).await?);
        let cache_control = crate::routes::rankings::cache_control(config.cache_max_age_seconds);
        let kafka = match &config.kafka {
            Some(kafka) => Some(
                KafkaConsumer::connect(
                    kafka.clone(),
                    rankings.clone(),
                    clock.clone(),
                    config.max_future_millis,
                )
                .await?,
            ),
            None => None,
        };
        let state = AppState {
            config: Arc::new(config),
            rankings,
            reader,
            cache_control,
            waiting_room,
            clock,
            prometheus: prometheus_handle(),
            top_streams,
            webhooks,
            kafka: kafka.as_ref().map(KafkaConsumer::status),
        };
        let mut workers = state.waiting_room.spawn_workers(shutdown.clone());
        workers.push(tokio::spawn(run_refresher_until_stopped(
            state.clone(),
            shutdown.clone(),
        )));
        workers.push(tokio::spawn(run_retention_until_stopped(
            state.clone(),
            shutdown.clone(),
        )));
        // Keeps the engine on the shared policy state (and resumes a build a crash interrupted).
        workers.push(tokio::spawn(
            state.rankings.clone().run_policy_driver(shutdown.clone()),
        ));
        if let Some(serving) = state.rankings.serving() {
            workers.push(tokio::spawn(serving::run_until_stopped(
                state.rankings.clone(),
                serving.clone(),
                state.clock.clone(),
                state.config.freshness_millis,
                shutdown.clone(),
            )));
        }
        if state.config.database.is_some() {
            workers.push(tokio::spawn(run_follower_until_stopped(
                state.clone(),
                shutdown.clone(),
            )));
        }
        if !state.webhooks.is_empty() {
            workers.extend(state.webhooks.spawn_workers(shutdown.clone()));
        }
        if let Some(url) = &state.config.stream {
            let consumer = StreamConsumer::connect(
                StreamConfig {
                    min_idle: Duration::from_millis(state.config.stream_claim_idle_millis),
                    ..StreamConfig::from_url(url)?
                },
                state.rankings.clone(),
                state.clock.clone(),
                state.config.max_future_millis,
            )
            .await?;
            workers.push(tokio::spawn(consumer.run_until_stopped(shutdown.clone())));
        }
        if let Some(consumer) = kafka {
            workers.push(tokio::spawn(consumer.run_until_stopped(shutdown.clone())));
        }
        Ok(Application {
            listener,
            router: router(state.clone()),
            state,
            shutdown,
            workers,
            _data_dir_lock: lock,
        })
    }

    /// The bound address (the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener has an address")
    }

    /// The shared state, for tests and tools that run in process.
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// A token that stops the server when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Serves until the shutdown token is cancelled or SIGTERM / Ctrl-C arrives.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let shutdown = self.shutdown.clone();
        let signal_shutdown = shutdown.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            signal_shutdown.cancel();
        });
        let http = &self.state.config.http;
        let limits = HttpLimits {
            header_timeout: Duration::from_millis(http.header_timeout_millis.max(1)),
            body_timeout: Duration::from_millis(http.body_timeout_millis.max(1)),
            max_connections: http.max_connections.max(1),
        };
        edge::serve_until_stopped(self.listener, self.router, limits, shutdown).await;
        for worker in self.workers {
            let _ = worker.await;
        }
        self.state.rankings.barrier().await?;
        Ok(())
    }
}

/// The webhooks of `config`: numbered under a lease in Redis when instances share one (so each change
/// is delivered once, not once per instance), in memory otherwise; delivered through the waiting room's
/// job store (embedded or Redis).
async fn open_webhooks(
    config: &Config,
    reader: &Arc<RankingsReader>,
    waiting_room: &Arc<WaitingRoom>,
    clock: &Arc<dyn Clock>,
) -> anyhow::Result<Webhooks> {
    use rankgate_store::watch_ledger::{EmbeddedWatchLedger, RedisWatchLedger, WatchLedger};
    let ledger: Arc<dyn WatchLedger> = if config.redis.is_empty() || config.webhooks.is_empty() {
        if config.database.is_some() && !config.webhooks.is_empty() {
            tracing::warn!(
                "[[webhook]] with a shared database but no --redis: each instance detects and delivers \
                 changes on its own; give --redis to deliver each change once across instances"
            );
        }
        Arc::new(
            EmbeddedWatchLedger::persisted(config.data_dir.join("webhooks.json"))
                .context("opening the webhook ledger (webhooks.json in the data dir)")?,
        )
    } else {
        Arc::new(
            RedisWatchLedger::connect(&config.redis, &config.redis_prefix)
                .await
                .context("opening the webhook ledger on Redis (check --redis)")?,
        )
    };
    Webhooks::new(
        config.webhooks.clone(),
        reader.clone(),
        ledger,
        waiting_room.jobs().clone(),
        clock.clone(),
        config.zone.clone(),
        config.metric_retention_millis,
        Duration::from_millis(config.freshness_millis.max(1)),
    )
}

/// Applies pending changes to every cached ranking well inside the freshness bound, so most reads find
/// their span clean and need only the shared lock. Also moves the engine to the clock's hour: when the
/// hour turns, the running periods' spans (whose `trending` end hour moved) are dropped and built again
/// here, in steps, so reads rarely have to wait for one.
async fn run_refresher_until_stopped(state: AppState, shutdown: CancellationToken) {
    let period = Duration::from_millis((state.config.freshness_millis / 4).max(10));
    let mut ticker = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let engine = state.rankings.engine().clone();
        let now = Hour::from_millis(state.clock.now_millis());
        let _ = tokio::task::spawn_blocking(move || {
            let dropped = engine.write().advance_to_hour(now);
            for query in &dropped {
                RankingEngine::build_span_in_steps(&engine, query);
            }
            engine.write().flush_all();
        })
        .await;
    }
}

/// With a shared source of truth (PostgreSQL), applies what other instances committed, well inside the
/// freshness bound, so reads from every instance agree.
async fn run_follower_until_stopped(state: AppState, shutdown: CancellationToken) {
    let mut ticker =
        tokio::time::interval(Duration::from_millis((state.config.freshness_millis / 4).max(10)));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        match state.rankings.writer().run(|ingestor| ingestor.follow()).await {
            // Metrics and listing flags are applied by `follow`; a newer policy state wakes the policy
            // driver, and catalogue entries replace the served ones.
            Ok(Ok(followed)) => {
                state.rankings.observe_policies(&followed.policies);
                state.rankings.observe_catalog(&followed.catalog);
            }
            Ok(Err(error)) => tracing::warn!(error = %error, "following other instances failed; will retry"),
            Err(error) => tracing::warn!(error = format!("{error:#}"), "the writer has stopped"),
        }
    }
}

/// Applies retention once a minute, relative to the watermark.
async fn run_retention_until_stopped(state: AppState, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        match state
            .rankings
            .apply_retention(
                state.config.event_retention_millis,
                state.config.metric_retention_millis,
                state.clock.now_millis(),
            )
            .await
        {
            Ok(0) => {}
            Ok(forgotten) => tracing::info!(forgotten, "retention dropped old raw events"),
            Err(error) => tracing::warn!(error = format!("{error:#}"), "retention failed; will retry"),
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}
