//! HTTP routes, one module per route group. Handlers are thin: extract, parse into domain types, call a
//! service, shape the answer.

pub mod admin;
pub mod catalog;
pub mod events;
pub mod ops;
pub mod rankings;
