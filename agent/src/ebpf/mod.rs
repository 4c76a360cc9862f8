//! The eBPF source: every process on the host, sampled in the kernel with its whole stack,
//! symbolized and labelled, as one profile per series and window.
//!
//! Input: the `ebpf:` and `symbolize:` config sections. Output: [`Profile`](smolder_common::Profile)s, one per series
//! (process labels and [`SampleKind`]: `<service_name>.cpu`, and with their sections enabled
//! `.off_cpu`, `.run_queue` and `.memory_growth`) and window, submitted to the
//! window loop at every window boundary ([`start`]), or returned by [`record`] for
//! `smolder-agent record`. Caller: [`crate::app`] and the `record` subcommand. Owns the
//! `smolder-ebpf` thread, which owns the [`Sampler`] (the BPF object, its perf events and maps),
//! an [`Unwinder`] and a [`Symbolizer`](symbolize::Symbolizer) (each with its own thread) and the table of known
//! [`Processes`](process::Processes).
//!
//! The kernel sends every sample through a ring buffer with its user stack, walked by the BPF
//! unwinder from the unwind tables of the process's binaries (or with frame pointers where no
//! table applies yet), and its kernel stack. The thread reads process events and samples every
//! 50 ms: a process's first sample makes it read the process's labels ([`process`]), have the
//! symbolizer capture its memory map and the unwinder load its tables while it still runs; an
//! exit starts its grace period. Samples are counted per distinct stack; at every window
//! boundary ([`window_start`]) the window's stacks are symbolized, merged into one tree per
//! series and submitted with `from`/`until` = the window. Events and samples keep being read
//! while the symbolizer works.
//!
//! Files follow the data's path. The kernel objects (see `agent-ebpf/src/unwind.h` and
//! `process.h`), each read by its own file: [`loader`] loads and attaches the programs, checks
//! capabilities and probes kernel features, `samples.rs` reads the samples ring buffer and
//! counts a window's stacks, `events.rs` reads the process-event ring buffer, `counters.rs` the
//! per-CPU loss counters. [`offcpu`] joins the off-CPU switch-outs and switch-ins and keeps the
//! unwind rate under its limit; [`memory`] sizes page-fault samples. Then [`unwind`] (the
//! tables' lifecycle), [`process`] (the process table and labels from `/proc`), `collector.rs`
//! (the loop body), [`symbolize`] (addresses to names), `profiles.rs` (symbolized samples to one
//! tree per series and kind), `record.rs` (`smolder-agent record`'s output), [`python`]
//! (CPython processes: their release, threads and frames read from their memory, Python frames
//! mixed into the native stacks of every kind) and [`metrics`] (`smolder_agent_ebpf_*`,
//! `smolder_agent_symbolize_*`, `smolder_agent_python_*`). `sample.rs` holds what every stage
//! of this source passes on: [`SampleKind`], [`Stack`], [`StackCount`].

mod cache_dir;
mod collector;
mod counters;
mod events;
pub mod loader;
pub mod memory;
pub mod metrics;
pub mod offcpu;
pub mod process;
mod profiles;
pub mod python;
mod record;
mod sample;
pub mod samples;
pub mod symbolize;
pub mod unwind;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use smolder_daemon::{Heartbeat, Supervised, supervise};
use tracing::{info_span, warn};

pub use counters::KernelCounts;
pub use events::{ProcessEvent, ProcessEventKind};
pub use loader::{EbpfError, Sampler, UnwindMaps};
pub use memory::MemoryConfig;
pub use metrics::{EbpfMetrics, PythonMetrics, SourceMetrics, SymbolizeMetrics};
pub use offcpu::OffCpuConfig;
pub use record::{ProcessReady, RecordFormat, Recording, print_record, record};
pub use sample::{PythonFrames, SPY_NAME, SampleKind, Splice, Stack, StackCount};
pub use unwind::{Reporting, UnwindConfig, Unwinder};

use self::collector::Collector;
use self::python::PythonConfig;
use self::symbolize::SymbolizeConfig;
use crate::relabel::RelabelConfig;
use crate::window::{Submitter, window_start};

/// The eBPF source's settings (`ebpf:` in the config file).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct EbpfConfig {
    /// Whether the eBPF source runs: every process's CPU stacks, and the off-CPU and memory
    /// profiles their own sections enable. `false` turns all three off. Default `true`.
    pub enabled: bool,
    /// Samples per second on each CPU. Default `99`: a prime just under 100 Hz, so that sampling
    /// does not fall in lock-step with periodic work.
    pub frequency: u64,
    /// Prometheus `relabel_configs` over each process's `__meta_process_*` labels (`comm`, `exe`,
    /// `cmdline`, `pid`, `cgroup`, `systemd_unit`, `container_id`, `user`) and the preset
    /// `service_name`, `hostname`, `systemd_unit`, `container_id` labels. A dropped process is
    /// not profiled. Default: none.
    pub relabel_configs: Vec<RelabelConfig>,
    /// User frames a stack keeps, 1 to 256. Default `128`. A deeper stack keeps its leaf part
    /// under a `[truncated]` root; the walk costs about 65 ns per frame (BENCHMARKS.md).
    pub max_frames: u32,
    /// The unwind tables (whole stacks for code built without frame pointers).
    pub unwind: UnwindConfig,
    /// Off-CPU profiles: where threads wait (`<service>.off_cpu`). Off by default.
    pub off_cpu: OffCpuConfig,
    /// Memory-growth profiles: where memory is first touched (`<service>.memory_growth`). Off
    /// by default.
    pub memory: MemoryConfig,
    /// How long an exited process's labels, memory map and unwind mappings are kept for its
    /// last samples. Default `30s`; they are kept at least until the drain after the exit in
    /// any case.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub exit_grace: Duration,
    /// Python stacks of CPython processes.
    pub python: PythonConfig,
    /// Deprecated and ignored: samples leave the kernel one by one through a ring buffer and
    /// are counted per window in user space, so there is no counts map to size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counts_map_entries: Option<u32>,
    /// Deprecated and ignored: user stacks are walked by the agent's own unwinder and kernel
    /// stacks sent with each sample, so there is no stack map to size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack_map_entries: Option<u32>,
}

impl Default for EbpfConfig {
    fn default() -> Self {
        EbpfConfig {
            enabled: true,
            frequency: 99,
            relabel_configs: Vec::new(),
            max_frames: smolder_agent_ebpf::unwind::DEFAULT_FRAMES,
            unwind: UnwindConfig::default(),
            off_cpu: OffCpuConfig::default(),
            memory: MemoryConfig::default(),
            exit_grace: Duration::from_secs(30),
            python: PythonConfig::default(),
            counts_map_entries: None,
            stack_map_entries: None,
        }
    }
}

impl EbpfConfig {
    /// Checks the settings that have a range, so that `check-config` refuses what the loader
    /// would.
    ///
    /// # Errors
    ///
    /// [`EbpfError::Frequency`] for a zero `frequency`, [`EbpfError::MaxFrames`] for
    /// `max-frames` of 0 or above what a sample holds.
    pub fn validate(&self) -> Result<(), EbpfError> {
        if self.frequency == 0 {
            return Err(EbpfError::Frequency);
        }
        if self.max_frames == 0 || self.max_frames as usize > smolder_agent_ebpf::unwind::MAX_FRAMES
        {
            return Err(EbpfError::MaxFrames {
                value: self.max_frames,
                max: smolder_agent_ebpf::unwind::MAX_FRAMES,
            });
        }
        Ok(())
    }

    /// The deprecated keys this config sets.
    pub fn deprecated_keys(&self) -> Vec<&'static str> {
        let mut keys = Vec::new();
        if self.counts_map_entries.is_some() {
            keys.push("ebpf.counts-map-entries");
        }
        if self.stack_map_entries.is_some() {
            keys.push("ebpf.stack-map-entries");
        }
        keys
    }

    /// Logs a warning for each deprecated key this config sets.
    pub(crate) fn warn_deprecated(&self) {
        for key in self.deprecated_keys() {
            warn!(
                key,
                "deprecated config key, ignored since stacks leave the kernel through a ring buffer; delete it"
            );
        }
    }
}

/// What the eBPF source reads of the agent's configuration: its own sections, the hostname
/// label and the window length. `config.rs` makes one from the whole file
/// (`TryFrom<&Config>`, which reads the kernel's hostname when none is configured).
#[derive(Clone, Debug)]
pub struct SourceConfig<'a> {
    /// The `ebpf:` section.
    pub ebpf: &'a EbpfConfig,
    /// The `symbolize:` section.
    pub symbolize: &'a SymbolizeConfig,
    /// The `hostname` label of every series, resolved (the configured one, else the kernel's).
    pub hostname: String,
    /// `window.length`: the source's windows are the window loop's.
    pub window_length: Duration,
}

/// The running eBPF source.
pub struct EbpfSource {
    stop: Arc<AtomicBool>,
    thread: Supervised,
}

impl EbpfSource {
    /// Stops sampling, submits what was sampled since the last window boundary and returns once
    /// the thread has ended. Blocks for up to one poll interval plus a drain (or a restart's
    /// backoff, if the loop failed just before).
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join();
    }
}

/// The `ebpf` loop's period: it beats every poll (50 ms), and while a drain waits for the
/// symbolizer; a drain's own work (closing the window, building the trees) takes well under a
/// second on a busy host. Stuck after three periods.
const PERIOD: Duration = Duration::from_secs(5);

/// Loads the sampler and starts the `smolder-ebpf` thread, which submits a profile per series
/// at every window boundary; the unwinder's and debuginfod's caches live in `data_dir`. The
/// thread is the health loop `ebpf`, supervised: a panic or an error of its loop restarts it
/// (same sampler, a new window) after a backoff.
///
/// # Errors
///
/// When the sampler cannot be loaded (the error names missing capabilities or kernel
/// features), the relabel rules are invalid or a thread cannot be started.
pub fn start(
    config: SourceConfig<'_>,
    submitter: Submitter,
    metrics: &SourceMetrics,
    data_dir: Option<&Path>,
) -> anyhow::Result<EbpfSource> {
    let length = config.window_length;
    let mut collector = Collector::new(config, metrics, data_dir)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    let heartbeat = metrics.health.register("ebpf", PERIOD);
    let thread = supervise(heartbeat, "smolder-ebpf", move |beat| {
        let _span = info_span!("ebpf").entered();
        // Never waits: a profile the window loop has no room for is dropped and counted there,
        // and sampling goes on.
        let mut submit = |profiles: Vec<_>| {
            profiles
                .into_iter()
                .all(|profile| submitter.try_submit(profile).is_ok())
        };
        sample_windows(&mut collector, length, &stopping, beat, &mut submit)
    })
    .context("starting the eBPF sampler thread")?;
    Ok(EbpfSource { stop, thread })
}

/// Runs windows of `length` until `stop`, handing each window's profiles to `submit`, which
/// says whether to go on; beats `beat` all along.
fn sample_windows(
    collector: &mut Collector,
    length: Duration,
    stop: &AtomicBool,
    beat: &Heartbeat,
    submit: &mut dyn FnMut(Vec<smolder_common::Profile>) -> bool,
) -> anyhow::Result<()> {
    let mut from = SystemTime::now();
    loop {
        let boundary = window_start(SystemTime::now(), length) + length;
        let wait = boundary
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        collector.poll_until(Instant::now() + wait, stop, beat)?;
        let stopping = stop.load(Ordering::Relaxed);
        let until = if stopping {
            SystemTime::now()
        } else {
            boundary
        };
        match collector.drain(from, until, beat) {
            Ok(profiles) => {
                if !submit(profiles) {
                    return Ok(());
                }
            }
            // A failed drain loses that window's samples; the next one starts clean.
            Err(err) => warn!(
                error = format!("{err:#}"),
                "draining the eBPF sampler failed"
            ),
        }
        if stopping {
            return Ok(());
        }
        from = until;
    }
}
