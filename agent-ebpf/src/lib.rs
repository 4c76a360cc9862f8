//! Smolder's kernel-side CPU sampler and unwinder, compiled from C by `build.rs` and embedded as
//! bytes.
//!
//! [`OBJECT`] is the BPF object the agent loads with aya (`smolder_agent::ebpf`). It holds the
//! program [`PROGRAM_SAMPLE`] (perf_event, one per online CPU), the process-lifecycle programs
//! [`PROGRAM_EXEC`] and [`PROGRAM_EXIT`] (raw tracepoints), and the maps named by the `MAP_*`
//! constants. `src/sampler.h` is the contract; the types here mirror it byte for byte:
//! [`SampleKey`] keys the counts maps, [`ProcessEvent`] is what the events ring buffer carries,
//! [`ErrorIndex`] indexes the per-CPU error counters.
//!
//! [`unwind`] holds the second object, the BPF unwinder (whole user stacks from `.eh_frame`
//! tables, through a ring buffer), and the mirror of its contract `src/unwind.h`.
//!
//! Samples go to one of two buffers, each a counts map and a stacks map ([`MAP_COUNTS`],
//! [`MAP_STACKS`]); [`MAP_BUFFER`] says which one the program writes. The agent flips it and
//! drains the other, so nothing is read twice or deleted unread.

pub mod unwind;

/// The compiled sampler, aligned for aya's ELF parser.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sampler.bpf.o"));

/// The perf_event program that counts a sample (`on_sample` in C).
pub const PROGRAM_SAMPLE: &str = "on_sample";
/// The `raw_tp/sched_process_exec` program.
pub const PROGRAM_EXEC: &str = "on_exec";
/// The `raw_tp/sched_process_exit` program.
pub const PROGRAM_EXIT: &str = "on_exit";
/// The raw tracepoint [`PROGRAM_EXEC`] attaches to.
pub const TRACEPOINT_EXEC: &str = "sched_process_exec";
/// The raw tracepoint [`PROGRAM_EXIT`] attaches to.
pub const TRACEPOINT_EXIT: &str = "sched_process_exit";

/// The one-entry array holding the index (0 or 1) of the buffer the program writes.
pub const MAP_BUFFER: &str = "buffer";
/// The counts maps of buffers 0 and 1: [`SampleKey`] → samples (`u64`).
pub const MAP_COUNTS: [&str; 2] = ["counts_0", "counts_1"];
/// The stack trace maps of buffers 0 and 1: stack id → up to [`MAX_STACK_DEPTH`] addresses.
pub const MAP_STACKS: [&str; 2] = ["stacks_0", "stacks_1"];
/// The LRU hash of processes already announced through [`MAP_EVENTS`].
pub const MAP_SEEN: &str = "seen";
/// The ring buffer of [`ProcessEvent`]s.
pub const MAP_EVENTS: &str = "events";
/// The per-CPU array of error counters, indexed by [`ErrorIndex`].
pub const MAP_ERRORS: &str = "errors";
/// The global the agent patches with its own process id so that it is not sampled.
pub const GLOBAL_SELF_TGID: &str = "self_tgid";

/// `SMOLDER_MAX_STACK_DEPTH`: frames a stack can hold (the kernel's `PERF_MAX_STACK_DEPTH`).
pub const MAX_STACK_DEPTH: usize = 127;
/// `SMOLDER_COUNTS_ENTRIES`: the compiled-in size of each counts map.
pub const COUNTS_ENTRIES: u32 = 16384;
/// `SMOLDER_STACKS_ENTRIES`: the compiled-in size of each stacks map.
pub const STACKS_ENTRIES: u32 = 16384;
/// `-EFAULT` as a stack id: no stack of that kind (the kernel stack of a sample taken in user
/// mode, or the user stack of a kernel thread).
pub const STACK_ID_NONE: i32 = -14;
/// `-EEXIST` as a stack id: the stack's bucket held another stack (counted in
/// [`ErrorIndex::UserStackCollision`] or [`ErrorIndex::KernelStackCollision`]).
pub const STACK_ID_COLLISION: i32 = -17;

/// `struct sample_key`: one process and its pair of stacks.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    /// The process (thread group) id.
    pub tgid: u32,
    /// Index into the buffer's stacks map, or a negative errno.
    pub user_stack_id: i32,
    /// Index into the buffer's stacks map, or a negative errno (`-EFAULT` in user mode).
    pub kernel_stack_id: i32,
}

// Three 4-byte fields: no padding on either side.
const _: () = assert!(size_of::<SampleKey>() == 12);

// SAFETY: `SampleKey` is `repr(C)`, `Copy`, made only of integers and has no padding, so every
// bit pattern the kernel writes is a valid value.
unsafe impl aya::Pod for SampleKey {}

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

/// `enum smolder_error`: indexes into the per-CPU [`MAP_ERRORS`] array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorIndex {
    /// The counts map was full; the sample is lost.
    CountsFull = 0,
    /// The user stack collided in the stacks map; the sample is kept without it.
    UserStackCollision = 1,
    /// The kernel stack collided in the stacks map; the sample is kept without it.
    KernelStackCollision = 2,
    /// Reading the user stack failed otherwise; the sample is kept without it.
    UserStackOther = 3,
    /// Reading the kernel stack failed otherwise; the sample is kept without it.
    KernelStackOther = 4,
    /// The events ring buffer was full; a process event is lost.
    EventsLost = 5,
}

impl ErrorIndex {
    /// Every index, in order (`SMOLDER_ERR_COUNT` of them).
    pub const ALL: [ErrorIndex; 6] = [
        ErrorIndex::CountsFull,
        ErrorIndex::UserStackCollision,
        ErrorIndex::KernelStackCollision,
        ErrorIndex::UserStackOther,
        ErrorIndex::KernelStackOther,
        ErrorIndex::EventsLost,
    ];
}
