//! One series' chunk of the trees section: a header holding its [`Shape`] and tree table, then
//! its trees back to back in table order.
//!
//! Header layout, after the shape (every integer a varint unless said otherwise):
//!
//! ```text
//! entry count
//! per entry, sorted by level, bucket, then the merged tree before the separable ones:
//!   level index, bucket delta in units of the level (from the previous entry of the same
//!   level, or from the block's start), flags (u8: bit 0 separable), marker count, marker index
//!   deltas, writes, total, nodes, stored length, CRC-32 (u32 LE)
//! ```
//!
//! A finest-level bucket may have several entries: at most one *merged* tree, which sums the
//! data of the markers it lists (and any data without a marker), and one *separable* tree per
//! batch whose data is kept apart, so that a copy of the same batch elsewhere can be dropped
//! instead of counted twice. A rollup (any coarser level) sums every entry below it and lists
//! no markers.

use std::ops::Range;

use smolder_common::Tree;

use crate::codec::{self, Reader, put_varint};
use crate::error::{BlockError, Section};
use crate::footer::{Fetched, Limits};
use crate::index::Index;
use crate::names::Names;
use crate::shape::Shape;
use crate::tree::{Accumulator, SparseTree, node_count};

/// Flag bit: a separable tree.
const SEPARABLE: u8 = 1;

/// One stored tree of a series, as its chunk's table records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeEntry {
    /// Index into the block's levels: 0 for the finest, higher for rollups.
    pub level: u8,
    /// Unix seconds of the bucket's start.
    pub bucket: u64,
    /// Whether this tree holds exactly one batch's data, kept apart from the rest.
    pub separable: bool,
    /// Positions in [`Index::markers`] of the batches whose data this tree holds (finest level
    /// only).
    pub markers: Vec<u32>,
    /// How many writes the tree sums; a range of an `average` series is its sum divided by its
    /// writes.
    pub writes: u64,
    /// The sum of its values.
    pub total: u64,
    /// Its nodes, the root not counted.
    pub nodes: u64,
    offset: u64,
    len: u64,
    crc: u32,
}

/// The decoded header of one series' chunk. See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct SeriesChunk {
    series: usize,
    shape: Shape,
    entries: Vec<TreeEntry>,
    levels: Vec<u64>,
    start: u64,
}

impl SeriesChunk {
    /// Decodes the header of series `series` of `index` from `fetched`, which must cover
    /// [`Index::chunk_header_range`].
    ///
    /// # Errors
    ///
    /// A [`BlockError`] naming the chunk.
    ///
    /// # Panics
    ///
    /// If `series` is not a position in [`Index::series`].
    pub fn decode(
        index: &Index,
        series: usize,
        fetched: &Fetched<'_>,
        limits: &Limits,
    ) -> Result<SeriesChunk, BlockError> {
        let section = Section::Chunk { series };
        let location = index.series()[series].chunk;
        let stored = fetched.get(index.chunk_header_range(series), section)?;
        let raw = codec::open(
            section,
            stored,
            location.header_codec,
            location.header_raw,
            location.header_crc,
            limits.max_section_bytes,
        )?;
        let meta = index.meta();
        let mut r = Reader::new(&raw, section);
        let shape = Shape::decode(&mut r, meta.names as u32)?;
        let count = r.count("tree entry", 12)?;
        let mut entries: Vec<TreeEntry> = Vec::with_capacity(count);
        let mut offset = location.offset + location.header_stored;
        let markers = index.markers().len() as u64;
        for _ in 0..count {
            let level = r.varint("level")?;
            let Some(&size) = meta.levels.get(level as usize) else {
                return Err(r.invalid("level", "not a level of the block"));
            };
            let level = level as u8;
            let delta = r.varint("bucket delta")?;
            let base = match entries.last() {
                Some(previous) if previous.level == level => previous.bucket,
                Some(previous) if previous.level > level => {
                    return Err(r.invalid("level", "entries not sorted by level"));
                }
                _ => meta.start,
            };
            let bucket = delta
                .checked_mul(size)
                .and_then(|d| d.checked_add(base))
                .filter(|&b| b < meta.end())
                .ok_or_else(|| r.invalid("bucket", "outside the block"))?;
            let flags = r.byte("flags")?;
            if flags & !SEPARABLE != 0 {
                return Err(r.invalid("flags", "unknown flag bits set"));
            }
            let separable = flags & SEPARABLE != 0;
            let marker_count = r.count("marker", 1)?;
            let mut list = Vec::with_capacity(marker_count);
            let mut marker = 0u64;
            for i in 0..marker_count {
                let delta = r.varint("marker")?;
                if i > 0 && delta == 0 {
                    return Err(r.invalid("marker", "marker positions must increase"));
                }
                marker = marker.saturating_add(delta);
                if marker >= markers {
                    return Err(r.invalid("marker", "not in the markers section"));
                }
                list.push(marker as u32);
            }
            let entry = TreeEntry {
                level,
                bucket,
                separable,
                markers: list,
                writes: r.varint("writes")?,
                total: r.varint("total")?,
                nodes: r.varint("nodes")?,
                offset,
                len: r.varint("tree length")?,
                crc: r.u32_le("tree crc")?,
            };
            check_order(entries.last(), &entry)
                .map_err(|reason| r.invalid("tree entry", reason))?;
            if entry.separable {
                // The merged tree of the bucket, if any, comes first among its entries.
                let merged = entries
                    .iter()
                    .rev()
                    .take_while(|e| (e.level, e.bucket) == (entry.level, entry.bucket))
                    .find(|e| !e.separable);
                if merged.is_some_and(|m| m.markers.binary_search(&entry.markers[0]).is_ok()) {
                    return Err(r.invalid(
                        "tree entry",
                        "a batch both merged and separable in one bucket",
                    ));
                }
            }
            offset = offset
                .checked_add(entry.len)
                .ok_or_else(|| r.invalid("tree length", "overflows"))?;
            entries.push(entry);
        }
        r.finish()?;
        let end = location.offset + location.len;
        if offset != end {
            return Err(BlockError::OutOfBounds {
                section,
                start: location.offset,
                end: offset,
                within: "the chunk, which its header and trees must fill exactly",
            });
        }
        Ok(SeriesChunk {
            series,
            shape,
            entries,
            levels: meta.levels.clone(),
            start: meta.start,
        })
    }

    /// The series' shape, which its trees' values refer to.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Every stored tree, sorted by level and bucket.
    pub fn entries(&self) -> &[TreeEntry] {
        &self.entries
    }

    /// The entries to read for `[from, until)` (Unix seconds, widened to whole finest buckets and
    /// clipped to the block): the fewest whole buckets that cover the range, each read from the
    /// coarsest level whose bucket starts there and ends inside it.
    pub fn plan(&self, from: u64, until: u64) -> Vec<usize> {
        let finest = self.levels[0];
        let end = self.start + *self.levels.last().expect("a level");
        let mut at = (from / finest * finest).max(self.start);
        let until = until.div_ceil(finest).saturating_mul(finest).min(end);
        let mut planned = Vec::new();
        while at < until {
            let level = self
                .levels
                .iter()
                .rposition(|&size| {
                    at.is_multiple_of(size) && at.checked_add(size).is_some_and(|e| e <= until)
                })
                .unwrap_or(0);
            let key = (level as u8, at);
            let first = self.entries.partition_point(|e| (e.level, e.bucket) < key);
            let last = self.entries.partition_point(|e| (e.level, e.bucket) <= key);
            planned.extend(first..last);
            at += self.levels[level];
        }
        planned
    }

    /// The byte range of tree `entry`, to fetch for [`SeriesChunk::read_tree`].
    ///
    /// # Panics
    ///
    /// If `entry` is not a position in [`SeriesChunk::entries`].
    pub fn tree_range(&self, entry: usize) -> Range<u64> {
        let entry = &self.entries[entry];
        entry.offset..entry.offset + entry.len
    }

    /// Reads tree `entry` from `fetched`, which must cover [`SeriesChunk::tree_range`],
    /// checking its CRC, total and node count.
    ///
    /// # Errors
    ///
    /// A [`BlockError`] naming the tree.
    ///
    /// # Panics
    ///
    /// If `entry` is not a position in [`SeriesChunk::entries`].
    pub fn read_tree(&self, entry: usize, fetched: &Fetched<'_>) -> Result<SparseTree, BlockError> {
        let section = Section::Tree {
            series: self.series,
            entry,
        };
        let bytes = fetched.get(self.tree_range(entry), section)?;
        let expected = &self.entries[entry];
        codec::check_crc(section, bytes, expected.crc)?;
        let mut r = Reader::new(bytes, section);
        let tree = SparseTree::decode(&mut r, self.shape.len())?;
        r.finish()?;
        let mut seen = vec![false; self.shape.len()];
        if tree.total() != expected.total
            || node_count(&tree.values, &self.shape.parents, &mut seen) != expected.nodes
        {
            return Err(BlockError::Malformed {
                section,
                offset: 0,
                problem: crate::error::Problem::Invalid {
                    field: "tree",
                    reason: "total or node count differs from the tree table",
                },
            });
        }
        Ok(tree)
    }

    /// Adds the series' data in `[from, until)` to `tree` and returns the writes it sums: the
    /// whole read of one series of one block when `fetched` covers its chunk.
    ///
    /// # Errors
    ///
    /// A [`BlockError`] naming the tree at fault.
    pub fn read_range(
        &self,
        from: u64,
        until: u64,
        fetched: &Fetched<'_>,
        names: &Names,
        tree: &mut Tree,
    ) -> Result<u64, BlockError> {
        let mut sum = Accumulator::new(&self.shape);
        let mut writes = 0u64;
        for entry in self.plan(from, until) {
            sum.add(&self.read_tree(entry, fetched)?);
            writes = writes.saturating_add(self.entries[entry].writes);
        }
        sum.merge_into(&self.shape, names, tree)?;
        Ok(writes)
    }
}

/// Entries sort by level, bucket, merged before separable, then marker; rollups list no markers
/// and are one per bucket; a separable tree holds one marker.
fn check_order(previous: Option<&TreeEntry>, entry: &TreeEntry) -> Result<(), &'static str> {
    if entry.separable && entry.markers.len() != 1 {
        return Err("a separable tree must hold exactly one marker");
    }
    if entry.level > 0 && (entry.separable || !entry.markers.is_empty()) {
        return Err("a rollup lists no markers");
    }
    if entry.total == 0 || entry.len == 0 {
        return Err("an empty tree is not stored");
    }
    let Some(previous) = previous else {
        return Ok(());
    };
    if (previous.level, previous.bucket) != (entry.level, entry.bucket) {
        return Ok(());
    }
    match (previous.separable, entry.separable) {
        (false, false) => Err("two merged trees of one bucket"),
        (true, false) => Err("the merged tree of a bucket must come before its separable ones"),
        (false, true) => Ok(()),
        (true, true) if previous.markers < entry.markers => Ok(()),
        (true, true) => Err("separable trees not sorted by marker"),
    }
}

/// Appends one entry of the header's table.
pub(crate) struct EntryOut<'a> {
    pub(crate) level: u8,
    pub(crate) bucket_delta: u64,
    pub(crate) separable: bool,
    pub(crate) markers: &'a [u32],
    pub(crate) writes: u64,
    pub(crate) total: u64,
    pub(crate) nodes: u64,
    pub(crate) len: u64,
    pub(crate) crc: u32,
}

impl EntryOut<'_> {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, u64::from(self.level));
        put_varint(out, self.bucket_delta);
        out.push(if self.separable { SEPARABLE } else { 0 });
        put_varint(out, self.markers.len() as u64);
        let mut previous = 0;
        for &marker in self.markers {
            put_varint(out, u64::from(marker - previous));
            previous = marker;
        }
        put_varint(out, self.writes);
        put_varint(out, self.total);
        put_varint(out, self.nodes);
        put_varint(out, self.len);
        out.extend_from_slice(&self.crc.to_le_bytes());
    }
}
