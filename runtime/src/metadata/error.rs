//! Why metadata did not decode.

/// Why metadata did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// A field the component does not know.
    #[error("unknown metadata field `{field}`{}", suggestion_text(.suggestion, .known))]
    UnknownField {
        /// The offending field path.
        field: String,
        /// The closest known field name, if one is close.
        suggestion: Option<String>,
        /// Every field the component knows at that level.
        known: Vec<String>,
    },
    /// A field whose value has the wrong type, or is missing.
    #[error("metadata field `{field}`: {message}")]
    Invalid {
        /// The field path (`.` for the whole object).
        field: String,
        /// What serde expected.
        message: String,
    },
}

fn suggestion_text(suggestion: &Option<String>, known: &[String]) -> String {
    match suggestion {
        Some(s) => format!(" (did you mean `{s}`?)"),
        None if known.is_empty() => " (this component takes no metadata)".to_string(),
        None => format!(" (known fields: {})", known.join(", ")),
    }
}
