//! Durations as Dapr and Go write them (`"5s"`, `"100ms"`, `"1m30s"`,
//! `"1.5s"`, `"1h"`): one parser for component metadata and the
//! configuration's sections.

use std::time::Duration;

/// A Go duration without sign: one or more `<number><unit>` groups
/// (`ns`, `us`, `ms`, `s`, `m`, `h`). `None` when malformed; a value too
/// large for a [`Duration`] saturates to [`Duration::MAX`].
pub fn parse_go_duration(mut text: &str) -> Option<Duration> {
    if text.is_empty() {
        return None;
    }
    let mut total = 0.0_f64;
    while !text.is_empty() {
        let number_len = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, rest) = text.split_at(number_len);
        let value: f64 = number.parse().ok()?;
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let (unit, rest) = rest.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += value * scale;
        text = rest;
    }
    Some(seconds(total))
}

/// `value` seconds; too many for a `Duration` saturates.
fn seconds(value: f64) -> Duration {
    Duration::try_from_secs_f64(value).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("5"), None);
        assert_eq!(parse_go_duration("5x"), None);
        assert_eq!(parse_go_duration(""), None);
    }
}
