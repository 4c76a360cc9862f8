//! The window loop's metrics (`smolder_agent_window_*`), updated per profile received and per
//! window closed.

use prometheus::{IntCounter, IntGauge, Registry};

use crate::metrics::{counter, gauge};

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
}

impl WindowMetrics {
    /// Creates the window loop's metrics in `registry`.
    pub(crate) fn new(registry: &Registry) -> Self {
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
        }
    }
}
