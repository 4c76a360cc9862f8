//! The agent's metrics registry and the helpers that register metrics in it.
//!
//! Each stage defines its own metrics beside its code (`ebpf/metrics.rs`, `scrape/metrics.rs`,
//! `window/metrics.rs`, `rules/metrics.rs`, `spool/metrics.rs`, `ship/metrics.rs`); [`Metrics`]
//! creates them all in one registry, which `/metrics` renders. Names are
//! `smolder_agent_<stage>_<noun>_<unit>`; each long-running loop has its own group.

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

use crate::ebpf::{EbpfMetrics, SymbolizeMetrics};
use crate::rules::RulesMetrics;
use crate::scrape::ScrapeMetrics;
use crate::ship::ShipMetrics;
use crate::spool::SpoolMetrics;
use crate::window::WindowMetrics;

/// The agent's metrics and the registry that serves them, one group per stage in data-path
/// order.
pub struct Metrics {
    registry: Registry,
    /// The eBPF sampler's metrics.
    pub ebpf: EbpfMetrics,
    /// The symbolizer's metrics.
    pub symbolize: SymbolizeMetrics,
    /// The pprof scraper's metrics.
    pub scrape: ScrapeMetrics,
    /// The window loop's metrics.
    pub window: WindowMetrics,
    /// The rules' metrics.
    pub rules: RulesMetrics,
    /// The spool's metrics.
    pub spool: SpoolMetrics,
    /// The shipper's metrics.
    pub ship: ShipMetrics,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let registry = Registry::new();
        Metrics {
            ebpf: EbpfMetrics::new(&registry),
            symbolize: SymbolizeMetrics::new(&registry),
            scrape: ScrapeMetrics::new(&registry),
            window: WindowMetrics::new(&registry),
            rules: RulesMetrics::new(&registry),
            spool: SpoolMetrics::new(&registry),
            ship: ShipMetrics::new(&registry),
            registry,
        }
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

/// Registers any metric.
pub(crate) fn register<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: M,
) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("a metric name registered once");
    metric
}

/// Creates and registers a counter.
pub(crate) fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    register(
        registry,
        IntCounter::with_opts(Opts::new(name, help)).expect("a valid counter"),
    )
}

/// Creates and registers a counter with labels.
pub(crate) fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntCounterVec {
    register(
        registry,
        IntCounterVec::new(Opts::new(name, help), labels).expect("a valid counter"),
    )
}

/// Creates and registers a gauge.
pub(crate) fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    register(
        registry,
        IntGauge::with_opts(Opts::new(name, help)).expect("a valid gauge"),
    )
}

/// Creates and registers a histogram of durations in seconds (1 ms to about 16 s).
pub(crate) fn histogram(registry: &Registry, name: &str, help: &str) -> Histogram {
    let buckets = prometheus::exponential_buckets(0.001, 2.0, 15).expect("valid buckets");
    register(
        registry,
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
            .expect("a valid histogram"),
    )
}
