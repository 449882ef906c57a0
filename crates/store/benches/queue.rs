//! Queue benchmarks (filled in below).
fn main() {}
