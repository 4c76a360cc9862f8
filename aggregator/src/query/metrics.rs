//! The query path's metrics, `smolder_aggregator_query_*`; failures are counted in the tier's
//! `smolder_aggregator_errors_total{stage="query"}`. The request metric Pyroscope's dashboards
//! read, `pyroscope_request_duration_seconds`, is the router's (`http.rs`).

use std::time::Instant;

use prometheus::{HistogramVec, IntGauge, Registry};
use smolder_daemon::metrics::{gauge, histogram_vec, latency_buckets};

/// The query path's metrics.
#[derive(Clone)]
pub(crate) struct QueryMetrics {
    /// `smolder_aggregator_query_duration_seconds{endpoint,format}`: one answered query, from
    /// its parameters to its body, store reads and merges included.
    duration: HistogramVec,
    /// `smolder_aggregator_query_series_merged{endpoint}`: series merged by one query.
    series_merged: HistogramVec,
    /// `smolder_aggregator_query_nodes_merged{endpoint}`: nodes of the trees one query merged,
    /// before `maxNodes` truncation.
    nodes_merged: HistogramVec,
    /// `smolder_aggregator_query_running`: store reads running now (`query.max-concurrent`),
    /// cancelled ones until they have stopped.
    pub(crate) running: IntGauge,
    /// `smolder_aggregator_query_queued`: queries waiting for a slot (`query.max-queued`).
    pub(crate) queued: IntGauge,
}

impl QueryMetrics {
    /// Creates the query path's metrics in `registry`.
    pub(crate) fn new(registry: &Registry) -> Self {
        let counts = prometheus::exponential_buckets(1.0, 4.0, 12).expect("valid count buckets");
        QueryMetrics {
            duration: histogram_vec(
                registry,
                "smolder_aggregator_query_duration_seconds",
                "Time to answer a query, by endpoint and answer format.",
                latency_buckets(),
                &["endpoint", "format"],
            ),
            series_merged: histogram_vec(
                registry,
                "smolder_aggregator_query_series_merged",
                "Series merged by one query.",
                counts.clone(),
                &["endpoint"],
            ),
            nodes_merged: histogram_vec(
                registry,
                "smolder_aggregator_query_nodes_merged",
                "Nodes of the trees one query merged, before truncation.",
                counts,
                &["endpoint"],
            ),
            running: gauge(
                registry,
                "smolder_aggregator_query_running",
                "Store reads of queries running now, cancelled ones until they have stopped.",
            ),
            queued: gauge(
                registry,
                "smolder_aggregator_query_queued",
                "Queries waiting for a slot to read the store.",
            ),
        }
    }

    /// Records an answered query of `endpoint` in `format`, started at `started`.
    pub(crate) fn answered(&self, endpoint: &str, format: &str, started: Instant) {
        self.duration
            .with_label_values(&[endpoint, format])
            .observe(started.elapsed().as_secs_f64());
    }

    /// Records what one query of `endpoint` merged.
    pub(crate) fn merged(&self, endpoint: &str, series: usize, nodes: usize) {
        self.series_merged
            .with_label_values(&[endpoint])
            .observe(series as f64);
        self.nodes_merged
            .with_label_values(&[endpoint])
            .observe(nodes as f64);
    }
}
