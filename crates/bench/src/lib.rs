//! Workloads and benchmark harnesses for rankgate.
//!
//! This crate produces the traffic that rankgate's performance targets are measured with, and the
//! baselines they are compared against:
//!
//! - [`workload`]: deterministic generators for the seed lesson's 200,000-sale demo (SPEC Part 4), the
//!   flash sale of the seed's section 6.6 and the waiting-room surge, all in the exact SPEC 1.1 event
//!   format, plus an NDJSON writer.
//! - [`coalesce`]: counts of sorted-set writes with and without per-batch coalescing (seed 6.6).
//!
//! The binaries in `src/bin` use these: `gen-workload` writes workloads to NDJSON files, `naive-redis`
//! measures the naive one-Lua-call-per-event Redis design, and `redis-memory` measures what Redis needs
//! to hold a 1,000,000-member sorted set. A plain batch recompute of rankings is deliberately not here:
//! it belongs to the ranking code it checks.

pub mod coalesce;
pub mod workload;
