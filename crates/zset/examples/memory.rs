//! Memory per member at 1,000,000 members named like `sku-0000001` with random scores: the crate's own
//! count ([`SortedSet::heap_bytes`]) and what the process actually grew by (RSS from `/proc/self/statm`).
//!
//! ```text
//! cargo run --release -p rankgate-zset --example memory [members]
//! ```
//!
//! Redis 7 takes ~101 bytes per member for the same set (`MEMORY USAGE`). The target here is ≤ 40.

use std::time::Instant;

use rankgate_zset::SortedSet;

/// Page size assumed for `/proc/self/statm`, which counts pages; 4 KiB on x86-64 and most arm64 Linux.
const PAGE_BYTES: u64 = 4096;

fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let resident_pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(resident_pages * PAGE_BYTES)
}

/// xorshift64: enough randomness for scores, and no `rand` dependency.
struct XorShift(u64);

impl XorShift {
    fn next_unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn main() {
    let members: u64 = std::env::args()
        .nth(1)
        .map(|arg| arg.parse().expect("members must be a number"))
        .unwrap_or(1_000_000);

    let names: Vec<String> = (1..=members).map(|n| format!("sku-{n:07}")).collect();
    let mut random = XorShift(0x9E37_79B9_7F4A_7C15);
    let rss_before = resident_bytes();
    let started = Instant::now();

    let mut set = SortedSet::new();
    for name in &names {
        set.insert(name.as_bytes(), random.next_unit() * 1e6)
            .expect("scores are finite");
    }
    let elapsed = started.elapsed();
    let rss_after = resident_bytes();

    let per_member = |bytes: u64| bytes as f64 / members as f64;
    println!("members:           {}", set.len());
    println!(
        "insert time:       {:.0} ms ({:.0} ns/insert)",
        elapsed.as_secs_f64() * 1e3,
        elapsed.as_nanos() as f64 / members as f64
    );
    println!(
        "heap_bytes:        {} B = {:.1} B/member (target <= 40, Redis ~101)",
        set.heap_bytes(),
        per_member(set.heap_bytes() as u64)
    );
    match (rss_before, rss_after) {
        (Some(before), Some(after)) => println!(
            "RSS delta:         {} B = {:.1} B/member (includes malloc overhead and freed-but-kept pages)",
            after.saturating_sub(before),
            per_member(after.saturating_sub(before))
        ),
        _ => println!("RSS delta:         unavailable (no /proc/self/statm)"),
    }
    // Keep the names alive until after the measurement so their memory is not counted as freed.
    drop(names);
}
