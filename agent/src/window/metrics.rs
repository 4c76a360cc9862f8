//! The window loop's metrics (`smolder_agent_window_*`), updated per profile received and per
//! window closed. What it drops is counted in the tier's counters with `stage="window"`:
//! profiles in `smolder_agent_dropped_profiles_total` (`max_series`: a new series past
//! `window.max-series`; `queue_full`: a source's profile while the loop's queue was full) and
//! windows in `smolder_agent_dropped_windows_total` (`<sink>_busy`: a sink's queue was full).

use prometheus::{IntCounter, IntGauge, Registry};
use smolder_daemon::metrics::{counter, gauge};

use crate::tier::{DropCause, DroppedUnit, StageCounters, TierCounters};

/// A new series past `window.max-series`: its profile is dropped.
pub(crate) const MAX_SERIES: DropCause = DropCause::forced("max_series");
/// The loop's queue was full when a source submitted: the profile is dropped, the source goes
/// on.
pub(crate) const QUEUE_FULL: DropCause = DropCause::forced("queue_full");
/// The spool's queue was full (its disk is slow or failing): the window is not spooled.
pub const SPOOL_BUSY: DropCause = DropCause::forced("spool_busy");
/// The rules' queue was full: the window is not counted by the rules.
pub const RULES_BUSY: DropCause = DropCause::forced("rules_busy");

/// The window loop's metrics.
#[derive(Clone)]
pub struct WindowMetrics {
    /// `smolder_agent_window_profiles_submitted_total`: profiles sources handed in.
    pub profiles_submitted: IntCounter,
    /// `smolder_agent_window_late_profiles_total`: profiles whose window had already closed,
    /// filed under the open one instead.
    pub late_profiles: IntCounter,
    /// `smolder_agent_window_windows_closed_total`: windows handed to the sinks.
    pub windows_closed: IntCounter,
    /// `smolder_agent_window_series`: series in the last closed window.
    pub series: IntGauge,
    /// `smolder_agent_window_nodes`: tree nodes in the last closed window.
    pub nodes: IntGauge,
    /// `smolder_agent_dropped_profiles_total{stage="window"}` and
    /// `smolder_agent_dropped_windows_total{stage="window"}`.
    pub tier: StageCounters,
}

impl WindowMetrics {
    /// Creates the window loop's metrics in `registry`.
    pub(crate) fn new(registry: &Registry, tier: &TierCounters) -> Self {
        WindowMetrics {
            profiles_submitted: counter(
                registry,
                "smolder_agent_window_profiles_submitted_total",
                "Profiles that sources submitted to the window loop.",
            ),
            late_profiles: counter(
                registry,
                "smolder_agent_window_late_profiles_total",
                "Profiles that arrived after their window closed and went into the open one.",
            ),
            windows_closed: counter(
                registry,
                "smolder_agent_window_windows_closed_total",
                "Windows closed and handed to the sinks.",
            ),
            series: gauge(
                registry,
                "smolder_agent_window_series",
                "Series in the last closed window.",
            ),
            nodes: gauge(
                registry,
                "smolder_agent_window_nodes",
                "Stack tree nodes in the last closed window.",
            ),
            tier: tier.stage(
                "window",
                &[],
                &[
                    (DroppedUnit::Profiles, MAX_SERIES),
                    (DroppedUnit::Profiles, QUEUE_FULL),
                    (DroppedUnit::Windows, SPOOL_BUSY),
                    (DroppedUnit::Windows, RULES_BUSY),
                ],
            ),
        }
    }
}
