//! rankgate's pure domain core.
//!
//! Nothing in this crate performs IO, spawns tasks or reads a clock: time is always passed in as a value,
//! so every rule here is deterministic and property-tested.
//!
//! # Layout
//! - [`ids`]: newtypes that parse raw strings at the edge (`EventId`, `ProductId`, `Category`, `MemberId`).
//! - [`event`]: behaviour events, parsed and validated exactly as SPEC 1.1 says.
//! - [`metrics`]: the four hourly metrics an event changes (SPEC 1.2), with overflow-checked arithmetic.
//! - [`period`]: hours, calendar periods in a time zone, sliding windows, and their keys (SPEC 1.4).
//! - [`read`]: the one parser of a ranking read's query string (SPEC 1.5), bounds included.
//! - [`ranker`]: scoring policies and their versions (SPEC 1.3), and the ranking order.
//! - [`policy`]: the version rules of a ranker (create, build, switch, rollback), as a state machine.
//! - [`carry`]: the carry-over rule for `popular` daily rankings (SPEC 1.4).
//! - [`queue`]: waiting-room member states, settings, polling intervals, wait estimates (SPEC 2).
//! - [`job`]: delayed/retry job states and capped exponential backoff (SPEC 3).
//! - [`limiter`]: sliding-log and sliding-window rate-limit maths (SPEC 3).

pub mod carry;
pub mod event;
pub mod ids;
pub mod job;
pub mod limiter;
pub mod metrics;
pub mod period;
pub mod policy;
pub mod queue;
pub mod ranker;
pub mod read;
