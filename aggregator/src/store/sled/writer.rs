//! The writer thread: every change to the sled store goes through it, in order.
//!
//! Writes read-modify-write bucket trees, so two at once could lose one's update; one writer
//! makes "concurrent ingests sum exactly" a property of the design rather than of locking. It
//! takes every request waiting in the queue, applies each as one atomic sled batch, then makes
//! the whole group durable with a single fsync before answering any of them. Profiles, app
//! deletions, recording rules, rollups and retention all take this one path.
//!
//! What to change is decided by `plan.rs` (which buckets a write touches, which rollups are
//! due, what retention deletes); this file reads what is stored and applies the plan.
//!
//! A write updates its 10 s bucket's tree and the totals of every level, and marks the coarser
//! buckets containing it dirty (`D` keys). Rewriting the large rollup trees on every write made
//! sled write 3x the ingested bytes and hold 245 B per stored node
//! (`benches/ingest_http_to_query.rs`); instead [`Command::Rollup`] rebuilds each closed dirty
//! rollup once from its ten children, bottom-up, and reads descend into the children of a
//! rollup that is still dirty.

use std::time::{Instant, SystemTime};

use smolder_common::{Profile, Tree};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info, warn};

use super::RetentionReport;
use super::keys::{self, DIRTY, SeriesId, TOTAL, TREE};
use super::series::SeriesRecord;
use crate::store::plan::{self, LEVELS, SeriesRetention, WritePlan};
use crate::store::{BatchMarker, StoreConfig, StoreError, StoreMetrics, Written, unix};

/// Requests the writer serves, each answered once the group it is applied in is durable.
pub(crate) enum Command {
    /// Store profiles, with an agent batch's marker.
    Write {
        profiles: Vec<Profile>,
        marker: Option<BatchMarker>,
        reply: oneshot::Sender<Result<Written, StoreError>>,
        queued: Instant,
    },
    /// Delete an app's series.
    DeleteApp {
        app: String,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
    /// Store a recording rule.
    PutRule {
        name: String,
        rule: Vec<u8>,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    /// Delete a recording rule.
    DeleteRule {
        name: String,
        reply: oneshot::Sender<Result<bool, StoreError>>,
    },
    /// Apply retention as of `now`.
    Retention {
        now: SystemTime,
        reply: oneshot::Sender<Result<RetentionReport, StoreError>>,
    },
    /// Rebuild the rollups due as of `now`.
    Rollup {
        now: SystemTime,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
    /// Flush and stop.
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
    Write {
        reply: oneshot::Sender<Result<Written, StoreError>>,
        queued: Instant,
        profiles: usize,
        written: Written,
    },
    Count(oneshot::Sender<Result<u64, StoreError>>, u64),
    Done(oneshot::Sender<Result<(), StoreError>>),
    Existed(oneshot::Sender<Result<bool, StoreError>>, bool),
    Retention(
        oneshot::Sender<Result<RetentionReport, StoreError>>,
        RetentionReport,
    ),
}

/// Holds `result`'s value back for the group's flush, or answers its error at once.
fn defer<T>(
    pending: &mut Vec<Pending>,
    reply: oneshot::Sender<Result<T, StoreError>>,
    result: Result<T, StoreError>,
    pend: impl FnOnce(oneshot::Sender<Result<T, StoreError>>, T) -> Pending,
) {
    match result {
        Ok(value) => pending.push(pend(reply, value)),
        Err(err) => {
            let _ = reply.send(Err(err));
        }
    }
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
                self.apply(command, &mut pending, &mut close);
            }
            let flushed = self.flush();
            self.answer(pending, &flushed);
            if let Some(reply) = close {
                let _ = reply.send(flushed.map_err(StoreError::from));
                info!("store closed");
                return;
            }
        }
        if let Err(err) = self.db.flush() {
            error!(error = %err, "final flush failed");
        }
    }

    /// Applies one command; its answer waits in `pending` for the group's flush.
    fn apply(
        &mut self,
        command: Command,
        pending: &mut Vec<Pending>,
        close: &mut Option<oneshot::Sender<Result<(), StoreError>>>,
    ) {
        match command {
            Command::Write {
                profiles,
                marker,
                reply,
                queued,
            } => {
                let result = self.write(&profiles, marker.as_ref());
                defer(pending, reply, result, |reply, written| Pending::Write {
                    reply,
                    queued,
                    profiles: if written == Written::Stored {
                        profiles.len()
                    } else {
                        0
                    },
                    written,
                });
            }
            Command::DeleteApp { app, reply } => {
                let result = self.delete_app(&app);
                defer(pending, reply, result, Pending::Count);
            }
            Command::PutRule { name, rule, reply } => {
                let result = self
                    .data
                    .insert(keys::rule(&name), keys::seal(&rule))
                    .map(|_| ())
                    .map_err(StoreError::from);
                defer(pending, reply, result, |reply, ()| Pending::Done(reply));
            }
            Command::DeleteRule { name, reply } => {
                let result = self
                    .data
                    .remove(keys::rule(&name))
                    .map(|old| old.is_some())
                    .map_err(StoreError::from);
                defer(pending, reply, result, Pending::Existed);
            }
            Command::Retention { now, reply } => {
                let result = self.retention(now);
                defer(pending, reply, result, Pending::Retention);
            }
            Command::Rollup { now, reply } => {
                let result = self.rollup(now);
                defer(pending, reply, result, Pending::Count);
            }
            Command::Close { reply } => *close = Some(reply),
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
        fn settle<T>(
            reply: oneshot::Sender<Result<T, StoreError>>,
            value: T,
            flushed: &Result<(), sled::Error>,
        ) {
            let answer = match flushed {
                Ok(()) => Ok(value),
                Err(err) => Err(StoreError::Flush {
                    reason: err.to_string(),
                }),
            };
            let _ = reply.send(answer);
        }
        for item in pending {
            match item {
                Pending::Write {
                    reply,
                    queued,
                    profiles,
                    written,
                } => {
                    if flushed.is_ok() {
                        self.metrics.profiles_written.inc_by(profiles as u64);
                        self.metrics
                            .write_duration
                            .observe(queued.elapsed().as_secs_f64());
                    }
                    settle(reply, written, flushed);
                }
                Pending::Count(reply, count) => settle(reply, count, flushed),
                Pending::Done(reply) => settle(reply, (), flushed),
                Pending::Existed(reply, existed) => settle(reply, existed, flushed),
                Pending::Retention(reply, report) => settle(reply, report, flushed),
            }
        }
    }

    /// Applies one write request, as [`WritePlan`] plans it, as one atomic batch: series
    /// records and index entries for new series, and for each profile its 10 s bucket's tree,
    /// the totals of every level, and a dirty mark on each rollup above it. With a `marker`, a
    /// batch whose marker is stored already is skipped (the writer is the only one that writes
    /// markers, so checking first is race-free), and the marker goes into the same atomic batch
    /// as the trees.
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
        let plan = WritePlan::new(profiles);
        let mut next_series = self.next_series;
        let mut created = 0;
        for write in &plan.series {
            let (id, record, new) = self.series_record(write, profiles, &mut next_series)?;
            for (&bucket, members) in &write.trees {
                let key = keys::bucket(TREE, 0, id, bucket);
                let mut tree = self.load_tree(&key)?;
                for &i in members {
                    tree.merge(&profiles[i].tree);
                }
                batch.insert(&key[..], keys::seal(&tree.encode()));
            }
            for (&(level, start), &(total, writes)) in &write.totals {
                let key = keys::bucket(TOTAL, level, id, start);
                let (stored, stored_writes) = self.load_total(&key)?;
                let sum = encode_total(stored.saturating_add(total), stored_writes + writes);
                batch.insert(&key[..], keys::seal(&sum));
            }
            for &(level, start) in &write.dirty {
                batch.insert(&keys::bucket(DIRTY, level, id, start)[..], &[][..]);
            }
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

    /// The record of a series the write names, updated with the metadata and buckets of its
    /// profiles in request order: loaded when the series exists, else new with the next id.
    /// Returns its id, the record and whether it is new.
    fn series_record(
        &self,
        write: &plan::SeriesWrite,
        profiles: &[Profile],
        next_series: &mut SeriesId,
    ) -> Result<(SeriesId, SeriesRecord, bool), StoreError> {
        let index_key = keys::series_by_key(&write.key);
        let (id, mut record, new) = match self.data.get(&index_key)? {
            Some(value) => {
                let id = series_id(&write.key, keys::open(&index_key, &value)?)?;
                let record_key = keys::series(id);
                let value = self
                    .data
                    .get(record_key)?
                    .ok_or_else(|| StoreError::Corrupt {
                        key: keys::printable(&record_key),
                        reason: "indexed series has no record",
                    })?;
                (id, SeriesRecord::decode(&record_key, &value)?, false)
            }
            None => {
                let (first, bucket) = write.profiles[0];
                let first = &profiles[first];
                let id = *next_series;
                *next_series += 1;
                (
                    id,
                    SeriesRecord::new(&first.series, &first.meta, bucket),
                    true,
                )
            }
        };
        for &(i, bucket) in &write.profiles {
            record.update(&profiles[i].meta, bucket);
        }
        Ok((id, record, new))
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

    /// Deletes what [`plan::series_retention`] says of every series, as of the cutoff
    /// [`plan::retention_cutoff`] sets, and the batch markers of windows before it.
    fn retention(&mut self, now: SystemTime) -> Result<RetentionReport, StoreError> {
        let started = Instant::now();
        let _span = tracing::info_span!("retention").entered();
        let disk = self.db.size_on_disk()?;
        let limit = self.config.max_disk_bytes;
        let over_size = limit > 0 && disk > limit;
        let mut records = Vec::new();
        for entry in self.data.scan_prefix([keys::SERIES]) {
            let (key, value) = entry?;
            let id = series_id(&keys::printable(&key), &key[1..])?;
            records.push((id, SeriesRecord::decode(&key, &value)?));
        }
        let oldest = records.iter().map(|(_, r)| r.first_seen).min();
        let cutoff = plan::retention_cutoff(
            unix(now),
            self.config.retention.as_secs(),
            over_size,
            oldest,
        );
        if over_size {
            warn!(
                disk,
                limit, cutoff, "store over its size limit; deleting oldest data"
            );
        }

        let mut report = RetentionReport::default();
        let mut batch = sled::Batch::default();
        for (id, mut record) in records {
            match plan::series_retention(record.first_seen, record.last_seen, cutoff) {
                SeriesRetention::Keep => {}
                SeriesRetention::Delete => {
                    report.buckets += self.delete_series(&mut batch, id)?;
                    report.series += 1;
                }
                SeriesRetention::Trim { first_seen } => {
                    for level in 0..LEVELS.len() {
                        for kind in [TREE, TOTAL, DIRTY] {
                            let prefix = keys::bucket_prefix(kind, level, id);
                            for entry in self.data.scan_prefix(prefix) {
                                let (key, _) = entry?;
                                let start = keys::bucket_start(&key)?;
                                if !plan::bucket_expired(level, start, cutoff) {
                                    break;
                                }
                                batch.remove(key);
                                report.buckets += u64::from(kind == TREE);
                            }
                        }
                    }
                    record.first_seen = first_seen;
                    batch.insert(&keys::series(id)[..], record.encode());
                }
            }
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

    /// Rebuilds every dirty rollup that [`plan::rollup_due`] as of `now`, finest level first,
    /// each from its ten children one level down. Returns how many trees it wrote.
    fn rollup(&mut self, now: SystemTime) -> Result<u64, StoreError> {
        let _span = tracing::debug_span!("rollup").entered();
        let now = unix(now);
        let mut built = 0;
        for level in 1..LEVELS.len() {
            let mut batch = sled::Batch::default();
            for entry in self.data.scan_prefix([DIRTY, level as u8]) {
                let (key, _) = entry?;
                let start = keys::bucket_start(&key)?;
                if !plan::rollup_due(level, start, now) {
                    continue;
                }
                let id = series_id(&keys::printable(&key), &key[2..10])?;
                let mut tree = Tree::new();
                for (child_level, child) in plan::children(level, start) {
                    tree.merge(&self.load_tree(&keys::bucket(TREE, child_level, id, child))?);
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
