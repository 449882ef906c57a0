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
mod serving_redis;
mod stream;
mod trending;
mod waiting_room_redis;
