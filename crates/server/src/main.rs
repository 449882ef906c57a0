//! The `rankgate` binary: parses the command line and hands over to [`rankgate::cli`].

fn main() -> std::process::ExitCode {
    rankgate::cli::main()
}
