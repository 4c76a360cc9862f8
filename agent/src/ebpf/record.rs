//! `smolder-agent record`: the eBPF source run for a while in the foreground, through the same
//! windows, unwinder and symbolizer as the daemon, and what it prints.
//!
//! Input: the config, a duration, the data directory (the unwinder's and debuginfod's caches).
//! Output: a [`Recording`]: the profiles of every window, when each process's unwind
//! tables went in and the metrics at the end, printed as folded stacks or JSON ([`print_record`]). Caller: the `record`
//! subcommand and the tests.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde::Serialize;
use smolder_common::Profile;

use super::collector::Collector;
use super::{SourceConfig, SourceMetrics};
use crate::window::window_start;

/// What [`record`] sampled.
pub struct Recording {
    /// One profile per series per window (`window.length`), in window order.
    pub profiles: Vec<Profile>,
    /// The processes whose unwind tables went into the kernel during the recording.
    pub ready: Vec<ProcessReady>,
    /// The eBPF source's metrics at the end (with the tier's errors and dropped counters of
    /// its stages), in Prometheus' text format.
    pub metrics: String,
}

/// A process whose unwind tables and mappings went into the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessReady {
    /// The process.
    pub pid: u32,
    /// When; samples taken from then on are walked with its tables.
    pub at: SystemTime,
    /// How long after its first sample (the agent's start, for a preloaded process; after the
    /// walk that left its mappings, for a refresh).
    pub after: Duration,
    /// Whether its mappings were read again because walks left them (a `dlopen`).
    pub refresh: bool,
    /// Whether it was loaded because it ran at the agent's start; `after` then counts from
    /// the agent's start.
    pub preloaded: bool,
}

/// Samples every process for `duration`, in windows of `window.length` as the daemon does, with
/// the caches in `data_dir`. `config` is what the source reads of the agent's configuration,
/// usually the whole `&Config`.
///
/// # Errors
///
/// When the hostname cannot be read, the sampler cannot be loaded or a drain fails.
pub fn record<'a>(
    config: impl TryInto<SourceConfig<'a>, Error = anyhow::Error>,
    duration: Duration,
    data_dir: Option<&Path>,
) -> anyhow::Result<Recording> {
    let config = config.try_into()?;
    let length = config.window_length;
    let (registry, metrics) = SourceMetrics::standalone();
    let mut collector = Collector::new(config, &metrics, data_dir)?;
    // Nothing reads the health of a recording; the collector beats all the same.
    let beat = metrics.health.register("ebpf", Duration::MAX);
    collector.ready = Some(Vec::new());
    let never = AtomicBool::new(false);
    let end = Instant::now() + duration;
    let mut from = SystemTime::now();
    let mut profiles = Vec::new();
    loop {
        let boundary = window_start(SystemTime::now(), length) + length;
        let to_boundary = boundary
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        collector.poll_until((Instant::now() + to_boundary).min(end), &never, &beat)?;
        let last = Instant::now() >= end;
        let until = if last { SystemTime::now() } else { boundary };
        profiles.extend(collector.drain(from, until, &beat)?);
        if last {
            break;
        }
        from = until;
    }
    let (now, instant) = (SystemTime::now(), Instant::now());
    let ready = collector
        .ready
        .unwrap_or_default()
        .iter()
        .map(|ready| ProcessReady {
            pid: ready.pid,
            at: now - instant.saturating_duration_since(ready.at),
            after: ready.after,
            refresh: ready.refresh,
            preloaded: ready.preloaded,
        })
        .collect();
    let metrics = smolder_daemon::metrics::render(&registry).context("rendering the metrics")?;
    Ok(Recording {
        profiles,
        ready,
        metrics,
    })
}

/// What `smolder-agent record` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RecordFormat {
    /// One `service_name;frame;...;leaf count` line per stack over the whole recording,
    /// heaviest first: the input of `flamegraph.pl` and of the aggregator's `/ingest`. Stacks
    /// of the off-CPU and memory types start with `service_name.off_cpu` (nanoseconds),
    /// `.run_queue` (nanoseconds) or `.memory_growth` (bytes).
    Folded,
    /// One JSON document: every window's series with their stacks (`frame;...;leaf`) and
    /// counts, when each process's unwind tables went in (times in Unix milliseconds), so
    /// that a script can tell the stacks walked with tables from those before, and the
    /// eBPF source's metrics at the end (Prometheus text, `metrics`).
    Json,
}

#[derive(Serialize)]
struct JsonRecording<'a> {
    profiles: Vec<JsonProfile>,
    ready: &'a [JsonReady],
    metrics: &'a str,
}

#[derive(Serialize)]
struct JsonProfile {
    series: String,
    from: u128,
    until: u128,
    stacks: Vec<(String, u64)>,
}

#[derive(Serialize)]
struct JsonReady {
    pid: u32,
    at: u128,
    after_ms: u128,
    refresh: bool,
    preloaded: bool,
}

fn unix_ms(time: SystemTime) -> u128 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis())
}

/// A profile's stacks, root first, `;`-joined.
fn stacks(profile: &Profile) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    profile.tree.for_each_stack(|stack, value| {
        let frames: Vec<&str> = stack
            .iter()
            .map(|&id| profile.tree.frames().name(id))
            .collect();
        out.push((frames.join(";"), value));
    });
    out
}

/// Samples for `duration` ([`record`], caches in `data_dir`) and writes the result to `out` in
/// `format`.
///
/// # Errors
///
/// When sampling fails or `out` cannot be written.
pub fn print_record<'a>(
    config: impl TryInto<SourceConfig<'a>, Error = anyhow::Error>,
    duration: Duration,
    data_dir: Option<&Path>,
    format: RecordFormat,
    mut out: impl std::io::Write,
) -> anyhow::Result<()> {
    let recording = record(config, duration, data_dir)?;
    match format {
        RecordFormat::Folded => {
            let mut lines: BTreeMap<String, u64> = BTreeMap::new();
            for profile in &recording.profiles {
                // CPU stacks under the service's name, as before; other types (off-CPU
                // nanoseconds, memory bytes) under `service.type`, never summed with them.
                let root = match profile.series.profile_type() {
                    Some("cpu") | None => profile.series.service(),
                    Some(_) => profile.series.app(),
                };
                for (stack, value) in stacks(profile) {
                    *lines.entry(format!("{root};{stack}")).or_default() += value;
                }
            }
            let mut lines: Vec<(String, u64)> = lines.into_iter().collect();
            lines.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            for (stack, value) in lines {
                writeln!(out, "{stack} {value}").context("writing the recording")?;
            }
        }
        RecordFormat::Json => {
            let ready: Vec<JsonReady> = recording
                .ready
                .iter()
                .map(|ready| JsonReady {
                    pid: ready.pid,
                    at: unix_ms(ready.at),
                    after_ms: ready.after.as_millis(),
                    refresh: ready.refresh,
                    preloaded: ready.preloaded,
                })
                .collect();
            let document = JsonRecording {
                profiles: recording
                    .profiles
                    .iter()
                    .map(|profile| JsonProfile {
                        series: profile.series.to_string(),
                        from: unix_ms(profile.from),
                        until: unix_ms(profile.until),
                        stacks: stacks(profile),
                    })
                    .collect(),
                ready: &ready,
                metrics: &recording.metrics,
            };
            serde_json::to_writer(&mut out, &document).context("writing the recording")?;
            writeln!(out).context("writing the recording")?;
        }
    }
    out.flush().context("writing the recording")
}
