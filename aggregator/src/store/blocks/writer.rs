//! The writer thread: every change to the block store goes through it, in order.
//!
//! It takes every request waiting in the queue, applies each to the head (`wal.rs`), makes the
//! whole group durable with one fsync, then adds the group's writes to the head in memory and
//! answers (group commit). A write arrives [`Prepared`]: numbered, split by head range and
//! framed for the logs by its caller, so that concurrent writes encode and compress in parallel
//! and the writer only appends. A cut's sealing of head ranges and publication of their blocks
//! (built in between off this thread, `cut.rs`), app deletions, rules, retention and the
//! publication of a compaction take the same path, so that none of them races another: a cut
//! never loses a write that arrived while it ran, and a deletion never misses a block being
//! published. Nothing here waits for the bucket but the segment upload, bounded by
//! `upload-timeout`: an app deletion's object is written before the writer learns it, and the
//! bucket's old deletions are deleted by the retention task (`deletions.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime};

use smolder_block::{HeadProfile, Marker};
use smolder_common::{Profile, SpanTrees};
use smolder_daemon::Heartbeat;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info, warn};

use super::deletions;
use super::files::{BlockFile, BlockSet};
use super::head::{Head, SealedRange, SpansAdded};
use super::sync::Update;
use super::uploads::{self, Applied, Uploads, in_blocks};
use super::wal::{Record, Wal};
use super::{RetentionReport, Shared, block_plans, plan};
use crate::store::{BatchMarker, ProfileSpans, StoreError, Written, unix};
use crate::tenant::Tenant;

/// Requests the writer serves, each answered once what it changed is durable.
pub(crate) enum Command {
    /// Store profiles, with an agent batch's marker.
    Write {
        write: Prepared,
        marker: Option<BatchMarker>,
        reply: oneshot::Sender<Result<Written, StoreError>>,
        queued: Instant,
    },
    /// Delete an app's data before the horizon of `now` (`deletions.rs`; local mode).
    DeleteApp {
        tenant: Tenant,
        app: String,
        now: SystemTime,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
    /// Learn and apply the deletion of an app with `horizon`, stored in the bucket already
    /// (object-storage mode, `deletions::store`); `series` is how many it takes data from here.
    LearnDeletion {
        tenant: Tenant,
        app: String,
        horizon: u64,
        series: u64,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    /// Store a recording rule (local mode).
    PutRule {
        tenant: Tenant,
        name: String,
        rule: Vec<u8>,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    /// Delete a recording rule (local mode).
    DeleteRule {
        tenant: Tenant,
        name: String,
        reply: oneshot::Sender<Result<bool, StoreError>>,
    },
    /// Seal the head ranges closed as of `now` for a cut; answers every sealed range.
    Seal {
        now: SystemTime,
        reply: oneshot::Sender<Result<Vec<SealedRange>, StoreError>>,
    },
    /// Publish the blocks cut from the sealed ranges starting at `start` (written durably)
    /// and remove their writes from the head; answers how many blocks.
    PublishCut {
        start: u64,
        blocks: Vec<Arc<BlockFile>>,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
    /// Apply retention as of `now`: to the batch markers, and to the blocks when `blocks`;
    /// answers with the blocks taken out of the published set, whose files the caller deletes
    /// (off this thread: in a bucket they are requests).
    Retention {
        now: SystemTime,
        blocks: bool,
        reply: oneshot::Sender<Result<Retained, StoreError>>,
    },
    /// Forget the app deletions that remove nothing any more as of retention's `cutoff`, once
    /// the blocks retention took out are deleted.
    ForgetDeletions {
        cutoff: u64,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    /// Publish a merged block in place of its inputs; answers whether it was (not when an
    /// input is gone or an app was deleted since the merge was planned).
    Publish {
        output: Arc<BlockFile>,
        inputs: BTreeSet<String>,
        generation: u64,
        reply: oneshot::Sender<Result<bool, StoreError>>,
    },
    /// Apply what a poll of the bucket found (object-storage mode, `sync.rs`).
    Sync {
        update: Update,
        reply: oneshot::Sender<Result<Applied, StoreError>>,
    },
    /// Flush and stop.
    Close {
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
}

/// What the writer's part of a retention pass did, and the blocks it took out of the published
/// set, for the caller to delete.
pub(crate) type Retained = (RetentionReport, Vec<Arc<BlockFile>>);

/// How many queued requests one fsync may cover.
const GROUP: usize = 64;

/// How many queued requests one segment upload may cover: under load, an upload interval's
/// writes.
const UPLOAD_GROUP: usize = 1024;

/// The marker agent id of the aggregator's own writes (HTTP pushes): no agent can send it,
/// since agent ids are printable ASCII.
const HTTP_AGENT: &str = "\u{b7}http\u{b7}";

/// The marker agent id of `agent_id`'s batches for `tenant`: the agent id as it is for the
/// anonymous tenant (as before tenants, so that markers written then still match), and
/// `<agent id> <tenant>` for another. Agent ids and tenant ids hold no space, so that agents of
/// two tenants never share a marker: an agent cannot have another tenant's batches taken for
/// retries of its own by sending their agent id and sequence numbers.
pub(crate) fn batch_agent(tenant: &Tenant, agent_id: &str) -> String {
    if tenant.as_str() == crate::tenant::ANONYMOUS {
        agent_id.to_owned()
    } else {
        format!("{agent_id} {tenant}")
    }
}

/// The writer's state, owned by its thread.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    ids: Arc<WriteIds>,
    /// One past the highest write number applied or replayed, as stored with each group.
    next_write: u64,
    /// Object-storage mode: the group commit's segment.
    uploads: Option<Uploads>,
}

/// What callers need to prepare a write: its number and the marker of HTTP writes.
pub(crate) struct WriteIds {
    /// The marker agent id of this aggregator's HTTP writes.
    http_agent: String,
    /// The next write's number. Given out before the writer applies the write, so numbers
    /// reach the logs out of order and a write given up before it was sent leaves a gap; both
    /// are harmless: a number only has to be unique (it is an HTTP write's marker), and replay
    /// orders a range's records by it.
    next: AtomicU64,
}

/// A write the writer appended: the profiles it holds and its records by head range, for the
/// head in memory once the group is durable.
type Appended = (usize, Vec<(u64, Record)>);

/// One write, numbered, split by head range and each range's record framed for its log.
pub(crate) struct Prepared {
    write: u64,
    /// Whose write it is.
    tenant: Tenant,
    /// The agent id of its marker: an agent batch's as [`batch_agent`] gives it, or this
    /// aggregator's for an HTTP write.
    batch_agent: String,
    /// Profiles the write holds.
    profiles: usize,
    /// Per head range: its record and the record's frame.
    records: Vec<(u64, Record, Vec<u8>)>,
}

impl Prepared {
    /// Numbers `profiles` of `tenant` (with the span trees of those in `spans`), splits them
    /// by head range and frames each range's record (the tree encoding and lz4 of
    /// [`Record::frame`], the costly part of a write).
    pub(crate) fn new(
        ids: &WriteIds,
        tenant: Tenant,
        profiles: Vec<Profile>,
        spans: ProfileSpans,
        marker: Option<&BatchMarker>,
    ) -> Prepared {
        let write = ids.next.fetch_add(1, Ordering::Relaxed);
        let window_end = marker.map(|m| m.window_end);
        let marker = match marker {
            Some(m) => Marker {
                agent_id: batch_agent(&tenant, &m.agent_id),
                sequence: m.sequence,
            },
            None => Marker {
                agent_id: ids.http_agent.clone(),
                sequence: write,
            },
        };
        let agent = marker.agent_id.clone();
        let count = profiles.len();
        let mut spans: BTreeMap<usize, SpanTrees> = spans.into_iter().collect();
        let mut ranges: BTreeMap<u64, Vec<HeadProfile>> = BTreeMap::new();
        for (i, profile) in profiles.into_iter().enumerate() {
            let bucket = plan::bucket_of(unix(profile.from), unix(profile.until));
            ranges
                .entry(plan::head_range(bucket))
                .or_default()
                .push(HeadProfile {
                    bucket,
                    profile,
                    spans: spans.remove(&i).unwrap_or_default(),
                });
        }
        let records = ranges
            .into_iter()
            .map(|(range, profiles)| {
                let record = Record {
                    tenant: tenant.clone(),
                    marker: marker.clone(),
                    window_end,
                    write,
                    profiles,
                };
                let frame = record.frame();
                (range, record, frame)
            })
            .collect();
        Prepared {
            write,
            tenant,
            batch_agent: agent,
            profiles: count,
            records,
        }
    }
}

/// An answer held back until the group it belongs to is durable.
enum Pending {
    Write {
        reply: oneshot::Sender<Result<Written, StoreError>>,
        queued: Instant,
        profiles: usize,
        written: Written,
        records: Vec<(u64, Record)>,
    },
    Count(oneshot::Sender<Result<u64, StoreError>>, u64),
    Done(oneshot::Sender<Result<(), StoreError>>),
    Existed(oneshot::Sender<Result<bool, StoreError>>, bool),
}

impl Writer {
    /// The writer over `shared`, replaying the head from its database.
    pub(crate) fn open(shared: Arc<Shared>) -> Result<Writer, StoreError> {
        Writer::replay(shared, None)
    }

    /// A writer again over `shared` and the callers' `ids`, after the last one panicked: the
    /// head in memory is rebuilt from its logs (a panic may have left it without a write that
    /// is durable, or half-changed). A cut in flight then finds its range no longer sealed and
    /// is refused ([`Writer::publish_cut`]).
    ///
    /// # Errors
    ///
    /// As [`Writer::open`].
    pub(crate) fn reopen(shared: Arc<Shared>, ids: Arc<WriteIds>) -> Result<Writer, StoreError> {
        Writer::replay(shared, Some(ids))
    }

    /// Replays the head from the database into an empty head; `ids` are the callers' when a
    /// writer is reopened.
    fn replay(shared: Arc<Shared>, ids: Option<Arc<WriteIds>>) -> Result<Writer, StoreError> {
        let wal = &shared.wal;
        let stored = match &shared.bucket {
            Some(mode) => Some(mode.writer.clone()),
            None => wal
                .meta("aggregator_id")?
                .map(|id| String::from_utf8_lossy(&id).into_owned()),
        };
        let id = match stored {
            Some(id) => id,
            None => {
                let id = format!("{:016x}", rand::random::<u64>());
                let mut batch = sled::Batch::default();
                Wal::set_meta(&mut batch, "aggregator_id", id.as_bytes());
                wal.apply(batch)?;
                wal.flush()?;
                id
            }
        };
        let mut next_write = match wal.meta("next_write")? {
            Some(bytes) => u64::from_be_bytes(bytes.as_slice().try_into().map_err(|_| {
                StoreError::Corrupt {
                    key: "Mnext_write".into(),
                    reason: "not 8 bytes",
                }
            })?),
            None => 1,
        };
        let mut writer = Writer {
            shared,
            ids: ids.unwrap_or_else(|| {
                Arc::new(WriteIds {
                    http_agent: format!("{HTTP_AGENT}{id}"),
                    next: AtomicU64::new(0),
                })
            }),
            next_write: 0,
            uploads: None,
        };
        writer.uploads = writer.shared.bucket.as_ref().map(Uploads::new);
        // Replay: a record whose marker a block of its range holds was cut before a crash.
        let cutoff = plan::retention_cutoff(unix(SystemTime::now()), writer.retention());
        let mut batch = sled::Batch::default();
        let (mut replayed, mut dropped) = (0, 0);
        // Object-storage mode: the own and adopted segments are the head's log (a writer that
        // panicked left them; at open there are none yet).
        let segments = uploads::owned_records(&writer.shared)?;
        {
            let mut state = writer.shared.state_mut();
            state.head = Head::default();
            let blocks = Arc::clone(&state.blocks);
            // One log file at a time, one record at a time: a head of hundreds of MiB is never
            // decoded whole. A file that held records a block holds is rewritten without them.
            for (range, path) in writer.shared.wal.log_files()? {
                writer.shared.wal.scan(range, &path, |record| {
                    next_write = next_write.max(record.write + 1);
                    if let Some(end) = record.window_end
                        && !writer
                            .shared
                            .wal
                            .has_batch(&record.marker.agent_id, record.marker.sequence)?
                    {
                        // The record was durable, its marker not yet: a crash between the two.
                        Wal::put_batch(
                            &mut batch,
                            &record.marker.agent_id,
                            record.marker.sequence,
                            end,
                        );
                    }
                    let cut = in_blocks(&blocks, &record.tenant, range, &record.marker);
                    if cut || range + plan::HEAD_SPAN <= cutoff {
                        dropped += 1;
                        return Ok(false);
                    }
                    // Replayed spans were counted when first written. An app deleted since the
                    // record was written leaves out its profiles before the horizon.
                    let mut record = record;
                    state.deletions.filter(&mut record);
                    state
                        .head
                        .add(range, &record, writer.shared.config.max_spans_per_bucket);
                    replayed += 1;
                    Ok(true)
                })?;
            }
            for (range, mut record) in segments {
                next_write = next_write.max(record.write + 1);
                let cut = in_blocks(&blocks, &record.tenant, range, &record.marker);
                if cut || range + plan::HEAD_SPAN <= cutoff {
                    dropped += 1;
                } else {
                    state.deletions.filter(&mut record);
                    state
                        .head
                        .add(range, &record, writer.shared.config.max_spans_per_bucket);
                    replayed += 1;
                }
            }
            state.head.observe(&writer.shared.metrics);
        }
        // A replayed record's number may be newer than the stored counter (a kill between the
        // log's sync and the database's); once its range is cut, only the counter remembers it,
        // and a number given out twice is a marker that replay and compaction take for a retry.
        Wal::set_meta(&mut batch, "next_write", &next_write.to_be_bytes());
        writer.shared.wal.apply(batch)?;
        writer.shared.wal.flush()?;
        writer.next_write = next_write;
        // After a panic, callers may hold numbers past the log's: never give one out again.
        writer.ids.next.fetch_max(next_write, Ordering::Relaxed);
        info!(replayed, dropped, "head replayed");
        Ok(writer)
    }

    /// What callers need to prepare writes for this writer.
    pub(crate) fn ids(&self) -> Arc<WriteIds> {
        Arc::clone(&self.ids)
    }

    fn retention(&self) -> u64 {
        self.shared.config.retention.as_secs()
    }

    /// Serves commands until `Close` or until every sender is gone, beating `beat` after each
    /// group (the cut task sends a command every 10 s, so an idle writer beats too).
    pub(crate) fn run(mut self, queue: &mut mpsc::Receiver<Command>, beat: &Heartbeat) {
        let _span = tracing::info_span!("store_writer").entered();
        beat.beat();
        while let Some(first) = queue.blocking_recv() {
            let mut group = vec![first];
            let cap = if self.uploads.is_some() {
                UPLOAD_GROUP
            } else {
                GROUP
            };
            while group.len() < cap {
                match queue.try_recv() {
                    Ok(command) => group.push(command),
                    Err(_) => break,
                }
            }
            if let Some(uploads) = &self.uploads
                && let Some(at) = uploads.next_upload()
                && group.iter().any(|c| matches!(c, Command::Write { .. }))
            {
                // At most one upload per interval: what arrives meanwhile shares it.
                let until = tokio::time::Instant::from_std(at);
                uploads.bucket().block_on(async {
                    while group.len() < cap {
                        match tokio::time::timeout_at(until, queue.recv()).await {
                            Ok(Some(command)) => group.push(command),
                            Ok(None) | Err(_) => break,
                        }
                    }
                });
            }
            self.refresh_before_checks(&group);
            let mut pending = Vec::with_capacity(group.len());
            let mut close = None;
            for command in group {
                // A cut, deletion, retention pass or publication works on the head as the
                // acknowledged writes left it: the group's writes so far are made durable and
                // added to the head first, or a cut would delete a range's log with a write in
                // it that its block does not hold.
                // Rules come here in local mode only (in a bucket they are objects of their
                // own, `rules.rs`), made durable with the writes.
                let writes = matches!(
                    command,
                    Command::Write { .. } | Command::PutRule { .. } | Command::DeleteRule { .. }
                );
                if !writes && !pending.is_empty() {
                    let flushed = self.flush();
                    self.answer(std::mem::take(&mut pending), &flushed);
                }
                self.apply(command, &mut pending, &mut close);
            }
            let flushed = self.flush();
            self.answer(pending, &flushed);
            match &flushed {
                // The bucket refuses or does not answer: writes are refused (retryable) until
                // it does; the writer itself is fine.
                Err(err) if self.uploads.is_some() => {
                    beat.degraded(format!("uploading a segment: {err}"));
                }
                _ => beat.beat(),
            }
            if let Some(reply) = close {
                let _ = reply.send(flushed.map_err(|err| StoreError::Flush {
                    reason: err.to_string(),
                }));
                info!("store closed");
                return;
            }
        }
        if let Err(err) = self.shared.wal.flush() {
            error!(error = %err, "final flush failed");
        }
    }

    fn apply(
        &mut self,
        command: Command,
        pending: &mut Vec<Pending>,
        close: &mut Option<oneshot::Sender<Result<(), StoreError>>>,
    ) {
        match command {
            Command::Write {
                write,
                marker,
                reply,
                queued,
            } => {
                if let Some(busy) = self.head_full() {
                    self.shared.metrics.head_full_refusals.inc();
                    let _ = reply.send(Err(busy));
                    return;
                }
                let result = self.write(write, marker.as_ref());
                // The test-only fault hook (`smolder_daemon::fault`), where a restart is hardest:
                // the write is in the head's log, neither durable nor acknowledged nor in the
                // head in memory.
                if smolder_daemon::fault::fire("store-writer-panic") {
                    panic!("injected fault store-writer-panic (SMOLDER_FAULTS)");
                }
                match result {
                    Ok((written, (profiles, records))) => pending.push(Pending::Write {
                        reply,
                        queued,
                        profiles,
                        written,
                        records,
                    }),
                    Err(err) => {
                        let _ = reply.send(Err(err));
                    }
                }
            }
            Command::DeleteApp {
                tenant,
                app,
                now,
                reply,
            } => match self.delete_app(&tenant, &app, now) {
                Ok(count) => pending.push(Pending::Count(reply, count)),
                Err(err) => {
                    let _ = reply.send(Err(err));
                }
            },
            Command::LearnDeletion {
                tenant,
                app,
                horizon,
                series,
                reply,
            } => {
                self.learn_deletion(&tenant, &app, horizon, series);
                let _ = reply.send(Ok(()));
            }
            Command::PutRule {
                tenant,
                name,
                rule,
                reply,
            } => match self.shared.wal.put_rule(&tenant, &name, &rule) {
                Ok(()) => pending.push(Pending::Done(reply)),
                Err(err) => {
                    let _ = reply.send(Err(err));
                }
            },
            Command::DeleteRule {
                tenant,
                name,
                reply,
            } => match self.shared.wal.delete_rule(&tenant, &name) {
                Ok(existed) => pending.push(Pending::Existed(reply, existed)),
                Err(err) => {
                    let _ = reply.send(Err(err));
                }
            },
            Command::Seal { now, reply } => {
                let now = unix(now);
                let budget =
                    usize::try_from(self.shared.config.head_max_bytes).unwrap_or(usize::MAX);
                let sealing = self
                    .shared
                    .state_mut()
                    .head
                    .seal(|start| plan::cut_due(start, now), budget);
                // The ranges' logs follow them aside, so that publishing the cut deletes exactly
                // the files its blocks hold. A log that cannot be moved stays open: the cut
                // still publishes, and a replay drops from it what the blocks hold.
                for start in &sealing.starts {
                    if let Err(err) = self.shared.wal.seal_range(*start) {
                        warn!(start, error = %err, "setting a sealed range's log aside failed; it is kept whole until the range is cut again");
                    }
                }
                let early = sealing.early;
                if early > 0 {
                    self.shared.metrics.ranges_sealed_early.inc_by(early as u64);
                    debug!(
                        ranges = early,
                        budget, "head over its memory budget: ranges cut early"
                    );
                }
                let _ = reply.send(Ok(sealing.ranges));
            }
            Command::PublishCut {
                start,
                blocks,
                reply,
            } => {
                let _ = reply.send(self.publish_cut(start, blocks));
            }
            Command::Retention { now, blocks, reply } => {
                let _ = reply.send(self.retention_pass(unix(now), blocks));
            }
            Command::ForgetDeletions { cutoff, reply } => {
                let _ = reply.send(self.forget_deletions(cutoff));
            }
            Command::Publish {
                output,
                inputs,
                generation,
                reply,
            } => {
                let _ = reply.send(self.publish(output, &inputs, generation));
            }
            Command::Sync { update, reply } => {
                let _ = reply.send(uploads::apply_sync(&self.shared, update));
            }
            Command::Close { reply } => *close = Some(reply),
        }
    }

    /// [`StoreError::Busy`] when the own head holds more than twice `store.head-max-bytes`:
    /// cuts (early ones included) do not keep up, and taking more would grow memory without
    /// bound; refused writes are retried by their clients.
    fn head_full(&self) -> Option<StoreError> {
        let limit = self.shared.config.head_max_bytes.saturating_mul(2);
        let head_bytes = self.shared.state().head.bytes() as u64;
        (head_bytes > limit).then_some(StoreError::Busy { head_bytes, limit })
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        let started = Instant::now();
        let flushed = match (&mut self.uploads, &self.shared.bucket) {
            (Some(uploads), Some(mode)) => uploads.upload(&self.shared, mode),
            _ => self.shared.wal.flush(),
        };
        self.shared
            .metrics
            .flush_duration
            .observe(started.elapsed().as_secs_f64());
        if let Err(err) = &flushed {
            error!(error = %err, "flush failed; the writes of this group are not acknowledged");
        }
        flushed
    }

    fn answer(&self, pending: Vec<Pending>, flushed: &Result<(), StoreError>) {
        fn settle<T>(
            reply: oneshot::Sender<Result<T, StoreError>>,
            value: T,
            flushed: &Result<(), StoreError>,
        ) {
            let answer = match flushed {
                Ok(()) => Ok(value),
                // Only a segment's upload fails with the object store in a flush.
                Err(StoreError::Object { what, source }) => Err(StoreError::Unavailable {
                    reason: format!("{what}: {source}"),
                }),
                Err(StoreError::Unavailable { reason }) => Err(StoreError::Unavailable {
                    reason: reason.clone(),
                }),
                Err(err) => Err(StoreError::Flush {
                    reason: err.to_string(),
                }),
            };
            let _ = reply.send(answer);
        }
        if flushed.is_ok() {
            let mut state = self.shared.state_mut();
            let max_spans = self.shared.config.max_spans_per_bucket;
            let mut spans = SpansAdded::default();
            for item in &pending {
                if let Pending::Write { records, .. } = item {
                    for (range, record) in records {
                        let added = state.head.add(*range, record, max_spans);
                        spans.kept += added.kept;
                        spans.dropped += added.dropped;
                    }
                }
            }
            let metrics = &self.shared.metrics;
            state.head.observe(metrics);
            metrics.span_trees_written.inc_by(spans.kept);
            if spans.dropped > 0 {
                metrics
                    .dropped_spans
                    .add("store", "span_limit", true, spans.dropped);
            }
        }
        for item in pending {
            match item {
                Pending::Write {
                    reply,
                    queued,
                    profiles,
                    written,
                    ..
                } => {
                    if flushed.is_ok() {
                        self.shared.metrics.profiles_written.inc_by(profiles as u64);
                        self.shared
                            .metrics
                            .write_duration
                            .observe(queued.elapsed().as_secs_f64());
                    }
                    settle(reply, written, flushed);
                }
                Pending::Count(reply, count) => settle(reply, count, flushed),
                Pending::Done(reply) => settle(reply, (), flushed),
                Pending::Existed(reply, existed) => settle(reply, existed, flushed),
            }
        }
    }

    /// Appends one prepared write to the head's logs, one record per head range it touches,
    /// with its marker (an agent batch's, checked first and stored in the same atomic batch, or
    /// the aggregator's own). Returns what it did, the profiles it stored and the records, which
    /// the head in memory gets once the group is durable.
    fn write(
        &mut self,
        mut prepared: Prepared,
        marker: Option<&BatchMarker>,
    ) -> Result<(Written, Appended), StoreError> {
        {
            // Data an app deletion removes, arriving late (a spool's backlog, a retry): never
            // logged or uploaded. Rare, so framed again here.
            let state = self.shared.state();
            prepared.records.retain_mut(|(_, record, frame)| {
                if state.deletions.filter(record) > 0 {
                    if record.profiles.is_empty() {
                        return false;
                    }
                    *frame = record.frame();
                }
                true
            });
        }
        let wal = &self.shared.wal;
        let mut batch = sled::Batch::default();
        if let Some(marker) = marker {
            let in_group = self
                .uploads
                .as_ref()
                .is_some_and(|u| u.in_group(&prepared.batch_agent, marker.sequence));
            if in_group
                || wal.has_batch(&prepared.batch_agent, marker.sequence)?
                || self.held_elsewhere(&prepared, marker.sequence)
            {
                debug!(
                    agent_id = %marker.agent_id,
                    tenant = %prepared.tenant,
                    sequence = marker.sequence,
                    "batch stored before; not written again"
                );
                return Ok((Written::Duplicate, (0, Vec::new())));
            }
            if self.uploads.is_none() {
                Wal::put_batch(
                    &mut batch,
                    &prepared.batch_agent,
                    marker.sequence,
                    marker.window_end,
                );
            }
        }
        if let Some(uploads) = &mut self.uploads {
            uploads.push(
                &prepared.records,
                marker.map(|m| (prepared.batch_agent.clone(), m.sequence, m.window_end)),
            );
            self.next_write = self.next_write.max(prepared.write + 1);
            let records = prepared
                .records
                .into_iter()
                .map(|(range, record, _)| (range, record))
                .collect();
            return Ok((Written::Stored, (prepared.profiles, records)));
        }
        for (range, _, frame) in &prepared.records {
            wal.append(*range, frame)?;
        }
        let next_write = self.next_write.max(prepared.write + 1);
        Wal::set_meta(&mut batch, "next_write", &next_write.to_be_bytes());
        wal.apply(batch)?;
        self.next_write = next_write;
        let records = prepared
            .records
            .into_iter()
            .map(|(range, record, _)| (range, record))
            .collect();
        Ok((Written::Stored, (prepared.profiles, records)))
    }

    /// Object-storage mode: reads the segments other aggregators uploaded since the last poll
    /// when `group` holds agent batches and that poll is older than one upload interval, so
    /// that the batches are checked against everything uploaded before then (a poll in
    /// progress elsewhere is not waited for).
    fn refresh_before_checks(&self, group: &[Command]) {
        let Some(mode) = &self.shared.bucket else {
            return;
        };
        let batches = group.iter().any(|c| {
            matches!(
                c,
                Command::Write {
                    marker: Some(_),
                    ..
                }
            )
        });
        if !batches {
            return;
        }
        let Ok(mut sync) = mode.sync.try_lock() else {
            return;
        };
        match sync.recent_segments(&self.shared, mode.upload_interval) {
            Ok(Some(update)) => {
                if let Err(err) = uploads::apply_sync(&self.shared, update) {
                    warn!(error = %err, "applying other aggregators' segments failed");
                }
            }
            Ok(None) => {}
            Err(err) => {
                warn!(error = %err, "listing other aggregators' segments before checking batches failed; checked against the last poll");
            }
        }
    }

    /// Whether a copy of agent batch `sequence` of `prepared`'s agent is held where the marker
    /// index does not look: another writer's segment (object-storage mode), or a block of one
    /// of its head ranges.
    fn held_elsewhere(&self, prepared: &Prepared, sequence: u64) -> bool {
        let marker = Marker {
            agent_id: prepared.batch_agent.clone(),
            sequence,
        };
        let state = self.shared.state();
        state.remote.holds(&prepared.tenant, &marker)
            || prepared
                .records
                .iter()
                .any(|(range, _, _)| in_blocks(&state.blocks, &prepared.tenant, *range, &marker))
    }

    /// Publishes the blocks a cut built from the sealed ranges starting at `start`: the range's
    /// log rid of what the blocks hold (deleted, unless writes arrived for the range since it
    /// was sealed), then the blocks in the published set and the sealed ranges out of the head,
    /// in one step for reads.
    fn publish_cut(&mut self, start: u64, blocks: Vec<Arc<BlockFile>>) -> Result<u64, StoreError> {
        if let Some(block) = blocks.iter().find(|block| {
            !self
                .shared
                .state()
                .head
                .is_sealed(&block.name.tenant, start)
        }) {
            // The head was rebuilt from its logs since the cut sealed this range (the writer
            // restarted): it holds the range's writes again, so publishing would count them
            // twice. The cut deletes its blocks; the next one builds them again.
            return Err(StoreError::Stale {
                block: block.name.to_string(),
            });
        }
        if let Err(err) = self.trim_cut_range(start) {
            // The blocks are durable, so they are published all the same: failing here would
            // have the next pass build them a second time, and a restart load both. The
            // records left in the log are the ones a restart's replay drops by their markers.
            warn!(start, error = %err, "removing a cut range's writes from its log failed; its blocks are published and the next restart drops those writes");
        }
        let count = blocks.len() as u64;
        let mut guard = self.shared.state_mut();
        let state = &mut *guard;
        let mut set = BlockSet::clone(&state.blocks);
        state.head.unseal(start);
        for block in blocks {
            set.insert(block);
        }
        self.shared.dedupe(&mut set);
        // A deletion learnt while the block was built hides the app in it (the block does not
        // list it): `deletions.rs`.
        state.deletions.mark(&mut set);
        state.blocks = Arc::new(set);
        state.head.observe(&self.shared.metrics);
        self.update_gauges(&state.blocks);
        Ok(count)
    }

    /// Removes from the disk the writes of head range `start` that its cut's `blocks` hold:
    /// the range's sealed logs, whole. The writes that arrived for the range while it was cut
    /// are in its open log, untouched.
    fn trim_cut_range(&self, start: u64) -> Result<(), StoreError> {
        self.shared.wal.remove_sealed(start)
    }

    /// Deletes `app` of `tenant` as of `now` in local mode (`deletions.rs`): counts the series
    /// here with data before the horizon (none: nothing is stored, and the caller answers that
    /// no such app exists), makes the deletion durable in the database, then applies it
    /// ([`Writer::learn_deletion`]). Returns the series counted.
    fn delete_app(
        &mut self,
        tenant: &Tenant,
        app: &str,
        now: SystemTime,
    ) -> Result<u64, StoreError> {
        let millis = super::sync::unix_millis(now);
        let (horizon, series) = deletions::plan(&self.shared.state(), tenant, app, millis);
        if series.is_empty() {
            return Ok(0);
        }
        let mut batch = sled::Batch::default();
        Wal::put_deletion(&mut batch, tenant, app, horizon, millis);
        self.shared.wal.apply(batch)?;
        self.shared.wal.flush()?;
        let series = series.len() as u64;
        self.learn_deletion(tenant, app, horizon, series);
        Ok(series)
    }

    /// Applies the deletion of `app` of `tenant` with `horizon`, durable already (in the
    /// database, or in the bucket), which takes data from `series` series here: the heads in
    /// memory, the blocks marked. The head's logs (and in a bucket the segments) keep the
    /// deleted profiles until the range is cut: a replay leaves them out, as every reader does,
    /// and reading every log back here would stall the writer for as long as the head is large.
    fn learn_deletion(&self, tenant: &Tenant, app: &str, horizon: u64, series: u64) {
        let mut guard = self.shared.state_mut();
        let state = &mut *guard;
        if state.deletions.learn(tenant, app, horizon) {
            deletions::apply(state, &[(tenant.clone(), app.to_owned(), horizon)]);
        }
        let mut set = BlockSet::clone(&state.blocks);
        state.deletions.mark(&mut set);
        state.blocks = Arc::new(set);
        let metrics = &self.shared.metrics;
        state.head.observe(metrics);
        metrics.app_deletions.set(state.deletions.len() as i64);
        info!(tenant = %tenant.as_str(), app, horizon, series, "app deleted");
    }

    /// Takes what [`plan::retention`] names (when `blocks`: a compactor, in object-storage
    /// mode) out of the published set and forgets batch markers older than the retention;
    /// returns the blocks taken out, for the caller to delete.
    fn retention_pass(&mut self, now: u64, delete_blocks: bool) -> Result<Retained, StoreError> {
        let _span = tracing::info_span!("retention").entered();
        let config = &self.shared.config;
        let blocks = Arc::clone(&self.shared.state().blocks);
        let plans: Vec<_> = blocks
            .blocks
            .values()
            .flat_map(|list| block_plans(list))
            .collect();
        let doomed: BTreeSet<String> = plan::retention(
            &plans,
            now,
            config.retention.as_secs(),
            config.max_disk_bytes,
            self.shared.wal.size_on_disk(),
        )
        .into_iter()
        .filter(|_| delete_blocks)
        .collect();
        let cutoff = plan::retention_cutoff(now, config.retention.as_secs());
        let mut report = RetentionReport::default();
        let mut batch = sled::Batch::default();
        report.markers = self.shared.wal.expire_batches(&mut batch, cutoff)?;
        let removed = if doomed.is_empty() {
            Vec::new()
        } else {
            self.unpublish(&doomed, None)
        };
        self.shared.wal.apply(batch)?;
        if !removed.is_empty() {
            self.shared.wal.flush()?;
        }
        Ok((report, removed))
    }

    /// Forgets the app deletions that remove nothing any more as of retention's `cutoff`
    /// (`deletions.rs`): from memory, and from the database (local mode). In a bucket a
    /// compactor's retention task deletes their objects afterwards (`deletions::prune`), off
    /// this thread; a poll learns again those whose objects are still there.
    fn forget_deletions(&self, cutoff: u64) -> Result<(), StoreError> {
        let forgotten = {
            let mut state = self.shared.state_mut();
            let blocks = Arc::clone(&state.blocks);
            let forgotten = state.deletions.forget_expired(&blocks, cutoff);
            self.shared
                .metrics
                .app_deletions
                .set(state.deletions.len() as i64);
            forgotten
        };
        for (tenant, app, horizon) in &forgotten {
            info!(tenant = %tenant.as_str(), app, horizon, "app deletion forgotten: retention removed all it could remove");
        }
        if self.shared.bucket.is_none() && !forgotten.is_empty() {
            let mut batch = sled::Batch::default();
            for (tenant, app, _) in &forgotten {
                Wal::remove_deletion(&mut batch, tenant, app);
            }
            self.shared.wal.apply(batch)?;
            self.shared.wal.flush()?;
        }
        Ok(())
    }

    /// Takes the blocks `ids` out of the published set, in one step with adding `output`;
    /// returns them.
    fn unpublish(
        &mut self,
        ids: &BTreeSet<String>,
        output: Option<Arc<BlockFile>>,
    ) -> Vec<Arc<BlockFile>> {
        let mut guard = self.shared.state_mut();
        let state = &mut *guard;
        let mut set = BlockSet::clone(&state.blocks);
        let removed = set.remove(ids);
        if let Some(output) = output {
            let learnt = state.deletions.learn_block(&output);
            deletions::apply(state, &learnt);
            set.insert(output);
        }
        self.shared.dedupe(&mut set);
        state.deletions.mark(&mut set);
        state.blocks = Arc::new(set);
        self.update_gauges(&state.blocks);
        removed
    }

    /// Publishes a merged block in place of its inputs, unless one of them is gone or an app
    /// was deleted since the merge was planned. In object-storage mode the inputs stay known
    /// (hidden) until a compactor deletes them after the grace, and the merge is published
    /// only if `lineage.rs` shows it.
    fn publish(
        &mut self,
        output: Arc<BlockFile>,
        inputs: &BTreeSet<String>,
        generation: u64,
    ) -> Result<bool, StoreError> {
        {
            let state = self.shared.state();
            if state.generation != generation || inputs.iter().any(|id| !state.blocks.knows(id)) {
                return Ok(false);
            }
        }
        if self.shared.bucket.is_some() {
            let mut guard = self.shared.state_mut();
            let state = &mut *guard;
            let mut set = BlockSet::clone(&state.blocks);
            let id = output.name.id.clone();
            set.insert(Arc::clone(&output));
            self.shared.dedupe(&mut set);
            if !set.all().any(|b| b.name.id == id) {
                return Ok(false);
            }
            let learnt = state.deletions.learn_block(&output);
            deletions::apply(state, &learnt);
            state.deletions.mark(&mut set);
            state.blocks = Arc::new(set);
            self.update_gauges(&state.blocks);
        } else {
            self.unpublish(inputs, Some(output));
        }
        for id in inputs {
            self.shared.cache.forget(id);
        }
        Ok(true)
    }

    fn update_gauges(&self, blocks: &BlockSet) {
        self.shared.update_block_gauges(blocks);
    }
}
