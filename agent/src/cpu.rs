//! The CPU source: eBPF samples of every process, symbolized and labelled, as one profile per
//! series and window.
//!
//! Input: the `ebpf:` and `symbolize:` config sections. Output: `<service_name>.cpu`
//! [`Profile`]s submitted to the window loop once per window ([`start`]), or returned by
//! [`record`] for `smolder-agent record`. Caller: [`crate::app`] and the `record` subcommand.
//! Owns the `smolder-ebpf` thread, which owns the [`Sampler`] and a [`Symbolizer`] (with its own
//! thread), and the table of known processes ([`Processes`]).
//!
//! The thread reads process events every 50 ms: a process's first sample makes
//! it read the process's labels ([`crate::process`]) and have the symbolizer capture its memory
//! map while it still runs; an exit starts its grace period. At every window boundary
//! ([`window_start`]) it drains the sampler, symbolizes the samples, merges them into one tree
//! per series and submits them with `from`/`until` = the window. It keeps reading events while
//! the symbolizer works, so processes born during a drain are captured too.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use smolder_common::{Aggregation, Profile, ProfileMeta, Series, Tree};
use tracing::{debug, info_span, warn};

use crate::config::Config;
use crate::ebpf::{ProcessEvent, ProcessEventKind, Sampler};
use crate::metrics::{EbpfMetrics, Metrics};
use crate::process::{Labeller, ProcessInfo};
use crate::relabel::Relabeler;
use crate::symbolize::{SymbolizedSample, Symbolizer};
use crate::window::{Submitter, window_start};

/// The spy name of the profiles, as Pyroscope's eBPF agent calls itself.
pub const SPY_NAME: &str = "ebpfspy";

/// How often process events are read. It bounds how long a new process can run before its
/// memory map is captured (a process that lives shorter than this may go unsymbolized), and
/// costs 20 wake-ups a second, which is nothing next to a drain.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A process the source knows of.
#[derive(Clone, Debug, PartialEq)]
struct Known {
    /// Its series; `None` when a relabel rule drops it.
    series: Option<Series>,
    /// When it started (`ProcessInfo::start_time`).
    start_time: u64,
    /// When it exited, and the number of the drain that was next at that moment.
    exited: Option<(Instant, u64)>,
}

/// Known processes and their lifecycle: the sans-IO core of the source. Time and drain numbers
/// come in as arguments.
#[derive(Debug, Default)]
pub struct Processes {
    known: HashMap<u32, Known>,
}

impl Processes {
    /// Records a process seen for the first time, or exec'd, with its series (`None`: dropped)
    /// and start time. A pid that exited and came back (pid reuse) starts afresh.
    pub fn seen(&mut self, pid: u32, series: Option<Series>, start_time: u64) {
        self.known.insert(
            pid,
            Known {
                series,
                start_time,
                exited: None,
            },
        );
    }

    /// The start time recorded for `pid`, if it is known.
    pub fn start_time(&self, pid: u32) -> Option<u64> {
        self.known.get(&pid).map(|known| known.start_time)
    }

    /// Whether `pid` is known (alive or in its grace period).
    pub fn contains(&self, pid: u32) -> bool {
        self.known.contains_key(&pid)
    }

    /// Whether `pid` is known and has not exited.
    pub fn is_alive(&self, pid: u32) -> bool {
        self.known
            .get(&pid)
            .is_some_and(|known| known.exited.is_none())
    }

    /// The series of `pid`: `None` if unknown, `Some(None)` if dropped by relabelling.
    pub fn series(&self, pid: u32) -> Option<Option<&Series>> {
        self.known.get(&pid).map(|known| known.series.as_ref())
    }

    /// Records that `pid` exited at `now`, while drain number `next_drain` had not started.
    pub fn exited(&mut self, pid: u32, now: Instant, next_drain: u64) {
        if let Some(known) = self.known.get_mut(&pid) {
            known.exited.get_or_insert((now, next_drain));
        }
    }

    /// Forgets processes whose exit is at least `grace` before `now` and whose last samples have
    /// been drained (`drained` drains have completed); returns their pids.
    pub fn purge(&mut self, now: Instant, drained: u64, grace: Duration) -> Vec<u32> {
        let mut gone = Vec::new();
        self.known.retain(|pid, known| match known.exited {
            Some((at, next_drain)) if drained > next_drain && now >= at + grace => {
                gone.push(*pid);
                false
            }
            _ => true,
        });
        gone
    }

    /// How many processes are known.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// Whether no process is known.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }
}

/// The sampler, the symbolizer and what they know, driven by one thread.
struct Collector {
    sampler: Sampler,
    symbolizer: Symbolizer,
    labeller: Labeller,
    processes: Processes,
    metrics: EbpfMetrics,
    meta: ProfileMeta,
    grace: Duration,
    /// Drains completed.
    drained: u64,
    events: Vec<ProcessEvent>,
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
            meta: ProfileMeta {
                spy_name: SPY_NAME.to_owned(),
                sample_rate: u32::try_from(config.ebpf.frequency).unwrap_or(u32::MAX),
                units: "samples".to_owned(),
                aggregation: Aggregation::Sum,
            },
            grace: config.ebpf.exit_grace,
            drained: 0,
            events: Vec::new(),
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
                let series = self.labeller.series(&info);
                if series.is_some() {
                    self.symbolizer.capture(pid)?;
                }
                self.processes.seen(pid, series, info.start_time);
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
        Ok(())
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
        let samples = match self.sampler.drain() {
            Ok(samples) => samples,
            Err(err) => {
                self.metrics.errors.with_label_values(&["drain"]).inc();
                return Err(err.into());
            }
        };
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
            match self.processes.series(sample.pid) {
                Some(Some(_)) => kept.push(sample),
                Some(None) => relabel_dropped += sample.count,
                None => unknown += sample.count,
            }
        }
        self.dropped("relabel", true, relabel_dropped);
        self.dropped("unknown_process", false, unknown);

        let pending = self.symbolizer.submit(kept)?;
        let symbolized = loop {
            if let Some(answer) = pending.wait_for(POLL_INTERVAL)? {
                break answer;
            }
            self.poll()?;
        };
        self.drained += 1;
        let profiles = self.profiles(symbolized, from, until);
        for pid in self
            .processes
            .purge(Instant::now(), self.drained, self.grace)
        {
            self.symbolizer.forget(pid)?;
        }
        self.metrics
            .processes
            .set(i64::try_from(self.processes.len()).unwrap_or(i64::MAX));
        self.metrics
            .series
            .set(i64::try_from(profiles.len()).unwrap_or(i64::MAX));
        Ok(profiles)
    }

    fn dropped(&self, reason: &str, intentional: bool, samples: u64) {
        if samples > 0 {
            let intentional = if intentional { "true" } else { "false" };
            self.metrics
                .dropped_samples
                .with_label_values(&[reason, intentional])
                .inc_by(samples);
        }
    }

    fn count_errors(&mut self) {
        match self.sampler.read_errors() {
            Ok(errors) => {
                self.dropped("counts_map_full", false, errors.counts_full);
                let stack = |stack: &str, reason: &str, n: u64| {
                    self.metrics
                        .stack_errors
                        .with_label_values(&[stack, reason])
                        .inc_by(n);
                };
                stack("user", "collision", errors.user_stack_collisions);
                stack("kernel", "collision", errors.kernel_stack_collisions);
                stack("user", "failed", errors.user_stack_failures);
                stack("kernel", "failed", errors.kernel_stack_failures);
                self.metrics.lost_events.inc_by(errors.events_lost);
                if errors.counts_full > 0 {
                    warn!(
                        samples = errors.counts_full,
                        "the eBPF counts map was full; raise ebpf.counts-map-entries"
                    );
                }
            }
            Err(err) => {
                self.metrics
                    .errors
                    .with_label_values(&["read_errors"])
                    .inc();
                warn!(error = %err, "reading the eBPF error counters failed");
            }
        }
    }

    fn profiles(
        &self,
        samples: Vec<SymbolizedSample>,
        from: SystemTime,
        until: SystemTime,
    ) -> Vec<Profile> {
        let mut trees: HashMap<&Series, Tree> = HashMap::new();
        for sample in &samples {
            let Some(Some(series)) = self.processes.series(sample.pid) else {
                continue;
            };
            trees
                .entry(series)
                .or_default()
                .insert_names(sample.frames.iter().map(|f| &**f), sample.count);
        }
        trees
            .into_iter()
            .map(|(series, tree)| Profile {
                series: series.clone(),
                meta: self.meta.clone(),
                from,
                until,
                tree,
            })
            .collect()
    }
}

/// The running CPU source.
pub struct CpuSource {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl CpuSource {
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
) -> anyhow::Result<CpuSource> {
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
    Ok(CpuSource { stop, thread })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exited_processes_stay_for_the_grace_period_and_the_next_drain() {
        let mut processes = Processes::default();
        let series: Series = "a.cpu{}".parse().unwrap();
        processes.seen(7, Some(series.clone()), 100);
        processes.seen(8, None, 100);
        let t0 = Instant::now();
        let grace = Duration::from_secs(30);
        // Exit during drain 3 (3 drains done, the 4th pending).
        processes.exited(7, t0, 3);
        assert!(processes.purge(t0 + grace, 3, grace).is_empty());
        assert!(
            processes
                .purge(t0 + Duration::from_secs(1), 4, grace)
                .is_empty()
        );
        assert_eq!(processes.series(7), Some(Some(&series)));
        assert_eq!(processes.purge(t0 + grace, 4, grace), vec![7]);
        assert_eq!(processes.series(7), None);
        assert_eq!(processes.series(8), Some(None));
        assert!(processes.is_alive(8));
        // The pid comes back: it is alive again and stays.
        processes.seen(8, Some(series), 100);
        processes.exited(8, t0, 0);
        assert_eq!(processes.start_time(8), Some(100));
        processes.seen(8, None, 200);
        assert!(processes.purge(t0 + grace * 2, 9, grace).is_empty());
        assert_eq!(processes.len(), 1);
    }
}
