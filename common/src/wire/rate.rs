//! A token bucket: the per-connection batches-per-second limit, sans IO.

use std::time::{Duration, Instant};

/// Allows `rate` events per second on average and bursts of up to `burst`, given the time of
/// each event. Holds no clock: callers pass `now`.
#[derive(Clone, Debug)]
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimiter {
    /// A full bucket at `now`. A `rate` of 0 means no limit.
    pub fn new(rate: u32, burst: u32, now: Instant) -> RateLimiter {
        RateLimiter {
            rate: f64::from(rate),
            burst: f64::from(burst.max(1)),
            tokens: f64::from(burst.max(1)),
            last: now,
        }
    }

    /// Takes one token for an event at `now`; `false` when the bucket is empty.
    pub fn try_take(&mut self, now: Instant) -> bool {
        if self.rate == 0.0 {
            return true;
        }
        let elapsed = now.saturating_duration_since(self.last);
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// How long from `now` until a token is available.
    pub fn wait(&self, now: Instant) -> Duration {
        if self.rate == 0.0 || self.tokens >= 1.0 {
            return Duration::ZERO;
        }
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        let missing = 1.0 - (self.tokens + elapsed * self.rate);
        Duration::from_secs_f64((missing / self.rate).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_then_refills_at_the_rate() {
        let t0 = Instant::now();
        let mut limiter = RateLimiter::new(10, 3, t0);
        assert!(limiter.try_take(t0));
        assert!(limiter.try_take(t0));
        assert!(limiter.try_take(t0));
        assert!(!limiter.try_take(t0));
        assert_eq!(limiter.wait(t0), Duration::from_millis(100));
        assert!(!limiter.try_take(t0 + Duration::from_millis(50)));
        assert!(limiter.try_take(t0 + Duration::from_millis(100)));
        // A long pause refills only up to the burst.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(limiter.try_take(later));
        }
        assert!(!limiter.try_take(later));
    }

    #[test]
    fn zero_rate_is_unlimited() {
        let t0 = Instant::now();
        let mut limiter = RateLimiter::new(0, 0, t0);
        assert!((0..1000).all(|_| limiter.try_take(t0)));
    }
}
