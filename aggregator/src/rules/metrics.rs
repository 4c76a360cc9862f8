//! The rules' metrics, `smolder_aggregator_rules_*` (the counters the rules make are on
//! `/exported-metrics`, not here). Increments the rules cannot add are counted in the tier's
//! `smolder_aggregator_dropped_increments_total{stage="rules"}`.

use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge, Registry};
use smolder_daemon::metrics::{counter, counter_vec, gauge, histogram};

use crate::metrics::Dropped;

/// The rules' metrics.
#[derive(Clone)]
pub(crate) struct RulesMetrics {
    /// `smolder_aggregator_rules_loaded`: rules in force, provisioned and API-made, summed over
    /// the tenants seen since start.
    pub(crate) rules: IntGauge,
    /// `smolder_aggregator_rules_series`: counter series on `/exported-metrics`, summed over
    /// tenants.
    pub(crate) series: IntGauge,
    /// `smolder_aggregator_rules_profiles_evaluated_total`.
    pub(crate) profiles_evaluated: IntCounter,
    /// `smolder_aggregator_rules_evaluation_duration_seconds`: one ingest request's profiles.
    pub(crate) evaluation_duration: Histogram,
    /// `smolder_aggregator_dropped_increments_total{stage="rules",reason,intentional}`: not
    /// added: `stale` (the rule changed while its profiles were being stored; intentional) or
    /// `series_limit` (a new label combination past the per-rule limit).
    pub(crate) dropped: Dropped,
    /// `smolder_aggregator_rules_remote_write_requests_total{outcome}`: `success` or `error`.
    pub(crate) remote_write_requests: IntCounterVec,
    /// `smolder_aggregator_rules_remote_write_samples_total`: samples accepted by the receiver.
    pub(crate) remote_write_samples: IntCounter,
    /// `smolder_aggregator_rules_remote_write_duration_seconds`: one push.
    pub(crate) remote_write_duration: Histogram,
    /// `smolder_aggregator_rules_reloads_total`: a tenant's rules replaced by those changed
    /// through other aggregators on the bucket (object-storage mode).
    pub(crate) reloads: IntCounter,
}

impl RulesMetrics {
    /// Creates the rules' metrics in `registry`; drops go to the tier's `dropped` increments.
    pub(crate) fn new(registry: &Registry, dropped: Dropped) -> Self {
        let latency =
            prometheus::exponential_buckets(0.000_05, 2.0, 18).expect("valid latency buckets");
        RulesMetrics {
            rules: gauge(
                registry,
                "smolder_aggregator_rules_loaded",
                "Rules in force, summed over tenants.",
            ),
            series: gauge(
                registry,
                "smolder_aggregator_rules_series",
                "Counter series the rules export on /exported-metrics.",
            ),
            profiles_evaluated: counter(
                registry,
                "smolder_aggregator_rules_profiles_evaluated_total",
                "Profiles the rules were evaluated on.",
            ),
            evaluation_duration: histogram(
                registry,
                "smolder_aggregator_rules_evaluation_duration_seconds",
                "Time to evaluate the rules on one ingest request's profiles.",
                latency.clone(),
            ),
            dropped,
            remote_write_requests: counter_vec(
                registry,
                "smolder_aggregator_rules_remote_write_requests_total",
                "Remote-write pushes of the rules' counters, by outcome.",
                &["outcome"],
            ),
            remote_write_samples: counter(
                registry,
                "smolder_aggregator_rules_remote_write_samples_total",
                "Samples the remote-write receiver accepted.",
            ),
            remote_write_duration: histogram(
                registry,
                "smolder_aggregator_rules_remote_write_duration_seconds",
                "Time of one remote-write push.",
                latency,
            ),
            reloads: counter(
                registry,
                "smolder_aggregator_rules_reloads_total",
                "A tenant's rules replaced by those changed through other aggregators on the bucket.",
            ),
        }
    }
}
