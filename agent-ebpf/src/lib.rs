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
//!
//! CPython processes (`src/python.h`): the agent registers each in [`MAP_PYTHON_PROCS`]
//! ([`PythonProc`]); their samples carry a Python stack instead of the user stack, keyed by a
//! [`PythonStackKey`] in the [`SampleKey`], deduplicated per buffer in [`MAP_PYTHON_STACKS`] and
//! sent once per buffer through [`MAP_PYTHON_EVENTS`] ([`PythonStackEvent`] then
//! [`PythonFrame`]s).

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
/// CPython processes the walk reads: tgid → [`PythonProc`].
pub const MAP_PYTHON_PROCS: &str = "python_procs";
/// The Python stacks of buffers 0 and 1 already sent: [`PythonStackKey`] → `u8`.
pub const MAP_PYTHON_STACKS: [&str; 2] = ["python_stacks_0", "python_stacks_1"];
/// The ring buffer of new Python stacks: a [`PythonStackEvent`], then its [`PythonFrame`]s.
pub const MAP_PYTHON_EVENTS: &str = "python_events";
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

/// `struct sample_key`: one process and its stacks.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    /// The process (thread group) id.
    pub tgid: u32,
    /// Index into the buffer's stacks map, or a negative errno (`-EFAULT` when a Python stack
    /// stands for it).
    pub user_stack_id: i32,
    /// Index into the buffer's stacks map, or a negative errno (`-EFAULT` in user mode).
    pub kernel_stack_id: i32,
    /// A [`PythonStatus`] as a number (0 for processes that are not walked).
    pub python_status: u16,
    /// With [`PythonStatus::Ok`] or [`PythonStatus::Truncated`]: the Python stack's frames.
    pub python_len: u16,
    /// With them: the Python stack's hash.
    pub python_hash: u64,
}

// Three 4-byte fields, two 2-byte ones, then an 8-byte one at offset 16: no padding.
const _: () = assert!(size_of::<SampleKey>() == 24);

impl SampleKey {
    /// The key of the sample's Python stack, when it has one.
    pub fn python_stack(&self) -> Option<PythonStackKey> {
        matches!(
            PythonStatus::from_raw(self.python_status),
            Some(PythonStatus::Ok | PythonStatus::Truncated)
        )
        .then_some(PythonStackKey {
            tgid: self.tgid,
            len: u32::from(self.python_len),
            hash: self.python_hash,
        })
    }
}

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

/// `SMOLDER_PYTHON_MAX_FRAMES`: Python frames a stack holds.
pub const PYTHON_MAX_FRAMES: usize = 128;
/// `SMOLDER_PYTHON_FRAME_READ`: bytes of a frame the walk reads; every field it uses lies below.
pub const PYTHON_FRAME_READ: u64 = 72;
/// `SMOLDER_PYTHON_NO_OFFSET`: an offset that does not apply.
pub const PYTHON_NO_OFFSET: u16 = 0xffff;
/// `SMOLDER_PYTHON_NO_SHIM`: the shim owner of releases without shim frames.
pub const PYTHON_NO_SHIM: u8 = 0xff;
/// `SMOLDER_PYTHON_STACKS_ENTRIES`: the compiled-in size of each Python stacks map.
pub const PYTHON_STACKS_ENTRIES: u32 = 8192;

/// `enum smolder_python_status`: what the walk found for a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PythonStatus {
    /// Not a CPython process the agent walks.
    None = 0,
    /// The key names a Python stack.
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
    /// The Python stacks map of the buffer was full.
    StacksFull = 8,
}

impl PythonStatus {
    /// The status a [`SampleKey::python_status`] names, if it is one.
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
            8 => PythonStatus::StacksFull,
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

/// `struct python_stack_key`: a Python stack of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PythonStackKey {
    /// The process.
    pub tgid: u32,
    /// Its frames.
    pub len: u32,
    /// The hash of its code objects.
    pub hash: u64,
}

// Two 4-byte fields, then an 8-byte one: no padding.
const _: () = assert!(size_of::<PythonStackKey>() == 16);

// SAFETY: `PythonStackKey` is `repr(C)`, `Copy`, made only of integers and has no padding.
unsafe impl aya::Pod for PythonStackKey {}

/// `struct python_stack_event`: the header of a [`MAP_PYTHON_EVENTS`] record, followed by
/// `key.len` [`PythonFrame`]s, innermost first.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PythonStackEvent {
    /// The stack.
    pub key: PythonStackKey,
    /// The buffer (0 or 1) whose counts reference it.
    pub buffer: u32,
    /// Zero.
    pub reserved: u32,
}

// A 16-byte key and two 4-byte fields.
const _: () = assert!(size_of::<PythonStackEvent>() == 24);
