//! The spool's bookkeeping, sans IO: which batches are waiting, which are in flight, what the
//! bounds evict. The driver in `mod.rs` applies what this decides to the files (`files.rs`).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// Why a batch left the spool without an ack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// The spool was over `spool.max-bytes`; the oldest batches went first.
    Full,
    /// The batch was older than `spool.max-age`.
    Expired,
    /// The aggregator rejected it as invalid; sending it again cannot help.
    Rejected,
    /// Its window could not be written: the spool's disk is full.
    DiskFull,
    /// Its window could not be written: another I/O error.
    WriteFailed,
    /// Its file was damaged on disk since it was written: it cannot be sent.
    Corrupt,
}

impl DropReason {
    /// The `reason` label of `smolder_agent_dropped_batches_total{stage="spool"}`.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Full => "full",
            DropReason::Expired => "expired",
            DropReason::Rejected => "rejected",
            DropReason::DiskFull => "disk_full",
            DropReason::WriteFailed => "write_failed",
            DropReason::Corrupt => "corrupt",
        }
    }
}

/// A batch that left the spool without an ack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// Its sequence number.
    pub sequence: u64,
    /// Its size in the spool.
    pub bytes: u64,
    /// Why.
    pub reason: DropReason,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    bytes: u64,
    created: SystemTime,
    in_flight: bool,
}

/// The batches in the spool, oldest (lowest sequence) first.
#[derive(Debug)]
pub struct Queue {
    entries: BTreeMap<u64, Entry>,
    bytes: u64,
    max_bytes: u64,
    max_age: Duration,
}

impl Queue {
    /// An empty queue with its bounds.
    pub fn new(max_bytes: u64, max_age: Duration) -> Queue {
        Queue {
            entries: BTreeMap::new(),
            bytes: 0,
            max_bytes,
            max_age,
        }
    }

    /// Adds a batch; returns the batches the byte bound evicts, oldest first. A batch larger
    /// than the whole bound evicts everything, itself included.
    pub fn push(&mut self, sequence: u64, bytes: u64, created: SystemTime) -> Vec<Dropped> {
        let entry = Entry {
            bytes,
            created,
            in_flight: false,
        };
        if let Some(old) = self.entries.insert(sequence, entry) {
            self.bytes -= old.bytes;
        }
        self.bytes += bytes;
        let mut dropped = Vec::new();
        while self.bytes > self.max_bytes {
            let Some((sequence, entry)) = self.entries.pop_first() else {
                break;
            };
            self.bytes -= entry.bytes;
            dropped.push(Dropped {
                sequence,
                bytes: entry.bytes,
                reason: DropReason::Full,
            });
        }
        dropped
    }

    /// Removes the batches created more than `max_age` before `now`.
    pub fn expire(&mut self, now: SystemTime) -> Vec<Dropped> {
        let Some(cutoff) = now.checked_sub(self.max_age) else {
            return Vec::new();
        };
        let old: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, entry)| entry.created < cutoff)
            .map(|(sequence, _)| *sequence)
            .collect();
        old.into_iter()
            .filter_map(|sequence| self.remove(sequence, DropReason::Expired))
            .collect()
    }

    /// The oldest batch not in flight, now marked in flight.
    pub fn take_next(&mut self) -> Option<u64> {
        let (sequence, entry) = self.entries.iter_mut().find(|(_, e)| !e.in_flight)?;
        entry.in_flight = true;
        Some(*sequence)
    }

    /// The aggregator acknowledged `sequence`: it leaves the spool. Returns its size, or `None`
    /// when it had already left (evicted while in flight).
    pub fn acked(&mut self, sequence: u64) -> Option<u64> {
        let entry = self.entries.remove(&sequence)?;
        self.bytes -= entry.bytes;
        Some(entry.bytes)
    }

    /// `sequence` was not delivered (connection lost, retryable reject): send it again.
    pub fn retry(&mut self, sequence: u64) {
        if let Some(entry) = self.entries.get_mut(&sequence) {
            entry.in_flight = false;
        }
    }

    /// Every batch in flight goes back to waiting (the connection is gone).
    pub fn retry_all(&mut self) {
        for entry in self.entries.values_mut() {
            entry.in_flight = false;
        }
    }

    /// Drops `sequence` for `reason`.
    pub fn remove(&mut self, sequence: u64, reason: DropReason) -> Option<Dropped> {
        let entry = self.entries.remove(&sequence)?;
        self.bytes -= entry.bytes;
        Some(Dropped {
            sequence,
            bytes: entry.bytes,
            reason,
        })
    }

    /// Bytes of every batch in the spool.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Batches in the spool.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the spool is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a batch waits that is not in flight.
    pub fn has_waiting(&self) -> bool {
        self.entries.values().any(|entry| !entry.in_flight)
    }

    /// How long the oldest batch has waited at `now`.
    pub fn oldest_age(&self, now: SystemTime) -> Duration {
        self.entries
            .values()
            .map(|entry| entry.created)
            .min()
            .and_then(|created| now.duration_since(created).ok())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn sends_in_order_and_resends_what_was_not_acked() {
        let mut queue = Queue::new(1_000, Duration::from_secs(3_600));
        for sequence in 1..=3 {
            assert!(queue.push(sequence, 10, at(sequence)).is_empty());
        }
        assert_eq!(queue.take_next(), Some(1));
        assert_eq!(queue.take_next(), Some(2));
        assert_eq!(queue.acked(2), Some(10));
        queue.retry(1);
        assert_eq!(queue.take_next(), Some(1));
        assert_eq!(queue.take_next(), Some(3));
        assert_eq!(queue.take_next(), None);
        queue.retry_all();
        assert_eq!(queue.take_next(), Some(1));
        assert_eq!((queue.len(), queue.bytes()), (2, 20));
    }

    #[test]
    fn the_byte_bound_drops_the_oldest_only() {
        let mut queue = Queue::new(25, Duration::from_secs(3_600));
        assert!(queue.push(1, 10, at(1)).is_empty());
        assert!(queue.push(2, 10, at(2)).is_empty());
        assert_eq!(queue.take_next(), Some(1));
        let dropped = queue.push(3, 10, at(3));
        assert_eq!(
            dropped,
            [Dropped {
                sequence: 1,
                bytes: 10,
                reason: DropReason::Full
            }]
        );
        // The evicted batch's late ack changes nothing.
        assert_eq!(queue.acked(1), None);
        assert_eq!((queue.len(), queue.bytes()), (2, 20));
        assert_eq!(queue.take_next(), Some(2));
        let too_big = queue.push(4, 100, at(4));
        assert_eq!(too_big.len(), 3);
        assert!(queue.is_empty());
    }

    #[test]
    fn old_batches_expire() {
        let mut queue = Queue::new(1_000, Duration::from_secs(60));
        queue.push(1, 10, at(100));
        queue.push(2, 10, at(150));
        assert_eq!(queue.oldest_age(at(170)), Duration::from_secs(70));
        let expired = queue.expire(at(170));
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].sequence, 1);
        assert_eq!(expired[0].reason, DropReason::Expired);
        assert_eq!(queue.oldest_age(at(170)), Duration::from_secs(20));
    }
}
