//! The rankings' HTTP handlers, one module per route group, and the tables their routers are built
//! from ([`crate::http::route_table`]). Handlers are thin: extract, parse into domain types, call the
//! service or the reader, shape the answer.
//!
//! - [`reads`]: `…/top`, its change stream, `…/rank`, `…/ranks`, the sort (SPEC 1.5);
//! - [`events`]: `POST /v1/events` (SPEC 1.6);
//! - [`admin`]: rankers, rebuilds and webhooks (SPEC 1.3, 1.7, 1.5);
//! - [`catalog`]: `PUT`/`GET /v1/products/{productId}`.

pub mod admin;
pub mod catalog;
pub mod events;
pub mod reads;

use axum::http::Method;
use axum::routing::on;

use super::Rankings;
use crate::http::route_table::Endpoint;

/// Admin routes: behind the admin keys.
pub const ADMIN: &[Endpoint<Rankings>] = &[
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
    Endpoint::new(Method::PUT, "/v1/admin/webhooks/{name}", |m| {
        on(m, admin::put_webhook)
    }),
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

/// Ingest: behind the ingest keys.
pub const INGEST: &[Endpoint<Rankings>] = &[Endpoint::new(Method::POST, "/v1/events", |m| {
    on(m, events::post_events)
})];

/// The rank read's route, which the fast path answers too (and records by this template).
pub const RANK_ROUTE: &str = "/v1/products/{product_id}/rank";

/// Reads, open to anyone.
pub const PUBLIC: &[Endpoint<Rankings>] = &[
    Endpoint::new(Method::GET, "/v1/categories/{category}/top", |m| {
        on(m, reads::top)
    }),
    Endpoint::new(Method::GET, "/v1/categories/{category}/top/events", |m| {
        on(m, reads::top_events)
    }),
    Endpoint::new(Method::GET, RANK_ROUTE, |m| on(m, reads::rank)),
    Endpoint::new(Method::GET, "/v1/products/{product_id}/ranks", |m| {
        on(m, reads::ranks)
    }),
    Endpoint::new(Method::POST, "/v1/rankings/sort", |m| on(m, reads::sort)),
];
