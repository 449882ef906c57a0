//! The `rankgate` binary: parses the command line and hands over to [`rankgate::cli`].

/// mimalloc instead of glibc malloc: ingest allocates many small, short-lived objects (parsed JSON,
/// events, hash map entries), and glibc's malloc/free/consolidate took a quarter of ingest time in
/// profiles; mimalloc's thread-local free lists cut that to a few percent. Built with `no_thp`: mimalloc
/// otherwise asks for transparent huge pages on its arenas, and each first touch of one zeroed 2 MiB (or
/// compacted memory to find it) on the thread that touched it, stalling every request that thread
/// served: with it, the first poll run after a million entries had a p99 of 7-235 ms, without it 1.5-2.2
/// ms, and a lone fleet instance spent ~6% less CPU per event (bench/results/2026-12-05-issue27.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    rankgate::cli::main()
}
