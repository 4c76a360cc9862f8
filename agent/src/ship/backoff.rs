//! Reconnect backoff, sans IO: exponential from a minimum to a maximum, with full jitter.

use std::time::Duration;

/// The delays between attempts: each failure doubles the ceiling, up to `max`; each delay is
/// drawn between half the ceiling and the ceiling, so that agents cut off together do not come
/// back together.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    ceiling: Duration,
}

impl Backoff {
    /// A backoff that starts at `min`.
    pub fn new(min: Duration, max: Duration) -> Backoff {
        let min = min.max(Duration::from_millis(1));
        Backoff {
            min,
            max: max.max(min),
            ceiling: min,
        }
    }

    /// The delay before the next attempt, given a uniformly random `u64` for the jitter; the
    /// ceiling then doubles.
    pub fn next(&mut self, random: u64) -> Duration {
        let ceiling = self.ceiling;
        self.ceiling = (self.ceiling * 2).min(self.max);
        let half = ceiling / 2;
        let span = u64::try_from((ceiling - half).as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(if span == 0 { 0 } else { random % (span + 1) })
    }

    /// Back to `min` after a success.
    pub fn reset(&mut self) {
        self.ceiling = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_maximum_with_jitter_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(backoff.next(0), Duration::from_millis(50));
        // The ceiling doubled: the span is 100 ms to 200 ms.
        assert_eq!(backoff.next(100_000_000), Duration::from_millis(200));
        let third = backoff.next(12_345_678);
        assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
        backoff.next(0);
        assert_eq!(backoff.next(0), Duration::from_millis(500));
        assert_eq!(backoff.next(0), Duration::from_millis(500), "capped at max");
        backoff.reset();
        assert_eq!(backoff.next(0), Duration::from_millis(50));
    }
}
