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

/// CPU seconds (user + system) this process has used so far, from `/proc/self/stat`, or `None` where
/// that file is missing. A harness that drives rankgate's code in process reads it around its timed
/// part, so the CPU it reports per event leaves out building the workload and connecting.
pub fn process_cpu_seconds() -> Option<f64> {
    // /proc reports utime and stime in USER_HZ ticks, which Linux fixes at 100 for user space.
    const USER_HZ: f64 = 100.0;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces; the fields after it start past its closing ')'.
    let mut fields = stat.rsplit_once(") ")?.1.split(' ');
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / USER_HZ)
}

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

#[cfg(test)]
mod cpu_tests {
    #[test]
    fn process_cpu_seconds_grows_with_work() {
        let before = super::process_cpu_seconds().expect("/proc/self/stat on Linux");
        // Spin until a tick of CPU lands on this process; the wall-clock bound only stops a reader that
        // never moves, however slow or busy the machine is.
        let started = std::time::Instant::now();
        let mut after = before;
        while after <= before && started.elapsed() < std::time::Duration::from_secs(60) {
            for _ in 0..100_000 {
                std::hint::black_box(after);
            }
            after = super::process_cpu_seconds().unwrap();
        }
        assert!(after > before, "{before} -> {after}");
    }
}
