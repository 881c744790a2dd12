//! Triggers that keep a runtime live — the configuration file, watched
//! refs and the overlay, all feeding one coalescing reload queue — and the
//! file watching primitive the file-backed components share.

mod config_file;
pub mod file;
pub(crate) mod overlay;
pub(crate) mod queue;
pub(crate) mod supervisor;

pub use file::{FileWatch, OnChange};
