//! The in-flight budget: bytes that requests and agent batches hold in memory at once, as sent
//! and as decompressed, taken before they are read and given back when their work is done.
//! Sans IO: a counter, never a wait (what does not fit is refused, and the client retries).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::IntGauge;

/// The bytes in flight, under a limit.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: u64,
    used: AtomicU64,
    gauge: IntGauge,
}

impl Budget {
    /// A budget of `limit` bytes, its use shown in `gauge`.
    pub(crate) fn new(limit: u64, gauge: IntGauge) -> Budget {
        Budget {
            limit,
            used: AtomicU64::new(0),
            gauge,
        }
    }

    /// The limit.
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// The bytes taken now.
    #[cfg(test)]
    fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `bytes` if they fit under the limit.
    fn try_take(&self, bytes: u64) -> bool {
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .is_ok();
        if taken {
            self.gauge.add(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        taken
    }

    fn give(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        self.gauge.sub(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
}

/// What one request or batch holds of the budget: given back when the last clone is dropped
/// (the handler, its body, and the decoders it handed the bytes to all hold one).
#[derive(Clone, Debug)]
pub(crate) struct Charge(Arc<Held>);

#[derive(Debug)]
struct Held {
    budget: Arc<Budget>,
    taken: AtomicU64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.give(*self.taken.get_mut());
    }
}

impl Charge {
    /// Nothing taken yet from `budget`.
    pub(crate) fn new(budget: Arc<Budget>) -> Charge {
        Charge(Arc::new(Held {
            budget,
            taken: AtomicU64::new(0),
        }))
    }

    /// Takes `bytes` more, if they fit.
    pub(crate) fn take(&self, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        let fits = self.0.budget.try_take(bytes);
        if fits {
            self.0.taken.fetch_add(bytes, Ordering::AcqRel);
        }
        fits
    }

    /// The bytes held.
    pub(crate) fn taken(&self) -> u64 {
        self.0.taken.load(Ordering::Acquire)
    }

    /// The budget's limit.
    pub(crate) fn limit(&self) -> u64 {
        self.0.budget.limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_fit_under_the_limit_and_come_back_when_dropped() {
        let gauge = IntGauge::new("t", "t").unwrap();
        let budget = Arc::new(Budget::new(100, gauge.clone()));
        let a = Charge::new(Arc::clone(&budget));
        assert!(a.take(60));
        let b = Charge::new(Arc::clone(&budget));
        assert!(!b.take(41), "over the limit");
        assert!(b.take(40));
        assert_eq!(budget.used(), 100);
        assert_eq!(gauge.get(), 100);
        let a2 = a.clone();
        drop(a);
        assert_eq!(budget.used(), 100, "a clone still holds it");
        drop(a2);
        assert_eq!(budget.used(), 40);
        assert!(Charge::new(Arc::clone(&budget)).take(60));
        drop(b);
        assert_eq!(budget.used(), 0);
        assert_eq!(gauge.get(), 0);
        assert!(!Charge::new(budget).take(u64::MAX), "no overflow");
    }
}
