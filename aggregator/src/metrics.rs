//! Every metric the aggregator exports on `/metrics`, in one catalogue.
//!
//! The request and ingest metrics keep Pyroscope's names and labels, so its dashboards and
//! recording rules work against Smolder unchanged. Everything else is
//! `smolder_aggregator_<stage>_<noun>_<unit>`.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder, exponential_buckets,
};

/// The aggregator's metrics and the registry that serves them.
pub(crate) struct Metrics {
    registry: Registry,
    /// `pyroscope_request_duration_seconds{method,route,status_code,ws}`.
    pub(crate) request_duration: HistogramVec,
    /// `pyroscope_distributor_received_compressed_bytes{type}`: body size per profile as sent.
    pub(crate) received_compressed_bytes: HistogramVec,
    /// `pyroscope_distributor_received_samples{type}`: samples (stacks) per profile.
    pub(crate) received_samples: HistogramVec,
    /// `smolder_aggregator_ingest_profiles_total{format}`: profiles stored, by body format.
    pub(crate) ingest_profiles: IntCounterVec,
    /// `smolder_aggregator_errors_total{stage,error_type}`: failures by stage and kind.
    pub(crate) errors: IntCounterVec,
    /// The store's own metrics.
    pub(crate) store: StoreMetrics,
    /// The rules' own metrics.
    pub(crate) rules: RulesMetrics,
    /// QUIC ingest's metrics.
    pub(crate) quic: QuicMetrics,
}

/// QUIC ingest's metrics (`smolder_aggregator_ingest_quic_*`).
#[derive(Clone)]
pub(crate) struct QuicMetrics {
    /// `smolder_aggregator_ingest_quic_connections`: agents connected now.
    pub(crate) connections: IntGauge,
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

/// The store's metrics, handed to [`crate::store::Store`] when it opens.
#[derive(Clone)]
pub(crate) struct StoreMetrics {
    /// `smolder_aggregator_store_series`: series known.
    pub(crate) series: IntGauge,
    /// `smolder_aggregator_store_disk_bytes`: size of the data directory as sled reports it,
    /// updated at open and by every retention pass.
    pub(crate) disk_bytes: IntGauge,
    /// `smolder_aggregator_store_write_duration_seconds`: one write batch, rollups and fsync
    /// included, from queueing to acknowledgement.
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

impl Metrics {
    /// Creates and registers every metric.
    pub(crate) fn new() -> Self {
        let registry = Registry::new();
        let latency = exponential_buckets(0.000_5, 2.0, 16).expect("valid latency buckets");
        let bytes = exponential_buckets(256.0, 4.0, 10).expect("valid size buckets");
        let samples = exponential_buckets(100.0, 10.0, 4).expect("valid sample buckets");
        Metrics {
            request_duration: histogram_vec(
                &registry,
                HistogramOpts::new(
                    "pyroscope_request_duration_seconds",
                    "Time to answer an HTTP request.",
                )
                .buckets(latency.clone()),
                &["method", "route", "status_code", "ws"],
            ),
            received_compressed_bytes: histogram_vec(
                &registry,
                HistogramOpts::new(
                    "pyroscope_distributor_received_compressed_bytes",
                    "Size of each received profile as sent, before decompression.",
                )
                .buckets(bytes),
                &["type"],
            ),
            received_samples: histogram_vec(
                &registry,
                HistogramOpts::new(
                    "pyroscope_distributor_received_samples",
                    "Stacks with a value in each received profile.",
                )
                .buckets(samples),
                &["type"],
            ),
            ingest_profiles: register(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "smolder_aggregator_ingest_profiles_total",
                        "Profiles stored, by body format.",
                    ),
                    &["format"],
                )
                .expect("valid metric"),
            ),
            errors: register(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "smolder_aggregator_errors_total",
                        "Failures, by stage and kind; client mistakes included.",
                    ),
                    &["stage", "error_type"],
                )
                .expect("valid metric"),
            ),
            store: StoreMetrics {
                series: register(
                    &registry,
                    IntGauge::new("smolder_aggregator_store_series", "Series in the store.")
                        .expect("valid metric"),
                ),
                disk_bytes: register(
                    &registry,
                    IntGauge::new(
                        "smolder_aggregator_store_disk_bytes",
                        "Bytes the store occupies on disk.",
                    )
                    .expect("valid metric"),
                ),
                write_duration: histogram(
                    &registry,
                    "smolder_aggregator_store_write_duration_seconds",
                    "Time from queueing a write to its acknowledgement, fsync included.",
                    latency.clone(),
                ),
                flush_duration: histogram(
                    &registry,
                    "smolder_aggregator_store_flush_duration_seconds",
                    "Time to make one group of writes durable.",
                    latency.clone(),
                ),
                profiles_written: register(
                    &registry,
                    IntCounter::new(
                        "smolder_aggregator_store_profiles_written_total",
                        "Profiles written durably.",
                    )
                    .expect("valid metric"),
                ),
                rollup_trees_written: register(
                    &registry,
                    IntCounter::new(
                        "smolder_aggregator_store_rollup_trees_written_total",
                        "Rollup trees built from their children after their bucket closed.",
                    )
                    .expect("valid metric"),
                ),
                retention_buckets_deleted: register(
                    &registry,
                    IntCounter::new(
                        "smolder_aggregator_store_retention_buckets_deleted_total",
                        "Buckets deleted by retention.",
                    )
                    .expect("valid metric"),
                ),
                retention_duration: histogram(
                    &registry,
                    "smolder_aggregator_store_retention_duration_seconds",
                    "Time of one retention pass.",
                    latency.clone(),
                ),
                filesystem_free_bytes: register(
                    &registry,
                    IntGauge::new(
                        "smolder_aggregator_store_filesystem_free_bytes",
                        "Bytes available to the aggregator on the data directory's filesystem.",
                    )
                    .expect("valid metric"),
                ),
                filesystem_size_bytes: register(
                    &registry,
                    IntGauge::new(
                        "smolder_aggregator_store_filesystem_size_bytes",
                        "Size of the data directory's filesystem in bytes.",
                    )
                    .expect("valid metric"),
                ),
            },
            quic: QuicMetrics {
                connections: register(
                    &registry,
                    IntGauge::new(
                        "smolder_aggregator_ingest_quic_connections",
                        "Agents connected over QUIC now.",
                    )
                    .expect("valid metric"),
                ),
                connections_total: register(
                    &registry,
                    IntCounterVec::new(
                        Opts::new(
                            "smolder_aggregator_ingest_quic_connections_total",
                            "QUIC connection attempts, by outcome: accepted, refused (hello), handshake_failed (TLS).",
                        ),
                        &["outcome"],
                    )
                    .expect("valid metric"),
                ),
                batches_received: register(
                    &registry,
                    IntCounter::new(
                        "smolder_aggregator_ingest_quic_batches_received_total",
                        "Agent batches read whole from QUIC streams.",
                    )
                    .expect("valid metric"),
                ),
                bytes_received: register(
                    &registry,
                    IntCounter::new(
                        "smolder_aggregator_ingest_quic_bytes_received_total",
                        "Bytes of agent batches as sent (frame header and compressed body).",
                    )
                    .expect("valid metric"),
                ),
                batches_acked: register(
                    &registry,
                    IntCounter::new(
                        "smolder_aggregator_ingest_quic_batches_acked_total",
                        "Agent batches acknowledged once durable, duplicates included.",
                    )
                    .expect("valid metric"),
                ),
                batches_duplicate: register(
                    &registry,
                    IntCounter::new(
                        "smolder_aggregator_ingest_quic_batches_duplicate_total",
                        "Acknowledged agent batches that had been stored before and were not stored again.",
                    )
                    .expect("valid metric"),
                ),
                batches_rejected: register(
                    &registry,
                    IntCounterVec::new(
                        Opts::new(
                            "smolder_aggregator_ingest_quic_batches_rejected_total",
                            "Agent batch streams refused, by reason.",
                        ),
                        &["reason"],
                    )
                    .expect("valid metric"),
                ),
                batch_duration: histogram(
                    &registry,
                    "smolder_aggregator_ingest_quic_batch_duration_seconds",
                    "Time from a batch stream's opening to its acknowledgement, fsync included.",
                    latency,
                ),
            },
            rules: RulesMetrics::new(&registry),
            registry,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub(crate) fn render(&self) -> Result<String, prometheus::Error> {
        TextEncoder::new().encode_to_string(&self.registry.gather())
    }
}

fn register<M: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("metric names are unique");
    metric
}

fn histogram_vec(registry: &Registry, opts: HistogramOpts, labels: &[&str]) -> HistogramVec {
    register(
        registry,
        HistogramVec::new(opts, labels).expect("valid metric"),
    )
}

fn histogram(registry: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    register(
        registry,
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
            .expect("valid metric"),
    )
}

/// The rules' metrics (the counters the rules make are on `/exported-metrics`, not here).
#[derive(Clone)]
pub(crate) struct RulesMetrics {
    /// `smolder_aggregator_rules_loaded`: rules in force, provisioned and API-made.
    pub(crate) rules: IntGauge,
    /// `smolder_aggregator_rules_series`: counter series on `/exported-metrics`.
    pub(crate) series: IntGauge,
    /// `smolder_aggregator_rules_profiles_evaluated_total`.
    pub(crate) profiles_evaluated: IntCounter,
    /// `smolder_aggregator_rules_evaluation_duration_seconds`: one ingest request's profiles.
    pub(crate) evaluation_duration: Histogram,
    /// `smolder_aggregator_rules_increments_dropped_total{reason}`: `stale` (the rule changed
    /// while its profiles were being stored) or `series_limit` (a new label combination past
    /// the per-rule limit).
    pub(crate) increments_dropped: IntCounterVec,
    /// `smolder_aggregator_rules_remote_write_requests_total{outcome}`: `success` or `error`.
    pub(crate) remote_write_requests: IntCounterVec,
    /// `smolder_aggregator_rules_remote_write_samples_total`: samples accepted by the receiver.
    pub(crate) remote_write_samples: IntCounter,
    /// `smolder_aggregator_rules_remote_write_duration_seconds`: one push.
    pub(crate) remote_write_duration: Histogram,
}

impl RulesMetrics {
    fn new(registry: &Registry) -> Self {
        let latency = exponential_buckets(0.000_05, 2.0, 18).expect("valid latency buckets");
        RulesMetrics {
            rules: register(
                registry,
                IntGauge::new("smolder_aggregator_rules_loaded", "Rules in force.")
                    .expect("valid metric"),
            ),
            series: register(
                registry,
                IntGauge::new(
                    "smolder_aggregator_rules_series",
                    "Counter series the rules export on /exported-metrics.",
                )
                .expect("valid metric"),
            ),
            profiles_evaluated: register(
                registry,
                IntCounter::new(
                    "smolder_aggregator_rules_profiles_evaluated_total",
                    "Profiles the rules were evaluated on.",
                )
                .expect("valid metric"),
            ),
            evaluation_duration: histogram(
                registry,
                "smolder_aggregator_rules_evaluation_duration_seconds",
                "Time to evaluate the rules on one ingest request's profiles.",
                latency.clone(),
            ),
            increments_dropped: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "smolder_aggregator_rules_increments_dropped_total",
                        "Counter increments not added, by reason: stale (the rule changed meanwhile) or series_limit.",
                    ),
                    &["reason"],
                )
                .expect("valid metric"),
            ),
            remote_write_requests: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "smolder_aggregator_rules_remote_write_requests_total",
                        "Remote-write pushes of the rules' counters, by outcome.",
                    ),
                    &["outcome"],
                )
                .expect("valid metric"),
            ),
            remote_write_samples: register(
                registry,
                IntCounter::new(
                    "smolder_aggregator_rules_remote_write_samples_total",
                    "Samples the remote-write receiver accepted.",
                )
                .expect("valid metric"),
            ),
            remote_write_duration: histogram(
                registry,
                "smolder_aggregator_rules_remote_write_duration_seconds",
                "Time of one remote-write push.",
                latency,
            ),
        }
    }
}
