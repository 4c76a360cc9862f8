//! Smolder's kernel-side sampler, compiled from C by `build.rs` and embedded as bytes.
//!
//! [`OBJECT`] is the BPF object the agent loads with aya (`smolder_agent::ebpf`). It holds the
//! program [`PROGRAM_CPU`] (perf_event, one per online CPU: a whole user stack and the kernel
//! stack per tick, unwound by the BPF unwinder), [`PROGRAM_UPROBE`] (the same walk at a probed
//! instruction, the tests' point check), and the process-lifecycle programs [`PROGRAM_EXEC`] and
//! [`PROGRAM_EXIT`] (raw tracepoints), and the off-CPU and memory-growth programs of
//! [`offcpu`] (`tp_btf/sched_switch`, page faults).
//!
//! Three contracts, each a C header mirrored here byte for byte: `src/process.h`, the process
//! events ([`ProcessEvent`], [`EventKind`]) a process's first sample, exec and exit send through
//! [`MAP_EVENTS`]; `src/unwind.h`, the unwinder's tables, mappings and samples, mirrored in
//! [`unwind`]; and `src/offcpu.h`, the off-CPU settings and the huge-page flag, in [`offcpu`].
//!
//! CPython processes (`src/python.h`): the agent registers each in [`MAP_PYTHON_PROCS`]
//! ([`PythonProc`]); the samples of their threads (CPU, off-CPU, memory growth, uprobe) carry
//! the Python frames the walk found ([`PythonFrame`]s after the kernel frames, [`PythonStatus`]
//! in the sample header), which the agent mixes into the native stack.

pub mod offcpu;
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
/// CPython processes the walk reads: tgid → [`PythonProc`].
pub const MAP_PYTHON_PROCS: &str = "python_procs";
/// The walk's cache of each thread's thread state (LRU): thread id → 16 bytes.
pub const MAP_PYTHON_THREADS: &str = "python_threads";

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

/// `SMOLDER_PYTHON_MAX_FRAMES`: Python frames a stack holds.
pub const PYTHON_MAX_FRAMES: usize = 128;
/// `SMOLDER_PYTHON_FRAME_READ`: bytes of a frame the walk reads; every field it uses lies below.
pub const PYTHON_FRAME_READ: u64 = 72;
/// `SMOLDER_PYTHON_NO_OFFSET`: an offset that does not apply.
pub const PYTHON_NO_OFFSET: u16 = 0xffff;
/// `SMOLDER_PYTHON_NO_SHIM`: the shim owner of releases without shim frames.
pub const PYTHON_NO_SHIM: u8 = 0xff;
/// `SMOLDER_PYTHON_PROCS_ENTRIES`: CPython processes [`MAP_PYTHON_PROCS`] holds.
pub const PYTHON_PROCS_ENTRIES: u32 = 4096;

/// `enum smolder_python_status`: what the walk found for a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PythonStatus {
    /// Not a CPython process the agent walks.
    None = 0,
    /// The sample carries the thread's Python frames.
    Ok = 1,
    /// The same, cut at [`PYTHON_MAX_FRAMES`] frames.
    Truncated = 2,
    /// The thread has no thread state: it is not a Python thread.
    NoThread = 3,
    /// The thread runs no Python code.
    NoFrames = 4,
    /// Reading the interpreter's lists failed.
    ReadThread = 5,
    /// Reading a frame failed.
    ReadFrame = 6,
    /// The lists are longer than the walk allows.
    ThreadLimit = 7,
}

impl PythonStatus {
    /// Every status, in code order (`SMOLDER_PYTHON_STATUS_COUNT` of them).
    pub const ALL: [PythonStatus; 8] = [
        PythonStatus::None,
        PythonStatus::Ok,
        PythonStatus::Truncated,
        PythonStatus::NoThread,
        PythonStatus::NoFrames,
        PythonStatus::ReadThread,
        PythonStatus::ReadFrame,
        PythonStatus::ThreadLimit,
    ];

    /// The status a sample header's `python_status` names, if it is one.
    pub fn from_raw(status: u16) -> Option<PythonStatus> {
        Some(match status {
            0 => PythonStatus::None,
            1 => PythonStatus::Ok,
            2 => PythonStatus::Truncated,
            3 => PythonStatus::NoThread,
            4 => PythonStatus::NoFrames,
            5 => PythonStatus::ReadThread,
            6 => PythonStatus::ReadFrame,
            7 => PythonStatus::ThreadLimit,
            _ => return None,
        })
    }
}

/// `struct python_proc`: one CPython process, as the walk reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PythonProc {
    /// The address of `_PyRuntime.interpreters.head`.
    pub interpreters_head: u64,
    /// The device of the process's PID namespace (the kernel's `dev_t` encoding).
    pub pidns_dev: u64,
    /// The inode of the process's PID namespace.
    pub pidns_ino: u64,
    /// `PyInterpreterState.next`.
    pub interp_next: u16,
    /// `PyInterpreterState.threads.head`.
    pub interp_threads_head: u16,
    /// `PyThreadState.next`.
    pub tstate_next: u16,
    /// `PyThreadState.native_thread_id`.
    pub tstate_native_thread_id: u16,
    /// `PyThreadState.current_frame` (3.13) or `cframe` (3.11, 3.12).
    pub tstate_frame: u16,
    /// `_PyCFrame.current_frame`, or [`PYTHON_NO_OFFSET`].
    pub cframe_current_frame: u16,
    /// `_PyInterpreterFrame.previous`.
    pub frame_previous: u16,
    /// `f_code` or `f_executable`.
    pub frame_code: u16,
    /// `prev_instr` or `instr_ptr`.
    pub frame_instr: u16,
    /// `owner`.
    pub frame_owner: u16,
    /// The owner of shim frames, or [`PYTHON_NO_SHIM`].
    pub shim_owner: u8,
    /// `is_entry` (3.11), or [`PYTHON_NO_SHIM`].
    pub frame_is_entry: u8,
    /// Zero.
    pub reserved: [u8; 2],
}

// Three 8-byte fields, ten 2-byte ones, four bytes: 48, no padding.
const _: () = assert!(size_of::<PythonProc>() == 48);

// SAFETY: `PythonProc` is `repr(C)`, `Copy`, made only of integers and has no padding.
unsafe impl aya::Pod for PythonProc {}

/// `SMOLDER_PYTHON_ENTRY`: bit 0 of [`PythonFrame::code`] marks an entry frame, the first one a
/// C-level call of the interpreter loop runs.
pub const PYTHON_ENTRY: u64 = 1;

/// `struct python_frame`: one Python frame.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PythonFrame {
    /// The code object's address, with [`PYTHON_ENTRY`] set for an entry frame.
    pub code: u64,
    /// The frame's instruction pointer (`prev_instr` or `instr_ptr`).
    pub instr: u64,
}

impl PythonFrame {
    /// The code object's address.
    pub fn code_object(&self) -> u64 {
        self.code & !PYTHON_ENTRY
    }

    /// Whether the frame is an entry frame.
    pub fn is_entry(&self) -> bool {
        self.code & PYTHON_ENTRY != 0
    }
}

// Two 8-byte fields.
const _: () = assert!(size_of::<PythonFrame>() == 16);
