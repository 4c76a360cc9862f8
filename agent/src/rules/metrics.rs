//! The rules' own metrics (`smolder_agent_rules_*`), updated once per window evaluated. The
//! counters the rules make are on `/exported-metrics`, not here.

use prometheus::{Histogram, IntCounter, IntGauge, Registry};
use smolder_daemon::metrics::{counter, doubling_buckets, gauge, histogram};

use crate::tier::{DropCause, DroppedUnit, StageCounters, TierCounters};

/// Increments for a new label combination past the per-rule series limit.
pub(crate) const SERIES_LIMIT: DropCause = DropCause::forced("series_limit");

/// The rules' metrics.
#[derive(Clone)]
pub struct RulesMetrics {
    /// `smolder_agent_rules_loaded`: rules in force.
    pub rules: IntGauge,
    /// `smolder_agent_rules_series`: counter series on `/exported-metrics`.
    pub series: IntGauge,
    /// `smolder_agent_rules_windows_evaluated_total`.
    pub windows_evaluated: IntCounter,
    /// `smolder_agent_rules_evaluation_duration_seconds`: one window.
    pub evaluation_duration: Histogram,
    /// `smolder_agent_errors_total{stage="rules",error_type="panic"}`: windows whose evaluation
    /// panicked; `smolder_agent_dropped_increments_total{stage="rules",reason="series_limit"}`:
    /// increments for a new label combination past the per-rule series limit.
    pub tier: StageCounters,
}

impl RulesMetrics {
    /// Creates the rules' metrics in `registry`.
    pub(crate) fn new(registry: &Registry, tier: &TierCounters) -> Self {
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
            evaluation_duration: histogram(
                registry,
                "smolder_agent_rules_evaluation_duration_seconds",
                "Time to evaluate the rules on one window.",
                doubling_buckets(0.000_05, 18),
            ),
            tier: tier.stage(
                "rules",
                &["panic"],
                &[(DroppedUnit::Increments, SERIES_LIMIT)],
            ),
        }
    }
}
