//! The table lifecycle's metrics, `smolder_agent_ebpf_unwind_*`, updated by the `smolder-unwind`
//! thread per table and per process loaded, never per sample.

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, Registry};
use smolder_daemon::metrics::{counter, counter_vec, gauge, histogram, histogram_vec};

use crate::ebpf::metrics::seconds_buckets;

/// Reasons a binary gets no table (`smolder_agent_ebpf_unwind_table_failures_total{reason}`).
pub(crate) const FAILURE_REASONS: [&str; 6] = [
    "unreadable",
    "not_elf",
    "no_cfi",
    "too_large",
    "malformed",
    "over_budget",
];

/// The table lifecycle's metrics.
#[derive(Clone)]
pub struct UnwindMetrics {
    /// `smolder_agent_ebpf_unwind_tables`: tables in the kernel.
    pub tables: IntGauge,
    /// `smolder_agent_ebpf_unwind_table_bytes`: kernel memory of the tables in the kernel
    /// (`memlock` of their maps).
    pub table_bytes: IntGauge,
    /// `smolder_agent_ebpf_unwind_tables_loaded_total{origin}`: tables put into the kernel, by
    /// where they came from (`cache`, `built`, `built_with_debug_file`).
    pub tables_loaded: IntCounterVec,
    /// `smolder_agent_ebpf_unwind_tables_evicted_total`: tables taken out of the kernel to stay
    /// within `ebpf.unwind.max-table-bytes`.
    pub tables_evicted: IntCounter,
    /// `smolder_agent_ebpf_unwind_table_failures_total{reason}`: binaries left without a table
    /// (their frames are walked with frame pointers).
    pub table_failures: IntCounterVec,
    /// `smolder_agent_ebpf_unwind_unsupported_rows_total{reason}`: rows of loaded tables the
    /// unwinder does not compute (a walk stops there).
    pub unsupported_rows: IntCounterVec,
    /// `smolder_agent_ebpf_unwind_table_build_duration_seconds`: building one table.
    pub build_duration: Histogram,
    /// `smolder_agent_ebpf_unwind_table_load_duration_seconds`: putting one table into the
    /// kernel (creating, filling and inserting its map); tables inserted in one batch each
    /// count the batch's time.
    pub load_duration: Histogram,
    /// `smolder_agent_ebpf_unwind_process_ready_seconds{trigger}`: from a process's first
    /// sample (`trigger="sample"`, the waits in the unwinder's and the builder's queues
    /// included) or from the
    /// agent's start (`trigger="start"`, a process loaded because it was running then,
    /// `ebpf.unwind.load-at-start`) to its tables and mappings in the kernel.
    pub ready_duration: HistogramVec,
    /// `smolder_agent_ebpf_unwind_mappings`: LPM entries of the mappings in the kernel.
    pub mappings: IntGauge,
    /// `smolder_agent_ebpf_unwind_refreshes_total`: processes' mappings read again after walks
    /// left them (a library loaded with `dlopen`).
    pub refreshes: IntCounter,
    /// `smolder_agent_ebpf_unwind_reloads_total`: sampled processes loaded again because a
    /// table they map was evicted.
    pub reloads: IntCounter,
    /// `smolder_agent_ebpf_unwind_cache_bytes`: the disk cache's size.
    pub cache_bytes: IntGauge,
    /// `smolder_agent_ebpf_unwind_requests_queued`: requests sent to the `smolder-unwind`
    /// thread and not taken yet; growing, it says the thread is stuck or cannot keep up.
    pub requests_queued: IntGauge,
    /// `smolder_agent_ebpf_unwind_tables_queued`: tables asked of the `smolder-unwind-build`
    /// thread and not begun yet (at most one per executable).
    pub tables_queued: IntGauge,
    /// `smolder_agent_ebpf_unwind_last_progress_timestamp_seconds`: when the `smolder-unwind`
    /// thread last went round its loop (Unix time); it goes round at least every 500 ms, so
    /// `time() - this` above a few seconds says the thread is stuck.
    pub last_progress: IntGauge,
}

impl UnwindMetrics {
    /// Creates the metrics in `registry`.
    pub(crate) fn new(registry: &Registry) -> Self {
        let metrics = UnwindMetrics {
            tables: gauge(
                registry,
                "smolder_agent_ebpf_unwind_tables",
                "Unwind tables in the kernel.",
            ),
            table_bytes: gauge(
                registry,
                "smolder_agent_ebpf_unwind_table_bytes",
                "Kernel memory of the unwind tables in the kernel (memlock of their maps).",
            ),
            tables_loaded: counter_vec(
                registry,
                "smolder_agent_ebpf_unwind_tables_loaded_total",
                "Unwind tables put into the kernel, by origin (cache, built, built_with_debug_file).",
                &["origin"],
            ),
            tables_evicted: counter(
                registry,
                "smolder_agent_ebpf_unwind_tables_evicted_total",
                "Unwind tables taken out of the kernel to stay within ebpf.unwind.max-table-bytes.",
            ),
            table_failures: counter_vec(
                registry,
                "smolder_agent_ebpf_unwind_table_failures_total",
                "Binaries left without an unwind table (walked with frame pointers), by reason.",
                &["reason"],
            ),
            unsupported_rows: counter_vec(
                registry,
                "smolder_agent_ebpf_unwind_unsupported_rows_total",
                "Rows of loaded unwind tables the unwinder does not compute, by reason.",
                &["reason"],
            ),
            build_duration: histogram(
                registry,
                "smolder_agent_ebpf_unwind_table_build_duration_seconds",
                "Time to build one unwind table from a binary.",
                seconds_buckets(),
            ),
            load_duration: histogram(
                registry,
                "smolder_agent_ebpf_unwind_table_load_duration_seconds",
                "Time to put one unwind table into the kernel.",
                seconds_buckets(),
            ),
            ready_duration: histogram_vec(
                registry,
                "smolder_agent_ebpf_unwind_process_ready_seconds",
                "Time from a process's first sample (trigger=sample) or from the agent's start (trigger=start, processes running then) to its unwind tables and mappings in the kernel.",
                vec![
                    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
                ],
                &["trigger"],
            ),
            mappings: gauge(
                registry,
                "smolder_agent_ebpf_unwind_mappings",
                "LPM entries of process mappings in the kernel.",
            ),
            refreshes: counter(
                registry,
                "smolder_agent_ebpf_unwind_refreshes_total",
                "Process mappings read again after walks left them (dlopen).",
            ),
            reloads: counter(
                registry,
                "smolder_agent_ebpf_unwind_reloads_total",
                "Sampled processes loaded again because an unwind table they map was evicted.",
            ),
            cache_bytes: gauge(
                registry,
                "smolder_agent_ebpf_unwind_cache_bytes",
                "Bytes of unwind tables in the disk cache.",
            ),
            requests_queued: gauge(
                registry,
                "smolder_agent_ebpf_unwind_requests_queued",
                "Requests sent to the smolder-unwind thread and not taken yet.",
            ),
            tables_queued: gauge(
                registry,
                "smolder_agent_ebpf_unwind_tables_queued",
                "Unwind tables asked of the table builder thread and not begun yet.",
            ),
            last_progress: gauge(
                registry,
                "smolder_agent_ebpf_unwind_last_progress_timestamp_seconds",
                "When the smolder-unwind thread last went round its loop (Unix time, at least every 500 ms while it is not stuck).",
            ),
        };
        for trigger in ["sample", "start"] {
            metrics.ready_duration.with_label_values(&[trigger]);
        }
        for origin in ["cache", "built", "built_with_debug_file"] {
            metrics.tables_loaded.with_label_values(&[origin]);
        }
        for reason in FAILURE_REASONS {
            metrics.table_failures.with_label_values(&[reason]);
        }
        for reason in smolder_unwind::Unsupported::ALL {
            metrics.unsupported_rows.with_label_values(&[reason.name()]);
        }
        metrics
    }
}
