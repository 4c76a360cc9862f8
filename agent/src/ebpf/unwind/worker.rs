//! The `smolder-unwind` thread: reads processes' mappings, has their tables (disk cache, else
//! built), puts tables then mappings into the kernel, and takes them out again.
//!
//! Input: [`Request`]s from the eBPF source's thread. Output: tables and LPM entries in the
//! kernel, [`Ready`] reports, metrics. Owns the two maps ([`Kernel`]), the lifecycle state
//! ([`Tables`]), the known files and the disk cache. Decisions are [`Tables`]'; this file does
//! the I/O they call for.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};

use smolder_daemon::Heartbeat;
use smolder_unwind::{Elf, ExeId, Layout, Limits, Unsupported, UnwindError};
use tracing::{debug, debug_span, warn};

use super::file::{FileBytes, Stamp};
use super::kernel::Kernel;
use super::metrics::UnwindMetrics;
use super::source::{self, DiskCache};
use super::state::{Resolved, Shape, Tables};
use super::{Ready, Request, vdso};
use crate::ebpf::metrics::{MAP_FULL, PROCESS_CAP};
use crate::ebpf::process::{FileKey, Mapping, Object, ProcessMap, open_mapped, process_start_time};
use crate::ebpf::symbolize::DebugDirs;
use crate::metrics::{DroppedUnit, StageCounters};

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
    bytes: Vec<u8>,
    id: ExeId,
    layout: Layout,
}

pub(super) struct Worker {
    pub(super) kernel: Kernel,
    pub(super) tables: Tables,
    pub(super) cache: Option<DiskCache>,
    pub(super) debug: DebugDirs,
    pub(super) grace: Duration,
    pub(super) metrics: UnwindMetrics,
    pub(super) errors: StageCounters,
    pub(super) ready: Sender<Ready>,
    files: HashMap<FileKey, Known>,
    vdso: Option<Vdso>,
    limits: Limits,
    /// When the processes running at the agent's start were queued: their first sight.
    preload_since: Option<Instant>,
}

impl Worker {
    #[expect(
        clippy::too_many_arguments,
        reason = "the worker's parts, assembled once"
    )]
    pub(super) fn new(
        kernel: Kernel,
        tables: Tables,
        cache: Option<DiskCache>,
        debug: DebugDirs,
        grace: Duration,
        metrics: UnwindMetrics,
        errors: StageCounters,
        ready: Sender<Ready>,
    ) -> Worker {
        let vdso = vdso::own_vdso().and_then(|bytes| {
            let elf = Elf::parse(&bytes).ok()?;
            let (id, layout) = (elf.id(), elf.layout());
            Some(Vdso { bytes, id, layout })
        });
        Worker {
            kernel,
            tables,
            cache,
            debug,
            grace,
            metrics,
            errors,
            ready,
            files: HashMap::new(),
            vdso,
            limits: Limits::default(),
            preload_since: None,
        }
    }

    /// Serves requests until the sender is dropped; preloads when none waits.
    pub(super) fn run(mut self, rx: Receiver<Request>, beat: &Heartbeat) {
        let mut last_tick = Instant::now();
        loop {
            self.metrics.last_progress.set(unix_seconds());
            beat.beat();
            if self.tables.preloading() {
                match rx.try_recv() {
                    Ok(request) => self.handle(request),
                    Err(TryRecvError::Empty) => {
                        if let Some(pid) = self.tables.next_preload()
                            && let Some(start_time) = process_start_time(pid)
                        {
                            let since = self.preload_since.unwrap_or_else(Instant::now);
                            self.start_preloaded(pid, start_time, since);
                        }
                    }
                    Err(TryRecvError::Disconnected) => return,
                }
            } else {
                match rx.recv_timeout(TICK) {
                    Ok(request) => self.handle(request),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            let now = Instant::now();
            if now.duration_since(last_tick) >= TICK {
                last_tick = now;
                self.tick(now);
            }
        }
    }

    fn handle(&mut self, request: Request) {
        self.metrics.requests_queued.dec();
        let now = Instant::now();
        match request {
            Request::Preload(pids, at) => {
                self.preload_since = Some(at);
                self.tables.preload(pids);
            }
            Request::Seen {
                pid, start_time, ..
            } if self.tables.is_alive(pid, start_time) => {}
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
                self.start(pid, start_time, at);
            }
            Request::Exited(pid) => {
                let keys = self.tables.exited(pid, now);
                self.delete_mappings(&keys);
            }
            Request::Sampled(pids) => {
                // Sampled and not tracked: its first sight was dropped (a full queue).
                for &pid in &pids {
                    if self.tables.mappings(pid).is_none()
                        && let Some(start_time) = process_start_time(pid)
                    {
                        self.start(pid, start_time, now);
                    }
                }
                for pid in self.tables.sampled(&pids, now) {
                    self.metrics.reloads.inc();
                    self.load(pid);
                    let back = !self.tables.maps_evicted(pid);
                    self.tables.refreshed(pid, back);
                }
            }
            Request::Missed(misses) => {
                for miss in misses {
                    if self.tables.needs_refresh(miss.pid, &miss.frames, now) {
                        self.metrics.refreshes.inc();
                        let changed = self.load(miss.pid);
                        self.tables.refreshed(miss.pid, changed);
                        if changed {
                            let done = Instant::now();
                            let _ = self.ready.send(Ready {
                                pid: miss.pid,
                                after: done.saturating_duration_since(now),
                                preloaded: false,
                                at: done,
                                refresh: true,
                            });
                        }
                    }
                }
            }
        }
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

    /// Starts (or starts over, after an exec or a pid reuse) tracking `pid`, first seen at
    /// `first_sight`, and loads it.
    fn start(&mut self, pid: u32, start_time: u64, first_sight: Instant) {
        let old = self.tables.start(pid, start_time, first_sight);
        self.delete_mappings(&old);
        self.load(pid);
    }

    /// Starts tracking `pid`, running at the agent's start (`since`), and loads it.
    fn start_preloaded(&mut self, pid: u32, start_time: u64, since: Instant) {
        let old = self.tables.start(pid, start_time, since);
        self.delete_mappings(&old);
        self.tables.mark_preloaded(pid);
        self.load(pid);
    }

    /// Reads `pid`'s mappings, has their tables loaded, then puts its mappings into the
    /// kernel. Returns whether its mappings changed.
    fn load(&mut self, pid: u32) -> bool {
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
        let mut keep = HashSet::new();
        let mut resolved = Vec::with_capacity(map.mappings.len());
        for mapping in &map.mappings {
            let exe = match &mapping.object {
                Object::File { path, .. } => self.resolve_file(pid, mapping, path, &mut keep),
                Object::Vdso => self.resolve_vdso(mapping, &mut keep),
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
        if changes.capped > 0 {
            self.errors
                .dropped(DroppedUnit::Mappings, PROCESS_CAP, changes.capped);
        }
        let mut refused = Vec::new();
        for (i, &(prefix, key, value)) in changes.insert.iter().enumerate() {
            if let Err(err) = self.kernel.insert_mapping(prefix, key, value) {
                self.errors.error("unwind_mappings");
                warn!(pid, error = %err, "the unwinder's mappings map refused an entry (full?); the process's stacks are walked with frame pointers where it lacks entries");
                refused = changes.insert[i..]
                    .iter()
                    .map(|&(prefix, key, _)| (prefix, key))
                    .collect();
                break;
            }
        }
        self.delete_mappings(&changes.delete);
        if !refused.is_empty() {
            self.tables.not_inserted(pid, &refused);
            self.errors
                .dropped(DroppedUnit::Mappings, MAP_FULL, refused.len() as u64);
            self.update_gauges();
            return changed;
        }
        let done = Instant::now();
        if let Some((after, preloaded)) = self.tables.ready(pid, done) {
            let trigger = if preloaded { "start" } else { "sample" };
            self.metrics
                .ready_duration
                .with_label_values(&[trigger])
                .observe(after.as_secs_f64());
            debug!(
                pid,
                ms = after.as_millis() as u64,
                trigger,
                "unwind tables loaded"
            );
            let _ = self.ready.send(Ready {
                pid,
                after,
                preloaded,
                at: done,
                refresh: false,
            });
        }
        self.update_gauges();
        changed
    }

    fn delete_mappings(&mut self, keys: &[(u32, smolder_agent_ebpf::unwind::MappingKey)]) {
        for &(prefix, key) in keys {
            if let Err(err) = self.kernel.delete_mapping(prefix, key) {
                self.errors.error("unwind_mappings");
                debug!(error = %err, "deleting an unwind mapping failed");
            }
        }
    }

    /// The executable of a file mapping and the mapping's bias, its table loaded if it can be.
    fn resolve_file(
        &mut self,
        pid: u32,
        mapping: &Mapping,
        path: &Arc<str>,
        keep: &mut HashSet<ExeId>,
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
            keep.insert(id.clone());
            if self.tables.needs_table(&id, Instant::now()) {
                let mapped = FileBytes::new(&file, &stamp).ok()?;
                let elf = Elf::parse(mapped.bytes()).ok()?;
                self.ensure_table(&id, &elf, pid, path, keep);
            }
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
        let elf = match Elf::parse(mapped.bytes()) {
            Ok(elf) => elf,
            Err(_) => {
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
            }
        };
        let id = elf.id();
        let layout = elf.layout();
        let bias = layout.bias(mapping.start, mapping.offset);
        self.files.insert(
            *key,
            Known {
                stamp,
                exe: Some(id.clone()),
                layout,
            },
        );
        keep.insert(id.clone());
        self.ensure_table(&id, &elf, pid, path, keep);
        Some((id, bias?))
    }

    fn resolve_vdso(
        &mut self,
        mapping: &Mapping,
        keep: &mut HashSet<ExeId>,
    ) -> Option<(ExeId, u64)> {
        let vdso = self.vdso.take()?;
        let bias = vdso.layout.bias(mapping.start, mapping.offset);
        let id = vdso.id.clone();
        keep.insert(id.clone());
        if self.tables.needs_table(&id, Instant::now())
            && let Ok(elf) = Elf::parse(&vdso.bytes)
        {
            self.ensure_table(&id, &elf, 0, "[vdso]", keep);
        }
        self.vdso = Some(vdso);
        Some((id, bias?))
    }

    fn fail(&self, reason: &str) {
        self.metrics
            .table_failures
            .with_label_values(&[reason])
            .inc();
    }

    /// Has the table of `elf` and puts it into the kernel, unless it is there or cannot be.
    fn ensure_table(
        &mut self,
        id: &ExeId,
        elf: &Elf<'_>,
        pid: u32,
        path: &str,
        keep: &HashSet<ExeId>,
    ) {
        if !self.tables.needs_table(id, Instant::now()) {
            return;
        }
        let now = Instant::now();
        let key = self.tables.key(id, now);
        let had = match source::table(
            elf,
            id,
            pid,
            path,
            self.cache.as_mut(),
            &self.debug,
            &self.limits,
        ) {
            Ok(had) => had,
            Err(err) => {
                // No call-frame information may come with a debug file (a package installed,
                // debuginfod): tried again later. The others are the file's for good.
                let (reason, retry_at) = match err {
                    UnwindError::NoCfi => ("no_cfi", Some(now + NO_CFI_RETRY)),
                    UnwindError::TooLarge { .. } => ("too_large", None),
                    _ => ("malformed", None),
                };
                debug!(path, error = %err, "no unwind table");
                self.fail(reason);
                self.tables.failed(id, retry_at);
                return;
            }
        };
        if let Some(took) = had.build_time {
            self.metrics.build_duration.observe(took.as_secs_f64());
        }
        let entries = had.table.entries();
        let bytes = Kernel::estimate(entries.len());
        if !self.tables.can_fit(bytes) {
            // Larger than the whole budget: never loads, so never built again.
            self.tables.failed(id, None);
        }
        let Some(evict) = self.tables.make_room(bytes, keep) else {
            self.fail("over_budget");
            warn!(
                path,
                bytes = Kernel::estimate(entries.len()),
                "an unwind table does not fit ebpf.unwind.max-table-bytes; its frames are walked with frame pointers"
            );
            return;
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
        let started = Instant::now();
        match self.kernel.load_table(key, entries) {
            Ok(bytes) => {
                self.metrics
                    .load_duration
                    .observe(started.elapsed().as_secs_f64());
                let shape = Shape {
                    first_page: had.table.first_page(),
                    n_pages: had.table.n_pages(),
                    n_entries: u32::try_from(entries.len()).unwrap_or(u32::MAX),
                };
                self.tables.loaded(id, shape, bytes, Instant::now());
                self.metrics
                    .tables_loaded
                    .with_label_values(&[had.origin.name()])
                    .inc();
                for reason in Unsupported::ALL {
                    self.metrics
                        .unsupported_rows
                        .with_label_values(&[reason.name()])
                        .inc_by(had.table.stats().unsupported(reason));
                }
                debug!(
                    path,
                    rows = had.table.n_rows(),
                    bytes,
                    origin = had.origin.name(),
                    "unwind table loaded"
                );
            }
            Err(err) => {
                self.errors.error("unwind_table_load");
                warn!(path, error = %err, "loading an unwind table failed; its frames are walked with frame pointers");
            }
        }
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
        if let Some(cache) = &self.cache {
            self.metrics.cache_bytes.set(gauge(cache.used_bytes()));
        }
    }
}
