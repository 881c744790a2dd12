//! Which time-to-live a write gets, with Dapr's rules, and when it ends.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rewire_runtime::StateError;
use tokio::time::Instant;

use crate::time_limits::{check_ttl, check_ttl_seconds, deadline, ttl_out_of_range};

/// The request metadata key Dapr uses for a per-write TTL.
pub(crate) const TTL_METADATA_KEY: &str = "ttlInSeconds";

/// The response metadata key of a read entry's expiry (Dapr's
/// `state.GetRespMetaKeyTTLExpireTime`).
pub(crate) const TTL_EXPIRE_TIME_KEY: &str = "ttlExpireTime";

/// When an entry expires: on the monotonic clock, which decides, and on
/// the wall clock, which a read reports as `ttlExpireTime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expiry {
    /// The entry is gone from this instant on.
    pub at: Instant,
    /// The same moment, by the wall clock at the write.
    pub wall: SystemTime,
}

impl Expiry {
    /// `ttl` after `now` (and after the wall clock's now); an error naming
    /// `ttl` when either clock cannot hold it.
    pub(crate) fn after(now: Instant, ttl: Duration) -> Result<Self, String> {
        let at = deadline(now, "ttl", ttl)?;
        let wall = SystemTime::now()
            .checked_add(ttl)
            .ok_or_else(|| ttl_out_of_range("ttl", format!("{} s", ttl.as_secs())))?;
        Ok(Self { at, wall })
    }

    /// The wall-clock expiry as Dapr's in-memory store reports it:
    /// RFC 3339 in UTC, to the second (Go's `time.RFC3339`).
    pub(crate) fn rfc3339(&self) -> String {
        let secs = self
            .wall
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        rewire_runtime::rfc3339_utc(secs)
    }
}

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
    fn expiry_times_are_rfc3339_utc_to_the_second() {
        let at = |secs: u64, millis: u64| Expiry {
            at: Instant::now(),
            wall: UNIX_EPOCH + Duration::from_millis(secs * 1000 + millis),
        };
        assert_eq!(at(0, 0).rfc3339(), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400, 999).rfc3339(), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_767_225_599, 0).rfc3339(), "2025-12-31T23:59:59Z");
        assert_eq!(at(4_102_444_799, 500).rfc3339(), "2099-12-31T23:59:59Z");
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
