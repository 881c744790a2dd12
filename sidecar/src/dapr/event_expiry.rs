//! A CloudEvent's `expiration` (set from `ttlInSeconds` at publish, by
//! rewire or by another Dapr sidecar): an event past it is not delivered,
//! as Dapr does for brokers without a native TTL (memory, redis).

use std::time::{SystemTime, UNIX_EPOCH};

/// Whether a CloudEvent whose `expiration` member is `expiration` (when
/// it is a string) lies before now. No `expiration`, or one that is not
/// RFC 3339, never expires (Dapr's rule).
pub fn has_expired(expiration: Option<&str>) -> bool {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    expired_at(expiration, now)
}

fn expired_at(expiration: Option<&str>, now: i64) -> bool {
    expiration
        .and_then(rfc3339_seconds)
        .is_some_and(|expiration| expiration < now)
}

/// Seconds since the Unix epoch of an RFC 3339 time
/// (`2026-12-06T10:00:00Z`, `…00.123+02:00`); fractions are cut.
fn rfc3339_seconds(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    if bytes.len() < 20
        || bytes[4] != b'-'
        || bytes[7] != b'-'
        || bytes[13] != b':'
        || bytes[16] != b':'
    {
        return None;
    }
    if !matches!(bytes[10], b'T' | b't' | b' ') {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &text[19..];
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &fraction[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let zone = rest.get(1..)?;
            if zone.len() != 5 || zone.as_bytes()[2] != b':' {
                return None;
            }
            let (hours, minutes) = (
                zone[0..2].parse::<i64>().ok()?,
                zone[3..5].parse::<i64>().ok()?,
            );
            if hours > 23 || minutes > 59 {
                return None;
            }
            sign * (hours * 3_600 + minutes * 60)
        }
    };
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second - offset)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times_are_read_with_fractions_and_offsets() {
        assert_eq!(rfc3339_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_seconds("2000-03-01T00:00:00Z"), Some(951_868_800));
        assert_eq!(
            rfc3339_seconds("2026-12-06T01:02:03.456Z"),
            Some(1_796_518_923)
        );
        assert_eq!(
            rfc3339_seconds("2026-12-06T03:02:03+02:00"),
            Some(1_796_518_923)
        );
        assert_eq!(
            rfc3339_seconds("2026-12-05T23:02:03-02:00"),
            Some(1_796_518_923)
        );
        for bad in [
            "",
            "tomorrow",
            "2026-13-01T00:00:00Z",
            "2026-12-06T01:02:03",
            "2026-12-06T01:02:03+0200",
            "2026-12-06T01:02:03.Z",
            "２026-12-06T01:02:03Z",
        ] {
            assert_eq!(rfc3339_seconds(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_event_past_its_expiration_has_expired_and_others_not() {
        let now = rfc3339_seconds("2026-12-06T01:00:00Z").unwrap();
        assert!(expired_at(Some("2026-12-06T00:59:59Z"), now));
        assert!(!expired_at(Some("2026-12-06T01:00:00Z"), now));
        assert!(!expired_at(Some("2026-12-06T01:00:01Z"), now));
        assert!(!expired_at(Some("not a time"), now));
        assert!(!expired_at(None, now));
    }
}
