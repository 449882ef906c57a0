//! The HTTP core: everything between a socket and a product's handler, knowing no product.
//!
//! # Layout
//! - [`edge`]: the listener and the edge around the router: connection limit, header and body
//!   deadlines, every error answered as JSON.
//! - [`fast_path`]: the hottest requests answered ahead of hyper and the router, through the
//!   [`DirectRoutes`](fast_path::DirectRoutes) a product set implements; anything else hands the
//!   connection to hyper.
//! - [`direct_reply`]: an answer written whole, the same bytes whichever path served it.
//! - [`json_writer`]: hand-written JSON for the hottest bodies, byte for byte serde_json's.
//! - [`entity_tag`]: `ETag`s as hashes of the body, and the `If-None-Match` test.
//! - [`route_table`]: routes as data, so the served routes can be listed and checked against
//!   `openapi.json`.
//! - [`auth`]: bearer keys, stored hashed, compared in constant time; the admin and ingest guards.
//! - [`peer`]: the peer address of a request, and the trusted proxies (CIDRs) whose word is believed.
//! - [`sse`]: Server-Sent Event streams with an instance limit, bounded buffers and slow clients
//!   dropped: the one mechanism behind every stream a product offers.
//! - [`error`]: the one `ApiError` every handler returns, and the JSON shape of every error.
//!
//! The products (`crate::rankings`, `crate::waiting_room`) build on this module and never on each
//! other; `crate::app` composes them.

pub mod auth;
pub mod direct_reply;
pub mod edge;
pub mod entity_tag;
pub mod error;
pub mod fast_path;
pub mod json_writer;
pub mod peer;
pub mod route_table;
pub mod sse;
