//! The unwind tables' lifecycle, off the sampling path: whole stacks for code without frame
//! pointers.
//!
//! Input: process events (first sight, exec, exit), the processes sampled each window and the
//! walks that left a process's known mappings ([`Miss`]), from the eBPF source's thread.
//! Output: one table per executable in the kernel's `unwind_tables` and each process's
//! executable mappings in `unwind_mappings`, which the BPF unwinder reads; [`Ready`] reports
//! when a process's tables are in. Caller: the eBPF source ([`crate::ebpf`]). Owns the
//! `smolder-unwind` thread, the two maps, the disk cache `<data dir>/unwind/` and the mapped
//! files while it reads them.
//!
//! At a process's first sight (and after an exec, and when a walk leaves its known mappings,
//! as after a `dlopen`; and, with `ebpf.unwind.load-at-start`, for every process running when
//! the agent starts, a few at a time when nothing more urgent waits), the thread reads
//! `/proc/PID/maps`, opens each mapped binary (`/proc/PID/map_files`, else `/proc/PID/root`, see
//! [`crate::ebpf::process`]) and names it by build id. The mappings whose tables are in the
//! kernel go into the LPM trie at once; the other tables are asked of the `smolder-unwind-build`
//! thread (`builder.rs`: the disk cache, else built with `smolder-unwind`, with the separate
//! debug file's `.debug_frame` where `.eh_frame` is missing; a sampled process's first, then
//! those the cache holds), put into the kernel as they come, together when several do
//! (`kernel.rs`: exactly sized arrays filled through a mapping of their fds, inserted in one
//! batch), and only then their mappings, so the BPF side never finds a mapping without its
//! table. A process is ready once it waits for no table: building python3.11's table never
//! holds up a process that maps only libc. The vDSO's table is built from the agent's own copy
//! (`vdso.rs`). Until its tables are in, and wherever no table applies, a walk steps with frame
//! pointers. Tables stay within
//! `ebpf.unwind.max-table-bytes` of kernel memory: those no live process maps go first, then
//! those of the least recently sampled processes (`state.rs`, the sans-IO core). An exited
//! process's mappings leave the kernel at its exit (a process reusing its pid must not be walked
//! through them; one whose exit event was lost is told apart by its start time), what is known
//! of it after `ebpf.exit-grace`.

mod builder;
mod file;
mod kernel;
pub mod metrics;
mod source;
mod state;
mod vdso;
mod worker;

use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use smolder_daemon::Heartbeat;
use smolder_unwind::Limits;
use tracing::info;

use self::builder::{Builder, Built};
pub(crate) use self::file::{FileBytes, Stamp, crc32, open_regular};
use self::kernel::Kernel;
pub use self::kernel::KernelError;
pub use self::metrics::UnwindMetrics;
use self::source::DiskCache;
use self::state::Tables;
use self::worker::Worker;
use super::loader::UnwindMaps;
use super::metrics::UNWIND_QUEUE_FULL;
use super::samples::Miss;
use super::symbolize::DebugDirs;
use crate::tier::{DroppedUnit, StageCounters};

/// The unwind tables' settings (`ebpf.unwind:` in the config file).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct UnwindConfig {
    /// Whether unwind tables are loaded. Default `true`; `false` walks every stack with frame
    /// pointers, which stops after a frame or two in code built without them (most of Debian,
    /// `gcc -O2`, Rust release builds).
    pub enabled: bool,
    /// Kernel memory for tables, in bytes. Default 64 MiB, about 8 million rows: every ELF file
    /// of a full Debian development host at once, many times a service host's (libc and
    /// python3.11 take 0.75 MiB together). Past it, the tables of the least recently sampled
    /// processes are evicted.
    pub max_table_bytes: u64,
    /// Bytes of tables kept on disk under `<data dir>/unwind/`, so that a restart does not
    /// build them again. Default 256 MiB; the least recently used go first.
    pub max_cache_bytes: u64,
    /// Whether the processes running when the agent starts get their tables right away, after
    /// those being sampled, rather than at their first sample. Default `true`: on a busy host
    /// the sampler can take tens of seconds to land on every process once, and each one's first
    /// samples would be walked with frame pointers. It costs the tables of processes that are
    /// never sampled (idle daemons): preloading stops at the first eviction (the budget,
    /// `max-table-bytes`, is full), and unsampled tables are the first evicted.
    pub load_at_start: bool,
}

impl Default for UnwindConfig {
    fn default() -> Self {
        UnwindConfig {
            enabled: true,
            max_table_bytes: 64 << 20,
            max_cache_bytes: 256 << 20,
            load_at_start: true,
        }
    }
}

/// The most requests waiting for the `smolder-unwind` thread; past it, requests are dropped
/// (`smolder_agent_dropped_requests_total{reason="unwind_queue_full"}`) rather than queued
/// without bound behind a thread that is stuck. A process whose first sight is dropped is
/// loaded at its next window's `Sampled`.
pub(crate) const MAX_QUEUED_REQUESTS: usize = 4096;

/// A process whose tables and mappings are in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ready {
    /// The process.
    pub pid: u32,
    /// How long after its first sight: its first sample (seen at the poll that read it, so
    /// the wait in the unwinder's queue counts), or, for a process preloaded at the agent's
    /// start, the agent's start; for a refresh, how long the refresh took.
    pub after: Duration,
    /// Whether it was loaded because it ran at the agent's start (`ebpf.unwind.load-at-start`)
    /// rather than at its first sample.
    pub preloaded: bool,
    /// When.
    pub at: Instant,
    /// Whether its mappings were read again (a walk left them) and changed, rather than read
    /// for the first time.
    pub refresh: bool,
}

enum Request {
    Preload(Vec<u32>, Instant),
    Seen {
        pid: u32,
        start_time: u64,
        at: Instant,
    },
    Exec {
        pid: u32,
        start_time: u64,
        at: Instant,
    },
    Exited(u32),
    Sampled(Vec<u32>),
    Missed(Vec<Miss>),
    /// A table the builder had (not counted in `requests_queued`).
    Built(Box<Built>),
    /// The handle was dropped (the builder holds a sender too, so the channel stays open).
    Stop,
}

/// Why the unwinder could not start.
#[derive(Debug, thiserror::Error)]
pub enum UnwinderError {
    /// The disk cache directory cannot be created or read.
    #[error("opening the unwind table cache in {path} failed")]
    Cache {
        /// The directory.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The thread cannot be started.
    #[error("starting the unwinder thread failed")]
    Spawn(#[source] std::io::Error),
}

/// The handle to the `smolder-unwind` thread; dropping it stops the thread.
pub struct Unwinder {
    tx: Option<mpsc::SyncSender<Request>>,
    queued: prometheus::IntGauge,
    errors: StageCounters,
    ready: mpsc::Receiver<Ready>,
    thread: Option<JoinHandle<()>>,
}

/// Where the unwinder reports: its metrics, the eBPF stage's error counters, and its heartbeat
/// (the health loop `unwind`).
pub struct Reporting {
    /// `smolder_agent_unwind_*`.
    pub metrics: UnwindMetrics,
    /// `smolder_agent_errors_total{stage="ebpf"}` and the dropped counters.
    pub errors: StageCounters,
    /// Beaten on each turn of the thread.
    pub heartbeat: Heartbeat,
}

impl Unwinder {
    /// Starts the thread over the unwinder's `maps`. `cache_dir` holds the disk cache (none:
    /// tables are built at every start); `debug` says where separate debug files are; an exited
    /// process's mappings stay for `grace`. The thread beats `reporting.heartbeat` on each turn; a panic leaves it dead, which fails `/healthz`, so that systemd
    /// restarts the agent (its tables come back from the disk cache).
    ///
    /// # Errors
    ///
    /// [`UnwinderError::Cache`] when the cache directory cannot be opened, [`UnwinderError::Spawn`]
    /// when the thread cannot start.
    pub fn start(
        maps: UnwindMaps,
        config: &UnwindConfig,
        grace: Duration,
        cache_dir: Option<&Path>,
        debug: DebugDirs,
        reporting: Reporting,
    ) -> Result<Unwinder, UnwinderError> {
        let Reporting {
            metrics,
            errors,
            heartbeat,
        } = reporting;
        let cache = cache_dir
            .map(|dir| {
                DiskCache::open(dir, config.max_cache_bytes).map_err(|source| {
                    UnwinderError::Cache {
                        path: dir.to_path_buf(),
                        source,
                    }
                })
            })
            .transpose()?;
        info!(
            cached_bytes = cache.as_ref().map_or(0, DiskCache::used_bytes),
            max_table_bytes = config.max_table_bytes,
            "unwinder starting"
        );
        let (tx, rx) = mpsc::sync_channel(MAX_QUEUED_REQUESTS);
        let (ready_tx, ready) = mpsc::channel();
        let dropped = errors.clone();
        let tables = Tables::new(
            config.max_table_bytes,
            smolder_agent_ebpf::unwind::TABLES_ENTRIES as usize,
        );
        let queued = metrics.requests_queued.clone();
        let builder = Builder::start(
            cache,
            debug,
            Limits::default(),
            tx.clone(),
            metrics.cache_bytes.clone(),
        )
        .map_err(UnwinderError::Spawn)?;
        let thread = std::thread::Builder::new()
            .name("smolder-unwind".to_owned())
            .spawn(move || {
                let _span = tracing::info_span!("unwind").entered();
                let mut worker = Worker::new(
                    Kernel::new(maps),
                    tables,
                    builder,
                    grace,
                    metrics,
                    errors,
                    ready_tx,
                );
                worker.run(&rx, &heartbeat);
                // The builder may wait to send a table: the channel goes first, then the
                // builder (joined as the worker drops).
                drop(rx);
                drop(worker);
            })
            .map_err(UnwinderError::Spawn)?;
        Ok(Unwinder {
            tx: Some(tx),
            queued,
            errors: dropped,
            ready,
            thread: Some(thread),
        })
    }

    fn send(&self, request: Request) {
        // A stopped thread (it panicked) leaves stacks walked with frame pointers: sampling goes
        // on.
        // Counted before it is sent, so that the thread never takes it before it counts.
        self.queued.inc();
        match self
            .tx
            .as_ref()
            .expect("the sender lives until drop")
            .try_send(request)
        {
            Ok(()) => {}
            Err(mpsc::TrySendError::Full(_)) => {
                self.queued.dec();
                self.errors
                    .dropped(DroppedUnit::Requests, UNWIND_QUEUE_FULL, 1);
            }
            Err(mpsc::TrySendError::Disconnected(_)) => self.queued.dec(),
        }
    }

    /// `pids` were running when the agent started: load their tables when nothing more urgent
    /// waits.
    pub fn preload(&self, pids: Vec<u32>) {
        self.send(Request::Preload(pids, Instant::now()));
    }

    /// `pid`, which started at `start_time` (`/proc/PID/stat`), was sampled for the first
    /// time: load its tables. A tracked process with another start time is one whose pid was
    /// reused: it starts over.
    pub fn seen(&self, pid: u32, start_time: u64) {
        self.send(Request::Seen {
            pid,
            start_time,
            at: Instant::now(),
        });
    }

    /// `pid` exec'd: its address space is new.
    pub fn exec(&self, pid: u32, start_time: u64) {
        self.send(Request::Exec {
            pid,
            start_time,
            at: Instant::now(),
        });
    }

    /// `pid` exited: its mappings leave the kernel now, what is known of it after the grace
    /// period.
    pub fn exited(&self, pid: u32) {
        self.send(Request::Exited(pid));
    }

    /// `pids` were sampled in the window just drained: their tables are in use.
    pub fn sampled(&self, pids: Vec<u32>) {
        self.send(Request::Sampled(pids));
    }

    /// Walks that left the tables: their processes may have mapped code since.
    pub fn missed(&self, misses: Vec<Miss>) {
        if !misses.is_empty() {
            self.send(Request::Missed(misses));
        }
    }

    /// The processes whose tables went in since the last call.
    pub fn take_ready(&self) -> Vec<Ready> {
        self.ready.try_iter().collect()
    }
}

impl Drop for Unwinder {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            // Waits for room behind the requests queued; fails when the thread is gone.
            let _ = tx.send(Request::Stop);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
