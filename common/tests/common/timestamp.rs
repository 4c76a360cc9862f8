//! Properties of time parsing: compound offsets add up, numbers read by length, no panics.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use smolder_common::timestamp::{self, parse_offset};

const UNITS: &[(&str, u64)] = &[
    ("s", 1),
    ("m", 60),
    ("min", 60),
    ("h", 3600),
    ("d", 86_400),
    ("w", 7 * 86_400),
    ("M", 30 * 86_400),
    ("mon", 30 * 86_400),
    ("y", 365 * 86_400),
];

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_790_000_000)
}

/// One `<number><unit>` part and the seconds it spans.
fn part() -> impl Strategy<Value = (String, u64)> {
    (0u64..100_000, 0..UNITS.len()).prop_map(|(n, u)| {
        let (unit, secs) = UNITS[u];
        (format!("{n}{unit}"), n * secs)
    })
}

proptest! {
    #[test]
    fn compound_offsets_are_the_sum_of_their_parts(
        parts in prop::collection::vec(part(), 1..6),
        spaced in any::<bool>(),
    ) {
        let text = parts
            .iter()
            .map(|(t, _)| t.as_str())
            .collect::<Vec<_>>()
            .join(if spaced { " " } else { "" });
        let sum: u64 = parts.iter().map(|(_, s)| s).sum();
        let each: Duration = parts
            .iter()
            .map(|(t, _)| parse_offset(t).expect("a single part parses"))
            .sum();
        prop_assert_eq!(parse_offset(&text), Ok(Duration::from_secs(sum)));
        prop_assert_eq!(each, Duration::from_secs(sum));
        let back = now().checked_sub(Duration::from_secs(sum)).expect("in range");
        prop_assert_eq!(timestamp::parse(&format!("now-{text}"), now()), Ok(back));
        prop_assert_eq!(
            timestamp::parse(&format!("+{text}"), now()),
            Ok(now() + Duration::from_secs(sum))
        );
    }

    #[test]
    fn ten_digit_numbers_are_seconds(secs in 1_000_000_000u64..10_000_000_000) {
        prop_assert_eq!(
            timestamp::parse(&secs.to_string(), now()),
            Ok(UNIX_EPOCH + Duration::from_secs(secs))
        );
    }

    #[test]
    fn thirteen_digit_numbers_are_milliseconds(ms in 1_000_000_000_000u64..10_000_000_000_000) {
        prop_assert_eq!(
            timestamp::parse(&ms.to_string(), now()),
            Ok(UNIX_EPOCH + Duration::from_millis(ms))
        );
    }

    #[test]
    fn parse_never_panics(input in any::<String>()) {
        let _ = timestamp::parse(&input, now());
        let _ = parse_offset(&input);
    }

    #[test]
    fn parse_never_panics_on_time_like_input(input in "[now+ -]{0,4}[0-9hmsdwMy:TZ+., _-]{0,30}") {
        let _ = timestamp::parse(&input, now());
        let _ = timestamp::parse(&input, UNIX_EPOCH);
    }
}
