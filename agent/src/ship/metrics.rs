//! The shipper's metrics (`smolder_agent_ship_*`), updated per connection and per batch sent.
//! Why connections fail is counted in `smolder_agent_errors_total{stage="ship",error_type}`.

use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Registry,
    exponential_buckets,
};

use super::ShipError;
use crate::metrics::{StageCounters, TierCounters, counter, counter_vec, gauge, register};

/// The shipper's metrics.
#[derive(Clone)]
pub struct ShipMetrics {
    /// `smolder_agent_ship_batches_sent_total`: batch streams opened, resends included.
    pub batches_sent: IntCounter,
    /// `smolder_agent_ship_bytes_sent_total`: their bytes.
    pub bytes_sent: IntCounter,
    /// `smolder_agent_ship_batches_acked_total`.
    pub batches_acked: IntCounter,
    /// `smolder_agent_ship_batches_rejected_total{retryable}`.
    pub batches_rejected: IntCounterVec,
    /// `smolder_agent_ship_batches_failed_total`: sent without an answer (connection lost,
    /// `ship.ack-timeout`); they are sent again.
    pub batches_failed: IntCounter,
    /// `smolder_agent_ship_reconnects_total`: connection attempts after a failure.
    pub reconnects: IntCounter,
    /// `smolder_agent_ship_connected`: 1 while connected to the aggregator.
    pub connected: IntGauge,
    /// `smolder_agent_ship_rtt_seconds`: QUIC's smoothed round-trip time to the aggregator.
    pub rtt: Gauge,
    /// `smolder_agent_ship_ack_duration_seconds`: from opening a batch's stream to its ack.
    pub ack_duration: Histogram,
    /// `smolder_agent_errors_total{stage="ship",error_type}`: failed connection attempts and
    /// lost connections, by [`ShipError::kind`].
    pub tier: StageCounters,
}

impl ShipMetrics {
    /// Creates the shipper's metrics in `registry`.
    pub(crate) fn new(registry: &Registry, tier: &TierCounters) -> Self {
        ShipMetrics {
            batches_sent: counter(
                registry,
                "smolder_agent_ship_batches_sent_total",
                "Batch streams opened to the aggregator, resends included.",
            ),
            bytes_sent: counter(
                registry,
                "smolder_agent_ship_bytes_sent_total",
                "Bytes of batches sent to the aggregator.",
            ),
            batches_acked: counter(
                registry,
                "smolder_agent_ship_batches_acked_total",
                "Batches the aggregator acknowledged as durable.",
            ),
            batches_rejected: counter_vec(
                registry,
                "smolder_agent_ship_batches_rejected_total",
                "Batches the aggregator refused, by whether a retry can help.",
                &["retryable"],
            ),
            batches_failed: counter(
                registry,
                "smolder_agent_ship_batches_failed_total",
                "Batches sent without an answer (connection lost, ack timeout); sent again.",
            ),
            reconnects: counter(
                registry,
                "smolder_agent_ship_reconnects_total",
                "Connection attempts to the aggregator after a failure.",
            ),
            connected: gauge(
                registry,
                "smolder_agent_ship_connected",
                "1 while connected to the aggregator.",
            ),
            rtt: register(
                registry,
                Gauge::new(
                    "smolder_agent_ship_rtt_seconds",
                    "Smoothed QUIC round-trip time to the aggregator.",
                )
                .expect("a valid gauge"),
            ),
            ack_duration: register(
                registry,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "smolder_agent_ship_ack_duration_seconds",
                        "Time from opening a batch's stream to its ack.",
                    )
                    .buckets(exponential_buckets(0.000_5, 2.0, 16).expect("valid buckets")),
                )
                .expect("a valid histogram"),
            ),
            tier: tier.stage("ship", &ShipError::KINDS, &[]),
        }
    }
}
