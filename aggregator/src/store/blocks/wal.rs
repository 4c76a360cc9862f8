//! The head's durable half, under `<data-dir>/head/`:
//!
//! - `log/<range start>.log`, one append-only file per head range holding every acknowledged
//!   write's profiles of that range; when the range is sealed for a cut (closed, or cut early
//!   for the head's memory budget), its log is renamed `log/<range start>.<n>.sealed` and later
//!   writes to the range start a new `.log`; once the cut's block is published the sealed
//!   files are deleted whole, so their space returns at once and nothing is read back. Each
//!   record is framed by `smolder_block::RecordRef::frame` (length, CRC-32, lz4 payload; the
//!   format crate owns the codec, fuzzed there); a torn frame at a file's end (a crash during
//!   an append, never acknowledged) is cut off when the file is read back.
//! - `db/`, a sled database with the batch markers that dedupe agents' retries, recording rules
//!   and app deletions (local mode; in a bucket they live there) and the store's own identity.
//!
//! Input: what the writer thread applies; output: the records a restart replays into the head
//! (`head.rs`). Owned by the writer thread for writes; reads (rules, markers) are sled's
//! consistent snapshots. A group is made durable log files first, then the database, so a
//! batch's marker is never durable without its data; a record's marker is put back at replay
//! when a crash came between the two.
//!
//! | prefix | key | value |
//! |---|---|---|
//! | `M` | name | store metadata (`aggregator_id`, `next_write`, `migrated_v01`) |
//! | `B` | agent id, sequence | window end: this agent batch is stored |
//! | `b` | window end, agent id, sequence | empty: the same marker by time, for retention |
//! | `R` | tenant, rule name | a recording rule (opaque bytes); local mode only (`rules.rs`) |
//! | `D` | tenant, app | an app deletion (local mode): its horizon and when it was made, Unix seconds and ms (`deletions.rs`) |
//! | `X` | tenant, app | an older version's app deletion, the ids of the blocks it hid: turned into a `D` at open |
//!
//! Integers in keys are big-endian, strings length-prefixed; every value but the empty ones is
//! framed with a CRC-32 of its payload, checked when read.

use smolder_block::{HeadProfile, HeadRecord, Limits, Marker, RecordRef};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::store::StoreError;
use crate::tenant::Tenant;

const META: u8 = b'M';
const BATCH: u8 = b'B';
const BATCH_BY_TIME: u8 = b'b';
const RULE: u8 = b'R';
const TOMBSTONE: u8 = b'X';
const DELETION: u8 = b'D';

/// The most a head record may decompress to: far above one write's (ingest caps bodies at
/// tens of MiB), so only damage reaches it.
const RECORD_LIMITS: Limits = Limits {
    max_section_bytes: 1 << 30,
};

/// The head's page cache: it holds minutes of writes and is read whole only at start.
const CACHE_BYTES: u64 = 64 << 20;

impl From<sled::Error> for StoreError {
    fn from(err: sled::Error) -> StoreError {
        StoreError::Engine {
            source: Box::new(err),
        }
    }
}

/// The head's files. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Wal {
    db: sled::Db,
    data: sled::Tree,
    logs: Arc<Logs>,
}

/// The per-range log files.
struct Logs {
    dir: PathBuf,
    /// Open files by range, and the ranges appended to since the last flush. Taken by the
    /// writer thread only (appends, flushes, deletions), and by a replay before it starts.
    open: Mutex<(BTreeMap<u64, File>, HashSet<u64>)>,
}

/// One write's profiles that fall in one head range, as the head stores and replays them.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    pub(crate) tenant: Tenant,
    /// The agent batch, or the aggregator's own marker of an HTTP write.
    pub(crate) marker: Marker,
    /// An agent batch's window end (its marker is in the marker index); `None` for the
    /// aggregator's own writes.
    pub(crate) window_end: Option<u64>,
    /// The write's number.
    pub(crate) write: u64,
    /// Each profile with its 10 s bucket and its span trees.
    pub(crate) profiles: Vec<HeadProfile>,
}

impl Wal {
    /// Opens (creating) the head in `dir`.
    pub(crate) fn open(dir: &Path) -> Result<Wal, StoreError> {
        let db = sled::Config::new()
            .path(dir.join("db"))
            .cache_capacity(CACHE_BYTES)
            .open()?;
        let data = db.open_tree("head")?;
        let logs = dir.join("log");
        std::fs::create_dir_all(&logs).map_err(|source| StoreError::Io {
            path: logs.clone(),
            source,
        })?;
        Ok(Wal {
            db,
            data,
            logs: Arc::new(Logs {
                dir: logs,
                open: Mutex::new((BTreeMap::new(), HashSet::new())),
            }),
        })
    }

    /// Makes everything applied so far durable: the log files appended to, then the database.
    pub(crate) fn flush(&self) -> Result<(), StoreError> {
        {
            let mut open = self.logs.lock();
            let (files, dirty) = &mut *open;
            for range in dirty.drain() {
                if let Some(file) = files.get(&range) {
                    file.sync_data().map_err(|source| StoreError::Io {
                        path: self.logs.path(range),
                        source,
                    })?;
                }
            }
        }
        self.db.flush()?;
        Ok(())
    }

    /// Bytes the head occupies on disk: its log files and its database.
    pub(crate) fn size_on_disk(&self) -> u64 {
        let logs: u64 = std::fs::read_dir(&self.logs.dir)
            .map(|dir| {
                dir.flatten()
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0);
        logs + self.db.size_on_disk().unwrap_or(0)
    }

    /// Appends a record's `frame` ([`Record::frame`]) to the log of head range `range`
    /// (durable at the next [`Wal::flush`]).
    pub(crate) fn append(&self, range: u64, frame: &[u8]) -> Result<(), StoreError> {
        let mut open = self.logs.lock();
        let (files, dirty) = &mut *open;
        let path = self.logs.path(range);
        let io = |source| StoreError::Io {
            path: path.clone(),
            source,
        };
        let file = match files.entry(range) {
            std::collections::btree_map::Entry::Occupied(file) => file.into_mut(),
            std::collections::btree_map::Entry::Vacant(slot) => {
                let file = File::options()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(io)?;
                // A new file's name must be durable too.
                sync_dir(&self.logs.dir).map_err(io)?;
                slot.insert(file)
            }
        };
        file.write_all(frame).map_err(io)?;
        dirty.insert(range);
        Ok(())
    }

    /// The head's log files, each with its range: per range in range order, its sealed
    /// generations oldest first, then its open log. A replay reads them in this order
    /// ([`Wal::scan`]).
    pub(crate) fn log_files(&self) -> Result<Vec<(u64, PathBuf)>, StoreError> {
        let dir = std::fs::read_dir(&self.logs.dir).map_err(|source| StoreError::Io {
            path: self.logs.dir.clone(),
            source,
        })?;
        // (range, generation): the open log after every sealed one.
        let mut files: Vec<((u64, u64), PathBuf)> = dir
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name();
                let name = name.to_str()?;
                let order = match name.strip_suffix(".log") {
                    Some(range) => (range.parse().ok()?, u64::MAX),
                    None => {
                        let range = name.strip_suffix(".sealed")?.split_once('.')?.0;
                        (range.parse().ok()?, Logs::generation(&entry.path())?)
                    }
                };
                Some((order, entry.path()))
            })
            .collect();
        files.sort_unstable();
        Ok(files
            .into_iter()
            .map(|((range, _), path)| (range, path))
            .collect())
    }

    /// Reads log file `path` record by record, in write order, handing each to `keep` with its
    /// frame; rewrites the file without the records `keep` refuses (deletes it when none is
    /// left). A torn frame at the end of a file (a crash during an append: never acknowledged)
    /// is cut off; a damaged frame before the end loses the rest of that file, logged. Only
    /// one file's bytes are held at a time, and one decoded record.
    pub(crate) fn scan(
        &self,
        range: u64,
        path: &Path,
        mut keep: impl FnMut(Record) -> Result<bool, StoreError>,
    ) -> Result<(), StoreError> {
        let io = |source| StoreError::Io {
            path: path.to_owned(),
            source,
        };
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(io(source)),
        };
        let mut at = 0;
        let mut kept: Vec<std::ops::Range<usize>> = Vec::new();
        let mut refused = false;
        let mut damage = None;
        while at < bytes.len() {
            match unframe(&bytes[at..]) {
                Ok((record, len)) => {
                    if keep(record)? {
                        kept.push(at..at + len);
                    } else {
                        refused = true;
                    }
                    at += len;
                }
                Err(reason) => {
                    damage = Some(reason);
                    break;
                }
            }
        }
        if let Some(reason) = &damage {
            tracing::warn!(file = %path.display(), kept = at, dropped = bytes.len() - at, %reason, "head log ends in a torn or damaged record; cut there (it was never acknowledged if at the end)");
        }
        if !refused && damage.is_none() {
            return Ok(());
        }
        // An appender of this range writes to the file replaced: it opens the new one.
        {
            let mut open = self.logs.lock();
            open.0.remove(&range);
            open.1.remove(&range);
        }
        if kept.is_empty() {
            std::fs::remove_file(path).map_err(io)?;
        } else {
            // Renamed over the old file: after a crash it is either whole, as it was (the
            // records refused are those a replay refuses again), or rewritten.
            let temporary = path.with_extension("rewrite");
            let mut file = File::create(&temporary).map_err(io)?;
            for frame in kept {
                file.write_all(&bytes[frame]).map_err(io)?;
            }
            file.sync_all().map_err(io)?;
            std::fs::rename(&temporary, path).map_err(io)?;
        }
        sync_dir(&self.logs.dir).map_err(io)
    }

    /// Every record of every range, in the order of [`Wal::log_files`].
    #[cfg(test)]
    pub(crate) fn records(&self) -> Result<Vec<(u64, Record)>, StoreError> {
        let mut out = Vec::new();
        for (range, path) in self.log_files()? {
            self.scan(range, &path, |record| {
                out.push((range, record));
                Ok(true)
            })?;
        }
        Ok(out)
    }

    /// Seals the log of head range `range` for a cut: its open file, synced, renamed to the
    /// range's next sealed generation, so that writes arriving for the range meanwhile start a
    /// new log (none: nothing to do).
    pub(crate) fn seal_range(&self, range: u64) -> Result<(), StoreError> {
        let mut open = self.logs.lock();
        let (files, dirty) = &mut *open;
        let path = self.logs.path(range);
        let io = |source| StoreError::Io {
            path: path.clone(),
            source,
        };
        if let Some(file) = files.remove(&range)
            && dirty.remove(&range)
        {
            file.sync_data().map_err(io)?;
        }
        // One past the newest: a replay may have deleted an older one whose records were cut.
        let generation = self
            .log_files()?
            .iter()
            .filter(|(r, _)| *r == range)
            .filter_map(|(_, path)| Logs::generation(path))
            .max()
            .map_or(0, |newest| newest + 1);
        let sealed = self.logs.sealed_path(range, generation);
        match std::fs::rename(&path, &sealed) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(io(source)),
        }
        sync_dir(&self.logs.dir).map_err(io)
    }

    /// Deletes the sealed logs of head range `range`, durably: its cut's blocks hold them.
    pub(crate) fn remove_sealed(&self, range: u64) -> Result<(), StoreError> {
        let sealed: Vec<PathBuf> = self
            .log_files()?
            .into_iter()
            .filter(|(r, path)| *r == range && Logs::generation(path).is_some())
            .map(|(_, path)| path)
            .collect();
        for path in &sealed {
            std::fs::remove_file(path).map_err(|source| StoreError::Io {
                path: path.clone(),
                source,
            })?;
        }
        if sealed.is_empty() {
            return Ok(());
        }
        sync_dir(&self.logs.dir).map_err(|source| StoreError::Io {
            path: self.logs.dir.clone(),
            source,
        })
    }

    /// A metadata value.
    pub(crate) fn meta(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = meta_key(name);
        match self.data.get(&key)? {
            Some(value) => Ok(Some(open(&key, &value)?.to_vec())),
            None => Ok(None),
        }
    }

    /// Sets a metadata value in `batch`.
    pub(crate) fn set_meta(batch: &mut sled::Batch, name: &str, value: &[u8]) {
        batch.insert(meta_key(name), seal(value));
    }

    /// Applies `batch` atomically (not yet durable: see [`Wal::flush`]).
    pub(crate) fn apply(&self, batch: sled::Batch) -> Result<(), StoreError> {
        self.data.apply_batch(batch).map_err(StoreError::from)
    }

    /// Whether agent batch (`agent`, `sequence`) is stored.
    pub(crate) fn has_batch(&self, agent: &str, sequence: u64) -> Result<bool, StoreError> {
        Ok(self.data.contains_key(batch_key(agent, sequence))?)
    }

    /// Adds agent batch marker to `batch`, with the end of its window for retention.
    pub(crate) fn put_batch(batch: &mut sled::Batch, agent: &str, sequence: u64, window_end: u64) {
        batch.insert(batch_key(agent, sequence), seal(&window_end.to_be_bytes()));
        batch.insert(batch_by_time(window_end, agent, sequence), &[][..]);
    }

    /// Adds the removal of every batch marker whose window ended before `cutoff` to `batch`;
    /// returns how many.
    pub(crate) fn expire_batches(
        &self,
        batch: &mut sled::Batch,
        cutoff: u64,
    ) -> Result<u64, StoreError> {
        let end = batch_by_time(cutoff, "", 0);
        let mut count = 0;
        for entry in self.data.range([BATCH_BY_TIME].as_slice()..end.as_slice()) {
            let (key, _) = entry?;
            let (agent, sequence) = parse_batch_by_time(&key)?;
            batch.remove(batch_key(agent, sequence));
            batch.remove(key);
            count += 1;
        }
        Ok(count)
    }

    /// Removes every agent batch marker (both indexes); returns how many batches they named.
    pub(crate) fn clear_batches(&self) -> Result<u64, StoreError> {
        let mut batch = sled::Batch::default();
        let mut count = 0;
        for prefix in [BATCH, BATCH_BY_TIME] {
            for entry in self.data.scan_prefix([prefix]) {
                let (key, _) = entry?;
                batch.remove(key);
                count += u64::from(prefix == BATCH);
            }
        }
        self.apply(batch)?;
        self.flush()?;
        Ok(count)
    }

    /// Every stored rule of `tenant`, in name order.
    pub(crate) fn rules(&self, tenant: &Tenant) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let prefix = tenant_key(RULE, tenant, None);
        let mut out = Vec::new();
        for entry in self.data.scan_prefix(&prefix) {
            let (key, value) = entry?;
            let name = take_str(&key[prefix.len()..])
                .map(|(name, _)| name.to_owned())
                .ok_or_else(|| StoreError::Corrupt {
                    key: printable(&key),
                    reason: "malformed rule key",
                })?;
            out.push((name, open(&key, &value)?.to_vec()));
        }
        Ok(out)
    }

    /// Every tenant with a stored rule, in id order.
    pub(crate) fn rule_tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        let mut out: Vec<Tenant> = Vec::new();
        for entry in self.data.scan_prefix([RULE]) {
            let (key, _) = entry?;
            let corrupt = |reason| StoreError::Corrupt {
                key: printable(&key),
                reason,
            };
            let (id, _) = take_str(&key[1..]).ok_or_else(|| corrupt("malformed rule key"))?;
            if out.last().is_some_and(|last| last.as_str() == id) {
                continue;
            }
            out.push(Tenant::new(id).map_err(|_| corrupt("invalid tenant"))?);
        }
        // Keys order ids by length first.
        out.sort();
        Ok(out)
    }

    /// Stores rule `name` of `tenant`.
    pub(crate) fn put_rule(
        &self,
        tenant: &Tenant,
        name: &str,
        rule: &[u8],
    ) -> Result<(), StoreError> {
        self.data
            .insert(tenant_key(RULE, tenant, Some(name)), seal(rule))?;
        Ok(())
    }

    /// Every stored rule of every tenant as (tenant, name, rule).
    pub(crate) fn all_rules(&self) -> Result<Vec<(Tenant, String, Vec<u8>)>, StoreError> {
        let mut out = Vec::new();
        for tenant in self.rule_tenants()? {
            for (name, rule) in self.rules(&tenant)? {
                out.push((tenant.clone(), name, rule));
            }
        }
        Ok(out)
    }

    /// Deletes every stored rule, durably.
    pub(crate) fn clear_rules(&self) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for entry in self.data.scan_prefix([RULE]) {
            let (key, _) = entry?;
            batch.remove(key);
        }
        self.apply(batch)?;
        self.flush()
    }

    /// Deletes rule `name` of `tenant`; whether it existed.
    pub(crate) fn delete_rule(&self, tenant: &Tenant, name: &str) -> Result<bool, StoreError> {
        Ok(self
            .data
            .remove(tenant_key(RULE, tenant, Some(name)))?
            .is_some())
    }

    /// The app deletions of an older version (prefix `X`): (tenant, app) and the ids of the
    /// blocks whose series of that app were hidden, for [`Wal::migrate_tombstones`].
    fn tombstones(&self) -> Result<Vec<(Tenant, String, BTreeSet<String>)>, StoreError> {
        let mut out = Vec::new();
        for entry in self.data.scan_prefix([TOMBSTONE]) {
            let (key, value) = entry?;
            let (tenant, app) = parse_tenant_key(&key)?;
            let blocks: BTreeSet<String> =
                serde_json::from_slice(open(&key, &value)?).map_err(|_| StoreError::Corrupt {
                    key: printable(&key),
                    reason: "malformed block list",
                })?;
            out.push((tenant, app, blocks));
        }
        Ok(out)
    }

    /// Turns an older version's app deletions (block lists, prefix `X`) into horizons: each
    /// becomes (tenant, app, the latest end `end_of` gives of the blocks it named; none when
    /// none of them is left, and then it hid nothing any more), returned for the caller to
    /// store, and the old entries are removed once the caller has (`commit`).
    ///
    /// # Errors
    ///
    /// When the database cannot be read or written, or `commit` fails.
    pub(crate) fn migrate_tombstones(
        &self,
        end_of: impl Fn(&str) -> Option<u64>,
        commit: impl FnOnce(&[(Tenant, String, u64)]) -> Result<(), StoreError>,
    ) -> Result<Vec<(Tenant, String, u64)>, StoreError> {
        let old = self.tombstones()?;
        if old.is_empty() {
            return Ok(Vec::new());
        }
        let migrated: Vec<(Tenant, String, u64)> = old
            .iter()
            .filter_map(|(tenant, app, blocks)| {
                let horizon = blocks.iter().filter_map(|id| end_of(id)).max()?;
                Some((tenant.clone(), app.clone(), horizon))
            })
            .collect();
        commit(&migrated)?;
        let mut batch = sled::Batch::default();
        for (tenant, app, _) in &old {
            batch.remove(tenant_key(TOMBSTONE, tenant, Some(app)));
        }
        self.apply(batch)?;
        self.flush()?;
        Ok(migrated)
    }

    /// Every app deletion (local mode): tenant, app and horizon.
    pub(crate) fn deletions(&self) -> Result<Vec<(Tenant, String, u64)>, StoreError> {
        let mut out = Vec::new();
        for entry in self.data.scan_prefix([DELETION]) {
            let (key, value) = entry?;
            let (tenant, app) = parse_tenant_key(&key)?;
            let payload = open(&key, &value)?;
            let horizon = payload
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| StoreError::Corrupt {
                    key: printable(&key),
                    reason: "malformed deletion",
                })?;
            out.push((tenant, app, horizon));
        }
        Ok(out)
    }

    /// Sets the deletion of `app` of `tenant` to `horizon`, made at `millis` (Unix ms), in
    /// `batch`.
    pub(crate) fn put_deletion(
        batch: &mut sled::Batch,
        tenant: &Tenant,
        app: &str,
        horizon: u64,
        millis: u64,
    ) {
        let mut value = horizon.to_be_bytes().to_vec();
        value.extend_from_slice(&millis.to_be_bytes());
        batch.insert(tenant_key(DELETION, tenant, Some(app)), seal(&value));
    }

    /// Removes the deletion of `app` of `tenant` in `batch`.
    pub(crate) fn remove_deletion(batch: &mut sled::Batch, tenant: &Tenant, app: &str) {
        batch.remove(tenant_key(DELETION, tenant, Some(app)));
    }
}

impl Logs {
    fn path(&self, range: u64) -> PathBuf {
        self.dir.join(format!("{range:012}.log"))
    }

    fn sealed_path(&self, range: u64, generation: u64) -> PathBuf {
        self.dir.join(format!("{range:012}.{generation}.sealed"))
    }

    /// The generation of sealed log `path` (`None`: an open log).
    fn generation(path: &Path) -> Option<u64> {
        let name = path.file_name()?.to_str()?.strip_suffix(".sealed")?;
        name.split_once('.')?.1.parse().ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (BTreeMap<u64, File>, HashSet<u64>)> {
        // Taken by the writer thread for an append, a flush or a deletion; never across
        // anything but file calls.
        self.open.lock().expect("head log lock")
    }
}

/// Makes the entries of directory `dir` durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The record at the start of `bytes` and its frame's length, or why there is none.
pub(crate) fn unframe(bytes: &[u8]) -> Result<(Record, usize), String> {
    let (record, len) = HeadRecord::unframe(bytes, crate::store::BUCKET, &RECORD_LIMITS)
        .map_err(|err| err.to_string())?;
    let tenant = Tenant::new(&record.tenant)
        .map_err(|err| format!("head log record: invalid tenant: {err}"))?;
    Ok((
        Record {
            tenant,
            marker: record.marker,
            window_end: record.window_end,
            write: record.write,
            profiles: record.profiles,
        },
        len,
    ))
}

fn meta_key(name: &str) -> Vec<u8> {
    let mut key = vec![META];
    key.extend_from_slice(name.as_bytes());
    key
}

fn tenant_key(prefix: u8, tenant: &Tenant, name: Option<&str>) -> Vec<u8> {
    let mut key = vec![prefix];
    put_key_str(&mut key, tenant.as_str());
    if let Some(name) = name {
        put_key_str(&mut key, name);
    }
    key
}

/// The tenant and name of a `tenant_key` with a name.
fn parse_tenant_key(key: &[u8]) -> Result<(Tenant, String), StoreError> {
    let corrupt = |reason| StoreError::Corrupt {
        key: printable(key),
        reason,
    };
    let (tenant, rest) = take_str(&key[1..]).ok_or_else(|| corrupt("malformed key"))?;
    let (name, _) = take_str(rest).ok_or_else(|| corrupt("malformed key"))?;
    let tenant = Tenant::new(tenant).map_err(|_| corrupt("invalid tenant"))?;
    Ok((tenant, name.to_owned()))
}

fn batch_key(agent: &str, sequence: u64) -> Vec<u8> {
    let mut key = vec![BATCH];
    put_key_str(&mut key, agent);
    key.extend_from_slice(&sequence.to_be_bytes());
    key
}

fn batch_by_time(end: u64, agent: &str, sequence: u64) -> Vec<u8> {
    let mut key = vec![BATCH_BY_TIME];
    key.extend_from_slice(&end.to_be_bytes());
    put_key_str(&mut key, agent);
    key.extend_from_slice(&sequence.to_be_bytes());
    key
}

fn parse_batch_by_time(key: &[u8]) -> Result<(&str, u64), StoreError> {
    key.get(9..)
        .and_then(take_str)
        .and_then(|(agent, rest)| Some((agent, u64::from_be_bytes(rest.try_into().ok()?))))
        .ok_or_else(|| StoreError::Corrupt {
            key: printable(key),
            reason: "malformed batch marker key",
        })
}

fn put_key_str(key: &mut Vec<u8>, s: &str) {
    // Names in keys (tenants, agent ids, apps, rule names) are capped far below 4 GiB.
    key.extend_from_slice(&(s.len() as u32).to_be_bytes());
    key.extend_from_slice(s.as_bytes());
}

fn take_str(bytes: &[u8]) -> Option<(&str, &[u8])> {
    let len = u32::from_be_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let s = std::str::from_utf8(bytes.get(4..4 + len)?).ok()?;
    Some((s, &bytes[4 + len..]))
}

/// Frames a value with the CRC-32 of its payload.
pub(crate) fn seal(payload: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(4 + payload.len());
    value.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    value.extend_from_slice(payload);
    value
}

/// Checks a framed value and returns its payload.
pub(crate) fn open<'v>(key: &[u8], value: &'v [u8]) -> Result<&'v [u8], StoreError> {
    let corrupt = |reason| StoreError::Corrupt {
        key: printable(key),
        reason,
    };
    let (crc, payload) = value
        .split_at_checked(4)
        .ok_or_else(|| corrupt("value too short"))?;
    if crc32fast::hash(payload) != u32::from_le_bytes(crc.try_into().expect("split at 4")) {
        return Err(corrupt("checksum mismatch"));
    }
    Ok(payload)
}

/// A key as an operator can read it in a log.
pub(crate) fn printable(key: &[u8]) -> String {
    key.escape_ascii().to_string()
}

impl Record {
    /// The record as its log frames it.
    pub(crate) fn frame(&self) -> Vec<u8> {
        RecordRef {
            tenant: self.tenant.as_str(),
            marker: &self.marker,
            window_end: self.window_end,
            write: self.write,
            profiles: &self.profiles,
        }
        .frame()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn record(tenant: &str) -> HeadRecord {
        let mut tree = smolder_common::Tree::new();
        tree.insert_names(["main", "work"], 7);
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        HeadRecord {
            tenant: tenant.into(),
            marker: Marker {
                agent_id: "host-1".into(),
                sequence: 9,
            },
            window_end: Some(1_700_000_010),
            write: 3,
            profiles: vec![HeadProfile {
                bucket: 1_700_000_000,
                profile: smolder_common::Profile {
                    series: smolder_common::Series::parse("app.cpu{env=prod}").unwrap(),
                    meta: smolder_common::ProfileMeta::default(),
                    from: at,
                    until: at + Duration::from_secs(crate::store::BUCKET),
                    tree,
                },
                spans: smolder_common::SpanTrees::new(),
            }],
        }
    }

    #[test]
    fn records_round_trip_and_refuse_an_invalid_tenant() {
        let written = record("team-a");
        let frame = written.as_ref().frame();
        let (back, len) = unframe(&frame).unwrap();
        assert_eq!(len, frame.len());
        assert_eq!(back.tenant.as_str(), "team-a");
        assert_eq!(back.frame(), frame);
        let err = unframe(&record("no/slash").as_ref().frame()).err().unwrap();
        assert!(err.contains("invalid tenant"), "{err}");
        let err = unframe(&frame[..frame.len() - 1]).err().unwrap();
        assert!(err.contains("head log record: truncated"), "{err}");
    }

    #[test]
    fn sealed_logs_go_aside_numbered_past_the_newest_and_go_whole() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(dir.path()).unwrap();
        let frame = record("team-a").as_ref().frame();
        let names = |wal: &Wal| -> Vec<(u64, String)> {
            wal.log_files()
                .unwrap()
                .iter()
                .map(|(range, path)| (*range, path.file_name().unwrap().to_str().unwrap().into()))
                .collect()
        };
        wal.append(1000, &frame).unwrap();
        wal.flush().unwrap();
        wal.seal_range(1000).unwrap();
        wal.append(1000, &frame).unwrap();
        wal.append(2000, &frame).unwrap();
        wal.seal_range(1000).unwrap();
        wal.append(1000, &frame).unwrap();
        wal.flush().unwrap();
        let name = |range: u64, rest: &str| (range, format!("{range:012}{rest}"));
        assert_eq!(
            names(&wal),
            [
                name(1000, ".0.sealed"),
                name(1000, ".1.sealed"),
                name(1000, ".log"),
                name(2000, ".log")
            ]
        );
        // A replay that finds every record of a sealed log cut deletes it; the next sealed log
        // is numbered past the newest, not into the gap.
        let (range, first) = wal.log_files().unwrap().remove(0);
        wal.scan(range, &first, |_| Ok(false)).unwrap();
        wal.seal_range(1000).unwrap();
        assert_eq!(
            names(&wal),
            [
                name(1000, ".1.sealed"),
                name(1000, ".2.sealed"),
                name(2000, ".log")
            ]
        );
        wal.remove_sealed(1000).unwrap();
        assert_eq!(names(&wal), [name(2000, ".log")]);
        assert_eq!(wal.records().unwrap().len(), 1);
    }

    #[test]
    fn batch_markers_sort_by_time() {
        let early = batch_by_time(100, "agent-b", 7);
        let late = batch_by_time(200, "agent-a", 1);
        assert!(early < late);
        assert_eq!(parse_batch_by_time(&early).unwrap(), ("agent-b", 7));
    }

    #[test]
    fn clearing_batch_markers_keeps_rules_and_meta() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(dir.path()).unwrap();
        let tenant = Tenant::new("team-a").unwrap();
        let mut batch = sled::Batch::default();
        Wal::put_batch(&mut batch, "host-1", 1, 100);
        Wal::put_batch(&mut batch, "host-2", 9, 200);
        Wal::set_meta(&mut batch, "next_write", &7u64.to_be_bytes());
        wal.apply(batch).unwrap();
        wal.put_rule(&tenant, "cpu", b"rule").unwrap();

        assert_eq!(wal.clear_batches().unwrap(), 2);
        assert!(!wal.has_batch("host-1", 1).unwrap());
        assert!(!wal.has_batch("host-2", 9).unwrap());
        let mut batch = sled::Batch::default();
        assert_eq!(wal.expire_batches(&mut batch, u64::MAX).unwrap(), 0);
        assert_eq!(wal.rules(&tenant).unwrap().len(), 1);
        assert_eq!(
            wal.meta("next_write").unwrap(),
            Some(7u64.to_be_bytes().to_vec())
        );
        assert_eq!(wal.clear_batches().unwrap(), 0);
    }

    #[test]
    fn an_older_versions_app_deletions_become_horizons() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(dir.path()).unwrap();
        let tenant = Tenant::new("team-a").unwrap();
        let mut batch = sled::Batch::default();
        for (app, blocks) in [("app.cpu", ["b1", "b2"]), ("gone.cpu", ["b9", "b8"])] {
            let list = serde_json::to_vec(&BTreeSet::from(blocks)).unwrap();
            batch.insert(tenant_key(TOMBSTONE, &tenant, Some(app)), seal(&list));
        }
        wal.apply(batch).unwrap();
        let ends = |id: &str| match id {
            "b1" => Some(2_000),
            "b2" => Some(3_000),
            _ => None,
        };
        let migrated = wal
            .migrate_tombstones(ends, |migrated| {
                let mut batch = sled::Batch::default();
                for (tenant, app, horizon) in migrated {
                    Wal::put_deletion(&mut batch, tenant, app, *horizon, 7);
                }
                wal.apply(batch)
            })
            .unwrap();
        // The latest end of the blocks it hid; a deletion none of whose blocks is left hid
        // nothing any more.
        let expected = [(tenant.clone(), "app.cpu".to_owned(), 3_000)];
        assert_eq!(migrated, expected);
        assert_eq!(wal.deletions().unwrap(), expected);
        assert!(wal.tombstones().unwrap().is_empty());
        assert!(
            wal.migrate_tombstones(ends, |_| unreachable!())
                .unwrap()
                .is_empty()
        );
        let mut batch = sled::Batch::default();
        Wal::remove_deletion(&mut batch, &tenant, "app.cpu");
        wal.apply(batch).unwrap();
        assert!(wal.deletions().unwrap().is_empty());
    }
}
