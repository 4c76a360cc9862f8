//! The eBPF source's metrics: the sampler's (`smolder_agent_ebpf_*`, updated once per drain by
//! the `smolder-ebpf` thread), the unwind tables' (`smolder_agent_ebpf_unwind_*`, by the
//! `smolder-unwind` thread, defined in [`super::unwind::metrics`]) and the symbolizer's
//! (`smolder_agent_symbolize_*`, by the `smolder-symbolize` and `smolder-debuginfod` threads)
//! and the Python walk's (`smolder_agent_python_*`, by the `smolder-ebpf` thread at first sight
//! of a process and once per drain). The source's errors and dropped samples are counted in the tier's counters with
//! `stage="ebpf"`.

use prometheus::{Gauge, Histogram, IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use smolder_agent_ebpf::unwind::Status;
use smolder_daemon::Health;
use smolder_daemon::metrics::{counter, counter_vec, gauge, histogram, register};

use super::symbolize::DebugSource;
use super::unwind::UnwindMetrics;
use crate::tier::{DropCause, DroppedUnit, StageCounters, TierCounters};

/// Bucket bounds of the source's durations in seconds (a drain, a table's build or load, a
/// symbolization): 1 ms to about 16 s, doubling.
pub(crate) fn seconds_buckets() -> Vec<f64> {
    smolder_daemon::metrics::doubling_buckets(0.001, 15)
}

/// Samples the kernel could not queue: the samples ring buffer was full.
pub(crate) const RING_BUFFER_FULL: DropCause = DropCause::forced("ring_buffer_full");
/// Samples of a process an `ebpf.relabel-configs` rule dropped.
pub(crate) const RELABEL: DropCause = DropCause::intentional("relabel");
/// Samples of a process that exited before the agent could read it.
pub(crate) const UNKNOWN_PROCESS: DropCause = DropCause::forced("unknown_process");
/// Off-CPU waits shorter than `ebpf.off-cpu.min-duration`.
pub(crate) const MIN_DURATION: DropCause = DropCause::intentional("min_duration");
/// Off-CPU switch-ins whose switch-out was lost (to a full ring buffer).
pub(crate) const UNMATCHED_SWITCH_IN: DropCause = DropCause::forced("unmatched_switch_in");
/// Off-CPU switch-outs not followed: too many threads were waiting already.
pub(crate) const WAITING_FULL: DropCause = DropCause::forced("waiting_full");
/// Mappings left out of the kernel past a process's share of `unwind_mappings`
/// (`smolder_agent_dropped_mappings_total`).
pub(crate) const PROCESS_CAP: DropCause = DropCause::forced("unwind_process_cap");
/// Mappings the kernel refused: `unwind_mappings` is full.
pub(crate) const MAP_FULL: DropCause = DropCause::forced("unwind_mappings_full");
/// Requests to the `smolder-unwind` thread past its queue's bound
/// (`smolder_agent_dropped_requests_total`).
pub(crate) const UNWIND_QUEUE_FULL: DropCause = DropCause::forced("unwind_queue_full");
/// Build ids asked of the debuginfod client past its queue's bound
/// (`smolder_agent_dropped_requests_total{stage="symbolize"}`).
pub(crate) const DEBUGINFOD_QUEUE_FULL: DropCause = DropCause::forced("debuginfod_queue_full");
/// Samples of new distinct stacks past a window's bound
/// ([`crate::ebpf::samples::MAX_WINDOW_STACKS`]).
pub(crate) const WINDOW_STACKS_FULL: DropCause = DropCause::forced("window_stacks_full");
/// Samples of a window the symbolizer failed on (it panicked and was restarted): they cannot
/// be named.
pub(crate) const SYMBOLIZER_FAILED: DropCause = DropCause::forced("symbolizer_failed");

/// The `error_type`s of `smolder_agent_errors_total{stage="ebpf"}`: reading the kernel's loss
/// counters failed, the samples ring buffer held a malformed record, putting an unwind table or
/// a process's mappings into the kernel failed, registering a CPython process for the kernel
/// walk did (`python_procs` full), or the symbolizer failed on a window.
const ERROR_TYPES: [&str; 6] = [
    "read_counters",
    "malformed_sample",
    "unwind_table_load",
    "unwind_mappings",
    "python_register",
    "symbolize",
];

/// The `source`s of `smolder_agent_ebpf_unwind_rows_total`.
pub(crate) const ROW_SOURCES: [&str; 2] = ["cache", "table"];

/// The eBPF sampler's metrics (the `smolder-ebpf` thread), updated once per drain.
#[derive(Clone)]
pub struct EbpfMetrics {
    /// `smolder_agent_ebpf_samples_total`: CPU samples read from the kernel, before
    /// relabelling.
    pub samples: IntCounter,
    /// `smolder_agent_ebpf_off_cpu_probability`: the probability a context switch is sampled
    /// with now (`ebpf.off-cpu.probability`, lowered to keep within
    /// `ebpf.off-cpu.max-unwinds-per-second`); absent 0 with off-CPU disabled.
    pub off_cpu_probability: Gauge,
    /// `smolder_agent_ebpf_off_cpu_unwinds_total`: switch-outs sampled and unwound.
    pub off_cpu_unwinds: IntCounter,
    /// `smolder_agent_ebpf_off_cpu_waiting_threads`: threads sampled at switch-out and not back
    /// on a CPU yet.
    pub off_cpu_waiting: IntGauge,
    /// `smolder_agent_ebpf_memory_samples_total`: page-fault samples read.
    pub memory_samples: IntCounter,
    /// `smolder_agent_ebpf_memory_huge_samples_total`: page-fault samples whose fault mapped a
    /// transparent huge page (counted as 2 MiB per fault).
    pub memory_huge_samples: IntCounter,
    /// `smolder_agent_ebpf_memory_unclassified_samples_total`: page-fault samples the kernel
    /// could not tell huge or not (its page tables could not be read): counted as base pages.
    pub memory_unclassified_samples: IntCounter,
    /// `smolder_agent_ebpf_unwind_samples_total{outcome}`: samples of the processes profiled
    /// (kept by relabelling) by why their user-stack walk ended: `complete` (it reached the
    /// stack's root, an end-of-stack row of a table), `truncated` (`ebpf.max-frames`),
    /// `fp_end` (a frame-pointer step met a zero `rbp`: the root only if every frame keeps a
    /// frame pointer), or where it stopped short (`no_table`, `bad_frame_pointer`,
    /// `unsupported`, `fp_lost`, `read_fault`, `not_moving_up`); `no_user_stack` for kernel
    /// threads.
    pub unwind_samples: IntCounterVec,
    /// `smolder_agent_ebpf_unwind_frames`: user frames per sample of the processes profiled.
    pub unwind_frames: Histogram,
    /// `smolder_agent_ebpf_unwind_fp_frames_total`: frames of the processes profiled found by
    /// frame-pointer steps (no table applied: a process whose tables are not loaded yet, JIT
    /// code, a binary without call-frame information).
    pub unwind_fp_frames: IntCounter,
    /// `smolder_agent_ebpf_unwind_rows_total{source}`: user frames the kernel's walks found an
    /// unwind row for, before relabelling, by where the row came from: the walk's row cache
    /// (`cache`, found by an earlier walk of the same program on the same CPU) or a search of
    /// the table (`table`, about 125 ns a frame more on the machine of BENCHMARKS.md).
    /// Frame-pointer steps are in neither.
    pub unwind_rows: IntCounterVec,
    /// `smolder_agent_ebpf_lost_events_total`: process events lost to a full ring buffer.
    pub lost_events: IntCounter,
    /// `smolder_agent_ebpf_drains_total`.
    pub drains: IntCounter,
    /// `smolder_agent_ebpf_drain_duration_seconds`: taking a window's samples.
    pub drain_duration: Histogram,
    /// `smolder_agent_ebpf_processes`: processes the sampler tracks (alive or in their exit
    /// grace period).
    pub processes: IntGauge,
    /// `smolder_agent_ebpf_series`: series submitted by the last drain.
    pub series: IntGauge,
    /// The unwind tables' metrics.
    pub unwind: UnwindMetrics,
    /// `smolder_agent_errors_total{stage="ebpf",error_type}`: reads of the loss counters that
    /// failed, malformed ring-buffer records, tables and mappings the kernel refused;
    /// `smolder_agent_dropped_samples_total{stage="ebpf",reason,intentional}`: samples not
    /// profiled: `ring_buffer_full` (the agent fell behind), `relabel` (a rule dropped the
    /// process, intentional), `unknown_process` (it exited before the agent could read it),
    /// and off-CPU waits: `min_duration` (shorter than `ebpf.off-cpu.min-duration`,
    /// intentional), `unmatched_switch_in` (its switch-out was lost), `waiting_full` (too many
    /// threads waiting at once).
    pub tier: StageCounters,
}

impl EbpfMetrics {
    /// Creates the sampler's metrics in `registry`.
    pub(crate) fn new(registry: &Registry, tier: &TierCounters) -> Self {
        let mut drops: Vec<(DroppedUnit, DropCause)> = [
            RING_BUFFER_FULL,
            RELABEL,
            UNKNOWN_PROCESS,
            MIN_DURATION,
            UNMATCHED_SWITCH_IN,
            WAITING_FULL,
            WINDOW_STACKS_FULL,
            SYMBOLIZER_FAILED,
        ]
        .map(|cause| (DroppedUnit::Samples, cause))
        .into();
        drops.push((DroppedUnit::Requests, UNWIND_QUEUE_FULL));
        drops.extend([PROCESS_CAP, MAP_FULL].map(|cause| (DroppedUnit::Mappings, cause)));
        let metrics = EbpfMetrics {
            samples: counter(
                registry,
                "smolder_agent_ebpf_samples_total",
                "CPU samples read from the kernel, before relabelling.",
            ),
            off_cpu_probability: register(
                registry,
                Gauge::with_opts(Opts::new(
                    "smolder_agent_ebpf_off_cpu_probability",
                    "The probability a context switch is sampled with now (0 with off-CPU disabled).",
                ))
                .expect("a valid gauge"),
            ),
            off_cpu_unwinds: counter(
                registry,
                "smolder_agent_ebpf_off_cpu_unwinds_total",
                "Threads sampled and unwound as they left the CPU.",
            ),
            off_cpu_waiting: gauge(
                registry,
                "smolder_agent_ebpf_off_cpu_waiting_threads",
                "Threads sampled as they left the CPU and not back on one yet.",
            ),
            memory_samples: counter(
                registry,
                "smolder_agent_ebpf_memory_samples_total",
                "Page-fault samples read from the kernel, before relabelling.",
            ),
            memory_huge_samples: counter(
                registry,
                "smolder_agent_ebpf_memory_huge_samples_total",
                "Page-fault samples whose fault mapped a transparent huge page.",
            ),
            memory_unclassified_samples: counter(
                registry,
                "smolder_agent_ebpf_memory_unclassified_samples_total",
                "Page-fault samples whose page tables could not be read, counted as base pages.",
            ),
            unwind_samples: counter_vec(
                registry,
                "smolder_agent_ebpf_unwind_samples_total",
                "Samples (CPU, off-CPU, memory) of the processes profiled, by how their user-stack walk ended (complete: it reached the root).",
                &["outcome"],
            ),
            unwind_frames: histogram(registry, "smolder_agent_ebpf_unwind_frames", "User frames per sample of the processes profiled.", vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]),
            unwind_fp_frames: counter(
                registry,
                "smolder_agent_ebpf_unwind_fp_frames_total",
                "User frames of the processes profiled found by frame-pointer steps, where no unwind table applied.",
            ),
            unwind_rows: counter_vec(
                registry,
                "smolder_agent_ebpf_unwind_rows_total",
                "User frames the kernel's walks found an unwind row for, before relabelling, by where the row came from: the walk's row cache, or a search of the table.",
                &["source"],
            ),
            lost_events: counter(
                registry,
                "smolder_agent_ebpf_lost_events_total",
                "Process events (first sample, exec, exit) lost to a full ring buffer.",
            ),
            drains: counter(
                registry,
                "smolder_agent_ebpf_drains_total",
                "Windows of samples taken from the sampler.",
            ),
            drain_duration: histogram(
                registry,
                "smolder_agent_ebpf_drain_duration_seconds",
                "Time to take a window's samples and read the kernel's loss counters.",
                seconds_buckets(),
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
            unwind: UnwindMetrics::new(registry),
            tier: tier.stage("ebpf", &ERROR_TYPES, &drops),
        };
        for status in Status::ALL {
            metrics.unwind_samples.with_label_values(&[status.name()]);
        }
        for source in ROW_SOURCES {
            metrics.unwind_rows.with_label_values(&[source]);
        }
        metrics
    }

    /// Counts `samples` not profiled for `cause`.
    pub(crate) fn dropped(&self, cause: DropCause, samples: u64) {
        self.tier.dropped(DroppedUnit::Samples, cause, samples);
    }
}

/// The symbolizer's metrics (the `smolder-symbolize` thread).
#[derive(Clone)]
pub struct SymbolizeMetrics {
    /// `smolder_agent_symbolize_frames_resolved_total`: addresses resolved to a name.
    pub frames_resolved: IntCounter,
    /// `smolder_agent_symbolize_frames_unresolved_total`: addresses left as `module+0xoffset`.
    pub frames_unresolved: IntCounter,
    /// `smolder_agent_symbolize_debug_files_total{source}`: binaries named from a separate
    /// debug file, by where it was found (`local`: a debug directory; `debuginfod`).
    pub debug_files: IntCounterVec,
    /// `smolder_agent_symbolize_debuginfod_fetches_total{outcome}`: debug files asked of the
    /// debuginfod servers, by outcome (`fetched`, `not_found`, `failed`, `timeout`,
    /// `too_large`, `mismatch`).
    pub debuginfod_fetches: IntCounterVec,
    /// `smolder_agent_symbolize_debuginfod_fetch_duration_seconds`: one fetch, all servers.
    pub debuginfod_duration: Histogram,
    /// `smolder_agent_symbolize_debuginfod_fetched_bytes_total`: bytes of debug files fetched.
    pub debuginfod_bytes: IntCounter,
    /// `smolder_agent_symbolize_debuginfod_cache_bytes`: the debuginfod cache's size on disk.
    pub debuginfod_cache_bytes: IntGauge,
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
    /// The tier's counters with `stage="symbolize"`.
    pub tier: StageCounters,
}

impl SymbolizeMetrics {
    /// Creates the symbolizer's metrics in `registry`.
    pub(crate) fn new(registry: &Registry, tier: &TierCounters) -> Self {
        let metrics = SymbolizeMetrics {
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
            debug_files: counter_vec(
                registry,
                "smolder_agent_symbolize_debug_files_total",
                "Binaries named from a separate debug file, by where it was found (local, debuginfod).",
                &["source"],
            ),
            debuginfod_fetches: counter_vec(
                registry,
                "smolder_agent_symbolize_debuginfod_fetches_total",
                "Debug files asked of the debuginfod servers, by outcome.",
                &["outcome"],
            ),
            debuginfod_duration: histogram(
                registry,
                "smolder_agent_symbolize_debuginfod_fetch_duration_seconds",
                "Time to fetch one debug file from the debuginfod servers.",
                prometheus::exponential_buckets(0.01, 2.0, 14).expect("valid buckets"),
            ),
            debuginfod_bytes: counter(
                registry,
                "smolder_agent_symbolize_debuginfod_fetched_bytes_total",
                "Bytes of debug files fetched from the debuginfod servers.",
            ),
            debuginfod_cache_bytes: gauge(
                registry,
                "smolder_agent_symbolize_debuginfod_cache_bytes",
                "Bytes of debug files in the debuginfod cache.",
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
                seconds_buckets(),
            ),
            tier: tier.stage(
                "symbolize",
                &[],
                &[(DroppedUnit::Requests, DEBUGINFOD_QUEUE_FULL)],
            ),
        };
        for source in [DebugSource::Local, DebugSource::Debuginfod] {
            metrics.debug_files.with_label_values(&[source.name()]);
        }
        for outcome in super::symbolize::FETCH_OUTCOMES {
            metrics.debuginfod_fetches.with_label_values(&[outcome]);
        }
        metrics
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
    /// `smolder_agent_python_samples_total{stack}`: samples of walked processes (kept by
    /// relabelling), by what they carry: `mixed` (Python frames in place of the interpreter
    /// loop's native frames), `python_only` (the native and Python stacks did not line up: the
    /// Python frames alone), `native` (the thread ran no Python code, or the walk failed).
    pub samples: IntCounterVec,
    /// `smolder_agent_python_frames_total`: Python frames in the samples that carry them.
    pub frames: IntCounter,
    /// `smolder_agent_python_read_failures_total{reason}`: what could not be read, by reason.
    /// Samples without their Python frames: `thread_state`, `frame`, `thread_limit`; samples
    /// with them cut at 128 frames: `truncated`; frames
    /// whose name could not be read: `read`, `not_code`, `not_string`, `stale_code`,
    /// `unknown_process`; processes that could not be inspected: `binary`, `open_memory`,
    /// `unmapped`.
    pub read_failures: IntCounterVec,
    /// `smolder_agent_python_cached_names`: frame names held for all CPython processes (at most
    /// 131,072; 16,384 per process).
    pub cached_names: IntGauge,
    /// `smolder_agent_python_names_evicted_total`: frame names dropped to stay under those
    /// bounds (read again from a live process when it needs them).
    pub names_evicted: IntCounter,
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
                "Samples of walked CPython processes, by the stack they carry (mixed, python_only or native).",
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
            cached_names: gauge(
                registry,
                "smolder_agent_python_cached_names",
                "Frame names held for all CPython processes.",
            ),
            names_evicted: counter(
                registry,
                "smolder_agent_python_names_evicted_total",
                "Frame names dropped to keep the name caches under their bounds.",
            ),
        };
        for version in PYTHON_VERSIONS {
            metrics
                .processes_found
                .with_label_values(&[version, "supported"]);
        }
        for stack in ["mixed", "python_only", "native"] {
            metrics.samples.with_label_values(&[stack]);
        }
        // The reasons a walked sample or a frame's name can fail exist from the start, so that
        // "nothing failed" reads as 0 rather than as a missing series.
        for reason in [
            "thread_state",
            "frame",
            "thread_limit",
            "truncated",
            "read",
            "not_code",
            "not_string",
            "stale_code",
            "unknown_process",
        ] {
            metrics.read_failures.with_label_values(&[reason]);
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

/// What the eBPF source reports to: its metrics, and the agent's health, which its threads
/// (`ebpf`, `unwind`, `symbolize`) register with.
#[derive(Clone)]
pub struct SourceMetrics {
    /// The sampler's metrics, with the unwind tables'.
    pub ebpf: EbpfMetrics,
    /// The symbolizer's metrics.
    pub symbolize: SymbolizeMetrics,
    /// The Python walk's metrics.
    pub python: PythonMetrics,
    /// The agent's heartbeats.
    pub health: Health,
}

impl SourceMetrics {
    /// The source's metrics alone, in a registry of their own with the tier's counters and a
    /// [`Health`], as `smolder-agent record` and unit tests report.
    pub(crate) fn standalone() -> (Registry, SourceMetrics) {
        let registry = Registry::new();
        let tier = TierCounters::new(&registry);
        let metrics = SourceMetrics {
            ebpf: EbpfMetrics::new(&registry, &tier),
            symbolize: SymbolizeMetrics::new(&registry, &tier),
            python: PythonMetrics::new(&registry),
            health: Health::new("agent", &registry),
        };
        (registry, metrics)
    }
}
