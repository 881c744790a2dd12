//! Triggers that keep a runtime live: a watched configuration file, and
//! the file watching primitive the file-backed components share.

pub mod file;

pub use file::{FileWatch, OnChange};
