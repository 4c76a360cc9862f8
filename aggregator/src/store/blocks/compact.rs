//! Compaction: merging a closed range's blocks into one, downsampling old ones, and removing
//! what merges replaced and writes left unfinished.
//!
//! Input: the published blocks and `now`; output: merged blocks, published through the writer
//! ([`Command::Publish`]), their inputs then deleted. Runs on the blocking pool, one pass at a
//! time, reading inputs one series at a time (`smolder_block::Merger`: every series' trees,
//! then every series' span profiles) and writing the output in pieces, so a merge holds one
//! series' chunks, never whole blocks.
//!
//! A merge's output lists its inputs (and what they still replaced) in its sources section and
//! is named after them, so the same merge repeated after a crash writes the same object, and a
//! restart that finds both the output and its inputs shows the output only.
//!
//! **Object-storage mode** (ARCHITECTURE.md, "Compaction without a coordinator of our own"): a
//! pass polls the bucket first and runs only while this aggregator compacts (`role.rs`). Two
//! compactors may still meet, so before a merge's upload completes (the object appears only
//! then) the bucket is polled again and the merge is dropped unless `lineage.rs` would show it
//! without displacing a block older than half the grace; once published, its inputs stay,
//! hidden, until they have been hidden for `compaction-grace`, and are then deleted with every
//! other block hidden that long (merges that lost among them).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use smolder_block::{Fetched, Limits, MergeInput, MergeOptions, Merger};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use super::files::{BlockFile, BlockName, unavailable};
use super::writer::Command;
use super::{CompactionReport, Shared, block_plans, plan};
use crate::store::StoreError;

/// Unfinished writes younger than this may still be in progress and are left alone.
const UNFINISHED_AGE: Duration = Duration::from_secs(600);

/// One compaction pass as of `now`. See the [module documentation](self).
pub(super) fn pass(
    shared: &Arc<Shared>,
    commands: &mpsc::Sender<Command>,
    now: u64,
) -> Result<CompactionReport, StoreError> {
    let _span = tracing::info_span!("compaction").entered();
    let mut report = CompactionReport::default();
    if let Some(mode) = &shared.bucket {
        // A fresh view of the bucket, and of the role.
        super::sync_once(shared, commands)?;
        if !shared.compacting() {
            return Ok(report);
        }
        retire(shared, mode);
    }
    let (blocks, generation, known) = {
        let state = shared.state();
        (
            Arc::clone(&state.blocks),
            state.generation,
            state.deletions.clone(),
        )
    };
    let downsampling = plan::Downsampling {
        to_100s: shared.config.downsample_to_100s_after,
        to_1000s: shared.config.downsample_to_1000s_after,
    };
    for (tenant, list) in &blocks.blocks {
        for job in plan::compactions(&block_plans(list), now, &downsampling) {
            let inputs: Vec<Arc<BlockFile>> = job
                .inputs
                .iter()
                .filter_map(|id| list.iter().find(|b| &b.name.id == id).cloned())
                .collect();
            let started = Instant::now();
            let deletions = known.for_block(tenant, job.start);
            match merge(shared, commands, &inputs, &job, &blocks.hidden, deletions) {
                Ok(Some(output)) => {
                    let name = output.name.clone();
                    let ids: BTreeSet<String> = job.inputs.iter().cloned().collect();
                    let (reply, answer) = oneshot::channel();
                    commands
                        .blocking_send(Command::Publish {
                            output: Arc::new(output),
                            inputs: ids,
                            generation,
                            reply,
                        })
                        .map_err(|_| StoreError::Closed)?;
                    let published = answer.blocking_recv().map_err(|_| StoreError::Closed)??;
                    if published {
                        shared.test_pause("merge published, inputs not yet deleted");
                        // In a bucket the inputs go once hidden for the grace (`retire`).
                        if shared.bucket.is_none() {
                            for input in &inputs {
                                shared.files.delete(&input.name)?;
                            }
                        }
                        report.merged += 1;
                        report.inputs += inputs.len() as u64;
                        shared.metrics.compactions.inc();
                        shared
                            .metrics
                            .compaction_duration
                            .observe(started.elapsed().as_secs_f64());
                        info!(tenant = %tenant.as_str(), block = %name, inputs = inputs.len(), finest = job.finest, "blocks merged");
                    } else {
                        // An input went or an app was deleted meanwhile, or (object-storage
                        // mode) another block shows in its place: plan again next pass. In a
                        // bucket the merge stays: another compactor may have written and
                        // published a merge of the same name (names follow the inputs), and
                        // deleting it could lose what it replaced; readers resolve it like any
                        // merge, and it goes once hidden for the grace (`retire`).
                        if shared.bucket.is_none() {
                            shared.files.delete(&name)?;
                        }
                        shared
                            .metrics
                            .merges_abandoned
                            .with_label_values(&["changed"])
                            .inc();
                        report.abandoned += 1;
                    }
                }
                Ok(None) => report.abandoned += 1,
                Err(err) => return Err(err),
            }
        }
    }
    let unfinished = shared.files.delete_unfinished(UNFINISHED_AGE);
    if unfinished > 0 {
        info!(files = unfinished, "deleted unfinished block writes");
    }
    Ok(report)
}

/// Deletes the bucket's blocks hidden for at least the grace (object-storage mode): merges'
/// inputs, merges that lost. A failure is logged and tried again at the next pass.
fn retire(shared: &Shared, mode: &super::uploads::BucketMode) {
    let retirable = mode.sync.lock().expect("sync lock").retirable(mode.grace);
    for name in retirable {
        match shared.files.delete(&name) {
            Ok(()) => {
                shared.cache.forget(&name.id);
                shared.metrics.blocks_retired.inc();
                info!(block = %name, "deleted a block hidden for the grace (merged elsewhere)");
            }
            Err(err) => {
                warn!(block = %name, error = %err, "deleting a hidden block failed; trying again at the next pass");
            }
        }
    }
}

/// Object-storage mode, before a merge's upload completes: polls the bucket, and says why the
/// merge must be dropped, if it must: another block would show in its place (`lost`), or it
/// would hide a block written more than half the grace ago, whose inputs may be gone
/// (`late`).
fn must_drop(
    shared: &Arc<Shared>,
    commands: &mpsc::Sender<Command>,
    name: &BlockName,
    sources: &BTreeSet<String>,
    inputs: &[Arc<BlockFile>],
) -> Result<Option<&'static str>, StoreError> {
    let Some(mode) = &shared.bucket else {
        return Ok(None);
    };
    super::sync_once(shared, commands)?;
    let known: Vec<Arc<BlockFile>> = {
        let state = shared.state();
        let mut known: Vec<Arc<BlockFile>> = state
            .blocks
            .candidates()
            .filter(|b| b.name.tenant == name.tenant && !b.is_bad())
            .cloned()
            .collect();
        known.sort_by(|a, b| a.name.cmp(&b.name));
        known
    };
    let ids: Vec<String> = sources.iter().cloned().collect();
    let leaves = super::lineage::leaves(&name.id, &ids);
    let (shown, displaced) = shared
        .duplicates
        .lock()
        .expect("duplicates lock")
        .try_merge(
            &known,
            (name, &leaves, sources.len()),
            inputs,
            &shared.metrics,
        );
    if !shown {
        info!(block = %name, "merge dropped: another block shows in its place");
        return Ok(Some("lost"));
    }
    let sync = mode.sync.lock().expect("sync lock");
    if let Some(old) = displaced.iter().find(|b| {
        sync.block_age(&b.id)
            .is_none_or(|age| age >= mode.grace / 2)
    }) {
        warn!(block = %name, displaced = %old, "merge dropped: it would hide a block older than half the compaction grace, whose inputs may be gone");
        return Ok(Some("late"));
    }
    Ok(None)
}

/// Merges `inputs` into the block `job` describes and writes it, without what `deletions`
/// remove and the series an input hides wholesale (`deletions.rs`); `None` when an input is
/// damaged (it is then marked, logged and left out of later passes), or when (object-storage
/// mode) it must not be published (`must_drop`).
fn merge(
    shared: &Arc<Shared>,
    commands: &mpsc::Sender<Command>,
    inputs: &[Arc<BlockFile>],
    job: &plan::Compaction,
    hidden: &std::collections::HashMap<String, BTreeSet<String>>,
    deletions: Vec<smolder_block::Deletion>,
) -> Result<Option<BlockFile>, StoreError> {
    let limits = Limits::default();
    let first = &inputs[0];
    let mut sources: BTreeSet<String> = BTreeSet::new();
    let mut hasher = Sha256::new();
    for input in inputs {
        hasher.update(input.name.id.as_bytes());
        hasher.update([0]);
        sources.insert(input.name.id.clone());
        sources.extend(input.sources.iter().cloned());
    }
    hasher.update(job.finest.to_le_bytes());
    // The same inputs merged under other deletions are other bytes: another name, which
    // `lineage.rs` resolves like any two merges of one range. Without deletions, the name is
    // what it always was.
    for deletion in &deletions {
        hasher.update(deletion.app.as_bytes());
        hasher.update([0]);
        hasher.update(deletion.horizon.to_le_bytes());
    }
    let digest = hasher.finalize();
    let id: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let name = BlockName {
        start: job.start,
        span: job.span,
        tenant: first.name.tenant.clone(),
        id: format!("m{id}"),
    };
    let merge_inputs: Vec<MergeInput> = inputs
        .iter()
        .map(|b| MergeInput {
            footer: b.footer.clone(),
            index: b.index.clone(),
            names: b.names.clone(),
            spans: b.spans.clone(),
            deletions: b.deletions.clone(),
        })
        .collect();
    let options = MergeOptions {
        start: job.start,
        span: job.span,
        finest: Some(job.finest),
    };
    let mut merger = match Merger::new(merge_inputs, options, limits) {
        Ok(merger) => merger,
        Err(err) => {
            warn!(block = %name, error = %err, "merge refused; left as it is");
            return Ok(None);
        }
    };
    merger.set_sources(sources.iter().cloned().collect());
    merger.set_deletions(deletions);
    merger.drop_series(|input, series| {
        hidden
            .get(&inputs[input].name.id)
            .is_some_and(|apps| apps.contains(series.app()))
    });
    let mut upload = shared.files.upload(&name)?;
    let mut len = 0u64;
    // Every series' trees, then (span profiles follow the trees) every series' spans, one
    // series at a time.
    let passes = if merger.has_spans() { 2 } else { 1 };
    for pass in 0..passes {
        for series in 0..merger.series_count() {
            let ranges = match pass {
                0 => merger.chunk_ranges(series),
                _ => merger.span_ranges(series),
            };
            let mut chunks = Vec::new();
            for (input, range) in ranges {
                match inputs[input].read(range.clone()) {
                    Ok(bytes) => chunks.push((range.start, bytes)),
                    // The bucket did not give the bytes: the next pass tries again.
                    Err(err) if unavailable(&err) => {
                        return Err(StoreError::Object {
                            what: format!("reading {} for a merge", inputs[input].name),
                            source: Box::new(err),
                        });
                    }
                    Err(err) => {
                        shared.damaged(&inputs[input], "reading for a merge", &err);
                        return Ok(None);
                    }
                }
            }
            let fetched: Vec<Fetched<'_>> = chunks
                .iter()
                .map(|(start, bytes)| Fetched::new(*start, bytes))
                .collect();
            let merged = match pass {
                0 => merger.merge_series(series, &fetched),
                _ => merger.merge_spans(series, &fetched),
            };
            if let Err(err) = merged {
                if let smolder_block::MergeError::Input { input, .. } = &err {
                    shared.damaged(&inputs[*input], "merging", &err);
                } else {
                    warn!(block = %name, error = %err, "merge failed; left as it is");
                }
                return Ok(None);
            }
            let out = merger.take_output();
            len += out.len() as u64;
            upload.write(&out);
        }
    }
    let (tail, _) = match merger.finish() {
        Ok(done) => done,
        Err(err) => {
            warn!(block = %name, error = %err, "merge failed; left as it is");
            return Ok(None);
        }
    };
    len += tail.len() as u64;
    upload.write(&tail);
    if let Some(reason) = must_drop(shared, commands, &name, &sources, inputs)? {
        // Dropped unfinished: the object never appears.
        drop(upload);
        shared
            .metrics
            .merges_abandoned
            .with_label_values(&[reason])
            .inc();
        return Ok(None);
    }
    upload.finish()?;
    shared.test_pause("merge written, not yet published");
    shared.metrics.block_bytes_written.inc_by(len);
    let block = shared.files.open_written(&name, len)?;
    Ok(Some(block))
}
