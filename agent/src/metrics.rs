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

/// The pprof scraper's metrics (`scrape-configs`), per job. Labels are bounded: `job` and
/// `profile` come from the config, `reason` and `mechanism` from fixed lists.
#[derive(Clone)]
pub struct ScrapeMetrics {
    /// `smolder_agent_scrape_duration_seconds{job,profile}`: request to profiles submitted.
    pub duration: prometheus::HistogramVec,
    /// `smolder_agent_scrape_scrapes_total{job,profile}`: scrapes attempted.
    pub scrapes: prometheus::IntCounterVec,
    /// `smolder_agent_scrape_failures_total{job,profile,reason}`: failed scrapes, by `timeout`,
    /// `connect`, `redirects`, `request`, `status`, `too_large`, `credentials`, `decode`.
    pub failures: prometheus::IntCounterVec,
    /// `smolder_agent_scrape_body_bytes_total{job,profile}`: response bytes, as sent.
    pub body_bytes: prometheus::IntCounterVec,
    /// `smolder_agent_scrape_samples_total{job,profile}`: pprof samples in scraped profiles.
    pub samples: prometheus::IntCounterVec,
    /// `smolder_agent_scrape_profiles_submitted_total{job,profile}`: series profiles handed
    /// to the window, after deltas.
    pub profiles_submitted: prometheus::IntCounterVec,
    /// `smolder_agent_scrape_counter_resets_total{job,profile}`: cumulative series whose total
    /// went down (the target restarted), primed again.
    pub counter_resets: prometheus::IntCounterVec,
    /// `smolder_agent_scrape_targets{job,health}`: targets by health (`up`, `down`,
    /// `unknown`).
    pub targets: prometheus::IntGaugeVec,
    /// `smolder_agent_scrape_targets_dropped{job}`: discovered label sets not scraped.
    pub targets_dropped: prometheus::IntGaugeVec,
    /// `smolder_agent_scrape_discovery_refreshes_total{job,mechanism}`: documents read.
    pub discovery_refreshes: prometheus::IntCounterVec,
    /// `smolder_agent_scrape_discovery_failures_total{job,mechanism}`: documents refused.
    pub discovery_failures: prometheus::IntCounterVec,
}

impl ScrapeMetrics {
    /// Creates the scraper's metrics in `registry`.
    pub fn new(registry: &Registry) -> Self {
        let counters = |name: &str, help: &str, labels: &[&str]| {
            let vec = prometheus::IntCounterVec::new(Opts::new(name, help), labels)
                .expect("a valid counter");
            registry
                .register(Box::new(vec.clone()))
                .expect("a metric name registered once");
            vec
        };
        let gauges = |name: &str, help: &str, labels: &[&str]| {
            let vec =
                prometheus::IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid gauge");
            registry
                .register(Box::new(vec.clone()))
                .expect("a metric name registered once");
            vec
        };
        let duration = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new(
                "smolder_agent_scrape_duration_seconds",
                "Time from a scrape's request to its profiles being submitted.",
            )
            .buckets(vec![
                0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0,
            ]),
            &["job", "profile"],
        )
        .expect("a valid histogram");
        registry
            .register(Box::new(duration.clone()))
            .expect("a metric name registered once");
        ScrapeMetrics {
            duration,
            scrapes: counters(
                "smolder_agent_scrape_scrapes_total",
                "Scrapes attempted.",
                &["job", "profile"],
            ),
            failures: counters(
                "smolder_agent_scrape_failures_total",
                "Scrapes that failed, by reason.",
                &["job", "profile", "reason"],
            ),
            body_bytes: counters(
                "smolder_agent_scrape_body_bytes_total",
                "Response body bytes read from targets, as sent.",
                &["job", "profile"],
            ),
            samples: counters(
                "smolder_agent_scrape_samples_total",
                "pprof samples in the profiles scraped.",
                &["job", "profile"],
            ),
            profiles_submitted: counters(
                "smolder_agent_scrape_profiles_submitted_total",
                "Series profiles submitted to the window loop, after deltas.",
                &["job", "profile"],
            ),
            counter_resets: counters(
                "smolder_agent_scrape_counter_resets_total",
                "Cumulative series whose total went down (the target restarted).",
                &["job", "profile"],
            ),
            targets: gauges(
                "smolder_agent_scrape_targets",
                "Targets being scraped, by health of their last scrape.",
                &["job", "health"],
            ),
            targets_dropped: gauges(
                "smolder_agent_scrape_targets_dropped",
                "Discovered targets not scraped (relabelled away or invalid).",
                &["job"],
            ),
            discovery_refreshes: counters(
                "smolder_agent_scrape_discovery_refreshes_total",
                "Discovery documents read.",
                &["job", "mechanism"],
            ),
            discovery_failures: counters(
                "smolder_agent_scrape_discovery_failures_total",
                "Discovery documents refused; the previous targets were kept.",
                &["job", "mechanism"],
            ),
        }
    }

    /// Counts a discovery document read by `mechanism` (`file`, `http`).
    pub fn discovery_refresh(&self, job: &str, mechanism: &str) {
        self.discovery_refreshes
            .with_label_values(&[job, mechanism])
            .inc();
    }

    /// Counts a discovery document refused.
    pub fn discovery_failure(&self, job: &str, mechanism: &str) {
        self.discovery_failures
            .with_label_values(&[job, mechanism])
            .inc();
    }
}
