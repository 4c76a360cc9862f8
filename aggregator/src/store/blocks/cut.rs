//! Cutting closed head ranges into blocks, off the writer thread.
//!
//! Input: `now`; output: one block per tenant and closed head range, published through the
//! writer. A pass asks the writer to seal the ranges due ([`Command::Seal`]: moved aside in the
//! head, still read, while writes for them start new ranges), builds and writes each block on
//! the blocking pool, then asks the writer to publish a range's blocks
//! ([`Command::PublishCut`]), which removes the range's writes from its log only then: the
//! block is durable (fsynced, renamed in, its directory fsynced) before any of its writes
//! leaves the head, so a crash in between keeps both, and the restart's replay drops the
//! records a block holds. Called by [`super::BlockStore::cut`], one pass at a time; appends
//! never wait for a block to be built.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use smolder_block::BlockBuilder;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::files::{BlockFile, BlockName};
use super::head::{HeadRange, SealedRange};
use super::writer::Command;
use super::{Shared, plan};
use crate::store::StoreError;
use crate::tenant::Tenant;

/// One cut pass as of `now`; returns how many blocks it published. A range whose block
/// cannot be built or written stays sealed (and read) and is tried again by the next pass.
pub(super) fn pass(
    shared: &Shared,
    commands: &mpsc::Sender<Command>,
    now: SystemTime,
) -> Result<u64, StoreError> {
    let sealed = ask(commands, |reply| Command::Seal { now, reply })?;
    let mut by_start: BTreeMap<u64, Vec<SealedRange>> = BTreeMap::new();
    for range in sealed {
        by_start.entry(range.start).or_default().push(range);
    }
    let mut cut = 0;
    for (start, ranges) in by_start {
        let started = Instant::now();
        let _span = tracing::info_span!("cut", start).entered();
        let mut blocks = Vec::with_capacity(ranges.len());
        for sealed in &ranges {
            match write_block(shared, &sealed.tenant, start, &sealed.range) {
                Ok(block) => blocks.push(Arc::new(block)),
                Err(err) => {
                    let written: Vec<BlockName> =
                        blocks.iter().map(|block| block.name.clone()).collect();
                    delete_unpublished(shared, &written);
                    return Err(err);
                }
            }
        }
        shared.test_pause("cut written, head not yet deleted");
        let written: Vec<BlockName> = blocks.iter().map(|block| block.name.clone()).collect();
        cut += match ask(commands, |reply| Command::PublishCut {
            start,
            blocks,
            reply,
        }) {
            Ok(count) => count,
            // The writer fails a publication only before it publishes or removes anything (a
            // failed log trim after that is logged, not returned). Without the writer, whether
            // the blocks were published is unknown: they stay, and so does the head's log.
            Err(StoreError::Closed) => return Err(StoreError::Closed),
            Err(err) => {
                delete_unpublished(shared, &written);
                return Err(err);
            }
        };
        shared
            .metrics
            .cut_duration
            .observe(started.elapsed().as_secs_f64());
    }
    Ok(cut)
}

/// Deletes blocks of a pass that were written but not published, nothing of the head removed:
/// a restart would load them beside the retry's blocks.
fn delete_unpublished(shared: &Shared, blocks: &[BlockName]) {
    for name in blocks {
        if let Err(err) = shared.files.delete(name) {
            warn!(block = %name, error = %err, "deleting an unpublished cut block failed");
        }
    }
}

/// Builds the block of `tenant`'s sealed range at `start`, writes it durably and opens it.
pub(super) fn write_block(
    shared: &Shared,
    tenant: &Tenant,
    start: u64,
    range: &HeadRange,
) -> Result<BlockFile, StoreError> {
    let mut builder = BlockBuilder::new(tenant.as_str(), start, plan::HEAD_SPAN, plan::BUCKET)
        .expect("the head span climbs by tens from 10 s");
    // What the head still holds of a deleted app was written from the horizon on; listing the
    // deletions tells readers the block holds nothing older (`deletions.rs`).
    builder.set_deletions(shared.state().deletions.for_block(tenant, start));
    for (series, data) in &range.series {
        range
            .add_to(&mut builder, series, data)
            .expect("a head range holds only its own buckets");
    }
    let (bytes, report) = builder.finish().map_err(|err| StoreError::Engine {
        source: Box::new(err),
    })?;
    let name = BlockName {
        start,
        span: plan::HEAD_SPAN,
        tenant: tenant.clone(),
        id: format!("{:016x}", rand::random::<u64>()),
    };
    let len = bytes.len() as u64;
    shared.files.put(&name, bytes)?;
    let block = shared.files.open_written(&name, len)?;
    shared.metrics.blocks_cut.inc();
    shared.metrics.block_bytes_written.inc_by(len);
    debug!(block = %name, series = report.series, nodes = report.nodes, spans = report.spans, bytes = len, "head range cut");
    Ok(block)
}

/// Sends a command to the writer from the blocking pool and waits for its answer.
fn ask<T>(
    commands: &mpsc::Sender<Command>,
    command: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Command,
) -> Result<T, StoreError> {
    let (reply, answer) = oneshot::channel();
    commands
        .blocking_send(command(reply))
        .map_err(|_| StoreError::Closed)?;
    answer.blocking_recv().map_err(|_| StoreError::Closed)?
}
