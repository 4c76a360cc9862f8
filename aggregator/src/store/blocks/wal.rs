//! The head's durable half: one sled database (`<data-dir>/head/`) that holds every
//! acknowledged write until it is in a block, the batch markers that dedupe agents' retries,
//! recording rules, app deletions and the store's own identity.
//!
//! Input: what the writer thread applies; output: the records a restart replays into the head
//! (`head.rs`). Owned by the writer thread for writes; reads (rules, markers) are sled's
//! consistent snapshots.
//!
//! | prefix | key | value |
//! |---|---|---|
//! | `M` | name | store metadata (`aggregator_id`, `next_write`, `migrated_v01`) |
//! | `W` | head range start (u64), write number (u64) | one write's profiles in that range ([`Record`], lz4) |
//! | `B` | agent id, sequence | window end: this agent batch is stored |
//! | `b` | window end, agent id, sequence | empty: the same marker by time, for retention |
//! | `R` | tenant, rule name | a recording rule (opaque bytes) |
//! | `X` | tenant, app | the ids of the blocks whose series of that app are deleted |
//!
//! Integers in keys are big-endian, strings length-prefixed; every value but the empty ones is
//! framed with a CRC-32 of its payload, checked when read.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use smolder_block::Marker;
use smolder_common::{Aggregation, Labels, Profile, ProfileMeta, Series, Tree};

use crate::store::StoreError;
use crate::tenant::Tenant;

const META: u8 = b'M';
const WRITE: u8 = b'W';
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

/// The head database. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Wal {
    db: sled::Db,
    data: sled::Tree,
}

/// One write's profiles that fall in one head range, as the head stores and replays them.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    pub(crate) tenant: Tenant,
    /// The agent batch, or the aggregator's own marker of an HTTP write.
    pub(crate) marker: Marker,
    /// Each profile with its 10 s bucket.
    pub(crate) profiles: Vec<(u64, Profile)>,
}

impl Wal {
    /// Opens (creating) the head database in `dir`.
    pub(crate) fn open(dir: &Path) -> Result<Wal, StoreError> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(CACHE_BYTES)
            .open()?;
        let data = db.open_tree("head")?;
        Ok(Wal { db, data })
    }

    /// Makes everything applied so far durable.
    pub(crate) fn flush(&self) -> Result<(), sled::Error> {
        self.db.flush().map(|_| ())
    }

    /// Bytes the database occupies on disk.
    pub(crate) fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
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

    /// Adds record `record` of write `write` in head range `range` to `batch`.
    pub(crate) fn put_record(batch: &mut sled::Batch, range: u64, write: u64, record: &Record) {
        // lz4: a record is mostly its trees' frame names, which repeat from write to write.
        let compressed = lz4_flex::block::compress_prepend_size(&record.encode());
        batch.insert(&record_key(range, write)[..], seal(&compressed));
    }

    /// Every record, in range and write order, with its key. A record that fails its checksum
    /// or does not decode is an error naming its key: the head is never guessed at.
    pub(crate) fn records(&self) -> Result<Vec<(u64, u64, Record)>, StoreError> {
        let mut out = Vec::new();
        for entry in self.data.scan_prefix([WRITE]) {
            let (key, value) = entry?;
            let corrupt = |reason| StoreError::Corrupt {
                key: printable(&key),
                reason,
            };
            let (range, write) = parse_record_key(&key).ok_or_else(|| corrupt("short key"))?;
            let compressed = open(&key, &value)?;
            let claimed = compressed
                .get(..4)
                .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
            if u64::from(claimed) > MAX_RECORD_BYTES {
                return Err(corrupt("record claims more than 1 GiB"));
            }
            let plain = lz4_flex::block::decompress_size_prepended(compressed)
                .map_err(|_| corrupt("record does not decompress"))?;
            let record = Record::decode(&plain).ok_or_else(|| corrupt("record does not decode"))?;
            out.push((range, write, record));
        }
        Ok(out)
    }

    /// Adds the removal of record (`range`, `write`) to `batch`.
    pub(crate) fn remove_record(batch: &mut sled::Batch, range: u64, write: u64) {
        batch.remove(&record_key(range, write)[..]);
    }

    /// The keys of every record of head range `range`, as (range, write).
    pub(crate) fn records_of(&self, range: u64) -> Result<Vec<u64>, StoreError> {
        let mut prefix = vec![WRITE];
        prefix.extend_from_slice(&range.to_be_bytes());
        let mut out = Vec::new();
        for entry in self.data.scan_prefix(prefix) {
            let (key, _) = entry?;
            let (_, write) = parse_record_key(&key).ok_or_else(|| StoreError::Corrupt {
                key: printable(&key),
                reason: "short key",
            })?;
            out.push(write);
        }
        Ok(out)
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

fn meta_key(name: &str) -> Vec<u8> {
    let mut key = vec![META];
    key.extend_from_slice(name.as_bytes());
    key
}

fn record_key(range: u64, write: u64) -> [u8; 17] {
    let mut key = [WRITE; 17];
    key[1..9].copy_from_slice(&range.to_be_bytes());
    key[9..].copy_from_slice(&write.to_be_bytes());
    key
}

fn parse_record_key(key: &[u8]) -> Option<(u64, u64)> {
    let range = u64::from_be_bytes(key.get(1..9)?.try_into().ok()?);
    let write = u64::from_be_bytes(key.get(9..17)?.try_into().ok()?);
    Some((range, write))
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
    /// Layout: tenant, marker agent id, marker sequence, profile count, per profile: bucket,
    /// app, label count, (name, value)…, spy name, sample rate, units, aggregation (0 sum, 1
    /// average), tree length, tree (`Tree::encode`). Integers are LEB128, strings a length and
    /// UTF-8.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_str(&mut out, self.tenant.as_str());
        put_str(&mut out, &self.marker.agent_id);
        put_varint(&mut out, self.marker.sequence);
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
