//! CPython: which processes run it, and their Python frames read from their memory and mixed
//! into their native stacks.
//!
//! Input: process ids the eBPF source has seen, and the Python frames the kernel walked with each
//! sample of their threads (`agent-ebpf/src/python.h`: code object, entry mark and instruction
//! pointer per frame). Output: for each CPython process, the interpreter found in it
//! ([`ProcessInterpreter`]: release, layout, addresses) and its `python_procs` entry; the drained
//! samples' Python frames as names, `qualname (path:first_line)`, placed in their native stacks.
//! Caller: the eBPF source's `smolder-ebpf` thread. Owns an open `/proc/PID/mem` per walked
//! process, the names of their code objects, and the per-binary cache of inspected interpreters
//! ([`Detector`]).
//!
//! Supported: CPython 3.11, 3.12 and 3.13 on x86-64 with glibc, linked statically or as
//! `libpython3.X.so`. Everything else that is CPython (older, newer, pre-releases, free-threaded,
//! musl) is detected, counted and reported as [`Unsupported`], never walked with guessed
//! offsets: those processes keep their native stacks. Walked processes show mixed stacks: each
//! native frame of the interpreter loop (`_PyEval_EvalFrameDefault`) gives way to the Python
//! frames that call of the loop ran, so C extensions, the interpreter and Python code appear in
//! the order they called each other ([`place`]).
//!
//! Files: `detect.rs` finds the interpreter and its release in a process's binaries;
//! `layout.rs` holds the offsets per release (tables for 3.11 and 3.12, 3.13's own
//! `_Py_DebugOffsets`); `memory.rs` reads `/proc/PID/mem`; `reader.rs` walks interpreters,
//! threads and frames from user space (the BPF walk's oracle in the tests); `names.rs` reads
//! code objects and strings and caches names; `maps.rs` registers processes in the kernel;
//! `mixed.rs` places Python frames in a native stack; `table.rs` ([`Pythons`]) ties them
//! together for the eBPF source.

mod detect;
mod layout;
mod maps;
mod memory;
mod mixed;
mod names;
mod reader;
mod table;

use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use detect::{
    Detector, Interpreter, ProcessInterpreter, PythonVersion, Target, Unsupported, inspect,
};
pub use layout::{EntryMarker, FrameAnchor, Layout};
pub use maps::PythonMaps;
pub use memory::Memory;
pub use mixed::{MixError, Placement, Walks, groups, place};
pub use names::{CodeInfo, CodeName, NameCache, read_code, read_string};
pub use reader::{
    Frame, MAX_FRAMES, MAX_INTERPRETERS, MAX_THREADS, PythonProcess, RawFrame, ThreadStack,
    ThreadState,
};
pub use table::{Pythons, UNKNOWN_CODE, kernel_entry};

/// Python stacks (`ebpf.python:` in the config file).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct PythonConfig {
    /// Whether the samples of CPython 3.11 to 3.13 processes (x86-64, glibc) carry their Python
    /// frames, read from the interpreter by the kernel and mixed into the native stack in place
    /// of the interpreter loop's frames. Default `true`; `false` leaves native frames only.
    pub enabled: bool,
}

impl Default for PythonConfig {
    fn default() -> Self {
        PythonConfig { enabled: true }
    }
}

/// Why a CPython process or binary could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    /// `/proc/PID/maps` could not be read: the process has exited.
    #[error("reading the memory map of process {pid} failed")]
    Maps {
        /// The process.
        pid: u32,
        /// Why.
        source: io::Error,
    },
    /// A binary's ELF headers or dynamic symbols could not be parsed.
    #[error("reading the symbols of {path} failed")]
    Inspect {
        /// The binary, as opened.
        path: PathBuf,
        /// What the ELF parser reported.
        source: object::read::Error,
    },
    /// A binary could not be mapped, or `Py_Version` or `_Py_DebugOffsets` lie past its end.
    #[error("reading {path} failed")]
    ReadBinary {
        /// The binary, as opened.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// 3.13's `_Py_DebugOffsets` disagrees with the binary or with itself.
    #[error("the debug offsets of CPython {version:#x} are unusable: {what}")]
    DebugOffsets {
        /// `Py_Version`.
        version: u32,
        /// What is wrong.
        what: &'static str,
    },
    /// The interpreter is a free-threaded build.
    #[error("CPython {version:#x} is a free-threaded build")]
    FreeThreaded {
        /// `Py_Version`.
        version: u32,
    },
    /// The interpreter's symbols lie outside the process's mappings of its binary.
    #[error("process {pid} does not map the CPython state of {path}")]
    Unmapped {
        /// The process.
        pid: u32,
        /// The binary.
        path: PathBuf,
    },
    /// `/proc/PID/mem` could not be opened: the process has exited, or the agent lacks
    /// `CAP_SYS_PTRACE`.
    #[error("opening the memory of process {pid} failed")]
    OpenMemory {
        /// The process.
        pid: u32,
        /// Why.
        source: io::Error,
    },
    /// A range of the process's memory could not be read: unmapped, or the process has exited.
    #[error("reading {len} bytes at {addr:#x} of process {pid} failed")]
    Read {
        /// The process.
        pid: u32,
        /// The address.
        addr: u64,
        /// The bytes asked for.
        len: usize,
        /// Why.
        source: io::Error,
    },
    /// What a frame runs is not a code object: the frame changed while it was read, or the
    /// object was freed.
    #[error("the object at {addr:#x} of process {pid} is not a code object")]
    NotCode {
        /// The process.
        pid: u32,
        /// The object's address.
        addr: u64,
    },
    /// A code object's name or file name is not a string the reader knows.
    #[error("the object at {addr:#x} of process {pid} is not a readable str: {what}")]
    NotString {
        /// The process.
        pid: u32,
        /// The object's address.
        addr: u64,
        /// What is wrong.
        what: &'static str,
    },
    /// The interpreter's lists do not hold together: the layout is wrong, or they changed
    /// while read.
    #[error("the CPython state of process {pid} is inconsistent: {what}")]
    Inconsistent {
        /// The process.
        pid: u32,
        /// What is wrong.
        what: &'static str,
    },
}

impl PythonError {
    /// The error as a bounded metric label value.
    pub fn reason(&self) -> &'static str {
        match self {
            PythonError::Maps { .. } => "maps",
            PythonError::Inspect { .. } | PythonError::ReadBinary { .. } => "binary",
            PythonError::DebugOffsets { .. } => "debug_offsets",
            PythonError::FreeThreaded { .. } => "free_threaded",
            PythonError::Unmapped { .. } => "unmapped",
            PythonError::OpenMemory { .. } => "open_memory",
            PythonError::Read { .. } => "read",
            PythonError::NotCode { .. } => "not_code",
            PythonError::NotString { .. } => "not_string",
            PythonError::Inconsistent { .. } => "inconsistent",
        }
    }
}
