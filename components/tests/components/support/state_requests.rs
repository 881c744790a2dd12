//! State requests the state store tests build again and again.

use rewire_runtime::{DeleteRequest, SetRequest};

/// A set of `value` (its UTF-8 bytes) at `key`, at `etag` when given.
pub fn write(key: &str, value: &str, etag: Option<&str>) -> SetRequest {
    SetRequest {
        key: key.into(),
        value: value.as_bytes().to_vec(),
        etag: etag.map(Into::into),
        ..SetRequest::default()
    }
}

/// A delete of `key`, at `etag` when given.
pub fn delete(key: &str, etag: Option<&str>) -> DeleteRequest {
    DeleteRequest {
        key: key.into(),
        etag: etag.map(Into::into),
        ..DeleteRequest::default()
    }
}
