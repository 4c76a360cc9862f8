//! The `smolder-unwind-build` thread: has the tables the worker asks for (`source.rs`: the disk
//! cache, else built from the binary), the most urgent first, so that building a large table
//! (python3.11's 65k rows, libLLVM's million) never holds up a process whose tables are had
//! already, or are quick to have.
//!
//! Input: [`Job`]s from the worker: urgent (a process was sampled) or not (a process preloaded
//! at the agent's start); a waiting job is hurried when a sampled process needs it. Output:
//! [`Built`] tables, sent back to the worker's queue. Owns the disk cache and the files while it
//! reads them. Order: urgent jobs first, then those in the disk cache (read in milliseconds),
//! then the smallest binaries first: on a loaded host, where the thread waits for a CPU like
//! everything else, the processes that need only small tables (and libc's, which nearly all
//! map) are not held up by one that needs a large one.

use std::collections::HashMap;
use std::fs::File;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use smolder_unwind::{Elf, ExeId, Limits, UnwindError};
use tracing::{debug, debug_span};

use super::Request;
use super::file::{FileBytes, Stamp};
use super::source::{self, DiskCache, Had};
use crate::ebpf::symbolize::DebugDirs;

/// Where a binary's bytes come from.
pub(super) enum Source {
    /// A mapped file, opened by the worker (through `/proc/PID/map_files` or the process's
    /// root), read only once its turn comes.
    File {
        /// The open file.
        file: File,
        /// Its stamp when the worker opened it.
        stamp: Stamp,
    },
    /// An image in memory (the vDSO).
    Image(Arc<[u8]>),
}

/// A table to have.
pub(super) struct Job {
    pub(super) id: ExeId,
    pub(super) source: Source,
    /// A process that maps it (where its separate debug file is looked for).
    pub(super) pid: u32,
    /// Its path in that process.
    pub(super) path: Arc<str>,
    /// Whether a sampled process waits for it (rather than only preloaded ones).
    pub(super) urgent: bool,
    /// The binary's size in bytes, which building its table takes time in proportion to.
    pub(super) size: u64,
}

/// A table had, or why not.
pub(super) struct Built {
    pub(super) id: ExeId,
    pub(super) path: Arc<str>,
    pub(super) result: Result<Had, UnwindError>,
}

struct Waiting {
    job: Job,
    /// The order it was asked in.
    seq: u64,
}

#[derive(Default)]
struct Queue {
    jobs: HashMap<ExeId, Waiting>,
    next_seq: u64,
    stopped: bool,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while the lock is held leaves the queue consistent (one insert or remove).
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The handle to the builder thread; dropping it stops the thread (the job in progress ends
/// first).
pub(super) struct Builder {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Builder {
    /// Starts the thread: it reads tables from `cache` or builds them (with the separate debug
    /// files `debug` finds, within `limits`), sends each to `out`, and keeps `cache_bytes` at
    /// the cache's size.
    pub(super) fn start(
        cache: Option<DiskCache>,
        debug: DebugDirs,
        limits: Limits,
        out: SyncSender<Request>,
        cache_bytes: prometheus::IntGauge,
    ) -> std::io::Result<Builder> {
        let shared = Arc::new(Shared::default());
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("smolder-unwind-build".to_owned())
            .spawn(move || {
                let _span = tracing::info_span!("unwind_build").entered();
                let mut cache = cache;
                if let Some(cache) = &cache {
                    cache_bytes.set(i64::try_from(cache.used_bytes()).unwrap_or(i64::MAX));
                }
                while let Some(job) = next(&theirs, cache.as_ref()) {
                    let started = std::time::Instant::now();
                    let result = build(&job, cache.as_mut(), &debug, &limits);
                    debug!(
                        path = &*job.path,
                        urgent = job.urgent,
                        ms = started.elapsed().as_millis() as u64,
                        origin = result.as_ref().map_or("none", |had| had.origin.name()),
                        "unwind table had"
                    );
                    if let Some(cache) = &cache {
                        cache_bytes.set(i64::try_from(cache.used_bytes()).unwrap_or(i64::MAX));
                    }
                    let built = Built {
                        id: job.id,
                        path: job.path,
                        result,
                    };
                    // The worker stopped: so does the builder.
                    if out.send(Request::Built(Box::new(built))).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Builder {
            shared,
            thread: Some(thread),
        })
    }

    /// Asks for a table; a job for the same executable already waiting is kept, made urgent
    /// if this one is.
    pub(super) fn submit(&self, job: Job) {
        let mut queue = self.shared.lock();
        if let Some(waiting) = queue.jobs.get_mut(&job.id) {
            waiting.job.urgent |= job.urgent;
        } else {
            let seq = queue.next_seq;
            queue.next_seq += 1;
            queue.jobs.insert(job.id.clone(), Waiting { job, seq });
        }
        drop(queue);
        self.shared.wake.notify_one();
    }

    /// Makes the waiting jobs of `ids` urgent: a sampled process needs them.
    pub(super) fn hurry<'a>(&self, ids: impl IntoIterator<Item = &'a ExeId>) {
        let mut queue = self.shared.lock();
        for id in ids {
            if let Some(waiting) = queue.jobs.get_mut(id) {
                waiting.job.urgent = true;
            }
        }
    }

    /// Jobs waiting (not the one in progress).
    pub(super) fn waiting(&self) -> usize {
        self.shared.lock().jobs.len()
    }

    /// Whether the thread ended: it panicked (the worker passes the panic on) or the worker
    /// stopped.
    pub(super) fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits for the thread to end (it has, [`Builder::is_finished`]) and passes its panic on.
    pub(super) fn join(&mut self) {
        if let Some(thread) = self.thread.take()
            && let Err(panic) = thread.join()
        {
            std::panic::resume_unwind(panic);
        }
    }
}

impl Drop for Builder {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The next job: urgent first, then those the cache holds, then the smallest, then the oldest.
/// `None` once stopped.
fn next(shared: &Shared, cache: Option<&DiskCache>) -> Option<Job> {
    let mut queue = shared.lock();
    loop {
        if queue.stopped {
            return None;
        }
        let first = queue
            .jobs
            .iter()
            .min_by_key(|(id, waiting)| {
                let cached = cache.is_some_and(|cache| cache.has(id));
                (!waiting.job.urgent, !cached, waiting.job.size, waiting.seq)
            })
            .map(|(id, _)| id.clone());
        if let Some(id) = first {
            return queue.jobs.remove(&id).map(|waiting| waiting.job);
        }
        queue = shared.wake.wait(queue).unwrap_or_else(|p| p.into_inner());
    }
}

/// Has the table of `job`'s binary.
fn build(
    job: &Job,
    cache: Option<&mut DiskCache>,
    debug: &DebugDirs,
    limits: &Limits,
) -> Result<Had, UnwindError> {
    let _span = debug_span!("table", path = &*job.path).entered();
    let with = |bytes: &[u8], cache: Option<&mut DiskCache>| {
        let elf = Elf::parse(bytes)?;
        source::table(&elf, &job.id, job.pid, &job.path, cache, debug, limits)
    };
    match &job.source {
        Source::File { file, stamp } => {
            let bytes = FileBytes::new(file, stamp).map_err(|err| UnwindError::Io {
                op: "read",
                path: job.path.to_string().into(),
                source: std::io::Error::other(err),
            })?;
            with(bytes.bytes(), cache)
        }
        Source::Image(bytes) => with(bytes, cache),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ExeId {
        ExeId::BuildId(vec![n; 20], [0; 16])
    }

    fn job(n: u8, urgent: bool, size: u64) -> Job {
        Job {
            id: id(n),
            source: Source::Image(Arc::from(&b""[..])),
            pid: 0,
            path: Arc::from("/x"),
            urgent,
            size,
        }
    }

    #[test]
    fn urgent_jobs_first_then_cached_then_small_then_old() {
        let dir = tempfile::tempdir().unwrap();
        // The cache holds table 4 (a file of its name).
        std::fs::write(
            dir.path().join(smolder_unwind::cache::file_name(&id(4))),
            b"x",
        )
        .unwrap();
        let cache = DiskCache::open(dir.path(), 1 << 20).unwrap();
        let shared = Shared::default();
        let submit = |job: Job| {
            let mut queue = shared.lock();
            let seq = queue.next_seq;
            queue.next_seq += 1;
            queue.jobs.insert(job.id.clone(), Waiting { job, seq });
        };
        submit(job(1, false, 10));
        submit(job(2, true, 5_000_000));
        submit(job(3, true, 1_000));
        submit(job(4, false, 9_000_000));
        submit(job(5, true, 1_000));
        submit(job(6, false, 10));
        let order: Vec<ExeId> = (0..6)
            .map(|_| next(&shared, Some(&cache)).unwrap().id)
            .collect();
        // Urgent by size, then equal sizes in the order asked; then the cached one, however
        // large; then the others by size and age.
        assert_eq!(order, vec![id(3), id(5), id(2), id(4), id(1), id(6)]);
        shared.lock().stopped = true;
        assert!(next(&shared, Some(&cache)).is_none());
    }

    #[test]
    fn a_job_asked_again_is_kept_once_and_hurried() {
        let builder = Builder {
            shared: Arc::new(Shared::default()),
            thread: None,
        };
        builder.submit(job(1, false, 10));
        builder.submit(job(2, false, 20));
        builder.submit(job(2, true, 20));
        builder.hurry(&[id(1)]);
        assert_eq!(builder.waiting(), 2);
        let queue = builder.shared.lock();
        assert!(queue.jobs.values().all(|waiting| waiting.job.urgent));
    }
}
