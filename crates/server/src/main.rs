//! The `rankgate` binary: parses the command line and hands over to [`rankgate::cli`].

/// mimalloc instead of glibc malloc: ingest allocates many small, short-lived objects (parsed JSON,
/// events, hash map entries), and glibc's malloc/free/consolidate took a quarter of ingest time in
/// profiles; mimalloc's thread-local free lists cut that to a few percent.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    rankgate::cli::main()
}
