//! Ingest's metrics: Pyroscope's distributor metrics, under Pyroscope's names so that its
//! dashboards read them, and `smolder_aggregator_ingest_profiles_total`. QUIC ingest's own are
//! in `quic/metrics.rs`.

use prometheus::{HistogramVec, IntCounterVec, Registry};
use smolder_daemon::metrics::{counter_vec, histogram_vec};

/// Ingest's metrics, recorded by the `Ingester` once a write is acknowledged (the clock-skew
/// refusals as they happen). Refused series count in the tier's
/// `smolder_aggregator_dropped_series_total{stage="ingest",reason}`.
#[derive(Clone)]
pub(crate) struct IngestMetrics {
    /// `pyroscope_distributor_received_compressed_bytes{type}`: body size per profile as sent.
    pub(crate) received_compressed_bytes: HistogramVec,
    /// `pyroscope_distributor_received_samples{type}`: samples (stacks) per profile.
    pub(crate) received_samples: HistogramVec,
    /// `smolder_aggregator_ingest_profiles_total{transport,format}`: profiles stored, by how
    /// they came (`http`, `quic`) and in what (`folded`, `lines`, `pprof`, `jfr`, `push`;
    /// `wire` for agents' batches).
    pub(crate) profiles: IntCounterVec,
    /// `smolder_aggregator_ingest_clock_skew_rejects_total{transport}`: requests and agent
    /// batches refused because they end too far past the aggregator's clock (for agents,
    /// retried: their clock is ahead).
    pub(crate) clock_skew_rejects: IntCounterVec,
}

impl IngestMetrics {
    /// Creates ingest's metrics in `registry`.
    pub(crate) fn new(registry: &Registry) -> Self {
        let bytes = prometheus::exponential_buckets(256.0, 4.0, 10).expect("valid size buckets");
        let samples =
            prometheus::exponential_buckets(100.0, 10.0, 4).expect("valid sample buckets");
        IngestMetrics {
            received_compressed_bytes: histogram_vec(
                registry,
                "pyroscope_distributor_received_compressed_bytes",
                "Size of each received profile as sent, before decompression.",
                bytes,
                &["type"],
            ),
            received_samples: histogram_vec(
                registry,
                "pyroscope_distributor_received_samples",
                "Stacks with a value in each received profile.",
                samples,
                &["type"],
            ),
            profiles: counter_vec(
                registry,
                "smolder_aggregator_ingest_profiles_total",
                "Profiles stored, by transport (http, quic) and body format.",
                &["transport", "format"],
            ),
            clock_skew_rejects: counter_vec(
                registry,
                "smolder_aggregator_ingest_clock_skew_rejects_total",
                "Requests and agent batches refused for ending too far past the aggregator's clock, by transport.",
                &["transport"],
            ),
        }
    }
}
