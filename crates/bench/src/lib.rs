//! Benchmark harnesses for rankgate.
//!
//! This crate drives the traffic that rankgate's performance targets are measured with, and the
//! baselines they are compared against:
//!
//! - the workloads themselves (the seed lesson's 200,000-sale demo, the flash sale of the seed's section
//!   6.6, the waiting-room surge) come from the `rankgate-workload` crate, which `rankgate demo` shares;
//! - [`coalesce`]: counts of sorted-set writes with and without per-batch coalescing (seed 6.6).
//!
//! The binaries in `src/bin` use these: `gen-workload` writes workloads to NDJSON files, `naive-redis`
//! measures the naive one-Lua-call-per-event Redis design, and `redis-memory` measures what Redis needs
//! to hold a 1,000,000-member sorted set. `http-ingest` and `freshness` load a running rankgate over HTTP
//! (durable ingest rate with 2,000-event batches; send→visible latency at a fixed ingest rate), through
//! [`loopback_base_url`], which keeps them on loopback. A plain batch recompute of rankings is deliberately not here:
//! it belongs to the ranking code it checks.

pub mod coalesce;

/// Checks that `url` is an `http://` URL on a loopback host (`127.0.0.1`, `localhost` or `[::1]`) and
/// returns it without a trailing slash. The HTTP load tools refuse anything else, so a typo cannot
/// send load to another machine.
pub fn loopback_base_url(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// URLs are supported"))?;
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.split(':').next().unwrap_or(""),
    };
    if !matches!(host, "127.0.0.1" | "localhost" | "::1") {
        return Err(format!("{url}: load tools only target loopback addresses"));
    }
    Ok(url.trim_end_matches('/').to_string())
}
