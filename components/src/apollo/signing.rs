//! Apollo's access-key signature: every config service request of an app
//! with an access key carries
//!
//! ```text
//! Authorization: Apollo {appId}:{base64(HMAC-SHA1(secret, timestamp + "\n" + pathWithQuery))}
//! Timestamp: {unix millis}
//! ```
//!
//! where `pathWithQuery` is the request's path and query exactly as sent.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha1::Sha1;

/// Name of the header carrying the signing time.
pub(crate) const TIMESTAMP_HEADER: &str = "Timestamp";

/// The signature of `path_with_query` at `timestamp` (unix millis, as
/// text) with `secret`.
pub(crate) fn signature(timestamp: &str, path_with_query: &str, secret: &str) -> String {
    // HMAC accepts keys of any length, so this never fails.
    let mut mac = match Hmac::<Sha1>::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(timestamp.as_bytes());
    mac.update(b"\n");
    mac.update(path_with_query.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// The `Authorization` and `Timestamp` header values for a request of
/// `app_id` to `path_with_query`, signed now.
pub(crate) fn headers(app_id: &str, path_with_query: &str, secret: &str) -> (String, String) {
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default()
        .to_string();
    let authorization = format!(
        "Apollo {app_id}:{}",
        signature(&timestamp, path_with_query, secret)
    );
    (authorization, timestamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector of Apollo's own `SignatureTest`.
    #[test]
    fn matches_apollos_reference_vector() {
        assert_eq!(
            signature(
                "1576478257344",
                "/configs/100004458/default/application?ip=10.0.0.1",
                "df23df3f59884980844ff3dada30fa97"
            ),
            "EoKyziXvKqzHgwx+ijDJwgVTDgE="
        );
    }

    #[test]
    fn headers_name_the_app_and_carry_a_timestamp() {
        let (authorization, timestamp) = headers("app", "/configs/app/default/application", "s");
        assert!(authorization.starts_with("Apollo app:"), "{authorization}");
        assert!(timestamp.parse::<u128>().is_ok(), "{timestamp}");
        let expected = signature(&timestamp, "/configs/app/default/application", "s");
        assert_eq!(authorization, format!("Apollo app:{expected}"));
    }
}
