//! The read side: series, merged trees, timelines, label listings and apps, from the head (under
//! the state lock, briefly) and from a snapshot of the published blocks (without a lock).
//!
//! A block that turns out to be damaged while it is read is named in the log, counted, and left
//! out from then on; the answer is built from the rest. A block whose bytes the bucket did not
//! give (object-storage mode, a block not in the local cache) is not damaged: the read fails
//! with the bucket's error and the next one tries again. A read under limits (`store::limits`)
//! stops between series once cancelled or past its series limit.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use smolder_block::{Accumulator, Fetched, Limits, SeriesChunk, SeriesEntry, SpanChunk};
use smolder_common::series::NAME_LABEL;
use smolder_common::{Aggregation, ProfileMeta, Selector, Series, SpanId, Tree};

use super::cache::ChunkError;
use super::files::{BlockFile, BlockSet, unavailable};
use super::head::HeadSeries;
use super::{Shared, plan};
use crate::store::limits::stop;
use crate::store::plan::TimelinePlan;
use crate::store::{AppInfo, Merged, MergedTrees, SeriesInfo, StoreError, TimeRange, Timelines};
use crate::tenant::Tenant;

/// Reads of one block closer than this are read as one.
const COALESCE: u64 = 64 << 10;

/// What is known of each series seen, merged across the head and blocks.
#[derive(Default)]
struct Infos(BTreeMap<Series, SeriesInfo>);

impl Infos {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn add(&mut self, series: &Series, meta: &ProfileMeta, first: u64, last: u64) {
        match self.0.get_mut(series) {
            Some(info) => {
                if last >= info.last_seen {
                    info.meta = meta.clone();
                }
                info.first_seen = info.first_seen.min(first);
                info.last_seen = info.last_seen.max(last);
            }
            None => {
                self.0.insert(
                    series.clone(),
                    SeriesInfo {
                        series: series.clone(),
                        meta: meta.clone(),
                        first_seen: first,
                        last_seen: last,
                    },
                );
            }
        }
    }

    fn into_vec(self) -> Vec<SeriesInfo> {
        self.0.into_values().collect()
    }
}

fn overlaps(first: u64, last: u64, finest: u64, from: u64, until: u64) -> bool {
    first < until && last.saturating_add(finest) > from
}

/// Calls `f` with every head series of `tenant` with data in `[from, until)` (the own head's and
/// the remote head's), under the lock, and returns the published blocks.
fn head_then_blocks(
    shared: &Shared,
    tenant: &Tenant,
    from: u64,
    until: u64,
    mut f: impl FnMut(&super::head::HeadRange, &Series, &HeadSeries),
) -> Arc<BlockSet> {
    let state = shared.state();
    // The own head, then other writers' records (object-storage mode): each marker is in one.
    for head in [&state.head, &state.remote.head] {
        for range in head.ranges_of(tenant, plan::HEAD_SPAN, from, until) {
            for (series, data) in &range.series {
                if overlaps(data.first, data.last, plan::BUCKET, from, until) {
                    f(range, series, data);
                }
            }
        }
    }
    Arc::clone(&state.blocks)
}

/// The series of `block` that `selector` matches with data in `[from, until)`, without those
/// an app deletion hides.
fn selected<'b>(
    blocks: &BlockSet,
    block: &'b BlockFile,
    selector: &Selector,
    from: u64,
    until: u64,
) -> Vec<(usize, &'b SeriesEntry)> {
    if blocks.hides(&block.name.id, selector.app()) {
        return Vec::new();
    }
    block
        .index
        .select(selector, from, until)
        .into_iter()
        .map(|p| (p, &block.index.series()[p]))
        .collect()
}

/// Every series of `block` with data in `[from, until)`, of `app` when given, without those an
/// app deletion hides.
fn all_series<'b>(
    blocks: &BlockSet,
    block: &'b BlockFile,
    app: Option<&str>,
    from: u64,
    until: u64,
) -> impl Iterator<Item = &'b SeriesEntry> {
    let finest = block.finest();
    let hidden = blocks
        .hidden
        .get(&block.name.id)
        .cloned()
        .unwrap_or_default();
    let app = app.map(str::to_owned);
    block.index.series().iter().filter(move |e| {
        overlaps(e.first_bucket, e.last_bucket, finest, from, until)
            && app.as_deref().is_none_or(|a| e.series.app() == a)
            && !hidden.contains(e.series.app())
    })
}

/// Series `selector` matches with data in `range`.
pub(super) fn series(
    shared: &Shared,
    tenant: &Tenant,
    selector: &Selector,
    range: TimeRange,
) -> Vec<SeriesInfo> {
    let (from, until) = range.aligned(plan::BUCKET);
    let mut infos = Infos::default();
    let blocks = head_then_blocks(shared, tenant, from, until, |_, series, data| {
        if selector.matches(series) && !stop(infos.len()) {
            infos.add(series, &data.meta, data.first, data.last);
        }
    });
    'blocks: for block in blocks.overlapping(tenant, from, until) {
        for (_, entry) in selected(&blocks, block, selector, from, until) {
            if stop(infos.len()) {
                break 'blocks;
            }
            infos.add(
                &entry.series,
                &entry.meta,
                entry.first_bucket,
                entry.last_bucket,
            );
        }
    }
    // The last series added may be the one past the limit.
    stop(infos.len());
    infos.into_vec()
}

/// The trees `selector` matches over `range` widened to `resolution`.
pub(super) fn merge(
    shared: &Shared,
    tenant: &Tenant,
    selector: &Selector,
    range: TimeRange,
    resolution: u64,
) -> Result<Merged, StoreError> {
    let (from, until) = range.aligned(resolution);
    let mut merged = Merged::default();
    let mut infos = Infos::default();
    let blocks = head_then_blocks(shared, tenant, from, until, |head, series, data| {
        if !selector.matches(series) || stop(infos.len()) {
            return;
        }
        if let Some((tree, writes)) = head.sum(data, from, until) {
            let part = part(&mut merged, &data.meta);
            part.tree.merge(&tree);
            part.writes = part.writes.saturating_add(writes);
            infos.add(series, &data.meta, data.first, data.last);
        }
    });
    'blocks: for block in blocks.overlapping(tenant, from, until) {
        for (position, entry) in selected(&blocks, block, selector, from, until) {
            if stop(infos.len()) {
                break 'blocks;
            }
            match read_series(
                shared,
                block,
                position,
                (from, until),
                blocks.skipped(&block.name.id),
                part(&mut merged, &entry.meta),
            ) {
                Ok(()) => infos.add(
                    &entry.series,
                    &entry.meta,
                    entry.first_bucket,
                    entry.last_bucket,
                ),
                Err(Damage::Unavailable(err)) => return Err(unavailable_block(block, err)),
                Err(damage) => {
                    shared.damaged(block, "reading", &damage);
                    break;
                }
            }
        }
    }
    // The last series added may be the one past the limit.
    stop(infos.len());
    merged.series = infos.into_vec();
    Ok(merged)
}

/// The samples of spans `wanted` (sorted) in the series `selector` matches over `range`: from
/// the head's span trees and the blocks' span chunks, finest buckets only.
pub(super) fn merge_spans(
    shared: &Shared,
    tenant: &Tenant,
    selector: &Selector,
    range: TimeRange,
    wanted: &[SpanId],
) -> Result<Merged, StoreError> {
    let (from, until) = range.aligned(plan::BUCKET);
    let mut merged = Merged::default();
    let mut infos = Infos::default();
    let blocks = head_then_blocks(shared, tenant, from, until, |head, series, data| {
        if !selector.matches(series) || stop(infos.len()) {
            return;
        }
        if let Some((tree, writes)) = head.sum_spans(data, from, until, wanted) {
            let part = part(&mut merged, &data.meta);
            part.tree.merge(&tree);
            part.writes = part.writes.saturating_add(writes);
            infos.add(series, &data.meta, data.first, data.last);
        }
    });
    'blocks: for block in blocks.overlapping(tenant, from, until) {
        if block.spans.is_empty() {
            continue;
        }
        for (position, entry) in selected(&blocks, block, selector, from, until) {
            if stop(infos.len()) {
                break 'blocks;
            }
            if block.spans.chunk_range(position).is_none() {
                continue;
            }
            let mut tree = Tree::new();
            let skip = blocks.skipped(&block.name.id);
            match read_spans(block, position, (from, until), wanted, skip, &mut tree) {
                Ok(0) => {}
                Ok(writes) => {
                    let part = part(&mut merged, &entry.meta);
                    part.tree.merge(&tree);
                    part.writes = part.writes.saturating_add(writes);
                    infos.add(
                        &entry.series,
                        &entry.meta,
                        entry.first_bucket,
                        entry.last_bucket,
                    );
                }
                Err(Damage::Unavailable(err)) => return Err(unavailable_block(block, err)),
                Err(damage) => {
                    shared.damaged(block, "reading span profiles", &damage);
                    break;
                }
            }
        }
    }
    // The last series added may be the one past the limit.
    stop(infos.len());
    merged.series = infos.into_vec();
    Ok(merged)
}

/// Adds the spans `wanted` of series `position` of `block` over `[from, until)` to `tree`:
/// its span chunk's header, then the bodies of the buckets in the range, in one read; returns
/// how many bucket entries had any of them.
fn read_spans(
    block: &BlockFile,
    position: usize,
    (from, until): (u64, u64),
    wanted: &[SpanId],
    skip: Option<&HashSet<u32>>,
    tree: &mut Tree,
) -> Result<u64, Damage> {
    let damage = |err: &dyn std::fmt::Display| Damage::Damaged(err.to_string());
    let header = block
        .spans
        .chunk_header_range(position)
        .expect("a series with a span chunk");
    let bytes = block.read(header.clone()).map_err(Damage::io)?;
    let chunk = SpanChunk::decode(
        &block.index,
        &block.spans,
        position,
        &Fetched::new(header.start, &bytes),
        &Limits::default(),
    )
    .map_err(|e| damage(&e))?;
    let planned = chunk.plan(from, until);
    if planned.is_empty() {
        return Ok(0);
    }
    let bodies = chunk.entry_range(planned.start).start..chunk.entry_range(planned.end - 1).end;
    let bytes = block.read(bodies.clone()).map_err(Damage::io)?;
    let none = HashSet::new();
    chunk
        .read_range_without(
            (from, until),
            wanted,
            skip.unwrap_or(&none),
            &Fetched::new(bodies.start, &bytes),
            &block.names,
            tree,
        )
        .map_err(|e| damage(&e))
}

fn part<'m>(merged: &'m mut Merged, meta: &ProfileMeta) -> &'m mut MergedTrees {
    match meta.aggregation {
        Aggregation::Average => &mut merged.average,
        Aggregation::Sum => &mut merged.sum,
    }
}

/// Why a block could not be read.
enum Damage {
    /// Its bytes are damaged: the block is left out from then on.
    Damaged(String),
    /// The bucket did not give its bytes: this read fails, the block is not damaged.
    Unavailable(std::io::Error),
}

impl Damage {
    fn io(err: std::io::Error) -> Damage {
        if unavailable(&err) {
            Damage::Unavailable(err)
        } else {
            Damage::Damaged(err.to_string())
        }
    }
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::Damaged(reason) => f.write_str(reason),
            Damage::Unavailable(err) => err.fmt(f),
        }
    }
}

impl From<ChunkError> for Damage {
    fn from(err: ChunkError) -> Damage {
        match err {
            ChunkError::Io(err) => Damage::io(err),
            ChunkError::Block(err) => Damage::Damaged(err.to_string()),
        }
    }
}

/// The error of a read that could not have `block`'s bytes from the bucket.
fn unavailable_block(block: &BlockFile, err: std::io::Error) -> StoreError {
    StoreError::Object {
        what: format!("reading {}", block.name),
        source: Box::new(err),
    }
}

/// Adds series `position` of `block` over `[from, until)` to `out`: the fewest trees covering
/// the range, read with as few reads as their layout allows; without the batches at the
/// positions `skip` names, when another block holds them too.
fn read_series(
    shared: &Shared,
    block: &BlockFile,
    position: usize,
    (from, until): (u64, u64),
    skip: Option<&HashSet<u32>>,
    out: &mut MergedTrees,
) -> Result<(), Damage> {
    let chunk = shared.cache.chunk(block, position)?;
    let planned = match skip {
        None => chunk.plan(from, until),
        Some(skip) => finest_without(&chunk, from, until, skip),
    };
    if planned.is_empty() {
        return Ok(());
    }
    let mut sum = Accumulator::new(chunk.shape());
    let mut writes = 0u64;
    let mut at = 0;
    while at < planned.len() {
        if stop(0) {
            return Ok(());
        }
        // A run of trees close together, read at once.
        let first = chunk.tree_range(planned[at]);
        let mut end = at + 1;
        let mut last = first.end;
        while end < planned.len() {
            let next = chunk.tree_range(planned[end]);
            if next.start < last || next.start - last > COALESCE {
                break;
            }
            last = next.end;
            end += 1;
        }
        let bytes = block.read(first.start..last).map_err(Damage::io)?;
        let fetched = Fetched::new(first.start, &bytes);
        for &entry in &planned[at..end] {
            let tree = chunk
                .read_tree(entry, &fetched)
                .map_err(|err| Damage::Damaged(err.to_string()))?;
            sum.add(&tree);
            writes = writes.saturating_add(chunk.entries()[entry].writes);
        }
        at = end;
    }
    sum.merge_into(chunk.shape(), &block.names, &mut out.tree)
        .map_err(|err| Damage::Damaged(err.to_string()))?;
    out.writes = out.writes.saturating_add(writes);
    Ok(())
}

/// The finest trees of `chunk` in `[from, until)` but the separable ones of the batches `skip`
/// names: a rollup sums every batch, so a block with a batch to leave out is read finest.
pub(super) fn finest_without(
    chunk: &SeriesChunk,
    from: u64,
    until: u64,
    skip: &HashSet<u32>,
) -> Vec<usize> {
    chunk
        .entries()
        .iter()
        .enumerate()
        .filter(|(_, e)| e.level == 0 && e.bucket < until && e.bucket >= from)
        .filter(|(_, e)| !(e.separable && e.markers.iter().all(|m| skip.contains(m))))
        .map(|(at, _)| at)
        .collect()
}

/// Totals per step, per value of `group_by`, from bucket totals: the head's writes and the
/// blocks' tree tables, never their trees.
pub(super) fn timelines(
    shared: &Shared,
    tenant: &Tenant,
    selector: &Selector,
    range: TimeRange,
    step: u64,
    group_by: Option<&str>,
) -> Result<Timelines, StoreError> {
    let (from, until) = range.aligned(plan::BUCKET);
    let plan = TimelinePlan::new(from, until, step);
    let mut groups: BTreeMap<Option<String>, Vec<u64>> = BTreeMap::new();
    let group = |series: &Series| {
        group_by
            .and_then(|label| series.labels().get(label))
            .map(str::to_owned)
    };
    let blocks = head_then_blocks(shared, tenant, from, until, |_, series, data| {
        if !selector.matches(series) || stop(0) {
            return;
        }
        let points = groups
            .entry(group(series))
            .or_insert_with(|| vec![0; plan.points]);
        for entry in &data.entries {
            if let Some(slot) = plan.slot(entry.bucket).filter(|_| entry.bucket >= from) {
                points[slot] = points[slot].saturating_add(entry.total);
            }
        }
    });
    'blocks: for block in blocks.overlapping(tenant, from, until) {
        let levels = &block.index.meta().levels;
        let skip = blocks.skipped(&block.name.id);
        let level = if skip.is_some() {
            0
        } else {
            plan.level(levels) as u8
        };
        for (position, entry) in selected(&blocks, block, selector, from, until) {
            if stop(0) {
                break 'blocks;
            }
            let chunk = match shared.cache.chunk(block, position).map_err(Damage::from) {
                Ok(chunk) => chunk,
                Err(Damage::Unavailable(err)) => return Err(unavailable_block(block, err)),
                Err(damage) => {
                    shared.damaged(block, "reading", &damage);
                    break;
                }
            };
            let points = groups
                .entry(group(&entry.series))
                .or_insert_with(|| vec![0; plan.points]);
            for tree in chunk.entries().iter().filter(|e| e.level == level) {
                if tree.bucket < from
                    || skip.is_some_and(|skip| {
                        tree.separable && tree.markers.iter().all(|m| skip.contains(m))
                    })
                {
                    continue;
                }
                if let Some(slot) = plan.slot(tree.bucket) {
                    points[slot] = points[slot].saturating_add(tree.total);
                }
            }
        }
    }
    Ok(Timelines {
        start: plan.start,
        step: plan.step,
        points: plan.points,
        groups,
    })
}

/// Label names of series with data in `range`, of `app` when given.
pub(super) fn label_names(
    shared: &Shared,
    tenant: &Tenant,
    app: Option<&str>,
    range: TimeRange,
) -> Vec<String> {
    let (from, until) = range.aligned(plan::BUCKET);
    let mut names = BTreeSet::new();
    let blocks = head_then_blocks(shared, tenant, from, until, |_, series, _| {
        if app.is_none_or(|a| series.app() == a) {
            names.extend(series.labels().iter().map(|(n, _)| n.to_owned()));
        }
    });
    for block in blocks.overlapping(tenant, from, until) {
        for entry in all_series(&blocks, block, app, from, until) {
            names.extend(entry.series.labels().iter().map(|(n, _)| n.to_owned()));
        }
    }
    names.into_iter().collect()
}

/// Values of label `name` among series with data in `range` that `selector` matches.
pub(super) fn label_values(
    shared: &Shared,
    tenant: &Tenant,
    name: &str,
    selector: Option<&Selector>,
    range: TimeRange,
) -> Vec<String> {
    let (from, until) = range.aligned(plan::BUCKET);
    let mut values = BTreeSet::new();
    let mut add = |series: &Series| {
        if selector.is_some_and(|s| !s.matches(series)) {
            return;
        }
        if name == NAME_LABEL {
            values.insert(series.app().to_owned());
        } else if let Some(value) = series.labels().get(name) {
            values.insert(value.to_owned());
        }
    };
    let blocks = head_then_blocks(shared, tenant, from, until, |_, series, _| add(series));
    for block in blocks.overlapping(tenant, from, until) {
        for entry in all_series(&blocks, block, selector.map(Selector::app), from, until) {
            add(&entry.series);
        }
    }
    values.into_iter().collect()
}

/// Every app with the metadata of its most recently written series.
pub(super) fn apps(shared: &Shared, tenant: &Tenant) -> Vec<AppInfo> {
    let mut apps: BTreeMap<String, (u64, ProfileMeta)> = BTreeMap::new();
    let mut add = |series: &Series, meta: &ProfileMeta, last: u64| {
        let newest = apps.get(series.app()).is_none_or(|(seen, _)| last >= *seen);
        if newest {
            apps.insert(series.app().to_owned(), (last, meta.clone()));
        }
    };
    let blocks = head_then_blocks(shared, tenant, 0, u64::MAX, |_, series, data| {
        add(series, &data.meta, data.last);
    });
    for block in blocks.overlapping(tenant, 0, u64::MAX) {
        for entry in all_series(&blocks, block, None, 0, u64::MAX) {
            add(&entry.series, &entry.meta, entry.last_bucket);
        }
    }
    apps.into_iter()
        .map(|(name, (_, meta))| AppInfo { name, meta })
        .collect()
}
