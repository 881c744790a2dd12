//! API tokens, compared in constant time.

use subtle::ConstantTimeEq;

use rewire_runtime::SecretString;

/// The header (HTTP) and metadata key (gRPC) carrying the app token, as in
/// Dapr.
pub const APP_TOKEN_HEADER: &str = "dapr-api-token";
/// The header / metadata key carrying the admin token for the Lifecycle API.
pub const ADMIN_TOKEN_HEADER: &str = "rewire-admin-token";

/// A token a caller must present. Never printed.
#[derive(Debug, Clone)]
pub struct ApiToken(SecretString);

impl ApiToken {
    /// A token with the given value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(SecretString::new(value))
    }

    /// Whether `presented` is this token (constant time in the length of
    /// the presented value).
    pub fn matches(&self, presented: &[u8]) -> bool {
        let expected = self.0.expose().as_bytes();
        expected.len() == presented.len() && bool::from(expected.ct_eq(presented))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_token_matches() {
        let token = ApiToken::new("s3cr3t-token");
        assert!(token.matches(b"s3cr3t-token"));
        assert!(!token.matches(b"s3cr3t-tokeN"));
        assert!(!token.matches(b"s3cr3t"));
        assert!(!token.matches(b""));
        assert_eq!(format!("{token:?}"), "ApiToken([redacted])");
    }
}
