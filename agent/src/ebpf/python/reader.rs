//! A live CPython process read from user space: its interpreters, their thread states, each
//! thread's chain of `_PyInterpreterFrame`s, and the names of the code they run.
//!
//! Threads are found by walking `_PyRuntime.interpreters.head`, each interpreter's `next`, and
//! each interpreter's `threads.head` list: every thread of every interpreter, subinterpreters
//! included, whether it holds the GIL or not. A thread's frames start at its current frame
//! (`PyThreadState.current_frame` in 3.13, `cframe->current_frame` before) and follow
//! `previous` to the thread's first frame. Shim frames (3.12 and later: owned by the C stack,
//! pushed by each C-level call of the interpreter loop) are skipped; the frame above each one,
//! like 3.11's `is_entry` frames, is marked as an entry frame.
//!
//! The process runs while it is read: a list may change under the reader, so every walk is
//! bounded, and a frame whose code is not a code object fails the read instead of naming
//! garbage. This reader names the frames the BPF walk reports and is the oracle the BPF walk is
//! tested against.

use std::path::Path;
use std::sync::Arc;

use super::PythonError;
use super::detect::Target;
use super::layout::{EntryMarker, FrameAnchor};
use super::memory::{Memory, u8_at, u64_at};
use super::names::{CodeName, NameCache};

/// Interpreters walked at most (the main one and its subinterpreters).
pub const MAX_INTERPRETERS: usize = 64;
/// Thread states walked at most, over all interpreters.
pub const MAX_THREADS: usize = 4096;
/// Frames walked at most per thread, shims included.
pub const MAX_FRAMES: usize = 1024;

/// A thread state: one thread in one interpreter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadState {
    /// Its address.
    pub addr: u64,
    /// The interpreter it belongs to.
    pub interp: u64,
    /// `thread_id`: the thread's `pthread_t`.
    pub thread_id: u64,
    /// `native_thread_id`: the thread's id in the process's PID namespace (0 before the state
    /// is bound to a thread).
    pub native_thread_id: u64,
    /// Its current frame (0 when it runs no Python code).
    pub frame: u64,
}

/// One Python frame as the interpreter holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawFrame {
    /// The code object it runs.
    pub code: u64,
    /// `prev_instr` (3.11, 3.12) or `instr_ptr` (3.13).
    pub instr: u64,
    /// Whether it is the first frame of a C-level call of the interpreter loop: in a mixed
    /// stack, native frames sit between it and its caller.
    pub entry: bool,
}

/// A named frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The raw frame.
    pub raw: RawFrame,
    /// `qualname (filename:first_line)`.
    pub name: Arc<str>,
}

/// One thread's Python stack, leaf first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadStack {
    /// The thread.
    pub thread: ThreadState,
    /// Its frames, the innermost first.
    pub frames: Vec<Frame>,
}

/// A live CPython process, attached.
#[derive(Debug)]
pub struct PythonProcess {
    memory: Memory,
    target: Target,
    names: NameCache,
}

impl PythonProcess {
    /// Attaches to process `pid` under `proc` (normally `/proc`), whose interpreter
    /// [`Detector::process`](super::Detector::process) found as `target`.
    ///
    /// # Errors
    ///
    /// [`PythonError::OpenMemory`] when its memory cannot be opened.
    pub fn attach(proc: &Path, pid: u32, target: Target) -> Result<PythonProcess, PythonError> {
        Ok(PythonProcess {
            memory: Memory::open(proc, pid)?,
            target,
            names: NameCache::default(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.memory.pid()
    }

    /// What the walk starts from.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The interpreters, newest first; empty before the runtime is initialised.
    ///
    /// # Errors
    ///
    /// [`PythonError::Read`] when the list cannot be read, [`PythonError::Inconsistent`] when it
    /// is longer than [`MAX_INTERPRETERS`].
    pub fn interpreters(&self) -> Result<Vec<u64>, PythonError> {
        let layout = &self.target.layout;
        let mut interps = Vec::new();
        let mut interp = self
            .memory
            .u64(self.target.runtime + layout.runtime_interpreters_head)?;
        while interp != 0 {
            if interps.len() == MAX_INTERPRETERS {
                return Err(self.inconsistent("more interpreters than the walk allows"));
            }
            interps.push(interp);
            interp = self.memory.u64(interp + layout.interp_next)?;
        }
        Ok(interps)
    }

    /// Every thread state of every interpreter.
    ///
    /// # Errors
    ///
    /// [`PythonError::Read`] when a list cannot be read, [`PythonError::Inconsistent`] when a
    /// thread state does not point back to its interpreter (the layout is wrong) or the lists
    /// are longer than the walk allows.
    pub fn threads(&self) -> Result<Vec<ThreadState>, PythonError> {
        let layout = &self.target.layout;
        let (frame_field, cframe_current) = match layout.tstate_frame {
            FrameAnchor::Direct(offset) => (offset, None),
            FrameAnchor::CFrame {
                cframe,
                current_frame,
            } => (cframe, Some(current_frame)),
        };
        let len = [
            layout.tstate_next,
            layout.tstate_interp,
            layout.tstate_thread_id,
            layout.tstate_native_thread_id,
            frame_field,
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
            + 8;
        let mut buf = vec![0u8; usize::try_from(len).unwrap_or(0)];
        let mut threads = Vec::new();
        for interp in self.interpreters()? {
            let mut tstate = self.memory.u64(interp + layout.interp_threads_head)?;
            while tstate != 0 {
                if threads.len() == MAX_THREADS {
                    return Err(self.inconsistent("more thread states than the walk allows"));
                }
                self.memory.read(tstate, &mut buf)?;
                if u64_at(&buf, layout.tstate_interp) != interp {
                    return Err(self.inconsistent("a thread state's interp is not its interpreter"));
                }
                let anchor = u64_at(&buf, frame_field);
                let frame = match cframe_current {
                    None => anchor,
                    Some(_) if anchor == 0 => 0,
                    Some(offset) => self.memory.u64(anchor + offset)?,
                };
                threads.push(ThreadState {
                    addr: tstate,
                    interp,
                    thread_id: u64_at(&buf, layout.tstate_thread_id),
                    native_thread_id: u64_at(&buf, layout.tstate_native_thread_id),
                    frame,
                });
                tstate = u64_at(&buf, layout.tstate_next);
            }
        }
        Ok(threads)
    }

    /// The frames of `thread`, leaf first, shims left out.
    ///
    /// # Errors
    ///
    /// [`PythonError::Read`] when a frame cannot be read, [`PythonError::Inconsistent`] when the
    /// chain is longer than [`MAX_FRAMES`].
    pub fn frames(&self, thread: &ThreadState) -> Result<Vec<RawFrame>, PythonError> {
        let layout = &self.target.layout;
        let mut buf = vec![0u8; layout.frame_header_len()];
        let mut frames: Vec<RawFrame> = Vec::new();
        let mut frame = thread.frame;
        let mut walked = 0;
        while frame != 0 {
            if walked == MAX_FRAMES {
                return Err(self.inconsistent("more frames than the walk allows"));
            }
            walked += 1;
            self.memory.read(frame, &mut buf)?;
            let owner = u8_at(&buf, layout.frame_owner);
            match layout.frame_entry {
                EntryMarker::ShimOwner(shim) if owner == shim => {
                    if let Some(last) = frames.last_mut() {
                        last.entry = true;
                    }
                }
                EntryMarker::ShimOwner(_) => frames.push(RawFrame {
                    code: u64_at(&buf, layout.frame_code),
                    instr: u64_at(&buf, layout.frame_instr),
                    entry: false,
                }),
                EntryMarker::Flag(offset) => frames.push(RawFrame {
                    code: u64_at(&buf, layout.frame_code),
                    instr: u64_at(&buf, layout.frame_instr),
                    entry: u8_at(&buf, offset) != 0,
                }),
            }
            frame = u64_at(&buf, layout.frame_previous);
        }
        Ok(frames)
    }

    /// The name of the code object at `code`, from the cache when the object there is still the
    /// one named.
    ///
    /// # Errors
    ///
    /// [`PythonError::Read`], [`PythonError::NotCode`] or [`PythonError::NotString`] when the
    /// object cannot be read or is not a code object with string names.
    pub fn name(&mut self, code: u64) -> Result<CodeName, PythonError> {
        self.names.resolve(&self.memory, &self.target, code)
    }

    /// The name of `code` if [`PythonProcess::name`] checked it in the current window.
    pub fn checked_name(&self, code: u64) -> Option<CodeName> {
        self.names.checked(code)
    }

    /// The name last resolved for `code`, without reading the process (which may have exited).
    pub fn cached_name(&self, code: u64) -> Option<CodeName> {
        self.names.cached(code)
    }

    /// Starts a new window: names are checked against the process again.
    pub fn next_window(&mut self) {
        self.names.next_window();
    }

    /// The names cached for this process.
    pub fn cached_names(&self) -> usize {
        self.names.len()
    }

    /// Drops the cached names not checked in the current window; returns how many.
    pub fn evict_stale_names(&mut self) -> usize {
        self.names.evict_stale()
    }

    /// Drops every cached name; returns how many.
    pub fn clear_names(&mut self) -> usize {
        self.names.clear()
    }

    /// Names the cache dropped for its per-process bound since the last call.
    pub fn take_evicted_names(&mut self) -> usize {
        self.names.take_evicted()
    }

    /// Whether the instruction pointer `instr` of a frame running `code` lies in its bytecode
    /// (`units` 2-byte code units long). 3.11 and 3.12 point at the last instruction started,
    /// one unit before the first before any has; 3.13 at the next, possibly one past the end.
    pub fn instruction_in_code(&self, code: u64, units: u64, instr: u64) -> bool {
        let start = code + self.target.layout.code_adaptive;
        instr + 2 >= start && instr <= start.saturating_add(units.saturating_mul(2))
    }

    /// Every thread's named stack.
    ///
    /// # Errors
    ///
    /// What [`PythonProcess::threads`], [`PythonProcess::frames`] and [`PythonProcess::name`]
    /// return.
    pub fn stacks(&mut self) -> Result<Vec<ThreadStack>, PythonError> {
        let mut stacks = Vec::new();
        for thread in self.threads()? {
            let mut frames = Vec::new();
            for raw in self.frames(&thread)? {
                let name = self.name(raw.code)?;
                frames.push(Frame {
                    raw,
                    name: name.name,
                });
            }
            stacks.push(ThreadStack { thread, frames });
        }
        Ok(stacks)
    }

    fn inconsistent(&self, what: &'static str) -> PythonError {
        PythonError::Inconsistent {
            pid: self.pid(),
            what,
        }
    }
}
