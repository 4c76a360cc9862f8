//! The sans-IO core of the table lifecycle: which executables have a table in the kernel, which
//! processes map them, what to evict to stay within the budget, when a process's mappings are
//! stale, when an exited process is forgotten.
//!
//! Input: processes' resolved mappings, tables asked of the builder and had, loads and
//! evictions done, samples and misses, exits, the processes running at the agent's start, all
//! with the time passed in. Output: decisions (which tables to ask for, what to evict, which LPM
//! keys to delete and insert, when a process is ready, whether to re-read a process's mappings,
//! which running process to load next) that the worker carries out on the kernel. Owns no file,
//! map or clock.
//!
//! A process's mappings go into the kernel as their tables come: at once for the executables
//! whose tables are in, the others as the builder has them (until then a walk there steps with
//! frame pointers, as before the process was loaded). The process is ready once no table it
//! waits for is being built.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use smolder_agent_ebpf::unwind::{Mapping, MappingKey, mapping_prefixes};
use smolder_unwind::ExeId;

/// The shortest time between two re-reads of a process's mappings after walks left its
/// known mappings; it doubles up to [`MAX_REFRESH_INTERVAL`] while re-reads find nothing new
/// (code in anonymous memory, or frame-pointer garbage, never has a mapping to find).
pub(crate) const REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// The longest time between two such re-reads.
pub(crate) const MAX_REFRESH_INTERVAL: Duration = Duration::from_secs(64);

/// The most LPM entries one process gets, so that one process with a huge number of mappings
/// cannot fill `unwind_mappings` (256 Ki entries) for all: 64 processes at this cap fill it.
/// A typical process takes a few hundred (up to about 70 per mapping).
pub(crate) const MAX_PROCESS_KEYS: usize = 4096;

/// The most preloaded processes waiting for tables at once: enough that the builder always has
/// work and that tables reach the kernel in batches (one RCU grace period for several, instead
/// of one per process), few enough that preloading stops soon after the budget is full.
pub(crate) const MAX_PRELOADS_WAITING: usize = 16;

/// The shape of a table: what a mapping's LPM value repeats of its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) first_page: u32,
    pub(crate) n_pages: u32,
    pub(crate) n_entries: u32,
}

/// An executable the agent has seen.
#[derive(Debug)]
struct Exe {
    /// Its id in the kernel's `unwind_tables`, never 0.
    key: u64,
    /// Its table's shape; `None` while it has no table (not built yet, or it cannot have one).
    shape: Option<Shape>,
    /// Kernel memory of its table while it is loaded.
    loaded: Option<u64>,
    /// Whether building its table failed: it is not tried again, or not before `retry_at`.
    failed: bool,
    /// Whether its table was asked of the builder and not had yet.
    building: bool,
    /// When a failure that may not last (no call-frame information yet: a debug file may come)
    /// is tried again.
    retry_at: Option<Instant>,
    /// Mappings of live or grace-period processes that map it.
    refs: u32,
    /// When a process mapping it was last sampled (or it was loaded).
    last_used: Instant,
}

/// One executable mapping of a process, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// The executable and the mapping's load bias; `None` for anonymous memory and files that
    /// could not be read.
    pub(crate) exe: Option<(ExeId, u64)>,
}

#[derive(Debug)]
struct Process {
    /// Its start time (`/proc/PID/stat`), which tells it from a later process reusing its pid.
    start_time: u64,
    first_sight: Instant,
    mappings: Vec<Resolved>,
    /// LPM keys inserted for it: (prefix length, key).
    keys: Vec<(u32, MappingKey)>,
    ready: Option<Instant>,
    /// Executables it maps whose tables are being built for the first time: it is ready once
    /// none is left.
    waiting: HashSet<ExeId>,
    /// Since when its mappings, read again and changed, wait for tables: reported as a
    /// refresh once none is left.
    refresh_since: Option<Instant>,
    /// Loaded because it ran at the agent's start (`first_sight` is then the agent's start),
    /// not at its first sample.
    preloaded: bool,
    exited: Option<Instant>,
    last_refresh: Instant,
    refresh_interval: Duration,
}

/// What the kernel's LPM trie must do for a process's new mappings: insert (or update) the new
/// keys, then delete the old keys that are not among them, so that no address of a mapping
/// that stays is ever without its entry. Their tables are loaded before.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct MappingChanges {
    pub(crate) insert: Vec<(u32, MappingKey, Mapping)>,
    pub(crate) delete: Vec<(u32, MappingKey)>,
    /// Entries left out past [`MAX_PROCESS_KEYS`] (whole mappings: walks there use frame
    /// pointers).
    pub(crate) capped: u64,
}

/// A process that became ready, or whose changed mappings are all in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settled {
    /// How long after its first sight (its first sample's, or the agent's start for a
    /// preloaded process), or, for a refresh, after its mappings were read again.
    pub(crate) after: Duration,
    pub(crate) preloaded: bool,
    pub(crate) refresh: bool,
}

/// LPM entries to insert for one process.
pub(crate) type Entries = Vec<(u32, MappingKey, Mapping)>;

/// The LPM entries of `mapping` of `pid`, an executable with `key` and table `shape`, appended
/// to `insert` and recorded in `keys` unless they would pass [`MAX_PROCESS_KEYS`]; returns how
/// many were left out.
fn mapping_entries(
    pid: u32,
    mapping: &Resolved,
    key: u64,
    shape: Shape,
    keys: &mut Vec<(u32, MappingKey)>,
    insert: &mut Entries,
) -> u64 {
    let Some((_, bias)) = &mapping.exe else {
        return 0;
    };
    let value = Mapping {
        exe_id: key,
        bias: *bias,
        first_page: shape.first_page,
        n_pages: shape.n_pages,
        n_entries: shape.n_entries,
        flags: 0,
        start: mapping.start,
        end: mapping.end,
    };
    let prefixes = mapping_prefixes(pid, mapping.start, mapping.end);
    if keys.len() + prefixes.len() > MAX_PROCESS_KEYS {
        return prefixes.len() as u64;
    }
    for (len, prefix) in prefixes {
        keys.push((len, prefix));
        insert.push((len, prefix, value));
    }
    0
}

/// The lifecycle state.
#[derive(Debug)]
pub(crate) struct Tables {
    exes: HashMap<ExeId, Exe>,
    processes: HashMap<u32, Process>,
    next_key: u64,
    max_bytes: u64,
    /// Entries of the kernel's `unwind_tables`: at most this many tables at once.
    max_tables: usize,
    used_bytes: u64,
    /// Processes running at the agent's start, not loaded yet (`ebpf.unwind.load-at-start`).
    preload: VecDeque<u32>,
}

impl Tables {
    /// An empty state with a budget of `max_bytes` of kernel memory and `max_tables` tables.
    pub(crate) fn new(max_bytes: u64, max_tables: usize) -> Tables {
        Tables {
            exes: HashMap::new(),
            processes: HashMap::new(),
            next_key: 1,
            max_bytes,
            max_tables,
            used_bytes: 0,
            preload: VecDeque::new(),
        }
    }

    /// Starts tracking `pid`, which started at `start_time`, first seen at `now`, forgetting
    /// what was known under its pid (a pid reused, or an exec). Returns the LPM keys of the old
    /// process to delete.
    pub(crate) fn start(
        &mut self,
        pid: u32,
        start_time: u64,
        now: Instant,
    ) -> Vec<(u32, MappingKey)> {
        let old = self.forget(pid);
        self.processes.insert(
            pid,
            Process {
                start_time,
                first_sight: now,
                mappings: Vec::new(),
                keys: Vec::new(),
                ready: None,
                waiting: HashSet::new(),
                refresh_since: None,
                preloaded: false,
                exited: None,
                last_refresh: now,
                refresh_interval: REFRESH_INTERVAL,
            },
        );
        old
    }

    /// Queues `pids`, running at the agent's start, to be loaded when no request waits.
    pub(crate) fn preload(&mut self, pids: impl IntoIterator<Item = u32>) {
        self.preload.extend(pids);
    }

    /// Whether processes wait to be preloaded.
    pub(crate) fn preloading(&self) -> bool {
        !self.preload.is_empty()
    }

    /// Whether [`MAX_PRELOADS_WAITING`] preloaded processes wait for tables: the next is
    /// preloaded once one of them has them.
    pub(crate) fn preload_waiting(&self) -> bool {
        self.processes
            .values()
            .filter(|p| p.preloaded && p.exited.is_none() && !p.waiting.is_empty())
            .count()
            >= MAX_PRELOADS_WAITING
    }

    /// The next process to preload: queued and not tracked yet (a sample may have got to it
    /// first). `None` once the queue is empty.
    pub(crate) fn next_preload(&mut self) -> Option<u32> {
        while let Some(pid) = self.preload.pop_front() {
            if !self.processes.contains_key(&pid) {
                return Some(pid);
            }
        }
        None
    }

    /// Whether `pid` is tracked and alive as the process that started at `start_time`: not a
    /// new process reusing the pid of one whose exit event was lost.
    pub(crate) fn is_alive(&self, pid: u32, start_time: u64) -> bool {
        self.processes
            .get(&pid)
            .is_some_and(|p| p.exited.is_none() && p.start_time == start_time)
    }

    /// The executable's kernel key, assigning one the first time it is seen.
    pub(crate) fn key(&mut self, id: &ExeId, now: Instant) -> u64 {
        if let Some(exe) = self.exes.get(id) {
            return exe.key;
        }
        let key = self.next_key;
        self.next_key += 1;
        self.exes.insert(
            id.clone(),
            Exe {
                key,
                shape: None,
                loaded: None,
                failed: false,
                building: false,
                retry_at: None,
                refs: 0,
                last_used: now,
            },
        );
        key
    }

    /// Whether the executable's table must be asked for at `now`: it has none in the kernel,
    /// is not being built, and has not failed, or its failure's retry time has come.
    pub(crate) fn needs_table(&self, id: &ExeId, now: Instant) -> bool {
        self.exes.get(id).is_none_or(|exe| {
            exe.loaded.is_none()
                && !exe.building
                && (!exe.failed || exe.retry_at.is_some_and(|at| now >= at))
        })
    }

    /// Records that the executable's table was asked of the builder.
    pub(crate) fn asked(&mut self, id: &ExeId, now: Instant) {
        self.key(id, now);
        if let Some(exe) = self.exes.get_mut(id) {
            exe.building = true;
        }
    }

    /// Records that the builder answered for the executable (a table, or why not).
    pub(crate) fn answered(&mut self, id: &ExeId) {
        if let Some(exe) = self.exes.get_mut(id) {
            exe.building = false;
        }
    }

    /// Whether the executable has had a table (in the kernel, or evicted since).
    pub(crate) fn has_shape(&self, id: &ExeId) -> bool {
        self.exes.get(id).is_some_and(|exe| exe.shape.is_some())
    }

    /// Records that the executable cannot have a table: never (`retry_at` `None`: a malformed
    /// file, a table larger than the whole budget) or not before `retry_at`.
    pub(crate) fn failed(&mut self, id: &ExeId, retry_at: Option<Instant>) {
        if let Some(exe) = self.exes.get_mut(id) {
            exe.failed = true;
            exe.retry_at = retry_at;
        }
    }

    /// Whether a table of `bytes` can ever fit the budget.
    pub(crate) fn can_fit(&self, bytes: u64) -> bool {
        bytes <= self.max_bytes && self.max_tables > 0
    }

    /// The executables to evict so that one more table of `bytes` fits, in bytes and in
    /// entries of the kernel's map, least valuable first: tables no live process maps, then
    /// those of the least recently sampled processes. Those in `keep` (the ones the process
    /// being loaded needs) stay. `None` when it cannot fit.
    pub(crate) fn make_room(&self, bytes: u64, keep: &HashSet<ExeId>) -> Option<Vec<ExeId>> {
        if bytes > self.max_bytes || self.max_tables == 0 {
            return None;
        }
        let mut free = self.max_bytes - self.used_bytes.min(self.max_bytes);
        let mut slots = self.max_tables.saturating_sub(self.loaded_count());
        let fits = |free: u64, slots: usize| bytes <= free && slots > 0;
        if fits(free, slots) {
            return Some(Vec::new());
        }
        let mut candidates: Vec<(&ExeId, &Exe)> = self
            .exes
            .iter()
            .filter(|(id, exe)| exe.loaded.is_some() && !keep.contains(*id))
            .collect();
        candidates.sort_by_key(|(_, exe)| (exe.refs > 0, exe.last_used));
        let mut evict = Vec::new();
        for (id, exe) in candidates {
            if fits(free, slots) {
                break;
            }
            free += exe.loaded.unwrap_or(0);
            slots += 1;
            evict.push(id.clone());
        }
        fits(free, slots).then_some(evict)
    }

    /// Records that the executable's table is in the kernel, taking `bytes` of it; returns its
    /// key.
    pub(crate) fn loaded(&mut self, id: &ExeId, shape: Shape, bytes: u64, now: Instant) -> u64 {
        let key = self.key(id, now);
        let exe = self.exes.get_mut(id).expect("key() inserted it");
        exe.shape = Some(shape);
        exe.failed = false;
        exe.retry_at = None;
        if let Some(old) = exe.loaded.replace(bytes) {
            self.used_bytes -= old;
        }
        exe.last_used = now;
        self.used_bytes += bytes;
        key
    }

    /// Records that the executable's table left the kernel; returns its key. The budget is
    /// full: preloading stops, so that the tables of processes never sampled do not push out
    /// those of processes sampled (the rest are loaded at their first sample).
    pub(crate) fn evicted(&mut self, id: &ExeId) -> Option<u64> {
        let exe = self.exes.get_mut(id)?;
        let bytes = exe.loaded.take()?;
        self.preload.clear();
        self.used_bytes -= bytes;
        Some(exe.key)
    }

    /// Takes back [`Tables::loaded`] for a table the kernel refused; `first` says it had no
    /// table before (its shape goes too).
    pub(crate) fn withdrawn(&mut self, id: &ExeId, first: bool) {
        if let Some(exe) = self.exes.get_mut(id) {
            if let Some(bytes) = exe.loaded.take() {
                self.used_bytes -= bytes;
            }
            if first {
                exe.shape = None;
            }
        }
    }

    /// Kernel memory the loaded tables take.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Tables in the kernel.
    pub(crate) fn loaded_count(&self) -> usize {
        self.exes.values().filter(|e| e.loaded.is_some()).count()
    }

    /// Sets `pid`'s mappings, now resolved; counts references and returns the LPM changes: one
    /// entry per prefix of every mapping whose executable has a table (a table evicted since
    /// keeps its key: its mappings walk with frame pointers until it is back), and the old keys
    /// that are gone. `None` when `pid` is not tracked.
    pub(crate) fn set_mappings(
        &mut self,
        pid: u32,
        mappings: Vec<Resolved>,
        now: Instant,
    ) -> Option<MappingChanges> {
        let process = self.processes.get_mut(&pid)?;
        let old = std::mem::replace(&mut process.mappings, mappings);
        let old_keys = std::mem::take(&mut process.keys);
        for mapping in &old {
            if let Some((id, _)) = &mapping.exe
                && let Some(exe) = self.exes.get_mut(id)
            {
                exe.refs = exe.refs.saturating_sub(1);
            }
        }
        let mut insert = Vec::new();
        let mut capped = 0;
        let process = self.processes.get_mut(&pid).expect("looked up above");
        process.waiting.clear();
        for mapping in &process.mappings {
            let Some((id, _)) = &mapping.exe else {
                continue;
            };
            let Some(exe) = self.exes.get_mut(id) else {
                continue;
            };
            exe.refs += 1;
            exe.last_used = now;
            let Some(shape) = exe.shape else {
                if exe.building {
                    process.waiting.insert(id.clone());
                }
                continue;
            };
            capped += mapping_entries(pid, mapping, exe.key, shape, &mut process.keys, &mut insert);
        }
        let kept: HashSet<&(u32, MappingKey)> = process.keys.iter().collect();
        let delete = old_keys
            .iter()
            .filter(|key| !kept.contains(key))
            .copied()
            .collect();
        Some(MappingChanges {
            insert,
            delete,
            capped,
        })
    }

    /// Records that the kernel refused `keys` of `pid` (its map is full): they are not held.
    pub(crate) fn not_inserted(&mut self, pid: u32, keys: &[(u32, MappingKey)]) {
        if let Some(process) = self.processes.get_mut(&pid) {
            let refused: HashSet<&(u32, MappingKey)> = keys.iter().collect();
            process.keys.retain(|key| !refused.contains(key));
        }
    }

    /// Records that `pid` is loaded because it ran at the agent's start.
    pub(crate) fn mark_preloaded(&mut self, pid: u32) {
        if let Some(process) = self.processes.get_mut(&pid) {
            process.preloaded = true;
        }
    }

    /// The builder answered for the executable, and its table is in the kernel now if it has
    /// a shape: the processes waiting for it stop waiting. Returns, for each of those alive,
    /// the LPM entries of its mappings of the executable (none when no table came) and how
    /// many were left out past [`MAX_PROCESS_KEYS`].
    pub(crate) fn arrived(&mut self, id: &ExeId) -> Vec<(u32, Entries, u64)> {
        let table = self
            .exes
            .get(id)
            .and_then(|exe| Some((exe.key, exe.shape?)));
        let mut out = Vec::new();
        for (&pid, process) in &mut self.processes {
            if !process.waiting.remove(id) || process.exited.is_some() {
                continue;
            }
            let mut insert = Vec::new();
            let mut capped = 0;
            if let Some((key, shape)) = table {
                for mapping in &process.mappings {
                    if mapping.exe.as_ref().is_some_and(|(mapped, _)| mapped == id) {
                        capped += mapping_entries(
                            pid,
                            mapping,
                            key,
                            shape,
                            &mut process.keys,
                            &mut insert,
                        );
                    }
                }
            }
            out.push((pid, insert, capped));
        }
        out
    }

    /// The executables whose tables `pid` waits for.
    pub(crate) fn waiting(&self, pid: u32) -> Vec<ExeId> {
        self.processes
            .get(&pid)
            .map(|p| p.waiting.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Records that `pid`'s mappings, read again at `since`, changed: it is reported as
    /// refreshed once it waits for no table.
    pub(crate) fn refreshing(&mut self, pid: u32, since: Instant) {
        if let Some(process) = self.processes.get_mut(&pid) {
            process.refresh_since.get_or_insert(since);
        }
    }

    /// If `pid` is alive and waits for no table at `now`: the first time, that it is ready
    /// (how long after its first sight: its first sample's, or the agent's start for a
    /// preloaded process); after a refresh, how long the refresh took. `None` otherwise.
    pub(crate) fn settle(&mut self, pid: u32, now: Instant) -> Option<Settled> {
        let process = self.processes.get_mut(&pid)?;
        if process.exited.is_some() || !process.waiting.is_empty() {
            return None;
        }
        if process.ready.is_none() {
            process.ready = Some(now);
            process.refresh_since = None;
            return Some(Settled {
                after: now.saturating_duration_since(process.first_sight),
                preloaded: process.preloaded,
                refresh: false,
            });
        }
        let since = process.refresh_since.take()?;
        Some(Settled {
            after: now.saturating_duration_since(since),
            preloaded: false,
            refresh: true,
        })
    }

    /// An evicted table of the executable is back: the processes mapping it are loaded again
    /// at the shortest interval next time.
    pub(crate) fn back_in(&mut self, id: &ExeId) {
        for process in self.processes.values_mut() {
            if process
                .mappings
                .iter()
                .any(|m| m.exe.as_ref().is_some_and(|(mapped, _)| mapped == id))
            {
                process.refresh_interval = REFRESH_INTERVAL;
            }
        }
    }

    /// The LPM keys held by every tracked process.
    pub(crate) fn mapping_keys(&self) -> usize {
        self.processes.values().map(|p| p.keys.len()).sum()
    }

    /// Marks the executables of `pids` as sampled at `now`; returns those of `pids` to load
    /// again: alive, loaded once, and mapping an executable whose table was evicted since (its
    /// LPM entries keep its key, so a walk there finds no table and falls back to frame
    /// pointers, which in code built without them stops at the first frame and never leaves
    /// the known mappings). Rate limited per process like [`Tables::needs_refresh`]: a load
    /// that leaves a table out ([`Tables::refreshed`] with `false`) doubles the wait.
    pub(crate) fn sampled(&mut self, pids: &[u32], now: Instant) -> Vec<u32> {
        let mut reload = Vec::new();
        for pid in pids {
            let Some(process) = self.processes.get_mut(pid) else {
                continue;
            };
            let mut evicted = false;
            for mapping in &process.mappings {
                if let Some((id, _)) = &mapping.exe
                    && let Some(exe) = self.exes.get_mut(id)
                {
                    exe.last_used = now;
                    evicted |= exe.shape.is_some() && exe.loaded.is_none() && !exe.failed;
                }
            }
            if evicted
                && process.ready.is_some()
                && process.exited.is_none()
                && now.saturating_duration_since(process.last_refresh) >= process.refresh_interval
            {
                process.last_refresh = now;
                reload.push(*pid);
            }
        }
        reload
    }

    /// Whether a walk of `pid` through `frames` left its known mappings and they are due to be
    /// read again: a library loaded since (`dlopen`). Rate limited per process; a re-read
    /// that finds nothing new ([`Tables::refreshed`]) doubles the wait.
    pub(crate) fn needs_refresh(&mut self, pid: u32, frames: &[u64], now: Instant) -> bool {
        let Some(process) = self.processes.get_mut(&pid) else {
            return false;
        };
        if process.ready.is_none()
            || process.exited.is_some()
            || now.saturating_duration_since(process.last_refresh) < process.refresh_interval
        {
            return false;
        }
        let known = |addr: u64| {
            process
                .mappings
                .iter()
                .any(|m| addr >= m.start && addr < m.end)
        };
        if frames.iter().all(|&addr| known(addr)) {
            return false;
        }
        process.last_refresh = now;
        true
    }

    /// Records what a re-read found: `changed` resets the refresh interval, else it doubles.
    pub(crate) fn refreshed(&mut self, pid: u32, changed: bool) {
        if let Some(process) = self.processes.get_mut(&pid) {
            process.refresh_interval = if changed {
                REFRESH_INTERVAL
            } else {
                (process.refresh_interval * 2).min(MAX_REFRESH_INTERVAL)
            };
        }
    }

    /// The resolved mappings of `pid`.
    pub(crate) fn mappings(&self, pid: u32) -> Option<&[Resolved]> {
        self.processes.get(&pid).map(|p| p.mappings.as_slice())
    }

    /// Forgets the executables no process maps and with no table in the kernel that were last
    /// used more than `after` before `now`; returns them.
    pub(crate) fn prune(&mut self, now: Instant, after: Duration) -> HashSet<ExeId> {
        let mut gone = HashSet::new();
        self.exes.retain(|id, exe| {
            let keep = exe.refs > 0
                || exe.loaded.is_some()
                || exe.building
                || now.saturating_duration_since(exe.last_used) < after;
            if !keep {
                gone.insert(id.clone());
            }
            keep
        });
        gone
    }

    /// Records that `pid` exited at `now`; returns its LPM keys to delete now. Its samples were
    /// walked when taken, so no walk needs them, and a process reusing the pid must not be
    /// walked through them. The process stays tracked (its tables referenced) for the grace.
    pub(crate) fn exited(&mut self, pid: u32, now: Instant) -> Vec<(u32, MappingKey)> {
        let Some(process) = self.processes.get_mut(&pid) else {
            return Vec::new();
        };
        process.exited.get_or_insert(now);
        std::mem::take(&mut process.keys)
    }

    /// Forgets the processes that exited at least `grace` before `now`; returns their LPM keys
    /// to delete.
    pub(crate) fn purge(&mut self, now: Instant, grace: Duration) -> Vec<(u32, MappingKey)> {
        let gone: Vec<u32> = self
            .processes
            .iter()
            .filter(|(_, p)| p.exited.is_some_and(|at| now >= at + grace))
            .map(|(pid, _)| *pid)
            .collect();
        gone.into_iter().flat_map(|pid| self.forget(pid)).collect()
    }

    /// Stops tracking `pid`, dropping its references; returns its LPM keys.
    fn forget(&mut self, pid: u32) -> Vec<(u32, MappingKey)> {
        let Some(process) = self.processes.remove(&pid) else {
            return Vec::new();
        };
        for mapping in &process.mappings {
            if let Some((id, _)) = &mapping.exe
                && let Some(exe) = self.exes.get_mut(id)
            {
                exe.refs = exe.refs.saturating_sub(1);
            }
        }
        process.keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ExeId {
        ExeId::BuildId(vec![n; 20], [0; 16])
    }

    fn shape() -> Shape {
        Shape {
            first_page: 0,
            n_pages: 1,
            n_entries: 10,
        }
    }

    fn mapping(start: u64, exe: Option<u8>) -> Resolved {
        Resolved {
            start,
            end: start + 0x1000,
            exe: exe.map(|n| (id(n), start)),
        }
    }

    #[test]
    fn mappings_get_keys_once_their_tables_are_loaded_and_give_them_back() {
        let t0 = Instant::now();
        let mut tables = Tables::new(1 << 20, 4096);
        assert!(tables.start(10, 0, t0).is_empty());
        let key = tables.key(&id(1), t0);
        assert_eq!(key, 1);
        assert!(tables.needs_table(&id(1), t0));
        tables.loaded(&id(1), shape(), 4096, t0);
        assert!(!tables.needs_table(&id(1), t0));
        tables.key(&id(2), t0);
        tables.failed(&id(2), None);
        assert!(!tables.needs_table(&id(2), t0));
        let changes = tables
            .set_mappings(
                10,
                vec![
                    mapping(0x1000, Some(1)),
                    mapping(0x4000, Some(2)),
                    mapping(0x8000, None),
                ],
                t0,
            )
            .unwrap();
        assert!(changes.delete.is_empty());
        // The same again: everything is updated in place, nothing deleted.
        let again = tables
            .set_mappings(
                10,
                vec![mapping(0x1000, Some(1)), mapping(0x4000, Some(2))],
                t0,
            )
            .unwrap();
        assert_eq!((again.insert.len(), again.delete.len()), (1, 0));
        // Only the mapping with a table: one 4 KiB-aligned block.
        assert_eq!(changes.insert.len(), 1);
        let (len, _, value) = changes.insert[0];
        assert_eq!((len, value.exe_id, value.bias), (96 - 12, 1, 0x1000));
        assert_eq!(
            tables.settle(10, t0 + Duration::from_millis(30)),
            Some(Settled {
                after: Duration::from_millis(30),
                preloaded: false,
                refresh: false
            })
        );
        assert_eq!(tables.settle(10, t0 + Duration::from_secs(1)), None);
        assert_eq!(tables.mapping_keys(), 1);
        assert!(tables.is_alive(10, 0));
        assert!(!tables.is_alive(10, 5), "another process with its pid");
        // Exit: the keys go back at once; the process is forgotten after the grace.
        assert_eq!(tables.exited(10, t0 + Duration::from_secs(1)).len(), 1);
        assert!(!tables.is_alive(10, 0));
        assert_eq!(tables.mapping_keys(), 0);
        assert!(
            tables
                .purge(t0 + Duration::from_secs(2), Duration::from_secs(5))
                .is_empty()
        );
        assert!(tables.mappings(10).is_some(), "kept for the grace");
        assert!(
            tables
                .purge(t0 + Duration::from_secs(6), Duration::from_secs(5))
                .is_empty(),
            "its keys went at the exit"
        );
        assert!(tables.mappings(10).is_none());
    }

    #[test]
    fn eviction_prefers_unmapped_then_least_recently_sampled_tables() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(10);
        let mut tables = Tables::new(3 * 4096, 4096);
        for n in 1..=3 {
            tables.key(&id(n), t0);
            tables.loaded(&id(n), shape(), 4096, t0);
        }
        tables.start(1, 0, t0);
        tables.set_mappings(1, vec![mapping(0x1000, Some(1))], t0);
        tables.start(2, 0, t0);
        tables.set_mappings(2, vec![mapping(0x1000, Some(2))], t0);
        tables.sampled(&[1], later);
        let keep = HashSet::new();
        assert_eq!(tables.make_room(4096, &keep), Some(vec![id(3)]));
        // Two pages: the unmapped one, then process 2's, sampled longest ago.
        assert_eq!(tables.make_room(2 * 4096, &keep), Some(vec![id(3), id(2)]));
        assert_eq!(
            tables.make_room(3 * 4096, &HashSet::from([id(1)])),
            None,
            "a kept table stays"
        );
        assert_eq!(tables.make_room(4 * 4096, &keep), None, "over the budget");
        assert_eq!(tables.evicted(&id(3)), Some(3));
        assert_eq!(tables.used_bytes(), 2 * 4096);
        assert_eq!(tables.make_room(4096, &keep), Some(vec![]));
        assert!(
            tables.needs_table(&id(3), t0),
            "an evicted table can come back"
        );
        // Unmapped and unloaded: forgotten once old enough; mapped or loaded ones stay.
        assert!(tables.prune(later, Duration::from_secs(60)).is_empty());
        let gone = tables.prune(later + Duration::from_secs(60), Duration::from_secs(60));
        assert_eq!(gone, HashSet::from([id(3)]));
    }

    #[test]
    fn the_map_entries_are_budgeted_as_well_as_the_bytes() {
        let t0 = Instant::now();
        let mut tables = Tables::new(1 << 20, 2);
        for n in 1..=2 {
            tables.key(&id(n), t0);
            assert_eq!(tables.make_room(4096, &HashSet::new()), Some(vec![]));
            tables.loaded(
                &id(n),
                shape(),
                4096,
                t0 + Duration::from_secs(u64::from(n)),
            );
        }
        // Bytes to spare, but the kernel's map holds two tables: the older goes.
        assert_eq!(tables.make_room(4096, &HashSet::new()), Some(vec![id(1)]));
        assert_eq!(tables.make_room(4096, &HashSet::from([id(1), id(2)])), None);
        assert_eq!(Tables::new(1 << 20, 0).make_room(1, &HashSet::new()), None);
    }

    #[test]
    fn a_process_gets_at_most_its_share_of_map_entries() {
        let t0 = Instant::now();
        let mut tables = Tables::new(1 << 20, 4096);
        tables.key(&id(1), t0);
        tables.loaded(&id(1), shape(), 4096, t0);
        tables.start(3, 0, t0);
        // Mappings of 3 pages: two LPM entries each (one of 8 KiB, one of 4 KiB).
        let mappings: Vec<Resolved> = (0..MAX_PROCESS_KEYS as u64)
            .map(|i| Resolved {
                start: 0x10_0000 + i * 0x4000,
                end: 0x10_0000 + i * 0x4000 + 0x3000,
                exe: Some((id(1), 0)),
            })
            .collect();
        let changes = tables.set_mappings(3, mappings, t0).unwrap();
        assert_eq!(changes.insert.len(), MAX_PROCESS_KEYS);
        assert_eq!(changes.capped, MAX_PROCESS_KEYS as u64);
        assert_eq!(tables.mapping_keys(), MAX_PROCESS_KEYS);
        // The kernel refused some: only those it took are counted and given back later.
        let refused: Vec<(u32, MappingKey)> = changes.insert[10..]
            .iter()
            .map(|&(len, key, _)| (len, key))
            .collect();
        tables.not_inserted(3, &refused);
        assert_eq!(tables.mapping_keys(), 10);
        assert_eq!(tables.exited(3, t0).len(), 10);
    }

    #[test]
    fn misses_outside_the_known_mappings_refresh_with_a_backoff() {
        let t0 = Instant::now();
        let mut tables = Tables::new(1 << 20, 4096);
        tables.start(5, 0, t0);
        tables.set_mappings(5, vec![mapping(0x1000, None)], t0);
        assert!(!tables.needs_refresh(5, &[0x9000], t0), "not ready yet");
        tables.settle(5, t0);
        let t1 = t0 + REFRESH_INTERVAL;
        assert!(!tables.needs_refresh(5, &[0x1010, 0x1020], t1), "all known");
        assert!(tables.needs_refresh(5, &[0x1010, 0x9000], t1));
        assert!(!tables.needs_refresh(5, &[0x9000], t1), "rate limited");
        tables.refreshed(5, false);
        assert!(!tables.needs_refresh(5, &[0x9000], t1 + REFRESH_INTERVAL));
        assert!(tables.needs_refresh(5, &[0x9000], t1 + 2 * REFRESH_INTERVAL));
        // A new start (exec) forgets the process's keys and starts over.
        tables.start(5, 0, t1);
        assert!(!tables.needs_refresh(5, &[0x9000], t1 + 10 * REFRESH_INTERVAL));
    }

    #[test]
    fn a_sampled_process_whose_table_was_evicted_is_loaded_again() {
        let t0 = Instant::now();
        let mut tables = Tables::new(4096, 4096);
        tables.key(&id(1), t0);
        tables.loaded(&id(1), shape(), 4096, t0);
        tables.start(7, 0, t0);
        tables.set_mappings(7, vec![mapping(0x1000, Some(1))], t0);
        tables.settle(7, t0);
        let t1 = t0 + REFRESH_INTERVAL;
        assert!(tables.sampled(&[7], t1).is_empty(), "its table is in");
        // Another process's table pushed it out.
        assert_eq!(tables.evicted(&id(1)), Some(1));
        let t2 = t1 + REFRESH_INTERVAL;
        assert_eq!(
            tables.sampled(&[7, 99], t2),
            vec![7],
            "sampled again: load it again"
        );
        assert!(tables.sampled(&[7], t2).is_empty(), "rate limited");
        // The load found no room: the wait doubles.
        tables.refreshed(7, false);
        assert!(tables.sampled(&[7], t2 + REFRESH_INTERVAL).is_empty());
        assert_eq!(tables.sampled(&[7], t2 + 2 * REFRESH_INTERVAL), vec![7]);
        // It came back: the next eviction is reloaded at the shortest interval.
        tables.loaded(&id(1), shape(), 4096, t2);
        tables.back_in(&id(1));
        assert!(
            tables.sampled(&[7], t2 + 10 * REFRESH_INTERVAL).is_empty(),
            "back in"
        );
        // A table that failed to build is not asked for again.
        tables.evicted(&id(1));
        tables.failed(&id(1), None);
        assert!(tables.sampled(&[7], t2 + 20 * REFRESH_INTERVAL).is_empty());
    }

    #[test]
    fn a_process_is_ready_once_the_tables_it_waits_for_came_or_failed() {
        let t0 = Instant::now();
        let mut tables = Tables::new(1 << 20, 4096);
        tables.key(&id(1), t0);
        tables.loaded(&id(1), shape(), 4096, t0);
        for n in [2, 3] {
            assert!(tables.needs_table(&id(n), t0));
            tables.asked(&id(n), t0);
            assert!(!tables.needs_table(&id(n), t0), "asked once");
        }
        tables.start(4, 0, t0);
        tables.start(5, 0, t0);
        let changes = tables
            .set_mappings(
                4,
                vec![
                    mapping(0x1000, Some(1)),
                    mapping(0x4000, Some(2)),
                    mapping(0x8000, Some(3)),
                ],
                t0,
            )
            .unwrap();
        tables.set_mappings(5, vec![mapping(0x1000, Some(2))], t0);
        // The table that is in goes in at once; the process waits for the two others.
        assert_eq!(changes.insert.len(), 1);
        assert_eq!(changes.insert[0].2.exe_id, 1);
        assert_eq!(tables.settle(4, t0), None);
        let mut waiting = tables.waiting(4);
        waiting.sort_by_key(|id| id.to_string());
        assert_eq!(waiting, vec![id(2), id(3)]);
        tables.mark_preloaded(4);
        assert!(!tables.preload_waiting(), "one preloaded process waits");
        for pid in 100..100 + MAX_PRELOADS_WAITING as u32 - 1 {
            tables.start(pid, 0, t0);
            tables.mark_preloaded(pid);
            tables.set_mappings(pid, vec![mapping(0x1000, Some(3))], t0);
        }
        assert!(tables.preload_waiting(), "as many as may wait at once");

        // Table 2 came: both processes get the entries of their mappings of it.
        tables.answered(&id(2));
        tables.loaded(&id(2), shape(), 4096, t0);
        let mut arrived = tables.arrived(&id(2));
        arrived.sort_by_key(|(pid, _, _)| *pid);
        assert_eq!(arrived.len(), 2);
        for (pid, insert, capped) in &arrived {
            assert_eq!((insert.len(), *capped), (1, 0), "pid {pid}");
            assert_eq!(insert[0].2.exe_id, tables.key(&id(2), t0));
        }
        assert!(tables.arrived(&id(2)).is_empty(), "nobody waits for it now");
        let t1 = t0 + Duration::from_millis(40);
        assert_eq!(tables.settle(5, t1).map(|s| s.after), Some(t1 - t0));
        assert_eq!(tables.settle(4, t1), None, "still waits for table 3");

        // Table 3 failed: no entries, and nothing more to wait for.
        tables.answered(&id(3));
        tables.failed(&id(3), None);
        let mut arrived = tables.arrived(&id(3));
        arrived.sort_by_key(|(pid, _, _)| *pid);
        assert_eq!(arrived.len(), MAX_PRELOADS_WAITING);
        assert_eq!(arrived[0], (4, Vec::new(), 0));
        assert!(!tables.preload_waiting());
        let t2 = t0 + Duration::from_millis(90);
        assert_eq!(
            tables.settle(4, t2),
            Some(Settled {
                after: t2 - t0,
                preloaded: true,
                refresh: false
            })
        );
        assert_eq!(
            tables.mapping_keys(),
            3,
            "1 + 1 for process 4, 1 for process 5"
        );

        // Its mappings read again and changed (a dlopen of a library being built): reported
        // as a refresh once its table is in; an exited process stops waiting unreported.
        tables.asked(&id(6), t2);
        tables.set_mappings(
            4,
            vec![mapping(0x1000, Some(1)), mapping(0x20000, Some(6))],
            t2,
        );
        tables.refreshing(4, t2);
        assert_eq!(tables.settle(4, t2), None);
        tables.start(7, 0, t2);
        tables.set_mappings(7, vec![mapping(0x1000, Some(6))], t2);
        tables.exited(7, t2);
        tables.answered(&id(6));
        tables.loaded(&id(6), shape(), 4096, t2);
        let arrived = tables.arrived(&id(6));
        assert_eq!(arrived.len(), 1);
        assert_eq!(arrived[0].0, 4);
        let t3 = t2 + Duration::from_millis(5);
        assert_eq!(
            tables.settle(4, t3),
            Some(Settled {
                after: t3 - t2,
                preloaded: false,
                refresh: true
            })
        );
        assert_eq!(tables.settle(7, t3), None, "exited");
        assert_eq!(tables.settle(4, t3), None, "reported once");
    }

    #[test]
    fn a_table_the_kernel_refused_is_taken_back() {
        let t0 = Instant::now();
        let mut tables = Tables::new(8192, 4096);
        tables.key(&id(1), t0);
        tables.loaded(&id(1), shape(), 4096, t0);
        tables.withdrawn(&id(1), true);
        assert_eq!(tables.used_bytes(), 0);
        assert!(!tables.has_shape(&id(1)));
        assert!(tables.needs_table(&id(1), t0));
        // An evicted table that failed to come back keeps its shape (its entries stay).
        tables.loaded(&id(1), shape(), 4096, t0);
        tables.evicted(&id(1));
        tables.loaded(&id(1), shape(), 4096, t0);
        tables.withdrawn(&id(1), false);
        assert!(tables.has_shape(&id(1)));
        assert_eq!(tables.loaded_count(), 0);
    }

    #[test]
    fn a_failure_that_may_not_last_is_tried_again_later() {
        let t0 = Instant::now();
        let mut tables = Tables::new(8192, 4096);
        tables.key(&id(1), t0);
        tables.failed(&id(1), Some(t0 + Duration::from_secs(300)));
        assert!(!tables.needs_table(&id(1), t0 + Duration::from_secs(299)));
        assert!(tables.needs_table(&id(1), t0 + Duration::from_secs(300)));
        tables.loaded(&id(1), shape(), 4096, t0);
        assert!(!tables.needs_table(&id(1), t0 + Duration::from_secs(300)));
        tables.evicted(&id(1));
        assert!(
            tables.needs_table(&id(1), t0),
            "a loaded table has no failure left"
        );
        assert!(tables.can_fit(8192) && !tables.can_fit(8193));
    }

    #[test]
    fn running_processes_preload_in_order_skipping_those_sampled_first() {
        let t0 = Instant::now();
        let mut tables = Tables::new(2 * 4096, 4096);
        assert!(!tables.preloading());
        assert_eq!(tables.next_preload(), None);
        tables.preload([1, 2, 3, 4]);
        assert!(tables.preloading());
        assert_eq!(tables.next_preload(), Some(1));
        tables.start(1, 0, t0);
        tables.mark_preloaded(1);
        assert_eq!(
            tables.settle(1, t0 + Duration::from_secs(3)),
            Some(Settled {
                after: Duration::from_secs(3),
                preloaded: true,
                refresh: false
            }),
            "measured from the agent's start"
        );
        // Process 2 was sampled before its turn: it is loaded already.
        tables.start(2, 0, t0);
        assert_eq!(tables.next_preload(), Some(3));
        tables.start(3, 0, t0);
        assert_eq!(tables.next_preload(), Some(4));
        assert_eq!(tables.next_preload(), None);
        assert!(!tables.preloading());

        // A process that exited while queued is tracked until its grace ends: skipped too.
        tables.exited(3, t0);
        tables.preload([3, 5]);
        assert_eq!(tables.next_preload(), Some(5));
    }

    #[test]
    fn preloading_stops_once_the_budget_is_full() {
        let t0 = Instant::now();
        let mut tables = Tables::new(2 * 4096, 4096);
        tables.preload([1, 2, 3, 4]);
        for n in 1..=2 {
            assert_eq!(tables.next_preload(), Some(u32::from(n)));
            tables.start(u32::from(n), 0, t0);
            tables.key(&id(n), t0);
            assert_eq!(tables.make_room(4096, &HashSet::new()), Some(vec![]));
            tables.loaded(&id(n), shape(), 4096, t0);
            tables.set_mappings(u32::from(n), vec![mapping(0x1000, Some(n))], t0);
        }
        assert_eq!(tables.next_preload(), Some(3));
        tables.start(3, 0, t0);
        tables.key(&id(3), t0);
        let keep = HashSet::from([id(3)]);
        let evict = tables.make_room(4096, &keep).unwrap();
        assert_eq!(evict.len(), 1);
        tables.evicted(&evict[0]);
        tables.loaded(&id(3), shape(), 4096, t0);
        assert!(!tables.preloading(), "the rest wait for their first sample");
        assert_eq!(tables.next_preload(), None);
    }
}
