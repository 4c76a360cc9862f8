//! Which aggregator of a bucket compacts (object-storage mode): merging, downsampling,
//! retention and the deletion of blocks merges replaced run on one aggregator at a time.
//!
//! Input: `store.object-store.compactor` (whether this aggregator may compact), whether the
//! store honours conditional writes (probed at start, `bucket.rs`), and each poll's view of the
//! heartbeats (`sync.rs`); output: whether this aggregator compacts now, asked by every
//! compaction pass and shown in `smolder_aggregator_store_compacting`.
//!
//! - **Lease** (stores that honour conditional writes: AWS S3, MinIO, Ceph RGW): the object
//!   `leases/compaction` names its holder. It is created with `If-None-Match: *`, renewed every
//!   quarter of its time to live with `If-Match` on its ETag, and taken over the same way once
//!   its Last-Modified is a time to live old by the store's clock. The holder compacts while its
//!   last renewal is younger than half the time to live, so that two never hold it at once.
//! - **Election** (Garage and other stores that overwrite): every aggregator that may compact
//!   says so beside its heartbeat (`aggregators/<writer>.compactor`), and the live one with the
//!   smallest writer id compacts. Two may both believe they compact for a moment (a heartbeat
//!   listed late); `lineage.rs` makes that exact, at the cost of work done twice.
//!
//! The log says which mode is in use at start and when this aggregator starts or stops
//! compacting.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::info;

use super::bucket::{Bucket, Compactor, RequestError};

/// The lease's key, under the bucket's prefix.
pub(crate) const LEASE: &str = "leases/compaction";

/// The suffix of the object beside a heartbeat that says its aggregator may compact.
pub(crate) const COMPACTOR_FLAG: &str = ".compactor";

/// How compactors take turns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Not a compactor (`compactor: false`).
    Off,
    /// A lease object written with conditional writes.
    Lease,
    /// The live compactor with the smallest writer id.
    Election,
    /// Always (`compactor: always`).
    Always,
}

/// This aggregator's compaction role.
pub(crate) struct Role {
    bucket: Arc<Bucket>,
    writer: String,
    mode: Mode,
    ttl: Duration,
    /// Lease mode: when this aggregator last wrote the lease, if it holds it.
    renewed: Option<Instant>,
    /// Whether it compacted at the last check, to log changes.
    compacting: bool,
}

/// The lease's body: its holder.
#[derive(serde::Serialize, serde::Deserialize)]
struct Lease {
    owner: String,
}

impl Role {
    /// The role of writer `writer` on `bucket` as `configured`: taking turns, through a lease
    /// of `ttl` where the bucket honours conditional writes, else the election.
    pub(crate) fn new(
        bucket: Arc<Bucket>,
        writer: String,
        configured: Compactor,
        ttl: Duration,
    ) -> Role {
        let mode = match (configured, bucket.conditional()) {
            (Compactor::Never, _) => Mode::Off,
            (Compactor::Always, _) => Mode::Always,
            (Compactor::TakesTurns, true) => Mode::Lease,
            (Compactor::TakesTurns, false) => Mode::Election,
        };
        match mode {
            Mode::Off => {
                info!("this aggregator does not compact (store.object-store.compactor: false)")
            }
            Mode::Lease => {
                info!(lease = LEASE, ttl = ?ttl, "compactors take turns through a lease (the store honours conditional writes)")
            }
            Mode::Election => info!(
                "compactors take turns by election: the live one with the smallest writer id compacts (the store does not honour conditional writes, so no lease)"
            ),
            Mode::Always => info!(
                "this aggregator compacts whatever the others do (store.object-store.compactor: always); the others of the bucket should have compactor: false, or they compact too (exact, but work done twice)"
            ),
        }
        Role {
            bucket,
            writer,
            mode,
            ttl,
            renewed: None,
            compacting: false,
        }
    }

    /// Whether this aggregator compacts now: `elected` says whether the election chose it (the
    /// live aggregator with the smallest writer id among those that may compact); in lease mode
    /// the lease is taken or renewed first, `store_now` being the store's clock (Unix ms).
    ///
    /// # Errors
    ///
    /// When the lease cannot be read or written; the holder then stops compacting once half
    /// the time to live has passed since its last renewal.
    pub(crate) fn check(&mut self, elected: bool, store_now: u64) -> Result<bool, RequestError> {
        let compacting = match self.mode {
            Mode::Off => false,
            Mode::Always => true,
            Mode::Election => elected,
            Mode::Lease => {
                let renewed = self.lease(store_now);
                let holds = self.renewed.is_some_and(|at| at.elapsed() < self.ttl / 2);
                if let Err(err) = renewed {
                    self.note(holds);
                    return Err(err);
                }
                holds
            }
        };
        self.note(compacting);
        Ok(compacting)
    }

    /// Logs a change of role.
    fn note(&mut self, compacting: bool) {
        if compacting != self.compacting {
            if compacting {
                info!(mode = ?self.mode, "this aggregator compacts the bucket now");
            } else {
                info!(mode = ?self.mode, "this aggregator no longer compacts the bucket");
            }
            self.compacting = compacting;
        }
    }

    /// Takes or renews the lease when due.
    fn lease(&mut self, store_now: u64) -> Result<(), RequestError> {
        if self.renewed.is_some_and(|at| at.elapsed() < self.ttl / 4) {
            return Ok(());
        }
        let body = Bytes::from(
            serde_json::to_vec(&Lease {
                owner: self.writer.clone(),
            })
            .expect("a lease serializes"),
        );
        let started = Instant::now();
        let written = match self.bucket.get_versioned(LEASE)? {
            None => self.bucket.create(LEASE, body)?,
            Some(current) => {
                let owner = serde_json::from_slice::<Lease>(&current.bytes)
                    .map(|lease| lease.owner)
                    .unwrap_or_default();
                let ttl = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
                let expired = current.modified.saturating_add(ttl) < store_now;
                match current.e_tag {
                    Some(e_tag) if owner == self.writer || expired => {
                        self.bucket.update(LEASE, body, &e_tag)?
                    }
                    _ => false,
                }
            }
        };
        // Read back: a store that took the condition for granted is not trusted with it.
        let held = written
            && self.bucket.get_versioned(LEASE)?.is_some_and(|now| {
                serde_json::from_slice::<Lease>(&now.bytes).is_ok_and(|l| l.owner == self.writer)
            });
        self.renewed = held.then_some(started);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now_ms() -> u64 {
        super::super::sync::unix_millis(std::time::SystemTime::now())
    }

    #[test]
    fn one_aggregator_holds_the_lease_until_it_expires() {
        let bucket = Arc::new(Bucket::in_memory());
        let ttl = Duration::from_millis(800);
        let mut a = Role::new(
            Arc::clone(&bucket),
            "aaaa".into(),
            Compactor::TakesTurns,
            ttl,
        );
        let mut b = Role::new(
            Arc::clone(&bucket),
            "bbbb".into(),
            Compactor::TakesTurns,
            ttl,
        );
        assert_eq!(a.mode, Mode::Lease);
        // The election does not matter in lease mode.
        assert!(a.check(false, now_ms()).unwrap());
        assert!(!b.check(true, now_ms()).unwrap());
        // Renewed while it lives.
        std::thread::sleep(Duration::from_millis(250));
        assert!(a.check(false, now_ms()).unwrap());
        assert!(!b.check(true, now_ms()).unwrap());
        // A stops renewing (stopped, cut off): it stops compacting after half the time to
        // live, B takes over once the lease is a time to live old, and A cannot renew it.
        std::thread::sleep(Duration::from_millis(450));
        assert!(a.renewed.is_some_and(|at| at.elapsed() >= ttl / 2));
        std::thread::sleep(Duration::from_millis(500));
        assert!(b.check(false, now_ms()).unwrap());
        assert!(!a.check(false, now_ms()).unwrap());
        let lease: Lease =
            serde_json::from_slice(&bucket.get_versioned(LEASE).unwrap().unwrap().bytes).unwrap();
        assert_eq!(lease.owner, "bbbb");
        // Not configured: never.
        let mut c = Role::new(bucket, "0000".into(), Compactor::Never, ttl);
        assert!(!c.check(true, now_ms()).unwrap());
    }
}
