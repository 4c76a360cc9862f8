//! The rules' own metrics (`smolder_agent_rules_*`), updated once per window evaluated. The
//! counters the rules make are on `/exported-metrics`, not here.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Registry, exponential_buckets};

use crate::metrics::{counter, gauge, register};

/// The rules' metrics.
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
    /// Creates the rules' metrics in `registry`.
    pub(crate) fn new(registry: &Registry) -> Self {
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
            evaluation_duration: register(
                registry,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "smolder_agent_rules_evaluation_duration_seconds",
                        "Time to evaluate the rules on one window.",
                    )
                    .buckets(exponential_buckets(0.000_05, 2.0, 18).expect("valid buckets")),
                )
                .expect("a valid histogram"),
            ),
        }
    }
}
