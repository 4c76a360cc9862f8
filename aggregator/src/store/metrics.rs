//! The store's metrics, `smolder_aggregator_store_*`.

use prometheus::{Histogram, IntCounter, IntGauge, Registry};
use smolder_daemon::Health;

use crate::metrics::{counter, gauge, histogram, latency_buckets};

/// The store's metrics, handed to the backend when it opens.
#[derive(Clone)]
pub(crate) struct StoreMetrics {
    /// `smolder_aggregator_store_head_series`: series with data in the head.
    pub(crate) head_series: IntGauge,
    /// `smolder_aggregator_store_blocks`: blocks served.
    pub(crate) blocks: IntGauge,
    /// `smolder_aggregator_store_block_bytes`: their size.
    pub(crate) block_bytes: IntGauge,
    /// `smolder_aggregator_store_bad_blocks`: blocks found damaged (or of a newer format) and
    /// not served.
    pub(crate) bad_blocks: IntGauge,
    /// `smolder_aggregator_store_disk_bytes`: blocks and head on disk.
    pub(crate) disk_bytes: IntGauge,
    /// `smolder_aggregator_store_write_duration_seconds`: one write request, from queueing to
    /// acknowledgement, fsync included.
    pub(crate) write_duration: Histogram,
    /// `smolder_aggregator_store_flush_duration_seconds`: one fsync of the head.
    pub(crate) flush_duration: Histogram,
    /// `smolder_aggregator_store_profiles_written_total`.
    pub(crate) profiles_written: IntCounter,
    /// `smolder_aggregator_store_blocks_cut_total`: blocks cut from the head.
    pub(crate) blocks_cut: IntCounter,
    /// `smolder_aggregator_store_cut_duration_seconds`: one head range cut (all tenants).
    pub(crate) cut_duration: Histogram,
    /// `smolder_aggregator_store_compactions_total`: merges published.
    pub(crate) compactions: IntCounter,
    /// `smolder_aggregator_store_compaction_duration_seconds`: one merge.
    pub(crate) compaction_duration: Histogram,
    /// `smolder_aggregator_store_block_bytes_written_total`: bytes of blocks written (cuts
    /// and merges).
    pub(crate) block_bytes_written: IntCounter,
    /// `smolder_aggregator_store_retention_blocks_deleted_total`.
    pub(crate) blocks_deleted_retention: IntCounter,
    /// `smolder_aggregator_store_retention_duration_seconds`: one retention pass.
    pub(crate) retention_duration: Histogram,
    /// `smolder_aggregator_store_cache_hits_total`: block chunk headers found decoded.
    pub(crate) cache_hits: IntCounter,
    /// `smolder_aggregator_store_cache_misses_total`: block chunk headers read and decoded.
    pub(crate) cache_misses: IntCounter,
    /// `smolder_aggregator_store_cache_bytes`: decoded block data kept (estimated).
    pub(crate) cache_bytes: IntGauge,
    /// `smolder_aggregator_store_filesystem_free_bytes`: bytes available to the aggregator on
    /// the data directory's filesystem, updated at start and after every retention pass.
    pub(crate) filesystem_free_bytes: IntGauge,
    /// `smolder_aggregator_store_filesystem_size_bytes`: size of that filesystem.
    pub(crate) filesystem_size_bytes: IntGauge,
    /// The tier's health, which the writer thread and the maintenance tasks register with
    /// (`store_writer`, `store_cut`, `store_compaction`, `store_retention`).
    pub(crate) health: Health,
}

impl StoreMetrics {
    /// Creates the store's metrics in `registry`; its loops report to `health`.
    pub(crate) fn new(registry: &Registry, health: &Health) -> Self {
        let g = |name, help| gauge(registry, name, help);
        let c = |name, help| counter(registry, name, help);
        let h = |name, help| histogram(registry, name, help, latency_buckets());
        StoreMetrics {
            head_series: g(
                "smolder_aggregator_store_head_series",
                "Series with data in the head (not yet cut into blocks).",
            ),
            blocks: g("smolder_aggregator_store_blocks", "Blocks served."),
            block_bytes: g(
                "smolder_aggregator_store_block_bytes",
                "Bytes of the blocks served.",
            ),
            bad_blocks: g(
                "smolder_aggregator_store_bad_blocks",
                "Blocks found damaged or of a newer format, named in the log and not served.",
            ),
            disk_bytes: g(
                "smolder_aggregator_store_disk_bytes",
                "Bytes the store (blocks and head) occupies on disk.",
            ),
            write_duration: h(
                "smolder_aggregator_store_write_duration_seconds",
                "Time from queueing a write to its acknowledgement, fsync included.",
            ),
            flush_duration: h(
                "smolder_aggregator_store_flush_duration_seconds",
                "Time to make one group of writes durable.",
            ),
            profiles_written: c(
                "smolder_aggregator_store_profiles_written_total",
                "Profiles written durably.",
            ),
            blocks_cut: c(
                "smolder_aggregator_store_blocks_cut_total",
                "Blocks cut from closed head ranges.",
            ),
            cut_duration: h(
                "smolder_aggregator_store_cut_duration_seconds",
                "Time to cut one head range into blocks, fsync included.",
            ),
            compactions: c(
                "smolder_aggregator_store_compactions_total",
                "Merges of blocks published.",
            ),
            compaction_duration: h(
                "smolder_aggregator_store_compaction_duration_seconds",
                "Time of one merge of blocks, from reading its inputs to publishing it.",
            ),
            block_bytes_written: c(
                "smolder_aggregator_store_block_bytes_written_total",
                "Bytes of blocks written by cuts and merges.",
            ),
            blocks_deleted_retention: c(
                "smolder_aggregator_store_retention_blocks_deleted_total",
                "Blocks deleted by retention (age or size).",
            ),
            retention_duration: h(
                "smolder_aggregator_store_retention_duration_seconds",
                "Time of one retention pass.",
            ),
            cache_hits: c(
                "smolder_aggregator_store_cache_hits_total",
                "Reads of a block series' shape and tree table found decoded in the cache.",
            ),
            cache_misses: c(
                "smolder_aggregator_store_cache_misses_total",
                "Reads of a block series' shape and tree table that read and decoded it.",
            ),
            cache_bytes: g(
                "smolder_aggregator_store_cache_bytes",
                "Estimated bytes of decoded block data in the cache (store.cache-bytes).",
            ),
            filesystem_free_bytes: g(
                "smolder_aggregator_store_filesystem_free_bytes",
                "Bytes available to the aggregator on the data directory's filesystem.",
            ),
            filesystem_size_bytes: g(
                "smolder_aggregator_store_filesystem_size_bytes",
                "Size of the data directory's filesystem in bytes.",
            ),
            health: health.clone(),
        }
    }
}
