//! Component metadata: a JSON object decoded into each component's own
//! typed struct.
//!
//! Decoding is lenient about scalars (the string `"5"` is accepted where a
//! number is expected, `"true"` where a bool is, because the Lifecycle API
//! carries `map<string,string>`) and strict about names: an unknown field is
//! an error that names it and suggests the closest known one.

mod decode;
mod error;
mod lenient;

pub use decode::{decode, decode_for_validation};
pub use error::MetadataError;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// A component's metadata, as declared or as resolved.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Metadata(pub Map<String, Value>);

impl Metadata {
    /// Decodes into `T` (see the module docs for the rules).
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, MetadataError> {
        decode(&self.0)
    }

    /// The value of `field`, if present.
    pub fn get(&self, field: &str) -> Option<&Value> {
        self.0.get(field)
    }

    /// Sets `field` to `value`.
    pub fn insert(&mut self, field: impl Into<String>, value: Value) {
        self.0.insert(field.into(), value);
    }
}

impl From<Map<String, Value>> for Metadata {
    fn from(map: Map<String, Value>) -> Self {
        Self(map)
    }
}

/// The metadata of a component that takes none: any field is unknown.
#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
pub struct NoMetadata {}
