//! The eBPF source: every process on the host, sampled in the kernel, symbolized and labelled,
//! as one profile per series and window.
//!
//! Input: the `ebpf:` and `symbolize:` config sections. Output: [`Profile`]s, one per series
//! (process labels and [`SampleKind`]: `<service_name>.cpu` today) and window, submitted to the
//! window loop at every window boundary ([`start`]), or returned by [`record`] for
//! `smolder-agent record`. Caller: [`crate::app`] and the `record` subcommand. Owns the
//! `smolder-ebpf` thread, which owns the [`Sampler`] (the BPF object, its perf events and maps),
//! a [`Symbolizer`] (with its own thread) and the table of known [`Processes`].
//!
//! The thread reads process events every 50 ms: a process's first sample makes it read the
//! process's labels ([`process`]) and have the symbolizer capture its memory map while it still
//! runs; an exit starts its grace period. At every window boundary ([`window_start`]) it drains
//! the sampler, symbolizes the samples, merges them into one tree per series and submits them
//! with `from`/`until` = the window. It keeps reading events while the symbolizer works, so
//! processes born during a drain are captured too.
//!
//! Files follow the data's path. The kernel objects (see `agent-ebpf/src/sampler.h`), each
//! read by its own file: [`loader`] loads and attaches the programs and checks capabilities,
//! `counts.rs` drains the double-buffered counts and stacks maps into [`StackCount`]s,
//! `events.rs` reads the process-event ring buffer, `errors.rs` the per-CPU error counters.
//! Then [`process`] (the process table and labels from `/proc`), [`symbolize`] (addresses to
//! names), [`python`] (CPython processes: their release, threads and frames read from their
//! memory), `profiles.rs` (symbolized samples to one tree per series and kind) and [`metrics`]
//! (`smolder_agent_ebpf_*`, `smolder_agent_symbolize_*`). `sample.rs` holds what every stage
//! of this source passes on: [`SampleKind`], [`Stack`], [`StackCount`].

mod counts;
mod errors;
mod events;
pub mod loader;
pub mod metrics;
pub mod process;
mod profiles;
pub mod python;
mod sample;
pub mod symbolize;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use smolder_common::Profile;
use tracing::{debug, info_span, warn};

pub use errors::ErrorCounts;
pub use events::{ProcessEvent, ProcessEventKind};
pub use loader::{EbpfError, Sampler};
pub use metrics::{EbpfMetrics, PythonMetrics, SymbolizeMetrics};
pub use sample::{SPY_NAME, SampleKind, Stack, StackCount};

use self::process::{Labeller, ProcessInfo, Processes};
use self::python::{PythonConfig, Pythons, StackEvent};
use self::symbolize::Symbolizer;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::relabel::{RelabelConfig, Relabeler};
use crate::window::{Submitter, window_start};

/// How often process events are read. It bounds how long a new process can run before its
/// memory map is captured (a process that lives shorter than this may go unsymbolized), and
/// costs 20 wake-ups a second, which is nothing next to a drain.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The eBPF source's settings (`ebpf:` in the config file).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct EbpfConfig {
    /// Whether the agent samples every process's CPU stacks. Default `true`.
    pub enabled: bool,
    /// Samples per second on each CPU. Default `99`: a prime just under 100 Hz, so that sampling
    /// does not fall in lock-step with periodic work.
    pub frequency: u64,
    /// Prometheus `relabel_configs` over each process's `__meta_process_*` labels (`comm`, `exe`,
    /// `cmdline`, `pid`, `cgroup`, `systemd_unit`, `container_id`, `user`) and the preset
    /// `service_name`, `hostname`, `systemd_unit`, `container_id` labels. A dropped process is
    /// not profiled. Default: none.
    pub relabel_configs: Vec<RelabelConfig>,
    /// Distinct (process, user stack, kernel stack) keys each of the two counts maps holds per
    /// window. Default `16384`; a sample that finds the map full is dropped and counted in
    /// `smolder_agent_dropped_samples_total{stage="ebpf",reason="counts_map_full"}`.
    pub counts_map_entries: u32,
    /// Distinct stacks each of the two stack maps holds per window (each entry takes 1016 bytes
    /// of kernel memory). Default `16384`. A stack whose slot is taken is counted in
    /// `smolder_agent_ebpf_lost_stacks_total` and its sample kept without it.
    pub stack_map_entries: u32,
    /// How long an exited process's labels and memory map are kept for its last samples.
    /// Default `30s`; they are kept at least until the drain after the exit in any case.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub exit_grace: Duration,
    /// Python stacks of CPython processes.
    pub python: PythonConfig,
}

impl Default for EbpfConfig {
    fn default() -> Self {
        EbpfConfig {
            enabled: true,
            frequency: 99,
            relabel_configs: Vec::new(),
            counts_map_entries: smolder_agent_ebpf::COUNTS_ENTRIES,
            stack_map_entries: smolder_agent_ebpf::STACKS_ENTRIES,
            exit_grace: Duration::from_secs(30),
            python: PythonConfig::default(),
        }
    }
}

/// The sampler, the symbolizer and what they know, driven by one thread.
struct Collector {
    sampler: Sampler,
    symbolizer: Symbolizer,
    labeller: Labeller,
    processes: Processes,
    metrics: EbpfMetrics,
    /// `ebpf.frequency`, for the profiles' meta.
    frequency: u64,
    grace: Duration,
    /// Drains completed.
    drained: u64,
    events: Vec<ProcessEvent>,
    /// The CPython processes walked; `None` when `ebpf.python.enabled` is off.
    python: Option<Pythons>,
    /// Processes learned and not yet looked at for CPython.
    python_pending: Vec<u32>,
    stack_events: Vec<StackEvent>,
}

impl Collector {
    fn new(config: &Config, hostname: String, metrics: &Metrics) -> anyhow::Result<Collector> {
        let relabeler =
            Relabeler::new(&config.ebpf.relabel_configs).context("ebpf.relabel-configs")?;
        let sampler = Sampler::load(&config.ebpf, std::process::id())?;
        let symbolizer = Symbolizer::start(config.symbolize.clone(), metrics.symbolize.clone())?;
        Ok(Collector {
            sampler,
            symbolizer,
            labeller: Labeller::new(relabeler, hostname),
            processes: Processes::default(),
            metrics: metrics.ebpf.clone(),
            frequency: config.ebpf.frequency,
            grace: config.ebpf.exit_grace,
            drained: 0,
            events: Vec::new(),
            python: config
                .ebpf
                .python
                .enabled
                .then(|| Pythons::new(Path::new("/proc"), metrics.python.clone())),
            python_pending: Vec::new(),
            stack_events: Vec::new(),
        })
    }

    /// Reads the labels of `pid` and has its memory map captured; `exec` says it exec'd, so
    /// that what is known of it is stale.
    fn learn(&mut self, pid: u32, exec: bool) -> anyhow::Result<()> {
        match ProcessInfo::read(Path::new("/proc"), pid) {
            // Sampled again after its exit event, while the kernel tears it down: the same
            // process (same start time), not a new one reusing the pid, and it can no longer be
            // read properly (its executable link is gone).
            Ok(info) if !exec && self.processes.start_time(pid) == Some(info.start_time) => {}
            Ok(info) => {
                let labels = self.labeller.labels(&info);
                if labels.is_some() {
                    self.symbolizer.capture(pid)?;
                }
                if let Some(python) = &mut self.python {
                    if labels.is_some() {
                        self.python_pending.push(pid);
                    } else {
                        python.forget(pid);
                    }
                }
                self.processes.seen(pid, labels, info.start_time);
            }
            Err(err) => debug!(pid, error = %err, "process gone before it was read"),
        }
        Ok(())
    }

    /// Handles the process events queued in the kernel.
    fn poll(&mut self) -> anyhow::Result<()> {
        let mut events = std::mem::take(&mut self.events);
        self.sampler.poll_events(&mut events);
        let now = Instant::now();
        for event in events.drain(..) {
            match event.kind {
                // Announced again after the kernel's LRU forgot it; a pid that exited and is
                // announced again has been reused by a new process.
                ProcessEventKind::FirstSight if self.processes.is_alive(event.pid) => {}
                ProcessEventKind::FirstSight => self.learn(event.pid, false)?,
                ProcessEventKind::Exec => self.learn(event.pid, true)?,
                ProcessEventKind::Exit => self.processes.exited(event.pid, now, self.drained),
            }
        }
        self.events = events;
        self.detect_python();
        self.poll_python();
        Ok(())
    }

    /// Looks for CPython in the processes learned since the last call and registers those it
    /// walks. After the events are handled, so that every new process's memory map is captured
    /// first: a short-lived process must not wait for others' detection.
    fn detect_python(&mut self) {
        let Some(python) = &mut self.python else {
            return;
        };
        for pid in self.python_pending.drain(..) {
            let Some(entry) = python.learn(pid) else {
                python.forget(pid);
                continue;
            };
            if let Err(err) = self.sampler.register_python(pid, &entry) {
                self.metrics.tier.error("python_register");
                warn!(pid, error = %err, "the process keeps native stacks");
                python.forget(pid);
            }
        }
    }

    /// Takes the new Python stacks the kernel sent, naming their frames while their processes
    /// run.
    fn poll_python(&mut self) {
        let Some(python) = &mut self.python else {
            return;
        };
        self.sampler.poll_python_events(&mut self.stack_events);
        for event in self.stack_events.drain(..) {
            python.stack_sent(event);
        }
    }

    /// Sleeps until `deadline`, handling process events every poll interval.
    fn poll_until(&mut self, deadline: Instant, stop: &AtomicBool) -> anyhow::Result<()> {
        loop {
            self.poll()?;
            let now = Instant::now();
            if now >= deadline || stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            std::thread::sleep(POLL_INTERVAL.min(deadline - now));
        }
    }

    /// Drains the sampler and returns one profile per series over `[from, until)`.
    fn drain(&mut self, from: SystemTime, until: SystemTime) -> anyhow::Result<Vec<Profile>> {
        let _span = info_span!("drain").entered();
        self.poll()?;
        let started = Instant::now();
        let mut samples = match self.sampler.drain() {
            Ok(samples) => samples,
            Err(err) => {
                self.metrics.tier.error("drain");
                return Err(err.into());
            }
        };
        // Every stack of the drained buffer was sent before the drain read it.
        self.poll_python();
        if let Some(python) = &mut self.python {
            python.name(&mut samples, self.sampler.drained_buffer());
        }
        self.metrics
            .drain_duration
            .observe(started.elapsed().as_secs_f64());
        self.metrics.drains.inc();
        self.count_errors();

        let total: u64 = samples.iter().map(|s| s.count).sum();
        self.metrics.samples.inc_by(total);
        let mut relabel_dropped = 0;
        let mut unknown = 0;
        let mut kept = Vec::with_capacity(samples.len());
        for sample in samples {
            if !self.processes.contains(sample.pid) {
                // Its first-sight event was lost or came after the drain began.
                self.learn(sample.pid, false)?;
            }
            match self.processes.labels(sample.pid) {
                Some(Some(_)) => kept.push(sample),
                Some(None) => relabel_dropped += sample.count,
                None => unknown += sample.count,
            }
        }
        self.metrics.dropped(metrics::RELABEL, relabel_dropped);
        self.metrics.dropped(metrics::UNKNOWN_PROCESS, unknown);

        let pending = self.symbolizer.submit(kept)?;
        let symbolized = loop {
            if let Some(answer) = pending.wait_for(POLL_INTERVAL)? {
                break answer;
            }
            self.poll()?;
        };
        self.drained += 1;
        let profiles =
            profiles::profiles(&symbolized, &self.processes, self.frequency, from, until);
        for pid in self
            .processes
            .purge(Instant::now(), self.drained, self.grace)
        {
            self.symbolizer.forget(pid)?;
            if let Some(python) = &mut self.python {
                python.forget(pid);
            }
        }
        self.metrics
            .processes
            .set(i64::try_from(self.processes.len()).unwrap_or(i64::MAX));
        self.metrics
            .series
            .set(i64::try_from(profiles.len()).unwrap_or(i64::MAX));
        Ok(profiles)
    }

    /// Counts what the kernel side's error counters say happened since the last drain.
    fn count_errors(&mut self) {
        match self.sampler.read_errors() {
            Ok(errors) => {
                self.metrics.kernel_errors(&errors);
                if errors.counts_full > 0 {
                    warn!(
                        samples = errors.counts_full,
                        "the eBPF counts map was full; raise ebpf.counts-map-entries"
                    );
                }
            }
            Err(err) => {
                self.metrics.tier.error("read_errors");
                warn!(error = %err, "reading the eBPF error counters failed");
            }
        }
    }
}

/// The running eBPF source.
pub struct EbpfSource {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl EbpfSource {
    /// Stops sampling, submits what was sampled since the last window boundary and returns once
    /// the thread has ended. Blocks for up to one poll interval plus a drain.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        if self.thread.join().is_err() {
            warn!("the eBPF sampler thread panicked");
        }
    }
}

/// Loads the sampler and starts the `smolder-ebpf` thread, which submits a profile per series
/// at every window boundary.
///
/// # Errors
///
/// When the sampler cannot be loaded (the error names missing capabilities), the relabel rules
/// are invalid or a thread cannot be started.
pub fn start(
    config: &Config,
    hostname: String,
    submitter: Submitter,
    metrics: &Metrics,
) -> anyhow::Result<EbpfSource> {
    let mut collector = Collector::new(config, hostname, metrics)?;
    let length = config.window.length;
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name("smolder-ebpf".to_owned())
        .spawn(move || {
            let _span = info_span!("ebpf").entered();
            if let Err(err) = sample_windows(&mut collector, length, &submitter, &stopping) {
                tracing::error!(error = format!("{err:#}"), "the eBPF sampler stopped");
            }
        })
        .context("starting the eBPF sampler thread")?;
    Ok(EbpfSource { stop, thread })
}

fn sample_windows(
    collector: &mut Collector,
    length: Duration,
    submitter: &Submitter,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let mut from = SystemTime::now();
    loop {
        let boundary = window_start(SystemTime::now(), length) + length;
        let wait = boundary
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        collector.poll_until(Instant::now() + wait, stop)?;
        let stopping = stop.load(Ordering::Relaxed);
        let until = if stopping {
            SystemTime::now()
        } else {
            boundary
        };
        match collector.drain(from, until) {
            Ok(profiles) => {
                for profile in profiles {
                    if submitter.blocking_submit(profile).is_err() {
                        return Ok(());
                    }
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

/// Samples every process for `duration` and returns one profile per series, as
/// `smolder-agent record` prints them.
///
/// # Errors
///
/// When the sampler cannot be loaded or drained.
pub fn record(config: &Config, duration: Duration) -> anyhow::Result<Vec<Profile>> {
    let metrics = Metrics::new();
    let mut collector = Collector::new(config, config.hostname()?, &metrics)?;
    let never = AtomicBool::new(false);
    let from = SystemTime::now();
    collector.poll_until(Instant::now() + duration, &never)?;
    collector.drain(from, SystemTime::now())
}

/// What `smolder-agent record` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RecordFormat {
    /// One `service_name;frame;...;leaf count` line per stack, heaviest first: the input of
    /// `flamegraph.pl` and of the aggregator's `/ingest`.
    Folded,
}

/// Samples for `duration` ([`record`]) and writes the result to `out` in `format`.
///
/// # Errors
///
/// When sampling fails or `out` cannot be written.
pub fn print_record(
    config: &Config,
    duration: Duration,
    format: RecordFormat,
    mut out: impl std::io::Write,
) -> anyhow::Result<()> {
    let profiles = record(config, duration)?;
    match format {
        RecordFormat::Folded => {
            let mut lines = Vec::new();
            for profile in &profiles {
                let service = profile.series.service();
                profile.tree.for_each_stack(|stack, value| {
                    let frames: Vec<&str> = stack
                        .iter()
                        .map(|&id| profile.tree.frames().name(id))
                        .collect();
                    lines.push((value, format!("{service};{}", frames.join(";"))));
                });
            }
            lines.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            for (value, stack) in lines {
                writeln!(out, "{stack} {value}").context("writing the recording")?;
            }
        }
    }
    out.flush().context("writing the recording")
}
