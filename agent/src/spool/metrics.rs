//! The spool's metrics (`smolder_agent_spool_*`), updated per batch written, acknowledged or
//! dropped.

use prometheus::{Gauge, IntCounter, IntCounterVec, IntGauge, Registry};

use super::queue::Dropped;
use crate::metrics::{counter, counter_vec, gauge, register};

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
    /// `smolder_agent_spool_batches_dropped_total{reason}`: batches that left unacknowledged:
    /// `full` (`spool.max-bytes`), `expired` (`spool.max-age`), `rejected` (by the aggregator,
    /// for good).
    pub batches_dropped: IntCounterVec,
    /// `smolder_agent_spool_bytes_dropped_total{reason}`: their bytes.
    pub bytes_dropped: IntCounterVec,
}

impl SpoolMetrics {
    /// Creates the spool's metrics in `registry`.
    pub(crate) fn new(registry: &Registry) -> Self {
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
            batches_dropped: counter_vec(
                registry,
                "smolder_agent_spool_batches_dropped_total",
                "Batches that left the spool without an ack, by reason: full, expired, rejected.",
                &["reason"],
            ),
            bytes_dropped: counter_vec(
                registry,
                "smolder_agent_spool_bytes_dropped_total",
                "Bytes of batches that left the spool without an ack, by reason.",
                &["reason"],
            ),
        }
    }

    /// Counts a dropped batch.
    pub fn dropped(&self, batch: &Dropped) {
        let reason = [batch.reason.as_str()];
        self.batches_dropped.with_label_values(&reason).inc();
        self.bytes_dropped
            .with_label_values(&reason)
            .inc_by(batch.bytes);
    }
}
