//! The configuration file: its model, loading with Layotto aliases, and
//! validation that collects every problem.

mod load;
mod model;
mod problem;
mod raw;
mod validate;

pub use load::{load_file, parse};
pub use model::{ComponentRef, ComponentSpec, ConfigFile, ConfigurationRef, OverlaySpec, SecretRef};
pub use problem::{Problem, Problems};
pub use validate::{validate, ValidConfig};
