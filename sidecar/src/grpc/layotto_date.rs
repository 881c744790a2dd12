//! File dates as Layotto's File API writes them: Go's `time.Time.String()`
//! (`2006-01-02 15:04:05.999999999 -0700 MST`), which its `local` and S3
//! stores put in `last_modified`; always in UTC here (`+0000 UTC`).

use std::time::{SystemTime, UNIX_EPOCH};

/// `time` as Go's `time.Time.String()` writes it in UTC: fractional
/// seconds without trailing zeros (none at all for a whole second), dates
/// before 1970 as they are.
pub(super) fn go_time_string(time: SystemTime) -> String {
    let (seconds, nanos) = match time.duration_since(UNIX_EPOCH) {
        Ok(after) => (saturating_i64(after.as_secs()), after.subsec_nanos()),
        Err(before) => {
            let before = before.duration();
            let seconds = saturating_i64(before.as_secs()).saturating_neg();
            match before.subsec_nanos() {
                0 => (seconds, 0),
                nanos => (seconds.saturating_sub(1), 1_000_000_000 - nanos),
            }
        }
    };
    let (days, second_of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    let year = if year < 0 {
        format!("-{:04}", year.unsigned_abs())
    } else {
        format!("{year:04}")
    };
    let fraction = if nanos == 0 {
        String::new()
    } else {
        format!(".{nanos:09}").trim_end_matches('0').to_string()
    };
    format!(
        "{year}-{month:02}-{day:02} {:02}:{:02}:{:02}{fraction} +0000 UTC",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60
    )
}

fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The proleptic Gregorian (year, month, day) of `days` since 1970-01-01
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    // Both in range by construction (1..=12, 1..=31).
    (year, month as u32, day as u32)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(seconds: i64, nanos: u32) -> SystemTime {
        let whole = Duration::from_secs(seconds.unsigned_abs());
        let time = if seconds < 0 {
            UNIX_EPOCH - whole
        } else {
            UNIX_EPOCH + whole
        };
        time + Duration::from_nanos(u64::from(nanos))
    }

    #[test]
    fn dates_read_as_gos_time_string_in_utc() {
        assert_eq!(go_time_string(at(0, 0)), "1970-01-01 00:00:00 +0000 UTC");
        // Go trims the fraction's trailing zeros.
        assert_eq!(
            go_time_string(at(1_700_000_000, 120_000_000)),
            "2023-11-14 22:13:20.12 +0000 UTC"
        );
        assert_eq!(
            go_time_string(at(951_782_400, 1)),
            "2000-02-29 00:00:00.000000001 +0000 UTC"
        );
        // Before 1970, half a second before midnight.
        assert_eq!(
            go_time_string(at(-1, 500_000_000)),
            "1969-12-31 23:59:59.5 +0000 UTC"
        );
        assert_eq!(
            go_time_string(at(-315_619_200, 0)),
            "1960-01-01 00:00:00 +0000 UTC"
        );
        assert_eq!(
            go_time_string(at(253_402_300_800, 0)),
            "10000-01-01 00:00:00 +0000 UTC"
        );
    }
}
