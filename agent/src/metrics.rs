//! The agent's metrics registry, the helpers that register metrics in it, and the two counters
//! every stage shares: errors and dropped data.
//!
//! Each stage defines its own metrics beside its code (`ebpf/metrics.rs`, `scrape/metrics.rs`,
//! `window/metrics.rs`, `rules/metrics.rs`, `spool/metrics.rs`, `ship/metrics.rs`); [`Metrics`]
//! creates them all in one registry, which `/metrics` renders. Names are
//! `smolder_agent_<stage>_<noun>_<unit>[_total]`, and only counters end in `_total`; each
//! long-running loop has its own group. The tier's own counters take the stage as a label
//! ([`StageCounters`]):
//!
//! - `smolder_agent_errors_total{stage,error_type}`: failures a stage handled (and logged once,
//!   where it handled them).
//! - `smolder_agent_dropped_<unit>_total{stage,reason,intentional}`: data a stage let go, in the
//!   unit it lost ([`DroppedUnit`]): `samples` (ebpf), `batches` and `bytes` (spool),
//!   `increments` (rules). `intentional="true"` when the configuration asked for it (a relabel
//!   rule's `drop`), `"false"` when a bound or a failure forced it. Work that is retried is never
//!   dropped.
//!
//! Every `stage`, `error_type`, `reason` combination a stage can emit exists at zero from the
//! start, so that `increase()` sees the first one and a missing series means a renamed metric.

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

use smolder_daemon::Health;

use crate::ebpf::{EbpfMetrics, PythonMetrics, SymbolizeMetrics};
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
            window: WindowMetrics::new(&registry),
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
        TextEncoder::new().encode_to_string(&self.registry.gather())
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// What a `smolder_agent_dropped_<unit>_total` counter counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DroppedUnit {
    /// `smolder_agent_dropped_samples_total`: samples (eBPF CPU samples).
    Samples,
    /// `smolder_agent_dropped_batches_total`: spooled batches.
    Batches,
    /// `smolder_agent_dropped_bytes_total`: bytes of spooled batches, as sent.
    Bytes,
    /// `smolder_agent_dropped_increments_total`: rule counter increments.
    Increments,
    /// `smolder_agent_dropped_mappings_total`: LPM entries of process mappings the unwinder
    /// did not put into the kernel.
    Mappings,
    /// `smolder_agent_dropped_requests_total`: requests to a background thread not queued.
    Requests,
}

/// Why a stage drops data: the `reason` label, and whether the configuration asked for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropCause {
    /// The `reason` label: bounded, one of the stage's.
    pub reason: &'static str,
    /// The `intentional` label: the configuration asked for it (a relabel rule's `drop`).
    pub intentional: bool,
}

impl DropCause {
    /// Data dropped because the configuration asked for it.
    pub const fn intentional(reason: &'static str) -> DropCause {
        DropCause {
            reason,
            intentional: true,
        }
    }

    /// Data dropped because a bound or a failure forced it.
    pub const fn forced(reason: &'static str) -> DropCause {
        DropCause {
            reason,
            intentional: false,
        }
    }

    fn intentional_label(self) -> &'static str {
        if self.intentional { "true" } else { "false" }
    }
}

/// The tier's counters, registered once and shared by every stage.
#[derive(Clone)]
pub(crate) struct TierCounters {
    errors: IntCounterVec,
    samples: IntCounterVec,
    batches: IntCounterVec,
    bytes: IntCounterVec,
    increments: IntCounterVec,
    mappings: IntCounterVec,
    requests: IntCounterVec,
}

impl TierCounters {
    fn new(registry: &Registry) -> TierCounters {
        let dropped = |name: &str, help: &str| {
            counter_vec(registry, name, help, &["stage", "reason", "intentional"])
        };
        TierCounters {
            errors: counter_vec(
                registry,
                "smolder_agent_errors_total",
                "Failures the agent's stages handled, by stage and error type.",
                &["stage", "error_type"],
            ),
            samples: dropped(
                "smolder_agent_dropped_samples_total",
                "Samples not profiled, by stage and reason; intentional=true when configured so.",
            ),
            batches: dropped(
                "smolder_agent_dropped_batches_total",
                "Batches that left the spool without an ack, by stage and reason.",
            ),
            bytes: dropped(
                "smolder_agent_dropped_bytes_total",
                "Bytes of batches that left the spool without an ack, by stage and reason.",
            ),
            increments: dropped(
                "smolder_agent_dropped_increments_total",
                "Rule counter increments not added, by stage and reason.",
            ),
            mappings: dropped(
                "smolder_agent_dropped_mappings_total",
                "LPM entries of process mappings the unwinder did not put into the kernel (walked with frame pointers there), by stage and reason.",
            ),
            requests: dropped(
                "smolder_agent_dropped_requests_total",
                "Requests to a background thread not queued because its queue was full, by stage and reason.",
            ),
        }
    }

    /// These counters for `stage`, with each of its `error_types` and `drops` at zero.
    pub(crate) fn stage(
        &self,
        stage: &'static str,
        error_types: &[&str],
        drops: &[(DroppedUnit, DropCause)],
    ) -> StageCounters {
        let counters = StageCounters {
            stage,
            tier: self.clone(),
        };
        for error_type in error_types {
            counters.error_counter(error_type);
        }
        for &(unit, cause) in drops {
            counters.dropped_counter(unit, cause);
        }
        counters
    }
}

/// `smolder_agent_errors_total` and the `smolder_agent_dropped_<unit>_total` counters, with one
/// stage's `stage` label.
#[derive(Clone)]
pub struct StageCounters {
    stage: &'static str,
    tier: TierCounters,
}

impl StageCounters {
    /// Counts one failure of `error_type`, one of the stage's bounded set.
    pub fn error(&self, error_type: &str) {
        self.error_counter(error_type).inc();
    }

    /// Counts `n` `unit`s dropped for `cause`.
    pub fn dropped(&self, unit: DroppedUnit, cause: DropCause, n: u64) {
        self.dropped_counter(unit, cause).inc_by(n);
    }

    fn error_counter(&self, error_type: &str) -> IntCounter {
        self.tier
            .errors
            .with_label_values(&[self.stage, error_type])
    }

    fn dropped_counter(&self, unit: DroppedUnit, cause: DropCause) -> IntCounter {
        let counters = match unit {
            DroppedUnit::Samples => &self.tier.samples,
            DroppedUnit::Batches => &self.tier.batches,
            DroppedUnit::Bytes => &self.tier.bytes,
            DroppedUnit::Increments => &self.tier.increments,
            DroppedUnit::Mappings => &self.tier.mappings,
            DroppedUnit::Requests => &self.tier.requests,
        };
        counters.with_label_values(&[self.stage, cause.reason, cause.intentional_label()])
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
