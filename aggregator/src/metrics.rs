//! The aggregator's metrics registry, the errors and dropped counters every stage shares, and
//! the helpers the stages register their own metrics with.
//!
//! Each stage defines its metrics in its own `metrics` module (`store/metrics.rs`,
//! `ingest/metrics.rs`, `ingest/quic/metrics.rs`, `query/metrics.rs`, `rules/metrics.rs`; the
//! request metrics in `http.rs`) with `smolder_daemon::metrics`' helpers, registered in this
//! registry by `app` at start. Names follow
//! `smolder_aggregator_<stage>_<noun>_<unit>[_total]`; the request and ingest metrics that
//! Pyroscope's dashboards and recording rules read keep Pyroscope's names and labels
//! (`pyroscope_request_duration_seconds`, `pyroscope_distributor_received_*`).
//!
//! A leaf: it depends on no other module of the crate.

use prometheus::{IntCounter, IntCounterVec, Registry};
use smolder_daemon::Health;
use smolder_daemon::metrics::counter_vec;

/// The registry `/metrics` serves, with the tier's errors and dropped counters.
pub(crate) struct Metrics {
    registry: Registry,
    /// `smolder_aggregator_errors_total{stage,error_type}`.
    pub(crate) errors: Errors,
    /// `smolder_aggregator_dropped_increments_total{stage,reason,intentional}`: rules' counter
    /// increments.
    pub(crate) dropped_increments: Dropped,
    /// `smolder_aggregator_dropped_series_total{stage,reason,intentional}`: series of ingest
    /// requests and agent batches refused one by one while the others were stored (or with
    /// them, when none was left).
    pub(crate) dropped_series: Dropped,
    /// `smolder_aggregator_refused_total{stage,reason}`: requests, agent batches and
    /// connections turned away by admission control, the query limits or authentication.
    pub(crate) refused: Refused,
    /// The loops' heartbeats (`smolder_aggregator_health_*`), which `/healthz`, `/readyz` and
    /// the watchdog pings read.
    pub(crate) health: Health,
}

impl Metrics {
    /// A registry holding the tier's counters; stages add theirs with [`Metrics::registry`].
    pub(crate) fn new() -> Self {
        let registry = Registry::new();
        let errors = Errors(counter_vec(
            &registry,
            "smolder_aggregator_errors_total",
            "Failures, by stage and kind; client mistakes included.",
            &["stage", "error_type"],
        ));
        let dropped_increments = Dropped::register(
            &registry,
            "smolder_aggregator_dropped_increments_total",
            "Rule counter increments",
        );
        let dropped_series = Dropped::register(
            &registry,
            "smolder_aggregator_dropped_series_total",
            "Series of ingest requests and agent batches refused one by one",
        );
        let refused = Refused(counter_vec(
            &registry,
            "smolder_aggregator_refused_total",
            "Requests, agent batches and connections refused by admission control, the query limits or authentication, by stage and reason; clients may retry those refused for load.",
            &["stage", "reason"],
        ));
        Metrics {
            health: Health::new("aggregator", &registry),
            registry,
            errors,
            dropped_increments,
            dropped_series,
            refused,
        }
    }

    /// The registry the stages register their metrics in.
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The Prometheus text exposition of every metric.
    pub(crate) fn render(&self) -> Result<String, prometheus::Error> {
        smolder_daemon::metrics::render(&self.registry)
    }
}

/// `smolder_aggregator_errors_total{stage,error_type}`: one counter for every failure of the
/// tier. `stage` is the module that handled it, `error_type` a bounded name of the kind.
#[derive(Clone)]
pub(crate) struct Errors(IntCounterVec);

impl Errors {
    /// Counts one failure of `stage` of kind `error_type`.
    pub(crate) fn inc(&self, stage: &str, error_type: &str) {
        self.0.with_label_values(&[stage, error_type]).inc();
    }
}

/// `smolder_aggregator_refused_total{stage,reason}`: one counter for everything the tier turns
/// away at its door rather than fails at: `stage` is where (`http`, `quic`, `query`, `auth`),
/// `reason` a bounded name of the limit or the credential problem. Work refused here was never
/// accepted, so it is neither dropped nor lost: a client may send it again.
#[derive(Clone)]
pub(crate) struct Refused(IntCounterVec);

impl Refused {
    /// Counts one refusal by `stage` for `reason`.
    pub(crate) fn inc(&self, stage: &str, reason: &str) {
        self.0.with_label_values(&[stage, reason]).inc();
    }

    /// The counter of one (`stage`, `reason`), for a hot path to keep.
    pub(crate) fn counter(&self, stage: &str, reason: &str) -> IntCounter {
        self.0.with_label_values(&[stage, reason])
    }
}

/// A dropped counter, `smolder_aggregator_dropped_<unit>_total{stage,reason,intentional}`: what
/// a stage discards instead of passing it on, one counter per unit across the tier, as the
/// agent's. Retried work is never dropped.
#[derive(Clone)]
pub(crate) struct Dropped(IntCounterVec);

impl Dropped {
    /// Registers the counter `name` (`smolder_aggregator_dropped_<unit>_total`, spelled out so
    /// that the catalogue and the dashboards' check find it) in `registry`; `what` names the
    /// items in its help.
    pub(crate) fn register(registry: &Registry, name: &str, what: &str) -> Dropped {
        Dropped(counter_vec(
            registry,
            name,
            &format!(
                "{what} a stage discarded, by stage and reason; intentional=\"true\" when by design or configuration."
            ),
            &["stage", "reason", "intentional"],
        ))
    }

    /// Counts `count` items `stage` dropped for `reason`; `intentional` when by design or
    /// configuration rather than a limit or a failure.
    pub(crate) fn add(&self, stage: &str, reason: &str, intentional: bool, count: u64) {
        let intentional = if intentional { "true" } else { "false" };
        self.0
            .with_label_values(&[stage, reason, intentional])
            .inc_by(count);
    }
}
