//! The `smolder-unwind` thread: reads processes' mappings, asks the builder for the tables they
//! lack, puts tables then mappings into the kernel, and takes them out again.
//!
//! Input: [`Request`]s from the eBPF source's thread, and the builder's tables
//! ([`Request::Built`]). Output: tables and LPM entries in the kernel, [`Ready`] reports,
//! metrics. Owns the two maps ([`Kernel`]), the lifecycle state ([`Tables`]), the known files and
//! the builder thread ([`Builder`]). Decisions are [`Tables`]'; this file does the I/O they call
//! for.
//!
//! Nothing here waits for a table to be built: a process sampled for the first time gets the
//! entries of its mappings whose tables are in at once (often all of them: libc's, ld.so's),
//! asks the builder for the others, urgently, and is ready when they come. Tables that come
//! together go into the kernel together (one RCU grace period, [`Kernel::load_tables`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};

use smolder_daemon::Heartbeat;
use smolder_unwind::{Elf, ExeId, Layout, Unsupported, UnwindError};
use tracing::{debug, debug_span, warn};

use super::builder::{Builder, Built, Job, Source};
use super::file::{FileBytes, Stamp};
use super::kernel::Kernel;
use super::metrics::UnwindMetrics;
use super::source::Had;
use super::state::{Entries, Resolved, Shape, Tables};
use super::{Ready, Request, vdso};
use crate::ebpf::metrics::{MAP_FULL, PROCESS_CAP};
use crate::ebpf::process::{FileKey, Mapping, Object, ProcessMap, open_mapped, process_start_time};
use crate::tier::{DroppedUnit, StageCounters};

/// How often exited processes are purged and gauges refreshed.
const TICK: Duration = Duration::from_millis(500);

/// Unreferenced executables without a table in the kernel are forgotten after this long, so
/// that a host that runs ever new binaries (a build machine) does not grow the agent.
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// Now in whole seconds since the Unix epoch.
fn unix_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The most files remembered as not ELF.
const MAX_NOT_ELF: usize = 4096;

/// How long a binary without call-frame information waits before its table is tried again
/// (its debug file may have come).
const NO_CFI_RETRY: Duration = Duration::from_secs(600);

/// A file the worker has read.
struct Known {
    stamp: Stamp,
    /// Its identity; `None` when it is not an ELF file.
    exe: Option<ExeId>,
    layout: Layout,
}

/// The vDSO image, its identity and layout.
struct Vdso {
    bytes: Arc<[u8]>,
    id: ExeId,
    layout: Layout,
}

pub(super) struct Worker {
    pub(super) kernel: Kernel,
    pub(super) tables: Tables,
    pub(super) builder: Builder,
    pub(super) grace: Duration,
    pub(super) metrics: UnwindMetrics,
    pub(super) errors: StageCounters,
    pub(super) ready: Sender<Ready>,
    files: HashMap<FileKey, Known>,
    vdso: Option<Vdso>,
    /// When the processes running at the agent's start were queued: their first sight.
    preload_since: Option<Instant>,
}

/// A table the builder had, ready for the kernel.
struct Incoming {
    id: ExeId,
    path: Arc<str>,
    had: Had,
    /// Whether the executable had no table before (not an evicted one coming back).
    first: bool,
}

impl Worker {
    pub(super) fn new(
        kernel: Kernel,
        tables: Tables,
        builder: Builder,
        grace: Duration,
        metrics: UnwindMetrics,
        errors: StageCounters,
        ready: Sender<Ready>,
    ) -> Worker {
        let vdso = vdso::own_vdso().and_then(|bytes| {
            let elf = Elf::parse(&bytes).ok()?;
            let (id, layout) = (elf.id(), elf.layout());
            Some(Vdso {
                bytes: bytes.into(),
                id,
                layout,
            })
        });
        Worker {
            kernel,
            tables,
            builder,
            grace,
            metrics,
            errors,
            ready,
            files: HashMap::new(),
            vdso,
            preload_since: None,
        }
    }

    /// Serves requests until told to stop or the sender is dropped; preloads when none waits
    /// and fewer than [`super::state::MAX_PRELOADS_WAITING`] preloaded processes wait for
    /// tables. A panic of the builder thread is passed on (the loop is then dead, which fails
    /// `/healthz`).
    pub(super) fn run(&mut self, rx: &Receiver<Request>, beat: &Heartbeat) {
        let mut last_tick = Instant::now();
        loop {
            self.metrics.last_progress.set(unix_seconds());
            beat.beat();
            if self.builder.is_finished() {
                self.builder.join();
                warn!("the unwind table builder stopped; so does the unwinder");
                return;
            }
            let request = if self.tables.preloading() && !self.tables.preload_waiting() {
                match rx.try_recv() {
                    Ok(request) => Some(request),
                    Err(TryRecvError::Empty) => {
                        self.preload_next();
                        None
                    }
                    Err(TryRecvError::Disconnected) => return,
                }
            } else {
                match rx.recv_timeout(TICK) {
                    Ok(request) => Some(request),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            };
            if let Some(request) = request
                && !self.handle(request, rx)
            {
                return;
            }
            let now = Instant::now();
            if now.duration_since(last_tick) >= TICK {
                last_tick = now;
                self.tick(now);
            }
        }
    }

    fn preload_next(&mut self) {
        if let Some(pid) = self.tables.next_preload()
            && let Some(start_time) = process_start_time(pid)
        {
            let since = self.preload_since.unwrap_or_else(Instant::now);
            let old = self.tables.start(pid, start_time, since);
            self.delete_mappings(&old);
            self.tables.mark_preloaded(pid);
            self.load(pid, false);
            self.settle(pid);
        }
    }

    /// Handles one request; returns `false` to stop.
    fn handle(&mut self, request: Request, rx: &Receiver<Request>) -> bool {
        let now = Instant::now();
        match request {
            Request::Stop => return false,
            Request::Built(built) => {
                // The tables had meanwhile go into the kernel with it: one grace period.
                let mut batch = vec![*built];
                let mut next = None;
                while let Ok(request) = rx.try_recv() {
                    match request {
                        Request::Built(built) => batch.push(*built),
                        other => {
                            next = Some(other);
                            break;
                        }
                    }
                }
                self.built(batch);
                if let Some(request) = next {
                    return self.handle(request, rx);
                }
                return true;
            }
            _ => self.metrics.requests_queued.dec(),
        }
        match request {
            Request::Stop | Request::Built(_) => {}
            Request::Preload(pids, at) => {
                self.preload_since = Some(at);
                self.tables.preload(pids);
            }
            // Preloaded, and sampled before its tables are all in: they are needed now.
            Request::Seen {
                pid, start_time, ..
            } if self.tables.is_alive(pid, start_time) => self.hurry(pid),
            Request::Seen {
                pid,
                start_time,
                at,
            }
            | Request::Exec {
                pid,
                start_time,
                at,
            } => {
                let old = self.tables.start(pid, start_time, at);
                self.delete_mappings(&old);
                self.load(pid, true);
                self.settle(pid);
            }
            Request::Exited(pid) => {
                let keys = self.tables.exited(pid, now);
                self.delete_mappings(&keys);
            }
            Request::Sampled(pids) => {
                for &pid in &pids {
                    if self.tables.mappings(pid).is_none() {
                        // Sampled and not tracked: its first sight was dropped (a full queue).
                        if let Some(start_time) = process_start_time(pid) {
                            let old = self.tables.start(pid, start_time, now);
                            self.delete_mappings(&old);
                            self.load(pid, true);
                            self.settle(pid);
                        }
                    } else {
                        self.hurry(pid);
                    }
                }
                for pid in self.tables.sampled(&pids, now) {
                    self.metrics.reloads.inc();
                    self.load(pid, true);
                    // Doubles the wait before the next reload unless the table comes back
                    // (`Tables::back_in`): a budget too small for every process's tables does
                    // not make them chase each other out every second.
                    self.tables.refreshed(pid, false);
                }
            }
            Request::Missed(misses) => {
                for miss in misses {
                    if self.tables.needs_refresh(miss.pid, &miss.frames, now) {
                        self.metrics.refreshes.inc();
                        let changed = self.load(miss.pid, true);
                        self.tables.refreshed(miss.pid, changed);
                        if changed {
                            self.tables.refreshing(miss.pid, now);
                            self.settle(miss.pid);
                        }
                    }
                }
            }
        }
        true
    }

    /// Has the builder hurry the tables `pid` waits for: it was sampled.
    fn hurry(&self, pid: u32) {
        let waiting = self.tables.waiting(pid);
        if !waiting.is_empty() {
            self.builder.hurry(&waiting);
        }
    }

    /// Reports `pid` ready (or refreshed) if it waits for no table.
    fn settle(&mut self, pid: u32) {
        let done = Instant::now();
        let Some(settled) = self.tables.settle(pid, done) else {
            return;
        };
        if !settled.refresh {
            let trigger = if settled.preloaded { "start" } else { "sample" };
            self.metrics
                .ready_duration
                .with_label_values(&[trigger])
                .observe(settled.after.as_secs_f64());
            debug!(
                pid,
                ms = settled.after.as_millis() as u64,
                trigger,
                "unwind tables loaded"
            );
        }
        let _ = self.ready.send(Ready {
            pid,
            after: settled.after,
            preloaded: settled.preloaded,
            at: done,
            refresh: settled.refresh,
        });
    }

    /// Purges processes past their exit grace and executables nothing needs.
    fn tick(&mut self, now: Instant) {
        let keys = self.tables.purge(now, self.grace);
        self.delete_mappings(&keys);
        let forgotten = self.tables.prune(now, FORGET_AFTER);
        if !forgotten.is_empty() {
            self.files
                .retain(|_, known| known.exe.as_ref().is_none_or(|id| !forgotten.contains(id)));
        }
        // Files that are not ELF are remembered, so that each load does not parse (and count)
        // them again; all of them are forgotten past a bound.
        if self
            .files
            .values()
            .filter(|known| known.exe.is_none())
            .count()
            > MAX_NOT_ELF
        {
            self.files.retain(|_, known| known.exe.is_some());
        }
        self.update_gauges();
    }

    /// Reads `pid`'s mappings, asks the builder for the tables they lack (`urgent`: the
    /// process was sampled) and puts the entries of those whose tables are in into the kernel.
    /// Returns whether its mappings changed.
    fn load(&mut self, pid: u32, urgent: bool) -> bool {
        let _span = debug_span!("load", pid).entered();
        let now = Instant::now();
        let map = match ProcessMap::read(pid) {
            Ok(map) => map,
            Err(err) => {
                debug!(pid, error = %err, "process gone before its mappings were read");
                // Its exit event may be lost; forget it once the grace is over.
                let keys = self.tables.exited(pid, now);
                self.delete_mappings(&keys);
                return false;
            }
        };
        let mut resolved = Vec::with_capacity(map.mappings.len());
        for mapping in &map.mappings {
            let exe = match &mapping.object {
                Object::File { path, .. } => self.resolve_file(pid, mapping, path, urgent),
                Object::Vdso => self.resolve_vdso(mapping, urgent),
                Object::Anonymous => None,
            };
            resolved.push(Resolved {
                start: mapping.start,
                end: mapping.end,
                exe,
            });
        }
        let changed = self.tables.mappings(pid) != Some(resolved.as_slice());
        let Some(changes) = self.tables.set_mappings(pid, resolved, Instant::now()) else {
            return false;
        };
        if urgent {
            self.hurry(pid);
        }
        if changes.capped > 0 {
            self.errors
                .dropped(DroppedUnit::Mappings, PROCESS_CAP, changes.capped);
        }
        self.insert_mappings(pid, &changes.insert);
        self.delete_mappings(&changes.delete);
        self.update_gauges();
        changed
    }

    /// Inserts `pid`'s LPM entries; returns whether the kernel took them all (a process some
    /// of whose entries were refused is not reported ready: its stacks are walked with frame
    /// pointers where it lacks them).
    fn insert_mappings(&mut self, pid: u32, insert: &Entries) -> bool {
        for (i, &(prefix, key, value)) in insert.iter().enumerate() {
            if let Err(err) = self.kernel.insert_mapping(prefix, key, value) {
                self.errors.error("unwind_mappings");
                warn!(pid, error = %err, "the unwinder's mappings map refused an entry (full?); the process's stacks are walked with frame pointers where it lacks entries");
                let refused: Vec<_> = insert[i..]
                    .iter()
                    .map(|&(prefix, key, _)| (prefix, key))
                    .collect();
                self.tables.not_inserted(pid, &refused);
                self.errors
                    .dropped(DroppedUnit::Mappings, MAP_FULL, refused.len() as u64);
                return false;
            }
        }
        true
    }

    fn delete_mappings(&mut self, keys: &[(u32, smolder_agent_ebpf::unwind::MappingKey)]) {
        for &(prefix, key) in keys {
            if let Err(err) = self.kernel.delete_mapping(prefix, key) {
                self.errors.error("unwind_mappings");
                debug!(error = %err, "deleting an unwind mapping failed");
            }
        }
    }

    /// The executable of a file mapping and the mapping's bias; its table asked for if it
    /// needs one.
    fn resolve_file(
        &mut self,
        pid: u32,
        mapping: &Mapping,
        path: &Arc<str>,
        urgent: bool,
    ) -> Option<(ExeId, u64)> {
        let Object::File { key, .. } = &mapping.object else {
            return None;
        };
        let Some((file, _)) = open_mapped(pid, mapping) else {
            self.fail("unreadable");
            return None;
        };
        let stamp = Stamp::of(&file).ok()?;
        let known = self.files.get(key).filter(|known| known.stamp == stamp);
        if let Some(Known {
            exe: Some(id),
            layout,
            ..
        }) = known
        {
            let (id, bias) = (id.clone(), layout.bias(mapping.start, mapping.offset)?);
            self.ask(&id, Source::File { file, stamp }, pid, path, urgent);
            return Some((id, bias));
        }
        if known.is_some() {
            // The same file, not an ELF file.
            return None;
        }
        let mapped = match FileBytes::new(&file, &stamp) {
            Ok(mapped) => mapped,
            Err(err) => {
                debug!(pid, path = &**path, error = %err, "reading a binary failed");
                self.fail("unreadable");
                return None;
            }
        };
        let Ok(elf) = Elf::parse(mapped.bytes()) else {
            self.fail("not_elf");
            self.files.insert(
                *key,
                Known {
                    stamp,
                    exe: None,
                    layout: Layout::default(),
                },
            );
            return None;
        };
        let id = elf.id();
        let layout = elf.layout();
        let bias = layout.bias(mapping.start, mapping.offset);
        drop(elf);
        drop(mapped);
        self.files.insert(
            *key,
            Known {
                stamp,
                exe: Some(id.clone()),
                layout,
            },
        );
        self.ask(&id, Source::File { file, stamp }, pid, path, urgent);
        Some((id, bias?))
    }

    fn resolve_vdso(&mut self, mapping: &Mapping, urgent: bool) -> Option<(ExeId, u64)> {
        let vdso = self.vdso.as_ref()?;
        let bias = vdso.layout.bias(mapping.start, mapping.offset);
        let (id, image) = (vdso.id.clone(), Arc::clone(&vdso.bytes));
        self.ask(&id, Source::Image(image), 0, &Arc::from("[vdso]"), urgent);
        Some((id, bias?))
    }

    /// Asks the builder for the table of `id` unless it is in the kernel, being built, or
    /// cannot be had.
    fn ask(&mut self, id: &ExeId, source: Source, pid: u32, path: &Arc<str>, urgent: bool) {
        let now = Instant::now();
        if !self.tables.needs_table(id, now) {
            return;
        }
        self.tables.asked(id, now);
        let size = match &source {
            Source::File { stamp, .. } => stamp.size,
            Source::Image(bytes) => bytes.len() as u64,
        };
        self.builder.submit(Job {
            id: id.clone(),
            source,
            pid,
            path: Arc::clone(path),
            urgent,
            size,
        });
    }

    fn fail(&self, reason: &str) {
        self.metrics
            .table_failures
            .with_label_values(&[reason])
            .inc();
    }

    /// Puts the tables the builder had into the kernel, as one batch, making room for them
    /// first; then the entries of the processes that waited for them, and reports those that
    /// wait for nothing more.
    fn built(&mut self, batch: Vec<Built>) {
        let now = Instant::now();
        let mut answered = Vec::with_capacity(batch.len());
        let mut incoming = Vec::new();
        for Built { id, path, result } in batch {
            self.tables.answered(&id);
            match result {
                Ok(had) => {
                    if let Some(took) = had.build_time {
                        self.metrics.build_duration.observe(took.as_secs_f64());
                    }
                    let first = !self.tables.has_shape(&id);
                    incoming.push(Incoming {
                        id,
                        path,
                        had,
                        first,
                    });
                }
                Err(err) => {
                    // No call-frame information may come with a debug file (a package
                    // installed, debuginfod): tried again later; a file that could not be read,
                    // at the next load. The others are the file's for good.
                    let (reason, failed) = match err {
                        UnwindError::NoCfi => ("no_cfi", Some(Some(now + NO_CFI_RETRY))),
                        UnwindError::TooLarge { .. } => ("too_large", Some(None)),
                        UnwindError::Io { .. } => ("unreadable", None),
                        _ => ("malformed", Some(None)),
                    };
                    debug!(path = &*path, error = %err, "no unwind table");
                    self.fail(reason);
                    if let Some(retry_at) = failed {
                        self.tables.failed(&id, retry_at);
                    }
                    answered.push(id);
                }
            }
        }
        let keep: HashSet<ExeId> = incoming.iter().map(|i| i.id.clone()).collect();
        let mut load = Vec::with_capacity(incoming.len());
        for table in incoming {
            let entries = table.had.table.entries();
            let bytes = Kernel::estimate(entries.len());
            if !self.tables.can_fit(bytes) {
                // Larger than the whole budget: never loads, so never built again.
                self.tables.failed(&table.id, None);
            }
            let Some(evict) = self.tables.make_room(bytes, &keep) else {
                self.fail("over_budget");
                warn!(
                    path = &*table.path,
                    bytes,
                    "an unwind table does not fit ebpf.unwind.max-table-bytes; its frames are walked with frame pointers"
                );
                answered.push(table.id);
                continue;
            };
            for victim in evict {
                if let Some(victim_key) = self.tables.evicted(&victim) {
                    if let Err(err) = self.kernel.evict_table(victim_key) {
                        self.errors.error("unwind_table_load");
                        warn!(error = %err, "evicting an unwind table failed");
                    }
                    self.metrics.tables_evicted.inc();
                }
            }
            // Counted in the budget now, so that the next table of the batch makes room past
            // it; its kernel memory is set once it is in.
            self.tables.loaded(&table.id, shape(&table.had), bytes, now);
            load.push(table);
        }
        if !load.is_empty() {
            let keys: Vec<(u64, &[u64])> = load
                .iter()
                .map(|table| (self.tables.key(&table.id, now), table.had.table.entries()))
                .collect();
            let started = Instant::now();
            let results = self.kernel.load_tables(&keys);
            let took = started.elapsed().as_secs_f64();
            for (table, result) in load.into_iter().zip(results) {
                match result {
                    Ok(bytes) => {
                        self.metrics.load_duration.observe(took);
                        self.tables
                            .loaded(&table.id, shape(&table.had), bytes, Instant::now());
                        if !table.first {
                            self.tables.back_in(&table.id);
                        }
                        self.metrics
                            .tables_loaded
                            .with_label_values(&[table.had.origin.name()])
                            .inc();
                        for reason in Unsupported::ALL {
                            self.metrics
                                .unsupported_rows
                                .with_label_values(&[reason.name()])
                                .inc_by(table.had.table.stats().unsupported(reason));
                        }
                        debug!(
                            path = &*table.path,
                            rows = table.had.table.n_rows(),
                            bytes,
                            origin = table.had.origin.name(),
                            "unwind table loaded"
                        );
                    }
                    Err(err) => {
                        self.tables.withdrawn(&table.id, table.first);
                        self.errors.error("unwind_table_load");
                        warn!(path = &*table.path, error = %err, "loading an unwind table failed; its frames are walked with frame pointers");
                    }
                }
                answered.push(table.id);
            }
        }
        let mut settle = Vec::new();
        for id in &answered {
            for (pid, insert, capped) in self.tables.arrived(id) {
                if capped > 0 {
                    self.errors
                        .dropped(DroppedUnit::Mappings, PROCESS_CAP, capped);
                }
                if self.insert_mappings(pid, &insert) {
                    settle.push(pid);
                }
            }
        }
        settle.sort_unstable();
        settle.dedup();
        for pid in settle {
            self.settle(pid);
        }
        self.update_gauges();
    }

    fn update_gauges(&self) {
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.metrics
            .tables
            .set(gauge(self.tables.loaded_count() as u64));
        self.metrics
            .table_bytes
            .set(gauge(self.tables.used_bytes()));
        self.metrics
            .mappings
            .set(gauge(self.tables.mapping_keys() as u64));
        self.metrics
            .tables_queued
            .set(gauge(self.builder.waiting() as u64));
    }
}

/// The shape of a table had.
fn shape(had: &Had) -> Shape {
    Shape {
        first_page: had.table.first_page(),
        n_pages: had.table.n_pages(),
        n_entries: u32::try_from(had.table.entries().len()).unwrap_or(u32::MAX),
    }
}
