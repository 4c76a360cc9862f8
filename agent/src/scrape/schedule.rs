//! When a target is scraped: at a fixed phase of its interval, aligned to the wall clock.
//!
//! Each target's phase is a hash of its key modulo the interval, so a job's targets spread
//! evenly over the interval instead of all firing at once, and a target keeps its phase across
//! agent restarts. Ticks are `phase + k × interval` since the Unix epoch; with an interval equal
//! to the window length, each window gets exactly one tick per target, so snapshot profiles
//! (in-use memory, goroutines) are never counted twice in a window. Pure: callers pass `now`.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The phase of the target with `key` within `interval`.
pub fn phase(key: &str, interval: Duration) -> Duration {
    // DefaultHasher::new() uses fixed keys, so the phase is stable across runs.
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    let interval_ns = interval.as_nanos().max(1);
    let phase_ns = u128::from(hasher.finish()) % interval_ns;
    Duration::from_nanos(u64::try_from(phase_ns).unwrap_or(0))
}

/// The first tick strictly after `after`.
pub fn next_tick(after: SystemTime, interval: Duration, phase: Duration) -> SystemTime {
    let since_epoch = after
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let interval_ns = interval.as_nanos().max(1);
    let phase_ns = phase.as_nanos() % interval_ns;
    let shifted = since_epoch.saturating_sub(phase_ns);
    let next = (shifted / interval_ns + 1) * interval_ns + phase_ns;
    UNIX_EPOCH + Duration::from_nanos(u64::try_from(next).unwrap_or(u64::MAX))
}

/// The tick to scrape at after a scrape at `previous` ended at `now`.
///
/// That is the tick following `previous`, even when `now` has just passed it: a duration
/// profile (`cpu`, `seconds` equal to the interval) always ends a little after the next tick,
/// and skipping that tick would halve its rate. A scrape that overran by more than half an
/// interval (a slow target with a timeout longer than the interval) skips to the first tick
/// after `now` instead of scraping back to back to catch up.
pub fn following_tick(
    previous: Option<SystemTime>,
    now: SystemTime,
    interval: Duration,
    phase: Duration,
) -> SystemTime {
    let Some(previous) = previous else {
        return next_tick(now, interval, phase);
    };
    let candidate = next_tick(previous, interval, phase);
    match now.duration_since(candidate) {
        Ok(late) if late > interval / 2 => next_tick(now, interval, phase),
        _ => candidate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64, ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(ms)
    }

    #[test]
    fn ticks_keep_their_phase_and_move_forward() {
        let interval = Duration::from_secs(10);
        let phase = Duration::from_millis(3_500);
        assert_eq!(next_tick(at(100, 0), interval, phase), at(103, 500));
        assert_eq!(next_tick(at(103, 500), interval, phase), at(113, 500));
        assert_eq!(next_tick(at(109, 999), interval, phase), at(113, 500));
        // A scrape that overran its interval skips the ticks it missed.
        assert_eq!(next_tick(at(125, 0), interval, phase), at(133, 500));
    }

    #[test]
    fn duration_profiles_keep_every_tick_and_overruns_skip() {
        let interval = Duration::from_secs(10);
        let phase = Duration::from_millis(3_500);
        let first = following_tick(None, at(100, 0), interval, phase);
        assert_eq!(first, at(103, 500));
        // A 10 s profile taken at 103.5 s returns at 113.6 s: the 113.5 s tick is still taken.
        assert_eq!(
            following_tick(Some(first), at(113, 600), interval, phase),
            at(113, 500)
        );
        // A scrape that ran 15 s skips to the next tick after now.
        assert_eq!(
            following_tick(Some(first), at(118, 600), interval, phase),
            at(123, 500)
        );
        // A quick scrape waits for the next tick.
        assert_eq!(
            following_tick(Some(first), at(103, 700), interval, phase),
            at(113, 500)
        );
    }

    #[test]
    fn phases_spread_over_the_interval() {
        let interval = Duration::from_secs(10);
        let mut buckets = [0; 10];
        for i in 0..1000 {
            let p = phase(&format!("job/cpu/http://10.0.0.{i}:6060/"), interval);
            assert!(p < interval);
            buckets[usize::try_from(p.as_secs()).unwrap()] += 1;
        }
        assert!(buckets.iter().all(|&n| n > 50), "{buckets:?}");
        assert_eq!(phase("a", interval), phase("a", interval));
    }
}
