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
//! published.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime};

use smolder_block::Marker;
use smolder_common::{Profile, Series};
use smolder_daemon::Heartbeat;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info, warn};

use super::files::{BlockFile, BlockSet};
use super::head::{Head, SealedRange};
use super::wal::{Record, Wal};
use super::{RetentionReport, Shared, Tombstones, block_plans, plan};
use crate::store::{BatchMarker, StoreError, Written, unix};
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
    /// Delete an app's series.
    DeleteApp {
        tenant: Tenant,
        app: String,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
    /// Store a recording rule.
    PutRule {
        tenant: Tenant,
        name: String,
        rule: Vec<u8>,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    /// Delete a recording rule.
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
    /// Apply retention as of `now`.
    Retention {
        now: SystemTime,
        reply: oneshot::Sender<Result<RetentionReport, StoreError>>,
    },
    /// Publish a merged block in place of its inputs; answers whether it was (not when an
    /// input is gone or an app was deleted since the merge was planned).
    Publish {
        output: Arc<BlockFile>,
        inputs: BTreeSet<String>,
        generation: u64,
        reply: oneshot::Sender<Result<bool, StoreError>>,
    },
    /// Flush and stop.
    Close {
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
}

/// How many queued requests one fsync may cover.
const GROUP: usize = 64;

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
    tombstones: Tombstones,
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
    /// Numbers `profiles` of `tenant`, splits them by head range and frames each range's
    /// record (the tree encoding and lz4 of [`Record::frame`], the costly part of a write).
    pub(crate) fn new(
        ids: &WriteIds,
        tenant: Tenant,
        profiles: Vec<Profile>,
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
        let mut ranges: BTreeMap<u64, Vec<(u64, Profile)>> = BTreeMap::new();
        for profile in profiles {
            let bucket = plan::bucket_of(unix(profile.from), unix(profile.until));
            ranges
                .entry(plan::head_range(bucket))
                .or_default()
                .push((bucket, profile));
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
    pub(crate) fn open(shared: Arc<Shared>, tombstones: Tombstones) -> Result<Writer, StoreError> {
        Writer::replay(shared, tombstones, None)
    }

    /// A writer again over `shared` and the callers' `ids`, after the last one panicked: the
    /// head in memory is rebuilt from its logs (a panic may have left it without a write that
    /// is durable, or half-changed), the app deletions read again from the database. A cut in
    /// flight then finds its range no longer sealed and is refused ([`Writer::publish_cut`]).
    ///
    /// # Errors
    ///
    /// As [`Writer::open`].
    pub(crate) fn reopen(shared: Arc<Shared>, ids: Arc<WriteIds>) -> Result<Writer, StoreError> {
        let present: BTreeSet<String> = shared
            .state()
            .blocks
            .all()
            .map(|b| b.name.id.clone())
            .collect();
        let tombstones = super::tombstones(&shared.wal, &present)?;
        Writer::replay(shared, tombstones, Some(ids))
    }

    /// Replays the head from the database into an empty head; `ids` are the callers' when a
    /// writer is reopened.
    fn replay(
        shared: Arc<Shared>,
        tombstones: Tombstones,
        ids: Option<Arc<WriteIds>>,
    ) -> Result<Writer, StoreError> {
        let wal = &shared.wal;
        let id = match wal.meta("aggregator_id")? {
            Some(id) => String::from_utf8_lossy(&id).into_owned(),
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
            tombstones,
        };
        // Replay: a record whose marker a block of its range holds was cut before a crash.
        let cutoff = plan::retention_cutoff(unix(SystemTime::now()), writer.retention());
        let mut batch = sled::Batch::default();
        let (mut replayed, mut dropped) = (0, 0);
        let records = writer.shared.wal.records()?;
        let mut by_range: BTreeMap<u64, Vec<&Record>> = BTreeMap::new();
        let mut changed: BTreeSet<u64> = BTreeSet::new();
        {
            let mut state = writer.shared.state_mut();
            state.head = Head::default();
            let blocks = Arc::clone(&state.blocks);
            for (range, record) in &records {
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
                let cut = blocks
                    .overlapping(&record.tenant, *range, range + plan::HEAD_SPAN)
                    .any(|b| {
                        b.name.start <= *range
                            && b.name.end() >= range + plan::HEAD_SPAN
                            && b.index.contains_marker(&record.marker)
                    });
                let kept = by_range.entry(*range).or_default();
                if cut || range + plan::HEAD_SPAN <= cutoff {
                    changed.insert(*range);
                    dropped += 1;
                } else {
                    state.head.add(*range, record);
                    kept.push(record);
                    replayed += 1;
                }
            }
            writer
                .shared
                .metrics
                .head_series
                .set(state.head.series_count() as i64);
        }
        for range in changed {
            writer.shared.wal.rewrite_range(range, &by_range[&range])?;
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
            while group.len() < GROUP {
                match queue.try_recv() {
                    Ok(command) => group.push(command),
                    Err(_) => break,
                }
            }
            let mut pending = Vec::with_capacity(group.len());
            let mut close = None;
            for command in group {
                // A cut, deletion, retention pass or publication works on the head as the
                // acknowledged writes left it: the group's writes so far are made durable and
                // added to the head first, or a cut would delete a range's log with a write in
                // it that its block does not hold.
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
            beat.beat();
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
            Command::DeleteApp { tenant, app, reply } => match self.delete_app(&tenant, &app) {
                Ok(count) => pending.push(Pending::Count(reply, count)),
                Err(err) => {
                    let _ = reply.send(Err(err));
                }
            },
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
                let sealed = self
                    .shared
                    .state_mut()
                    .head
                    .seal(|start| plan::cut_due(start, now));
                let _ = reply.send(Ok(sealed));
            }
            Command::PublishCut {
                start,
                blocks,
                reply,
            } => {
                let _ = reply.send(self.publish_cut(start, blocks));
            }
            Command::Retention { now, reply } => {
                let _ = reply.send(self.retention_pass(unix(now)));
            }
            Command::Publish {
                output,
                inputs,
                generation,
                reply,
            } => {
                let _ = reply.send(self.publish(output, &inputs, generation));
            }
            Command::Close { reply } => *close = Some(reply),
        }
    }

    fn flush(&self) -> Result<(), StoreError> {
        let started = Instant::now();
        let flushed = self.shared.wal.flush();
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
                Err(err) => Err(StoreError::Flush {
                    reason: err.to_string(),
                }),
            };
            let _ = reply.send(answer);
        }
        if flushed.is_ok() {
            let mut state = self.shared.state_mut();
            for item in &pending {
                if let Pending::Write { records, .. } = item {
                    for (range, record) in records {
                        state.head.add(*range, record);
                    }
                }
            }
            self.shared
                .metrics
                .head_series
                .set(state.head.series_count() as i64);
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
        prepared: Prepared,
        marker: Option<&BatchMarker>,
    ) -> Result<(Written, Appended), StoreError> {
        let wal = &self.shared.wal;
        let mut batch = sled::Batch::default();
        if let Some(marker) = marker {
            if wal.has_batch(&prepared.batch_agent, marker.sequence)? {
                debug!(
                    agent_id = %marker.agent_id,
                    tenant = %prepared.tenant,
                    sequence = marker.sequence,
                    "batch stored before; not written again"
                );
                return Ok((Written::Duplicate, (0, Vec::new())));
            }
            Wal::put_batch(
                &mut batch,
                &prepared.batch_agent,
                marker.sequence,
                marker.window_end,
            );
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

    /// Publishes the blocks a cut built from the sealed ranges starting at `start`: the apps
    /// deleted from those ranges meanwhile hidden in them (durably), then the range's log rid
    /// of what the blocks hold (deleted, unless writes arrived for the range since it was
    /// sealed), then the blocks in the published set and the sealed ranges out of the head, in
    /// one step for reads.
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
        let deleted: Vec<(Arc<BlockFile>, BTreeSet<String>)> = {
            let state = self.shared.state();
            blocks
                .iter()
                .map(|block| {
                    (
                        Arc::clone(block),
                        state.head.deleted_in_sealed(&block.name.tenant, start),
                    )
                })
                .collect()
        };
        if deleted.iter().any(|(_, apps)| !apps.is_empty()) {
            let mut batch = sled::Batch::default();
            for (block, apps) in &deleted {
                for app in apps {
                    let key = (block.name.tenant.clone(), app.clone());
                    let hidden = self.tombstones.entry(key).or_default();
                    hidden.insert(block.name.id.clone());
                    Wal::put_tombstone(&mut batch, &block.name.tenant, app, hidden);
                }
            }
            self.shared.wal.apply(batch)?;
            self.shared.wal.flush()?;
        }
        if let Err(err) = self.trim_cut_range(start, &blocks) {
            // The blocks are durable, so they are published all the same: failing here would
            // have the next pass build them a second time, and a restart load both. The
            // records left in the log are the ones a restart's replay drops by their markers.
            warn!(start, error = %err, "removing a cut range's writes from its log failed; its blocks are published and the next restart drops those writes");
        }
        let count = blocks.len() as u64;
        let mut state = self.shared.state_mut();
        let mut set = BlockSet::clone(&state.blocks);
        for (block, apps) in deleted {
            state.head.unseal(&block.name.tenant, start);
            for app in apps {
                set.hidden
                    .entry(block.name.id.clone())
                    .or_default()
                    .insert(app);
            }
            set.insert(block);
        }
        state.blocks = Arc::new(set);
        self.shared
            .metrics
            .head_series
            .set(state.head.series_count() as i64);
        self.update_gauges(&state.blocks);
        Ok(count)
    }

    /// Removes from the log of head range `start` the writes `blocks` hold: the whole log, or,
    /// when writes arrived for the range while it was cut, everything but theirs (the rule a
    /// restart's replay applies).
    fn trim_cut_range(&self, start: u64, blocks: &[Arc<BlockFile>]) -> Result<(), StoreError> {
        if !self.shared.state().head.has_live(start) {
            return self.shared.wal.remove_range(start);
        }
        let kept: Vec<Record> = self
            .shared
            .wal
            .range_records(start)?
            .into_iter()
            .filter(|record| {
                !blocks.iter().any(|block| {
                    block.name.tenant == record.tenant
                        && block.index.contains_marker(&record.marker)
                })
            })
            .collect();
        let kept: Vec<&Record> = kept.iter().collect();
        self.shared.wal.rewrite_range(start, &kept)
    }

    /// Deletes every series of `app` of `tenant`: from the head (memory and records) and, as
    /// a deletion naming the blocks that hold it, from every live block (reads hide it at once,
    /// compaction leaves it out of its output).
    fn delete_app(&mut self, tenant: &Tenant, app: &str) -> Result<u64, StoreError> {
        let mut deleted: BTreeSet<Series> = BTreeSet::new();
        let mut batch = sled::Batch::default();
        let mut by_range: BTreeMap<u64, Vec<Record>> = BTreeMap::new();
        let mut changed: BTreeSet<u64> = BTreeSet::new();
        for (range, mut record) in self.shared.wal.records()? {
            if record.tenant == *tenant
                && record.profiles.iter().any(|(_, p)| p.series.app() == app)
            {
                record.profiles.retain(|(_, p)| p.series.app() != app);
                changed.insert(range);
            }
            by_range.entry(range).or_default().push(record);
        }
        for range in changed {
            let kept: Vec<&Record> = by_range[&range]
                .iter()
                .filter(|r| !r.profiles.is_empty())
                .collect();
            self.shared.wal.rewrite_range(range, &kept)?;
        }
        let mut state = self.shared.state_mut();
        let mut set = BlockSet::clone(&state.blocks);
        let key = (tenant.clone(), app.to_owned());
        let mut hidden = self.tombstones.get(&key).cloned().unwrap_or_default();
        for block in set.overlapping(tenant, 0, u64::MAX) {
            if set.hides(&block.name.id, app) {
                continue;
            }
            let positions = block
                .index
                .postings(smolder_common::series::NAME_LABEL, app);
            if positions.is_empty() {
                continue;
            }
            deleted.extend(
                positions
                    .iter()
                    .map(|&p| block.index.series()[p as usize].series.clone()),
            );
            hidden.insert(block.name.id.clone());
        }
        Wal::put_tombstone(&mut batch, tenant, app, &hidden);
        self.shared.wal.apply(batch)?;
        for id in &hidden {
            set.hidden
                .entry(id.clone())
                .or_default()
                .insert(app.to_owned());
        }
        deleted.extend(state.head.delete_app(tenant, app));
        self.tombstones.insert(key, hidden);
        state.blocks = Arc::new(set);
        state.generation += 1;
        self.shared
            .metrics
            .head_series
            .set(state.head.series_count() as i64);
        info!(app, series = deleted.len(), "app deleted");
        Ok(deleted.len() as u64)
    }

    /// Deletes what [`plan::retention`] names and forgets batch markers older than the
    /// retention.
    fn retention_pass(&mut self, now: u64) -> Result<RetentionReport, StoreError> {
        let started = Instant::now();
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
        .collect();
        let mut report = RetentionReport::default();
        let mut batch = sled::Batch::default();
        report.markers = self.shared.wal.expire_batches(
            &mut batch,
            plan::retention_cutoff(now, config.retention.as_secs()),
        )?;
        if !doomed.is_empty() {
            let removed = self.unpublish(&doomed, None, &mut batch);
            self.shared.wal.apply(batch)?;
            self.shared.wal.flush()?;
            for block in &removed {
                self.shared.files.delete(&block.name)?;
                self.shared.cache.forget(&block.name.id);
                info!(block = %block.name, "retention deleted a block");
            }
            report.blocks = removed.len() as u64;
            self.shared
                .metrics
                .blocks_deleted_retention
                .inc_by(report.blocks);
        } else {
            self.shared.wal.apply(batch)?;
        }
        self.shared
            .metrics
            .retention_duration
            .observe(started.elapsed().as_secs_f64());
        Ok(report)
    }

    /// Takes the blocks `ids` out of the published set, in one step with adding `output`, and
    /// out of the app deletions (adding the changes to `batch`); returns them.
    fn unpublish(
        &mut self,
        ids: &BTreeSet<String>,
        output: Option<Arc<BlockFile>>,
        batch: &mut sled::Batch,
    ) -> Vec<Arc<BlockFile>> {
        let mut state = self.shared.state_mut();
        let mut set = BlockSet::clone(&state.blocks);
        let removed = set.remove(ids);
        if let Some(output) = output {
            set.insert(output);
        }
        for id in ids {
            set.hidden.remove(id);
        }
        for ((tenant, app), hidden) in &mut self.tombstones {
            if hidden.iter().any(|id| ids.contains(id)) {
                hidden.retain(|id| !ids.contains(id));
                Wal::put_tombstone(batch, tenant, app, hidden);
            }
        }
        self.tombstones.retain(|_, hidden| !hidden.is_empty());
        state.blocks = Arc::new(set);
        self.update_gauges(&state.blocks);
        removed
    }

    /// Publishes a merged block in place of its inputs, unless one of them is gone or an app
    /// was deleted since the merge was planned.
    fn publish(
        &mut self,
        output: Arc<BlockFile>,
        inputs: &BTreeSet<String>,
        generation: u64,
    ) -> Result<bool, StoreError> {
        {
            let state = self.shared.state();
            let present: BTreeSet<&String> = state.blocks.all().map(|b| &b.name.id).collect();
            if state.generation != generation || inputs.iter().any(|id| !present.contains(id)) {
                return Ok(false);
            }
        }
        let mut batch = sled::Batch::default();
        self.unpublish(inputs, Some(output), &mut batch);
        self.shared.wal.apply(batch)?;
        self.shared.wal.flush()?;
        for id in inputs {
            self.shared.cache.forget(id);
        }
        Ok(true)
    }

    fn update_gauges(&self, blocks: &BlockSet) {
        let metrics = &self.shared.metrics;
        metrics.blocks.set(blocks.all().count() as i64);
        metrics
            .block_bytes
            .set(i64::try_from(blocks.bytes()).unwrap_or(i64::MAX));
        let disk = blocks.bytes() + self.shared.wal.size_on_disk();
        metrics
            .disk_bytes
            .set(i64::try_from(disk).unwrap_or(i64::MAX));
    }
}
