//! Every metric the agent exports on `/metrics`, in one catalogue.
//!
//! Names are `smolder_agent_<stage>_<noun>_<unit>`; each long-running loop has its own group.

use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder, exponential_buckets,
};

use crate::spool::queue::Dropped;

/// The agent's metrics and the registry that serves them.
pub struct Metrics {
    registry: Registry,
    /// The window loop's metrics.
    pub window: WindowMetrics,
    /// The rules' metrics.
    pub rules: RulesMetrics,
    /// The spool's metrics.
    pub spool: SpoolMetrics,
    /// The shipper's metrics.
    pub ship: ShipMetrics,
}

/// The spool's metrics (`smolder_agent_spool_*`).
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
    /// Counts a dropped batch.
    pub fn dropped(&self, batch: &Dropped) {
        let reason = [batch.reason.as_str()];
        self.batches_dropped.with_label_values(&reason).inc();
        self.bytes_dropped
            .with_label_values(&reason)
            .inc_by(batch.bytes);
    }
}

/// The shipper's metrics (`smolder_agent_ship_*`).
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
}

/// The window loop's metrics.
#[derive(Clone)]
pub struct WindowMetrics {
    /// `smolder_agent_window_profiles_submitted_total`: profiles sources handed in.
    pub profiles_submitted: IntCounter,
    /// `smolder_agent_window_late_profiles_total`: profiles whose window had already closed,
    /// filed under the open one instead.
    pub late_profiles: IntCounter,
    /// `smolder_agent_window_closed_total`.
    pub windows_closed: IntCounter,
    /// `smolder_agent_window_series`: series in the last closed window.
    pub series: IntGauge,
    /// `smolder_agent_window_nodes`: tree nodes in the last closed window.
    pub nodes: IntGauge,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let registry = Registry::new();
        let window = WindowMetrics {
            profiles_submitted: counter(
                &registry,
                "smolder_agent_window_profiles_submitted_total",
                "Profiles that sources submitted to the window loop.",
            ),
            late_profiles: counter(
                &registry,
                "smolder_agent_window_late_profiles_total",
                "Profiles that arrived after their window closed and went into the open one.",
            ),
            windows_closed: counter(
                &registry,
                "smolder_agent_window_closed_total",
                "Windows closed and handed to the sinks.",
            ),
            series: gauge(
                &registry,
                "smolder_agent_window_series",
                "Series in the last closed window.",
            ),
            nodes: gauge(
                &registry,
                "smolder_agent_window_nodes",
                "Stack tree nodes in the last closed window.",
            ),
        };
        let rules = RulesMetrics::new(&registry);
        let spool = SpoolMetrics {
            bytes: gauge(
                &registry,
                "smolder_agent_spool_bytes",
                "Bytes of batches in the spool, compressed as sent.",
            ),
            batches: gauge(
                &registry,
                "smolder_agent_spool_batches",
                "Batches in the spool, sent or not, waiting for an ack.",
            ),
            oldest_age: register(
                &registry,
                Gauge::new(
                    "smolder_agent_spool_oldest_age_seconds",
                    "How long the oldest batch in the spool has waited.",
                )
                .expect("a valid gauge"),
            ),
            batches_written: counter(
                &registry,
                "smolder_agent_spool_batches_written_total",
                "Batches written to the spool.",
            ),
            bytes_written: counter(
                &registry,
                "smolder_agent_spool_bytes_written_total",
                "Bytes of batches written to the spool.",
            ),
            batches_dropped: register(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "smolder_agent_spool_batches_dropped_total",
                        "Batches that left the spool without an ack, by reason: full, expired, rejected.",
                    ),
                    &["reason"],
                )
                .expect("a valid counter"),
            ),
            bytes_dropped: register(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "smolder_agent_spool_bytes_dropped_total",
                        "Bytes of batches that left the spool without an ack, by reason.",
                    ),
                    &["reason"],
                )
                .expect("a valid counter"),
            ),
        };
        let ship = ShipMetrics {
            batches_sent: counter(
                &registry,
                "smolder_agent_ship_batches_sent_total",
                "Batch streams opened to the aggregator, resends included.",
            ),
            bytes_sent: counter(
                &registry,
                "smolder_agent_ship_bytes_sent_total",
                "Bytes of batches sent to the aggregator.",
            ),
            batches_acked: counter(
                &registry,
                "smolder_agent_ship_batches_acked_total",
                "Batches the aggregator acknowledged as durable.",
            ),
            batches_rejected: register(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "smolder_agent_ship_batches_rejected_total",
                        "Batches the aggregator refused, by whether a retry can help.",
                    ),
                    &["retryable"],
                )
                .expect("a valid counter"),
            ),
            batches_failed: counter(
                &registry,
                "smolder_agent_ship_batches_failed_total",
                "Batches sent without an answer (connection lost, ack timeout); sent again.",
            ),
            reconnects: counter(
                &registry,
                "smolder_agent_ship_reconnects_total",
                "Connection attempts to the aggregator after a failure.",
            ),
            connected: gauge(
                &registry,
                "smolder_agent_ship_connected",
                "1 while connected to the aggregator.",
            ),
            rtt: register(
                &registry,
                Gauge::new(
                    "smolder_agent_ship_rtt_seconds",
                    "Smoothed QUIC round-trip time to the aggregator.",
                )
                .expect("a valid gauge"),
            ),
            ack_duration: register(
                &registry,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "smolder_agent_ship_ack_duration_seconds",
                        "Time from opening a batch's stream to its ack.",
                    )
                    .buckets(exponential_buckets(0.000_5, 2.0, 16).expect("valid buckets")),
                )
                .expect("a valid histogram"),
            ),
        };
        Metrics {
            registry,
            window,
            rules,
            spool,
            ship,
        }
    }

    /// The registry, for stages that register their own metrics.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Every metric in Prometheus' text format.
    ///
    /// # Errors
    ///
    /// When a metric cannot be encoded.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        TextEncoder::new().encode_to_string(&self.registry.gather())
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Creates and registers a counter.
pub fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let counter = IntCounter::with_opts(Opts::new(name, help)).expect("a valid counter");
    registry
        .register(Box::new(counter.clone()))
        .expect("a metric name registered once");
    counter
}

/// Registers any metric.
fn register<M: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("a metric name registered once");
    metric
}

/// Creates and registers a gauge.
pub fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let gauge = IntGauge::with_opts(Opts::new(name, help)).expect("a valid gauge");
    registry
        .register(Box::new(gauge.clone()))
        .expect("a metric name registered once");
    gauge
}

/// The rules' metrics (the counters the rules make are on `/exported-metrics`, not here).
#[derive(Clone)]
pub struct RulesMetrics {
    /// `smolder_agent_rules_loaded`: rules in force.
    pub rules: IntGauge,
    /// `smolder_agent_rules_series`: counter series on `/exported-metrics`.
    pub series: IntGauge,
    /// `smolder_agent_rules_windows_evaluated_total`.
    pub windows_evaluated: IntCounter,
    /// `smolder_agent_rules_increments_dropped_total`: increments for a new label combination
    /// past the per-rule series limit.
    pub increments_dropped: IntCounter,
    /// `smolder_agent_rules_evaluation_duration_seconds`: one window.
    pub evaluation_duration: Histogram,
}

impl RulesMetrics {
    fn new(registry: &Registry) -> Self {
        let evaluation_duration = Histogram::with_opts(
            HistogramOpts::new(
                "smolder_agent_rules_evaluation_duration_seconds",
                "Time to evaluate the rules on one window.",
            )
            .buckets(exponential_buckets(0.000_05, 2.0, 18).expect("valid buckets")),
        )
        .expect("a valid histogram");
        registry
            .register(Box::new(evaluation_duration.clone()))
            .expect("a metric name registered once");
        RulesMetrics {
            rules: gauge(registry, "smolder_agent_rules_loaded", "Rules in force."),
            series: gauge(
                registry,
                "smolder_agent_rules_series",
                "Counter series the rules export on /exported-metrics.",
            ),
            windows_evaluated: counter(
                registry,
                "smolder_agent_rules_windows_evaluated_total",
                "Windows the rules were evaluated on.",
            ),
            increments_dropped: counter(
                registry,
                "smolder_agent_rules_increments_dropped_total",
                "Counter increments not added: a new label combination past the per-rule limit.",
            ),
            evaluation_duration,
        }
    }
}
