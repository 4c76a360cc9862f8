//! The writer thread: every change to the block store goes through it, in order.
//!
//! It takes every request waiting in the queue, applies each to the head (`wal.rs`), makes the
//! whole group durable with one fsync, then adds the group's writes to the head in memory and
//! answers (group commit). Cuts, app deletions, rules, retention and the publication of a
//! compaction take the same path, so that none of them races another: a cut never loses a
//! write that arrived while it ran, and a deletion never misses a block being published.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use smolder_block::{BlockBuilder, Contribution, Marker};
use smolder_common::{Profile, Series};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info};

use super::files::{BlockFile, BlockName, BlockSet};
use super::wal::{Record, Wal};
use super::{RetentionReport, Shared, Tombstones, block_plans, plan};
use crate::store::{BatchMarker, StoreError, Written, unix};
use crate::tenant::Tenant;

/// Requests the writer serves, each answered once what it changed is durable.
pub(crate) enum Command {
    /// Store profiles, with an agent batch's marker.
    Write {
        tenant: Tenant,
        profiles: Vec<Profile>,
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
    /// Cut the head ranges closed as of `now`.
    Cut {
        now: SystemTime,
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
    /// The marker agent id of this aggregator's HTTP writes.
    http_agent: String,
    next_write: u64,
    tombstones: Tombstones,
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
            http_agent: format!("{HTTP_AGENT}{id}"),
            shared,
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
        info!(replayed, dropped, "head replayed");
        Ok(writer)
    }

    fn retention(&self) -> u64 {
        self.shared.config.retention.as_secs()
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
                tenant,
                profiles,
                marker,
                reply,
                queued,
            } => match self.write(tenant, &profiles, marker.as_ref()) {
                Ok((written, records)) => pending.push(Pending::Write {
                    reply,
                    queued,
                    profiles: if written == Written::Stored {
                        profiles.len()
                    } else {
                        0
                    },
                    written,
                    records,
                }),
                Err(err) => {
                    let _ = reply.send(Err(err));
                }
            },
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
            Command::Cut { now, reply } => {
                let _ = reply.send(self.cut(unix(now)));
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

    /// Appends one write to the head's logs, one record per head range it touches, with
    /// its marker (an agent batch's, checked first and stored in the same atomic batch, or the
    /// aggregator's own). The head in memory gets the records once the group is durable.
    fn write(
        &mut self,
        tenant: Tenant,
        profiles: &[Profile],
        marker: Option<&BatchMarker>,
    ) -> Result<(Written, Vec<(u64, Record)>), StoreError> {
        let wal = &self.shared.wal;
        let mut batch = sled::Batch::default();
        let window_end = marker.map(|m| m.window_end);
        let batch_agent = marker.map(|m| batch_agent(&tenant, &m.agent_id));
        if let (Some(marker), Some(agent)) = (marker, &batch_agent) {
            if wal.has_batch(agent, marker.sequence)? {
                debug!(
                    agent_id = %marker.agent_id,
                    %tenant,
                    sequence = marker.sequence,
                    "batch stored before; not written again"
                );
                return Ok((Written::Duplicate, Vec::new()));
            }
            Wal::put_batch(&mut batch, agent, marker.sequence, marker.window_end);
        }
        let write = self.next_write;
        let marker = match (marker, batch_agent) {
            (Some(m), Some(agent_id)) => Marker {
                agent_id,
                sequence: m.sequence,
            },
            _ => Marker {
                agent_id: self.http_agent.clone(),
                sequence: write,
            },
        };
        let mut ranges: BTreeMap<u64, Vec<(u64, Profile)>> = BTreeMap::new();
        for profile in profiles {
            let bucket = plan::bucket_of(unix(profile.from), unix(profile.until));
            ranges
                .entry(plan::head_range(bucket))
                .or_default()
                .push((bucket, profile.clone()));
        }
        let records: Vec<(u64, Record)> = ranges
            .into_iter()
            .map(|(range, profiles)| {
                (
                    range,
                    Record {
                        tenant: tenant.clone(),
                        marker: marker.clone(),
                        window_end,
                        write,
                        profiles,
                    },
                )
            })
            .collect();
        for (range, record) in &records {
            wal.append(*range, record)?;
        }
        Wal::set_meta(&mut batch, "next_write", &(write + 1).to_be_bytes());
        wal.apply(batch)?;
        self.next_write = write + 1;
        Ok((Written::Stored, records))
    }

    /// Cuts every head range closed as of `now`: one block per tenant, written durably, then
    /// the range's log deleted, then the blocks published and the
    /// range dropped from memory.
    fn cut(&mut self, now: u64) -> Result<u64, StoreError> {
        let due: BTreeSet<u64> = self
            .shared
            .state()
            .head
            .keys()
            .into_iter()
            .map(|(_, start)| start)
            .filter(|&start| plan::cut_due(start, now))
            .collect();
        let mut cut = 0;
        for start in due {
            cut += self.cut_range(start)?;
        }
        Ok(cut)
    }

    fn cut_range(&mut self, start: u64) -> Result<u64, StoreError> {
        let started = Instant::now();
        let _span = tracing::info_span!("cut", start).entered();
        let tenants: Vec<Tenant> = self
            .shared
            .state()
            .head
            .keys()
            .into_iter()
            .filter(|(_, s)| *s == start)
            .map(|(t, _)| t)
            .collect();
        let mut blocks = Vec::new();
        for tenant in &tenants {
            let bytes = {
                let state = self.shared.state();
                let Some(range) = state.head.range(tenant, start) else {
                    continue;
                };
                let mut builder =
                    BlockBuilder::new(tenant.as_str(), start, plan::HEAD_SPAN, plan::BUCKET)
                        .expect("the head span climbs by tens from 10 s");
                for (series, data) in &range.series {
                    for entry in &data.entries {
                        let tree = range.entry_tree(data, entry);
                        builder
                            .add(
                                series,
                                &data.meta,
                                entry.bucket,
                                &tree,
                                Contribution::batch(entry.marker.clone(), entry.writes),
                            )
                            .expect("a head range holds only its own buckets");
                    }
                }
                builder.finish().map_err(|err| StoreError::Engine {
                    source: Box::new(err),
                })?
            };
            let (bytes, report) = bytes;
            let name = BlockName {
                start,
                span: plan::HEAD_SPAN,
                tenant: tenant.clone(),
                id: format!("{:016x}", rand::random::<u64>()),
            };
            let len = bytes.len() as u64;
            self.shared.files.put(&name, bytes)?;
            let block =
                self.shared
                    .files
                    .open_block(&name, len)
                    .map_err(|err| StoreError::Object {
                        what: format!("reading back {name}"),
                        source: Box::new(err),
                    })?;
            self.shared.metrics.blocks_cut.inc();
            self.shared.metrics.block_bytes_written.inc_by(len);
            debug!(block = %name, series = report.series, nodes = report.nodes, bytes = len, "head range cut");
            blocks.push(Arc::new(block));
        }
        self.shared.test_pause("cut written, head not yet deleted");
        self.shared.wal.remove_range(start)?;
        let count = blocks.len() as u64;
        let mut state = self.shared.state_mut();
        let mut set = BlockSet::clone(&state.blocks);
        for block in blocks {
            set.insert(block);
        }
        for tenant in &tenants {
            state.head.remove(tenant, start);
        }
        state.blocks = Arc::new(set);
        self.shared
            .metrics
            .head_series
            .set(state.head.series_count() as i64);
        self.update_gauges(&state.blocks);
        self.shared
            .metrics
            .cut_duration
            .observe(started.elapsed().as_secs_f64());
        Ok(count)
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
