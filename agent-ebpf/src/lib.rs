//! Smolder's kernel-side sampler, compiled from C by `build.rs` and embedded as bytes.
//!
//! [`OBJECT`] is the BPF object the agent loads with aya (`smolder_agent::ebpf`). It holds the
//! program [`PROGRAM_CPU`] (perf_event, one per online CPU: a whole user stack and the kernel
//! stack per tick, unwound by the BPF unwinder), [`PROGRAM_UPROBE`] (the same walk at a probed
//! instruction, the tests' point check), and the process-lifecycle programs [`PROGRAM_EXEC`] and
//! [`PROGRAM_EXIT`] (raw tracepoints).
//!
//! Two contracts, each a C header mirrored here byte for byte: `src/process.h`, the process
//! events ([`ProcessEvent`], [`EventKind`]) a process's first sample, exec and exit send through
//! [`MAP_EVENTS`]; and `src/unwind.h`, the unwinder's tables, mappings and samples, mirrored in
//! [`unwind`].

pub mod unwind;

/// The compiled object, aligned for aya's ELF parser.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/unwinder.bpf.o"));

/// The perf_event program that sends one unwound sample per tick (`on_cpu` in C).
pub const PROGRAM_CPU: &str = "on_cpu";
/// The uprobe program that sends one unwound sample per hit (`on_uprobe` in C).
pub const PROGRAM_UPROBE: &str = "on_uprobe";
/// The `raw_tp/sched_process_exec` program.
pub const PROGRAM_EXEC: &str = "on_exec";
/// The `raw_tp/sched_process_exit` program.
pub const PROGRAM_EXIT: &str = "on_exit";
/// The raw tracepoint [`PROGRAM_EXEC`] attaches to.
pub const TRACEPOINT_EXEC: &str = "sched_process_exec";
/// The raw tracepoint [`PROGRAM_EXIT`] attaches to.
pub const TRACEPOINT_EXIT: &str = "sched_process_exit";

/// The LRU hash of processes already announced through [`MAP_EVENTS`].
pub const MAP_SEEN: &str = "seen";
/// The ring buffer of [`ProcessEvent`]s.
pub const MAP_EVENTS: &str = "events";
/// The global the agent patches with its own process id so that it is not sampled.
pub const GLOBAL_SELF_TGID: &str = "self_tgid";

/// `SMOLDER_EVENTS_BYTES`: the events ring buffer's size.
pub const EVENTS_BYTES: u32 = 256 * 1024;

/// `struct process_event`: what happened to a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessEvent {
    /// The process (thread group) id.
    pub tgid: u32,
    /// An [`EventKind`] as a number.
    pub kind: u32,
}

// Two 4-byte fields: no padding.
const _: () = assert!(size_of::<ProcessEvent>() == 8);

// SAFETY: `ProcessEvent` is `repr(C)`, `Copy`, made only of integers and has no padding.
unsafe impl aya::Pod for ProcessEvent {}

/// `enum smolder_event_kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The process's first sample.
    FirstSight = 1,
    /// The process called execve.
    Exec = 2,
    /// The process's main thread exited.
    Exit = 3,
}

impl EventKind {
    /// The kind a [`ProcessEvent::kind`] names, if it is one.
    pub fn from_raw(kind: u32) -> Option<EventKind> {
        match kind {
            1 => Some(EventKind::FirstSight),
            2 => Some(EventKind::Exec),
            3 => Some(EventKind::Exit),
            _ => None,
        }
    }
}
