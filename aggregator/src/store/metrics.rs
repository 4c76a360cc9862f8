//! The store's metrics, `smolder_aggregator_store_*`.

use prometheus::{Histogram, IntCounter, IntGauge, Registry};

use crate::metrics::{counter, gauge, histogram, latency_buckets};

/// The store's metrics, handed to the backend when it opens.
#[derive(Clone)]
pub(crate) struct StoreMetrics {
    /// `smolder_aggregator_store_series`: series known.
    pub(crate) series: IntGauge,
    /// `smolder_aggregator_store_disk_bytes`: size of the data directory as sled reports it,
    /// updated at open and by every retention pass.
    pub(crate) disk_bytes: IntGauge,
    /// `smolder_aggregator_store_write_duration_seconds`: one write request, from queueing to
    /// acknowledgement, fsync included.
    pub(crate) write_duration: Histogram,
    /// `smolder_aggregator_store_flush_duration_seconds`: one fsync of the log.
    pub(crate) flush_duration: Histogram,
    /// `smolder_aggregator_store_profiles_written_total`.
    pub(crate) profiles_written: IntCounter,
    /// `smolder_aggregator_store_rollup_trees_written_total`: rollup trees built.
    pub(crate) rollup_trees_written: IntCounter,
    /// `smolder_aggregator_store_retention_buckets_deleted_total`.
    pub(crate) retention_buckets_deleted: IntCounter,
    /// `smolder_aggregator_store_retention_duration_seconds`: one retention pass.
    pub(crate) retention_duration: Histogram,
    /// `smolder_aggregator_store_filesystem_free_bytes`: bytes available to the aggregator on
    /// the data directory's filesystem, updated at start and after every retention pass.
    pub(crate) filesystem_free_bytes: IntGauge,
    /// `smolder_aggregator_store_filesystem_size_bytes`: size of that filesystem.
    pub(crate) filesystem_size_bytes: IntGauge,
}

impl StoreMetrics {
    /// Creates the store's metrics in `registry`.
    pub(crate) fn new(registry: &Registry) -> Self {
        StoreMetrics {
            series: gauge(
                registry,
                "smolder_aggregator_store_series",
                "Series in the store.",
            ),
            disk_bytes: gauge(
                registry,
                "smolder_aggregator_store_disk_bytes",
                "Bytes the store occupies on disk.",
            ),
            write_duration: histogram(
                registry,
                "smolder_aggregator_store_write_duration_seconds",
                "Time from queueing a write to its acknowledgement, fsync included.",
                latency_buckets(),
            ),
            flush_duration: histogram(
                registry,
                "smolder_aggregator_store_flush_duration_seconds",
                "Time to make one group of writes durable.",
                latency_buckets(),
            ),
            profiles_written: counter(
                registry,
                "smolder_aggregator_store_profiles_written_total",
                "Profiles written durably.",
            ),
            rollup_trees_written: counter(
                registry,
                "smolder_aggregator_store_rollup_trees_written_total",
                "Rollup trees built from their children after their bucket closed.",
            ),
            retention_buckets_deleted: counter(
                registry,
                "smolder_aggregator_store_retention_buckets_deleted_total",
                "Buckets deleted by retention.",
            ),
            retention_duration: histogram(
                registry,
                "smolder_aggregator_store_retention_duration_seconds",
                "Time of one retention pass.",
                latency_buckets(),
            ),
            filesystem_free_bytes: gauge(
                registry,
                "smolder_aggregator_store_filesystem_free_bytes",
                "Bytes available to the aggregator on the data directory's filesystem.",
            ),
            filesystem_size_bytes: gauge(
                registry,
                "smolder_aggregator_store_filesystem_size_bytes",
                "Size of the data directory's filesystem in bytes.",
            ),
        }
    }
}
