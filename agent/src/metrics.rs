//! Every metric the agent exports on `/metrics`, in one catalogue.
//!
//! Names are `smolder_agent_<stage>_<noun>_<unit>`; each long-running loop has its own group.

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

/// The agent's metrics and the registry that serves them.
pub struct Metrics {
    registry: Registry,
    /// The window loop's metrics.
    pub window: WindowMetrics,
    /// The eBPF CPU sampler's metrics.
    pub ebpf: EbpfMetrics,
    /// The symbolizer's metrics.
    pub symbolize: SymbolizeMetrics,
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
        let ebpf = EbpfMetrics::new(&registry);
        let symbolize = SymbolizeMetrics::new(&registry);
        Metrics {
            registry,
            window,
            ebpf,
            symbolize,
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
