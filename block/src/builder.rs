//! Building a block from trees: what the aggregator does when it cuts a closed range of its head.

use std::collections::{BTreeMap, HashMap};

use smolder_common::tree::NodeRef;
use smolder_common::{ProfileMeta, Series, Tree};

use crate::error::WriteError;
use crate::index::Marker;
use crate::names::Interner;
use crate::writer::{BlockWriter, Part, SeriesParts, WriteReport, ladder};

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
    series: BTreeMap<Series, SeriesParts>,
    markers: Vec<Marker>,
    marker_ids: HashMap<Marker, u32>,
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
        })
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
        let data = match self.series.get_mut(series) {
            Some(data) => data,
            None => self.series.entry(series.clone()).or_default(),
        };
        if data
            .meta
            .as_ref()
            .is_none_or(|(newest, _)| bucket >= *newest)
        {
            data.meta = Some((bucket, meta.clone()));
        }
        let values = add_tree(&mut self.frames, &mut data.trie, tree);
        let finest = self.levels[0];
        data.parts.push(Part {
            bucket: bucket / finest * finest,
            size: finest,
            separable: contribution.separable,
            markers,
            writes: contribution.writes,
            values,
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
        let mut bytes = Vec::new();
        let frames = &self.frames;
        for (series, mut data) in self.series {
            for part in &mut data.parts {
                for marker in &mut part.markers {
                    *marker = position[*marker as usize];
                }
                part.markers.sort_unstable();
                part.markers.dedup();
            }
            writer.push_series(&series, data, |id| frames.name(id))?;
            bytes.extend(writer.take_output());
        }
        let (tail, report) = writer.finish();
        bytes.extend(tail);
        Ok((bytes, report))
    }
}

/// Adds `tree`'s nodes to `trie` (frames interned in `frames`) and returns its self values.
fn add_tree(frames: &mut Interner, trie: &mut crate::shape::Trie, tree: &Tree) -> Vec<(u32, u64)> {
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
