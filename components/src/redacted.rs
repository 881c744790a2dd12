//! How the components show a secret in their `Debug` output.

/// `<redacted>` for a set secret, nothing for an empty one (so a missing
/// password still shows as missing).
pub(crate) fn redacted(secret: &str) -> &'static str {
    if secret.is_empty() {
        ""
    } else {
        "<redacted>"
    }
}
