//! Which time-to-live a write gets, with Dapr's rules.

use std::collections::HashMap;
use std::time::Duration;

use rewire_runtime::StateError;

use crate::time_limits::{check_ttl, check_ttl_seconds};

/// The request metadata key Dapr uses for a per-write TTL.
pub(crate) const TTL_METADATA_KEY: &str = "ttlInSeconds";

/// The TTL of a write, or `None` for "never expires".
///
/// The first of these that is set decides: the request's `ttl` (zero means
/// never expire), its `ttlInSeconds` metadata (zero or negative, like Dapr's
/// `-1`, means never expire), the store's `defaultTtlInSeconds` (zero or
/// negative: no default). Each is at most
/// [`MAX_TTL_SECONDS`](crate::time_limits::MAX_TTL_SECONDS): a longer one
/// is an invalid request naming the field.
pub(crate) fn write_ttl(
    key: &str,
    ttl: Option<Duration>,
    metadata: &HashMap<String, String>,
    default_ttl_in_seconds: i64,
) -> Result<Option<Duration>, StateError> {
    let invalid = |message: String| StateError::Invalid(format!("key `{key}`: {message}"));
    if let Some(ttl) = ttl {
        let ttl = check_ttl("ttl", ttl).map_err(invalid)?;
        return Ok(Some(ttl).filter(|ttl| !ttl.is_zero()));
    }
    if let Some(text) = metadata
        .get(TTL_METADATA_KEY)
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
    {
        let seconds: i64 = text.parse().map_err(|_| {
            StateError::Invalid(format!(
                "metadata `{TTL_METADATA_KEY}` of key `{key}` is not a whole number of seconds: `{text}`"
            ))
        })?;
        let seconds = check_ttl_seconds(TTL_METADATA_KEY, seconds).map_err(invalid)?;
        return Ok(seconds_ttl(seconds));
    }
    let seconds =
        check_ttl_seconds("defaultTtlInSeconds", default_ttl_in_seconds).map_err(invalid)?;
    Ok(seconds_ttl(seconds))
}

fn seconds_ttl(seconds: i64) -> Option<Duration> {
    u64::try_from(seconds)
        .ok()
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(ttl: &str) -> HashMap<String, String> {
        HashMap::from([(TTL_METADATA_KEY.to_string(), ttl.to_string())])
    }

    #[test]
    fn request_ttl_wins_then_metadata_then_default() {
        let none = HashMap::new();
        assert_eq!(
            write_ttl("k", Some(Duration::from_millis(50)), &meta("9"), 7),
            Ok(Some(Duration::from_millis(50)))
        );
        assert_eq!(
            write_ttl("k", None, &meta("9"), 7),
            Ok(Some(Duration::from_secs(9)))
        );
        assert_eq!(
            write_ttl("k", None, &none, 7),
            Ok(Some(Duration::from_secs(7)))
        );
        assert_eq!(write_ttl("k", None, &none, 0), Ok(None));
    }

    #[test]
    fn minus_one_and_zero_mean_never_even_with_a_default() {
        assert_eq!(write_ttl("k", None, &meta("-1"), 7), Ok(None));
        assert_eq!(write_ttl("k", None, &meta("0"), 7), Ok(None));
        assert_eq!(
            write_ttl("k", Some(Duration::ZERO), &HashMap::new(), 7),
            Ok(None)
        );
        assert_eq!(
            write_ttl("k", None, &meta(""), 7),
            Ok(Some(Duration::from_secs(7)))
        );
    }

    #[test]
    fn a_ttl_past_the_limit_is_invalid_naming_the_field() {
        let max = i64::MAX.to_string();
        let cases = [
            (write_ttl("k", None, &meta(&max), 0), "ttlInSeconds"),
            (
                write_ttl("k", Some(Duration::MAX), &HashMap::new(), 0),
                "ttl",
            ),
            (
                write_ttl("k", None, &HashMap::new(), i64::MAX),
                "defaultTtlInSeconds",
            ),
        ];
        for (result, field) in cases {
            let err = result.expect_err("past the limit");
            assert!(
                matches!(err, StateError::Invalid(ref m) if m.contains(&format!("`{field}`"))),
                "{err}"
            );
        }
    }

    #[test]
    fn a_malformed_ttl_is_invalid() {
        let err = write_ttl("k", None, &meta("soon"), 0).expect_err("expected an error");
        assert!(
            matches!(err, StateError::Invalid(ref m) if m.contains("ttlInSeconds")),
            "{err}"
        );
    }
}
