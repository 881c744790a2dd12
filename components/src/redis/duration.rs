//! Timeouts as Dapr writes them: Go duration strings (`"5s"`, `"100ms"`,
//! `"1m30s"`, `"1.5s"`) or a plain number of milliseconds (`250`, `"250"`).
//! A negative value (`"-1"`, Dapr's "no timeout") is kept as
//! [`Timeout::Never`]; the empty string (a value injected later, during
//! validation) counts as not set. A positive value past
//! [`MAX_TIMEOUT`] (24 h) is an error, so no timeout can overflow the
//! arithmetic done with it.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};

use rewire_runtime::parse_go_duration;

use crate::time_limits::MAX_TIMEOUT;

/// A configured timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeout {
    /// Give up after this long (zero: the default applies).
    After(Duration),
    /// Never give up (a negative value in the metadata).
    Never,
}

/// Why a duration text did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` {reason}")]
pub struct DurationError {
    text: String,
    reason: Reason,
}

/// What is wrong with a duration text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum Reason {
    #[error("is not a duration (write `5s`, `100ms`, `1m30s`, or a number of milliseconds)")]
    Malformed,
    #[error("is longer than the 24h accepted (write a negative value for no limit)")]
    TooLong,
}

/// Parses `text`: a number of milliseconds, or a Go duration. `Ok(None)`
/// for the empty string.
pub fn parse_timeout(text: &str) -> Result<Option<Timeout>, DurationError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let error = || DurationError {
        text: text.to_string(),
        reason: Reason::Malformed,
    };
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if body.starts_with(['-', '+']) {
        return Err(error());
    }
    let duration = match body.parse::<f64>() {
        Ok(ms) if ms.is_finite() => seconds(ms / 1000.0),
        _ => parse_go_duration(body).ok_or_else(error)?,
    };
    if !negative && duration > MAX_TIMEOUT {
        return Err(DurationError {
            text: text.to_string(),
            reason: Reason::TooLong,
        });
    }
    Ok(Some(if negative && !duration.is_zero() {
        Timeout::Never
    } else {
        Timeout::After(duration)
    }))
}

/// `value` seconds (never negative nor NaN here); too many for a
/// `Duration` saturates, and is then refused as too long.
fn seconds(value: f64) -> Duration {
    Duration::try_from_secs_f64(value).unwrap_or(Duration::MAX)
}

/// `deserialize_with` for an optional timeout field.
pub fn deserialize_timeout<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Timeout>, D::Error> {
    deserializer.deserialize_any(TimeoutVisitor)
}

struct TimeoutVisitor;

impl Visitor<'_> for TimeoutVisitor {
    type Value = Option<Timeout>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration such as `5s` or `100ms`, or a number of milliseconds")
    }

    fn visit_u64<E: de::Error>(self, ms: u64) -> Result<Self::Value, E> {
        parse_timeout(&ms.to_string()).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, ms: i64) -> Result<Self::Value, E> {
        match u64::try_from(ms) {
            Ok(ms) => self.visit_u64(ms),
            Err(_) => Ok(Some(Timeout::Never)),
        }
    }

    fn visit_f64<E: de::Error>(self, ms: f64) -> Result<Self::Value, E> {
        parse_timeout(&ms.to_string()).map_err(E::custom)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        parse_timeout(text).map_err(E::custom)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(ms: u64) -> Result<Option<Timeout>, DurationError> {
        Ok(Some(Timeout::After(Duration::from_millis(ms))))
    }

    #[test]
    fn go_durations_and_milliseconds() {
        assert_eq!(parse_timeout("5s"), after(5000));
        assert_eq!(parse_timeout("100ms"), after(100));
        assert_eq!(parse_timeout("1m30s"), after(90_000));
        assert_eq!(parse_timeout("1.5s"), after(1500));
        assert_eq!(parse_timeout("1h"), after(3_600_000));
        assert_eq!(parse_timeout(" 250 "), after(250));
        assert_eq!(parse_timeout("0"), after(0));
        assert_eq!(parse_timeout(""), Ok(None));
    }

    #[test]
    fn timeouts_past_a_day_are_refused() {
        assert_eq!(parse_timeout("24h"), after(86_400_000));
        for long in [
            "1e22",
            "25h",
            "86400001",
            "1e308",
            "9223372036854775807",
            "9999999999999999h",
        ] {
            let err = parse_timeout(long).map(|_| ()).map_err(|e| e.to_string());
            assert!(
                matches!(&err, Err(m) if m.contains("24h")),
                "{long}: {err:?}"
            );
        }
        let json: Result<Option<Timeout>, _> = deserialize_timeout(serde_json::json!(u64::MAX));
        assert!(json.is_err());
        let json: Result<Option<Timeout>, _> = deserialize_timeout(serde_json::json!(1e22));
        assert!(json.is_err());
        assert_eq!(parse_timeout("-1e22"), Ok(Some(Timeout::Never)));
    }

    #[test]
    fn negative_means_never_and_junk_is_an_error() {
        assert_eq!(parse_timeout("-1"), Ok(Some(Timeout::Never)));
        assert_eq!(parse_timeout("-1s"), Ok(Some(Timeout::Never)));
        for junk in ["5 seconds", "s", "5x", "1..2s", "--1"] {
            let err = parse_timeout(junk).map(|_| ()).map_err(|e| e.to_string());
            assert!(
                matches!(&err, Err(m) if m.contains(junk.trim())),
                "{junk}: {err:?}"
            );
        }
    }
}
