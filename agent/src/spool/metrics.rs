//! The spool's metrics (`smolder_agent_spool_*`), updated per batch written, acknowledged or
//! dropped. Its errors, dropped batches and dropped series are counted in the tier's counters
//! with `stage="spool"`.

use prometheus::{Gauge, IntCounter, IntGauge, Registry};
use smolder_common::wire::RefusalReason;
use smolder_daemon::metrics::{counter, gauge, register};

use super::queue::{DropReason, Dropped};
use crate::tier::{DropCause, DroppedUnit, StageCounters, TierCounters};

/// The `error_type`s of `smolder_agent_errors_total{stage="spool"}`: spooling a window failed
/// because the disk is full, or for another reason (its batches are lost and counted), or
/// applying `spool.max-age` failed.
const ERROR_TYPES: [&str; 3] = ["disk_full", "write", "expire"];

/// Why the spool drops a series of a window before it is spooled: the aggregator's limits.
const SERIES_REASONS: [RefusalReason; 3] = [
    RefusalReason::TooManyLabels,
    RefusalReason::LabelTooLong,
    RefusalReason::TooLarge,
];

/// The spool's metrics.
#[derive(Clone)]
pub struct SpoolMetrics {
    /// `smolder_agent_spool_bytes`: bytes of batches in the spool, as sent.
    pub bytes: IntGauge,
    /// `smolder_agent_spool_batches`: batches in the spool.
    pub batches: IntGauge,
    /// `smolder_agent_spool_oldest_age_seconds`: how long the oldest batch has waited.
    pub oldest_age: Gauge,
    /// `smolder_agent_spool_batches_written_total`.
    pub batches_written: IntCounter,
    /// `smolder_agent_spool_bytes_written_total`.
    pub bytes_written: IntCounter,
    /// `smolder_agent_dropped_batches_total{stage="spool",reason}` and
    /// `smolder_agent_dropped_bytes_total{stage="spool",reason}`: batches that left
    /// unacknowledged, and their bytes: `full` (`spool.max-bytes`), `expired` (`spool.max-age`),
    /// `rejected` (by the aggregator, for good), `disk_full` and `write_failed` (never
    /// written), `corrupt` (damaged on disk since); `smolder_agent_dropped_series_total{stage="spool",reason}`: series over the
    /// aggregator's limits (`too_many_labels`, `label_too_long`, `too_large`);
    /// `smolder_agent_errors_total{stage="spool"}`.
    pub tier: StageCounters,
}

impl SpoolMetrics {
    /// Creates the spool's metrics in `registry`.
    pub(crate) fn new(registry: &Registry, tier: &TierCounters) -> Self {
        let reasons = [
            DropReason::Full,
            DropReason::Expired,
            DropReason::Rejected,
            DropReason::DiskFull,
            DropReason::WriteFailed,
            DropReason::Corrupt,
        ];
        let mut drops: Vec<(DroppedUnit, DropCause)> = reasons
            .iter()
            .flat_map(|&reason| {
                [DroppedUnit::Batches, DroppedUnit::Bytes].map(|unit| (unit, cause(reason)))
            })
            .collect();
        drops.extend(SERIES_REASONS.map(|r| (DroppedUnit::Series, DropCause::forced(r.as_str()))));
        SpoolMetrics {
            bytes: gauge(
                registry,
                "smolder_agent_spool_bytes",
                "Bytes of batches in the spool, compressed as sent.",
            ),
            batches: gauge(
                registry,
                "smolder_agent_spool_batches",
                "Batches in the spool, sent or not, waiting for an ack.",
            ),
            oldest_age: register(
                registry,
                Gauge::new(
                    "smolder_agent_spool_oldest_age_seconds",
                    "How long the oldest batch in the spool has waited.",
                )
                .expect("a valid gauge"),
            ),
            batches_written: counter(
                registry,
                "smolder_agent_spool_batches_written_total",
                "Batches written to the spool.",
            ),
            bytes_written: counter(
                registry,
                "smolder_agent_spool_bytes_written_total",
                "Bytes of batches written to the spool.",
            ),
            tier: tier.stage("spool", &ERROR_TYPES, &drops),
        }
    }

    /// Counts a dropped batch.
    pub fn dropped(&self, batch: &Dropped) {
        let cause = cause(batch.reason);
        self.tier.dropped(DroppedUnit::Batches, cause, 1);
        self.tier.dropped(DroppedUnit::Bytes, cause, batch.bytes);
    }
}

impl SpoolMetrics {
    /// Counts a series dropped over the aggregator's limits before it was spooled.
    pub fn refused(&self, reason: RefusalReason) {
        self.tier
            .dropped(DroppedUnit::Series, DropCause::forced(reason.as_str()), 1);
    }
}

/// A batch leaves the spool unacknowledged only when a bound or the aggregator forces it.
fn cause(reason: DropReason) -> DropCause {
    DropCause::forced(reason.as_str())
}
