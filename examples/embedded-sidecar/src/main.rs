//! A user's sidecar: the `rewire` command line, with one more component
//! type linked in. Every command sees it (run in this example's directory,
//! where `greeter.json` is):
//!
//! ```sh
//! cargo run --bin greeter-sidecar -- components   # lists greeter/hello
//! cargo run --bin greeter-sidecar -- validate --config greeter.json
//! cargo run --bin greeter-sidecar -- run --config greeter.json  # edits update it in place
//! ```

// Links the library, so its component registers itself (an unused `use`
// would not: only a named crate is sure to be linked).
extern crate greeter_sidecar;

/// The allocator the `rewire` binary runs on (docs/components.md).
#[global_allocator]
static ALLOCATOR: rewire::MiMalloc = rewire::MiMalloc;

fn main() -> std::process::ExitCode {
    rewire::main()
}
