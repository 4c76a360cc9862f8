//! Times as Pyroscope's API accepts them (`from`, `until`), parsed without reading a clock.
//!
//! Input: a query or ingest parameter such as `now-1h`, `1700000000` or `2026-11-22T10:00:00Z`,
//! and the current time, which the caller passes in so that parsing is pure and testable.
//! Output: a [`SystemTime`]. Callers: the aggregator's ingest and query handlers.
//!
//! # Formats
//!
//! - **Digits** (after removing `_`, `,` and spaces), by length, as Pyroscope's `attime`: 8 is
//!   `YYYYMMDD` (midnight UTC), 13 is unix milliseconds, 16 microseconds, 19 nanoseconds, and any
//!   other length unix seconds.
//! - **Relative**: `now`, or `now` or nothing followed by `+` or `-` and an offset: `now-1h`,
//!   `-1h`, `now+5m`. An offset is one or more `<number><unit>` parts that add up, so `now-3h30m`
//!   is three and a half hours ago. Units: `s`, `m`, `h`, `d`, `w`, `M` (30 days), `y` (365 days),
//!   also spelled `sec`, `min`, `hour`, `day`, `week`, `mon`, `month`, `year` and their plurals
//!   (`secs`, `mins`, ...). `m` is minutes and `M` months. Whitespace between parts is allowed.
//! - **RFC 3339**: `2026-11-22T10:00:00Z`, with a numeric offset (`+02:00`) and fractional
//!   seconds allowed.
//!
//! Surrounding whitespace is ignored. `now` is used as given, to the nanosecond.
//!
//! # Where this differs from Pyroscope
//!
//! Pyroscope silently reads what it cannot parse; Smolder reports it. Pyroscope truncates a
//! compound offset to its first part (`now-3h30m` is `now-3h` there); treats any text before the
//! sign as `now` (`yesterday-1h`); matches units by prefix, so an unknown unit counts as zero and
//! `now-5` or `now-1x` is `now`; and wraps numbers that overflow. Here each of these is a
//! [`TimeError`] naming the byte position. An empty input is an error too: callers map a missing
//! parameter to its default themselves.
//!
//! ```
//! use std::time::{Duration, UNIX_EPOCH};
//! use smolder_common::timestamp;
//!
//! let now = UNIX_EPOCH + Duration::from_secs(1_790_000_000);
//! assert_eq!(timestamp::parse("now-3h30m", now)?, now - Duration::from_secs(3 * 3600 + 1800));
//! assert_eq!(timestamp::parse("1_700_000_000", now)?, UNIX_EPOCH + Duration::from_secs(1_700_000_000));
//! assert_eq!(
//!     timestamp::parse("2026-11-22T12:00:00+02:00", now)?,
//!     timestamp::parse("2026-11-22T10:00:00Z", now)?,
//! );
//! # Ok::<(), smolder_common::TimeError>(())
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use time::format_description::well_known::Rfc3339;
use time::{Date, Month, OffsetDateTime};

use crate::series::Cursor;

/// Offset units and their length in seconds. Exact names only: Pyroscope's prefix matching made
/// `ms` minutes and any typo zero.
const UNITS: &[(&str, u64)] = &[
    ("s", 1),
    ("sec", 1),
    ("secs", 1),
    ("second", 1),
    ("seconds", 1),
    ("m", MINUTE),
    ("min", MINUTE),
    ("mins", MINUTE),
    ("minute", MINUTE),
    ("minutes", MINUTE),
    ("h", HOUR),
    ("hour", HOUR),
    ("hours", HOUR),
    ("d", DAY),
    ("day", DAY),
    ("days", DAY),
    ("w", 7 * DAY),
    ("week", 7 * DAY),
    ("weeks", 7 * DAY),
    ("M", 30 * DAY),
    ("mon", 30 * DAY),
    ("month", 30 * DAY),
    ("months", 30 * DAY),
    ("y", 365 * DAY),
    ("year", 365 * DAY),
    ("years", 365 * DAY),
];
const MINUTE: u64 = 60;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

/// The units, for error messages.
const UNIT_LIST: &str = "s, m, h, d, w, M (30 days) or y (365 days)";

/// Why a time could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TimeError {
    /// The input is empty or only whitespace.
    #[error(
        "empty time, expected unix seconds, YYYYMMDD, an RFC 3339 time or now with an offset \
         such as now-1h"
    )]
    Empty,
    /// Eight digits that are not a calendar date.
    #[error("invalid date {date:?} at position {position}, expected YYYYMMDD")]
    InvalidDate {
        /// The digits.
        date: String,
        /// Where they start.
        position: usize,
    },
    /// A number, an offset or the resulting time does not fit.
    #[error("time out of range at position {position}")]
    OutOfRange {
        /// Where the number or offset that overflows starts.
        position: usize,
    },
    /// Something other than `now` (or nothing) comes before the offset's sign.
    #[error("unknown time reference {reference:?} at position {position}, expected now")]
    UnknownReference {
        /// The text found.
        reference: String,
        /// Where it starts.
        position: usize,
    },
    /// A character is not allowed where it appears in an offset.
    #[error("invalid character {found:?} in offset at position {position}, expected {expected}")]
    InvalidCharacter {
        /// The character found.
        found: char,
        /// Its byte offset in the input.
        position: usize,
        /// What would have been accepted there.
        expected: &'static str,
    },
    /// The input ends where an offset should start.
    #[error("unexpected end of offset at position {position}, expected {expected}")]
    UnexpectedEnd {
        /// The input's length.
        position: usize,
        /// What would have been accepted there.
        expected: &'static str,
    },
    /// A number in an offset has no unit, as in `now-5`.
    #[error("missing unit at position {position}, expected {UNIT_LIST}")]
    MissingUnit {
        /// Where the unit should start.
        position: usize,
    },
    /// An offset's unit is not one of the known ones.
    #[error("unknown unit {unit:?} at position {position}, expected {UNIT_LIST}")]
    UnknownUnit {
        /// The unit found.
        unit: String,
        /// Where it starts.
        position: usize,
    },
    /// The input looks like an RFC 3339 time (it starts with `YYYY-`) but is not one.
    #[error("invalid RFC 3339 time {input:?} at position {position}: {error}")]
    InvalidRfc3339 {
        /// The input, trimmed.
        input: String,
        /// Where it starts.
        position: usize,
        /// What the parser said, which names the component that is wrong.
        error: time::error::Parse,
    },
}

/// Parses a time in any of the [formats](self) Pyroscope accepts, relative to `now`.
///
/// # Errors
///
/// A [`TimeError`] naming what is wrong and its byte position: an unknown reference or unit, a
/// missing unit, an invalid date or RFC 3339 time, or a time that does not fit in a
/// [`SystemTime`].
pub fn parse(input: &str, now: SystemTime) -> Result<SystemTime, TimeError> {
    let trimmed = input.trim_start();
    let start = input.len() - trimmed.len();
    let s = trimmed.trim_end();
    if s.is_empty() {
        return Err(TimeError::Empty);
    }
    let digits: String = s
        .chars()
        .filter(|c| !matches!(c, '_' | ',' | ' '))
        .collect();
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return parse_digits(&digits, start);
    }
    let bytes = s.as_bytes();
    if bytes.len() > 4 && bytes[..4].iter().all(u8::is_ascii_digit) && bytes[4] == b'-' {
        return OffsetDateTime::parse(s, &Rfc3339)
            .map_err(|error| TimeError::InvalidRfc3339 {
                input: s.to_owned(),
                position: start,
                error,
            })
            .and_then(|t| from_unix_nanos(t.unix_timestamp_nanos(), start));
    }
    let (reference, offset) = match s.find(['+', '-']) {
        Some(i) => (&s[..i], Some(i)),
        None => (s, None),
    };
    let reference = reference.trim_end();
    if !reference.is_empty() && reference != "now" {
        return Err(TimeError::UnknownReference {
            reference: reference.to_owned(),
            position: start,
        });
    }
    let Some(sign_at) = offset else {
        return Ok(now);
    };
    let offset = parse_offset_at(&s[sign_at + 1..], start + sign_at + 1)?;
    let shifted = if bytes[sign_at] == b'-' {
        now.checked_sub(offset)
    } else {
        now.checked_add(offset)
    };
    shifted.ok_or(TimeError::OutOfRange {
        position: start + sign_at,
    })
}

/// Parses an unsigned offset such as `1h` or `3h30m` (the part of `now-3h30m` after the sign)
/// into the duration it spans.
///
/// # Errors
///
/// A [`TimeError`] naming the byte position of a missing or unknown unit, a character that is
/// neither a digit nor a unit, or a total that does not fit in 64-bit seconds.
pub fn parse_offset(input: &str) -> Result<Duration, TimeError> {
    parse_offset_at(input, 0)
}

/// [`parse_offset`] of text that starts at byte `base` of the caller's input.
fn parse_offset_at(input: &str, base: usize) -> Result<Duration, TimeError> {
    let mut cur = Cursor::new(input);
    let mut total: u64 = 0;
    let mut parts = 0;
    loop {
        cur.skip_whitespace();
        let expected = if parts == 0 {
            "a number"
        } else {
            "a number or the end of the offset"
        };
        match cur.peek() {
            None if parts == 0 => {
                return Err(TimeError::UnexpectedEnd {
                    position: base + cur.pos,
                    expected,
                });
            }
            None => return Ok(Duration::from_secs(total)),
            Some(c) if c.is_ascii_digit() => {}
            Some(found) => {
                return Err(TimeError::InvalidCharacter {
                    found,
                    position: base + cur.pos,
                    expected,
                });
            }
        }
        let number_at = base + cur.pos;
        let out_of_range = TimeError::OutOfRange {
            position: number_at,
        };
        let number: u64 = cur
            .take_while(|c| c.is_ascii_digit())
            .parse()
            .map_err(|_| out_of_range.clone())?;
        let unit_at = base + cur.pos;
        let unit = cur.take_while(|c| c.is_ascii_alphabetic());
        if unit.is_empty() {
            return Err(TimeError::MissingUnit { position: unit_at });
        }
        let Some(&(_, seconds)) = UNITS.iter().find(|(name, _)| *name == unit) else {
            return Err(TimeError::UnknownUnit {
                unit: unit.to_owned(),
                position: unit_at,
            });
        };
        total = number
            .checked_mul(seconds)
            .and_then(|part| total.checked_add(part))
            .ok_or(out_of_range)?;
        parts += 1;
    }
}

/// A number by its digit count: a date, unix milliseconds, microseconds, nanoseconds or seconds.
fn parse_digits(digits: &str, position: usize) -> Result<SystemTime, TimeError> {
    let out_of_range = TimeError::OutOfRange { position };
    if digits.len() == 8 {
        return parse_date(digits, position);
    }
    // Up to 19 digits always fit in a u64; more can only be seconds, and far too many of them.
    let number: u64 = digits.parse().map_err(|_| out_of_range.clone())?;
    let since_epoch = match digits.len() {
        13 => Duration::from_millis(number),
        16 => Duration::from_micros(number),
        19 => Duration::from_nanos(number),
        _ => Duration::from_secs(number),
    };
    UNIX_EPOCH.checked_add(since_epoch).ok_or(out_of_range)
}

/// `YYYYMMDD` at midnight UTC.
fn parse_date(digits: &str, position: usize) -> Result<SystemTime, TimeError> {
    let invalid = || TimeError::InvalidDate {
        date: digits.to_owned(),
        position,
    };
    // The caller checked that these are ASCII digits, so the slices are on char boundaries and
    // the numbers parse.
    let field = |range: std::ops::Range<usize>| digits[range].parse::<u16>().map_err(|_| invalid());
    let year = field(0..4)?;
    let month = u8::try_from(field(4..6)?).map_err(|_| invalid())?;
    let day = u8::try_from(field(6..8)?).map_err(|_| invalid())?;
    let month = Month::try_from(month).map_err(|_| invalid())?;
    let date = Date::from_calendar_date(i32::from(year), month, day).map_err(|_| invalid())?;
    from_unix_nanos(
        date.midnight().assume_utc().unix_timestamp_nanos(),
        position,
    )
}

/// The [`SystemTime`] `nanos` nanoseconds from the unix epoch, which may be before it.
fn from_unix_nanos(nanos: i128, position: usize) -> Result<SystemTime, TimeError> {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let magnitude = nanos.unsigned_abs();
    let secs = u64::try_from(magnitude / NANOS_PER_SEC);
    let sub = u32::try_from(magnitude % NANOS_PER_SEC).expect("a remainder below 10^9 fits");
    let time = secs.ok().and_then(|secs| {
        let d = Duration::new(secs, sub);
        if nanos < 0 {
            UNIX_EPOCH.checked_sub(d)
        } else {
            UNIX_EPOCH.checked_add(d)
        }
    });
    time.ok_or(TimeError::OutOfRange { position })
}

/// Serde adapters for durations in config files, written the way the query API writes offsets:
/// `30d`, `1h30m`, `10s`.
///
/// ```
/// # use std::time::Duration;
/// #[derive(serde::Deserialize)]
/// struct Window {
///     #[serde(with = "smolder_common::timestamp::serde_duration")]
///     length: Duration,
/// }
/// let w: Window = serde_json::from_str(r#"{"length": "1m30s"}"#).unwrap();
/// assert_eq!(w.length, Duration::from_secs(90));
/// ```
pub mod serde_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    /// Writes the largest whole unit: `30d`, `2h`, `5m`, else seconds.
    pub fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        let secs = value.as_secs();
        let text = [(86_400, "d"), (3_600, "h"), (60, "m")]
            .iter()
            .find(|(unit, _)| secs > 0 && secs.is_multiple_of(*unit))
            .map_or_else(
                || format!("{secs}s"),
                |(unit, name)| format!("{}{name}", secs / unit),
            );
        s.serialize_str(&text)
    }

    /// Reads an offset such as `10s` or `1h30m` ([`super::parse_offset`]).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_offset(&text).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-09-21T14:13:20Z, a fixed clock.
    const NOW_SECS: u64 = 1_790_000_000;

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(NOW_SECS)
    }

    fn at(input: &str) -> SystemTime {
        parse(input, now()).unwrap_or_else(|e| panic!("{input}: {e}"))
    }

    fn err(input: &str) -> TimeError {
        parse(input, now()).expect_err(input)
    }

    fn ago(secs: u64) -> SystemTime {
        now() - Duration::from_secs(secs)
    }

    fn epoch_plus(d: Duration) -> SystemTime {
        UNIX_EPOCH + d
    }

    #[test]
    fn digits_by_length() {
        let secs = Duration::from_secs(1_700_000_000);
        assert_eq!(at("1700000000"), epoch_plus(secs));
        assert_eq!(at("1_700_000_000"), epoch_plus(secs));
        assert_eq!(at("1,700,000,000"), epoch_plus(secs));
        assert_eq!(at(" 1 700 000 000 "), epoch_plus(secs));
        assert_eq!(
            at("1700000000123"),
            epoch_plus(Duration::from_millis(1_700_000_000_123))
        );
        assert_eq!(
            at("1700000000123456"),
            epoch_plus(Duration::from_micros(1_700_000_000_123_456))
        );
        assert_eq!(
            at("1700000000123456789"),
            epoch_plus(Duration::from_nanos(1_700_000_000_123_456_789))
        );
        assert_eq!(at("0"), UNIX_EPOCH);
        // 12, 14 and 20 digits are seconds.
        assert_eq!(
            at("100000000000"),
            epoch_plus(Duration::from_secs(100_000_000_000))
        );
        assert_eq!(
            err("100000000000000000000"),
            TimeError::OutOfRange { position: 0 }
        );
        assert_eq!(
            err("  18446744073709551615"),
            TimeError::OutOfRange { position: 2 }
        );
    }

    #[test]
    fn eight_digits_are_a_date() {
        // 2026-11-22T00:00:00Z.
        assert_eq!(
            at("20261122"),
            epoch_plus(Duration::from_secs(1_795_305_600))
        );
        assert_eq!(at("19700101"), UNIX_EPOCH);
        assert_eq!(at("19691231"), UNIX_EPOCH - Duration::from_secs(86_400));
        for bad in ["20261322", "20260230", "20261100", "20260000"] {
            assert_eq!(
                err(bad),
                TimeError::InvalidDate {
                    date: bad.into(),
                    position: 0
                }
            );
        }
    }

    #[test]
    fn now_and_offsets() {
        assert_eq!(at("now"), now());
        assert_eq!(at("  now "), now());
        assert_eq!(at("now-1h"), ago(3600));
        assert_eq!(at("-1h"), ago(3600));
        assert_eq!(at("now+5m"), now() + Duration::from_secs(300));
        assert_eq!(at("+5m"), now() + Duration::from_secs(300));
        assert_eq!(at("now - 1h"), ago(3600));
        assert_eq!(at("now-30s"), ago(30));
        assert_eq!(at("now-2d"), ago(2 * DAY));
        assert_eq!(at("now-1w"), ago(7 * DAY));
        assert_eq!(at("now-1M"), ago(30 * DAY));
        assert_eq!(at("now-1mon"), ago(30 * DAY));
        assert_eq!(at("now-1y"), ago(365 * DAY));
        assert_eq!(at("now-15min"), ago(900));
        assert_eq!(at("now-2hours"), ago(7200));
    }

    #[test]
    fn compound_offsets_add_up() {
        // Pyroscope reads these as now-3h and now-1d.
        assert_eq!(at("now-3h30m"), ago(3 * HOUR + 30 * MINUTE));
        assert_eq!(at("now-1d12h"), ago(DAY + 12 * HOUR));
        assert_eq!(
            at("-1w 2d 3h 4m 5s"),
            ago(9 * DAY + 3 * HOUR + 4 * MINUTE + 5)
        );
        assert_eq!(parse_offset("1h1h"), Ok(Duration::from_secs(7200)));
    }

    #[test]
    fn rfc3339() {
        let t = epoch_plus(Duration::from_secs(1_795_341_600));
        assert_eq!(at("2026-11-22T10:00:00Z"), t);
        assert_eq!(at("2026-11-22T12:00:00+02:00"), t);
        assert_eq!(at("2026-11-22T05:30:00-04:30"), t);
        assert_eq!(
            at("2026-11-22T10:00:00.25Z"),
            t + Duration::from_millis(250)
        );
        assert_eq!(
            at("1969-12-31T23:59:59.5Z"),
            UNIX_EPOCH - Duration::from_millis(500)
        );
        assert!(matches!(
            err(" 2026-13-22T10:00:00Z"),
            TimeError::InvalidRfc3339 { position: 1, .. }
        ));
        let e = err("2026-11-22");
        assert!(
            e.to_string()
                .starts_with("invalid RFC 3339 time \"2026-11-22\" at position 0: ")
        );
    }

    #[test]
    fn errors_name_what_and_where() {
        assert_eq!(err(""), TimeError::Empty);
        assert_eq!(err("   "), TimeError::Empty);
        assert_eq!(
            err("yesterday-1h"),
            TimeError::UnknownReference {
                reference: "yesterday".into(),
                position: 0
            }
        );
        assert_eq!(
            err(" later"),
            TimeError::UnknownReference {
                reference: "later".into(),
                position: 1
            }
        );
        assert_eq!(
            err("1h"),
            TimeError::UnknownReference {
                reference: "1h".into(),
                position: 0
            }
        );
        assert_eq!(
            err("now-1x"),
            TimeError::UnknownUnit {
                unit: "x".into(),
                position: 5
            }
        );
        assert_eq!(
            err("now-1ms").to_string(),
            "unknown unit \"ms\" at position 5, expected s, m, h, d, w, M (30 days) or y (365 days)"
        );
        assert_eq!(err("now-5"), TimeError::MissingUnit { position: 5 });
        assert_eq!(err("now-5 m"), TimeError::MissingUnit { position: 5 });
        assert_eq!(
            err("now-"),
            TimeError::UnexpectedEnd {
                position: 4,
                expected: "a number"
            }
        );
        assert_eq!(
            err("now-h"),
            TimeError::InvalidCharacter {
                found: 'h',
                position: 4,
                expected: "a number"
            }
        );
        assert_eq!(
            err("now-1h+30m"),
            TimeError::InvalidCharacter {
                found: '+',
                position: 6,
                expected: "a number or the end of the offset"
            }
        );
        assert_eq!(
            err("now-1h!"),
            TimeError::InvalidCharacter {
                found: '!',
                position: 6,
                expected: "a number or the end of the offset"
            }
        );
        assert_eq!(err("now-1é"), TimeError::MissingUnit { position: 5 });
    }

    #[test]
    fn overflow_is_an_error() {
        assert_eq!(
            err("now-99999999999999999999s"),
            TimeError::OutOfRange { position: 4 }
        );
        assert_eq!(
            err("now-999999999999y"),
            TimeError::OutOfRange { position: 4 }
        );
        assert_eq!(
            err("now-1y 18446744073709551615s"),
            TimeError::OutOfRange { position: 7 }
        );
        // Fits in 64-bit seconds but not in a SystemTime.
        assert_eq!(
            err("now+500000000000y"),
            TimeError::OutOfRange { position: 3 }
        );
    }
}
