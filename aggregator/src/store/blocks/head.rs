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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use smolder_block::Marker;
use smolder_common::tree::NodeRef;
use smolder_common::{FrameId, ProfileMeta, Series, Tree};

use super::wal::Record;
use crate::tenant::Tenant;

/// The head: ranges by tenant and start.
#[derive(Default)]
pub(crate) struct Head {
    ranges: BTreeMap<(Tenant, u64), HeadRange>,
    /// Ranges being cut, at most one per tenant and start.
    sealed: BTreeMap<(Tenant, u64), Sealed>,
}

/// A range being cut.
struct Sealed {
    range: Arc<HeadRange>,
    /// Apps deleted since it was sealed: hidden from reads here, and in its block once
    /// published.
    deleted: BTreeSet<String>,
}

/// A range sealed for a cut: what the cut builds its block from.
pub(crate) struct SealedRange {
    pub(crate) tenant: Tenant,
    pub(crate) start: u64,
    pub(crate) range: Arc<HeadRange>,
}

/// One tenant's writes in one head range.
#[derive(Default)]
pub(crate) struct HeadRange {
    names: Vec<String>,
    ids: HashMap<String, u32, foldhash::fast::RandomState>,
    pub(crate) series: BTreeMap<Series, HeadSeries>,
}

/// One series' writes in a head range.
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
pub(crate) struct Entry {
    /// Unix seconds of its 10 s bucket.
    pub(crate) bucket: u64,
    pub(crate) marker: Marker,
    /// Profiles it sums.
    pub(crate) writes: u64,
    /// Its total.
    pub(crate) total: u64,
    values: Vec<(u32, u64)>,
}

impl Head {
    /// Adds a record of head range `range`.
    pub(crate) fn add(&mut self, range: u64, record: &Record) {
        let head = self
            .ranges
            .entry((record.tenant.clone(), range))
            .or_default();
        for (bucket, profile) in &record.profiles {
            head.add(*bucket, &record.marker, profile);
        }
    }

    /// The ranges of `tenant` overlapping `[from, until)`, given the range span, each with the
    /// apps deleted from it that reads must skip (only a sealed range has any).
    pub(crate) fn ranges_of<'h>(
        &'h self,
        tenant: &Tenant,
        span: u64,
        from: u64,
        until: u64,
    ) -> impl Iterator<Item = (&'h HeadRange, Option<&'h BTreeSet<String>>)> + use<'h> {
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
            .map(|(_, range)| (range, None));
        let sealed = self
            .sealed
            .iter()
            .filter(move |(key, _)| wanted(key))
            .map(|(_, sealed)| (&*sealed.range, Some(&sealed.deleted)));
        live.chain(sealed)
    }

    /// Whether a live range of any tenant starts at `start`.
    pub(crate) fn has_live(&self, start: u64) -> bool {
        self.ranges.keys().any(|(_, s)| *s == start)
    }

    /// Seals every live range whose start `due` accepts (unless one of its tenant and start is
    /// sealed already: it waits for that cut), and returns every sealed range, those of an
    /// earlier cut that failed included.
    pub(crate) fn seal(&mut self, due: impl Fn(u64) -> bool) -> Vec<SealedRange> {
        let keys: Vec<(Tenant, u64)> = self
            .ranges
            .keys()
            .filter(|key| due(key.1) && !self.sealed.contains_key(key))
            .cloned()
            .collect();
        for key in keys {
            if let Some(range) = self.ranges.remove(&key) {
                let sealed = Sealed {
                    range: Arc::new(range),
                    deleted: BTreeSet::new(),
                };
                self.sealed.insert(key, sealed);
            }
        }
        self.sealed
            .iter()
            .map(|((tenant, start), sealed)| SealedRange {
                tenant: tenant.clone(),
                start: *start,
                range: Arc::clone(&sealed.range),
            })
            .collect()
    }

    /// The apps deleted from the sealed range of `tenant` at `start` since it was sealed,
    /// which its block must hide.
    pub(crate) fn deleted_in_sealed(&self, tenant: &Tenant, start: u64) -> BTreeSet<String> {
        self.sealed
            .get(&(tenant.clone(), start))
            .map(|sealed| sealed.deleted.clone())
            .unwrap_or_default()
    }

    /// Whether the range of `tenant` at `start` is sealed (a cut builds its block).
    pub(crate) fn is_sealed(&self, tenant: &Tenant, start: u64) -> bool {
        self.sealed.contains_key(&(tenant.clone(), start))
    }

    /// Drops the sealed range of `tenant` at `start`, its block published.
    pub(crate) fn unseal(&mut self, tenant: &Tenant, start: u64) {
        self.sealed.remove(&(tenant.clone(), start));
    }

    /// Deletes every series of `app` of `tenant` (from a sealed range, hides it); returns the
    /// series deleted.
    pub(crate) fn delete_app(&mut self, tenant: &Tenant, app: &str) -> Vec<Series> {
        let mut deleted = Vec::new();
        for ((t, _), range) in &mut self.ranges {
            if t != tenant {
                continue;
            }
            range.series.retain(|series, _| {
                let gone = series.app() == app;
                if gone {
                    deleted.push(series.clone());
                }
                !gone
            });
        }
        self.ranges.retain(|_, range| !range.series.is_empty());
        for ((t, _), sealed) in &mut self.sealed {
            if t != tenant || sealed.deleted.contains(app) {
                continue;
            }
            let before = deleted.len();
            deleted.extend(
                sealed
                    .range
                    .series
                    .keys()
                    .filter(|series| series.app() == app)
                    .cloned(),
            );
            if deleted.len() > before {
                sealed.deleted.insert(app.to_owned());
            }
        }
        deleted
    }

    /// Series in the head, sealed ranges included.
    pub(crate) fn series_count(&self) -> usize {
        let live: usize = self.ranges.values().map(|r| r.series.len()).sum();
        let sealed: usize = self.sealed.values().map(|s| s.range.series.len()).sum();
        live + sealed
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
        id
    }

    fn add(&mut self, bucket: u64, marker: &Marker, profile: &smolder_common::Profile) {
        let tree = &profile.tree;
        // Intern the tree's frames once.
        let frames: Vec<u32> = tree
            .frames()
            .iter()
            .map(|(_, name)| self.intern(name))
            .collect();
        let series = match self.series.get_mut(&profile.series) {
            Some(series) => series,
            None => self
                .series
                .entry(profile.series.clone())
                .or_insert_with(|| HeadSeries::new(bucket)),
        };
        if bucket >= series.meta_bucket {
            series.meta = profile.meta.clone();
            series.meta_bucket = bucket;
        }
        series.first = series.first.min(bucket);
        series.last = series.last.max(bucket);
        // About a fifth of a tree's nodes carry a self value.
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
            let at = series.child(parent, frame);
            if node.self_value() > 0 {
                values.push((at, node.self_value()));
            }
            pending.extend(node.children().map(|c| (c, at)));
        }
        let total = tree.total();
        match series
            .entries
            .iter_mut()
            .find(|e| e.bucket == bucket && e.marker == *marker)
        {
            // Several profiles of one series and bucket in one write: one entry.
            Some(entry) => {
                entry.values.extend(values);
                entry.values = sum_values(std::mem::take(&mut entry.values));
                entry.writes += 1;
                entry.total = entry.total.saturating_add(total);
            }
            None => {
                values.sort_unstable_by_key(|&(node, _)| node);
                series.entries.push(Entry {
                    bucket,
                    marker: marker.clone(),
                    writes: 1,
                    total,
                    values,
                });
            }
        }
    }

    /// The tree of one entry of `series`, for the block builder.
    pub(crate) fn entry_tree(&self, series: &HeadSeries, entry: &Entry) -> Tree {
        series.to_tree(&self.names, &entry.values)
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
        let values: Vec<(u32, u64)> = dense
            .iter()
            .enumerate()
            .filter(|(_, v)| **v > 0)
            .map(|(node, v)| (node as u32, *v))
            .collect();
        Some((series.to_tree(&self.names, &values), writes))
    }
}

impl HeadSeries {
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
