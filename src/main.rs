//! The `rewire` binary: the sidecar and its command-line tools.

/// mimalloc (feature `mimalloc`): see `rewire::MiMalloc`.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: rewire::MiMalloc = rewire::MiMalloc;

fn main() -> std::process::ExitCode {
    rewire::main()
}
