//! HTTP API tests: the whole service on port 0 with its own data dir, driven over real HTTP.

mod helpers;
/// Deleting a test's keys on the shared Redis, shared with the other test binaries.
#[path = "../support/redis_keys.rs"]
mod redis_keys;
/// Redis servers the store tests start (the 3-node Cluster among them), shared with this binary.
#[path = "../../../store/tests/support/redis_servers.rs"]
mod redis_servers;

mod adaptive_metrics;
mod admin;
mod crash;
mod delisting;
mod edge;
mod estimates;
mod events;
mod faults;
mod hostile;
mod instances;
mod member_streams;
mod opening;
mod ops;
mod policies;
mod queue_admin;
mod rankings;
mod reads;
mod serving_redis;
mod stream;
mod top_streams;
mod trending;
mod waiting_room_redis;
mod webhooks;
