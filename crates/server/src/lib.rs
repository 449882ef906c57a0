//! The `rankgate` service: configuration, HTTP API, background workers and the command line.
//!
//! # Layout
//! A small HTTP core and one folder per product, composed by the application:
//! - [`http`]: the HTTP core, which knows no product: the edge (accept loop, limits, deadlines, JSON
//!   errors), the fast path and its direct replies, the route table, auth, Server-Sent Events, errors.
//! - [`rankings`]: events → source of truth → serving → reads (SPEC Part 1): its routes, reader, writer,
//!   policy driver, streams, webhooks, ingest sources (Redis Streams, Kafka), the outbox relay, verify.
//! - [`waiting_room`]: entry → admission → token → claim → consume (SPEC Part 2): its routes, service,
//!   gate, page, streams, admission, openings.
//! - [`app`]: composes them: `Application::build` / `run_until_stopped`, the route table of the whole
//!   service, the fast path's routes, and the operations endpoints (`/healthz`, `/readyz`, `/metrics`).
//! - [`readiness`]: dependency health (state, since, last error) that `/readyz` reports, shared by the
//!   rankings' writer and the application's probes.
//! - [`config`]: defaults → TOML file → `RANKGATE_*` variables → flags; bearer keys hashed on load.
//! - [`cli`]: the `rankgate` subcommands: serve, ingest, verify, rebuild, replay, demo, migrate, relay,
//!   catalog, queue, verify-draw.
//! - [`telemetry`]: the Prometheus exposition: the catalogue of every series (help, type, buckets),
//!   HTTP requests by route template, `process_*` and build info.
//! - [`demo`]: `rankgate demo`, a generated shop's events and the flash sale end to end.
//!
//! `rankings` and `waiting_room` never import each other; what both need lives in `http` or in a
//! lower crate.

pub mod app;
pub mod cli;
pub mod config;
pub mod demo;
pub mod http;
pub mod rankings;
pub mod readiness;
pub mod telemetry;
pub mod waiting_room;
