//! The kernel side's user half: loads the C sampler, attaches it and reads its maps.
//!
//! Input: the `ebpf:` config section. Output: plain [`Sample`]s (a process id, its user and
//! kernel stacks as addresses, a count) per [`Sampler::drain`], [`ProcessEvent`]s per
//! [`Sampler::poll_events`], and error counts per [`Sampler::read_errors`]. Caller: the CPU
//! source ([`crate::cpu`]), on its own thread. This module owns the BPF object, its perf events
//! (one per online CPU) and its maps; it knows nothing of symbols, labels or windows.
//!
//! Files follow the kernel objects (see `agent-ebpf/src/sampler.h`): [`loader`] loads and
//! attaches the programs and checks capabilities, `counts.rs` drains the double-buffered counts
//! and stacks maps, `events.rs` reads the process-event ring buffer, `errors.rs` the per-CPU error
//! counters.

mod counts;
mod errors;
mod events;
pub mod loader;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use aya::Ebpf;
use aya::maps::{Array, HashMap, MapData, PerCpuArray, RingBuf, StackTraceMap};
use serde::{Deserialize, Serialize};
use smolder_agent_ebpf::SampleKey;

pub use errors::ErrorCounts;
pub use events::{ProcessEvent, ProcessEventKind};

use crate::relabel::RelabelConfig;

/// The eBPF CPU sampler's settings (`ebpf:` in the config file).
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
    /// `smolder_agent_ebpf_dropped_samples_total{reason="counts_map_full"}`.
    pub counts_map_entries: u32,
    /// Distinct stacks each of the two stack maps holds per window (each entry takes 1016 bytes
    /// of kernel memory). Default `16384`. A stack whose slot is taken is counted in
    /// `smolder_agent_ebpf_stack_errors_total` and its sample kept without it.
    pub stack_map_entries: u32,
    /// How long an exited process's labels and memory map are kept for its last samples.
    /// Default `30s`; they are kept at least until the drain after the exit in any case.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub exit_grace: Duration,
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
        }
    }
}

/// Why the sampler could not start or read its maps.
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    /// Loading the object or creating its maps was refused; `missing` names the capabilities the
    /// agent's process lacks (empty when it has them all).
    #[error("loading the eBPF sampler failed{}", missing_hint(missing))]
    Load {
        /// Capabilities the process lacks, such as `CAP_BPF`.
        missing: Vec<&'static str>,
        /// What aya reported.
        source: Box<aya::EbpfError>,
    },
    /// A program is missing from the object or could not be loaded or attached.
    #[error("eBPF program {program}: {action} failed{}", missing_hint(missing))]
    Program {
        /// The program's C function name.
        program: &'static str,
        /// `loading`, or what it was attached to.
        action: String,
        /// Capabilities the process lacks.
        missing: Vec<&'static str>,
        /// What aya reported.
        source: Option<Box<aya::programs::ProgramError>>,
    },
    /// A map is missing from the object or could not be read or written.
    #[error("eBPF map {map}: {action} failed")]
    Map {
        /// The map's name.
        map: &'static str,
        /// What was being done.
        action: &'static str,
        /// What aya reported.
        source: Option<Box<aya::maps::MapError>>,
    },
    /// The list of online CPUs could not be read.
    #[error("reading the online CPUs from {path} failed")]
    OnlineCpus {
        /// The file read.
        path: &'static str,
        /// Why.
        source: io::Error,
    },
    /// `ebpf.frequency` is zero.
    #[error("ebpf.frequency must be at least 1 Hz")]
    Frequency,
}

fn missing_hint(missing: &[&'static str]) -> String {
    if missing.is_empty() {
        String::new()
    } else {
        format!(
            " (the agent lacks {}; run it as root or grant them, with systemd's AmbientCapabilities= for instance)",
            missing.join(", ")
        )
    }
}

/// A stack as the kernel recorded it, leaf first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stack {
    /// Instruction addresses, the leaf (innermost frame) first.
    Frames(Arc<[u64]>),
    /// The sample has no stack of this kind (no kernel stack for a sample in user mode, no user
    /// stack for a kernel thread).
    None,
    /// The stack was not recorded (its slot in the stacks map was taken, or the helper failed).
    Lost,
}

/// Samples of one process with one pair of stacks, over one drain.
#[derive(Clone, Debug)]
pub struct Sample {
    /// The process (thread group) id.
    pub pid: u32,
    /// The user-space stack.
    pub user: Stack,
    /// The kernel stack.
    pub kernel: Stack,
    /// How many times this pair was sampled.
    pub count: u64,
}

/// The loaded and attached sampler and its maps.
pub struct Sampler {
    /// Owns the programs; their perf events and links live as long as it does.
    _ebpf: Ebpf,
    buffer: Array<MapData, u32>,
    counts: [HashMap<MapData, SampleKey, u64>; 2],
    stacks: [StackTraceMap<MapData>; 2],
    events: RingBuf<MapData>,
    errors: PerCpuArray<MapData, u64>,
    /// The buffer the program writes to now.
    active: u32,
    /// Error counters as last read, to report increments.
    errors_seen: [u64; smolder_agent_ebpf::ErrorIndex::ALL.len()],
    cpus: usize,
}

impl Sampler {
    /// The number of CPUs sampled.
    pub fn cpus(&self) -> usize {
        self.cpus
    }
}
