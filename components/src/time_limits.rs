//! Limits on the times that come from metadata or requests (TTLs, lock
//! expiries, timeouts), so that no arithmetic on them can overflow.
//!
//! A value past a limit is an error naming the field: a metadata field is
//! refused when it is decoded (so `rewire validate` reports it), a request
//! field with an invalid-argument error. Nothing adds a user's duration to
//! an instant unchecked.

use std::time::Duration;

use serde::de::{Deserializer, Error as _};
use serde::Deserialize;
use tokio::time::Instant;

/// The longest TTL (`ttlInSeconds`, `defaultTtlInSeconds`, a request's
/// TTL) and lock expiry: 2147483647 s (about 68 years), Dapr's limit.
pub const MAX_TTL_SECONDS: i64 = i32::MAX as i64;

/// [`MAX_TTL_SECONDS`] as a duration.
pub const MAX_TTL: Duration = Duration::from_secs(MAX_TTL_SECONDS as u64);

/// The longest timeout a metadata field may ask for (`dialTimeout`,
/// `readTimeout`, `writeTimeout`): 24 hours. A negative value still means
/// "no limit" where a field allows it.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Why a time is out of range, worded for the request or metadata `field`.
pub(crate) fn ttl_out_of_range(field: &str, shown: impl std::fmt::Display) -> String {
    format!("`{field}` is {shown}, past the {MAX_TTL_SECONDS} s accepted")
}

/// Checks a TTL given in seconds: at most [`MAX_TTL_SECONDS`] (zero and
/// negative values pass: they mean "never expire" or "no default").
pub(crate) fn check_ttl_seconds(field: &str, seconds: i64) -> Result<i64, String> {
    if seconds > MAX_TTL_SECONDS {
        Err(ttl_out_of_range(field, format!("{seconds} s")))
    } else {
        Ok(seconds)
    }
}

/// Checks a TTL or expiry given as a duration: at most [`MAX_TTL`].
pub(crate) fn check_ttl(field: &str, ttl: Duration) -> Result<Duration, String> {
    if ttl > MAX_TTL {
        Err(ttl_out_of_range(field, format!("{} s", ttl.as_secs())))
    } else {
        Ok(ttl)
    }
}

/// `now + after`, or an error naming `field` when the sum is not a
/// representable instant.
pub(crate) fn deadline(now: Instant, field: &str, after: Duration) -> Result<Instant, String> {
    now.checked_add(after)
        .ok_or_else(|| ttl_out_of_range(field, format!("{} s", after.as_secs())))
}

/// `deserialize_with` for a TTL metadata field in whole seconds (`i64`):
/// refuses values past [`MAX_TTL_SECONDS`], naming the field.
pub fn deserialize_ttl_seconds<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<i64, D::Error> {
    let seconds = i64::deserialize(deserializer)?;
    check_ttl_seconds_value(seconds).map_err(D::Error::custom)
}

/// `deserialize_with` for an optional TTL metadata field in whole seconds.
pub fn deserialize_optional_ttl_seconds<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<i64>, D::Error> {
    match Option::<i64>::deserialize(deserializer)? {
        None => Ok(None),
        Some(seconds) => check_ttl_seconds_value(seconds)
            .map(Some)
            .map_err(D::Error::custom),
    }
}

/// The serde message: the field name is added by the metadata decoder.
fn check_ttl_seconds_value(seconds: i64) -> Result<i64, String> {
    if seconds > MAX_TTL_SECONDS {
        Err(format!(
            "{seconds} s is past the {MAX_TTL_SECONDS} s accepted (use 0 or -1 for no TTL)"
        ))
    } else {
        Ok(seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_past_the_limit_are_refused_naming_the_field() {
        assert_eq!(check_ttl_seconds("ttlInSeconds", -1), Ok(-1));
        assert_eq!(
            check_ttl_seconds("ttlInSeconds", MAX_TTL_SECONDS),
            Ok(MAX_TTL_SECONDS)
        );
        let err = check_ttl_seconds("ttlInSeconds", i64::MAX).expect_err("too long");
        assert!(err.contains("`ttlInSeconds`"), "{err}");
        assert!(check_ttl("ttl", Duration::MAX).is_err());
        assert!(deadline(Instant::now(), "ttl", Duration::MAX).is_err());
    }

    #[test]
    fn deserializers_check_the_range() {
        let ok: Result<i64, _> = deserialize_ttl_seconds(serde_json::json!(30));
        assert_eq!(ok.ok(), Some(30));
        let err = deserialize_ttl_seconds(serde_json::json!(i64::MAX)).expect_err("too long");
        assert!(err.to_string().contains("2147483647"), "{err}");
        let none = deserialize_optional_ttl_seconds(serde_json::Value::Null);
        assert_eq!(none.ok(), Some(None));
    }
}
