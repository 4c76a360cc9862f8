//! A read's limits, set by its caller around the read, on the thread that runs it: `query`
//! runs each of its reads under [`with_limits`]; the block store's read loops ask [`stop`]
//! between series (and between runs of trees), so that a read whose client left, whose time is
//! up ([`ReadLimits::cancel`]) or that matched more than its series limit stops merging at
//! once. Its answer is then partial, and the caller's to drop.
//!
//! Ambient rather than an argument of every read: the limits are the caller's policy, which
//! the store's interface need not carry, and a read without them (rules, admin) runs whole.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    static CURRENT: RefCell<Option<ReadLimits>> = const { RefCell::new(None) };
}

/// What one read may do, and whether it was stopped.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReadLimits {
    cancelled: Arc<AtomicBool>,
    /// The most distinct series one read may match; 0 for no limit.
    max_series: usize,
    exceeded: Arc<AtomicBool>,
}

impl ReadLimits {
    /// Limits of at most `max_series` series per read (0: no limit), not cancelled.
    pub(crate) fn new(max_series: usize) -> ReadLimits {
        ReadLimits {
            max_series,
            ..ReadLimits::default()
        }
    }

    /// Stops the read at its next check, from any thread.
    pub(crate) fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
    }

    /// Whether it was cancelled.
    pub(crate) fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// Whether a read stopped for matching more than `max_series` series.
    pub(crate) fn exceeded(&self) -> bool {
        self.exceeded.load(Ordering::Acquire)
    }
}

/// Runs `read` on this thread under `limits`; the thread's limits are put back when it ends,
/// by a panic too (the blocking pool reuses the thread for other reads).
pub(crate) fn with_limits<T>(limits: &ReadLimits, read: impl FnOnce() -> T) -> T {
    struct Restore(Option<ReadLimits>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            CURRENT.with(|current| *current.borrow_mut() = outer);
        }
    }
    let _restore = Restore(CURRENT.with(|current| current.replace(Some(limits.clone()))));
    read()
}

/// Whether the read on this thread must stop now, having matched `series` series so far:
/// cancelled, or past its series limit (which is then remembered).
pub(super) fn stop(series: usize) -> bool {
    CURRENT.with(|current| {
        let current = current.borrow();
        let Some(limits) = current.as_ref() else {
            return false;
        };
        if limits.cancelled() {
            return true;
        }
        if limits.max_series > 0 && series > limits.max_series {
            limits.exceeded.store(true, Ordering::Release);
            return true;
        }
        false
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stop_only_under_limits() {
        assert!(!stop(usize::MAX), "no limits: a read runs whole");
        let limits = ReadLimits::new(10);
        with_limits(&limits, || {
            assert!(!stop(10));
            assert!(stop(11));
        });
        assert!(limits.exceeded() && !limits.cancelled());
        assert!(!stop(11), "the limits end with the read");
        let cancelled = ReadLimits::new(0);
        cancelled.cancel();
        assert!(with_limits(&cancelled, || stop(0)));
        assert!(!cancelled.exceeded());
    }
}
