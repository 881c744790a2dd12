//! Request values quoted back in error messages, cut to a readable length.
//!
//! An error names the key, resource or owner it refused, so the caller
//! sees which one; but a request may carry a value of megabytes, and an
//! error text travels in a gRPC `grpc-message` trailer, a JSON body and a
//! log line. Every message quoting a caller's value goes through
//! [`echoed`].

use std::borrow::Cow;

/// How many characters of a value an error message quotes.
pub const ECHO_LIMIT: usize = 200;

/// `value` as an error message quotes it: whole up to [`ECHO_LIMIT`]
/// characters, else its first [`ECHO_LIMIT`] characters and `…`.
pub fn echoed(value: &str) -> Cow<'_, str> {
    match value.char_indices().nth(ECHO_LIMIT) {
        Some((cut, _)) => Cow::Owned(format!("{}…", &value[..cut])),
        None => Cow::Borrowed(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_cut_on_a_character_boundary() {
        assert_eq!(echoed("order-42"), "order-42");
        let exact = "x".repeat(ECHO_LIMIT);
        assert_eq!(echoed(&exact), exact);
        let long = "é".repeat(5 * ECHO_LIMIT);
        let shown = echoed(&long);
        assert_eq!(shown.chars().count(), ECHO_LIMIT + 1);
        assert!(shown.ends_with('…'), "{shown}");
    }
}
