//! The agent's metrics catalogue: every stage's metrics in one registry, which `/metrics`
//! renders.
//!
//! Each stage defines its own metrics beside its code (`ebpf/metrics.rs`, `scrape/metrics.rs`,
//! `window/metrics.rs`, `rules/metrics.rs`, `spool/metrics.rs`, `ship/metrics.rs`), created
//! with `smolder_daemon::metrics`' helpers; [`Metrics`] creates them all, with the tier's
//! errors and dropped counters (`tier.rs`), in one registry, and `app.rs` hands each stage its
//! group. Names are `smolder_agent_<stage>_<noun>_<unit>[_total]`, and only counters end in
//! `_total`; each long-running loop has its own group. It sits above the stages it gathers:
//! none of them imports it.

use prometheus::Registry;

use smolder_daemon::Health;

use crate::ebpf::{EbpfMetrics, PythonMetrics, SymbolizeMetrics};
use crate::rules::RulesMetrics;
use crate::scrape::ScrapeMetrics;
use crate::ship::ShipMetrics;
use crate::spool::SpoolMetrics;
use crate::tier::TierCounters;
use crate::window::WindowMetrics;

/// The agent's metrics and the registry that serves them, one group per stage in data-path
/// order.
pub struct Metrics {
    registry: Registry,
    /// The eBPF sampler's metrics.
    pub ebpf: EbpfMetrics,
    /// The symbolizer's metrics.
    pub symbolize: SymbolizeMetrics,
    /// The Python walk's metrics.
    pub python: PythonMetrics,
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
    /// The loops' heartbeats (`smolder_agent_health_*`), which `/healthz`, `/readyz` and the
    /// watchdog pings read.
    pub health: Health,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let registry = Registry::new();
        let tier = TierCounters::new(&registry);
        Metrics {
            ebpf: EbpfMetrics::new(&registry, &tier),
            symbolize: SymbolizeMetrics::new(&registry, &tier),
            python: PythonMetrics::new(&registry),
            scrape: ScrapeMetrics::new(&registry, &tier),
            window: WindowMetrics::new(&registry, &tier),
            rules: RulesMetrics::new(&registry, &tier),
            spool: SpoolMetrics::new(&registry, &tier),
            ship: ShipMetrics::new(&registry, &tier),
            health: Health::new("agent", &registry),
            registry,
        }
    }

    /// Every metric in Prometheus' text format.
    ///
    /// # Errors
    ///
    /// When a metric cannot be encoded.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        smolder_daemon::metrics::render(&self.registry)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
