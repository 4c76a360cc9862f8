//! The head's durable half, under `<data-dir>/head/`:
//!
//! - `log/<range start>.log`, one append-only file per head range holding every acknowledged
//!   write's profiles of that range until the range is cut into a block, then deleted whole, so
//!   its space returns at once. Each record is framed as length (u32 LE), CRC-32 (u32 LE) of
//!   the payload, payload (a [`Record`], lz4-compressed); a torn frame at a file's end (a crash
//!   during an append, never acknowledged) is cut off when the file is read back.
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

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use smolder_block::Marker;
use smolder_common::{Aggregation, Labels, Profile, ProfileMeta, Series, Tree};

use crate::store::StoreError;
use crate::tenant::Tenant;

const META: u8 = b'M';
const BATCH: u8 = b'B';
const BATCH_BY_TIME: u8 = b'b';
const RULE: u8 = b'R';
const TOMBSTONE: u8 = b'X';

/// The most a head record may decompress to: far above one write's (ingest caps bodies at
/// tens of MiB), so only damage reaches it.
const MAX_RECORD_BYTES: u64 = 1 << 30;

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

    /// Appends `record` to the log of head range `range` (durable at the next
    /// [`Wal::flush`]).
    pub(crate) fn append(&self, range: u64, record: &Record) -> Result<(), StoreError> {
        let frame = frame(record);
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
        file.write_all(&frame).map_err(io)?;
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
            let path = self.logs.path(range);
            let bytes = std::fs::read(&path).map_err(|source| StoreError::Io {
                path: path.clone(),
                source,
            })?;
            let mut at = 0;
            let mut records = Vec::new();
            while at < bytes.len() {
                match unframe(&bytes[at..]) {
                    Some((record, len)) => {
                        records.push((range, record));
                        at += len;
                    }
                    None => break,
                }
            }
            if at < bytes.len() {
                tracing::warn!(file = %path.display(), kept = at, dropped = bytes.len() - at, "head log ends in a torn or damaged record; cut there (it was never acknowledged if at the end)");
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
            records.sort_by_key(|(_, r)| r.write);
            out.extend(records);
        }
        Ok(out)
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
            file.write_all(&frame(record)).map_err(io)?;
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

/// A record as its log frames it: length, CRC-32, lz4 payload (a record is mostly its trees'
/// frame names, which repeat from write to write).
fn frame(record: &Record) -> Vec<u8> {
    let payload = lz4_flex::block::compress_prepend_size(&record.encode());
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// The record framed at the start of `bytes` and the frame's length; `None` for a torn or
/// damaged frame.
fn unframe(bytes: &[u8]) -> Option<(Record, usize)> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?);
    let payload = bytes.get(8..8 + len)?;
    if crc32fast::hash(payload) != crc {
        return None;
    }
    let claimed = u32::from_le_bytes(payload.get(..4)?.try_into().ok()?);
    if u64::from(claimed) > MAX_RECORD_BYTES {
        return None;
    }
    let plain = lz4_flex::block::decompress_size_prepended(payload).ok()?;
    Some((Record::decode(&plain)?, 8 + len))
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
    /// Layout: tenant, marker agent id, marker sequence, window end + 1 (0: none), write
    /// number, profile count, per profile: bucket,
    /// app, label count, (name, value)…, spy name, sample rate, units, aggregation (0 sum, 1
    /// average), tree length, tree (`Tree::encode`). Integers are LEB128, strings a length and
    /// UTF-8.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_str(&mut out, self.tenant.as_str());
        put_str(&mut out, &self.marker.agent_id);
        put_varint(&mut out, self.marker.sequence);
        // 0: no window end (an HTTP write); else the window end plus one.
        put_varint(
            &mut out,
            self.window_end.map_or(0, |end| end.saturating_add(1)),
        );
        put_varint(&mut out, self.write);
        put_varint(&mut out, self.profiles.len() as u64);
        for (bucket, profile) in &self.profiles {
            put_varint(&mut out, *bucket);
            put_str(&mut out, profile.series.app());
            put_varint(&mut out, profile.series.labels().len() as u64);
            for (name, value) in profile.series.labels().iter() {
                put_str(&mut out, name);
                put_str(&mut out, value);
            }
            put_str(&mut out, &profile.meta.spy_name);
            put_varint(&mut out, u64::from(profile.meta.sample_rate));
            put_str(&mut out, &profile.meta.units);
            out.push(match profile.meta.aggregation {
                Aggregation::Sum => 0,
                Aggregation::Average => 1,
            });
            let tree = profile.tree.encode();
            put_varint(&mut out, tree.len() as u64);
            out.extend_from_slice(&tree);
        }
        out
    }

    /// Decodes [`Record::encode`]'s bytes; `None` when they are malformed.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Record> {
        let mut r = bytes;
        let tenant = Tenant::new(take(&mut r)?).ok()?;
        let agent_id = take(&mut r)?.to_owned();
        let sequence = varint(&mut r)?;
        let window_end = varint(&mut r)?.checked_sub(1);
        let write = varint(&mut r)?;
        let count = usize::try_from(varint(&mut r)?).ok()?;
        let mut profiles = Vec::with_capacity(count.min(r.len()));
        for _ in 0..count {
            let bucket = varint(&mut r)?;
            let app = take(&mut r)?.to_owned();
            let labels = usize::try_from(varint(&mut r)?).ok()?;
            let mut pairs = Vec::with_capacity(labels.min(r.len()));
            for _ in 0..labels {
                pairs.push((take(&mut r)?.to_owned(), take(&mut r)?.to_owned()));
            }
            let series = Series::new(app, Labels::from_pairs(pairs).ok()?).ok()?;
            let spy_name = take(&mut r)?.to_owned();
            let sample_rate = u32::try_from(varint(&mut r)?).ok()?;
            let units = take(&mut r)?.to_owned();
            let (&aggregation, rest) = r.split_first()?;
            r = rest;
            let aggregation = match aggregation {
                0 => Aggregation::Sum,
                1 => Aggregation::Average,
                _ => return None,
            };
            let len = usize::try_from(varint(&mut r)?).ok()?;
            let (tree, rest) = r.split_at_checked(len)?;
            r = rest;
            let tree = Tree::decode(tree).ok()?;
            let at = UNIX_EPOCH + Duration::from_secs(bucket);
            profiles.push((
                bucket,
                Profile {
                    series,
                    meta: ProfileMeta {
                        spy_name,
                        sample_rate,
                        units,
                        aggregation,
                    },
                    from: at,
                    until: at + Duration::from_secs(crate::store::BUCKET),
                    tree,
                },
            ));
        }
        r.is_empty().then_some(Record {
            tenant,
            marker: Marker { agent_id, sequence },
            window_end,
            write,
            profiles,
        })
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn varint(r: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = r.split_first()?;
        *r = rest;
        value |= u64::from(byte & 0x7f).checked_shl(shift)?;
        if byte < 0x80 {
            return Some(value);
        }
    }
    None
}

fn take<'a>(r: &mut &'a [u8]) -> Option<&'a str> {
    let len = usize::try_from(varint(r)?).ok()?;
    let (s, rest) = r.split_at_checked(len)?;
    *r = rest;
    std::str::from_utf8(s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_refuse_damage() {
        let mut tree = Tree::new();
        tree.insert_names(["main", "work"], 7);
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let record = Record {
            tenant: Tenant::anonymous(),
            marker: Marker {
                agent_id: "host-1".into(),
                sequence: 9,
            },
            window_end: Some(1_700_000_010),
            write: 3,
            profiles: vec![(
                1_700_000_000,
                Profile {
                    series: Series::parse("app.cpu{env=prod}").unwrap(),
                    meta: ProfileMeta::default(),
                    from: at,
                    until: at + Duration::from_secs(10),
                    tree: tree.clone(),
                },
            )],
        };
        let bytes = record.encode();
        let back = Record::decode(&bytes).unwrap();
        assert_eq!(back.marker, record.marker);
        assert_eq!((back.window_end, back.write), (record.window_end, 3));
        assert_eq!(back.profiles[0].1.tree, tree);
        assert_eq!(back.profiles[0].1.series, record.profiles[0].1.series);
        for len in 0..bytes.len() {
            assert!(
                Record::decode(&bytes[..len]).is_none(),
                "truncated at {len}"
            );
        }
    }

    #[test]
    fn batch_markers_sort_by_time() {
        let early = batch_by_time(100, "agent-b", 7);
        let late = batch_by_time(200, "agent-a", 1);
        assert!(early < late);
        assert_eq!(parse_batch_by_time(&early).unwrap(), ("agent-b", 7));
    }
}
