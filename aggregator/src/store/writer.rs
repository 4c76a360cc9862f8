//! The writer thread: every change to the store goes through it, in order.
//!
//! Writes read-modify-write bucket trees, so two at once could lose one's update; one writer
//! makes "concurrent ingests sum exactly" a property of the design rather than of locking. It
//! takes every request waiting in the queue, applies each as one atomic sled batch, then makes
//! the whole group durable with a single fsync before answering any of them.
//!
//! A write updates its 10 s bucket's tree and the totals of every level, and marks the coarser
//! buckets containing it dirty. Rewriting the large rollup trees on every write made sled write
//! 3x the ingested bytes and hold 245 B per stored node (`benches/ingest_http_to_query.rs`);
//! instead [`Command::Rollup`] rebuilds each closed dirty rollup once from its ten children,
//! bottom-up, and reads descend into the children of a rollup that is still dirty.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::time::{Instant, SystemTime};

use smolder_common::{Profile, Tree};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info, warn};

use super::keys::{self, BUCKET, DIRTY, LEVELS, SeriesId, TOTAL, TREE};
use super::series::SeriesRecord;
use super::{BatchMarker, RetentionReport, StoreConfig, StoreError, Written, unix};
use crate::metrics::StoreMetrics;

/// Requests the writer serves.
pub(crate) enum Command {
    Write {
        profiles: Vec<Profile>,
        marker: Option<BatchMarker>,
        reply: oneshot::Sender<Result<Written, StoreError>>,
        queued: Instant,
    },
    DeleteApp {
        app: String,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
    Retention {
        now: SystemTime,
        reply: oneshot::Sender<Result<RetentionReport, StoreError>>,
    },
    Rollup {
        now: SystemTime,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
    Close {
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
}

/// How many queued requests one fsync may cover. Bounds the latency of the first request in a
/// group by the work of the others.
const GROUP: usize = 64;

/// The writer's state, owned by its thread.
pub(crate) struct Writer {
    db: sled::Db,
    data: sled::Tree,
    config: StoreConfig,
    metrics: StoreMetrics,
    next_series: SeriesId,
    series_count: i64,
}

/// An answer held back until the group it belongs to is durable.
enum Pending {
    Write(
        oneshot::Sender<Result<Written, StoreError>>,
        Instant,
        usize,
        Written,
    ),
    DeleteApp(oneshot::Sender<Result<u64, StoreError>>, u64),
    Retention(
        oneshot::Sender<Result<RetentionReport, StoreError>>,
        RetentionReport,
    ),
    Rollup(oneshot::Sender<Result<u64, StoreError>>, u64),
}

impl Writer {
    pub(crate) fn open(
        db: sled::Db,
        data: sled::Tree,
        config: StoreConfig,
        metrics: StoreMetrics,
    ) -> Result<Writer, StoreError> {
        let next_key = keys::meta("next_series");
        let next_series = match data.get(&next_key)? {
            Some(value) => {
                let payload = keys::open(&next_key, &value)?;
                let bytes: [u8; 8] = payload.try_into().map_err(|_| StoreError::Corrupt {
                    key: keys::printable(&next_key),
                    reason: "series counter is not 8 bytes",
                })?;
                u64::from_be_bytes(bytes)
            }
            None => 1,
        };
        let series_count = data.scan_prefix([keys::SERIES]).count() as i64;
        metrics.series.set(series_count);
        metrics
            .disk_bytes
            .set(db.size_on_disk().unwrap_or(0) as i64);
        info!(series = series_count, "store opened");
        Ok(Writer {
            db,
            data,
            config,
            metrics,
            next_series,
            series_count,
        })
    }

    /// Serves commands until `Close` or until every sender is gone.
    pub(crate) fn run(mut self, mut queue: mpsc::Receiver<Command>) {
        let _span = tracing::info_span!("store_writer").entered();
        while let Some(first) = queue.blocking_recv() {
            let mut group = vec![first];
            while group.len() < GROUP {
                match queue.try_recv() {
                    Ok(command) => group.push(command),
                    Err(_) => break,
                }
            }
            let mut pending = Vec::with_capacity(group.len());
            let mut close = None;
            for command in group {
                match command {
                    Command::Write {
                        profiles,
                        marker,
                        reply,
                        queued,
                    } => match self.write(&profiles, marker.as_ref()) {
                        Ok(written) => {
                            let count = if written == Written::Stored {
                                profiles.len()
                            } else {
                                0
                            };
                            pending.push(Pending::Write(reply, queued, count, written));
                        }
                        Err(err) => {
                            let _ = reply.send(Err(err));
                        }
                    },
                    Command::DeleteApp { app, reply } => match self.delete_app(&app) {
                        Ok(count) => pending.push(Pending::DeleteApp(reply, count)),
                        Err(err) => {
                            let _ = reply.send(Err(err));
                        }
                    },
                    Command::Retention { now, reply } => match self.retention(now) {
                        Ok(report) => pending.push(Pending::Retention(reply, report)),
                        Err(err) => {
                            let _ = reply.send(Err(err));
                        }
                    },
                    Command::Rollup { now, reply } => match self.rollup(now) {
                        Ok(built) => pending.push(Pending::Rollup(reply, built)),
                        Err(err) => {
                            let _ = reply.send(Err(err));
                        }
                    },
                    Command::Close { reply } => close = Some(reply),
                }
            }
            let flushed = self.flush();
            self.answer(pending, &flushed);
            if let Some(reply) = close {
                let _ = reply.send(flushed.map_err(StoreError::Sled));
                info!("store closed");
                return;
            }
        }
        if let Err(err) = self.db.flush() {
            error!(error = %err, "final flush failed");
        }
    }

    fn flush(&self) -> Result<(), sled::Error> {
        let started = Instant::now();
        let flushed = self.db.flush().map(|_| ());
        self.metrics
            .flush_duration
            .observe(started.elapsed().as_secs_f64());
        if let Err(err) = &flushed {
            error!(error = %err, "flush failed; the writes of this group are not acknowledged");
        }
        flushed
    }

    fn answer(&self, pending: Vec<Pending>, flushed: &Result<(), sled::Error>) {
        let failed = || StoreError::Flush {
            reason: flushed
                .as_ref()
                .err()
                .map(ToString::to_string)
                .unwrap_or_default(),
        };
        for item in pending {
            match item {
                Pending::Write(reply, queued, profiles, written) => {
                    if flushed.is_ok() {
                        self.metrics.profiles_written.inc_by(profiles as u64);
                        self.metrics
                            .write_duration
                            .observe(queued.elapsed().as_secs_f64());
                    }
                    let _ = reply.send(flushed.as_ref().map(|_| written).map_err(|_| failed()));
                }
                Pending::DeleteApp(reply, count) => {
                    let _ = reply.send(flushed.as_ref().map(|_| count).map_err(|_| failed()));
                }
                Pending::Retention(reply, report) => {
                    let _ = reply.send(flushed.as_ref().map(|_| report).map_err(|_| failed()));
                }
                Pending::Rollup(reply, built) => {
                    let _ = reply.send(flushed.as_ref().map(|_| built).map_err(|_| failed()));
                }
            }
        }
    }

    /// Applies one write request as one atomic batch: series records and index entries for new
    /// series, and for each profile its 10 s bucket's tree, the totals of every level, and a
    /// dirty mark on each rollup above it. With a `marker`, a batch whose marker is stored
    /// already is skipped (the writer is the only one that writes markers, so checking first
    /// is race-free), and the marker goes into the same atomic batch as the trees.
    fn write(
        &mut self,
        profiles: &[Profile],
        marker: Option<&BatchMarker>,
    ) -> Result<Written, StoreError> {
        let mut batch = sled::Batch::default();
        if let Some(marker) = marker {
            let key = keys::batch(&marker.agent_id, marker.sequence);
            if self.data.contains_key(&key)? {
                debug!(
                    agent_id = %marker.agent_id,
                    sequence = marker.sequence,
                    "batch stored before; not written again"
                );
                return Ok(Written::Duplicate);
            }
            batch.insert(key, keys::seal(&marker.window_end.to_be_bytes()));
            batch.insert(
                keys::batch_by_time(marker.window_end, &marker.agent_id, marker.sequence),
                &[][..],
            );
        }
        let mut records: HashMap<String, (SeriesId, SeriesRecord, bool)> = HashMap::new();
        let mut trees: HashMap<[u8; 18], Tree> = HashMap::new();
        let mut totals: HashMap<[u8; 18], (u64, u64)> = HashMap::new();
        let mut next_series = self.next_series;

        for profile in profiles {
            let bucket = bucket_of(profile);
            let key = profile.series.to_string();
            let (id, _, _) = match records.entry(key) {
                Entry::Occupied(entry) => {
                    let entry = entry.into_mut();
                    entry.1.update(&profile.meta, bucket);
                    entry
                }
                Entry::Vacant(entry) => {
                    let index_key = keys::series_by_key(entry.key());
                    let stored = self.data.get(&index_key)?;
                    let loaded = match stored {
                        Some(value) => {
                            let id = series_id(entry.key(), keys::open(&index_key, &value)?)?;
                            let record_key = keys::series(id);
                            let value =
                                self.data
                                    .get(record_key)?
                                    .ok_or_else(|| StoreError::Corrupt {
                                        key: keys::printable(&record_key),
                                        reason: "indexed series has no record",
                                    })?;
                            let mut record = SeriesRecord::decode(&record_key, &value)?;
                            record.update(&profile.meta, bucket);
                            (id, record, false)
                        }
                        None => {
                            let id = next_series;
                            next_series += 1;
                            (
                                id,
                                SeriesRecord::new(&profile.series, &profile.meta, bucket),
                                true,
                            )
                        }
                    };
                    entry.insert(loaded)
                }
            };
            let id = *id;
            let tree_key = keys::bucket(TREE, 0, id, bucket);
            let tree = match trees.entry(tree_key) {
                Entry::Occupied(entry) => entry.into_mut(),
                Entry::Vacant(entry) => entry.insert(self.load_tree(&tree_key)?),
            };
            tree.merge(&profile.tree);
            for (level, size) in LEVELS.iter().enumerate() {
                let start = bucket / size * size;
                if level > 0 {
                    batch.insert(&keys::bucket(DIRTY, level, id, start)[..], &[][..]);
                }
                let total_key = keys::bucket(TOTAL, level, id, start);
                let total = match totals.entry(total_key) {
                    Entry::Occupied(entry) => entry.into_mut(),
                    Entry::Vacant(entry) => entry.insert(self.load_total(&total_key)?),
                };
                total.0 = total.0.saturating_add(profile.tree.total());
                total.1 += 1;
            }
        }

        for (key, tree) in trees {
            batch.insert(&key[..], keys::seal(&tree.encode()));
        }
        for (key, (total, writes)) in totals {
            batch.insert(&key[..], keys::seal(&encode_total(total, writes)));
        }
        let mut created = 0;
        for (id, record, new) in records.into_values() {
            if new {
                created += 1;
                batch.insert(
                    keys::series_by_key(&record.key),
                    keys::seal(&id.to_be_bytes()),
                );
                for (name, value) in record.index_entries() {
                    batch.insert(keys::label(name, value, id), &[][..]);
                }
            }
            batch.insert(&keys::series(id)[..], record.encode());
        }
        if next_series != self.next_series {
            batch.insert(
                keys::meta("next_series"),
                keys::seal(&next_series.to_be_bytes()),
            );
        }
        self.data.apply_batch(batch)?;
        self.next_series = next_series;
        self.series_count += created;
        self.metrics.series.set(self.series_count);
        debug!(profiles = profiles.len(), created, "write applied");
        Ok(Written::Stored)
    }

    /// The stored tree of a bucket, or an empty one. A tree that fails its checksum cannot be
    /// merged into; it is logged with its key and replaced, so that the series stays writable.
    fn load_tree(&self, key: &[u8]) -> Result<Tree, StoreError> {
        let Some(value) = self.data.get(key)? else {
            return Ok(Tree::new());
        };
        match keys::open(key, &value).and_then(|payload| {
            Tree::decode(payload).map_err(|_| StoreError::Corrupt {
                key: keys::printable(key),
                reason: "tree does not decode",
            })
        }) {
            Ok(tree) => Ok(tree),
            Err(err) => {
                error!(error = %err, "replacing a corrupt bucket tree with the new write");
                Ok(Tree::new())
            }
        }
    }

    fn load_total(&self, key: &[u8]) -> Result<(u64, u64), StoreError> {
        match self.data.get(key)? {
            None => Ok((0, 0)),
            Some(value) => match keys::open(key, &value).and_then(|p| decode_total(key, p)) {
                Ok(total) => Ok(total),
                Err(err) => {
                    error!(error = %err, "replacing a corrupt bucket total with the new write");
                    Ok((0, 0))
                }
            },
        }
    }

    /// Deletes every series of `app`, its index entries and all its buckets.
    fn delete_app(&mut self, app: &str) -> Result<u64, StoreError> {
        let mut batch = sled::Batch::default();
        let mut deleted = 0;
        let prefix = keys::label_prefix(smolder_common::series::NAME_LABEL, Some(app));
        for entry in self.data.scan_prefix(&prefix) {
            let (key, _) = entry?;
            let (_, _, id) = keys::parse_label(&key)?;
            self.delete_series(&mut batch, id)?;
            deleted += 1;
        }
        self.data.apply_batch(batch)?;
        self.series_count -= deleted as i64;
        self.metrics.series.set(self.series_count);
        info!(app, series = deleted, "app deleted");
        Ok(deleted)
    }

    /// Adds the removal of series `id`, everything about it, to `batch`; returns how many
    /// buckets that removes.
    fn delete_series(&self, batch: &mut sled::Batch, id: SeriesId) -> Result<u64, StoreError> {
        let record_key = keys::series(id);
        if let Some(value) = self.data.get(record_key)? {
            let record = SeriesRecord::decode(&record_key, &value)?;
            for (name, value) in record.index_entries() {
                batch.remove(keys::label(name, value, id));
            }
            batch.remove(keys::series_by_key(&record.key));
        }
        batch.remove(&record_key[..]);
        let mut buckets = 0;
        for level in 0..LEVELS.len() {
            for kind in [TREE, TOTAL, DIRTY] {
                for entry in self.data.scan_prefix(keys::bucket_prefix(kind, level, id)) {
                    batch.remove(entry?.0);
                    buckets += u64::from(kind == TREE);
                }
            }
        }
        Ok(buckets)
    }

    /// Deletes buckets that end before the retention cutoff and series left without data; past
    /// `max_disk_bytes`, also the oldest 10 000 s of data.
    fn retention(&mut self, now: SystemTime) -> Result<RetentionReport, StoreError> {
        let started = Instant::now();
        let _span = tracing::info_span!("retention").entered();
        let mut cutoff = unix(now).saturating_sub(self.config.retention.as_secs());
        let disk = self.db.size_on_disk()?;
        let limit = self.config.max_disk_bytes;
        let over_size = limit > 0 && disk > limit;
        let mut records = Vec::new();
        for entry in self.data.scan_prefix([keys::SERIES]) {
            let (key, value) = entry?;
            let id = series_id(&keys::printable(&key), &key[1..])?;
            records.push((id, SeriesRecord::decode(&key, &value)?));
        }
        if over_size {
            let oldest = records
                .iter()
                .map(|(_, r)| r.first_seen)
                .min()
                .unwrap_or(cutoff);
            let coarsest = LEVELS[LEVELS.len() - 1];
            let by_size = (oldest / coarsest + 1) * coarsest;
            warn!(
                disk,
                limit,
                cutoff = by_size,
                "store over its size limit; deleting oldest data"
            );
            cutoff = cutoff.max(by_size);
        }

        let mut report = RetentionReport::default();
        let mut batch = sled::Batch::default();
        for (id, mut record) in records {
            if record.last_seen + BUCKET <= cutoff {
                report.buckets += self.delete_series(&mut batch, id)?;
                report.series += 1;
                continue;
            }
            if record.first_seen >= cutoff {
                continue;
            }
            for (level, size) in LEVELS.iter().enumerate() {
                for kind in [TREE, TOTAL, DIRTY] {
                    for entry in self.data.scan_prefix(keys::bucket_prefix(kind, level, id)) {
                        let (key, _) = entry?;
                        if keys::bucket_start(&key)? + size > cutoff {
                            break;
                        }
                        batch.remove(key);
                        report.buckets += u64::from(kind == TREE);
                    }
                }
            }
            record.first_seen = cutoff / BUCKET * BUCKET;
            batch.insert(&keys::series(id)[..], record.encode());
        }
        // A batch older than the retention is refused at ingest, so its marker has no more
        // duplicates to catch.
        let end = keys::batch_by_time(cutoff, "", 0);
        for entry in self
            .data
            .range([keys::BATCH_BY_TIME].as_slice()..end.as_slice())
        {
            let (key, _) = entry?;
            let (agent, sequence) = keys::parse_batch_by_time(&key)?;
            batch.remove(keys::batch(agent, sequence));
            batch.remove(key);
        }
        self.data.apply_batch(batch)?;
        self.series_count -= report.series as i64;
        self.metrics.series.set(self.series_count);
        self.metrics
            .retention_buckets_deleted
            .inc_by(report.buckets);
        self.metrics
            .retention_duration
            .observe(started.elapsed().as_secs_f64());
        self.metrics
            .disk_bytes
            .set(self.db.size_on_disk().unwrap_or(disk) as i64);
        if report != RetentionReport::default() {
            info!(
                buckets = report.buckets,
                series = report.series,
                cutoff,
                "retention applied"
            );
        }
        Ok(report)
    }
}

impl Writer {
    /// Rebuilds every dirty rollup whose bucket ended at least [`ROLLUP_GRACE`] before `now`,
    /// finest level first, each from its ten children one level down. Returns how many trees
    /// it wrote.
    fn rollup(&mut self, now: SystemTime) -> Result<u64, StoreError> {
        let _span = tracing::debug_span!("rollup").entered();
        let closed_before = unix(now).saturating_sub(ROLLUP_GRACE);
        let mut built = 0;
        for (level, size) in LEVELS.iter().enumerate().skip(1) {
            let child_size = LEVELS[level - 1];
            let mut batch = sled::Batch::default();
            let prefix = [DIRTY, level as u8];
            for entry in self.data.scan_prefix(prefix) {
                let (key, _) = entry?;
                let start = keys::bucket_start(&key)?;
                if start + size > closed_before {
                    continue;
                }
                let id = series_id(&keys::printable(&key), &key[2..10])?;
                let mut tree = Tree::new();
                for child in (start..start + size).step_by(child_size as usize) {
                    tree.merge(&self.load_tree(&keys::bucket(TREE, level - 1, id, child))?);
                }
                let tree_key = keys::bucket(TREE, level, id, start);
                if tree.total() > 0 || !tree.is_empty() {
                    batch.insert(&tree_key[..], keys::seal(&tree.encode()));
                } else {
                    batch.remove(&tree_key[..]);
                }
                batch.remove(key);
                built += 1;
            }
            // Each level is applied before the next reads it as its children.
            self.data.apply_batch(batch)?;
        }
        self.metrics.rollup_trees_written.inc_by(built);
        if built > 0 {
            debug!(built, "rollups rebuilt");
        }
        Ok(built)
    }
}

/// How long after a rollup's bucket ends it is built: late profiles (an agent's window that
/// arrives after a reconnect) usually land within this, so most rollups are built once.
pub(crate) const ROLLUP_GRACE: u64 = 60;

/// The 10 s bucket a profile is stored in: the one holding the middle of its span, so that a
/// profile taken over `[10:00:05, 10:00:15)` is not counted as older than it mostly is.
fn bucket_of(profile: &Profile) -> u64 {
    let (from, until) = (unix(profile.from), unix(profile.until));
    let middle = from + until.saturating_sub(from) / 2;
    middle / BUCKET * BUCKET
}

fn series_id(key: &str, bytes: &[u8]) -> Result<SeriesId, StoreError> {
    bytes
        .try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::Corrupt {
            key: key.to_owned(),
            reason: "series id is not 8 bytes",
        })
}

fn encode_total(total: u64, writes: u64) -> [u8; 16] {
    let mut bytes = [0; 16];
    bytes[..8].copy_from_slice(&total.to_be_bytes());
    bytes[8..].copy_from_slice(&writes.to_be_bytes());
    bytes
}

/// A bucket's total and the number of writes it sums.
pub(crate) fn decode_total(key: &[u8], payload: &[u8]) -> Result<(u64, u64), StoreError> {
    let bytes: [u8; 16] = payload.try_into().map_err(|_| StoreError::Corrupt {
        key: keys::printable(key),
        reason: "bucket total is not 16 bytes",
    })?;
    let total = u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes"));
    let writes = u64::from_be_bytes(bytes[8..].try_into().expect("8 bytes"));
    Ok((total, writes))
}
