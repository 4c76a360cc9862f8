//! The store's metrics, `smolder_aggregator_store_*`.

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, Registry};
use smolder_daemon::Health;
use smolder_daemon::metrics::{
    counter, counter_vec, gauge, histogram, histogram_vec, latency_buckets,
};

use crate::metrics::Dropped;

/// The store's metrics, handed to the backend when it opens.
#[derive(Clone)]
pub(crate) struct StoreMetrics {
    /// `smolder_aggregator_store_head_series`: series with data in the head.
    pub(crate) head_series: IntGauge,
    /// `smolder_aggregator_store_head_bytes`: memory the head holds (estimated), what
    /// `store.head-max-bytes` bounds.
    pub(crate) head_bytes: IntGauge,
    /// `smolder_aggregator_store_head_ranges_cut_early_total`: head ranges sealed for a cut
    /// before they closed, because the head held more than `store.head-max-bytes`.
    pub(crate) ranges_sealed_early: IntCounter,
    /// `smolder_aggregator_store_head_full_refusals_total`: writes refused (retryable) while
    /// the head held more than twice `store.head-max-bytes`.
    pub(crate) head_full_refusals: IntCounter,
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
    /// `smolder_aggregator_store_span_trees_written_total`: span trees added to the head (one
    /// per span per write).
    pub(crate) span_trees_written: IntCounter,
    /// `smolder_aggregator_dropped_spans_total{stage="store",reason="span_limit"}`: span trees
    /// past `store.max-spans-per-bucket`; their samples stay in their series' profile.
    pub(crate) dropped_spans: Dropped,
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
    /// `smolder_aggregator_store_segments_uploaded_total`: segments written to the bucket
    /// (object-storage mode), each one group commit's writes.
    pub(crate) segments_uploaded: IntCounter,
    /// `smolder_aggregator_store_segment_bytes_uploaded_total`.
    pub(crate) segment_bytes_uploaded: IntCounter,
    /// `smolder_aggregator_store_segment_upload_failures_total`: uploads that failed; their
    /// writes were refused as retryable, none acknowledged.
    pub(crate) segment_upload_failures: IntCounter,
    /// `smolder_aggregator_store_segment_uploads_refused_total`: groups of writes refused
    /// without an upload, within `upload-timeout` of a failed one.
    pub(crate) segment_uploads_refused: IntCounter,
    /// `smolder_aggregator_store_segment_upload_duration_seconds`: one segment's PUT.
    pub(crate) segment_upload_duration: Histogram,
    /// `smolder_aggregator_store_segments_deleted_total`: own or adopted segments deleted once
    /// blocks held their records.
    pub(crate) segments_deleted: IntCounter,
    /// `smolder_aggregator_store_segments_pending`: own or adopted segments waiting for blocks.
    pub(crate) segments_pending: IntGauge,
    /// `smolder_aggregator_store_segments_doubtful`: own segments whose upload failed, not yet
    /// known to be absent from the bucket or read from it.
    pub(crate) segments_doubtful: IntGauge,
    /// `smolder_aggregator_store_segments_landed_late_total`: own segments found in the bucket
    /// after their upload failed, taken into the own head.
    pub(crate) segments_landed_late: IntCounter,
    /// `smolder_aggregator_store_remote_segments`: other writers' segments read and held.
    pub(crate) remote_segments: IntGauge,
    /// `smolder_aggregator_store_remote_head_series`: series in the remote head.
    pub(crate) remote_head_series: IntGauge,
    /// `smolder_aggregator_store_adopted_segments_total`: segments of orphaned writers taken
    /// over.
    pub(crate) adopted_segments: IntCounter,
    /// `smolder_aggregator_store_bad_segments_total`: segments that did not decode, not read.
    pub(crate) bad_segments: IntCounter,
    /// `smolder_aggregator_store_duplicate_batches_total{found}`: copies of a stored batch
    /// found beside the first and left out, where: `segment` (another aggregator's segment
    /// brought a batch held here already), `head` (a block of another aggregator holds a write
    /// of the own head), `block` (two blocks hold it; reads leave one copy out), `merge` (two
    /// merged blocks hold it: reads show one of them and the other's inputs). Each is the race
    /// that remains without compare-and-swap: two aggregators accepting one batch within one
    /// upload interval.
    pub(crate) duplicate_batches: IntCounterVec,
    /// `smolder_aggregator_store_compacting`: 1 while this aggregator compacts the bucket (it
    /// may, and holds the lease or won the election), else 0; always 1 in local mode.
    pub(crate) compacting: IntGauge,
    /// `smolder_aggregator_store_blocks_hidden`: blocks of the bucket that reads do not show
    /// because shown blocks hold their data (merges' inputs, merges that lost), until a
    /// compactor deletes them after `compaction-grace`.
    pub(crate) blocks_hidden: IntGauge,
    /// `smolder_aggregator_store_blocks_retired_total`: hidden blocks a compactor deleted after
    /// the grace.
    pub(crate) blocks_retired: IntCounter,
    /// `smolder_aggregator_store_app_deletions`: app deletions this aggregator knows and
    /// applies (made here, read from the bucket or from blocks), until retention forgets them.
    pub(crate) app_deletions: IntGauge,
    /// `smolder_aggregator_store_merges_abandoned_total{reason}`: merges written but not
    /// published: `lost` (another block shows in their place), `late` (they would hide a block
    /// older than half the grace), `changed` (an input went or an app was deleted meanwhile).
    pub(crate) merges_abandoned: IntCounterVec,
    /// `smolder_aggregator_store_sync_duration_seconds`: one poll of the bucket.
    pub(crate) sync_duration: Histogram,
    /// `smolder_aggregator_store_sync_failures_total`: polls that failed (retried at the next).
    pub(crate) sync_failures: IntCounter,
    /// `smolder_aggregator_store_shared_poll_duration_seconds`: one poll of the bucket's
    /// recording rules.
    pub(crate) shared_poll_duration: Histogram,
    /// `smolder_aggregator_store_shared_poll_failures_total`: polls of the bucket's recording
    /// rules that failed (retried at the next).
    pub(crate) shared_poll_failures: IntCounter,
    /// `smolder_aggregator_store_shared_rules`: recording rules made through the API, in the
    /// bucket, every tenant's.
    pub(crate) shared_rules: IntGauge,
    /// `smolder_aggregator_store_shared_rule_changes_total`: rules created, changed or deleted
    /// through other aggregators, found by a poll.
    pub(crate) shared_rule_changes: IntCounter,
    /// The object store's requests (object-storage mode): what S3 bills.
    pub(crate) object: ObjectMetrics,
    /// The bucket's blocks kept on local disk (object-storage mode).
    pub(crate) block_cache: BlockCacheMetrics,
    /// The tier's health, which the writer thread and the maintenance tasks register with
    /// (`store_writer`, `store_cut`, `store_compaction`, `store_retention`, `store_sync`,
    /// `store_shared`).
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
            head_bytes: g(
                "smolder_aggregator_store_head_bytes",
                "Memory the head holds, estimated; store.head-max-bytes bounds it.",
            ),
            ranges_sealed_early: c(
                "smolder_aggregator_store_head_ranges_cut_early_total",
                "Head ranges cut before they closed because the head held more than store.head-max-bytes.",
            ),
            head_full_refusals: c(
                "smolder_aggregator_store_head_full_refusals_total",
                "Writes refused (retryable) while the head held more than twice store.head-max-bytes: cuts did not keep up.",
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
            span_trees_written: c(
                "smolder_aggregator_store_span_trees_written_total",
                "Span trees added to the head: one per span of a written profile.",
            ),
            dropped_spans: Dropped::register(
                registry,
                "smolder_aggregator_dropped_spans_total",
                "Span trees",
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
            segments_uploaded: c(
                "smolder_aggregator_store_segments_uploaded_total",
                "Segments written to the bucket (object-storage mode), each one group commit's writes.",
            ),
            segment_bytes_uploaded: c(
                "smolder_aggregator_store_segment_bytes_uploaded_total",
                "Bytes of segments written to the bucket.",
            ),
            segment_upload_failures: c(
                "smolder_aggregator_store_segment_upload_failures_total",
                "Segment uploads that failed; their writes were refused as retryable.",
            ),
            segment_uploads_refused: c(
                "smolder_aggregator_store_segment_uploads_refused_total",
                "Groups of writes refused without an upload because the last upload failed less than upload-timeout ago (object-storage mode).",
            ),
            segment_upload_duration: h(
                "smolder_aggregator_store_segment_upload_duration_seconds",
                "Time to write one segment to the bucket.",
            ),
            segments_deleted: c(
                "smolder_aggregator_store_segments_deleted_total",
                "Own or adopted segments deleted once blocks held their records.",
            ),
            segments_pending: g(
                "smolder_aggregator_store_segments_pending",
                "Own or adopted segments in the bucket waiting for blocks to hold their records.",
            ),
            segments_doubtful: g(
                "smolder_aggregator_store_segments_doubtful",
                "Own segments whose upload failed, not yet known to be absent from the bucket or read from it.",
            ),
            segments_landed_late: c(
                "smolder_aggregator_store_segments_landed_late_total",
                "Own segments found in the bucket after their upload failed (their writes were refused), taken into the own head.",
            ),
            remote_segments: g(
                "smolder_aggregator_store_remote_segments",
                "Other aggregators' segments read from the bucket and held for reads.",
            ),
            remote_head_series: g(
                "smolder_aggregator_store_remote_head_series",
                "Series in the remote head (other aggregators' segments).",
            ),
            adopted_segments: c(
                "smolder_aggregator_store_adopted_segments_total",
                "Segments of aggregators whose heartbeat stopped, taken over to be cut here.",
            ),
            bad_segments: c(
                "smolder_aggregator_store_bad_segments_total",
                "Segments that did not decode and were not read.",
            ),
            duplicate_batches: counter_vec(
                registry,
                "smolder_aggregator_store_duplicate_batches_total",
                "Copies of a stored batch found beside the first and left out, by where.",
                &["found"],
            ),
            compacting: g(
                "smolder_aggregator_store_compacting",
                "1 while this aggregator compacts the store (object-storage mode: it may, and holds the lease or won the election).",
            ),
            blocks_hidden: g(
                "smolder_aggregator_store_blocks_hidden",
                "Blocks of the bucket that reads do not show because shown blocks hold their data, until deleted after compaction-grace.",
            ),
            blocks_retired: c(
                "smolder_aggregator_store_blocks_retired_total",
                "Hidden blocks (merges' inputs, merges that lost) deleted after compaction-grace.",
            ),
            app_deletions: g(
                "smolder_aggregator_store_app_deletions",
                "App deletions known and applied (DELETE /api/apps, here or on another aggregator of the bucket).",
            ),
            merges_abandoned: counter_vec(
                registry,
                "smolder_aggregator_store_merges_abandoned_total",
                "Merges written but not published, by reason.",
                &["reason"],
            ),
            sync_duration: h(
                "smolder_aggregator_store_sync_duration_seconds",
                "Time of one poll of the bucket for other aggregators' segments and blocks.",
            ),
            sync_failures: c(
                "smolder_aggregator_store_sync_failures_total",
                "Polls of the bucket that failed; the next poll tries again.",
            ),
            shared_poll_duration: h(
                "smolder_aggregator_store_shared_poll_duration_seconds",
                "Time of one poll of the bucket's recording rules.",
            ),
            shared_poll_failures: c(
                "smolder_aggregator_store_shared_poll_failures_total",
                "Polls of the bucket's recording rules that failed; the next poll tries again.",
            ),
            shared_rules: g(
                "smolder_aggregator_store_shared_rules",
                "Recording rules made through the API kept in the bucket, every tenant's.",
            ),
            shared_rule_changes: c(
                "smolder_aggregator_store_shared_rule_changes_total",
                "Recording rules created, changed or deleted through other aggregators, found by a poll of the bucket.",
            ),
            object: ObjectMetrics::new(registry),
            block_cache: BlockCacheMetrics::new(registry),
            health: health.clone(),
        }
    }
}

/// Every HTTP request this aggregator makes to the object store, counted where the S3 client
/// sends it (`blocks/bucket.rs`), so that retries, listing pages and multipart parts count as
/// the store bills them.
#[derive(Clone)]
pub(crate) struct ObjectMetrics {
    /// `smolder_aggregator_store_object_requests_total{op,outcome}`: requests by operation
    /// (`put`, `put_part`, `multipart`, `copy`, `get`, `get_range`, `head`, `list`, `delete`,
    /// `credentials`, `other`) and outcome (`ok`, `not_found`, `precondition_failed`,
    /// `client_error`, `server_error`, `transport_error`).
    pub(crate) requests: IntCounterVec,
    /// `smolder_aggregator_store_object_request_duration_seconds{op}`: from sending a request
    /// to its answer's headers (a GET's body is read after).
    pub(crate) duration: HistogramVec,
    /// `smolder_aggregator_store_object_bytes_total{direction}`: bodies `sent` (uploads) and
    /// `received` (downloads, by their Content-Length).
    pub(crate) bytes: IntCounterVec,
}

impl ObjectMetrics {
    fn new(registry: &Registry) -> ObjectMetrics {
        ObjectMetrics {
            requests: counter_vec(
                registry,
                "smolder_aggregator_store_object_requests_total",
                "Requests to the object store (object-storage mode), by operation and outcome.",
                &["op", "outcome"],
            ),
            duration: histogram_vec(
                registry,
                "smolder_aggregator_store_object_request_duration_seconds",
                "Time from sending a request to the object store to its answer's headers, by operation.",
                latency_buckets(),
                &["op"],
            ),
            bytes: counter_vec(
                registry,
                "smolder_aggregator_store_object_bytes_total",
                "Bytes of request bodies sent to the object store and of answers received from it.",
                &["direction"],
            ),
        }
    }
}

/// The block cache: the bucket's blocks kept whole on local disk, under
/// `store.object-store.block-cache-bytes` (`blocks/cache.rs`).
#[derive(Clone)]
pub(crate) struct BlockCacheMetrics {
    /// `smolder_aggregator_store_block_cache_bytes`: bytes of cached blocks on disk, with
    /// those being downloaded or written.
    pub(crate) bytes: IntGauge,
    /// `smolder_aggregator_store_block_cache_limit_bytes`: the bound.
    pub(crate) limit: IntGauge,
    /// `smolder_aggregator_store_block_cache_blocks`: blocks cached.
    pub(crate) blocks: IntGauge,
    /// `smolder_aggregator_store_block_cache_hits_total`: reads of a block's profiles found on
    /// disk (opening a block, which reads its end, is not counted).
    pub(crate) hits: IntCounter,
    /// `smolder_aggregator_store_block_cache_misses_total`: reads of a block's profiles that
    /// went to the bucket (a whole download, or a ranged read).
    pub(crate) misses: IntCounter,
    /// `smolder_aggregator_store_block_cache_evictions_total`: blocks removed to make room.
    pub(crate) evictions: IntCounter,
    /// `smolder_aggregator_store_block_cache_downloads_total`: blocks downloaded whole.
    pub(crate) downloads: IntCounter,
    /// `smolder_aggregator_store_block_cache_ranged_reads_total`: reads served by a ranged
    /// GET, for blocks opened without their bytes or that do not fit the cache.
    pub(crate) ranged_reads: IntCounter,
}

impl BlockCacheMetrics {
    fn new(registry: &Registry) -> BlockCacheMetrics {
        let g = |name, help| gauge(registry, name, help);
        let c = |name, help| counter(registry, name, help);
        BlockCacheMetrics {
            bytes: g(
                "smolder_aggregator_store_block_cache_bytes",
                "Bytes of the bucket's blocks cached on local disk, downloads and writes in progress included.",
            ),
            limit: g(
                "smolder_aggregator_store_block_cache_limit_bytes",
                "The block cache's bound (store.object-store.block-cache-bytes).",
            ),
            blocks: g(
                "smolder_aggregator_store_block_cache_blocks",
                "Blocks of the bucket cached on local disk.",
            ),
            hits: c(
                "smolder_aggregator_store_block_cache_hits_total",
                "Reads of a bucket's block's profiles found in the local cache (opening a block is not counted).",
            ),
            misses: c(
                "smolder_aggregator_store_block_cache_misses_total",
                "Reads of a bucket's block's profiles that went to the bucket.",
            ),
            evictions: c(
                "smolder_aggregator_store_block_cache_evictions_total",
                "Cached blocks removed, least recently read first, to make room.",
            ),
            downloads: c(
                "smolder_aggregator_store_block_cache_downloads_total",
                "Blocks downloaded whole into the cache.",
            ),
            ranged_reads: c(
                "smolder_aggregator_store_block_cache_ranged_reads_total",
                "Reads of a bucket's block served by a ranged GET rather than the cache.",
            ),
        }
    }
}
