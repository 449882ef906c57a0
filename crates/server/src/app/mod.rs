//! The application: the two products composed into one service, and startup you can test.
//!
//! [`Application::build`] binds the listener (port 0 in tests) first, then locks the data directory, opens
//! the waiting room and the rankings (each restoring its state) and assembles the router inside the
//! [`Edge`](crate::http::edge::Edge); [`Application::run_until_stopped`] serves until shutdown.
//!
//! - this module: the composition, and the route table of the whole service ([`endpoints`]);
//! - [`direct`]: the fast path's routes, the rank read and the member's poll and entry;
//! - [`ops`]: `/healthz`, `/metrics` and `/openapi.json`, which report on both products;
//! - [`readiness`]: `/readyz`, every dependency's state and the probes behind it;
//! - [`dashboard`]: the dashboard page (`/`, `/dashboard`) and its history of the last hour, sampled
//!   each second (`GET /v1/admin/dashboard/history`).
//!
//! This is the one place that knows both products: the rankings' webhooks deliver through the waiting
//! room's job store, handed over here.

pub mod dashboard;
pub mod direct;
pub mod ops;
pub mod readiness;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::http::Method;
use axum::routing::on;
use axum::{middleware, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::trace::TraceLayer;

use rankgate_store::clock::{Clock, SystemClock};

use crate::config::Config;
use crate::http::auth::{require_admin, require_ingest, AccessKeys};
use crate::http::edge::{self, Edge, HttpLimits};
use crate::http::route_table::{self, Endpoint};
use crate::rankings::Rankings;
use crate::telemetry::http_requests;
use crate::waiting_room::{self, WaitingRoom};
use direct::DirectRoutesOfApp;

/// What the operations endpoints reach, and what tests and tools running in process inspect.
#[derive(Clone)]
pub struct AppState {
    /// Merged configuration.
    pub config: Arc<Config>,
    /// The rankings.
    pub rankings: Rankings,
    /// The waiting room.
    pub waiting_room: Arc<WaitingRoom>,
    /// Server clock (a manual one in tests).
    pub clock: Arc<dyn Clock>,
    /// Renders `/metrics`.
    pub prometheus: PrometheusHandle,
    /// The dashboard's history, sampled each second ([`dashboard::spawn_sampler`]).
    pub dashboard: Arc<dashboard::History>,
    /// The queue store's and serving's health for `/readyz` (see [`readiness`]).
    pub dependencies: Arc<readiness::Dependencies>,
}

/// Operations endpoints, open to anyone.
const OPS_ENDPOINTS: &[Endpoint<AppState>] = &[
    Endpoint::new(Method::GET, "/healthz", |m| on(m, ops::healthz)),
    Endpoint::new(Method::GET, "/readyz", |m| on(m, readiness::readyz)),
    Endpoint::new(Method::GET, "/metrics", |m| on(m, ops::metrics)),
    Endpoint::new(Method::GET, "/openapi.json", |m| on(m, ops::openapi)),
    Endpoint::new(Method::GET, "/", |m| on(m, dashboard::page)),
    Endpoint::new(Method::GET, "/dashboard", |m| on(m, dashboard::page)),
];

/// Every (method, path) [`router`] serves, from the same tables it is built from (the `[[gate]]` paths
/// aside: see [`crate::http::route_table`]). The OpenAPI test compares this with `openapi.json`.
pub fn endpoints() -> Vec<(Method, &'static str)> {
    route_table::methods_and_paths(OPS_ENDPOINTS)
        .chain(Rankings::endpoints())
        .chain(waiting_room::endpoints())
        .chain(route_table::methods_and_paths(dashboard::ADMIN_ENDPOINTS))
        .collect()
}

/// The router with every route group, auth and limits, inside the [`Edge`].
pub fn router(state: AppState) -> Edge<DirectRoutesOfApp> {
    let keys = Arc::new(AccessKeys {
        admin: state.config.admin_keys.clone(),
        ingest: state.config.ingest_keys.clone(),
    });
    let admin_routes = state
        .rankings
        .admin_routes()
        .merge(waiting_room::admin_routes(state.waiting_room.clone()))
        .merge(dashboard::admin_routes(state.dashboard.clone()))
        .route_layer(middleware::from_fn_with_state(keys.clone(), require_admin));
    let ingest_routes = state
        .rankings
        .ingest_routes()
        .route_layer(middleware::from_fn_with_state(keys, require_ingest));
    let mut app = Router::new()
        .merge(route_table::router_of(OPS_ENDPOINTS).with_state(state.clone()))
        .merge(state.rankings.public_routes())
        .merge(ingest_routes)
        .merge(admin_routes)
        .merge(waiting_room::member_routes(state.waiting_room.clone()));
    if let Some(gate) = waiting_room::gate_routes(state.waiting_room.clone()) {
        app = app.merge(gate);
    }
    // Every route (and the fallback, which has no template) names its template on the answer, which
    // the edge records by (telemetry::http_requests).
    let app = app
        .fallback(edge::unknown_route)
        .layer(http_requests::TagRouteLayer)
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
    let edge = Edge::new(
        app,
        Duration::from_millis(state.config.http.body_timeout_millis.max(1)),
        state.config.max_body_bytes,
    );
    // The hottest requests skip the router (see `edge`), unless it is traced: then every request must
    // pass the layer.
    if traced {
        edge
    } else {
        edge.with_direct_routes(DirectRoutesOfApp::new(&state))
    }
}

/// Where the waiting room's Redis scripts take "now" from.
enum RedisQueueTime {
    /// Redis `TIME`: shared by every instance whatever its own clock says (production).
    RedisServer,
    /// The application's clock (a simulated one in tests and demos).
    TheClock,
}

/// A built, bound, not yet serving rankgate.
pub struct Application {
    listener: TcpListener,
    router: Edge<DirectRoutesOfApp>,
    state: AppState,
    shutdown: CancellationToken,
    workers: Vec<tokio::task::JoinHandle<()>>,
    _data_dir_lock: std::fs::File,
}

impl Application {
    /// Opens the embedded stores under `config.data_dir`, restores their state, and binds `config.listen`.
    /// On Redis, the waiting room's scripts read Redis `TIME`, so instances on different machines agree.
    pub async fn build(config: Config) -> anyhow::Result<Application> {
        Application::build_on(config, Arc::new(SystemClock), RedisQueueTime::RedisServer).await
    }

    /// [`Application::build`] on a chosen clock, which is the whole service's time: the schedulers', the
    /// embedded stores', and on Redis the waiting room's scripts' too (instead of Redis `TIME`), so a test
    /// or a demo that moves a [`ManualClock`](rankgate_store::clock::ManualClock) moves every part of the
    /// service at once. Instances sharing a queue must then share the clock: in one process only.
    pub async fn build_with_clock(config: Config, clock: Arc<dyn Clock>) -> anyhow::Result<Application> {
        Application::build_on(config, clock, RedisQueueTime::TheClock).await
    }

    async fn build_on(
        config: Config,
        clock: Arc<dyn Clock>,
        redis_queue_time: RedisQueueTime,
    ) -> anyhow::Result<Application> {
        // The address first: a port already in use must fail before anything is created on disk (the data
        // dir, its lock, the token secret), so a mistyped start leaves nothing behind.
        let listener = TcpListener::bind(config.listen).await.with_context(|| {
            format!(
                "binding {}; is another process using that address? (choose another with --listen)",
                config.listen
            )
        })?;
        let lock = lock_data_dir(&config.data_dir)?;
        let waiting_room = if config.redis.is_empty() {
            WaitingRoom::open_embedded(&config.data_dir, config.waiting_room.clone(), clock.clone()).await?
        } else {
            let open = match redis_queue_time {
                RedisQueueTime::RedisServer => {
                    WaitingRoom::open_redis(
                        &config.redis,
                        &config.redis_prefix,
                        config.waiting_room.clone(),
                        clock.clone(),
                    )
                    .await
                }
                RedisQueueTime::TheClock => {
                    WaitingRoom::open_redis_simulated(
                        &config.redis,
                        &config.redis_prefix,
                        config.waiting_room.clone(),
                        clock.clone(),
                    )
                    .await
                }
            };
            let room = open.context("opening the waiting room on Redis (check --redis)")?;
            room.keep_settings_in(&config.data_dir)?;
            room
        };
        let shutdown = CancellationToken::new();
        let rankings = Rankings::open(
            config.rankings.clone(),
            &config.rankings_storage(),
            waiting_room.jobs(),
            config.max_body_bytes,
            clock.clone(),
            &shutdown,
        )
        .await?;
        let dashboard = Arc::new(dashboard::History::new(config.waiting_room.max_queues));
        let dependencies = readiness::dependencies_of(&config.redis);
        let state = AppState {
            config: Arc::new(config),
            rankings,
            waiting_room,
            clock,
            prometheus: crate::telemetry::prometheus_handle(),
            dashboard,
            dependencies,
        };
        let mut workers = state.waiting_room.spawn_workers(shutdown.clone());
        workers.extend(state.rankings.spawn_workers(&shutdown));
        workers.push(dashboard::spawn_sampler(state.clone(), shutdown.clone()));
        workers.push(readiness::spawn_probes(state.clone(), shutdown.clone()));
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
        // After the last request: the sale report's counts of this instance go to the store (issue 28).
        if let Err(error) = self.state.waiting_room.flush_sale_reports().await {
            tracing::warn!(
                error = format!("{error:#}"),
                "the last sale-report counts could not be stored"
            );
        }
        self.state.rankings.barrier().await?;
        Ok(())
    }
}

/// Opens a data dir for exclusive use by one process: the embedded stores are single-writer.
pub fn lock_data_dir(data_dir: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating data dir {}", data_dir.display()))?;
    let path = data_dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    file.try_lock().map_err(|_| {
        anyhow::anyhow!(
            "{} is in use by another rankgate process; stop it, or use --url to talk to it",
            data_dir.display()
        )
    })?;
    Ok(file)
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
