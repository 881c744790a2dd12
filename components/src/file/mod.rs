//! The `file` components: stores backed by a file on disk.

pub mod config_store;
