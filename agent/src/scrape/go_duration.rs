//! Durations as Go and Prometheus write them: a sequence of `<integer><unit>` with units `ms`,
//! `s`, `m`, `h`, `d` and `w`, such as `10s`, `1m30s` or `500ms`.
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer, de::Error};

/// Writes whole seconds as the largest whole unit (`5m`, `15s`), else milliseconds.
pub fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format(*value))
}

/// Reads a duration; see the [module docs](self).
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    parse(&text).map_err(D::Error::custom)
}

/// Writes `value` the way [`parse`] reads it.
pub fn format(value: Duration) -> String {
    let ms = value.as_millis();
    if !ms.is_multiple_of(1000) || ms == 0 {
        return format!("{ms}ms");
    }
    let secs = ms / 1000;
    [(604_800, "w"), (86_400, "d"), (3_600, "h"), (60, "m")]
        .iter()
        .find(|(unit, _)| secs.is_multiple_of(*unit))
        .map_or_else(
            || format!("{secs}s"),
            |(unit, name)| format!("{}{name}", secs / unit),
        )
}

/// Parses a duration such as `1m30s`.
///
/// # Errors
///
/// A message naming what is wrong with `text`.
pub fn parse(text: &str) -> Result<Duration, String> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err("empty duration".to_owned());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("invalid duration {text:?}: expected a number"));
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("invalid duration {text:?}: number out of range"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let millis_per = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 604_800_000,
            "" => return Err(format!("invalid duration {text:?}: missing unit")),
            unit => {
                return Err(format!(
                    "invalid duration {text:?}: unknown unit {unit:?} (ms, s, m, h, d, w)"
                ));
            }
        };
        let part = number
            .checked_mul(millis_per)
            .ok_or_else(|| format!("invalid duration {text:?}: out of range"))?;
        total = total
            .checked_add(Duration::from_millis(part))
            .ok_or_else(|| format!("invalid duration {text:?}: out of range"))?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn durations_read_and_write_like_go() {
        for (text, ms) in [
            ("10s", 10_000),
            ("1m30s", 90_000),
            ("500ms", 500),
            ("1h", 3_600_000),
        ] {
            assert_eq!(parse(text), Ok(Duration::from_millis(ms)));
        }
        for bad in ["", "10", "s", "1.5s", "10x"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert_eq!(format(Duration::from_secs(300)), "5m");
        assert_eq!(format(Duration::from_secs(15)), "15s");
        assert_eq!(format(Duration::from_millis(1500)), "1500ms");
    }
}
