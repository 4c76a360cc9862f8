//! The aggregator's metrics registry, the errors and dropped counters every stage shares, and
//! the helpers the stages register their own metrics with.
//!
//! Each stage defines its metrics in its own `metrics` module (`store/metrics.rs`,
//! `ingest/metrics.rs`, `ingest/quic/metrics.rs`, `query/metrics.rs`, `rules/metrics.rs`; the
//! request metrics in `http.rs`), registered here by `app` at start. Names follow
//! `smolder_aggregator_<stage>_<noun>_<unit>[_total]`; the request and ingest metrics that
//! Pyroscope's dashboards and recording rules read keep Pyroscope's names and labels
//! (`pyroscope_request_duration_seconds`, `pyroscope_distributor_received_*`).
//!
//! A leaf: it depends on no other module of the crate.

use prometheus::core::Collector;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};
use smolder_daemon::Health;

/// The registry `/metrics` serves, with the tier's errors and dropped counters.
pub(crate) struct Metrics {
    registry: Registry,
    /// `smolder_aggregator_errors_total{stage,error_type}`.
    pub(crate) errors: Errors,
    /// `smolder_aggregator_dropped_increments_total{stage,reason,intentional}`: rules' counter
    /// increments, the one thing the aggregator drops today.
    pub(crate) dropped_increments: Dropped,
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
        let dropped_increments = Dropped(counter_vec(
            &registry,
            "smolder_aggregator_dropped_increments_total",
            "Rule counter increments a stage discarded, by stage and reason; intentional=\"true\" when by design or configuration.",
            &["stage", "reason", "intentional"],
        ));
        Metrics {
            health: Health::new("aggregator", &registry),
            registry,
            errors,
            dropped_increments,
        }
    }

    /// The registry the stages register their metrics in.
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The Prometheus text exposition of every metric.
    pub(crate) fn render(&self) -> Result<String, prometheus::Error> {
        TextEncoder::new().encode_to_string(&self.registry.gather())
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

/// A dropped counter, `smolder_aggregator_dropped_<unit>_total{stage,reason,intentional}`: what
/// a stage discards instead of passing it on, one counter per unit across the tier, as the
/// agent's. Retried work is never dropped.
#[derive(Clone)]
pub(crate) struct Dropped(IntCounterVec);

impl Dropped {
    /// Counts `count` items `stage` dropped for `reason`; `intentional` when by design or
    /// configuration rather than a limit or a failure.
    pub(crate) fn add(&self, stage: &str, reason: &str, intentional: bool, count: u64) {
        let intentional = if intentional { "true" } else { "false" };
        self.0
            .with_label_values(&[stage, reason, intentional])
            .inc_by(count);
    }
}

/// Registers `metric` and returns it.
///
/// # Panics
///
/// When a metric of the same name is registered already: names are fixed in the code, so that
/// is a bug.
pub(crate) fn register<M: Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("metric names are unique");
    metric
}

/// A registered counter.
pub(crate) fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    register(registry, IntCounter::new(name, help).expect("valid metric"))
}

/// A registered counter with labels.
pub(crate) fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntCounterVec {
    register(
        registry,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

/// A registered gauge.
pub(crate) fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    register(registry, IntGauge::new(name, help).expect("valid metric"))
}

/// A registered histogram.
pub(crate) fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: Vec<f64>,
) -> Histogram {
    register(
        registry,
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
            .expect("valid metric"),
    )
}

/// A registered histogram with labels.
pub(crate) fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: Vec<f64>,
    labels: &[&str],
) -> HistogramVec {
    register(
        registry,
        HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
            .expect("valid metric"),
    )
}

/// Latency buckets from 0.5 ms to 16 s, doubling: requests, writes, fsyncs.
pub(crate) fn latency_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(0.000_5, 2.0, 16).expect("valid latency buckets")
}
