//! Storage for rankgate: one trait per capability, and the backends that implement them.
//!
//! # Layout
//! - [`clock`]: the `Clock` trait every time-dependent store and worker takes, so tests control time.
//! - [`queue`]: waiting-room state (entries, sequence, tokens, claims), the delayed/retry job queue and the
//!   rate limiter: traits and the embedded backend.
//! - [`ranking`]: the rankings source of truth (SQLite) and the in-process ranking engine.

pub mod clock;
pub mod queue;
pub mod ranking;
