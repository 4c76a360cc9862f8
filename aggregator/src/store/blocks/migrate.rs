//! Migration of a v0.1 data directory (the sled store, `<data-dir>/sled/`) on first start.
//!
//! Decision: **migrate, then delete the old store**, rather than read both until retention
//! ages the old one out: one read path, and space comes back at once. Every series' 10 s trees
//! become blocks of 10 000 s (rollups are rebuilt by the block writer, so the old ones are not
//! read), with each bucket's write count, as merged data of no batch; the agents' batch
//! markers, with their window ends, go into the head's marker index, so a batch an agent
//! resends after the upgrade is still stored once; recording rules move to the head.
//!
//! Crash-safe: blocks are named after their range (`…-v01-<start>.block`), so a migration repeated
//! after a crash rewrites the same objects; the head records that the migration finished
//! before the old directory is deleted.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Instant;

use serde::Deserialize;
use smolder_block::{BlockBuilder, Contribution};
use smolder_common::{Aggregation, Labels, ProfileMeta, Series, Tree};
use tracing::info;

use super::files::{BlockName, Files};
use super::wal::{Wal, open, printable};
use crate::store::StoreError;
use crate::tenant::Tenant;

/// The span of a migrated block.
const SPAN: u64 = 10_000;

/// The series record of the v0.1 store (`S` keys), as JSON.
#[derive(Deserialize)]
struct SeriesRecord {
    app: String,
    labels: Vec<(String, String)>,
    spy_name: String,
    sample_rate: u32,
    units: String,
    aggregation: String,
}

/// Migrates the v0.1 store in `data_dir`, if there is one. See the [module documentation](self).
pub(super) fn run(data_dir: &Path, files: &Files, wal: &Wal) -> Result<(), StoreError> {
    let old = data_dir.join("sled");
    if !old.exists() {
        return Ok(());
    }
    if wal.meta("migrated_v01")?.is_none() {
        migrate(&old, files, wal)?;
        let mut batch = sled::Batch::default();
        Wal::set_meta(&mut batch, "migrated_v01", b"1");
        wal.apply(batch)?;
        wal.flush()?;
    }
    std::fs::remove_dir_all(&old).map_err(|source| StoreError::Io { path: old, source })?;
    info!("the v0.1 store was migrated to blocks and its directory deleted");
    Ok(())
}

fn corrupt(key: &[u8], reason: &'static str) -> StoreError {
    StoreError::Corrupt {
        key: printable(key),
        reason,
    }
}

fn migrate(old: &Path, files: &Files, wal: &Wal) -> Result<(), StoreError> {
    let started = Instant::now();
    let db = sled::Config::new().path(old).open()?;
    let data = db.open_tree("data")?;
    let mut series: HashMap<u64, (Series, ProfileMeta)> = HashMap::new();
    for entry in data.scan_prefix(b"S") {
        let (key, value) = entry?;
        let id = key
            .get(1..9)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
            .ok_or_else(|| corrupt(&key, "series key is not 9 bytes"))?;
        let record: SeriesRecord = serde_json::from_slice(open(&key, &value)?)
            .map_err(|_| corrupt(&key, "malformed series record"))?;
        let labels =
            Labels::from_pairs(record.labels).map_err(|_| corrupt(&key, "invalid labels"))?;
        let name = Series::new(record.app, labels).map_err(|_| corrupt(&key, "invalid series"))?;
        let meta = ProfileMeta {
            spy_name: record.spy_name,
            sample_rate: record.sample_rate,
            units: record.units,
            aggregation: record.aggregation.parse().unwrap_or(Aggregation::Sum),
        };
        series.insert(id, (name, meta));
    }
    // The 10 s trees (level 0), grouped by the migrated block they go to.
    let mut ranges: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for entry in data.scan_prefix([b'T', 0]) {
        let (key, _) = entry?;
        let (id, start) = bucket_key(&key)?;
        ranges
            .entry(start / SPAN * SPAN)
            .or_default()
            .push((id, start));
    }
    let tenant = Tenant::anonymous();
    let mut trees = 0u64;
    for (range, buckets) in &ranges {
        let mut builder = BlockBuilder::new(tenant.as_str(), *range, SPAN, 10)
            .expect("10 000 s climbs by tens from 10 s");
        for &(id, start) in buckets {
            let Some((name, meta)) = series.get(&id) else {
                continue;
            };
            let key = bucket(b'T', id, start);
            let Some(value) = data.get(key)? else {
                continue;
            };
            let tree = Tree::decode(open(&key, &value)?)
                .map_err(|_| corrupt(&key, "tree does not decode"))?;
            let total_key = bucket(b'N', id, start);
            let writes = match data.get(total_key)? {
                Some(value) => {
                    let payload = open(&total_key, &value)?;
                    payload
                        .get(8..16)
                        .and_then(|b| b.try_into().ok())
                        .map(u64::from_be_bytes)
                        .ok_or_else(|| corrupt(&total_key, "bucket total is not 16 bytes"))?
                }
                None => 1,
            };
            builder
                .add(
                    name,
                    meta,
                    start,
                    &tree,
                    Contribution::merged(Vec::new(), writes),
                )
                .map_err(|err| StoreError::Engine {
                    source: Box::new(err),
                })?;
            trees += 1;
        }
        let (bytes, _) = builder.finish().map_err(|err| StoreError::Engine {
            source: Box::new(err),
        })?;
        let name = BlockName {
            start: *range,
            span: SPAN,
            tenant: tenant.clone(),
            id: format!("v01-{range}"),
        };
        files.put(&name, bytes)?;
    }
    let mut batch = sled::Batch::default();
    let mut markers = 0u64;
    for entry in data.scan_prefix(b"B") {
        let (key, value) = entry?;
        let agent = key
            .get(1..5)
            .and_then(|b| b.try_into().ok())
            .map(|b| u32::from_be_bytes(b) as usize)
            .and_then(|len| {
                std::str::from_utf8(key.get(5..5 + len)?)
                    .ok()
                    .map(|a| (a, len))
            })
            .ok_or_else(|| corrupt(&key, "malformed batch marker key"))?;
        let sequence = key
            .get(5 + agent.1..)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
            .ok_or_else(|| corrupt(&key, "malformed batch marker key"))?;
        let end = open(&key, &value)?
            .try_into()
            .map(u64::from_be_bytes)
            .map_err(|_| corrupt(&key, "window end is not 8 bytes"))?;
        Wal::put_batch(&mut batch, agent.0, sequence, end);
        markers += 1;
    }
    wal.apply(batch)?;
    let mut rules = 0u64;
    for entry in data.scan_prefix(b"R") {
        let (key, value) = entry?;
        let name =
            std::str::from_utf8(&key[1..]).map_err(|_| corrupt(&key, "rule name is not UTF-8"))?;
        wal.put_rule(&tenant, name, open(&key, &value)?)?;
        rules += 1;
    }
    wal.flush()?;
    info!(
        series = series.len(),
        trees,
        blocks = ranges.len(),
        markers,
        rules,
        seconds = started.elapsed().as_secs_f64(),
        "v0.1 store migrated to blocks"
    );
    Ok(())
}

fn bucket(kind: u8, id: u64, start: u64) -> [u8; 18] {
    let mut key = [0; 18];
    key[0] = kind;
    key[2..10].copy_from_slice(&id.to_be_bytes());
    key[10..].copy_from_slice(&start.to_be_bytes());
    key
}

fn bucket_key(key: &[u8]) -> Result<(u64, u64), StoreError> {
    let id = key
        .get(2..10)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes);
    let start = key
        .get(10..18)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes);
    id.zip(start)
        .ok_or_else(|| corrupt(key, "short bucket key"))
}
