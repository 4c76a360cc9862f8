//! The eBPF source's loop body, driven by the `smolder-ebpf` thread (and by `record`): reads
//! process events and samples as they come, and at each window boundary turns the window's
//! samples into profiles.
//!
//! Input: the kernel's ring buffers, through the [`Sampler`]. Output: one [`Profile`] per series
//! per window. Owns the sampler, the unwinder's handle, the symbolizer's handle, the process
//! table, the CPython processes ([`Pythons`]) and the window's samples.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use prometheus::local::LocalHistogram;
use smolder_agent_ebpf::unwind::Status;
use smolder_common::Profile;
use smolder_daemon::Heartbeat;
use tracing::{debug, info_span, warn};

use super::offcpu::{Throttle, monotonic_ns};
use super::process::{Labeller, ProcessInfo, Processes, process_start_time};
use super::python::Pythons;
use super::samples::{KindCounts, UnwindCounts, WindowSamples};
use super::symbolize::{DebugDirs, Symbolizer};
use super::unwind::{Ready, Reporting, Unwinder};
use super::{
    EbpfMetrics, ProcessEvent, ProcessEventKind, SampleKind, Sampler, SourceConfig, SourceMetrics,
    memory, metrics, profiles,
};
use crate::relabel::Relabeler;

/// How often process events and samples are read. It bounds how long a new process can run
/// before its memory map is captured (a process that lives shorter than this may go
/// unsymbolized) and how full the samples ring buffer gets (at 99 Hz, 64 CPUs fill 2 MiB of
/// 300-byte samples in about 3 s), and costs 20 wake-ups a second.
pub(super) const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The `symbolize` loop's period: it beats between requests, between the processes of a
/// window and every period while idle; one process's binaries (a first read of a large debug
/// file) take seconds at most. Stuck after three periods.
const SYMBOLIZE_PERIOD: Duration = Duration::from_secs(10);
/// The unwinder's heartbeat period: it beats every half second when idle, but one table of a
/// very large binary (a browser's, a JIT's) takes seconds to build.
const UNWIND_PERIOD: Duration = Duration::from_secs(30);

/// The sampler, the unwinder, the symbolizer and what they know, driven by one thread.
pub(super) struct Collector {
    sampler: Sampler,
    window: WindowSamples,
    /// `None` with `ebpf.unwind.enabled: false`: frame pointers only.
    unwinder: Option<Unwinder>,
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
    /// Keeps off-CPU unwinds under `ebpf.off-cpu.max-unwinds-per-second`; `None` with
    /// off-CPU disabled.
    throttle: Option<Throttle>,
    /// `ebpf.off-cpu.run-queue`, as the kernel's flags.
    off_cpu_flags: u32,
    /// What the off-CPU and memory samples came to since the last drain.
    kinds: KindCounts,
    /// The CPython processes walked; `None` with `ebpf.python.enabled: false`.
    python: Option<Pythons>,
    /// Processes learned and not yet looked at for CPython.
    python_pending: Vec<u32>,
    /// Processes whose tables went in, for `record`'s report; `None` in the daemon, which
    /// reports them in metrics only.
    pub(super) ready: Option<Vec<Ready>>,
}

/// The processes running now that the relabel rules keep (kernel threads and the agent aside).
fn running(labeller: &Labeller) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|&pid| {
            ProcessInfo::read(Path::new("/proc"), pid)
                .is_ok_and(|info| info.exe.is_some() && labeller.labels(&info).is_some())
        })
        .collect()
}

/// Has the kernel take (or stop taking) off-CPU and memory-growth samples of `pid`. A map
/// that cannot be written (full) loses that process's samples, not the agent.
fn follow(sampler: &mut Sampler, metrics: &EbpfMetrics, pid: u32, profiled: bool) {
    if let Err(err) = sampler.follow(pid, profiled) {
        metrics.tier.error("profiled_map");
        warn!(pid, error = %err, "the kernel's table of profiled processes could not be written");
    }
}

impl Collector {
    /// Loads the sampler and starts the unwinder and the symbolizer; `data_dir` holds their disk
    /// caches (none: nothing is kept across starts).
    pub(super) fn new(
        config: SourceConfig<'_>,
        metrics: &SourceMetrics,
        data_dir: Option<&Path>,
    ) -> anyhow::Result<Collector> {
        let relabeler =
            Relabeler::new(&config.ebpf.relabel_configs).context("ebpf.relabel-configs")?;
        let mut sampler = super::Sampler::load(config.ebpf, std::process::id())?;
        let debuginfod_cache = data_dir.map(|dir| dir.join("debuginfod"));
        let debug = DebugDirs {
            dirs: config.symbolize.debug_dirs.clone(),
            downloaded: debuginfod_cache.clone(),
        };
        let unwinder = if config.ebpf.unwind.enabled {
            let maps = sampler.take_unwind_maps()?;
            let cache = data_dir.map(|dir| dir.join("unwind"));
            Some(Unwinder::start(
                maps,
                &config.ebpf.unwind,
                config.ebpf.exit_grace,
                cache.as_deref(),
                debug.clone(),
                Reporting {
                    metrics: metrics.ebpf.unwind.clone(),
                    errors: metrics.ebpf.tier.clone(),
                    heartbeat: metrics.health.register("unwind", UNWIND_PERIOD),
                },
            )?)
        } else {
            None
        };
        let labeller = Labeller::new(relabeler, config.hostname);
        let follows = config.ebpf.off_cpu.enabled || config.ebpf.memory.enabled;
        let preloads = unwinder.is_some() && config.ebpf.unwind.load_at_start;
        if follows || preloads {
            let running = running(&labeller);
            // A process asleep since before the start is followed from its next switch, not
            // only once a CPU sample or a switch announced it.
            for &pid in &running {
                follow(&mut sampler, &metrics.ebpf, pid, true);
            }
            if let Some(unwinder) = &unwinder
                && preloads
            {
                unwinder.preload(running);
            }
        }
        let symbolizer = Symbolizer::start(
            config.symbolize.clone(),
            debug,
            metrics.symbolize.clone(),
            metrics.health.register("symbolize", SYMBOLIZE_PERIOD),
        )?;
        let throttle = config
            .ebpf
            .off_cpu
            .enabled
            .then(|| Throttle::new(&config.ebpf.off_cpu, Instant::now()));
        if let Some(throttle) = &throttle {
            metrics.ebpf.off_cpu_probability.set(throttle.probability());
        }
        Ok(Collector {
            sampler,
            window: WindowSamples::new(config.ebpf.off_cpu.min_duration, memory::page_size()),
            throttle,
            off_cpu_flags: config.ebpf.off_cpu.flags(),
            kinds: KindCounts::default(),
            unwinder,
            symbolizer,
            labeller,
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
            ready: None,
        })
    }

    /// Reads the labels of `pid` and has its memory map captured and its tables loaded; `exec`
    /// says it exec'd, so that what is known of it is stale.
    fn learn(&mut self, pid: u32, exec: bool) -> anyhow::Result<()> {
        match ProcessInfo::read(Path::new("/proc"), pid) {
            // Sampled again after its exit event, while the kernel tears it down: the same
            // process (same start time), not a new one reusing the pid, and it can no longer be
            // read properly (its executable link is gone).
            Ok(info) if !exec && self.processes.start_time(pid) == Some(info.start_time) => {}
            Ok(info) => {
                let labels = self.labeller.labels(&info);
                follow(&mut self.sampler, &self.metrics, pid, labels.is_some());
                if labels.is_some() {
                    self.symbolizer.capture(pid)?;
                    if let Some(unwinder) = &self.unwinder {
                        if exec {
                            unwinder.exec(pid, info.start_time);
                        } else {
                            unwinder.seen(pid, info.start_time);
                        }
                    }
                }
                if let Some(python) = &mut self.python {
                    if labels.is_some() {
                        self.python_pending.push(pid);
                    } else {
                        python.forget(pid);
                        self.sampler.unregister_python(pid);
                    }
                }
                self.processes.seen(pid, labels, info.start_time);
            }
            Err(err) => debug!(pid, error = %err, "process gone before it was read"),
        }
        Ok(())
    }

    /// Handles the process events and reads the samples the kernel queued.
    fn poll(&mut self) -> anyhow::Result<()> {
        let mut events = std::mem::take(&mut self.events);
        self.sampler.poll_events(&mut events);
        let now = Instant::now();
        let mut exited = HashSet::new();
        for event in events.drain(..) {
            match event.kind {
                // Announced again after the kernel's LRU forgot it (the same start time); a pid
                // that exited, or whose exit event was lost, and is announced again has been
                // reused by a new process.
                ProcessEventKind::FirstSight
                    if self.processes.is_alive(event.pid)
                        && process_start_time(event.pid)
                            .is_none_or(|t| self.processes.start_time(event.pid) == Some(t)) => {}
                ProcessEventKind::FirstSight => self.learn(event.pid, false)?,
                ProcessEventKind::Exec => self.learn(event.pid, true)?,
                ProcessEventKind::Exit => {
                    exited.insert(event.pid);
                    follow(&mut self.sampler, &self.metrics, event.pid, false);
                    self.processes.exited(event.pid, now, self.drained);
                    if let Some(unwinder) = &self.unwinder {
                        unwinder.exited(event.pid);
                    }
                }
            }
        }
        self.events = events;
        self.detect_python();
        let window = &mut self.window;
        let malformed = self.sampler.read_samples(|sample| window.add(sample));
        if malformed > 0 {
            self.metrics.tier.error("malformed_sample");
            warn!(
                records = malformed,
                "the samples ring buffer held records shorter than a sample"
            );
        }
        let new_python = self.window.take_new_python();
        if let Some(python) = &mut self.python {
            for (pid, frames) in new_python {
                python.read_names(pid, &frames);
            }
        }
        // After the samples: a thread's switch-in is read before its process's exit is acted on.
        if !exited.is_empty() {
            self.window.forget(&exited);
        }
        self.throttle(now)?;
        if let Some(unwinder) = &self.unwinder {
            unwinder.missed(self.window.take_misses());
            let ready = unwinder.take_ready();
            if let Some(kept) = &mut self.ready {
                kept.extend(ready);
            }
        } else {
            self.window.take_misses();
        }
        Ok(())
    }

    /// Adapts the off-CPU probability to the unwinds seen, and sets it in the kernel when it
    /// changes.
    fn throttle(&mut self, now: Instant) -> anyhow::Result<()> {
        let kinds = self.window.take_kinds();
        self.kinds.add(&kinds);
        let Some(throttle) = &mut self.throttle else {
            return Ok(());
        };
        if let Some(probability) =
            throttle.observe(kinds.off_cpu_unwinds, kinds.off_cpu_switches, now)
        {
            self.sampler
                .set_off_cpu(probability, self.off_cpu_flags)
                .context("setting the off-CPU probability")?;
            self.metrics.off_cpu_probability.set(probability);
            debug!(probability, "off-CPU probability changed");
        }
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
                continue;
            };
            if let Err(err) = self.sampler.register_python(pid, &entry) {
                self.metrics.tier.error("python_register");
                warn!(pid, error = %err, "the process keeps native stacks");
                python.forget(pid);
            }
        }
    }

    /// Sleeps until `deadline`, handling events and samples every poll interval and beating
    /// `beat` after each.
    pub(super) fn poll_until(
        &mut self,
        deadline: Instant,
        stop: &AtomicBool,
        beat: &Heartbeat,
    ) -> anyhow::Result<()> {
        loop {
            self.poll()?;
            beat.beat();
            let now = Instant::now();
            if now >= deadline || stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            std::thread::sleep(POLL_INTERVAL.min(deadline - now));
        }
    }

    /// Takes the window's samples and returns one profile per series over `[from, until)`,
    /// beating `beat` while the symbolizer works. A window the symbolizer fails on (it panicked
    /// and is restarting) yields no profiles; its samples are counted as dropped.
    pub(super) fn drain(
        &mut self,
        from: SystemTime,
        until: SystemTime,
        beat: &Heartbeat,
    ) -> anyhow::Result<Vec<Profile>> {
        let _span = info_span!("drain").entered();
        self.poll()?;
        let started = Instant::now();
        // The window's end on the kernel's clock: threads still waiting count up to it.
        let (mono, wall) = (monotonic_ns(), SystemTime::now());
        let boundary = match wall.duration_since(until) {
            Ok(past) => mono.saturating_sub(u64::try_from(past.as_nanos()).unwrap_or(u64::MAX)),
            Err(ahead) => {
                mono.saturating_add(u64::try_from(ahead.duration().as_nanos()).unwrap_or(u64::MAX))
            }
        };
        self.window.close(boundary);
        let samples = self.window.take();
        let counts = self.window.take_counts();
        self.metrics
            .dropped(metrics::WINDOW_STACKS_FULL, self.window.take_dropped());
        self.read_counters();
        self.metrics
            .drain_duration
            .observe(started.elapsed().as_secs_f64());
        self.metrics.drains.inc();

        let cpu: u64 = samples
            .iter()
            .filter(|s| s.kind == SampleKind::Cpu)
            .map(|s| s.samples)
            .sum();
        self.metrics.samples.inc_by(cpu);
        self.count_kinds();
        let mut relabel_dropped = 0;
        let mut unknown = 0;
        let mut kept = Vec::with_capacity(samples.len());
        let mut sampled = HashSet::new();
        for sample in samples {
            if !self.processes.contains(sample.pid) {
                // Its first-sight event was lost or came after the drain began.
                self.learn(sample.pid, false)?;
            }
            match self.processes.labels(sample.pid) {
                Some(Some(_)) => {
                    sampled.insert(sample.pid);
                    kept.push(sample);
                }
                Some(None) => relabel_dropped += sample.samples,
                None => unknown += sample.samples,
            }
        }
        self.metrics.dropped(metrics::RELABEL, relabel_dropped);
        self.metrics.dropped(metrics::UNKNOWN_PROCESS, unknown);
        let mut profiled = UnwindCounts::default();
        for (pid, counts) in &counts {
            if sampled.contains(pid) {
                profiled.add(counts);
            }
        }
        self.count(&profiled);
        if let Some(unwinder) = &self.unwinder {
            unwinder.sampled(sampled.into_iter().collect());
        }
        if let Some(python) = &mut self.python {
            python.mix(&mut kept, &profiled.python);
        }

        let submitted: u64 = kept.iter().map(|s| s.samples).sum();
        let pending = self.symbolizer.submit(kept)?;
        let symbolized = loop {
            match pending.wait_for(POLL_INTERVAL) {
                Ok(Some(answer)) => break answer,
                Ok(None) => {
                    self.poll()?;
                    beat.beat();
                }
                Err(err) => {
                    self.metrics.tier.error("symbolize");
                    self.metrics.dropped(metrics::SYMBOLIZER_FAILED, submitted);
                    warn!(error = %err, samples = submitted, "the symbolizer failed on this window; its samples are dropped");
                    break Vec::new();
                }
            }
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

    /// Counts how the window's samples of profiled processes were unwound.
    fn count(&self, counts: &UnwindCounts) {
        for status in Status::ALL {
            self.metrics
                .unwind_samples
                .with_label_values(&[status.name()])
                .inc_by(counts.outcomes[status as usize]);
        }
        let frames: LocalHistogram = self.metrics.unwind_frames.local();
        for (&len, &samples) in &counts.frames {
            for _ in 0..samples {
                frames.observe(f64::from(len));
            }
        }
        frames.flush();
        self.metrics.unwind_fp_frames.inc_by(counts.fp_frames);
    }

    /// Counts what the off-CPU and memory samples came to since the last drain.
    fn count_kinds(&mut self) {
        let kinds = std::mem::take(&mut self.kinds);
        let m = &self.metrics;
        m.off_cpu_unwinds.inc_by(kinds.off_cpu_unwinds);
        m.off_cpu_waiting
            .set(i64::try_from(self.window.waiting()).unwrap_or(i64::MAX));
        m.memory_samples.inc_by(kinds.memory_samples);
        m.memory_huge_samples.inc_by(kinds.memory_huge);
        m.memory_unclassified_samples
            .inc_by(kinds.memory_unclassified);
        m.dropped(metrics::MIN_DURATION, kinds.off_cpu_too_short);
        m.dropped(metrics::UNMATCHED_SWITCH_IN, kinds.off_cpu_unmatched);
        m.dropped(metrics::WAITING_FULL, kinds.off_cpu_pending_full);
    }

    /// Counts what the kernel lost, and where the walks found their rows, since the last
    /// drain.
    fn read_counters(&mut self) {
        match self.sampler.read_counters() {
            Ok(counts) => {
                self.metrics
                    .dropped(metrics::RING_BUFFER_FULL, counts.lost_samples);
                self.metrics.lost_events.inc_by(counts.lost_events);
                let [cache, table] = metrics::ROW_SOURCES;
                let rows = &self.metrics.unwind_rows;
                rows.with_label_values(&[cache]).inc_by(counts.rows_cached);
                rows.with_label_values(&[table])
                    .inc_by(counts.rows_searched);
                if counts.lost_samples > 0 {
                    warn!(
                        samples = counts.lost_samples,
                        "the eBPF samples ring buffer was full; samples were lost"
                    );
                }
            }
            Err(err) => {
                self.metrics.tier.error("read_counters");
                warn!(error = %err, "reading the eBPF kernel counters failed");
            }
        }
    }
}
