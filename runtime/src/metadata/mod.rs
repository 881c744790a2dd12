//! Component metadata: a JSON object decoded into each component's own
//! typed struct.
//!
//! Decoding is lenient about scalars (the string `"5"` is accepted where a
//! number is expected, `"true"` where a bool is, because the Lifecycle API
//! carries `map<string,string>`) and strict about names: an unknown field is
//! an error that names it and suggests the closest known one.
//!
//! Nest instead of flatten: serde reads a `#[serde(flatten)]` field, and an
//! internally tagged or untagged enum, from a private buffer, not through
//! this decoder. Inside one a string is not taken for a number, an unknown
//! field is not refused, and a flattened field's error names the whole
//! object (`.`). A nested struct field, or an externally tagged enum, is
//! decoded leniently and checked.

mod decode;
mod error;
mod fields;
mod lenient;

pub use decode::{decode, decode_for_validation};
pub use error::MetadataError;
pub(crate) use fields::LendsMetadata;
pub use fields::Metadata;

/// The metadata of a component that takes none: any field is unknown.
#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
pub struct NoMetadata {}
