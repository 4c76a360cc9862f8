//! The shipper's metrics (`smolder_agent_ship_*`), updated per connection and per batch sent.
//! Why connections fail is counted in `smolder_agent_errors_total{stage="ship",error_type}`.

use std::net::SocketAddr;

use prometheus::Opts;
use prometheus::{Gauge, Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};
use smolder_daemon::metrics::{counter, counter_vec, gauge, histogram, latency_buckets, register};

use smolder_common::wire::RefusalReason;

use super::ShipError;
use crate::tier::{DropCause, DroppedUnit, StageCounters, TierCounters};

/// The `reason` of a refused series whose code this build does not know (a newer aggregator's).
const OTHER: &str = "other";

/// The `reason`s of `smolder_agent_ship_failovers_total`: no connection (or no welcome), the
/// hello refused, the connection lost, a batch refused as `unavailable`.
pub(super) const FAILOVER_REASONS: [&str; 4] = ["connect", "refused", "lost", "unavailable"];

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
    /// `smolder_agent_ship_failovers_total{reason}`: moves to the next of several aggregators,
    /// by why the last one failed: `connect`, `refused`, `lost`, `unavailable`.
    pub failovers: IntCounterVec,
    /// `smolder_agent_ship_aggregator_info{address}`: 1 for the address connected to or tried
    /// now, the only series (the addresses come from `ship.aggregators` and DNS: bounded).
    pub aggregator: IntGaugeVec,
    /// `smolder_agent_ship_connected`: 1 while connected to the aggregator.
    pub connected: IntGauge,
    /// `smolder_agent_ship_rtt_seconds`: QUIC's smoothed round-trip time to the aggregator.
    pub rtt: Gauge,
    /// `smolder_agent_ship_ack_duration_seconds`: from opening a batch's stream to its ack.
    pub ack_duration: Histogram,
    /// `smolder_agent_ship_clock_offset_seconds`: the aggregator's clock minus this host's, as
    /// measured at the last welcome (negative: this host is ahead).
    pub clock_offset: Gauge,
    /// `smolder_agent_errors_total{stage="ship",error_type}`: failed connection attempts and
    /// lost connections, by [`ShipError::kind`];
    /// `smolder_agent_dropped_series_total{stage="ship",reason}`: series the aggregator refused.
    pub tier: StageCounters,
}

impl ShipMetrics {
    /// Creates the shipper's metrics in `registry`.
    pub(crate) fn new(registry: &Registry, tier: &TierCounters) -> Self {
        let metrics = ShipMetrics {
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
            failovers: {
                let failovers = counter_vec(
                    registry,
                    "smolder_agent_ship_failovers_total",
                    "Moves to the next of several aggregators, by why the last one failed.",
                    &["reason"],
                );
                for reason in FAILOVER_REASONS {
                    failovers.with_label_values(&[reason]);
                }
                failovers
            },
            aggregator: register(
                registry,
                IntGaugeVec::new(
                    Opts::new(
                        "smolder_agent_ship_aggregator_info",
                        "1 for the aggregator address connected to or tried now.",
                    ),
                    &["address"],
                )
                .expect("a valid gauge"),
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
            ack_duration: histogram(
                registry,
                "smolder_agent_ship_ack_duration_seconds",
                "Time from opening a batch's stream to its ack.",
                latency_buckets(),
            ),
            clock_offset: register(
                registry,
                Gauge::new(
                    "smolder_agent_ship_clock_offset_seconds",
                    "The aggregator's clock minus this host's, at the last welcome; negative when this host is ahead.",
                )
                .expect("a valid gauge"),
            ),
            tier: tier.stage(
                "ship",
                &ShipError::KINDS,
                &RefusalReason::ALL
                    .map(|r| (DroppedUnit::Series, DropCause::forced(r.as_str())))
                    .into_iter()
                    .chain([(DroppedUnit::Series, DropCause::forced(OTHER))])
                    .collect::<Vec<_>>(),
            ),
        };
        // Both label values exist from the start, so that "no batch refused" reads as 0 rather
        // than as a missing series.
        for retryable in ["true", "false"] {
            metrics.batches_rejected.with_label_values(&[retryable]);
        }
        metrics
    }

    /// Shows `addr` as the current aggregator, `shown` being the one shown so far.
    pub(crate) fn show_current(&self, shown: &mut Option<SocketAddr>, addr: SocketAddr) {
        if *shown == Some(addr) {
            return;
        }
        if let Some(old) = shown.replace(addr) {
            let _ = self.aggregator.remove_label_values(&[&old.to_string()]);
        }
        self.aggregator
            .with_label_values(&[&addr.to_string()])
            .set(1);
    }

    /// Counts `count` series the aggregator refused for `reason` (`None`: a code this build
    /// does not know).
    pub fn refused(&self, reason: Option<RefusalReason>, count: u64) {
        let reason = reason.map_or(OTHER, RefusalReason::as_str);
        self.tier
            .dropped(DroppedUnit::Series, DropCause::forced(reason), count);
    }
}
