//! Every metric the agent exports on `/metrics`, in one catalogue.
//!
//! Names are `smolder_agent_<stage>_<noun>_<unit>`; each long-running loop has its own group.

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntGauge, Opts, Registry, TextEncoder,
    exponential_buckets,
};

/// The agent's metrics and the registry that serves them.
pub struct Metrics {
    registry: Registry,
    /// The window loop's metrics.
    pub window: WindowMetrics,
    /// The rules' metrics.
    pub rules: RulesMetrics,
}

/// The window loop's metrics.
#[derive(Clone)]
pub struct WindowMetrics {
    /// `smolder_agent_window_profiles_submitted_total`: profiles sources handed in.
    pub profiles_submitted: IntCounter,
    /// `smolder_agent_window_late_profiles_total`: profiles whose window had already closed,
    /// filed under the open one instead.
    pub late_profiles: IntCounter,
    /// `smolder_agent_windows_closed_total`.
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
                "smolder_agent_windows_closed_total",
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
        Metrics {
            registry,
            window,
            rules,
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
