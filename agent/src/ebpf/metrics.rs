//! The eBPF source's metrics: the sampler's (`smolder_agent_ebpf_*`, updated once per drain by
//! the `smolder-ebpf` thread), the symbolizer's (`smolder_agent_symbolize_*`, by the
//! `smolder-symbolize` thread) and the Python walk's (`smolder_agent_python_*`, by the
//! `smolder-ebpf` thread at first sight of a process and once per drain). The source's errors and dropped samples are counted in the
//! tier's counters with `stage="ebpf"`.

use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge, Registry};

use super::ErrorCounts;
use crate::metrics::{
    DropCause, DroppedUnit, StageCounters, TierCounters, counter, counter_vec, gauge, histogram,
};

/// Samples that found the kernel's counts map full (raise `ebpf.counts-map-entries`).
pub(crate) const COUNTS_MAP_FULL: DropCause = DropCause::forced("counts_map_full");
/// Samples of a process an `ebpf.relabel-configs` rule dropped.
pub(crate) const RELABEL: DropCause = DropCause::intentional("relabel");
/// Samples of a process that exited before the agent could read it.
pub(crate) const UNKNOWN_PROCESS: DropCause = DropCause::forced("unknown_process");

/// The `error_type`s of `smolder_agent_errors_total{stage="ebpf"}`: a drain of the sample maps
/// failed, reading the kernel's error counters did, or registering a CPython process for the
/// kernel walk did (`python_procs` full).
const ERROR_TYPES: [&str; 3] = ["drain", "read_errors", "python_register"];

/// The eBPF sampler's metrics (the `smolder-ebpf` thread), updated once per drain.
#[derive(Clone)]
pub struct EbpfMetrics {
    /// `smolder_agent_ebpf_samples_total`: samples drained from the kernel, before relabelling.
    pub samples: IntCounter,
    /// `smolder_agent_ebpf_lost_stacks_total{stack,reason}`: samples kept without their `user`
    /// or `kernel` stack, because its stack-map slot was taken (`collision`; raise
    /// `ebpf.stack-map-entries`) or the helper failed (`failed`).
    pub lost_stacks: IntCounterVec,
    /// `smolder_agent_ebpf_lost_events_total`: process events lost to a full ring buffer.
    pub lost_events: IntCounter,
    /// `smolder_agent_ebpf_drains_total`.
    pub drains: IntCounter,
    /// `smolder_agent_ebpf_drain_duration_seconds`: reading and emptying the maps.
    pub drain_duration: Histogram,
    /// `smolder_agent_ebpf_processes`: processes the sampler tracks (alive or in their exit
    /// grace period).
    pub processes: IntGauge,
    /// `smolder_agent_ebpf_series`: series submitted by the last drain.
    pub series: IntGauge,
    /// `smolder_agent_errors_total{stage="ebpf",error_type}`: drains or reads that failed;
    /// `smolder_agent_dropped_samples_total{stage="ebpf",reason,intentional}`: samples not
    /// profiled: `counts_map_full` (raise `ebpf.counts-map-entries`), `relabel` (a rule dropped
    /// the process, intentional), `unknown_process` (it exited before the agent could read it).
    pub tier: StageCounters,
}

impl EbpfMetrics {
    /// Creates the sampler's metrics in `registry`.
    pub(crate) fn new(registry: &Registry, tier: &TierCounters) -> Self {
        let drops =
            [COUNTS_MAP_FULL, RELABEL, UNKNOWN_PROCESS].map(|cause| (DroppedUnit::Samples, cause));
        EbpfMetrics {
            samples: counter(
                registry,
                "smolder_agent_ebpf_samples_total",
                "CPU samples drained from the kernel, before relabelling.",
            ),
            lost_stacks: counter_vec(
                registry,
                "smolder_agent_ebpf_lost_stacks_total",
                "CPU samples kept without their user or kernel stack, by stack and reason.",
                &["stack", "reason"],
            ),
            lost_events: counter(
                registry,
                "smolder_agent_ebpf_lost_events_total",
                "Process events (first sample, exec, exit) lost to a full ring buffer.",
            ),
            drains: counter(
                registry,
                "smolder_agent_ebpf_drains_total",
                "Drains of the kernel sample maps.",
            ),
            drain_duration: histogram(
                registry,
                "smolder_agent_ebpf_drain_duration_seconds",
                "Time to switch buffers, read and empty the kernel sample maps.",
            ),
            processes: gauge(
                registry,
                "smolder_agent_ebpf_processes",
                "Processes tracked by the sampler, alive or in their exit grace period.",
            ),
            series: gauge(
                registry,
                "smolder_agent_ebpf_series",
                "Series submitted by the last drain.",
            ),
            tier: tier.stage("ebpf", &ERROR_TYPES, &drops),
        }
    }

    /// Counts `samples` not profiled for `cause`.
    pub(crate) fn dropped(&self, cause: DropCause, samples: u64) {
        self.tier.dropped(DroppedUnit::Samples, cause, samples);
    }

    /// Counts what the kernel side's error counters say happened since their last read.
    pub(crate) fn kernel_errors(&self, errors: &ErrorCounts) {
        self.dropped(COUNTS_MAP_FULL, errors.counts_full);
        let stack = |stack: &str, reason: &str, n: u64| {
            self.lost_stacks
                .with_label_values(&[stack, reason])
                .inc_by(n);
        };
        stack("user", "collision", errors.user_stack_collisions);
        stack("kernel", "collision", errors.kernel_stack_collisions);
        stack("user", "failed", errors.user_stack_failures);
        stack("kernel", "failed", errors.kernel_stack_failures);
        self.lost_events.inc_by(errors.events_lost);
    }
}

/// The symbolizer's metrics (the `smolder-symbolize` thread).
#[derive(Clone)]
pub struct SymbolizeMetrics {
    /// `smolder_agent_symbolize_frames_resolved_total`: addresses resolved to a name.
    pub frames_resolved: IntCounter,
    /// `smolder_agent_symbolize_frames_unresolved_total`: addresses left as `module+0xoffset`.
    pub frames_unresolved: IntCounter,
    /// `smolder_agent_symbolize_truncated_stacks_total`: samples whose user stack does not reach
    /// a thread entry point, because code without frame pointers cut the unwinding short.
    pub truncated_stacks: IntCounter,
    /// `smolder_agent_symbolize_captures_total`: process memory maps captured.
    pub captures: IntCounter,
    /// `smolder_agent_symbolize_capture_failures_total`: processes gone before capture.
    pub capture_failures: IntCounter,
    /// `smolder_agent_symbolize_files_evicted_total`: binaries closed to stay within
    /// `symbolize.max-open-files`.
    pub files_evicted: IntCounter,
    /// `smolder_agent_symbolize_processes`: process maps held.
    pub processes: IntGauge,
    /// `smolder_agent_symbolize_open_files`: binaries held open.
    pub open_files: IntGauge,
    /// `smolder_agent_symbolize_cached_frames`: resolved frames cached.
    pub cached_frames: IntGauge,
    /// `smolder_agent_symbolize_duration_seconds`: symbolizing one drain.
    pub duration: Histogram,
}

impl SymbolizeMetrics {
    /// Creates the symbolizer's metrics in `registry`.
    pub(crate) fn new(registry: &Registry) -> Self {
        SymbolizeMetrics {
            frames_resolved: counter(
                registry,
                "smolder_agent_symbolize_frames_resolved_total",
                "Distinct addresses resolved to a function name.",
            ),
            frames_unresolved: counter(
                registry,
                "smolder_agent_symbolize_frames_unresolved_total",
                "Distinct addresses no symbol was found for (shown as module+0xoffset).",
            ),
            truncated_stacks: counter(
                registry,
                "smolder_agent_symbolize_truncated_stacks_total",
                "Samples whose user stack stops before a thread entry point (code without frame pointers).",
            ),
            captures: counter(
                registry,
                "smolder_agent_symbolize_captures_total",
                "Process memory maps captured at first sight or after an exec.",
            ),
            capture_failures: counter(
                registry,
                "smolder_agent_symbolize_capture_failures_total",
                "Processes that exited before their memory map could be captured.",
            ),
            files_evicted: counter(
                registry,
                "smolder_agent_symbolize_files_evicted_total",
                "Binaries closed to stay within symbolize.max-open-files.",
            ),
            processes: gauge(
                registry,
                "smolder_agent_symbolize_processes",
                "Process memory maps held by the symbolizer.",
            ),
            open_files: gauge(
                registry,
                "smolder_agent_symbolize_open_files",
                "Binaries held open by the symbolizer.",
            ),
            cached_frames: gauge(
                registry,
                "smolder_agent_symbolize_cached_frames",
                "Resolved frames in the symbolizer's cache.",
            ),
            duration: histogram(
                registry,
                "smolder_agent_symbolize_duration_seconds",
                "Time to symbolize one drain's samples.",
            ),
        }
    }
}

/// Label values of `smolder_agent_python_processes_total{version}`.
const PYTHON_VERSIONS: [&str; 5] = ["older", "3.11", "3.12", "3.13", "newer"];

/// The Python walk's metrics (the `smolder-ebpf` thread).
#[derive(Clone)]
pub struct PythonMetrics {
    /// `smolder_agent_python_processes_total{version,support}`: CPython processes found at
    /// first sight or exec, by minor release (`3.11`, `3.12`, `3.13`, `older`, `newer`) and
    /// `supported` or why not: `older`, `newer`, `pre_release`, `free_threaded`, `musl`,
    /// `debug_offsets`, `bpf_layout`, `no_pid_namespace`.
    pub processes_found: IntCounterVec,
    /// `smolder_agent_python_processes`: CPython processes walked now (alive or in their exit
    /// grace period).
    pub processes: IntGauge,
    /// `smolder_agent_python_samples_total{stack}`: samples of walked processes, by what they
    /// carry: `python` (a Python stack) or `native` (the thread ran no Python code, or the walk
    /// failed).
    pub samples: IntCounterVec,
    /// `smolder_agent_python_frames_total`: Python frames in the samples that carry them.
    pub frames: IntCounter,
    /// `smolder_agent_python_read_failures_total{reason}`: what could not be read, by reason.
    /// Samples without their Python stack: `thread_state`, `frame`, `thread_limit`,
    /// `stacks_map_full` (raise `ebpf.python.stack-map-entries`), `stack_lost` (the event
    /// carrying its frames was lost); samples with it cut at 128 frames: `truncated`; frames
    /// whose name could not be read: `read`, `not_code`, `not_string`, `stale_code`,
    /// `unknown_process`; processes that could not be inspected: `binary`, `open_memory`,
    /// `unmapped`.
    pub read_failures: IntCounterVec,
}

impl PythonMetrics {
    /// Creates the Python walk's metrics in `registry`.
    pub(crate) fn new(registry: &Registry) -> Self {
        let metrics = PythonMetrics {
            processes_found: counter_vec(
                registry,
                "smolder_agent_python_processes_total",
                "CPython processes found, by minor release and support (supported, or why not).",
                &["version", "support"],
            ),
            processes: gauge(
                registry,
                "smolder_agent_python_processes",
                "CPython processes whose Python stacks are walked, alive or in their exit grace period.",
            ),
            samples: counter_vec(
                registry,
                "smolder_agent_python_samples_total",
                "Samples of walked CPython processes, by the stack they carry (python or native).",
                &["stack"],
            ),
            frames: counter(
                registry,
                "smolder_agent_python_frames_total",
                "Python frames in the samples that carry a Python stack.",
            ),
            read_failures: counter_vec(
                registry,
                "smolder_agent_python_read_failures_total",
                "Python stacks, frame names and processes that could not be read, by reason.",
                &["reason"],
            ),
        };
        for version in PYTHON_VERSIONS {
            metrics
                .processes_found
                .with_label_values(&[version, "supported"]);
        }
        for stack in ["python", "native"] {
            metrics.samples.with_label_values(&[stack]);
        }
        metrics
    }

    /// Counts a CPython process found with `version` and `support`.
    pub(crate) fn found(&self, version: &str, support: &str) {
        self.processes_found
            .with_label_values(&[version, support])
            .inc();
    }

    /// Counts `n` failures for `reason`.
    pub(crate) fn failed(&self, reason: &str, n: u64) {
        self.read_failures.with_label_values(&[reason]).inc_by(n);
    }
}
