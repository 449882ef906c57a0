//! HTTP API tests: the whole service on port 0 with its own data dir, driven over real HTTP.

/// `spawn_app()`: the whole service, as every HTTP test binary of this crate starts it.
#[path = "../support/app.rs"]
mod app;
mod helpers;
/// Private Redis servers on spare ports (the 3-node Cluster among them) and key cleanup on the shared one.
use rankgate_testkit::redis_servers;

mod adaptive_metrics;
mod admin;
mod crash;
mod dashboard;
mod delisting;
mod edge;
mod entry_guards;
mod estimates;
mod events;
mod faults;
mod first_hour;
mod hostile;
mod instances;
mod member_auth_modes;
mod member_identity;
mod member_streams;
mod metrics;
mod opening;
mod ops;
mod policies;
mod queue_admin;
mod rankings;
mod readiness;
mod reads;
mod sale_report;
mod sentinel;
mod serving_redis;
mod store_loss;
mod stream;
mod top_streams;
mod trending;
mod waiting_room_redis;
mod webhooks;
