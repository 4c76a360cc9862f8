//! Loads the embedded sampler, attaches it to every online CPU and to the process-lifecycle
//! tracepoints, and says which capability is missing when the kernel refuses.
//!
//! The agent needs `CAP_BPF` and `CAP_PERFMON` (or `CAP_SYS_ADMIN`) to load and attach, and
//! `CAP_SYS_PTRACE`, `CAP_DAC_READ_SEARCH` and `CAP_SYSLOG` to read other processes' memory maps,
//! binaries and the kernel's symbol addresses. Nothing else: kernels since 5.11 charge BPF maps to
//! the memory cgroup, so `RLIMIT_MEMLOCK` is not raised.
//!
//! What loading yields, [`Sampler`], holds the object and one field per kernel object; the map
//! readers beside this file (`counts.rs`, `events.rs`, `errors.rs`) and `python/maps.rs` (the
//! Python walk's maps) read them.

use std::io;

use aya::maps::{Array, HashMap, MapData, PerCpuArray, RingBuf, StackTraceMap};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::{PerfEvent, ProgramError, RawTracePoint};
use aya::{Ebpf, EbpfLoader};
use smolder_agent_ebpf::{self as kernel, SampleKey};
use tracing::{info, warn};

use super::EbpfConfig;
use super::python::PythonMaps;

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

/// The loaded and attached sampler and its maps: one field per kernel object, read by the map
/// reader of the same name (`counts.rs`, `events.rs`, `errors.rs`).
pub struct Sampler {
    /// Owns the programs; their perf events and links live as long as it does.
    _ebpf: Ebpf,
    /// `buffer`: which of the two buffers the program writes to.
    pub(super) buffer: Array<MapData, u32>,
    /// `counts_0`, `counts_1`.
    pub(super) counts: [HashMap<MapData, SampleKey, u64>; 2],
    /// `stacks_0`, `stacks_1`.
    pub(super) stacks: [StackTraceMap<MapData>; 2],
    /// `events`: the process-event ring buffer.
    pub(super) events: RingBuf<MapData>,
    /// `errors`: the per-CPU error counters.
    pub(super) errors: PerCpuArray<MapData, u64>,
    /// The buffer the program writes to now.
    pub(super) active: u32,
    /// Error counters as last read, to report increments.
    pub(super) errors_seen: [u64; kernel::ErrorIndex::ALL.len()],
    /// `python_procs`, `python_stacks_N`, `python_events`.
    pub(super) python: PythonMaps,
    cpus: usize,
}

impl Sampler {
    /// The number of CPUs sampled.
    pub fn cpus(&self) -> usize {
        self.cpus
    }
}

/// The file [`aya::util::online_cpus`] reads.
const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";

/// A Linux capability the agent uses, with its bit in `CapEff` and what it is for.
struct Capability {
    name: &'static str,
    bit: u32,
    /// Capabilities that grant the same (`CAP_SYS_ADMIN` predates `CAP_BPF` and `CAP_PERFMON`).
    or: Option<u32>,
    for_loading: bool,
}

const CAP_SYS_ADMIN: u32 = 21;

const CAPABILITIES: [Capability; 5] = [
    Capability {
        name: "CAP_BPF",
        bit: 39,
        or: Some(CAP_SYS_ADMIN),
        for_loading: true,
    },
    Capability {
        name: "CAP_PERFMON",
        bit: 38,
        or: Some(CAP_SYS_ADMIN),
        for_loading: true,
    },
    Capability {
        name: "CAP_SYS_PTRACE",
        bit: 19,
        or: None,
        for_loading: false,
    },
    Capability {
        name: "CAP_DAC_READ_SEARCH",
        bit: 2,
        or: None,
        for_loading: false,
    },
    Capability {
        name: "CAP_SYSLOG",
        bit: 34,
        or: None,
        for_loading: false,
    },
];

/// The effective capability set of this process, from `/proc/self/status`.
fn effective_capabilities() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

/// The capabilities among those the agent uses that this process lacks; `loading` selects the
/// ones loading and attaching need, else the ones reading other processes needs.
fn missing_capabilities(loading: bool) -> Vec<&'static str> {
    let Some(effective) = effective_capabilities() else {
        return Vec::new();
    };
    let has = |bit: u32| effective & (1u64 << bit) != 0;
    CAPABILITIES
        .iter()
        .filter(|cap| cap.for_loading == loading)
        .filter(|cap| !has(cap.bit) && !cap.or.is_some_and(has))
        .map(|cap| cap.name)
        .collect()
}

fn program_error(program: &'static str, action: String, source: ProgramError) -> EbpfError {
    let denied = match &source {
        ProgramError::LoadError { io_error, .. } => {
            io_error.kind() == io::ErrorKind::PermissionDenied
        }
        ProgramError::SyscallError(err) => err.io_error.kind() == io::ErrorKind::PermissionDenied,
        _ => false,
    };
    EbpfError::Program {
        program,
        action,
        missing: if denied {
            missing_capabilities(true)
        } else {
            Vec::new()
        },
        source: Some(Box::new(source)),
    }
}

fn missing_program(program: &'static str) -> EbpfError {
    EbpfError::Program {
        program,
        action: "finding it in the object".to_owned(),
        missing: Vec::new(),
        source: None,
    }
}

fn take_map(ebpf: &mut aya::Ebpf, map: &'static str) -> Result<aya::maps::Map, EbpfError> {
    ebpf.take_map(map).ok_or(EbpfError::Map {
        map,
        action: "finding it in the object",
        source: None,
    })
}

fn typed<T>(map: &'static str, result: Result<T, aya::maps::MapError>) -> Result<T, EbpfError> {
    result.map_err(|source| EbpfError::Map {
        map,
        action: "opening it",
        source: Some(Box::new(source)),
    })
}

impl Sampler {
    /// Loads the sampler, skipping the process `self_pid` (the agent), and attaches it to every
    /// online CPU at `config.frequency` and to `sched_process_exec` / `sched_process_exit`.
    ///
    /// # Errors
    ///
    /// [`EbpfError::Load`] or [`EbpfError::Program`] naming the missing capabilities when the
    /// kernel refuses, [`EbpfError::Map`] when the object lacks a map, [`EbpfError::OnlineCpus`]
    /// when the CPU list cannot be read, [`EbpfError::Frequency`] for a zero frequency.
    pub fn load(config: &EbpfConfig, self_pid: u32) -> Result<Sampler, EbpfError> {
        if config.frequency == 0 {
            return Err(EbpfError::Frequency);
        }
        let unreadable = missing_capabilities(false);
        if !unreadable.is_empty() {
            warn!(
                missing = %unreadable.join(", "),
                "without these capabilities other processes' binaries or kernel symbols cannot be read; their frames show as module+offset or [unknown]"
            );
        }
        let mut ebpf = EbpfLoader::new()
            .override_global(kernel::GLOBAL_SELF_TGID, &self_pid, true)
            .map_max_entries(kernel::MAP_COUNTS[0], config.counts_map_entries)
            .map_max_entries(kernel::MAP_COUNTS[1], config.counts_map_entries)
            .map_max_entries(kernel::MAP_STACKS[0], config.stack_map_entries)
            .map_max_entries(kernel::MAP_STACKS[1], config.stack_map_entries)
            .map_max_entries(
                kernel::MAP_PYTHON_STACKS[0],
                config.python.stack_map_entries,
            )
            .map_max_entries(
                kernel::MAP_PYTHON_STACKS[1],
                config.python.stack_map_entries,
            )
            .load(kernel::OBJECT)
            .map_err(|source| EbpfError::Load {
                missing: missing_capabilities(true),
                source: Box::new(source),
            })?;

        let cpus = aya::util::online_cpus().map_err(|(_, source)| EbpfError::OnlineCpus {
            path: ONLINE_CPUS,
            source,
        })?;
        let sample: &mut PerfEvent = ebpf
            .program_mut(kernel::PROGRAM_SAMPLE)
            .ok_or_else(|| missing_program(kernel::PROGRAM_SAMPLE))?
            .try_into()
            .map_err(|source| program_error(kernel::PROGRAM_SAMPLE, "typing".into(), source))?;
        sample
            .load()
            .map_err(|source| program_error(kernel::PROGRAM_SAMPLE, "loading".into(), source))?;
        for &cpu in &cpus {
            sample
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(config.frequency),
                    false,
                )
                .map_err(|source| {
                    program_error(
                        kernel::PROGRAM_SAMPLE,
                        format!("attaching to the cpu-clock event of CPU {cpu}"),
                        source,
                    )
                })?;
        }
        for (program, tracepoint) in [
            (kernel::PROGRAM_EXEC, kernel::TRACEPOINT_EXEC),
            (kernel::PROGRAM_EXIT, kernel::TRACEPOINT_EXIT),
        ] {
            let raw: &mut RawTracePoint = ebpf
                .program_mut(program)
                .ok_or_else(|| missing_program(program))?
                .try_into()
                .map_err(|source| program_error(program, "typing".into(), source))?;
            raw.load()
                .map_err(|source| program_error(program, "loading".into(), source))?;
            raw.attach(tracepoint).map_err(|source| {
                program_error(
                    program,
                    format!("attaching to raw tracepoint {tracepoint}"),
                    source,
                )
            })?;
        }

        let buffer = typed(
            kernel::MAP_BUFFER,
            Array::<MapData, u32>::try_from(take_map(&mut ebpf, kernel::MAP_BUFFER)?),
        )?;
        let counts = [
            typed(
                kernel::MAP_COUNTS[0],
                HashMap::try_from(take_map(&mut ebpf, kernel::MAP_COUNTS[0])?),
            )?,
            typed(
                kernel::MAP_COUNTS[1],
                HashMap::try_from(take_map(&mut ebpf, kernel::MAP_COUNTS[1])?),
            )?,
        ];
        let stacks = [
            typed(
                kernel::MAP_STACKS[0],
                StackTraceMap::try_from(take_map(&mut ebpf, kernel::MAP_STACKS[0])?),
            )?,
            typed(
                kernel::MAP_STACKS[1],
                StackTraceMap::try_from(take_map(&mut ebpf, kernel::MAP_STACKS[1])?),
            )?,
        ];
        let events = typed(
            kernel::MAP_EVENTS,
            RingBuf::try_from(take_map(&mut ebpf, kernel::MAP_EVENTS)?),
        )?;
        let errors = typed(
            kernel::MAP_ERRORS,
            PerCpuArray::try_from(take_map(&mut ebpf, kernel::MAP_ERRORS)?),
        )?;
        let python = PythonMaps {
            procs: typed(
                kernel::MAP_PYTHON_PROCS,
                HashMap::try_from(take_map(&mut ebpf, kernel::MAP_PYTHON_PROCS)?),
            )?,
            stacks: [
                typed(
                    kernel::MAP_PYTHON_STACKS[0],
                    HashMap::try_from(take_map(&mut ebpf, kernel::MAP_PYTHON_STACKS[0])?),
                )?,
                typed(
                    kernel::MAP_PYTHON_STACKS[1],
                    HashMap::try_from(take_map(&mut ebpf, kernel::MAP_PYTHON_STACKS[1])?),
                )?,
            ],
            events: typed(
                kernel::MAP_PYTHON_EVENTS,
                RingBuf::try_from(take_map(&mut ebpf, kernel::MAP_PYTHON_EVENTS)?),
            )?,
        };
        info!(
            cpus = cpus.len(),
            frequency = config.frequency,
            "eBPF sampler attached"
        );
        Ok(Sampler {
            _ebpf: ebpf,
            buffer,
            counts,
            stacks,
            events,
            errors,
            active: 0,
            errors_seen: [0; kernel::ErrorIndex::ALL.len()],
            python,
            cpus: cpus.len(),
        })
    }
}
