//! The waiting room (SPEC Part 2): member API, admin API, token service, reverse-proxy gate, admission
//! scheduler and the flash-sale demo.
//!
//! Flow: **entry** (`POST …/entries`, one atomic store step with a store-side sequence) → **admission**
//! (each instance's scheduler ticks; the store pops and issues tokens in one step against a global budget)
//! → **token** (shown on the member's next poll; only its hash is stored) → **claim** (one atomic step,
//! exactly one concurrent winner) → **consume** on a committed order, or **release** back to READY.
//!
//! # Layout
//! - [`config`]: [`WaitingRoomConfig`], [`GateConfig`], [`GateRoute`].
//! - `service`: [`WaitingRoom`], the one type handlers, the gate and workers call; `position`: the
//!   bodies it answers (the position, written by hand for the hot path); `errors`: store outcomes as
//!   [`ApiError`](crate::http::error::ApiError)s; `secret`: the token secret.
//! - `member_api`, `admin_api`, `gate`: thin axum handlers, one module per route group.
//! - `member_streams`: members' position streams (SSE), one watch per queue per instance.
//! - `page`: the waiting page at `GET /wait/{queue}` and its visitor / entry-token cookies.
//! - `opening`: scheduled openings (`opensAt`, `drawBeaconRound`): the pre-queue in positions, the draw
//!   after the close (and the beacon, `PUT /v1/admin/queues/{queue}/draw/beacon`), the published draw
//!   (`GET /v1/queues/{queue}/draw`).
//! - `redis_backend`: [`WaitingRoom::open_redis`], the room on Redis (standalone or Cluster).
//! - `scheduler`: admission, expiry and metrics workers, driven by the store's clock; `deadlines`: when
//!   a queue nobody waits in (READY and CLAIMED members included) is next due, so it costs nothing per tick.
//! - `telemetry`: metric names and helpers.
//! - [`identity`] and [`ticket`]: who a request speaks for: every call for a member needs that member's
//!   credential (its entry's ticket, or the waiting page's visitor cookie; with `member_auth` "gateway"
//!   also the shop's gateway's word, with "jwt" the shop's JWT). [`member_auth`]: the modes' settings;
//!   [`jwt`]: the JWT check and its key rotation.
//! - `draw_verify`: `rankgate queue verify-draw`, the check of a scheduled opening's published draw.
//! - [`dashboard_feed`]: what the dashboard (`app::dashboard`) samples each second: the gauges worker's
//!   last waiting counts and the sale report's moves since the last sample.
//! - `sale_report`: the sale's report (issue 28): counts per queue and minute, flushed to the store;
//!   `report_page`: its page of charts at `/admin/queues/{queue}/report`.
//! - `adaptive`: adaptive admission: gate measurements → shared store → AIMD controller → the queue's rate.
//! - [`entry_guard`]: what a new member's entry must get past (proof-of-work challenges, the CAPTCHA
//!   hook, per-address budgets); [`captcha`]: `[waiting_room.captcha]` and the provider's siteverify.

mod adaptive;
mod admin_api;
pub mod captcha;
pub mod config;
mod consumed;
pub mod dashboard_feed;
mod deadlines;
pub mod draw_verify;
pub mod entry_guard;
mod errors;
mod gate;
pub mod identity;
pub mod jwt;
mod member_api;
pub mod member_auth;
mod member_streams;
mod opening;
mod page;
mod position;
mod redis_backend;
mod report_page;
mod sale_report;
mod scheduler;
mod secret;
mod service;
mod telemetry;
pub mod ticket;

use std::sync::Arc;

pub use self::config::{GateConfig, GateRoute, WaitingRoomConfig};
pub use self::member_api::{
    direct_enter_queue, direct_poll_target, enter_reply, poll_reply, ENTER_ROUTE, POLL_ROUTE,
};
pub use self::position::{ClaimGranted, Position};
pub use self::service::WaitingRoom;
pub use self::telemetry::SERIES_IDLE_TIMEOUT;

/// `/v1/queues/...`: member endpoints (SPEC 2.2) and the token service (SPEC 2.4); and the waiting page,
/// `/wait/{queue}`.
pub fn member_routes(room: Arc<WaitingRoom>) -> axum::Router {
    member_api::routes(Arc::clone(&room)).merge(page::routes(room))
}

/// `/v1/admin/queues/...`: queue settings and counters (SPEC 2.1). The caller adds authentication.
pub fn admin_routes(room: Arc<WaitingRoom>) -> axum::Router {
    admin_api::routes(room)
}

/// The (method, path) pairs of [`member_routes`] and [`admin_routes`], from the tables they are built from.
pub fn endpoints() -> impl Iterator<Item = (axum::http::Method, &'static str)> {
    crate::http::route_table::methods_and_paths(member_api::ENDPOINTS)
        .chain(crate::http::route_table::methods_and_paths(page::ENDPOINTS))
        .chain(crate::http::route_table::methods_and_paths(admin_api::ENDPOINTS))
}

/// The reverse-proxy routes of every `[[gate]]`; `None` when none is configured.
pub fn gate_routes(room: Arc<WaitingRoom>) -> Option<axum::Router> {
    gate::routes(room)
}
