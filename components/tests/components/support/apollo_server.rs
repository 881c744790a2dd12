//! The Apollo protocol server of `testkit`, and a harness that starts the
//! apollo config store against it.

pub use testkit::apollo::*;

pub mod harness;
