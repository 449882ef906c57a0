//! The `rankgate` service: configuration, HTTP API, background workers and the command line.
//!
//! # Layout
//! - [`error`]: the one `ApiError` every handler returns.
//! - [`waiting_room`]: the waiting room's HTTP API, admission scheduler and order gate (SPEC 2).

pub mod error;
pub mod waiting_room;
