//! The `rewire` binary: the sidecar and its command-line tools.

fn main() -> std::process::ExitCode {
    rewire::main()
}
