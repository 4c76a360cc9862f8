//! Compaction: merging a closed range's blocks into one, downsampling old ones, and removing
//! what merges replaced and writes left unfinished.
//!
//! Input: the published blocks and `now`; output: merged blocks, published through the writer
//! ([`Command::Publish`]), their inputs then deleted. Runs on the blocking pool, one pass at a
//! time, reading inputs one series at a time (`smolder_block::Merger`) and writing the output
//! in pieces, so a merge holds one series' chunks, never whole blocks.
//!
//! A merge's output lists its inputs (and what they still replaced) in its sources section and
//! is named after them, so the same merge repeated after a crash writes the same object, and a
//! restart that finds both the output and its inputs shows the output only.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use smolder_block::{Fetched, Limits, MergeInput, MergeOptions, Merger};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use super::files::{BlockFile, BlockName};
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
    let (blocks, generation) = {
        let state = shared.state();
        (Arc::clone(&state.blocks), state.generation)
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
            match merge(shared, &inputs, &job, &blocks.hidden) {
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
                        for input in &inputs {
                            shared.files.delete(&input.name)?;
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
                        // An input went or an app was deleted meanwhile: plan again next pass.
                        shared.files.delete(&name)?;
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

/// Merges `inputs` into the block `job` describes and writes it; `None` when an input is
/// damaged (it is then marked, logged and left out of later passes).
fn merge(
    shared: &Shared,
    inputs: &[Arc<BlockFile>],
    job: &plan::Compaction,
    hidden: &std::collections::HashMap<String, BTreeSet<String>>,
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
    merger.set_sources(sources.into_iter().collect());
    merger.drop_series(|input, series| {
        hidden
            .get(&inputs[input].name.id)
            .is_some_and(|apps| apps.contains(series.app()))
    });
    let mut upload = shared.files.upload(&name)?;
    let mut len = 0u64;
    for series in 0..merger.series_count() {
        let mut chunks = Vec::new();
        for (input, range) in merger.chunk_ranges(series) {
            match inputs[input].read(range.clone()) {
                Ok(bytes) => chunks.push((range.start, bytes)),
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
        if let Err(err) = merger.merge_series(series, &fetched) {
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
    let (tail, _) = match merger.finish() {
        Ok(done) => done,
        Err(err) => {
            warn!(block = %name, error = %err, "merge failed; left as it is");
            return Ok(None);
        }
    };
    len += tail.len() as u64;
    upload.write(&tail);
    upload.finish()?;
    shared.test_pause("merge written, not yet published");
    shared.metrics.block_bytes_written.inc_by(len);
    let block = shared
        .files
        .open_block(&name, len)
        .map_err(|err| StoreError::Object {
            what: format!("reading back {name}"),
            source: Box::new(err),
        })?;
    Ok(Some(block))
}
