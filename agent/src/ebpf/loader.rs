//! Loads the embedded BPF object, attaches it to every online CPU and to the process-lifecycle
//! tracepoints, and says what is missing when the kernel refuses: a capability, or a kernel
//! feature (the feature probes report what they checked).
//!
//! The agent needs `CAP_BPF` and `CAP_PERFMON` (or `CAP_SYS_ADMIN`) to load and attach, and
//! `CAP_SYS_PTRACE`, `CAP_DAC_READ_SEARCH` and `CAP_SYSLOG` to read other processes' memory maps,
//! binaries and the kernel's symbol addresses. `CAP_CHECKPOINT_RESTORE` (or `CAP_SYS_ADMIN`)
//! lets it open binaries through `/proc/PID/map_files`, the only way to a binary deleted or
//! replaced since its process started (after a package upgrade); without it such binaries get
//! no unwind table and their frames show as `module+0xoffset`. Nothing else: kernels since 5.11
//! charge BPF maps to the memory cgroup, so `RLIMIT_MEMLOCK` is not raised.
//!
//! What loading yields, [`Sampler`], holds the object and one field per kernel object the
//! source reads; the readers beside this file (`samples.rs`, `events.rs`, `counters.rs`) and
//! `python/maps.rs` (the CPython processes the kernel walks) read them. The unwinder's tables
//! and mappings maps are handed to [`super::unwind`] whole ([`Sampler::take_unwind_maps`]).

use std::io;

use aya::maps::lpm_trie::LpmTrie;
use aya::maps::{Array, HashMap, HashOfMaps, MapData, MapType, PerCpuArray, RingBuf};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::{BtfTracePoint, PerfEvent, Program, ProgramError, ProgramType, RawTracePoint};
use aya::sys::{BpfHelper, is_helper_supported, is_map_supported};
use aya::{Btf, Ebpf, EbpfLoader};
use smolder_agent_ebpf::offcpu::{self as offcpu_contract, OffCpuConfig as KernelOffCpu};
use smolder_agent_ebpf::unwind::{self as contract, Mapping, MappingKey};
use smolder_agent_ebpf::{self as kernel};
use tracing::{debug, info, warn};

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
    /// The kernel lacks what the sampler needs (the probes say which, and since which Linux).
    #[error("the kernel lacks what the eBPF sampler needs: {}", missing.join(", "))]
    Feature {
        /// The missing features, each with the Linux version that brought it.
        missing: Vec<&'static str>,
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
    /// `ebpf.off-cpu.probability` is not in (0, 1].
    #[error("ebpf.off-cpu.probability is {value}; it must be above 0 and at most 1")]
    OffCpuProbability {
        /// The configured value.
        value: f64,
    },
    /// `ebpf.memory.period` is zero.
    #[error("ebpf.memory.period must be at least 1 fault")]
    MemoryPeriod,
    /// The kernel's BTF, which the off-CPU program attaches through, could not be read.
    #[error("reading the kernel's BTF (/sys/kernel/btf/vmlinux) for ebpf.off-cpu failed")]
    Btf {
        /// What aya reported.
        source: Box<aya::BtfError>,
    },
    /// `ebpf.max-frames` is zero or above what a sample holds.
    #[error("ebpf.max-frames is {value}; it must be between 1 and {max}")]
    MaxFrames {
        /// The configured value.
        value: u32,
        /// The largest a sample holds.
        max: usize,
    },
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

/// The loaded and attached sampler: one field per kernel object the source reads, by the
/// reader of the same name (`samples.rs`, `events.rs`, `counters.rs`).
pub struct Sampler {
    /// Owns the programs; their perf events and links live as long as it does.
    ebpf: Ebpf,
    /// `unwind_samples`: the unwound samples.
    pub(super) samples: RingBuf<MapData>,
    /// `events`: the process-event ring buffer.
    pub(super) events: RingBuf<MapData>,
    /// `unwind_counters`: the per-CPU counters of lost samples and events and of the walks'
    /// rows.
    pub(super) counters: PerCpuArray<MapData, u64>,
    /// Counters as last read, to report increments.
    pub(super) counters_seen: [u64; contract::Counter::ALL.len()],
    /// `offcpu_config`: the off-CPU sampling threshold; `None` when off-CPU is disabled.
    off_cpu: Option<Array<MapData, KernelOffCpu>>,
    /// `profiled`: the processes off-CPU and memory-growth samples are taken of; `None` when
    /// both are disabled.
    profiled: Option<HashMap<MapData, u32, u8>>,
    /// `python_procs`: the CPython processes the kernel walks.
    pub(super) python: PythonMaps,
    cpus: usize,
}

/// The unwinder's maps, which the table lifecycle ([`super::unwind`]) fills.
pub struct UnwindMaps {
    /// `unwind_tables`: executable id → that executable's table.
    pub tables: HashOfMaps<MapData, u64, Array<MapData, u64>>,
    /// A descriptor of `unwind_tables` of its own, for the batch updates aya does not make.
    pub tables_fd: std::os::fd::OwnedFd,
    /// `unwind_mappings`: (process, address) → the executable mapped there.
    pub mappings: LpmTrie<MapData, MappingKey, Mapping>,
}

impl Sampler {
    /// The number of CPUs sampled.
    pub fn cpus(&self) -> usize {
        self.cpus
    }

    /// A program of the loaded object by its C name, to attach it elsewhere: the uprobe point
    /// check of the tests ([`kernel::PROGRAM_UPROBE`]) is not attached by the agent itself.
    pub fn program_mut(&mut self, name: &str) -> Option<&mut Program> {
        self.ebpf.program_mut(name)
    }

    /// Sets the probability the kernel samples switch-outs with (off-CPU enabled only).
    ///
    /// # Errors
    ///
    /// [`EbpfError::Map`] when the config map cannot be written.
    pub fn set_off_cpu(&mut self, probability: f64, flags: u32) -> Result<(), EbpfError> {
        let Some(map) = &mut self.off_cpu else {
            return Ok(());
        };
        let config = KernelOffCpu {
            threshold: offcpu_contract::threshold(probability),
            flags,
        };
        map.set(0, config, 0).map_err(|source| EbpfError::Map {
            map: offcpu_contract::MAP_CONFIG,
            action: "setting the off-CPU threshold",
            source: Some(Box::new(source)),
        })
    }

    /// Whether the kernel takes off-CPU and memory-growth samples of process `pid` (the
    /// relabelling keeps it); a no-op when both are disabled. Forgetting a process not
    /// followed is no error.
    ///
    /// # Errors
    ///
    /// [`EbpfError::Map`] when the map cannot be written (it holds 65,536 processes).
    pub fn follow(&mut self, pid: u32, profiled: bool) -> Result<(), EbpfError> {
        let Some(map) = &mut self.profiled else {
            return Ok(());
        };
        let result = if profiled {
            map.insert(pid, 1, 0)
        } else {
            // A process never followed is not in the map: nothing to do.
            match map.remove(&pid) {
                Err(aya::maps::MapError::SyscallError(error))
                    if error.io_error.raw_os_error() == Some(libc::ENOENT) =>
                {
                    Ok(())
                }
                other => other,
            }
        };
        result.map_err(|source| EbpfError::Map {
            map: offcpu_contract::MAP_PROFILED,
            action: "following a process",
            source: Some(Box::new(source)),
        })
    }

    /// Takes the maps the table lifecycle fills, once.
    ///
    /// # Errors
    ///
    /// [`EbpfError::Map`] when they were taken already or cannot be opened.
    pub fn take_unwind_maps(&mut self) -> Result<UnwindMaps, EbpfError> {
        let tables = take_map(&mut self.ebpf, contract::MAP_TABLES)?;
        let tables_fd = match &tables {
            aya::maps::Map::HashOfMaps(data) => {
                use std::os::fd::AsFd as _;
                data.fd()
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|io_error| EbpfError::Map {
                        map: contract::MAP_TABLES,
                        action: "duplicating its descriptor",
                        source: Some(Box::new(aya::maps::MapError::SyscallError(
                            aya::sys::SyscallError {
                                call: "fcntl(F_DUPFD_CLOEXEC)",
                                io_error,
                            },
                        ))),
                    })?
            }
            _ => {
                return Err(EbpfError::Map {
                    map: contract::MAP_TABLES,
                    action: "opening it as a hash of maps",
                    source: None,
                });
            }
        };
        Ok(UnwindMaps {
            tables: typed(contract::MAP_TABLES, HashOfMaps::try_from(tables))?,
            tables_fd,
            mappings: typed(
                contract::MAP_MAPPINGS,
                LpmTrie::try_from(take_map(&mut self.ebpf, contract::MAP_MAPPINGS)?),
            )?,
        })
    }
}

/// The file [`aya::util::online_cpus`] reads.
const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";

/// What a capability is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// Loading and attaching: without it nothing works.
    Loading,
    /// Reading other processes' maps and binaries, and kernel symbols.
    Reading,
    /// Opening binaries through `/proc/PID/map_files`.
    MapFiles,
}

/// A Linux capability the agent uses, with its bit in `CapEff` and what it is for.
struct Capability {
    name: &'static str,
    bit: u32,
    /// A capability that grants the same (`CAP_SYS_ADMIN` predates the narrower ones).
    or: Option<u32>,
    purpose: Purpose,
}

const CAP_SYS_ADMIN: u32 = 21;

const CAPABILITIES: [Capability; 6] = [
    Capability {
        name: "CAP_BPF",
        bit: 39,
        or: Some(CAP_SYS_ADMIN),
        purpose: Purpose::Loading,
    },
    Capability {
        name: "CAP_PERFMON",
        bit: 38,
        or: Some(CAP_SYS_ADMIN),
        purpose: Purpose::Loading,
    },
    Capability {
        name: "CAP_SYS_PTRACE",
        bit: 19,
        or: None,
        purpose: Purpose::Reading,
    },
    Capability {
        name: "CAP_DAC_READ_SEARCH",
        bit: 2,
        or: None,
        purpose: Purpose::Reading,
    },
    Capability {
        name: "CAP_SYSLOG",
        bit: 34,
        or: None,
        purpose: Purpose::Reading,
    },
    Capability {
        name: "CAP_CHECKPOINT_RESTORE",
        bit: 40,
        or: Some(CAP_SYS_ADMIN),
        purpose: Purpose::MapFiles,
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

/// The capabilities among those the agent uses for `purpose` that this process lacks.
fn missing_capabilities(purpose: Purpose) -> Vec<&'static str> {
    let Some(effective) = effective_capabilities() else {
        return Vec::new();
    };
    let has = |bit: u32| effective & (1u64 << bit) != 0;
    CAPABILITIES
        .iter()
        .filter(|cap| cap.purpose == purpose)
        .filter(|cap| !has(cap.bit) && !cap.or.is_some_and(has))
        .map(|cap| cap.name)
        .collect()
}

/// One kernel feature the sampler needs, and how it is probed.
struct Feature {
    /// What it is, with the Linux version that brought it.
    name: &'static str,
    probe: Probe,
}

enum Probe {
    Map(MapType),
    /// A helper called from a perf_event program.
    Helper(BpfHelper),
}

const FEATURES: [Feature; 8] = [
    Feature {
        name: "ring buffer maps (Linux 5.8)",
        probe: Probe::Map(MapType::RingBuf),
    },
    Feature {
        name: "hash-of-maps (Linux 4.12)",
        probe: Probe::Map(MapType::HashOfMaps),
    },
    Feature {
        name: "LPM trie maps (Linux 4.11)",
        probe: Probe::Map(MapType::LpmTrie),
    },
    Feature {
        name: "the bpf_loop helper (Linux 5.17)",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_loop),
    },
    Feature {
        name: "the bpf_get_stack helper (Linux 4.18)",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_get_stack),
    },
    Feature {
        name: "the bpf_task_pt_regs helper (Linux 5.15)",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_task_pt_regs),
    },
    Feature {
        name: "the bpf_get_current_task_btf helper (Linux 5.11)",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_get_current_task_btf),
    },
    Feature {
        name: "the bpf_ringbuf_output helper (Linux 5.8)",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_ringbuf_output),
    },
];

/// Probes every feature the sampler needs and logs what it checked. Returns the missing ones;
/// a probe that cannot run (no `CAP_BPF`) counts as present, so that loading itself reports the
/// capability instead.
fn probe_features() -> Vec<&'static str> {
    let mut missing = Vec::new();
    for feature in &FEATURES {
        let (checked, result) = match &feature.probe {
            Probe::Map(map_type) => (
                "creating a map of that type",
                is_map_supported(*map_type).map_err(|err| err.to_string()),
            ),
            Probe::Helper(helper) => (
                "loading a perf_event program that calls it",
                is_helper_supported(ProgramType::PerfEvent, *helper).map_err(|err| err.to_string()),
            ),
        };
        match result {
            Ok(true) => debug!(feature = feature.name, checked, "kernel feature present"),
            Ok(false) => {
                warn!(feature = feature.name, checked, "kernel feature missing");
                missing.push(feature.name);
            }
            Err(error) => {
                debug!(feature = feature.name, checked, %error, "kernel feature probe failed")
            }
        }
    }
    missing
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
            missing_capabilities(Purpose::Loading)
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
    /// online CPU at `config.frequency` and to `sched_process_exec` / `sched_process_exit`;
    /// with `ebpf.off-cpu.enabled` to `sched_switch` (BTF), with `ebpf.memory.enabled` to
    /// every CPU's minor page faults.
    ///
    /// # Errors
    ///
    /// [`EbpfError::Load`] or [`EbpfError::Program`] naming the missing capabilities when the
    /// kernel refuses, [`EbpfError::Feature`] when it lacks a feature, [`EbpfError::Map`] when
    /// the object lacks a map, [`EbpfError::OnlineCpus`] when the CPU list cannot be read,
    /// [`EbpfError::Frequency`], [`EbpfError::MaxFrames`], [`EbpfError::OffCpuProbability`]
    /// and [`EbpfError::MemoryPeriod`] for settings out of range, [`EbpfError::Btf`] when
    /// off-CPU is enabled and the kernel's BTF cannot be read.
    pub fn load(config: &EbpfConfig, self_pid: u32) -> Result<Sampler, EbpfError> {
        config.validate()?;
        let unreadable = missing_capabilities(Purpose::Reading);
        if !unreadable.is_empty() {
            warn!(
                missing = %unreadable.join(", "),
                "without these capabilities other processes' binaries or kernel symbols cannot be read; their stacks are walked with frame pointers and their frames show as module+offset or [unknown]"
            );
        }
        let no_map_files = missing_capabilities(Purpose::MapFiles);
        if !no_map_files.is_empty() {
            info!(
                missing = %no_map_files.join(", "),
                "binaries are opened through /proc/PID/root: those deleted or replaced since their process started (by a package upgrade) get no unwind table and no names"
            );
        }
        let missing = probe_features();
        if !missing.is_empty() {
            return Err(EbpfError::Feature { missing });
        }
        let off_cpu = &config.off_cpu;
        if off_cpu.enabled && !(off_cpu.probability > 0.0 && off_cpu.probability <= 1.0) {
            return Err(EbpfError::OffCpuProbability {
                value: off_cpu.probability,
            });
        }
        if config.memory.enabled && config.memory.period == 0 {
            return Err(EbpfError::MemoryPeriod);
        }
        let layout = super::memory::PhysicalLayout::of_host();
        let mut ebpf = EbpfLoader::new()
            .override_global(kernel::GLOBAL_SELF_TGID, &self_pid, true)
            .override_global(
                offcpu_contract::GLOBAL_PHYS_ADDRESS_BITS,
                &layout.address_bits,
                true,
            )
            .override_global(
                offcpu_contract::GLOBAL_DIRECT_MAP_CANDIDATES,
                &layout.direct_map_candidates(),
                true,
            )
            .override_global(contract::GLOBAL_MAX_FRAMES, &config.max_frames, true)
            // The off-CPU task storage, which aya creates but has no type for.
            .allow_unsupported_maps()
            .load(kernel::OBJECT)
            .map_err(|source| EbpfError::Load {
                missing: missing_capabilities(Purpose::Loading),
                source: Box::new(source),
            })?;

        let cpus = aya::util::online_cpus().map_err(|(_, source)| EbpfError::OnlineCpus {
            path: ONLINE_CPUS,
            source,
        })?;
        let cpu: &mut PerfEvent = ebpf
            .program_mut(kernel::PROGRAM_CPU)
            .ok_or_else(|| missing_program(kernel::PROGRAM_CPU))?
            .try_into()
            .map_err(|source| program_error(kernel::PROGRAM_CPU, "typing".into(), source))?;
        cpu.load()
            .map_err(|source| program_error(kernel::PROGRAM_CPU, "loading".into(), source))?;
        for &id in &cpus {
            cpu.attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu: id },
                SamplePolicy::Frequency(config.frequency),
                false,
            )
            .map_err(|source| {
                program_error(
                    kernel::PROGRAM_CPU,
                    format!("attaching to the cpu-clock event of CPU {id}"),
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

        let off_cpu_map = if off_cpu.enabled {
            Some(attach_off_cpu(&mut ebpf)?)
        } else {
            None
        };
        if config.memory.enabled {
            attach_memory(&mut ebpf, &cpus, config.memory.period)?;
        }

        let samples = typed(
            contract::MAP_SAMPLES,
            RingBuf::try_from(take_map(&mut ebpf, contract::MAP_SAMPLES)?),
        )?;
        let events = typed(
            kernel::MAP_EVENTS,
            RingBuf::try_from(take_map(&mut ebpf, kernel::MAP_EVENTS)?),
        )?;
        let counters = typed(
            contract::MAP_COUNTERS,
            PerCpuArray::try_from(take_map(&mut ebpf, contract::MAP_COUNTERS)?),
        )?;
        let profiled = if off_cpu.enabled || config.memory.enabled {
            Some(typed(
                offcpu_contract::MAP_PROFILED,
                HashMap::try_from(take_map(&mut ebpf, offcpu_contract::MAP_PROFILED)?),
            )?)
        } else {
            None
        };
        let python = PythonMaps {
            procs: typed(
                kernel::MAP_PYTHON_PROCS,
                HashMap::try_from(take_map(&mut ebpf, kernel::MAP_PYTHON_PROCS)?),
            )?,
        };
        info!(
            cpus = cpus.len(),
            frequency = config.frequency,
            max_frames = config.max_frames,
            off_cpu = off_cpu.enabled,
            memory = config.memory.enabled,
            "eBPF sampler attached"
        );
        let mut sampler = Sampler {
            ebpf,
            samples,
            events,
            counters,
            counters_seen: [0; contract::Counter::ALL.len()],
            off_cpu: off_cpu_map,
            profiled,
            python,
            cpus: cpus.len(),
        };
        sampler.set_off_cpu(off_cpu.probability, off_cpu.flags())?;
        Ok(sampler)
    }
}

/// Attaches the off-CPU program to `sched_switch` through BTF; returns its config map, whose
/// threshold (0 until set) turns sampling on.
fn attach_off_cpu(ebpf: &mut Ebpf) -> Result<Array<MapData, KernelOffCpu>, EbpfError> {
    let btf = Btf::from_sys_fs().map_err(|source| EbpfError::Btf {
        source: Box::new(source),
    })?;
    let program = offcpu_contract::PROGRAM_SWITCH;
    let switch: &mut BtfTracePoint = ebpf
        .program_mut(program)
        .ok_or_else(|| missing_program(program))?
        .try_into()
        .map_err(|source| program_error(program, "typing".into(), source))?;
    switch
        .load(offcpu_contract::TRACEPOINT_SWITCH, &btf)
        .map_err(|source| program_error(program, "loading".into(), source))?;
    switch.attach().map_err(|source| {
        program_error(
            program,
            format!(
                "attaching to BTF tracepoint {}",
                offcpu_contract::TRACEPOINT_SWITCH
            ),
            source,
        )
    })?;
    typed(
        offcpu_contract::MAP_CONFIG,
        Array::try_from(take_map(ebpf, offcpu_contract::MAP_CONFIG)?),
    )
}

/// Attaches the page-fault program to the minor-fault event of every CPU in `cpus`, one sample
/// every `period` faults.
fn attach_memory(ebpf: &mut Ebpf, cpus: &[u32], period: u64) -> Result<(), EbpfError> {
    let program = offcpu_contract::PROGRAM_FAULT;
    let fault: &mut PerfEvent = ebpf
        .program_mut(program)
        .ok_or_else(|| missing_program(program))?
        .try_into()
        .map_err(|source| program_error(program, "typing".into(), source))?;
    fault
        .load()
        .map_err(|source| program_error(program, "loading".into(), source))?;
    for &id in cpus {
        fault
            .attach(
                PerfEventConfig::Software(SoftwareEvent::PageFaultsMin),
                PerfEventScope::AllProcessesOneCpu { cpu: id },
                SamplePolicy::Period(period),
                false,
            )
            .map_err(|source| {
                program_error(
                    program,
                    format!("attaching to the page-faults-min event of CPU {id}"),
                    source,
                )
            })?;
    }
    Ok(())
}
