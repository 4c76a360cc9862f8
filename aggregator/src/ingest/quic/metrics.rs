//! QUIC ingest's metrics, `smolder_aggregator_ingest_quic_*`.

use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge, Registry};
use smolder_daemon::metrics::{counter, counter_vec, gauge, histogram, latency_buckets};

/// QUIC ingest's metrics.
#[derive(Clone)]
pub(crate) struct QuicMetrics {
    /// `smolder_aggregator_ingest_quic_connections_open`: agents connected now.
    pub(crate) connections_open: IntGauge,
    /// `smolder_aggregator_ingest_quic_connections_total{outcome}`: connection attempts, by
    /// `accepted`, `refused` (hello: credentials, version) or `handshake_failed` (TLS).
    pub(crate) connections_total: IntCounterVec,
    /// `smolder_aggregator_ingest_quic_batches_received_total`: batch frames read whole.
    pub(crate) batches_received: IntCounter,
    /// `smolder_aggregator_ingest_quic_bytes_received_total`: their bytes as sent.
    pub(crate) bytes_received: IntCounter,
    /// `smolder_aggregator_ingest_quic_batches_acked_total`: batches acknowledged durable,
    /// duplicates included.
    pub(crate) batches_acked: IntCounter,
    /// `smolder_aggregator_ingest_quic_batches_duplicate_total`: acknowledged batches that had
    /// been stored before and were not stored again.
    pub(crate) batches_duplicate: IntCounter,
    /// `smolder_aggregator_ingest_quic_batches_rejected_total{reason}`: batch streams refused.
    pub(crate) batches_rejected: IntCounterVec,
    /// `smolder_aggregator_ingest_quic_batch_duration_seconds`: from a batch stream's opening
    /// to its ack, fsync included.
    pub(crate) batch_duration: Histogram,
}

impl QuicMetrics {
    /// Creates QUIC ingest's metrics in `registry`.
    pub(crate) fn new(registry: &Registry) -> Self {
        QuicMetrics {
            connections_open: gauge(
                registry,
                "smolder_aggregator_ingest_quic_connections_open",
                "Agents connected over QUIC now.",
            ),
            connections_total: counter_vec(
                registry,
                "smolder_aggregator_ingest_quic_connections_total",
                "QUIC connection attempts, by outcome: accepted, refused (hello), handshake_failed (TLS).",
                &["outcome"],
            ),
            batches_received: counter(
                registry,
                "smolder_aggregator_ingest_quic_batches_received_total",
                "Agent batches read whole from QUIC streams.",
            ),
            bytes_received: counter(
                registry,
                "smolder_aggregator_ingest_quic_bytes_received_total",
                "Bytes of agent batches as sent (frame header and compressed body).",
            ),
            batches_acked: counter(
                registry,
                "smolder_aggregator_ingest_quic_batches_acked_total",
                "Agent batches acknowledged once durable, duplicates included.",
            ),
            batches_duplicate: counter(
                registry,
                "smolder_aggregator_ingest_quic_batches_duplicate_total",
                "Acknowledged agent batches that had been stored before and were not stored again.",
            ),
            batches_rejected: counter_vec(
                registry,
                "smolder_aggregator_ingest_quic_batches_rejected_total",
                "Agent batch streams refused, by reason.",
                &["reason"],
            ),
            batch_duration: histogram(
                registry,
                "smolder_aggregator_ingest_quic_batch_duration_seconds",
                "Time from a batch stream's opening to its acknowledgement, fsync included.",
                latency_buckets(),
            ),
        }
    }
}
