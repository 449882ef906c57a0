//! The `rankgate` service: configuration, HTTP API, background workers and the command line.
//!
//! # Layout
//! - [`config`]: defaults → TOML file → `RANKGATE_*` variables → flags; bearer keys hashed on load.
//! - [`app`]: `Application::build` / `run_until_stopped`, the router and the background refresher.
//! - [`rankings`]: the rankings service (engine, writer thread with group commit, policies, catalogue).
//! - [`edge`]: the listener and the edge of the router: connection limit, header and body deadlines,
//!   every error answered as JSON.
//! - [`fast_lane`]: plain rank reads answered ahead of hyper; anything else hands the connection over.
//! - [`routes`]: one module per route group; thin handlers.
//! - [`auth`]: bearer-key middleware for admin and ingest.
//! - [`error`]: the one `ApiError` every handler returns.
//! - [`json_writer`]: hand-written JSON for the hottest bodies, byte for byte serde_json's.
//! - [`waiting_room`]: the waiting room's HTTP API, admission scheduler and order gate (SPEC 2).
//! - [`cli`]: the `rankgate` subcommands: serve, ingest, verify, rebuild, replay, demo, catalog.
//! - [`relay`]: `rankgate relay`, the transactional outbox relay (PostgreSQL/MySQL → Kafka or HTTP).
//! - [`stream`]: the Redis Streams consumer group (`--stream`).
//! - [`kafka`]: the Kafka consumer group (`--kafka`), with dead letters and backpressure.
//! - [`verify`]: batch recompute vs served rankings.
//! - [`demo`]: the seed lesson's workload end to end.
//! - [`draw_verify`]: `rankgate queue verify-draw`, the check of a scheduled opening's published draw.
//! - [`webhooks`]: `[[webhook]]`: top-N changes posted, signed, retried through the job queue.

pub mod app;
pub mod auth;
pub mod cli;
pub mod config;
pub mod demo;
pub mod direct_reply;
pub mod draw_verify;
pub mod edge;
pub mod error;
pub mod fast_lane;
pub mod json_writer;
pub mod kafka;
pub mod rankings;
pub mod relay;
pub mod route_table;
pub mod routes;
pub mod stream;
pub mod verify;
pub mod waiting_room;
pub mod webhooks;
