//! How both daemons' stages create their metrics: each helper makes one metric and registers
//! it in the daemon's registry, and [`render`] writes the registry as `/metrics` serves it.
//!
//! Input: a [`Registry`], a name and help text (names and the stages they belong to are each
//! daemon's own catalogue). Output: the registered metric, a handle the stage keeps. Owns
//! nothing.

use prometheus::core::Collector;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// Registers `metric` and returns it.
///
/// # Panics
///
/// When a metric of the same name is registered already: names are fixed in the code, so that
/// is a bug.
pub fn register<M: Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("a metric name registered once");
    metric
}

/// A registered counter.
///
/// # Panics
///
/// When the name is invalid or registered already (a bug).
pub fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    register(
        registry,
        IntCounter::with_opts(Opts::new(name, help)).expect("a valid counter"),
    )
}

/// A registered counter with labels.
///
/// # Panics
///
/// When the name or a label is invalid, or the name is registered already (a bug).
pub fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        registry,
        IntCounterVec::new(Opts::new(name, help), labels).expect("a valid counter"),
    )
}

/// A registered gauge.
///
/// # Panics
///
/// When the name is invalid or registered already (a bug).
pub fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    register(
        registry,
        IntGauge::with_opts(Opts::new(name, help)).expect("a valid gauge"),
    )
}

/// A registered histogram with these bucket bounds.
///
/// # Panics
///
/// When the name or the buckets are invalid, or the name is registered already (a bug).
pub fn histogram(registry: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    register(
        registry,
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
            .expect("a valid histogram"),
    )
}

/// A registered histogram with labels and these bucket bounds.
///
/// # Panics
///
/// When the name, a label or the buckets are invalid, or the name is registered already (a
/// bug).
pub fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: Vec<f64>,
    labels: &[&str],
) -> HistogramVec {
    register(
        registry,
        HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
            .expect("a valid histogram"),
    )
}

/// `count` bucket bounds from `first`, each twice the one before.
///
/// # Panics
///
/// When `first` is not positive or `count` is 0 (a bug: bounds are fixed in the code).
pub fn doubling_buckets(first: f64, count: usize) -> Vec<f64> {
    prometheus::exponential_buckets(first, 2.0, count).expect("valid buckets")
}

/// Latency buckets from 0.5 ms to about 16 s, doubling: requests, writes, fsyncs, sends.
pub fn latency_buckets() -> Vec<f64> {
    doubling_buckets(0.000_5, 16)
}

/// Every metric of `registry` in Prometheus' text format.
///
/// # Errors
///
/// When a metric cannot be encoded.
pub fn render(registry: &Registry) -> Result<String, prometheus::Error> {
    TextEncoder::new().encode_to_string(&registry.gather())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_register_what_render_prints() {
        let registry = Registry::new();
        counter(&registry, "smolder_test_a_total", "A.").inc();
        counter_vec(&registry, "smolder_test_b_total", "B.", &["stage"])
            .with_label_values(&["x"])
            .inc_by(2);
        gauge(&registry, "smolder_test_c", "C.").set(3);
        histogram(&registry, "smolder_test_d_seconds", "D.", latency_buckets()).observe(0.001);
        histogram_vec(
            &registry,
            "smolder_test_e_seconds",
            "E.",
            doubling_buckets(0.001, 15),
            &["route"],
        )
        .with_label_values(&["r"])
        .observe(1.0);
        let text = render(&registry).unwrap();
        for line in [
            "smolder_test_a_total 1",
            "smolder_test_b_total{stage=\"x\"} 2",
            "smolder_test_c 3",
            "smolder_test_d_seconds_bucket{le=\"0.0005\"} 0",
            "smolder_test_d_seconds_bucket{le=\"0.001\"} 1",
            "smolder_test_e_seconds_bucket{route=\"r\",le=\"16.384\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }

    #[test]
    #[should_panic(expected = "a metric name registered once")]
    fn a_name_registered_twice_is_a_bug() {
        let registry = Registry::new();
        counter(&registry, "smolder_test_twice_total", "Once.");
        counter(&registry, "smolder_test_twice_total", "Twice.");
    }
}
