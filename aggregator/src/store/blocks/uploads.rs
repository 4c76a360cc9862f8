//! The writer's object-storage half: a group commit made durable by one segment upload, and
//! the bucket's changes (`sync.rs`) applied to the published state.
//!
//! Input: prepared writes from the writer thread (`writer.rs`), which owns the [`Uploads`] of
//! its run, and [`Update`]s from the sync loop. Output: segments in the bucket before any write
//! of their group is acknowledged; blocks, other writers' records and adopted segments in the
//! state reads see; own and adopted segments deleted once blocks hold them. Nothing here runs
//! in local mode.
//!
//! ARCHITECTURE.md, "Object storage and several aggregators", gives the rules this follows.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use smolder_block::Marker;
use tracing::{debug, info, warn};

use super::bucket::Bucket;
use super::deletions::{self, Deletions};
use super::files::{BlockFile, BlockSet, bucket_error};
use super::segment::{Doubtful, Held, Owned, Pending, SegmentKey};
use super::sync::{Sync, Update, unix_millis};
use super::wal::{Record, Wal};
use super::{Shared, plan};
use crate::store::StoreError;
use crate::tenant::Tenant;

/// What object-storage mode adds to the store's shared state.
pub(crate) struct BucketMode {
    pub(crate) bucket: Arc<Bucket>,
    /// This run's writer id: it names this run's segments, heartbeat and HTTP writes' markers.
    pub(crate) writer: String,
    pub(crate) upload_interval: Duration,
    /// How long an upload may take, and how long writes are refused at once after one failed
    /// (`upload-timeout`).
    pub(crate) upload_timeout: Duration,
    pub(crate) poll_interval: Duration,
    /// Whether this aggregator may compact (`store.object-store.compactor`); whether it does
    /// now is the role's (`role.rs`, [`Sync::compacting`]).
    pub(crate) compactor: bool,
    /// Whether it compacts now, as of the last poll.
    pub(crate) compacting: std::sync::atomic::AtomicBool,
    /// How long a block stays hidden before a compactor deletes it (`compaction-grace`).
    pub(crate) grace: Duration,
    /// Own and adopted segments, until blocks hold them. Outlives a writer that panicked, whose
    /// successor reads them back into the head.
    pub(crate) owned: Mutex<Owned>,
    /// This writer's segments whose upload failed but which may have landed (`segment.rs`).
    pub(crate) doubtful: Mutex<Doubtful>,
    /// The sync loop's memory; one poll at a time.
    pub(crate) sync: Mutex<Sync>,
}

/// The group commit being built, for one writer run.
pub(crate) struct Uploads {
    bucket: Arc<Bucket>,
    writer: String,
    interval: Duration,
    timeout: Duration,
    /// This run's next segment number.
    number: u64,
    /// When the last upload started.
    last: Option<Instant>,
    /// When the last upload failed, if the last one did: until `timeout` later, groups are
    /// refused without an upload, since the bucket was out of reach a moment ago.
    failed: Option<(Instant, String)>,
    pending: Pending,
    /// Agent batch markers of the group: (agent, sequence, window end), stored in the marker
    /// index once the segment is.
    markers: Vec<(String, u64, u64)>,
    group: HashSet<(String, u64)>,
}

impl Uploads {
    /// The writer's uploads in `mode`.
    pub(crate) fn new(mode: &BucketMode) -> Uploads {
        Uploads {
            bucket: Arc::clone(&mode.bucket),
            writer: mode.writer.clone(),
            interval: mode.upload_interval,
            timeout: mode.upload_timeout,
            number: 0,
            last: None,
            failed: None,
            pending: Pending::default(),
            markers: Vec::new(),
            group: HashSet::new(),
        }
    }

    /// When the next upload may start, if not at once.
    pub(crate) fn next_upload(&self) -> Option<Instant> {
        let at = self.last? + self.interval;
        (at > Instant::now()).then_some(at)
    }

    /// The bucket, whose runtime the writer waits on.
    pub(crate) fn bucket(&self) -> &Bucket {
        &self.bucket
    }

    /// Whether agent batch (`agent`, `sequence`) is in the group being built.
    pub(crate) fn in_group(&self, agent: &str, sequence: u64) -> bool {
        self.group.contains(&(agent.to_owned(), sequence))
    }

    /// Adds a write's records, and its agent batch's marker (agent, sequence, window end).
    pub(crate) fn push(
        &mut self,
        records: &[(u64, Record, Vec<u8>)],
        marker: Option<(String, u64, u64)>,
    ) {
        for (range, record, frame) in records {
            self.pending.push(*range, record, frame);
        }
        if let Some((agent, sequence, end)) = marker {
            self.group.insert((agent.clone(), sequence));
            self.markers.push((agent, sequence, end));
        }
    }

    /// Makes the group durable: one segment uploaded within `upload-timeout`, then its markers
    /// in the index (and the index, rules and any local log flushed). On failure nothing of
    /// the group is kept; within `upload-timeout` of a failed upload the group is refused
    /// without trying, so that clients hear at once that the bucket is out of reach.
    ///
    /// # Errors
    ///
    /// When the upload or the index fails, or the last upload failed a moment ago
    /// ([`StoreError::Unavailable`]); none of the group's writes may be acknowledged.
    pub(crate) fn upload(&mut self, shared: &Shared, mode: &BucketMode) -> Result<(), StoreError> {
        let (bytes, held) = self.pending.take();
        let markers = std::mem::take(&mut self.markers);
        self.group.clear();
        if let Some((at, reason)) = &self.failed
            && !held.is_empty()
            && at.elapsed() < self.timeout
        {
            shared.metrics.segment_uploads_refused.inc();
            return Err(StoreError::Unavailable {
                reason: format!(
                    "the last segment upload failed {:?} ago: {reason}",
                    at.elapsed()
                ),
            });
        }
        if !held.is_empty() {
            let key = SegmentKey {
                millis: unix_millis(SystemTime::now()),
                writer: self.writer.clone(),
                number: self.number,
            }
            .key();
            self.number += 1;
            self.last = Some(Instant::now());
            let len = bytes.len() as u64;
            let started = Instant::now();
            if let Err(err) = self
                .bucket
                .put_within(&key, Bytes::from(bytes), self.timeout)
            {
                shared.metrics.segment_upload_failures.inc();
                self.failed = Some((Instant::now(), err.to_string()));
                // Given up on, the PUT may still be committed: the sync loop settles it.
                doubt(shared, mode, key);
                return Err(bucket_error(err));
            }
            self.failed = None;
            shared
                .metrics
                .segment_upload_duration
                .observe(started.elapsed().as_secs_f64());
            shared.metrics.segments_uploaded.inc();
            shared.metrics.segment_bytes_uploaded.inc_by(len);
            let mut owned = mode.owned.lock().expect("owned segments lock");
            owned.add(key, held);
            shared.metrics.segments_pending.set(owned.len() as i64);
        }
        index(shared, &markers)
    }
}

/// Stores a group's agent batch markers in the index, and flushes it.
fn index(shared: &Shared, markers: &[(String, u64, u64)]) -> Result<(), StoreError> {
    let mut batch = sled::Batch::default();
    for (agent, sequence, end) in markers {
        Wal::put_batch(&mut batch, agent, *sequence, *end);
    }
    shared.wal.apply(batch)?;
    shared.wal.flush()
}

/// Notes segment `key` as in doubt (`segment.rs`, [`Doubtful`]).
fn doubt(shared: &Shared, mode: &BucketMode, key: String) {
    let mut doubtful = mode.doubtful.lock().expect("doubtful segments lock");
    doubtful.add(key);
    shared.metrics.segments_doubtful.set(doubtful.len() as i64);
}

/// Whether a block of `blocks` covering head range `range` of `tenant` holds `marker`: the
/// restart replay's rule, applied to every copy of a write.
pub(crate) fn in_blocks(blocks: &BlockSet, tenant: &Tenant, range: u64, marker: &Marker) -> bool {
    blocks
        .overlapping(tenant, range, range + plan::HEAD_SPAN)
        .any(|b| {
            b.name.start <= range
                && b.name.end() >= range + plan::HEAD_SPAN
                && b.index.contains_marker(marker)
        })
}

/// What applying a poll changed.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    pub(crate) blocks_added: usize,
    pub(crate) blocks_gone: usize,
    pub(crate) records: usize,
    pub(crate) adopted: usize,
    /// Series that app deletions learnt from the bucket took data from.
    pub(crate) deleted: usize,
}

/// Applies a poll's [`Update`] to the state in one step for reads (called on the writer
/// thread): blocks added and removed, which known blocks show (`lineage.rs`), records that
/// blocks now hold dropped from the remote head, new segments' records added to it (each marker
/// once), adopted writers' records moved into the own head (their markers into the index).
///
/// # Errors
///
/// When the marker index cannot be written.
pub(crate) fn apply_sync(shared: &Shared, update: Update) -> Result<Applied, StoreError> {
    let mut applied = Applied::default();
    let mut batch = sled::Batch::default();
    let mut adopted: Vec<(String, Vec<Held>)> = Vec::new();
    let mut landed: Vec<(String, Vec<Held>)> = Vec::new();
    // The agent batches landed segments put in the own head in this step, whose markers reach
    // the index only at its end.
    let mut landed_batches: HashSet<(Tenant, Marker)> = HashSet::new();
    {
        let mut guard = shared.state_mut();
        let state = &mut *guard;
        let mut set = BlockSet::clone(&state.blocks);
        for block in set.remove(&update.gone) {
            shared.files.forget_cached(&block.name);
            shared.cache.forget(&block.name.id);
            info!(block = %block.name, "block gone from the bucket");
            applied.blocks_gone += 1;
        }
        applied.blocks_added = update.blocks.len();
        let added: Vec<Arc<BlockFile>> = update.blocks;
        for block in &added {
            debug!(block = %block.name, "block found in the bucket");
            set.insert(Arc::clone(block));
        }
        // App deletions, from the bucket and from the new blocks' lists, before any record is
        // added: what they remove never shows.
        let mut learnt = Vec::new();
        let cutoff = plan::retention_cutoff(
            unix_millis(SystemTime::now()) / 1_000,
            shared.config.retention.as_secs(),
        );
        for listed in update.deletions.into_iter().flatten() {
            let expired = Deletions::expired(&set, &listed.tenant, listed.horizon, cutoff);
            if !expired
                && state
                    .deletions
                    .learn(&listed.tenant, &listed.app, listed.horizon)
            {
                learnt.push((listed.tenant, listed.app, listed.horizon));
            }
        }
        for block in &added {
            learnt.extend(state.deletions.learn_block(block));
        }
        applied.deleted = deletions::apply(state, &learnt).len();
        if !added.is_empty() {
            // Copies of writes the new blocks hold, in either head: another aggregator stored
            // and cut them too (rule 3).
            let covers = |tenant: &Tenant, range: u64| {
                added.iter().any(|b| {
                    b.name.tenant == *tenant
                        && b.name.start <= range
                        && b.name.end() >= range + plan::HEAD_SPAN
                })
            };
            let holds = |tenant: &Tenant, range: u64, marker: &Marker| {
                covers(tenant, range)
                    && added.iter().any(|b| {
                        b.name.tenant == *tenant
                            && b.name.start <= range
                            && b.name.end() >= range + plan::HEAD_SPAN
                            && b.index.contains_marker(marker)
                    })
            };
            state.remote.forget(&holds);
            let own = state.head.forget(covers, holds);
            if own > 0 {
                warn!(
                    writes = own,
                    "writes stored here that a block of another aggregator holds too (accepted by both); counted once"
                );
                shared
                    .metrics
                    .duplicate_batches
                    .with_label_values(&["head"])
                    .inc_by(own as u64);
            }
        }
        // This writer's segments that landed after their upload failed: their writes were
        // refused, so a retry may have stored an agent batch again since (then the copy here
        // is dropped); the rest is this writer's own from now on, cut and settled like it.
        for (key, records) in update.landed {
            let mut held = Vec::new();
            for (range, record) in &records {
                if let Some(end) = record.window_end {
                    let marker = &record.marker;
                    let stored = in_blocks(&set, &record.tenant, *range, marker)
                        || state.remote.holds(&record.tenant, marker)
                        || !landed_batches.insert((record.tenant.clone(), marker.clone()))
                        || shared
                            .wal
                            .has_batch(&marker.agent_id, marker.sequence)
                            .unwrap_or(false);
                    if stored {
                        continue;
                    }
                    Wal::put_batch(&mut batch, &marker.agent_id, marker.sequence, end);
                }
                state
                    .head
                    .add(*range, record, shared.config.max_spans_per_bucket);
                held.push(Held::of(*range, record));
            }
            warn!(segment = %key.key(), records = held.len(), "a segment whose upload failed reached the bucket after all; its writes are kept (a client that retried a refused push may have stored it twice)");
            shared.metrics.segments_landed_late.inc();
            if let Some(mode) = &shared.bucket {
                let mut doubtful = mode.doubtful.lock().expect("doubtful segments lock");
                doubtful.remove(&key.key());
                shared.metrics.segments_doubtful.set(doubtful.len() as i64);
            }
            landed.push((key.key(), held));
        }
        let wal = &shared.wal;
        for (key, records) in update.segments {
            let deletions = &state.deletions;
            let added = state
                .remote
                .add(&key, records, deletions, |tenant, range, marker| {
                    if in_blocks(&set, tenant, range, marker) {
                        Some(true)
                    } else if landed_batches.contains(&(tenant.clone(), marker.clone()))
                        || wal
                            .has_batch(&marker.agent_id, marker.sequence)
                            .unwrap_or(false)
                    {
                        Some(false)
                    } else {
                        None
                    }
                });
            applied.records += added.records;
            if added.duplicates > 0 {
                warn!(segment = %key.key(), copies = added.duplicates, "batches another aggregator stored too (accepted by both within one upload interval); counted once");
                shared
                    .metrics
                    .duplicate_batches
                    .with_label_values(&["segment"])
                    .inc_by(added.duplicates as u64);
            }
        }
        if let Some(listed) = &update.listed {
            state.remote.retain_listed(listed);
        }
        for (key, records, held) in state.remote.take(&update.adopt) {
            for (range, record) in &records {
                // Their spans were counted by the writer that accepted them.
                state
                    .head
                    .add(*range, record, shared.config.max_spans_per_bucket);
                if let Some(end) = record.window_end {
                    Wal::put_batch(
                        &mut batch,
                        &record.marker.agent_id,
                        record.marker.sequence,
                        end,
                    );
                }
            }
            adopted.push((key, held));
        }
        applied.adopted = adopted.len();
        shared.dedupe(&mut set);
        state.deletions.mark(&mut set);
        state.blocks = Arc::new(set);
        shared
            .metrics
            .app_deletions
            .set(state.deletions.len() as i64);
        let (segments, _) = state.remote.counts();
        shared.metrics.remote_segments.set(segments as i64);
        shared
            .metrics
            .remote_head_series
            .set(state.remote.head.series_count() as i64);
        state.head.observe(&shared.metrics);
        shared.update_block_gauges(&state.blocks);
    }
    // Owned before the markers are stored: a failure there leaves no segment unowned.
    if let Some(mode) = &shared.bucket {
        let mut owned = mode.owned.lock().expect("owned segments lock");
        for (key, held) in adopted {
            owned.add(key, held);
            shared.metrics.adopted_segments.inc();
        }
        for (key, held) in landed {
            owned.add(key, held);
        }
    }
    shared.wal.apply(batch)?;
    Ok(applied)
}

/// Deletes the own and adopted segments whose every record a block holds (or app deletions
/// removed, or retention has passed), as of the published blocks.
pub(crate) fn settle(shared: &Shared, now: u64) {
    let Some(mode) = &shared.bucket else {
        return;
    };
    let (blocks, deletions) = {
        let state = shared.state();
        (Arc::clone(&state.blocks), state.deletions.clone())
    };
    let cutoff = plan::retention_cutoff(now, shared.config.retention.as_secs());
    let done = mode
        .owned
        .lock()
        .expect("owned segments lock")
        .settle(|held| {
            held.range + plan::HEAD_SPAN <= cutoff
                || in_blocks(&blocks, &held.tenant, held.range, &held.marker)
                || deletions.removes_all(&held.tenant, &held.apps)
        });
    for key in done {
        match mode.bucket.delete(&key) {
            Ok(()) => shared.metrics.segments_deleted.inc(),
            Err(err) => {
                warn!(segment = %key, error = %err, "deleting a segment blocks hold failed; trying again later");
                mode.owned.lock().expect("owned segments lock").retry(key);
            }
        }
    }
    shared
        .metrics
        .segments_pending
        .set(mode.owned.lock().expect("owned segments lock").len() as i64);
}

/// The records of the own and adopted segments, read back from the bucket for a writer that
/// starts again after a panic (its head in memory is rebuilt from them).
///
/// # Errors
///
/// When a segment cannot be read.
pub(crate) fn owned_records(shared: &Shared) -> Result<Vec<(u64, Record)>, StoreError> {
    let Some(mode) = &shared.bucket else {
        return Ok(Vec::new());
    };
    let keys = mode.owned.lock().expect("owned segments lock").keys();
    let mut records = Vec::new();
    for key in keys {
        let bytes = match mode.bucket.get(&key) {
            Ok(bytes) => bytes,
            Err(err) if err.not_found() => continue,
            Err(err) => return Err(bucket_error(err)),
        };
        let decoded = super::segment::decode(&bytes).map_err(|reason| StoreError::Engine {
            source: format!("segment {key}: {reason}").into(),
        })?;
        records.extend(decoded);
    }
    Ok(records)
}
