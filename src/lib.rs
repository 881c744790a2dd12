//! rewire: a component runtime with dependency injection and lossless hot
//! reload.
//!
//! Write a component with `#[derive(Component)]`, declare it in JSON, and
//! the runtime builds it, injects what it references, and keeps it live.
//! See `docs/components.md` for the authoring guide.
//!
//! A binary that links its own components is a complete rewire sidecar —
//! every command (`run`, `validate`, `graph`, `components`, `apply`,
//! `status`) knows its types:
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     rewire::main()
//! }
//! ```
//!
//! The `rewire` binary allocates with mimalloc (feature `mimalloc`, on by
//! default): a host binary gets the same with one more line.
//!
//! ```no_run
//! #[global_allocator]
//! static ALLOCATOR: rewire::MiMalloc = rewire::MiMalloc;
//!
//! fn main() -> std::process::ExitCode {
//!     rewire::main()
//! }
//! ```

// Lets `#[derive(Component)]` (which names `::rewire`) work in this crate too.
extern crate self as rewire;

pub use rewire_runtime::*;

/// `tracing`, as the runtime logs with it: a component logs with
/// `rewire::tracing::info!` without a dependency of its own.
#[doc(no_inline)]
pub use tracing;

/// The community components (memory, file, env...), linked into the
/// binary so their registrations are collected.
pub use rewire_components as components;

mod host;
pub use host::Host;

/// `tokio`, as the runtime runs on it: a host writes
/// `#[rewire::tokio::main(crate = "rewire::tokio")]` without a dependency
/// of its own.
#[doc(no_inline)]
pub use tokio;

/// The allocator the `rewire` binary runs on (feature `mimalloc`): set it
/// as a host binary's `#[global_allocator]` for the same start-up and
/// reload costs (docs/BENCHMARKS.md §1n).
#[cfg(feature = "mimalloc")]
pub use mimalloc::MiMalloc;

#[cfg(feature = "logging")]
mod logging;
#[cfg(feature = "logging")]
pub use logging::init_logging;

#[cfg(feature = "sidecar")]
mod cli;

#[cfg(feature = "sidecar")]
pub use cli::main;

/// The sidecar APIs (feature `sidecar`): Dapr-compatible gRPC and HTTP,
/// the Lifecycle API, health, metrics and status.
#[cfg(feature = "sidecar")]
pub use rewire_sidecar as sidecar;
