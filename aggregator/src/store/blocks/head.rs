//! The head in memory: every acknowledged write not yet in a block, per tenant and head range
//! (1000 s, the span of a cut block), per series as self values over one shape.
//!
//! Input: [`Record`]s, as the writer applies them and as a restart replays them from the head
//! database (`wal.rs`). Output: what reads ask of recent data (series, sums over a range,
//! totals) and, when a range is cut, one tree per batch and bucket for the block builder.
//! Owned by the store's state lock; the writer thread is its only writer.
//!
//! A range being cut is sealed: moved aside, shared with the cut building its block off the
//! writer thread, and still read until the block is published; writes that arrive for it
//! meanwhile start a new range of the same start, cut next time.
//!
//! A series keeps the union of its trees' nodes once (parent and frame per node, frames named
//! in the range's one name table) and each write as `(node, self value)` pairs: about a fifth
//! of a tree's nodes carry a self value, so the head holds a 10 s tree of 11,000 nodes in about
//! 30 KB rather than the 400 KB of a `Tree`. Every write keeps its marker and stays apart, so
//! that a cut block keeps batches separable (see the block format).
//!
//! A write's span trees are kept the same way, beside its values: per span, self values over
//! the series' shape. At most `store.max-spans-per-bucket` of them per series and 10 s bucket
//! (the largest first); the rest are dropped, and counted by the writer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use smolder_block::Marker;
use smolder_common::tree::NodeRef;
use smolder_common::{FrameId, ProfileMeta, Series, SpanId, SpanTrees, Tree};

use super::StoreMetrics;
use super::wal::Record;
use crate::tenant::Tenant;

/// The head: ranges by tenant and start.
#[derive(Default)]
pub(crate) struct Head {
    ranges: BTreeMap<(Tenant, u64), HeadRange>,
    /// Ranges being cut, at most one per tenant and start.
    sealed: BTreeMap<(Tenant, u64), Sealed>,
}

/// A range being cut: shared with the cut building its block, copied before it changes (an
/// app deletion, a copy another aggregator cut).
struct Sealed {
    range: Arc<HeadRange>,
}

/// What [`Head::seal`] did.
pub(crate) struct Sealing {
    /// Every sealed range: what the cut builds its blocks from.
    pub(crate) ranges: Vec<SealedRange>,
    /// The starts sealed now (every tenant's range at each).
    pub(crate) starts: Vec<u64>,
    /// How many of them were sealed early, for the memory budget.
    pub(crate) early: usize,
}

/// A range sealed for a cut: what the cut builds its block from.
pub(crate) struct SealedRange {
    pub(crate) tenant: Tenant,
    pub(crate) start: u64,
    pub(crate) range: Arc<HeadRange>,
}

/// One tenant's writes in one head range.
#[derive(Clone, Default)]
pub(crate) struct HeadRange {
    names: Vec<String>,
    ids: HashMap<String, u32, foldhash::fast::RandomState>,
    pub(crate) series: BTreeMap<Series, HeadSeries>,
    /// About how much memory it holds ([`HeadRange::weigh`]), kept up to date as it grows.
    bytes: usize,
}

/// One series' writes in a head range.
#[derive(Clone)]
pub(crate) struct HeadSeries {
    /// The metadata of its newest data.
    pub(crate) meta: ProfileMeta,
    meta_bucket: u64,
    /// Unix seconds of its first and last 10 s bucket.
    pub(crate) first: u64,
    pub(crate) last: u64,
    /// The shape: the union of its trees' nodes, the root first.
    nodes: Vec<ShapeNode>,
    /// The children of parents with more than [`WIDE`] of them, by (parent, frame).
    wide: HashMap<(u32, u32), u32, foldhash::fast::RandomState>,
    pub(crate) entries: Vec<Entry>,
}

/// One node of a series' shape. Children are found by walking the parent's child list (a
/// node's first child usually follows it, since trees add their nodes depth first), which
/// stays in cache where a hash lookup per node missed it: adding a tree does one lookup per
/// node, and the shape of a busy series outgrows the caches.
#[derive(Clone)]
struct ShapeNode {
    parent: u32,
    /// The frame's id in the range's name table (`u32::MAX` for the root).
    frame: u32,
    /// `NONE` when it has none.
    first_child: u32,
    next_sibling: u32,
    children: u32,
}

/// "No node": the root is nobody's child or sibling.
const NONE: u32 = 0;

/// Parents with more children than this find a child in [`HeadSeries::wide`] rather than by
/// walking their list (roots and dispatchers can have thousands).
const WIDE: u32 = 8;

/// One write's data of one series in one bucket.
#[derive(Clone)]
pub(crate) struct Entry {
    /// Unix seconds of its 10 s bucket.
    pub(crate) bucket: u64,
    pub(crate) marker: Marker,
    /// Profiles it sums.
    pub(crate) writes: u64,
    /// Its total.
    pub(crate) total: u64,
    values: Vec<(u32, u64)>,
    /// Its span trees by span id: self values over the series' shape.
    spans: Vec<(SpanId, Vec<(u32, u64)>)>,
}

impl Entry {
    /// About how much memory its values and spans hold (beside the entry itself).
    fn weight(&self) -> usize {
        let values = |values: &Vec<(u32, u64)>| values.capacity() * size_of::<(u32, u64)>();
        values(&self.values)
            + self.spans.capacity() * size_of::<(SpanId, Vec<(u32, u64)>)>()
            + self.spans.iter().map(|(_, v)| values(v)).sum::<usize>()
    }
}

/// What adding a record did with its span trees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SpansAdded {
    /// Span trees kept.
    pub(crate) kept: u64,
    /// Span trees past `store.max-spans-per-bucket`, dropped.
    pub(crate) dropped: u64,
}

impl Head {
    /// Adds a record of head range `range`, keeping at most `max_spans` span trees per series
    /// and bucket.
    pub(crate) fn add(&mut self, range: u64, record: &Record, max_spans: usize) -> SpansAdded {
        if record.profiles.is_empty() {
            // All of it deleted (`deletions.rs`): no range for nothing.
            return SpansAdded::default();
        }
        let head = self
            .ranges
            .entry((record.tenant.clone(), range))
            .or_default();
        let mut added = SpansAdded::default();
        for profile in &record.profiles {
            let spans = head.add(
                profile.bucket,
                &record.marker,
                &profile.profile,
                &profile.spans,
                max_spans,
            );
            added.kept += spans.kept;
            added.dropped += spans.dropped;
        }
        added
    }

    /// The ranges of `tenant` overlapping `[from, until)`, given the range span, sealed ones
    /// included.
    pub(crate) fn ranges_of<'h>(
        &'h self,
        tenant: &Tenant,
        span: u64,
        from: u64,
        until: u64,
    ) -> impl Iterator<Item = &'h HeadRange> + use<'h> {
        let wanted = {
            let tenant = tenant.clone();
            move |(t, start): &(Tenant, u64)| *t == tenant && *start < until && start + span > from
        };
        let live = self
            .ranges
            .iter()
            .filter({
                let wanted = wanted.clone();
                move |(key, _)| wanted(key)
            })
            .map(|(_, range)| range);
        let sealed = self
            .sealed
            .iter()
            .filter(move |(key, _)| wanted(key))
            .map(|(_, sealed)| &*sealed.range);
        live.chain(sealed)
    }

    /// Seals, for a cut, every live range of each start `due` accepts and, when the live ranges
    /// left hold more than `budget` bytes, of the starts holding the most until they hold at
    /// most half of it: cut early, a range's writes so far make a block of their own, and
    /// later writes to it start a new range. A start is sealed whole, every tenant's range at
    /// once (they share a log, `wal.rs`), and only when none of its ranges is sealed already
    /// (its cut has not published yet). Returns what it sealed now and every sealed range,
    /// those of an earlier cut that failed included.
    pub(crate) fn seal(&mut self, due: impl Fn(u64) -> bool, budget: usize) -> Sealing {
        let busy: BTreeSet<u64> = self.sealed.keys().map(|(_, start)| *start).collect();
        let mut live: BTreeMap<u64, usize> = BTreeMap::new();
        for ((_, start), range) in &self.ranges {
            *live.entry(*start).or_default() += range.bytes;
        }
        let mut starts: Vec<u64> = live
            .keys()
            .copied()
            .filter(|start| due(*start) && !busy.contains(start))
            .collect();
        let mut left: usize = live
            .iter()
            .filter(|(start, _)| !starts.contains(start))
            .map(|(_, bytes)| bytes)
            .sum();
        let mut early = 0;
        if left > budget {
            let mut largest: Vec<(u64, usize)> = live
                .iter()
                .filter(|(start, _)| !starts.contains(start) && !busy.contains(start))
                .map(|(start, bytes)| (*start, *bytes))
                .collect();
            largest.sort_by_key(|(_, bytes)| std::cmp::Reverse(*bytes));
            for (start, bytes) in largest {
                if left <= budget / 2 {
                    break;
                }
                starts.push(start);
                left -= bytes;
                early += 1;
            }
        }
        let keys: Vec<(Tenant, u64)> = self
            .ranges
            .keys()
            .filter(|(_, start)| starts.contains(start))
            .cloned()
            .collect();
        for key in keys {
            if let Some(range) = self.ranges.remove(&key) {
                let sealed = Sealed {
                    range: Arc::new(range),
                };
                self.sealed.insert(key, sealed);
            }
        }
        let ranges = self
            .sealed
            .iter()
            .map(|((tenant, start), sealed)| SealedRange {
                tenant: tenant.clone(),
                start: *start,
                range: Arc::clone(&sealed.range),
            })
            .collect();
        Sealing {
            ranges,
            starts,
            early,
        }
    }

    /// Whether the range of `tenant` at `start` is sealed (a cut builds its block).
    pub(crate) fn is_sealed(&self, tenant: &Tenant, start: u64) -> bool {
        self.sealed.contains_key(&(tenant.clone(), start))
    }

    /// Drops the sealed ranges at `start`, every tenant's, their blocks published.
    pub(crate) fn unseal(&mut self, start: u64) {
        self.sealed.retain(|(_, s), _| *s != start);
    }

    /// The series of `app` of `tenant` with entries in buckets before `horizon`: what
    /// [`Head::delete`] would drop from.
    pub(crate) fn deletable(&self, tenant: &Tenant, app: &str, horizon: u64) -> BTreeSet<Series> {
        let live = self.ranges.iter();
        let sealed = self.sealed.iter().map(|(key, s)| (key, &*s.range));
        live.chain(sealed)
            .filter(|((t, _), _)| t == tenant)
            .flat_map(|(_, range)| &range.series)
            .filter(|(series, data)| {
                series.app() == app && data.entries.iter().any(|e| e.bucket < horizon)
            })
            .map(|(series, _)| series.clone())
            .collect()
    }

    /// Drops the entries of `app` of `tenant` in buckets before `horizon` (an app deletion,
    /// `deletions.rs`), from sealed ranges too (copied first: a cut may be building its block
    /// from one, and that block hides the app wholesale, not listing the deletion); returns
    /// the series that lost entries.
    pub(crate) fn delete(&mut self, tenant: &Tenant, app: &str, horizon: u64) -> BTreeSet<Series> {
        let mut deleted = BTreeSet::new();
        let gone = |series: &Series, entry: &Entry| series.app() == app && entry.bucket < horizon;
        for ((t, _), range) in &mut self.ranges {
            if t == tenant {
                range.drop_entries(gone, &mut deleted);
            }
        }
        self.ranges.retain(|_, range| !range.series.is_empty());
        for ((t, _), sealed) in &mut self.sealed {
            let touched = *t == *tenant
                && sealed
                    .range
                    .series
                    .iter()
                    .any(|(series, data)| data.entries.iter().any(|e| gone(series, e)));
            if touched {
                Arc::make_mut(&mut sealed.range).drop_entries(gone, &mut deleted);
            }
        }
        deleted
    }

    /// Drops every write `covered` says a block holds (given its tenant, head range and marker:
    /// a copy another aggregator stored and cut, object-storage mode), looking only in the
    /// ranges `wanted` names; returns how many entries went. A sealed range is copied first: a
    /// cut may be building its block from it, and publishes it all the same (reads then leave
    /// out the block's second copy).
    pub(crate) fn forget(
        &mut self,
        wanted: impl Fn(&Tenant, u64) -> bool,
        covered: impl Fn(&Tenant, u64, &Marker) -> bool,
    ) -> usize {
        let mut dropped = 0;
        for ((tenant, start), range) in &mut self.ranges {
            if wanted(tenant, *start) {
                dropped += range.forget(|marker| covered(tenant, *start, marker));
            }
        }
        self.ranges.retain(|_, range| !range.series.is_empty());
        for ((tenant, start), sealed) in &mut self.sealed {
            if !wanted(tenant, *start) {
                continue;
            }
            let held = sealed.range.series.values().any(|series| {
                series
                    .entries
                    .iter()
                    .any(|e| covered(tenant, *start, &e.marker))
            });
            if held {
                dropped += Arc::make_mut(&mut sealed.range).forget(|m| covered(tenant, *start, m));
            }
        }
        dropped
    }

    /// Series in the head, sealed ranges included.
    pub(crate) fn series_count(&self) -> usize {
        let live: usize = self.ranges.values().map(|r| r.series.len()).sum();
        let sealed: usize = self.sealed.values().map(|s| s.range.series.len()).sum();
        live + sealed
    }

    /// About how much memory the head holds, sealed ranges included.
    pub(crate) fn bytes(&self) -> usize {
        let live: usize = self.ranges.values().map(|r| r.bytes).sum();
        let sealed: usize = self.sealed.values().map(|s| s.range.bytes).sum();
        live + sealed
    }

    /// Sets the gauges of the own head: its series and its bytes.
    pub(crate) fn observe(&self, metrics: &StoreMetrics) {
        metrics.head_series.set(self.series_count() as i64);
        metrics.head_bytes.set(self.bytes() as i64);
    }
}

impl HeadRange {
    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_owned());
        self.ids.insert(name.to_owned(), id);
        self.bytes += name_weight(name);
        id
    }

    /// About how much memory it holds: its names, and each series' shape and entries. Counted
    /// whole only where series or entries leave; [`HeadRange::add`] keeps it up to date.
    fn weigh(&self) -> usize {
        let names: usize = self.names.iter().map(|name| name_weight(name)).sum();
        names + self.series.values().map(HeadSeries::weight).sum::<usize>()
    }

    /// The range's name ids of `tree`'s frames.
    fn frame_ids(&mut self, tree: &Tree) -> Vec<u32> {
        tree.frames()
            .iter()
            .map(|(_, name)| self.intern(name))
            .collect()
    }

    /// Adds one profile of a write, keeping the range's count of its bytes up to date.
    fn add(
        &mut self,
        bucket: u64,
        marker: &Marker,
        profile: &smolder_common::Profile,
        spans: &SpanTrees,
        max_spans: usize,
    ) -> SpansAdded {
        let tree = &profile.tree;
        // Intern the trees' frames once.
        let frames = self.frame_ids(tree);
        // The largest spans first: those are kept when there are too many.
        let mut spans: Vec<(SpanId, &Tree)> = spans.iter().collect();
        spans.sort_by_key(|(span, tree)| (std::cmp::Reverse(tree.total()), *span));
        let span_frames: Vec<Vec<u32>> = spans.iter().map(|(_, t)| self.frame_ids(t)).collect();
        // The bytes counted change by what this write changes: the shape's and the one entry's
        // (all of a new series).
        let (series, shape_before) = match self.series.get_mut(&profile.series) {
            Some(series) => {
                let before = series.shape_weight();
                (series, before)
            }
            None => (
                self.series
                    .entry(profile.series.clone())
                    .or_insert_with(|| HeadSeries::new(bucket)),
                0,
            ),
        };
        let (at, entry_before) = series.add(bucket, marker, profile, &frames);
        let added = series.add_spans(at, bucket, spans, &span_frames, max_spans);
        let after = series.shape_weight() + series.entries[at].weight();
        self.bytes = (self.bytes + after).saturating_sub(shape_before + entry_before);
        added
    }

    /// Drops the entries whose marker `covered` names; returns how many.
    fn forget(&mut self, covered: impl Fn(&Marker) -> bool) -> usize {
        let mut series = BTreeSet::new();
        self.drop_entries(|_, entry| covered(&entry.marker), &mut series)
    }

    /// Drops the entries `gone` names, adding the series that lost any to `touched`; returns
    /// how many.
    fn drop_entries(
        &mut self,
        gone: impl Fn(&Series, &Entry) -> bool,
        touched: &mut BTreeSet<Series>,
    ) -> usize {
        let mut dropped = 0;
        for (key, series) in &mut self.series {
            let before = series.entries.len();
            series.entries.retain(|e| !gone(key, e));
            if series.entries.len() < before {
                dropped += before - series.entries.len();
                touched.insert(key.clone());
            }
            if let (Some(first), Some(last)) = (
                series.entries.iter().map(|e| e.bucket).min(),
                series.entries.iter().map(|e| e.bucket).max(),
            ) {
                series.first = first;
                series.last = last;
            }
        }
        self.series.retain(|_, series| !series.entries.is_empty());
        if dropped > 0 {
            self.bytes = self.weigh();
        }
        dropped
    }

    /// Adds `series`' entries (of `key`) to `builder`, their values mapped from the series'
    /// shape once per node rather than each built as a tree.
    pub(crate) fn add_to(
        &self,
        builder: &mut smolder_block::BlockBuilder,
        key: &Series,
        series: &HeadSeries,
    ) -> Result<(), smolder_block::WriteError> {
        let shape = ShapeOf {
            names: &self.names,
            series,
        };
        let mut map = smolder_block::NodeMap::default();
        for entry in &series.entries {
            builder.add_values(
                key,
                &series.meta,
                entry.bucket,
                &shape,
                &mut map,
                &entry.values,
                &entry.spans,
                smolder_block::Contribution::batch(entry.marker.clone(), entry.writes),
            )?;
        }
        Ok(())
    }

    /// The sum of the trees of spans `wanted` (sorted) in `series`' entries in
    /// `[from, until)`, and how many entries had any; `None` when none did.
    pub(crate) fn sum_spans(
        &self,
        series: &HeadSeries,
        from: u64,
        until: u64,
        wanted: &[SpanId],
    ) -> Option<(Tree, u64)> {
        let mut dense: Vec<u64> = Vec::new();
        let mut entries = 0u64;
        for entry in &series.entries {
            if entry.bucket < from || entry.bucket >= until {
                continue;
            }
            let mut any = false;
            for (_, values) in entry
                .spans
                .iter()
                .filter(|(span, _)| wanted.binary_search(span).is_ok())
            {
                if dense.is_empty() {
                    dense = vec![0; series.nodes.len()];
                }
                for &(node, value) in values {
                    let slot = &mut dense[node as usize];
                    *slot = slot.saturating_add(value);
                }
                any = true;
            }
            entries += u64::from(any);
        }
        if entries == 0 {
            return None;
        }
        Some((self.dense_tree(series, &dense), entries))
    }

    /// The sum of `series`' entries in `[from, until)` and the writes it sums; `None` when
    /// none falls there.
    pub(crate) fn sum(&self, series: &HeadSeries, from: u64, until: u64) -> Option<(Tree, u64)> {
        let mut dense = vec![0u64; series.nodes.len()];
        let mut writes = 0u64;
        let mut any = false;
        for entry in &series.entries {
            if entry.bucket < from || entry.bucket >= until {
                continue;
            }
            any = true;
            writes = writes.saturating_add(entry.writes);
            for &(node, value) in &entry.values {
                let slot = &mut dense[node as usize];
                *slot = slot.saturating_add(value);
            }
        }
        if !any {
            return None;
        }
        Some((self.dense_tree(series, &dense), writes))
    }

    /// The tree of dense self values over `series`' shape.
    fn dense_tree(&self, series: &HeadSeries, dense: &[u64]) -> Tree {
        let values: Vec<(u32, u64)> = dense
            .iter()
            .enumerate()
            .filter(|(_, v)| **v > 0)
            .map(|(node, v)| (node as u32, *v))
            .collect();
        series.to_tree(&self.names, &values)
    }
}

/// About the memory an interned frame name takes: the name twice (the table and the map) and
/// their bookkeeping.
fn name_weight(name: &str) -> usize {
    2 * (name.len() + size_of::<String>()) + size_of::<u32>()
}

impl HeadSeries {
    /// About how much memory it holds: its shape and its entries (their values and spans).
    fn weight(&self) -> usize {
        self.shape_weight() + self.entries.iter().map(Entry::weight).sum::<usize>()
    }

    /// About how much memory its shape and its list of entries hold, their values aside.
    fn shape_weight(&self) -> usize {
        self.nodes.capacity() * size_of::<ShapeNode>()
            + self.wide.capacity() * size_of::<((u32, u32), u32)>()
            + self.entries.capacity() * size_of::<Entry>()
    }

    /// Adds `profile`'s tree (its frames' ids in `frames`) as an entry of `bucket` and
    /// `marker`, or to the entry it already has: where the entry is, and what it weighed before.
    fn add(
        &mut self,
        bucket: u64,
        marker: &Marker,
        profile: &smolder_common::Profile,
        frames: &[u32],
    ) -> (usize, usize) {
        let series = self;
        let tree = &profile.tree;
        if bucket >= series.meta_bucket {
            series.meta = profile.meta.clone();
            series.meta_bucket = bucket;
        }
        series.first = series.first.min(bucket);
        series.last = series.last.max(bucket);
        let mut values = series.values_of(tree, frames);
        let total = tree.total();
        match series
            .entries
            .iter()
            .position(|e| e.bucket == bucket && e.marker == *marker)
        {
            // Several profiles of one series and bucket in one write: one entry.
            Some(at) => {
                let entry = &mut series.entries[at];
                let before = entry.weight();
                entry.values.extend(values);
                entry.values = sum_values(std::mem::take(&mut entry.values));
                entry.writes += 1;
                entry.total = entry.total.saturating_add(total);
                (at, before)
            }
            None => {
                values.sort_unstable_by_key(|&(node, _)| node);
                series.entries.push(Entry {
                    bucket,
                    marker: marker.clone(),
                    writes: 1,
                    total,
                    values,
                    spans: Vec::new(),
                });
                (series.entries.len() - 1, 0)
            }
        }
    }

    /// Adds the span trees of the write whose entry is `at` (of `bucket`), at most
    /// `max_spans` per bucket, the largest first (their frames' ids in `span_frames`).
    fn add_spans(
        &mut self,
        at: usize,
        bucket: u64,
        spans: Vec<(SpanId, &Tree)>,
        span_frames: &[Vec<u32>],
        max_spans: usize,
    ) -> SpansAdded {
        let series = self;
        let mut added = SpansAdded::default();
        if spans.is_empty() {
            return added;
        }
        let used: usize = series
            .entries
            .iter()
            .filter(|e| e.bucket == bucket)
            .map(|e| e.spans.len())
            .sum();
        let mut room = max_spans.saturating_sub(used);
        for ((span, tree), frames) in spans.into_iter().zip(span_frames) {
            let known = series.entries[at]
                .spans
                .binary_search_by_key(&span, |(s, _)| *s);
            if known.is_err() && room == 0 {
                added.dropped += 1;
                continue;
            }
            let mut values = series.values_of(tree, frames);
            let entry = &mut series.entries[at];
            match known {
                // The same span in another profile of this write's bucket: one tree.
                Ok(k) => {
                    values.extend(std::mem::take(&mut entry.spans[k].1));
                    entry.spans[k].1 = sum_values(values);
                }
                Err(k) => {
                    entry.spans.insert(k, (span, sum_values(values)));
                    room -= 1;
                    added.kept += 1;
                }
            }
        }
        added
    }

    fn new(bucket: u64) -> HeadSeries {
        HeadSeries {
            meta: ProfileMeta::default(),
            meta_bucket: bucket,
            first: bucket,
            last: bucket,
            nodes: vec![ShapeNode {
                parent: 0,
                frame: u32::MAX,
                first_child: NONE,
                next_sibling: NONE,
                children: 0,
            }],
            wide: HashMap::default(),
            entries: Vec::new(),
        }
    }

    /// `tree`'s self values over this series' shape, nodes added as needed; `frames` maps the
    /// tree's frame ids to the range's name ids. About a fifth of a tree's nodes carry a self
    /// value.
    fn values_of(&mut self, tree: &Tree, frames: &[u32]) -> Vec<(u32, u64)> {
        let mut values = Vec::with_capacity(tree.len() / 4);
        let root = tree.root();
        if root.self_value() > 0 {
            values.push((0, root.self_value()));
        }
        let mut pending: Vec<(NodeRef<'_>, u32)> = root.children().map(|c| (c, 0)).collect();
        while let Some((node, parent)) = pending.pop() {
            if node.total() == 0 {
                continue;
            }
            let frame = frames[node.frame().expect("only the root has no frame").index()];
            let at = self.child(parent, frame);
            if node.self_value() > 0 {
                values.push((at, node.self_value()));
            }
            pending.extend(node.children().map(|c| (c, at)));
        }
        values
    }

    /// The child of `parent` with `frame`, added if new.
    fn child(&mut self, parent: u32, frame: u32) -> u32 {
        let node = &self.nodes[parent as usize];
        if node.children > WIDE {
            if let Some(&at) = self.wide.get(&(parent, frame)) {
                return at;
            }
        } else {
            let mut at = node.first_child;
            while at != NONE {
                let child = &self.nodes[at as usize];
                if child.frame == frame {
                    return at;
                }
                at = child.next_sibling;
            }
        }
        let at = u32::try_from(self.nodes.len()).expect("fewer than 2^32 nodes in one series");
        let next_sibling = self.nodes[parent as usize].first_child;
        self.nodes.push(ShapeNode {
            parent,
            frame,
            first_child: NONE,
            next_sibling,
            children: 0,
        });
        let node = &mut self.nodes[parent as usize];
        node.first_child = at;
        node.children += 1;
        match node.children {
            count if count == WIDE + 1 => {
                // Grown wide: its children move to the map.
                let mut child = at;
                while child != NONE {
                    let data = &self.nodes[child as usize];
                    self.wide.insert((parent, data.frame), child);
                    child = data.next_sibling;
                }
            }
            count if count > WIDE + 1 => {
                self.wide.insert((parent, frame), at);
            }
            _ => {}
        }
        at
    }

    /// A tree with these self values over this series' shape.
    fn to_tree(&self, names: &[String], values: &[(u32, u64)]) -> Tree {
        let mut tree = Tree::new();
        let mut ids: Vec<Option<FrameId>> = vec![None; names.len()];
        let mut path: Vec<FrameId> = Vec::new();
        for &(node, value) in values {
            path.clear();
            let mut at = node;
            while at != 0 {
                let node = &self.nodes[at as usize];
                let frame = node.frame as usize;
                let id = *ids[frame].get_or_insert_with(|| tree.intern(&names[frame]));
                path.push(id);
                at = node.parent;
            }
            path.reverse();
            tree.insert(&path, value);
        }
        tree
    }
}

/// A head series' shape, its frames named in its range's table, as the block builder reads it.
struct ShapeOf<'h> {
    names: &'h [String],
    series: &'h HeadSeries,
}

impl smolder_block::ShapeSource for ShapeOf<'_> {
    fn parent(&self, node: u32) -> u32 {
        self.series.nodes[node as usize].parent
    }

    fn name(&self, node: u32) -> &str {
        &self.names[self.series.nodes[node as usize].frame as usize]
    }
}

/// Sums values of the same node; sorts by node.
fn sum_values(mut values: Vec<(u32, u64)>) -> Vec<(u32, u64)> {
    values.sort_unstable_by_key(|&(node, _)| node);
    let mut out: Vec<(u32, u64)> = Vec::with_capacity(values.len());
    for (node, value) in values {
        match out.last_mut() {
            Some(last) if last.0 == node => last.1 = last.1.saturating_add(value),
            _ => out.push((node, value)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use smolder_block::HeadProfile;
    use smolder_common::{ProfileMeta, SpanId};

    use super::*;

    fn record(write: u64, buckets: &[u64], stacks: &[&str], span: Option<u64>) -> Record {
        let profiles = buckets
            .iter()
            .map(|&bucket| {
                let mut tree = Tree::new();
                let mut spans = SpanTrees::new();
                for (i, stack) in stacks.iter().enumerate() {
                    tree.insert_names(stack.split(';'), i as u64 + 1);
                    if let Some(id) = span {
                        let id = SpanId::from_bytes(id.to_be_bytes()).unwrap();
                        spans
                            .tree_mut(id)
                            .insert_names(stack.split(';'), i as u64 + 1);
                    }
                }
                let at = UNIX_EPOCH + Duration::from_secs(bucket);
                HeadProfile {
                    bucket,
                    profile: smolder_common::Profile {
                        series: Series::parse("app.cpu{env=prod}").unwrap(),
                        meta: ProfileMeta::default(),
                        from: at,
                        until: at + Duration::from_secs(10),
                        tree,
                    },
                    spans,
                }
            })
            .collect();
        Record {
            tenant: Tenant::anonymous(),
            marker: Marker {
                agent_id: "host-1".into(),
                sequence: write,
            },
            window_end: None,
            write,
            profiles,
        }
    }

    /// The count kept as writes arrive is the count taken whole: new entries, a second profile
    /// of one series and bucket in one write (one entry, summed), spans, new frames and nodes.
    #[test]
    fn the_bytes_kept_up_to_date_are_the_bytes_counted_whole() {
        let mut head = Head::default();
        let writes = [
            record(1, &[1_000], &["main;a", "main;b"], None),
            record(2, &[1_000, 1_010], &["main;a;x", "gc"], Some(7)),
            record(2, &[1_010], &["main;c;y;z", "main;a;x"], Some(8)),
            record(3, &[1_020], &["main;a"; 3], Some(7)),
        ];
        for record in &writes {
            head.add(1_000, record, 1000);
            let range = &head.ranges[&(Tenant::anonymous(), 1_000)];
            assert_eq!(range.bytes, range.weigh());
        }
        assert!(head.bytes() > 0);
    }
}
