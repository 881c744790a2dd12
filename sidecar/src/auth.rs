//! API tokens, compared in constant time.

use subtle::ConstantTimeEq;

use rewire_runtime::SecretString;

/// The header (HTTP) and metadata key (gRPC) carrying the app token, as in
/// Dapr.
pub const APP_TOKEN_HEADER: &str = "dapr-api-token";
/// The header / metadata key carrying the admin token for the Lifecycle API.
pub const ADMIN_TOKEN_HEADER: &str = "rewire-admin-token";

/// A token a caller must present. Never printed.
#[derive(Clone)]
pub struct ApiToken {
    value: SecretString,
    /// SHA-256 of the value: what a presented value's digest is compared
    /// with, so the comparison's time tells nothing of the token, not even
    /// its length.
    digest: [u8; 32],
}

impl ApiToken {
    /// A token with the given value.
    pub fn new(value: impl Into<String>) -> Self {
        let value = SecretString::new(value);
        let digest = sha256(value.expose().as_bytes());
        Self { value, digest }
    }

    /// `check` run on the token's value (which never leaves this call but
    /// through `check`'s own error).
    pub(crate) fn check_presentable(
        &self,
        check: impl FnOnce(&str) -> Result<(), String>,
    ) -> Result<(), String> {
        check(self.value.expose())
    }

    /// Whether `presented` is this token: their digests compared in
    /// constant time (a length compared first would tell the token's).
    pub fn matches(&self, presented: &[u8]) -> bool {
        bool::from(self.digest.ct_eq(&sha256(presented)))
    }
}

impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ApiToken").field(&self.value).finish()
    }
}

/// SHA-256 of `bytes`.
fn sha256(bytes: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0; 32];
    out.copy_from_slice(digest.as_ref());
    out
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

    /// A presented value is compared by digest: one longer or shorter than
    /// the token, or sharing its prefix, never matches, and nothing of the
    /// token or its digest is printed.
    #[test]
    fn values_of_other_lengths_never_match() {
        let token = ApiToken::new("abc");
        for other in [&b"ab"[..], b"abcd", b"abc\0", b"ABC", b"\0abc"] {
            assert!(!token.matches(other), "{other:?}");
        }
        assert!(token.matches(b"abc"));
        let shown = format!("{token:?} {token:#?}");
        assert!(
            !shown.contains("abc") && !shown.contains("digest"),
            "{shown}"
        );
    }
}
