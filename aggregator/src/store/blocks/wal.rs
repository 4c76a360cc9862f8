//! The head's durable half, under `<data-dir>/head/`:
//!
//! - `log/<range start>.log`, one append-only file per head range holding every acknowledged
//!   write's profiles of that range until the range is cut into a block, then deleted whole, so
//!   its space returns at once. Each record is framed by `smolder_block::RecordRef::frame`
//!   (length, CRC-32, lz4 payload; the format crate owns the codec, fuzzed there); a torn
//!   frame at a file's end (a crash during an append, never acknowledged) is cut off when the
//!   file is read back.
//! - `db/`, a sled database with the batch markers that dedupe agents' retries, recording rules,
//!   app deletions and the store's own identity.
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
//! | `R` | tenant, rule name | a recording rule (opaque bytes) |
//! | `X` | tenant, app | the ids of the blocks whose series of that app are deleted |
//!
//! Integers in keys are big-endian, strings length-prefixed; every value but the empty ones is
//! framed with a CRC-32 of its payload, checked when read.

use smolder_block::{HeadRecord, Limits, Marker, RecordRef};
use smolder_common::Profile;
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
    /// Each profile with its 10 s bucket.
    pub(crate) profiles: Vec<(u64, Profile)>,
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

    /// Every record of every range, in range and write order. A torn frame at the end of a
    /// file (a crash during an append: never acknowledged) is cut off; a damaged frame before
    /// the end loses the rest of that file, logged.
    pub(crate) fn records(&self) -> Result<Vec<(u64, Record)>, StoreError> {
        let mut out = Vec::new();
        let dir = std::fs::read_dir(&self.logs.dir).map_err(|source| StoreError::Io {
            path: self.logs.dir.clone(),
            source,
        })?;
        let mut ranges: Vec<u64> = dir
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".log")?.parse().ok())
            .collect();
        ranges.sort_unstable();
        for range in ranges {
            out.extend(self.range_records(range)?.into_iter().map(|r| (range, r)));
        }
        Ok(out)
    }

    /// Every record of head range `range`, in write order (none when it has no log), its
    /// file cut at a torn or damaged frame as [`Wal::records`] says.
    pub(crate) fn range_records(&self, range: u64) -> Result<Vec<Record>, StoreError> {
        let path = self.logs.path(range);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(StoreError::Io { path, source }),
        };
        let mut at = 0;
        let mut records = Vec::new();
        let mut damage = None;
        while at < bytes.len() {
            match unframe(&bytes[at..]) {
                Ok((record, len)) => {
                    records.push(record);
                    at += len;
                }
                Err(reason) => {
                    damage = Some(reason);
                    break;
                }
            }
        }
        if let Some(reason) = damage {
            tracing::warn!(file = %path.display(), kept = at, dropped = bytes.len() - at, %reason, "head log ends in a torn or damaged record; cut there (it was never acknowledged if at the end)");
            let file =
                File::options()
                    .write(true)
                    .open(&path)
                    .map_err(|source| StoreError::Io {
                        path: path.clone(),
                        source,
                    })?;
            file.set_len(at as u64)
                .and_then(|()| file.sync_all())
                .map_err(|source| StoreError::Io {
                    path: path.clone(),
                    source,
                })?;
        }
        records.sort_by_key(|r| r.write);
        Ok(records)
    }

    /// Deletes the log of head range `range`, durably.
    pub(crate) fn remove_range(&self, range: u64) -> Result<(), StoreError> {
        let mut open = self.logs.lock();
        open.0.remove(&range);
        open.1.remove(&range);
        let path = self.logs.path(range);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(StoreError::Io { path, source }),
        }
        sync_dir(&self.logs.dir).map_err(|source| StoreError::Io { path, source })
    }

    /// Replaces the log of head range `range` with `records` (none: deletes it), durably.
    pub(crate) fn rewrite_range(&self, range: u64, records: &[&Record]) -> Result<(), StoreError> {
        if records.is_empty() {
            return self.remove_range(range);
        }
        let mut open = self.logs.lock();
        open.0.remove(&range);
        open.1.remove(&range);
        let path = self.logs.path(range);
        let temporary = path.with_extension("rewrite");
        let io = |source| StoreError::Io {
            path: path.clone(),
            source,
        };
        let mut file = File::create(&temporary).map_err(io)?;
        for record in records {
            file.write_all(&record.frame()).map_err(io)?;
        }
        file.sync_all().map_err(io)?;
        std::fs::rename(&temporary, &path).map_err(io)?;
        sync_dir(&self.logs.dir).map_err(io)
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

    /// Deletes rule `name` of `tenant`; whether it existed.
    pub(crate) fn delete_rule(&self, tenant: &Tenant, name: &str) -> Result<bool, StoreError> {
        Ok(self
            .data
            .remove(tenant_key(RULE, tenant, Some(name)))?
            .is_some())
    }

    /// Every app deletion: (tenant, app) and the blocks whose series of that app are hidden.
    pub(crate) fn tombstones(&self) -> Result<Vec<(Tenant, String, BTreeSet<String>)>, StoreError> {
        let mut out = Vec::new();
        for entry in self.data.scan_prefix([TOMBSTONE]) {
            let (key, value) = entry?;
            let corrupt = |reason| StoreError::Corrupt {
                key: printable(&key),
                reason,
            };
            let (tenant, rest) = take_str(&key[1..]).ok_or_else(|| corrupt("malformed key"))?;
            let (app, _) = take_str(rest).ok_or_else(|| corrupt("malformed key"))?;
            let tenant = Tenant::new(tenant).map_err(|_| corrupt("invalid tenant"))?;
            let blocks: BTreeSet<String> = serde_json::from_slice(open(&key, &value)?)
                .map_err(|_| corrupt("malformed block list"))?;
            out.push((tenant, app.to_owned(), blocks));
        }
        Ok(out)
    }

    /// Sets (or, with no blocks, removes) the deletion of `app` of `tenant` in `batch`.
    pub(crate) fn put_tombstone(
        batch: &mut sled::Batch,
        tenant: &Tenant,
        app: &str,
        blocks: &BTreeSet<String>,
    ) {
        let key = tenant_key(TOMBSTONE, tenant, Some(app));
        if blocks.is_empty() {
            batch.remove(key);
        } else {
            let list = serde_json::to_vec(blocks).expect("a list of strings serializes");
            batch.insert(key, seal(&list));
        }
    }
}

impl Logs {
    fn path(&self, range: u64) -> PathBuf {
        self.dir.join(format!("{range:012}.log"))
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
fn unframe(bytes: &[u8]) -> Result<(Record, usize), String> {
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
            profiles: vec![(
                1_700_000_000,
                Profile {
                    series: smolder_common::Series::parse("app.cpu{env=prod}").unwrap(),
                    meta: smolder_common::ProfileMeta::default(),
                    from: at,
                    until: at + Duration::from_secs(crate::store::BUCKET),
                    tree,
                },
            )],
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
    fn batch_markers_sort_by_time() {
        let early = batch_by_time(100, "agent-b", 7);
        let late = batch_by_time(200, "agent-a", 1);
        assert!(early < late);
        assert_eq!(parse_batch_by_time(&early).unwrap(), ("agent-b", 7));
    }
}
