//! Building a block from trees: what the aggregator does when it cuts a closed range of its head.

use std::collections::{BTreeMap, HashMap};

use smolder_common::tree::NodeRef;
use smolder_common::{ProfileMeta, Series, SpanId, SpanTrees, Tree};

use crate::error::WriteError;
use crate::footer::{Deletion, canonical_deletions, horizon_of};
use crate::index::Marker;
use crate::names::Interner;
use crate::shape::Trie;
use crate::writer::{BlockWriter, Part, SeriesParts, SeriesSpans, SpanPart, WriteReport, ladder};

/// Where a tree's data came from, so that every batch is counted once across cuts and merges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contribution {
    markers: Vec<Marker>,
    separable: bool,
    writes: u64,
}

impl Contribution {
    /// One batch's data, `writes` writes of it, kept apart in the block so that another copy of
    /// the same batch (a retry stored elsewhere, a cut repeated after a crash) is dropped when
    /// the blocks are merged.
    pub fn batch(marker: Marker, writes: u64) -> Contribution {
        Contribution {
            markers: vec![marker],
            separable: true,
            writes,
        }
    }

    /// Data already summed from the batches `markers` (none for data without a marker, such as
    /// a push over HTTP), `writes` writes in all. Its batches cannot be taken out again.
    pub fn merged(markers: Vec<Marker>, writes: u64) -> Contribution {
        Contribution {
            markers,
            separable: false,
            writes,
        }
    }
}

/// Collects trees for one block of one tenant and time range, then writes it.
///
/// ```
/// use smolder_block::{BlockBuilder, Contribution, Fetched, Footer, Index, Limits, Marker, Names,
///     SeriesChunk, Tail};
/// use smolder_common::{ProfileMeta, Selector, Series, Tree};
///
/// let mut tree = Tree::new();
/// tree.insert_names(["main", "work"], 3);
/// let mut builder = BlockBuilder::new("anonymous", 1_000, 1_000, 10)?;
/// let marker = Marker { agent_id: "host-1".into(), sequence: 7 };
/// let series = Series::parse("app.cpu{env=prod}")?;
/// builder.add(&series, &ProfileMeta::default(), 1_230, &tree, Contribution::batch(marker, 1))?;
/// let (block, _) = builder.finish()?;
///
/// // A reader fetches the tail, the directory, the index, the names and the chunks it needs;
/// // here the whole block is at hand.
/// let fetched = Fetched::whole(&block);
/// let limits = Limits::default();
/// let tail = Tail::decode(block.len() as u64, &fetched)?;
/// let footer = Footer::decode(&tail, &fetched)?;
/// let index = Index::decode(&footer, &fetched, &limits)?;
/// let names = Names::decode(&footer, &fetched, &limits)?;
/// let found = index.select(&Selector::parse("app.cpu")?, 1_000, 2_000);
/// let chunk = SeriesChunk::decode(&index, found[0], &fetched, &limits)?;
/// let mut read = Tree::new();
/// chunk.read_range(1_000, 2_000, &fetched, &names, &mut read)?;
/// assert_eq!(read, tree);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct BlockBuilder {
    tenant: String,
    start: u64,
    levels: Vec<u64>,
    frames: Interner,
    series: BTreeMap<Series, (SeriesParts, SeriesSpans)>,
    markers: Vec<Marker>,
    marker_ids: HashMap<Marker, u32>,
    /// The app deletions it applies (canonical).
    deletions: Vec<Deletion>,
}

impl BlockBuilder {
    /// A builder of a block of `tenant` over `[start, start + span)` with buckets of `finest`
    /// seconds and rollups ten times coarser up to `span`.
    ///
    /// # Errors
    ///
    /// [`WriteError::BadLevels`] when `span` is not `finest` times a power of ten or `start` is
    /// not a multiple of `span`.
    pub fn new(tenant: &str, start: u64, span: u64, finest: u64) -> Result<Self, WriteError> {
        Ok(BlockBuilder {
            tenant: tenant.to_owned(),
            start,
            levels: ladder(finest, span, start)?,
            frames: Interner::default(),
            series: BTreeMap::new(),
            markers: Vec::new(),
            marker_ids: HashMap::new(),
            deletions: Vec::new(),
        })
    }

    /// Applies app deletions: a tree of a series of a deleted app whose bucket starts before
    /// the deletion's horizon is left out (its batch's marker is still recorded, so that the
    /// batch is known as stored), and the block lists the deletions (its deletions section;
    /// one per app, the latest horizon winning). Call before adding trees: those added before
    /// are kept.
    pub fn set_deletions(&mut self, deletions: Vec<Deletion>) {
        self.deletions = canonical_deletions(deletions);
    }

    /// Records batch `marker` as stored in this block even if it brought no tree, so that it is
    /// not stored again.
    pub fn add_marker(&mut self, marker: Marker) {
        self.marker_id(marker);
    }

    fn marker_id(&mut self, marker: Marker) -> u32 {
        let next = self.markers.len() as u32;
        *self.marker_ids.entry(marker).or_insert_with_key(|marker| {
            self.markers.push(marker.clone());
            next
        })
    }

    /// Adds `tree`, the data of `series` in the bucket holding `bucket` (Unix seconds), which
    /// `contribution` says where it came from. `meta` of the newest bucket wins.
    ///
    /// # Errors
    ///
    /// [`WriteError::BucketOutsideBlock`] when `bucket` is outside the block's range.
    pub fn add(
        &mut self,
        series: &Series,
        meta: &ProfileMeta,
        bucket: u64,
        tree: &Tree,
        contribution: Contribution,
    ) -> Result<(), WriteError> {
        self.add_with_spans(series, meta, bucket, tree, &SpanTrees::new(), contribution)
    }

    /// [`BlockBuilder::add`], with the trees of the spans the tree's samples ran in (each a
    /// part of `tree`), kept in the block's span chunks with the tree's contribution.
    ///
    /// # Errors
    ///
    /// [`WriteError::BucketOutsideBlock`] when `bucket` is outside the block's range.
    pub fn add_with_spans(
        &mut self,
        series: &Series,
        meta: &ProfileMeta,
        bucket: u64,
        tree: &Tree,
        spans: &SpanTrees,
        contribution: Contribution,
    ) -> Result<(), WriteError> {
        self.add_parts(
            series,
            meta,
            bucket,
            contribution,
            |frames, trie| add_tree(frames, trie, tree),
            |frames, trie| {
                spans
                    .iter()
                    .map(|(span, tree)| (span, add_tree(frames, trie, tree)))
                    .collect()
            },
        )
    }

    /// [`BlockBuilder::add_with_spans`] for a tree held as self values over the nodes of the
    /// caller's own `shape` of the series (and its spans' trees likewise), as the aggregator's
    /// head holds its writes: each of the shape's nodes is mapped into the block once, through
    /// `map` (one per series, kept across calls), so the tree is never built and its frames
    /// are named once per series rather than once per tree.
    ///
    /// # Errors
    ///
    /// [`WriteError::BucketOutsideBlock`] when `bucket` is outside the block's range.
    #[expect(
        clippy::too_many_arguments,
        reason = "add_with_spans' arguments, the tree and spans given over a shape and its map"
    )]
    pub fn add_values(
        &mut self,
        series: &Series,
        meta: &ProfileMeta,
        bucket: u64,
        shape: &impl ShapeSource,
        map: &mut NodeMap,
        values: &[(u32, u64)],
        spans: &[(SpanId, Vec<(u32, u64)>)],
        contribution: Contribution,
    ) -> Result<(), WriteError> {
        self.add_parts(
            series,
            meta,
            bucket,
            contribution,
            |frames, trie| map_values(frames, trie, shape, &mut map.tree, values),
            |frames, trie| {
                spans
                    .iter()
                    .map(|(span, values)| {
                        (
                            *span,
                            map_values(frames, trie, shape, &mut map.spans, values),
                        )
                    })
                    .collect()
            },
        )
    }

    /// Adds one tree and its spans' trees, whose self values over the series' tries
    /// `tree_values` and `span_values` give.
    fn add_parts(
        &mut self,
        series: &Series,
        meta: &ProfileMeta,
        bucket: u64,
        contribution: Contribution,
        tree_values: impl FnOnce(&mut Interner, &mut Trie) -> Vec<(u32, u64)>,
        span_values: impl FnOnce(&mut Interner, &mut Trie) -> Vec<(SpanId, Vec<(u32, u64)>)>,
    ) -> Result<(), WriteError> {
        let end = self.start + self.levels.last().expect("a level");
        if bucket < self.start || bucket >= end {
            return Err(WriteError::BucketOutsideBlock {
                bucket,
                start: self.start,
                end,
            });
        }
        let markers: Vec<u32> = contribution
            .markers
            .into_iter()
            .map(|m| self.marker_id(m))
            .collect();
        let finest = self.levels[0];
        let bucket = bucket / finest * finest;
        if horizon_of(&self.deletions, series.app()).is_some_and(|horizon| bucket < horizon) {
            return Ok(());
        }
        let (data, span_data) = match self.series.get_mut(series) {
            Some(data) => data,
            None => self.series.entry(series.clone()).or_default(),
        };
        let origin = u32::try_from(data.parts.len()).expect("fewer than 2^32 trees per series");
        let spans: Vec<(SpanId, Vec<(u32, u64)>)> =
            span_values(&mut self.frames, &mut span_data.trie)
                .into_iter()
                .filter(|(_, values)| !values.is_empty())
                .collect();
        if !spans.is_empty() {
            span_data.parts.push(SpanPart {
                origin,
                bucket,
                separable: contribution.separable,
                marker: contribution.separable.then(|| markers[0]),
                spans,
            });
        }
        if data
            .meta
            .as_ref()
            .is_none_or(|(newest, _)| bucket >= *newest)
        {
            data.meta = Some((bucket, meta.clone()));
        }
        let values = tree_values(&mut self.frames, &mut data.trie);
        data.parts.push(Part {
            bucket,
            size: finest,
            separable: contribution.separable,
            markers,
            writes: contribution.writes,
            values,
            origin,
        });
        Ok(())
    }

    /// Writes the block and says what it holds.
    ///
    /// # Errors
    ///
    /// [`WriteError::InseparableDuplicate`] when one batch was added twice as merged data of
    /// one bucket of one series.
    pub fn finish(self) -> Result<(Vec<u8>, WriteReport), WriteError> {
        let mut order: Vec<u32> = (0..self.markers.len() as u32).collect();
        order.sort_by(|&a, &b| self.markers[a as usize].cmp(&self.markers[b as usize]));
        let mut position = vec![0u32; order.len()];
        for (at, &id) in order.iter().enumerate() {
            position[id as usize] = at as u32;
        }
        let mut markers = self.markers;
        markers.sort();
        let mut writer = BlockWriter::new(&self.tenant, self.start, self.levels, markers, 0, true);
        writer.set_deletions(self.deletions);
        let mut bytes = Vec::new();
        let frames = &self.frames;
        let mut with_spans = Vec::new();
        for (series, (mut data, mut spans)) in self.series {
            for part in &mut data.parts {
                for marker in &mut part.markers {
                    *marker = position[*marker as usize];
                }
                part.markers.sort_unstable();
                part.markers.dedup();
            }
            let pushed = writer.push_series(&series, data, |id| frames.name(id))?;
            bytes.extend(writer.take_output());
            if !spans.is_empty() {
                for part in &mut spans.parts {
                    part.marker = part.marker.map(|m| position[m as usize]);
                }
                with_spans.push((pushed, spans));
            }
        }
        for (pushed, spans) in with_spans {
            writer.push_spans(&pushed, spans, |id| frames.name(id));
            bytes.extend(writer.take_output());
        }
        let (tail, report) = writer.finish();
        bytes.extend(tail);
        Ok((bytes, report))
    }
}

/// A series' shape as a caller of [`BlockBuilder::add_values`] holds it: node 0 the root, every
/// other node with a parent and a frame name.
pub trait ShapeSource {
    /// The parent of `node` (never asked of the root).
    fn parent(&self, node: u32) -> u32;
    /// The frame name of `node` (never asked of the root).
    fn name(&self, node: u32) -> &str;
}

/// Which node of the block each node of a caller's shape became, for one series (for its trees
/// and for its spans' trees, which have a trie of their own): keep one per series across the
/// [`BlockBuilder::add_values`] calls of that series.
#[derive(Debug, Default)]
pub struct NodeMap {
    tree: Vec<u32>,
    spans: Vec<u32>,
}

/// Not mapped yet.
const UNMAPPED: u32 = u32::MAX;

/// `values` over `shape`'s nodes as self values over `trie`'s, mapping each node not in `map`
/// yet (its ancestors first, frames interned in `frames`). Zero values are left out, as
/// [`add_tree`] leaves out nodes without samples.
fn map_values(
    frames: &mut Interner,
    trie: &mut Trie,
    shape: &impl ShapeSource,
    map: &mut Vec<u32>,
    values: &[(u32, u64)],
) -> Vec<(u32, u64)> {
    let mut chain = Vec::new();
    values
        .iter()
        .filter(|(_, value)| *value > 0)
        .map(|&(node, value)| {
            // Up to the first mapped ancestor (the root always is), then down, mapping.
            let mut at = node;
            while at != 0 && map.get(at as usize).is_none_or(|&m| m == UNMAPPED) {
                chain.push(at);
                at = shape.parent(at);
            }
            let mut mapped = if at == 0 { 0 } else { map[at as usize] };
            while let Some(node) = chain.pop() {
                mapped = trie.child(mapped, frames.intern(shape.name(node)));
                if map.len() <= node as usize {
                    map.resize(node as usize + 1, UNMAPPED);
                }
                map[node as usize] = mapped;
            }
            (mapped, value)
        })
        .collect()
}

/// Adds `tree`'s nodes to `trie` (frames interned in `frames`) and returns its self values.
fn add_tree(frames: &mut Interner, trie: &mut Trie, tree: &Tree) -> Vec<(u32, u64)> {
    let mut ids = vec![u32::MAX; tree.frames().len()];
    let mut values = Vec::new();
    let root = tree.root();
    if root.self_value() > 0 {
        values.push((0, root.self_value()));
    }
    let mut pending: Vec<(NodeRef<'_>, u32)> = root.children().map(|c| (c, 0)).collect();
    while let Some((node, parent)) = pending.pop() {
        if node.total() == 0 {
            continue;
        }
        let frame = node.frame().expect("only the root has no frame");
        let id = &mut ids[frame.index()];
        if *id == u32::MAX {
            *id = frames.intern(node.name());
        }
        let at = trie.child(parent, *id);
        if node.self_value() > 0 {
            values.push((at, node.self_value()));
        }
        pending.extend(node.children().map(|c| (c, at)));
    }
    values
}
