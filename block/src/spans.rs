//! Span profiles in a block: per series, the trees of the spans its samples ran in, so that a
//! trace can open the profile of its spans without span ids being series labels.
//!
//! Two optional sections hold them (readers of version 1 that predate them skip both):
//!
//! - **spans** (kind 16, stored as it is): one *span chunk* per series that has spans, in
//!   series order, back to back: a header (lz4 when smaller, CRC-32 checked) and then its
//!   entries' bodies, each with its own CRC-32, so that a query reads the header and only the
//!   bodies of the buckets it asks for.
//! - **span index** (kind 17, lz4 when smaller): where each span chunk is, read with the index.
//!
//! A span chunk stands on its own: its trees are self values over its own shape (the union of
//! the nodes of the series' span trees, frame ids of the block's name table), not over the
//! series' shape in the trees section, so that a merge writes the span chunks after every tree
//! chunk, one series at a time, without keeping the trees' shapes.
//!
//! ```text
//! span index:  chunk count, per chunk (series order): series position delta (the first is the
//!              position), header codec u8, header stored length, header raw length,
//!              header CRC-32 u32 LE, chunk length
//! span chunk:  header: shape (as in a tree chunk), entry count, per entry sorted by bucket,
//!              the merged entry before the separable ones, those by marker:
//!                bucket delta in finest buckets (from the previous entry, or the block's
//!                start), flags u8 (bit 0 separable), marker position (separable only),
//!                span count, body length, body CRC-32 u32 LE
//!              then the bodies in entry order, each: per span in span id order:
//!                span id (8 bytes, big-endian), its tree (the layout of `tree.rs`)
//! ```
//!
//! Entries mirror the finest trees of the series' chunk: an entry holds the spans of the tree
//! of the same bucket, separability and marker, so that a merge counts a batch's spans exactly
//! when it counts the batch's tree. Rollups have no span entries: span queries read finest
//! buckets, the range of a trace.

use std::collections::HashSet;
use std::ops::Range;

use smolder_common::{SpanId, Tree};

use crate::codec::{self, Reader, put_varint};
use crate::error::{BlockError, Section};
use crate::footer::{Fetched, Footer, Kind, Limits};
use crate::index::{ChunkLocation, Index, check_filled};
use crate::names::Names;
use crate::shape::Shape;
use crate::tree::{Accumulator, SparseTree};

/// Flag bit: the entry holds one separable tree's spans.
const SEPARABLE: u8 = 1;

/// Bytes a span takes at least in a body: its id and a tree of one value.
const MIN_SPAN_BYTES: usize = 12;

/// Where one series' span chunk lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SpanLocation {
    /// The series' position in the block's index.
    pub(crate) series: u32,
    /// The chunk: its header and bodies.
    pub(crate) chunk: ChunkLocation,
}

/// Where a block's span chunks are: empty for a block without span profiles. See the
/// [module documentation](self).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpanIndex {
    chunks: Vec<SpanLocation>,
}

impl SpanIndex {
    /// Decodes the span index from `fetched`, which must cover
    /// [`Footer::span_index_range`] when there is one; an empty index for a block without.
    ///
    /// # Errors
    ///
    /// A [`BlockError`] naming the span index: one section without the other, a series
    /// position outside `index`, chunks that do not fill the spans section exactly.
    pub fn decode(
        footer: &Footer,
        index: &Index,
        fetched: &Fetched<'_>,
        limits: &Limits,
    ) -> Result<SpanIndex, BlockError> {
        let spans = footer.entry(Kind::Spans).ok().map(|e| e.range());
        let Some(_) = footer.span_index_range() else {
            if spans.is_some() {
                return Err(BlockError::MissingSection {
                    section: Section::SpanIndex,
                });
            }
            return Ok(SpanIndex::default());
        };
        let spans = spans.ok_or(BlockError::MissingSection {
            section: Section::Spans,
        })?;
        let raw = footer.read(Kind::SpanIndex, fetched, limits)?;
        let chunks = parse_index(&raw, index.series().len(), spans)?;
        Ok(SpanIndex { chunks })
    }

    /// Whether the block has no span profiles.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// How many series have span profiles.
    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    /// The positions of the series with span profiles, in order.
    pub fn series(&self) -> impl Iterator<Item = usize> + '_ {
        self.chunks.iter().map(|c| c.series as usize)
    }

    fn location(&self, series: usize) -> Option<&SpanLocation> {
        self.chunks
            .binary_search_by_key(&series, |c| c.series as usize)
            .ok()
            .map(|i| &self.chunks[i])
    }

    /// The range to fetch for [`SpanChunk::decode`]: the header of series `series`' span
    /// chunk; `None` when the series has no span profiles here.
    pub fn chunk_header_range(&self, series: usize) -> Option<Range<u64>> {
        self.location(series)
            .map(|c| c.chunk.offset..c.chunk.offset + c.chunk.header_stored)
    }

    /// The range of series `series`' whole span chunk; `None` when it has none.
    pub fn chunk_range(&self, series: usize) -> Option<Range<u64>> {
        self.location(series).map(|c| c.chunk.offset..c.chunk.end())
    }

    /// The raw bytes of the span index section for `chunks`, in series order.
    pub(crate) fn encode(chunks: &[SpanLocation]) -> Vec<u8> {
        let mut out = Vec::new();
        put_varint(&mut out, chunks.len() as u64);
        let mut previous = 0;
        for location in chunks {
            put_varint(&mut out, u64::from(location.series - previous));
            previous = location.series;
            location.chunk.encode(&mut out);
        }
        out
    }
}

/// One entry of a span chunk: the spans of one finest tree of the series.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanEntry {
    /// Unix seconds of its finest bucket.
    pub bucket: u64,
    /// Whether it holds the spans of a separable tree (one batch's data kept apart).
    pub separable: bool,
    /// A separable entry's batch: its position in [`Index::markers`].
    pub marker: Option<u32>,
    /// How many spans its body holds.
    pub spans: u64,
    offset: u64,
    len: u64,
    crc: u32,
}

/// The decoded header of one series' span chunk. See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct SpanChunk {
    series: usize,
    shape: Shape,
    entries: Vec<SpanEntry>,
    finest: u64,
}

impl SpanChunk {
    /// Decodes the header of series `series`' span chunk from `fetched`, which must cover
    /// [`SpanIndex::chunk_header_range`].
    ///
    /// # Errors
    ///
    /// A [`BlockError`] naming the span chunk.
    ///
    /// # Panics
    ///
    /// If `series` has no span chunk in `spans`.
    pub fn decode(
        index: &Index,
        spans: &SpanIndex,
        series: usize,
        fetched: &Fetched<'_>,
        limits: &Limits,
    ) -> Result<SpanChunk, BlockError> {
        let section = Section::SpanChunk { series };
        let location = spans
            .location(series)
            .expect("a series with a span chunk")
            .chunk;
        let range = location.offset..location.offset + location.header_stored;
        let raw = codec::open(
            section,
            fetched.get(range, section)?,
            location.header_codec,
            location.header_raw,
            location.header_crc,
            limits.max_section_bytes,
        )?;
        let meta = index.meta();
        let layout = Layout {
            start: meta.start,
            end: meta.end(),
            finest: meta.finest(),
            names: meta.names as u32,
            markers: index.markers().len() as u64,
        };
        let (shape, entries) = parse_header(&raw, section, &layout, &location)?;
        let finest = layout.finest;
        Ok(SpanChunk {
            series,
            shape,
            entries,
            finest,
        })
    }

    /// The chunk's own shape, which its span trees' values refer to.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Every entry, sorted by bucket.
    pub fn entries(&self) -> &[SpanEntry] {
        &self.entries
    }

    /// The entries in `[from, until)` (Unix seconds, widened to whole finest buckets).
    pub fn plan(&self, from: u64, until: u64) -> Range<usize> {
        let from = from / self.finest * self.finest;
        let until = until.div_ceil(self.finest).saturating_mul(self.finest);
        let first = self.entries.partition_point(|e| e.bucket < from);
        let last = self.entries.partition_point(|e| e.bucket < until);
        first..last.max(first)
    }

    /// The byte range of entry `entry`'s body, to fetch for [`SpanChunk::read_entry`].
    ///
    /// # Panics
    ///
    /// If `entry` is not a position in [`SpanChunk::entries`].
    pub fn entry_range(&self, entry: usize) -> Range<u64> {
        let entry = &self.entries[entry];
        entry.offset..entry.offset + entry.len
    }

    /// Reads entry `entry`'s spans from `fetched`, which must cover
    /// [`SpanChunk::entry_range`]: each span id with its tree, in span id order.
    ///
    /// # Errors
    ///
    /// A [`BlockError`] naming the entry.
    ///
    /// # Panics
    ///
    /// If `entry` is not a position in [`SpanChunk::entries`].
    pub fn read_entry(
        &self,
        entry: usize,
        fetched: &Fetched<'_>,
    ) -> Result<Vec<(SpanId, SparseTree)>, BlockError> {
        let section = Section::SpanEntry {
            series: self.series,
            entry,
        };
        let bytes = fetched.get(self.entry_range(entry), section)?;
        let expected = &self.entries[entry];
        codec::check_crc(section, bytes, expected.crc)?;
        parse_body(bytes, section, expected.spans, self.shape.len())
    }

    /// Adds to `tree` the spans among `wanted` (sorted) in `[from, until)`, read from
    /// `fetched`, which must cover their bodies; returns how many entries had any.
    ///
    /// # Errors
    ///
    /// A [`BlockError`] naming the entry at fault, or the names section when the shape names
    /// a frame the table does not have.
    pub fn read_range(
        &self,
        from: u64,
        until: u64,
        wanted: &[SpanId],
        fetched: &Fetched<'_>,
        names: &Names,
        tree: &mut Tree,
    ) -> Result<u64, BlockError> {
        self.read_range_without((from, until), wanted, &HashSet::new(), fetched, names, tree)
    }

    /// As [`SpanChunk::read_range`], leaving out the separable entries of the batches in `skip`
    /// (positions in [`Index::markers`]): a batch another block holds too is counted there.
    ///
    /// # Errors
    ///
    /// As [`SpanChunk::read_range`].
    pub fn read_range_without(
        &self,
        (from, until): (u64, u64),
        wanted: &[SpanId],
        skip: &HashSet<u32>,
        fetched: &Fetched<'_>,
        names: &Names,
        tree: &mut Tree,
    ) -> Result<u64, BlockError> {
        let mut sum = Accumulator::new(&self.shape);
        let mut found = 0u64;
        for entry in self.plan(from, until) {
            let skipped = self.entries[entry]
                .marker
                .is_some_and(|m| self.entries[entry].separable && skip.contains(&m));
            if skipped {
                continue;
            }
            let mut any = false;
            for (span, values) in self.read_entry(entry, fetched)? {
                if wanted.binary_search(&span).is_ok() {
                    sum.add(&values);
                    any = true;
                }
            }
            found += u64::from(any);
        }
        if found > 0 {
            sum.merge_into(&self.shape, names, tree)?;
        }
        Ok(found)
    }
}

/// The span index's raw bytes read: chunks back to back over `spans`, of series below
/// `series`.
fn parse_index(
    raw: &[u8],
    series: usize,
    spans: Range<u64>,
) -> Result<Vec<SpanLocation>, BlockError> {
    let mut r = Reader::new(raw, Section::SpanIndex);
    let count = r.count("span chunk", 9)?;
    let mut chunks: Vec<SpanLocation> = Vec::with_capacity(count);
    let mut offset = spans.start;
    let mut position = 0u64;
    for i in 0..count {
        let delta = r.varint("series position delta")?;
        if i > 0 && delta == 0 {
            return Err(r.invalid("series position delta", "positions must increase"));
        }
        position = position.saturating_add(delta);
        if position >= series as u64 {
            return Err(r.invalid("series position", "not a series of the block"));
        }
        let chunk = ChunkLocation::read(&mut r, offset, &spans, "the spans section")?;
        offset = chunk.end();
        chunks.push(SpanLocation {
            series: position as u32,
            chunk,
        });
    }
    r.finish()?;
    check_filled(
        Section::SpanIndex,
        &spans,
        offset,
        "the spans section, which its chunks must fill exactly",
    )?;
    Ok(chunks)
}

/// What a span chunk's header is checked against: the block's range, finest bucket, name
/// table and marker count.
struct Layout {
    start: u64,
    end: u64,
    finest: u64,
    names: u32,
    markers: u64,
}

/// A span chunk's decompressed header read: its shape and entries, the bodies laid out after
/// the header of the chunk at `location`, which they must fill exactly.
fn parse_header(
    raw: &[u8],
    section: Section,
    layout: &Layout,
    location: &ChunkLocation,
) -> Result<(Shape, Vec<SpanEntry>), BlockError> {
    let mut r = Reader::new(raw, section);
    let shape = Shape::decode(&mut r, layout.names)?;
    let count = r.count("span entry", 8)?;
    let mut entries: Vec<SpanEntry> = Vec::with_capacity(count);
    let mut offset = location.offset + location.header_stored;
    for _ in 0..count {
        let delta = r.varint("bucket delta")?;
        let base = entries.last().map_or(layout.start, |e| e.bucket);
        let bucket = delta
            .checked_mul(layout.finest)
            .and_then(|d| d.checked_add(base))
            .filter(|&b| b < layout.end)
            .ok_or_else(|| r.invalid("bucket", "outside the block"))?;
        let flags = r.byte("flags")?;
        if flags & !SEPARABLE != 0 {
            return Err(r.invalid("flags", "unknown flag bits set"));
        }
        let separable = flags & SEPARABLE != 0;
        let marker = if separable {
            let marker = r.varint("marker")?;
            if marker >= layout.markers {
                return Err(r.invalid("marker", "not in the markers section"));
            }
            Some(marker as u32)
        } else {
            None
        };
        let entry = SpanEntry {
            bucket,
            separable,
            marker,
            spans: r.varint("span count")?,
            offset,
            len: r.varint("body length")?,
            crc: r.u32_le("body crc")?,
        };
        if entry.spans == 0 || entry.spans.saturating_mul(MIN_SPAN_BYTES as u64) > entry.len {
            return Err(r.invalid("span count", "zero, or more than the body can hold"));
        }
        if let Some(previous) = entries.last() {
            let key = |e: &SpanEntry| (e.bucket, e.separable, e.marker);
            if key(previous) >= key(&entry) {
                return Err(r.invalid("span entry", "not sorted, or listed twice"));
            }
        }
        offset = offset
            .checked_add(entry.len)
            .ok_or_else(|| r.invalid("body length", "overflows"))?;
        entries.push(entry);
    }
    r.finish()?;
    check_filled(
        section,
        &(location.offset..location.end()),
        offset,
        "the span chunk, which its header and bodies must fill exactly",
    )?;
    Ok((shape, entries))
}

/// An entry's body read (its CRC checked): `count` spans over a shape of `shape_len` nodes.
fn parse_body(
    bytes: &[u8],
    section: Section,
    count: u64,
    shape_len: usize,
) -> Result<Vec<(SpanId, SparseTree)>, BlockError> {
    let mut r = Reader::new(bytes, section);
    if count.saturating_mul(MIN_SPAN_BYTES as u64) > bytes.len() as u64 {
        return Err(r.invalid("span count", "more than the body can hold"));
    }
    let mut spans: Vec<(SpanId, SparseTree)> = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let id = r.take(8, "span id")?;
        let id = SpanId::from_bytes(id.try_into().expect("8 bytes"))
            .ok_or_else(|| r.invalid("span id", "all zeros"))?;
        if spans.last().is_some_and(|(last, _)| *last >= id) {
            return Err(r.invalid("span id", "not sorted, or listed twice"));
        }
        let tree = SparseTree::decode(&mut r, shape_len)?;
        if tree.values.is_empty() {
            return Err(r.invalid("span tree", "empty"));
        }
        spans.push((id, tree));
    }
    r.finish()?;
    Ok(spans)
}

/// Appends one entry of a span chunk's header.
pub(crate) struct SpanEntryOut {
    pub(crate) bucket_delta: u64,
    pub(crate) marker: Option<u32>,
    pub(crate) spans: u64,
    pub(crate) len: u64,
    pub(crate) crc: u32,
}

impl SpanEntryOut {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.bucket_delta);
        match self.marker {
            Some(marker) => {
                out.push(SEPARABLE);
                put_varint(out, u64::from(marker));
            }
            None => out.push(0),
        }
        put_varint(out, self.spans);
        put_varint(out, self.len);
        out.extend_from_slice(&self.crc.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn location(len: u64) -> ChunkLocation {
        ChunkLocation {
            offset: 100,
            header_codec: crate::codec::Codec::None,
            header_stored: 0,
            header_raw: 0,
            header_crc: 0,
            len,
        }
    }

    const LAYOUT: Layout = Layout {
        start: 1_000,
        end: 2_000,
        finest: 10,
        names: 8,
        markers: 4,
    };

    proptest! {
        /// Behind their CRCs: arbitrary bytes read as a span index, header or body, or an
        /// error; never a panic, and what reads keeps the format's invariants.
        #[test]
        fn arbitrary_span_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..160)) {
            if let Ok(chunks) = parse_index(&bytes, 4, 100..400) {
                prop_assert!(chunks.windows(2).all(|w| w[0].series < w[1].series));
                prop_assert!(chunks.iter().all(|c| c.series < 4 && c.chunk.end() <= 400));
            }
            let section = Section::SpanChunk { series: 0 };
            if let Ok((shape, entries)) = parse_header(&bytes, section, &LAYOUT, &location(4_000)) {
                prop_assert!(shape.len() == shape.parents.len());
                prop_assert!(entries.iter().all(|e| (1_000..2_000).contains(&e.bucket)));
                prop_assert!(entries.iter().all(|e| e.separable == e.marker.is_some()));
            }
            let section = Section::SpanEntry { series: 0, entry: 0 };
            for count in [1, 2, 5] {
                if let Ok(spans) = parse_body(&bytes, section, count, 8) {
                    prop_assert_eq!(spans.len() as u64, count);
                    prop_assert!(spans.windows(2).all(|w| w[0].0 < w[1].0));
                }
            }
        }
    }

    #[test]
    fn an_entry_body_round_trips_and_refuses_disorder() {
        let a = SpanId::from_bytes([0, 0, 0, 0, 0, 0, 0, 1]).unwrap();
        let b = SpanId::from_bytes([0, 0, 0, 0, 0, 0, 0, 2]).unwrap();
        let body = |first: SpanId, second: SpanId| {
            let mut out = Vec::new();
            for (span, values) in [(first, vec![(1, 3)]), (second, vec![(0, 1), (2, 5)])] {
                out.extend_from_slice(&span.to_bytes());
                crate::tree::encode(&values, &mut out);
            }
            out
        };
        let section = Section::SpanEntry {
            series: 0,
            entry: 0,
        };
        let spans = parse_body(&body(a, b), section, 2, 3).unwrap();
        assert_eq!(spans[0].0, a);
        assert_eq!(spans[1].1.values(), [(0, 1), (2, 5)]);
        let err = parse_body(&body(b, a), section, 2, 3).unwrap_err();
        assert!(err.to_string().contains("not sorted"), "{err}");
        assert!(
            parse_body(&body(a, b), section, 2, 2).is_err(),
            "node 2 of 2"
        );
        assert!(
            parse_body(&body(a, b), section, 3, 3).is_err(),
            "a third span"
        );
    }
}
