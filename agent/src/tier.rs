//! The agent tier's two counters with the stage as a label, which every stage shares: errors
//! and dropped data. A leaf: it depends on no other module of the crate.
//!
//! - `smolder_agent_errors_total{stage,error_type}`: failures a stage handled (and logged once,
//!   where it handled them).
//! - `smolder_agent_dropped_<unit>_total{stage,reason,intentional}`: data a stage let go, in the
//!   unit it lost ([`DroppedUnit`]): `samples` (ebpf), `profiles` and `windows` (window),
//!   `batches` and `bytes` (spool), `series` (spool, ship), `increments` (rules), `mappings`
//!   (the unwinder), `requests` (a background thread's queue).
//!   `intentional="true"` when the configuration asked for it (a relabel rule's `drop`),
//!   `"false"` when a bound or a failure forced it. Work that is retried is never dropped.
//!
//! [`TierCounters`] registers them once; each stage holds its [`StageCounters`], which creates
//! every `stage`, `error_type`, `reason` combination the stage can emit at zero from the start,
//! so that `increase()` sees the first one and a missing series means a renamed metric.

use prometheus::{IntCounter, IntCounterVec, Registry};
use smolder_daemon::metrics::counter_vec;

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
    /// `smolder_agent_dropped_profiles_total`: profiles a source submitted that no window took.
    Profiles,
    /// `smolder_agent_dropped_windows_total`: closed windows a sink did not take.
    Windows,
    /// `smolder_agent_dropped_series_total`: series of a window not spooled or not stored
    /// (over the aggregator's limits, or refused by it).
    Series,
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
    profiles: IntCounterVec,
    windows: IntCounterVec,
    series: IntCounterVec,
}

impl TierCounters {
    /// Registers the tier's counters in `registry`.
    pub(crate) fn new(registry: &Registry) -> TierCounters {
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
            profiles: dropped(
                "smolder_agent_dropped_profiles_total",
                "Profiles that sources submitted and no window took, by stage and reason.",
            ),
            windows: dropped(
                "smolder_agent_dropped_windows_total",
                "Closed windows a sink did not take (its queue was full), by stage and reason.",
            ),
            series: dropped(
                "smolder_agent_dropped_series_total",
                "Series of closed windows not spooled or refused by the aggregator, by stage and reason.",
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
            DroppedUnit::Profiles => &self.tier.profiles,
            DroppedUnit::Windows => &self.tier.windows,
            DroppedUnit::Series => &self.tier.series,
        };
        counters.with_label_values(&[self.stage, cause.reason, cause.intentional_label()])
    }
}
