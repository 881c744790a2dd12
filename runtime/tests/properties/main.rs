//! Property tests of the config model: loader, metadata decoding, diff and
//! graph. One test binary.
// Test code: a failed setup step should panic where it happens.
#![allow(clippy::unwrap_used)]

mod prop_support;

mod prop_diff;
mod prop_graph;
mod prop_loader;
mod prop_metadata;
