//! What the fleet sent and what became of it: per series, the values acknowledged, refused and
//! left without an answer; fleet-wide counters; latencies.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// A series as the aggregator answers for it: the app name (`svc-07.cpu`) and the one label
/// that tells the fleet's series of that app apart (`hostname` for agents, `instance` for SDK
/// clients), with the units and sample rate its values are stored in (which say how the query
/// API scales them).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeriesKey {
    /// The app name, profile type included.
    pub app: String,
    /// The label's name.
    pub label: &'static str,
    /// Its value.
    pub value: String,
    /// The units the aggregator stores: `samples`, `nanoseconds`, `bytes`.
    pub units: &'static str,
    /// Samples per second of `samples`; 0 otherwise.
    pub sample_rate: u32,
}

/// One series' values, in its units as sent (samples, nanoseconds, bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Acknowledged: a QUIC ack, or a 2xx answer to a push. The aggregator must hold all of it.
    pub acked: u64,
    /// Sent and never answered (a connection lost, a timeout, the run's end): it may or may not
    /// be stored, but at most once.
    pub unanswered: u64,
    /// Refused (a reject, a 4xx or 5xx): the aggregator said it did not store it.
    pub refused: u64,
    /// Never sent: dropped from an agent's full spool before its first send, still waiting
    /// when the run ended, or a push that could not connect. The aggregator must not hold it.
    pub dropped: u64,
}

impl Tally {
    pub(crate) fn add(&mut self, other: &Tally) {
        self.acked += other.acked;
        self.unanswered += other.unanswered;
        self.refused += other.refused;
        self.dropped += other.dropped;
    }
}

/// Fleet-wide counters, shared by every agent and pusher task.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) windows: AtomicU64,
    pub(crate) acked: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) rejected_retryable: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) dropped_full: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) connects: AtomicU64,
    pub(crate) connect_errors: AtomicU64,
    pub(crate) connected: AtomicI64,
    pub(crate) batch_bytes: AtomicU64,
    pub(crate) pushes: AtomicU64,
    pub(crate) pushes_ok: AtomicU64,
    pub(crate) pushes_refused: AtomicU64,
    pub(crate) pushes_failed: AtomicU64,
    pub(crate) pushes_unanswered: AtomicU64,
    pub(crate) pushes_unreachable: AtomicU64,
    pub(crate) pushes_skipped: AtomicU64,
    /// Pushes answered 429 or 503 with a `Retry-After` header.
    pub(crate) pushes_retry_after: AtomicU64,
}

impl Counters {
    pub(crate) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn read(&self) -> Totals {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Totals {
            windows: get(&self.windows),
            acked: get(&self.acked),
            duplicates: get(&self.duplicates),
            rejected_retryable: get(&self.rejected_retryable),
            rejected: get(&self.rejected),
            dropped_full: get(&self.dropped_full),
            failed: get(&self.failed),
            connects: get(&self.connects),
            connect_errors: get(&self.connect_errors),
            connected: self.connected.load(Ordering::Relaxed).max(0) as u64,
            batch_bytes: get(&self.batch_bytes),
            pushes: get(&self.pushes),
            pushes_ok: get(&self.pushes_ok),
            pushes_refused: get(&self.pushes_refused),
            pushes_failed: get(&self.pushes_failed),
            pushes_unanswered: get(&self.pushes_unanswered),
            pushes_unreachable: get(&self.pushes_unreachable),
            pushes_skipped: get(&self.pushes_skipped),
            pushes_retry_after: get(&self.pushes_retry_after),
        }
    }
}

/// The fleet's counters at one moment, cumulative since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Windows the agents closed, each a batch.
    pub windows: u64,
    /// Batches acknowledged (each counted once, whatever the resends).
    pub acked: u64,
    /// Acks that said the batch had been stored before (a resend after a lost answer).
    pub duplicates: u64,
    /// Retryable rejects (the batch is sent again after a backoff).
    pub rejected_retryable: u64,
    /// Rejects a retry cannot fix: the batch is dropped.
    pub rejected: u64,
    /// Batches dropped from a full spool, oldest first.
    pub dropped_full: u64,
    /// Batch sends without an answer (connection lost, ack timeout); sent again.
    pub failed: u64,
    /// Connections welcomed.
    pub connects: u64,
    /// Connection attempts that failed (handshake, hello refused, timeout).
    pub connect_errors: u64,
    /// Agents connected now.
    pub connected: u64,
    /// Bytes of batch frames sent, resends included.
    pub batch_bytes: u64,
    /// Pushes sent.
    pub pushes: u64,
    /// Pushes answered 2xx.
    pub pushes_ok: u64,
    /// Pushes answered 429 or 503 (overload: the client may retry later).
    pub pushes_refused: u64,
    /// Pushes answered another non-2xx status.
    pub pushes_failed: u64,
    /// Pushes without an answer (timeout, connection reset): stored or not.
    pub pushes_unanswered: u64,
    /// Pushes that could not connect (the aggregator is down): not sent.
    pub pushes_unreachable: u64,
    /// Pushes not sent because the generator already had its most in flight.
    pub pushes_skipped: u64,
    /// Refused pushes that carried `Retry-After`.
    pub pushes_retry_after: u64,
}

impl Totals {
    /// Windows neither acknowledged nor dropped: waiting in the agents' spools or in flight.
    pub fn backlog(&self) -> u64 {
        self.windows
            .saturating_sub(self.acked + self.rejected + self.dropped_full)
    }
}

/// Latencies in microseconds, each list kept whole for the run and for the current interval.
#[derive(Debug, Default)]
pub(crate) struct Latencies {
    inner: Mutex<LatencyLists>,
}

#[derive(Debug, Default)]
struct LatencyLists {
    ack: (Vec<u32>, Vec<u32>),
    age: (Vec<u32>, Vec<u32>),
    push: (Vec<u32>, Vec<u32>),
}

/// Which latency.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Latency {
    /// From a batch's stream opening to its ack.
    Ack,
    /// From the window's close to its ack: spool time included.
    Age,
    /// A push's request to its answer.
    Push,
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

impl Latencies {
    pub(crate) fn observe(&self, which: Latency, took: Duration) {
        let mut lists = self
            .inner
            .lock()
            .expect("latency lock: held only to push or swap");
        let list = match which {
            Latency::Ack => &mut lists.ack,
            Latency::Age => &mut lists.age,
            Latency::Push => &mut lists.push,
        };
        list.0.push(micros(took));
        list.1.push(micros(took));
    }

    /// The current interval's quantiles; the interval starts again.
    pub(crate) fn interval(&self) -> [Quantiles; 3] {
        let mut lists = self
            .inner
            .lock()
            .expect("latency lock: held only to push or swap");
        [
            Quantiles::of(std::mem::take(&mut lists.ack.1)),
            Quantiles::of(std::mem::take(&mut lists.age.1)),
            Quantiles::of(std::mem::take(&mut lists.push.1)),
        ]
    }

    /// The whole run's quantiles.
    pub(crate) fn whole(&self) -> [Quantiles; 3] {
        let lists = self
            .inner
            .lock()
            .expect("latency lock: held only to push or swap");
        [
            Quantiles::of(lists.ack.0.clone()),
            Quantiles::of(lists.age.0.clone()),
            Quantiles::of(lists.push.0.clone()),
        ]
    }
}

/// Quantiles of a set of latencies.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Quantiles {
    /// How many.
    pub count: usize,
    /// Median.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Largest.
    pub max: Duration,
}

impl Quantiles {
    fn of(mut micros: Vec<u32>) -> Quantiles {
        if micros.is_empty() {
            return Quantiles::default();
        }
        micros.sort_unstable();
        let at = |q: f64| {
            let index = ((micros.len() as f64 * q).ceil() as usize).clamp(1, micros.len()) - 1;
            Duration::from_micros(u64::from(micros[index]))
        };
        Quantiles {
            count: micros.len(),
            p50: at(0.50),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}

impl std::fmt::Display for Quantiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.count == 0 {
            return f.write_str("-");
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        write!(
            f,
            "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n={})",
            ms(self.p50),
            ms(self.p99),
            ms(self.max),
            self.count
        )
    }
}

/// Per series, what was sent and what became of it.
pub type Tallies = BTreeMap<SeriesKey, Tally>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let q = Quantiles::of((1..=100).collect());
        assert_eq!(q.count, 100);
        assert_eq!(q.p50, Duration::from_micros(50));
        assert_eq!(q.p99, Duration::from_micros(99));
        assert_eq!(q.max, Duration::from_micros(100));
        assert_eq!(Quantiles::of(vec![7]).p99, Duration::from_micros(7));
        assert_eq!(Quantiles::of(Vec::new()).count, 0);
    }

    #[test]
    fn backlog_is_what_is_neither_acked_nor_dropped() {
        let totals = Totals {
            windows: 100,
            acked: 90,
            rejected: 2,
            dropped_full: 3,
            ..Totals::default()
        };
        assert_eq!(totals.backlog(), 5);
    }
}
