//! The arguments of the `redis` state store's scripts, shared by single
//! writes and transactions: the etag as the scripts compare it and the TTL
//! in milliseconds.

use std::collections::HashMap;
use std::time::Duration;

use rewire_runtime::StateError;

use crate::time_limits::{check_ttl, check_ttl_seconds};

/// The request metadata key Dapr uses for a per-write TTL.
const TTL_METADATA_KEY: &str = "ttlInSeconds";

/// The etag as the script compares it: the version number in canonical
/// text, or `""` for none.
pub(super) fn etag_arg(key: &str, etag: Option<&str>) -> Result<String, StateError> {
    match etag.map(str::trim).filter(|e| !e.is_empty()) {
        None => Ok(String::new()),
        Some(etag) => etag
            .parse::<u64>()
            .map(|v| v.to_string())
            .map_err(|_| StateError::EtagInvalid(key.to_string())),
    }
}

/// The TTL argument of the set script, in milliseconds: `> 0` expire,
/// `< 0` never expire (clear an older TTL), `0` leave the TTL alone.
///
/// The first of these that is set decides: the request's `ttl` (exactly
/// zero: never expire; under a millisecond: 1 ms), its `ttlInSeconds`
/// metadata (`-1` or more, as Dapr's `ParseTTL`), the store's
/// `ttlInSeconds` (for both, zero or negative, like Dapr's `-1`: never
/// expire). Each is at most
/// [`MAX_TTL_SECONDS`](crate::time_limits::MAX_TTL_SECONDS).
pub(super) fn ttl_arg(
    key: &str,
    ttl: Option<Duration>,
    metadata: &HashMap<String, String>,
    default_ttl_in_seconds: Option<i64>,
) -> Result<i64, StateError> {
    let invalid = |message: String| StateError::Invalid(format!("key `{key}`: {message}"));
    if let Some(ttl) = ttl {
        let ttl = check_ttl("ttl", ttl).map_err(invalid)?;
        // Only an exact zero never expires; a sub-millisecond TTL rounds
        // up to 1 ms (it still expires). At most MAX_TTL: the milliseconds
        // fit in an i64.
        if ttl.is_zero() {
            return Ok(-1);
        }
        return Ok(i64::try_from(ttl.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX));
    }
    let requested = metadata
        .get(TTL_METADATA_KEY)
        .map(|t| t.trim())
        .filter(|t| !t.is_empty());
    let seconds = match requested {
        Some(text) => Some(requested_seconds(key, text)?),
        None => default_ttl_in_seconds,
    };
    let seconds = seconds
        .map(|s| check_ttl_seconds(TTL_METADATA_KEY, s).map_err(invalid))
        .transpose()?;
    Ok(match seconds {
        None => 0,
        Some(s) if s <= 0 => -1,
        Some(s) => s.saturating_mul(1000),
    })
}

/// A request's `ttlInSeconds` metadata: a whole number of seconds, `0` or
/// less never expiring, as Dapr's Redis store takes it (its own
/// `parseTTL`, not the `ParseTTL` of other stores, which refuses below -1).
fn requested_seconds(key: &str, text: &str) -> Result<i64, StateError> {
    text.parse::<i64>().map_err(|_| {
        StateError::Invalid(format!(
            "metadata `{TTL_METADATA_KEY}` of key `{key}` is not a whole number of seconds: `{text}`"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(ttl: &str) -> HashMap<String, String> {
        HashMap::from([(TTL_METADATA_KEY.to_string(), ttl.to_string())])
    }

    #[test]
    fn ttl_argument() {
        let none = HashMap::new();
        assert_eq!(
            ttl_arg("k", Some(Duration::from_millis(1500)), &meta("9"), Some(7)),
            Ok(1500)
        );
        assert_eq!(ttl_arg("k", Some(Duration::ZERO), &none, None), Ok(-1));
        assert_eq!(ttl_arg("k", None, &meta("9"), Some(7)), Ok(9000));
        assert_eq!(ttl_arg("k", None, &meta("-1"), Some(7)), Ok(-1));
        assert_eq!(ttl_arg("k", None, &none, Some(7)), Ok(7000));
        assert_eq!(ttl_arg("k", None, &none, Some(-1)), Ok(-1));
        assert_eq!(ttl_arg("k", None, &none, None), Ok(0));
        assert!(matches!(
            ttl_arg("k", None, &meta("soon"), None),
            Err(StateError::Invalid(m)) if m.contains("ttlInSeconds")
        ));
        for (ttl, meta) in [
            (Some(Duration::MAX), none.clone()),
            (None, meta(&i64::MAX.to_string())),
        ] {
            let err = ttl_arg("k", ttl, &meta, None);
            assert!(
                matches!(&err, Err(StateError::Invalid(m)) if m.contains("2147483647")),
                "{err:?}"
            );
        }
    }

    /// Only an exact zero never expires: a TTL under a millisecond expires
    /// after 1 ms, and a fraction of a millisecond rounds up. Before: under
    /// a millisecond read as 0 ms, which meant never expire.
    #[test]
    fn a_sub_millisecond_ttl_still_expires() {
        let none = HashMap::new();
        let ttl = |ttl: Duration| ttl_arg("k", Some(ttl), &none, None);
        assert_eq!(ttl(Duration::ZERO), Ok(-1));
        assert_eq!(ttl(Duration::from_nanos(1)), Ok(1));
        assert_eq!(ttl(Duration::from_micros(999)), Ok(1));
        assert_eq!(ttl(Duration::from_micros(1001)), Ok(2));
        assert_eq!(ttl(Duration::from_millis(1)), Ok(1));
    }

    /// A request's `ttlInSeconds` below -1 is refused naming the field, as
    /// Dapr's `ParseTTL` refuses it; -1 and 0 still mean never expire.
    /// Before: any negative value was taken as never expire.
    #[test]
    fn a_requested_ttl_in_seconds_of_zero_or_less_never_expires_as_daprs_redis_store() {
        for text in ["-1", "0", "-2", &i64::MIN.to_string()] {
            assert_eq!(ttl_arg("k", None, &meta(text), Some(7)), Ok(-1), "{text}");
        }
    }

    #[test]
    fn etags_are_canonical_versions() {
        assert_eq!(etag_arg("k", None), Ok(String::new()));
        assert_eq!(etag_arg("k", Some(" ")), Ok(String::new()));
        assert_eq!(etag_arg("k", Some("007")), Ok("7".into()));
        assert_eq!(
            etag_arg("k", Some("x1")),
            Err(StateError::EtagInvalid("k".into()))
        );
    }
}
