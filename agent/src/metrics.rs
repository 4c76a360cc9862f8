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
    /// The eBPF CPU sampler's metrics.
    pub ebpf: EbpfMetrics,
    /// The symbolizer's metrics.
    pub symbolize: SymbolizeMetrics,
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
        let ebpf = EbpfMetrics::new(&registry);
        let symbolize = SymbolizeMetrics::new(&registry);
        Metrics {
            registry,
            window,
            ebpf,
            symbolize,
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

/// The eBPF CPU sampler's metrics (the `smolder-ebpf` thread), updated once per drain.
#[derive(Clone)]
pub struct EbpfMetrics {
    /// `smolder_agent_ebpf_samples_total`: samples drained from the kernel, before relabelling.
    pub samples: IntCounter,
    /// `smolder_agent_ebpf_dropped_samples_total{reason,intentional}`: samples not profiled:
    /// `counts_map_full` (raise `ebpf.counts-map-entries`), `relabel` (a rule dropped the
    /// process, intentional), `unknown_process` (it exited before the agent could read it).
    pub dropped_samples: IntCounterVec,
    /// `smolder_agent_ebpf_stack_errors_total{stack,reason}`: samples kept without their `user`
    /// or `kernel` stack, because its stack-map slot was taken (`collision`; raise
    /// `ebpf.stack-map-entries`) or the helper failed (`failed`).
    pub stack_errors: IntCounterVec,
    /// `smolder_agent_ebpf_lost_events_total`: process events lost to a full ring buffer.
    pub lost_events: IntCounter,
    /// `smolder_agent_ebpf_drains_total`.
    pub drains: IntCounter,
    /// `smolder_agent_ebpf_drain_duration_seconds`: reading and emptying the maps.
    pub drain_duration: Histogram,
    /// `smolder_agent_ebpf_processes`: processes the sampler tracks (alive or in their exit
    /// grace period).
    pub processes: IntGauge,
    /// `smolder_agent_ebpf_series`: series submitted by the last drain.
    pub series: IntGauge,
    /// `smolder_agent_ebpf_errors_total{error_type}`: drains or reads that failed.
    pub errors: IntCounterVec,
}

impl EbpfMetrics {
    fn new(registry: &Registry) -> Self {
        EbpfMetrics {
            samples: counter(
                registry,
                "smolder_agent_ebpf_samples_total",
                "CPU samples drained from the kernel, before relabelling.",
            ),
            dropped_samples: counter_vec(
                registry,
                "smolder_agent_ebpf_dropped_samples_total",
                "CPU samples not profiled, by reason; intentional=true when configured so.",
                &["reason", "intentional"],
            ),
            stack_errors: counter_vec(
                registry,
                "smolder_agent_ebpf_stack_errors_total",
                "CPU samples kept without their user or kernel stack, by stack and reason.",
                &["stack", "reason"],
            ),
            lost_events: counter(
                registry,
                "smolder_agent_ebpf_lost_events_total",
                "Process events (first sample, exec, exit) lost to a full ring buffer.",
            ),
            drains: counter(
                registry,
                "smolder_agent_ebpf_drains_total",
                "Drains of the kernel sample maps.",
            ),
            drain_duration: histogram(
                registry,
                "smolder_agent_ebpf_drain_duration_seconds",
                "Time to switch buffers, read and empty the kernel sample maps.",
            ),
            processes: gauge(
                registry,
                "smolder_agent_ebpf_processes",
                "Processes tracked by the sampler, alive or in their exit grace period.",
            ),
            series: gauge(
                registry,
                "smolder_agent_ebpf_series",
                "Series submitted by the last drain.",
            ),
            errors: counter_vec(
                registry,
                "smolder_agent_ebpf_errors_total",
                "Failed drains and map reads of the eBPF sampler, by error type.",
                &["error_type"],
            ),
        }
    }
}

/// The symbolizer's metrics (the `smolder-symbolize` thread).
#[derive(Clone)]
pub struct SymbolizeMetrics {
    /// `smolder_agent_symbolize_frames_resolved_total`: addresses resolved to a name.
    pub frames_resolved: IntCounter,
    /// `smolder_agent_symbolize_frames_unresolved_total`: addresses left as `module+0xoffset`.
    pub frames_unresolved: IntCounter,
    /// `smolder_agent_symbolize_truncated_stacks_total`: samples whose user stack does not reach
    /// a thread entry point, because code without frame pointers cut the unwinding short.
    pub truncated_stacks: IntCounter,
    /// `smolder_agent_symbolize_captures_total`: process memory maps captured.
    pub captures: IntCounter,
    /// `smolder_agent_symbolize_capture_failures_total`: processes gone before capture.
    pub capture_failures: IntCounter,
    /// `smolder_agent_symbolize_files_evicted_total`: binaries closed to stay within
    /// `symbolize.max-open-files`.
    pub files_evicted: IntCounter,
    /// `smolder_agent_symbolize_processes`: process maps held.
    pub processes: IntGauge,
    /// `smolder_agent_symbolize_open_files`: binaries held open.
    pub open_files: IntGauge,
    /// `smolder_agent_symbolize_cached_frames`: resolved frames cached.
    pub cached_frames: IntGauge,
    /// `smolder_agent_symbolize_duration_seconds`: symbolizing one drain.
    pub duration: Histogram,
}

impl SymbolizeMetrics {
    fn new(registry: &Registry) -> Self {
        SymbolizeMetrics {
            frames_resolved: counter(
                registry,
                "smolder_agent_symbolize_frames_resolved_total",
                "Distinct addresses resolved to a function name.",
            ),
            frames_unresolved: counter(
                registry,
                "smolder_agent_symbolize_frames_unresolved_total",
                "Distinct addresses no symbol was found for (shown as module+0xoffset).",
            ),
            truncated_stacks: counter(
                registry,
                "smolder_agent_symbolize_truncated_stacks_total",
                "Samples whose user stack stops before a thread entry point (code without frame pointers).",
            ),
            captures: counter(
                registry,
                "smolder_agent_symbolize_captures_total",
                "Process memory maps captured at first sight or after an exec.",
            ),
            capture_failures: counter(
                registry,
                "smolder_agent_symbolize_capture_failures_total",
                "Processes that exited before their memory map could be captured.",
            ),
            files_evicted: counter(
                registry,
                "smolder_agent_symbolize_files_evicted_total",
                "Binaries closed to stay within symbolize.max-open-files.",
            ),
            processes: gauge(
                registry,
                "smolder_agent_symbolize_processes",
                "Process memory maps held by the symbolizer.",
            ),
            open_files: gauge(
                registry,
                "smolder_agent_symbolize_open_files",
                "Binaries held open by the symbolizer.",
            ),
            cached_frames: gauge(
                registry,
                "smolder_agent_symbolize_cached_frames",
                "Resolved frames in the symbolizer's cache.",
            ),
            duration: histogram(
                registry,
                "smolder_agent_symbolize_duration_seconds",
                "Time to symbolize one drain's samples.",
            ),
        }
    }
}

/// Creates and registers a counter with labels.
pub fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let counter = IntCounterVec::new(Opts::new(name, help), labels).expect("a valid counter");
    registry
        .register(Box::new(counter.clone()))
        .expect("a metric name registered once");
    counter
}

/// Creates and registers a histogram of durations in seconds (1 ms to about 16 s).
pub fn histogram(registry: &Registry, name: &str, help: &str) -> Histogram {
    let buckets = prometheus::exponential_buckets(0.001, 2.0, 15).expect("valid buckets");
    let histogram = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
        .expect("a valid histogram");
    registry
        .register(Box::new(histogram.clone()))
        .expect("a metric name registered once");
    histogram
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
