//! Symbolization: addresses of sampled stacks to function names, on a thread of its own.
//!
//! Input: [`StackCount`]s of one window, of any [`SampleKind`], plus
//! [`Symbolizer::capture`] calls for processes the sampler sees for the first time (or after an
//! exec) and [`Symbolizer::forget`] calls once an exited process's grace period is over. Output:
//! [`SymbolizedSample`]s whose frames are names, root first (user frames, then the kernel frames
//! below them). Caller: the eBPF source ([`crate::ebpf`]). Owns the `smolder-symbolize` thread,
//! which owns a blazesym `Symbolizer` (not `Send`), the captured process maps, the open
//! binaries and debug files, the frame cache, and the debuginfod client's thread.
//!
//! The thread is the health loop `symbolize`, supervised: if blazesym panics (on an odd ELF,
//! say), the window it worked on is dropped and counted, and the loop starts again after a
//! backoff with fresh state, capturing processes again as their samples come.
//!
//! User frames come from symbol tables (no DWARF, so no line numbers), demangled for Rust and
//! C++: the binary's own `.symtab`, else its separate debug file's (found the way gdb finds it,
//! `debuginfo.rs`, or fetched by build id from `symbolize.debuginfod-urls` in the background,
//! `debuginfod.rs`), else its `.dynsym` (a stripped binary's exported functions). Code in
//! anonymous memory is named from the runtime's perf map (`/tmp/perf-PID.map`) while the
//! process lives; kernel frames from `/proc/kallsyms`. A frame that cannot be named reads
//! `module+0xoffset` (file offset) or `[unknown]`, never a bare address. A user stack cut at
//! the unwinder's depth limit gets a `[truncated]` root.

mod binaries;
mod cache;
mod debuginfo;
mod debuginfod;
mod maps;
mod resolve;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use smolder_daemon::{Heartbeat, Supervised, supervise};

pub use self::debuginfo::{DebugDirs, DebugSource};
pub(crate) use self::debuginfod::FETCH_OUTCOMES;
use super::metrics::SymbolizeMetrics;
use super::sample::{SampleKind, StackCount};

/// The root frame of a user stack cut at the unwinder's depth limit (`ebpf.max-frames`).
pub const TRUNCATED: &str = "[truncated]";

/// The symbolizer's settings (`symbolize:` in the config file).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct SymbolizeConfig {
    /// Binaries held open for symbolization; the least recently used is closed first (and
    /// reopened from a live process when needed again). A binary named from its separate debug
    /// file holds that file open too: up to twice this many descriptors. Default `256`, so at
    /// most 512, well below the usual 1024 open-file limit.
    pub max_open_files: usize,
    /// Resolved frames remembered across drains. Default `65536` (a few MiB).
    pub max_cached_frames: usize,
    /// Whether kernel frames are shown below user frames. Default `true`.
    pub kernel_frames: bool,
    /// Where separate debug files are looked for, by build id (`<dir>/.build-id/xx/….debug`)
    /// and by `.gnu_debuglink` name, inside a process's root (containers) and on the host:
    /// gdb's `debug-file-directory`. Default `[/usr/lib/debug]`, where Debian's `-dbgsym`
    /// packages and `libc6-dbg` install them.
    pub debug_dirs: Vec<PathBuf>,
    /// debuginfod servers to fetch missing debug files from by build id, tried in order, as
    /// `DEBUGINFOD_URLS` lists them (`https://debuginfod.debian.net`, say). Default none: no
    /// build id leaves the host. Fetches run in the background into `<data dir>/debuginfod/`;
    /// frames of a binary stay `module+0xoffset` until its file arrives.
    pub debuginfod_urls: Vec<String>,
    /// How long one debuginfod request may take, connection and download. Default `60s`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub debuginfod_timeout: Duration,
    /// Bytes of debug files kept in `<data dir>/debuginfod/`; the least recently used go
    /// first, and a larger file is not fetched. Default 1 GiB.
    pub debuginfod_cache_bytes: u64,
}

impl Default for SymbolizeConfig {
    fn default() -> Self {
        SymbolizeConfig {
            max_open_files: 256,
            max_cached_frames: 65536,
            kernel_frames: true,
            debug_dirs: vec![PathBuf::from("/usr/lib/debug")],
            debuginfod_urls: Vec::new(),
            debuginfod_timeout: Duration::from_secs(60),
            debuginfod_cache_bytes: 1 << 30,
        }
    }
}

/// A [`StackCount`] with names for its frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolizedSample {
    /// What the samples measure.
    pub kind: SampleKind,
    /// The process id.
    pub pid: u32,
    /// Frame names, root first: user frames, then kernel frames.
    pub frames: Vec<Arc<str>>,
    /// How many times the stack was sampled.
    pub count: u64,
}

/// Why the symbolizer could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum SymbolizeError {
    /// The symbolizer thread could not be started.
    #[error("starting the symbolizer thread failed")]
    Spawn(#[source] std::io::Error),
    /// The symbolizer dropped the request: it failed on it (it panicked, and restarts), or it
    /// has stopped for good (it failed too often in a row).
    #[error("the symbolizer dropped the request (it failed and restarts, or has stopped)")]
    Stopped,
}

enum Request {
    Capture(u32),
    Forget(u32),
    Symbolize(Vec<StackCount>, mpsc::Sender<Vec<SymbolizedSample>>),
}

/// A pending answer to [`Symbolizer::submit`].
pub struct Pending(mpsc::Receiver<Vec<SymbolizedSample>>);

impl Pending {
    /// The answer, waiting at most `timeout` for it.
    ///
    /// # Errors
    ///
    /// [`SymbolizeError::Stopped`] when the thread stopped without answering.
    pub fn wait_for(
        &self,
        timeout: std::time::Duration,
    ) -> Result<Option<Vec<SymbolizedSample>>, SymbolizeError> {
        match self.0.recv_timeout(timeout) {
            Ok(answer) => Ok(Some(answer)),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(SymbolizeError::Stopped),
        }
    }
}

/// The handle to the symbolizer thread; dropping it stops the thread.
pub struct Symbolizer {
    tx: Option<mpsc::Sender<Request>>,
    thread: Option<Supervised>,
}

impl Symbolizer {
    /// Starts the symbolizer thread under supervision with `heartbeat`, looking for debug files
    /// in `debug` (whose `downloaded` directory is the debuginfod client's cache; none: no
    /// debuginfod).
    ///
    /// # Errors
    ///
    /// [`SymbolizeError::Spawn`] when the thread cannot be created.
    pub fn start(
        config: SymbolizeConfig,
        debug: DebugDirs,
        metrics: SymbolizeMetrics,
        heartbeat: Heartbeat,
    ) -> Result<Symbolizer, SymbolizeError> {
        let (tx, rx) = mpsc::channel();
        let thread = supervise(heartbeat, "smolder-symbolize", move |beat| {
            // Each run starts afresh: a panic may have left blazesym's caches half-built.
            resolve::run(config.clone(), debug.clone(), metrics.clone(), &rx, beat);
            Ok(())
        })
        .map_err(SymbolizeError::Spawn)?;
        Ok(Symbolizer {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    fn send(&self, request: Request) -> Result<(), SymbolizeError> {
        self.tx
            .as_ref()
            .expect("the sender lives until drop")
            .send(request)
            .map_err(|_| SymbolizeError::Stopped)
    }

    /// Captures `pid`'s memory map and opens its binaries now, while it runs; it goes ahead of
    /// any symbolization in progress. Called again after an exec.
    ///
    /// # Errors
    ///
    /// [`SymbolizeError::Stopped`] when the thread has stopped.
    pub fn capture(&self, pid: u32) -> Result<(), SymbolizeError> {
        self.send(Request::Capture(pid))
    }

    /// Drops what was captured for `pid` (after its exit and grace period).
    ///
    /// # Errors
    ///
    /// [`SymbolizeError::Stopped`] when the thread has stopped.
    pub fn forget(&self, pid: u32) -> Result<(), SymbolizeError> {
        self.send(Request::Forget(pid))
    }

    /// Queues `samples` for symbolization; the answer keeps their order.
    ///
    /// # Errors
    ///
    /// [`SymbolizeError::Stopped`] when the thread has stopped.
    pub fn submit(&self, samples: Vec<StackCount>) -> Result<Pending, SymbolizeError> {
        let (reply, answer) = mpsc::channel();
        self.send(Request::Symbolize(samples, reply))?;
        Ok(Pending(answer))
    }
}

impl Drop for Symbolizer {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(thread) = self.thread.take() {
            thread.join();
        }
    }
}
