//! HTTP API tests: the whole service on port 0 with its own data dir, driven over real HTTP.

mod helpers;

mod admin;
mod crash;
mod edge;
mod events;
mod faults;
mod hostile;
mod instances;
mod ops;
mod policies;
mod rankings;
mod reads;
#[path = "../../../store/tests/support/redis_servers.rs"]
mod redis_servers;
mod serving_redis;
mod stream;
mod waiting_room_redis;
