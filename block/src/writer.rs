//! Writing a block, one series at a time: the code that [`BlockBuilder`](crate::BlockBuilder)
//! and the merger share.
//!
//! For each series the writer takes its finest-level trees (as self values of nodes of a
//! [`Trie`]), counts every batch once (`combine`), orders the shape canonically (children by
//! frame name, frame ids by first use), builds every rollup once, and appends the series' chunk.
//! The output comes out in pieces ([`BlockWriter::take_output`]) so that a caller can stream a
//! large block to a file or an upload; [`BlockWriter::finish`] appends the small sections, the
//! directory and the tail.
//!
//! Span profiles come second: once every series' chunk is written, [`BlockWriter::push_spans`]
//! appends each series' span chunk (`spans.rs`), keeping exactly the spans of the trees the
//! first pass kept, so that a merge or downsampling streams them as it streams trees.
//!
//! The same data gives the same bytes, whatever order it was added in.

use std::collections::{BTreeMap, HashMap, HashSet};

use smolder_common::{ProfileMeta, Series, SpanId};

use crate::chunk::EntryOut;
use crate::codec::{self, put_varint};
use crate::error::WriteError;
use crate::footer::{self, Deletion, Entry, Kind, MAGIC};
use crate::index::{self, BlockMeta, ChunkLocation, Marker, SeriesEntry};
use crate::names::Interner;
use crate::shape::{NO_FRAME, Shape, Trie};
use crate::spans::{SpanEntryOut, SpanIndex, SpanLocation};
use crate::tree::{self, node_count};

/// The level ladder: from `finest` up by factors of ten to `span`, for a block starting at
/// `start`.
///
/// # Errors
///
/// [`WriteError::BadLevels`] when `span` is not `finest` times a power of ten, or `start` is
/// not a multiple of `span`.
pub(crate) fn ladder(finest: u64, span: u64, start: u64) -> Result<Vec<u64>, WriteError> {
    let bad = WriteError::BadLevels {
        finest,
        span,
        start,
    };
    if finest == 0 || span == 0 || !start.is_multiple_of(span) || start.checked_add(span).is_none()
    {
        return Err(bad);
    }
    let mut levels = vec![finest];
    while *levels.last().expect("one level") < span {
        let next = levels.last().expect("one level").saturating_mul(10);
        levels.push(next);
    }
    if *levels.last().expect("one level") != span {
        return Err(bad);
    }
    Ok(levels)
}

/// One finest-level tree to write.
#[derive(Clone, Debug)]
pub(crate) struct Part {
    /// Unix seconds of the start of the bucket its data was written in.
    pub(crate) bucket: u64,
    /// That bucket's size in seconds: the finest level of the block it comes from.
    pub(crate) size: u64,
    /// Holds exactly one batch's data, kept apart.
    pub(crate) separable: bool,
    /// Positions in the writer's markers of the batches whose data it holds.
    pub(crate) markers: Vec<u32>,
    /// Writes it sums.
    pub(crate) writes: u64,
    /// Self values of trie nodes, each node at most once.
    pub(crate) values: Vec<(u32, u64)>,
    /// Which input it came from (the merger's input, the builder's part): with its bucket
    /// and marker, it names a separable part that [`Pushed::dropped`] lists.
    pub(crate) origin: u32,
}

/// What [`BlockWriter::push_series`] did with a series, for its spans.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pushed {
    /// The series' position in the block, if it was written (all its trees may be dropped).
    pub(crate) position: Option<usize>,
    /// The separable parts dropped as copies of a batch already counted: (origin, bucket,
    /// marker). Their spans go with them.
    pub(crate) dropped: Vec<(u32, u64, u32)>,
}

/// The spans of one finest tree to write.
#[derive(Clone, Debug)]
pub(crate) struct SpanPart {
    /// As its [`Part`]'s.
    pub(crate) origin: u32,
    /// As its [`Part`]'s: the bucket its data was written in.
    pub(crate) bucket: u64,
    /// Whether its part is separable; then `marker` is the part's one marker.
    pub(crate) separable: bool,
    pub(crate) marker: Option<u32>,
    /// Each span with its self values over [`SeriesSpans::trie`]'s nodes.
    pub(crate) spans: Vec<(SpanId, Vec<(u32, u64)>)>,
}

/// A series' span trees to write.
#[derive(Clone, Debug, Default)]
pub(crate) struct SeriesSpans {
    /// The nodes of every span tree of the series, frames named as the series' own trie.
    pub(crate) trie: Trie,
    pub(crate) parts: Vec<SpanPart>,
}

impl SeriesSpans {
    /// Whether there is nothing to write.
    pub(crate) fn is_empty(&self) -> bool {
        self.parts.iter().all(|p| p.spans.is_empty())
    }
}

/// Each span's self values over a trie, by span.
type SpanValues = BTreeMap<SpanId, Vec<(u32, u64)>>;

/// A series' data to write.
#[derive(Clone, Debug, Default)]
pub(crate) struct SeriesParts {
    pub(crate) trie: Trie,
    pub(crate) parts: Vec<Part>,
    /// The metadata of its newest data, and that data's bucket.
    pub(crate) meta: Option<(u64, ProfileMeta)>,
}

/// What a written block holds and what writing it dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteReport {
    /// Series written.
    pub series: u64,
    /// Trees written, rollups included.
    pub trees: u64,
    /// Nodes of the finest-level trees.
    pub nodes: u64,
    /// Separable trees dropped because their batch was already counted.
    pub duplicates: u64,
    /// Span trees written (one per span and finest tree).
    pub spans: u64,
    /// The block's length in bytes.
    pub bytes: u64,
}

/// Writes one block. See the [module documentation](self).
pub(crate) struct BlockWriter {
    meta: BlockMeta,
    markers: Vec<Marker>,
    /// Ids of the blocks this one replaces, for the sources section.
    sources: Vec<String>,
    /// The app deletions it was built with (canonical), for the deletions section.
    deletions: Vec<Deletion>,
    keep_separable: bool,
    names: Interner,
    series: Vec<SeriesEntry>,
    /// Bytes not yet taken by the caller.
    out: Vec<u8>,
    /// Bytes written so far, taken or not.
    written: u64,
    trees_crc: crc32fast::Hasher,
    /// Where the spans section starts, once the first span chunk is written.
    spans_start: Option<u64>,
    spans_crc: crc32fast::Hasher,
    span_chunks: Vec<SpanLocation>,
    /// The separable parts [`BlockWriter::combine`] dropped from the series being pushed.
    dropped: Vec<(u32, u64, u32)>,
    report: WriteReport,
}

impl BlockWriter {
    /// A writer of a block of `tenant` over `levels` from `start`, holding `markers` (sorted,
    /// distinct), `compactions` deep. With `keep_separable`, separable trees stay apart (a block
    /// cut from the head); without, each bucket's trees are summed into one (a merge).
    pub(crate) fn new(
        tenant: &str,
        start: u64,
        levels: Vec<u64>,
        markers: Vec<Marker>,
        compactions: u32,
        keep_separable: bool,
    ) -> BlockWriter {
        debug_assert!(markers.windows(2).all(|w| w[0] < w[1]), "markers sorted");
        let mut out = Vec::with_capacity(1 << 16);
        out.extend_from_slice(&MAGIC);
        BlockWriter {
            meta: BlockMeta {
                tenant: tenant.to_owned(),
                start,
                levels,
                names: 0,
                series: 0,
                trees: 0,
                nodes: 0,
                markers: markers.len() as u64,
                compactions,
            },
            markers,
            sources: Vec::new(),
            deletions: Vec::new(),
            keep_separable,
            names: Interner::default(),
            series: Vec::new(),
            written: out.len() as u64,
            out,
            trees_crc: crc32fast::Hasher::new(),
            spans_start: None,
            spans_crc: crc32fast::Hasher::new(),
            span_chunks: Vec::new(),
            dropped: Vec::new(),
            report: WriteReport::default(),
        }
    }

    /// Records the ids of the blocks this block replaces (written as its sources section).
    pub(crate) fn set_sources(&mut self, mut sources: Vec<String>) {
        sources.sort();
        sources.dedup();
        self.sources = sources;
    }

    /// Records the app deletions this block was built with (written as its deletions section),
    /// as `footer::canonical_deletions` orders them.
    pub(crate) fn set_deletions(&mut self, deletions: Vec<Deletion>) {
        self.deletions = deletions;
    }

    /// Appends one series' chunk. Series must come in increasing order, all before any span
    /// chunk; `name` gives the frame name of a trie frame id.
    ///
    /// # Panics
    ///
    /// When a span chunk was written already.
    pub(crate) fn push_series<'n>(
        &mut self,
        series: &Series,
        data: SeriesParts,
        name: impl Fn(u32) -> &'n str,
    ) -> Result<Pushed, WriteError> {
        debug_assert!(
            self.series.last().is_none_or(|last| &last.series < series),
            "series pushed in order"
        );
        assert!(
            self.spans_start.is_none(),
            "every series' trees come before the spans"
        );
        let SeriesParts { trie, parts, meta } = data;
        self.dropped.clear();
        let parts = self.combine(series, parts)?;
        let dropped = std::mem::take(&mut self.dropped);
        if parts.is_empty() {
            return Ok(Pushed {
                position: None,
                dropped,
            });
        }
        let (shape, renumber) =
            self.canonical_shape(&trie, parts.iter().map(|p| p.values.as_slice()), &name);
        let mut seen = vec![false; shape.len()];

        // The finest level as written, then each rollup from the level below it.
        let mut levels: Vec<Vec<Part>> = vec![
            parts
                .into_iter()
                .map(|mut part| {
                    for value in &mut part.values {
                        value.0 = renumber[value.0 as usize];
                    }
                    part.values.sort_unstable_by_key(|&(node, _)| node);
                    part
                })
                .collect(),
        ];
        let mut sum = Sum::new(shape.len());
        for &size in &self.meta.levels[1..] {
            let below = levels.last().expect("the finest level");
            let mut rollups = Vec::new();
            for group in below.chunk_by(|a, b| a.bucket / size == b.bucket / size) {
                let mut writes = 0u64;
                for part in group {
                    sum.add(&part.values);
                    writes = writes.saturating_add(part.writes);
                }
                rollups.push(Part {
                    bucket: group[0].bucket / size * size,
                    size,
                    separable: false,
                    markers: Vec::new(),
                    writes,
                    values: sum.take(),
                    origin: 0,
                });
            }
            levels.push(rollups);
        }

        let mut header = Vec::new();
        shape.encode(&mut header);
        let mut trees = Vec::new();
        put_varint(
            &mut header,
            levels.iter().map(Vec::len).sum::<usize>() as u64,
        );
        let (first, last) = (levels[0][0].bucket, levels[0][levels[0].len() - 1].bucket);
        for (level, parts) in levels.iter().enumerate() {
            let size = self.meta.levels[level];
            let mut previous = self.meta.start;
            for part in parts {
                let start = trees.len();
                tree::encode(&part.values, &mut trees);
                let nodes = node_count(&part.values, &shape.parents, &mut seen);
                if level == 0 {
                    self.report.nodes += nodes;
                }
                EntryOut {
                    level: level as u8,
                    bucket_delta: (part.bucket - previous) / size,
                    separable: part.separable,
                    markers: &part.markers,
                    writes: part.writes,
                    total: tree::total(&part.values),
                    nodes,
                    len: (trees.len() - start) as u64,
                    crc: codec::crc(&trees[start..]),
                }
                .encode(&mut header);
                previous = part.bucket;
                self.report.trees += 1;
            }
        }
        let header_raw = header.len() as u64;
        let (header_codec, header) = codec::compress(header);
        let location = ChunkLocation {
            offset: self.written,
            header_codec,
            header_stored: header.len() as u64,
            header_raw,
            header_crc: codec::crc(&header),
            len: (header.len() + trees.len()) as u64,
        };
        self.append_trees(&header);
        self.append_trees(&trees);
        self.series.push(SeriesEntry {
            series: series.clone(),
            meta: meta.map(|(_, meta)| meta).unwrap_or_default(),
            first_bucket: first,
            last_bucket: last,
            chunk: location,
        });
        self.report.series += 1;
        Ok(Pushed {
            position: Some(self.series.len() - 1),
            dropped,
        })
    }

    /// Appends the span chunk of the series `pushed` describes (nothing when it was not
    /// written or has no spans left): the spans of the trees it kept, each finest bucket's
    /// merged spans in one entry and, in a cut, each separable tree's in its own. Span chunks
    /// must come in series order, after every series' trees; `name` gives the frame name of a
    /// trie frame id.
    pub(crate) fn push_spans<'n>(
        &mut self,
        pushed: &Pushed,
        data: SeriesSpans,
        name: impl Fn(u32) -> &'n str,
    ) {
        let Some(position) = pushed.position else {
            return;
        };
        debug_assert!(
            self.span_chunks
                .last()
                .is_none_or(|last| (last.series as usize) < position),
            "span chunks pushed in series order"
        );
        let finest = self.meta.finest();
        let mut entries: BTreeMap<(u64, bool, Option<u32>), SpanValues> = BTreeMap::new();
        for part in data.parts {
            if let (true, Some(marker)) = (part.separable, part.marker)
                && pushed.dropped.contains(&(part.origin, part.bucket, marker))
            {
                continue;
            }
            let bucket = part.bucket / finest * finest;
            let key = if self.keep_separable && part.separable {
                (bucket, true, part.marker)
            } else {
                (bucket, false, None)
            };
            let entry = entries.entry(key).or_default();
            for (span, values) in part.spans {
                entry.entry(span).or_default().extend(values);
            }
        }
        for spans in entries.values_mut() {
            for values in spans.values_mut() {
                *values = sum_values(std::mem::take(values));
            }
            spans.retain(|_, values| !values.is_empty());
        }
        entries.retain(|_, spans| !spans.is_empty());
        if entries.is_empty() {
            return;
        }
        let (shape, renumber) = self.canonical_shape(
            &data.trie,
            entries
                .values()
                .flat_map(|spans| spans.values().map(Vec::as_slice)),
            &name,
        );
        let mut header = Vec::new();
        shape.encode(&mut header);
        put_varint(&mut header, entries.len() as u64);
        let mut bodies = Vec::new();
        let mut previous = self.meta.start;
        for ((bucket, _, marker), spans) in entries {
            let start = bodies.len();
            for (span, mut values) in spans.iter().map(|(s, v)| (*s, v.clone())) {
                for value in &mut values {
                    value.0 = renumber[value.0 as usize];
                }
                values.sort_unstable_by_key(|&(node, _)| node);
                bodies.extend_from_slice(&span.to_bytes());
                tree::encode(&values, &mut bodies);
            }
            self.report.spans += spans.len() as u64;
            SpanEntryOut {
                bucket_delta: (bucket - previous) / finest,
                marker,
                spans: spans.len() as u64,
                len: (bodies.len() - start) as u64,
                crc: codec::crc(&bodies[start..]),
            }
            .encode(&mut header);
            previous = bucket;
        }
        let header_raw = header.len() as u64;
        let (header_codec, header) = codec::compress(header);
        self.spans_start.get_or_insert(self.written);
        self.span_chunks.push(SpanLocation {
            series: position as u32,
            chunk: ChunkLocation {
                offset: self.written,
                header_codec,
                header_stored: header.len() as u64,
                header_raw,
                header_crc: codec::crc(&header),
                len: (header.len() + bodies.len()) as u64,
            },
        });
        for bytes in [&header, &bodies] {
            self.spans_crc.update(bytes);
            self.out.extend_from_slice(bytes);
            self.written += bytes.len() as u64;
        }
    }

    fn append_trees(&mut self, bytes: &[u8]) {
        self.trees_crc.update(bytes);
        self.out.extend_from_slice(bytes);
        self.written += bytes.len() as u64;
    }

    /// Counts every batch once. A batch is known by its marker and the bucket its data was
    /// written in (`Part::bucket` and `Part::size`, before it is folded into this block's
    /// finest buckets), so that one batch's data in two buckets is not taken for a copy.
    ///
    /// Merged trees go first: a batch summed into two merged trees over overlapping buckets
    /// cannot be taken out of either and is an error; a separable tree whose batch is already
    /// counted in its bucket is dropped. Unless separable trees are kept apart, each bucket's
    /// survivors are summed into one merged tree. Empty trees are dropped.
    fn combine(&mut self, series: &Series, mut parts: Vec<Part>) -> Result<Vec<Part>, WriteError> {
        let finest = self.meta.finest();
        // Stable: within a bucket, merged trees first, each kind in the order given.
        parts.sort_by_key(|part| (part.bucket / finest, part.separable));
        let mut out = Vec::new();
        // Per marker, the buckets `[start, end)` of merged trees holding it.
        let mut merged_in: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
        let mut separate: HashSet<(u32, u64)> = HashSet::new();
        let mut parts = parts.into_iter().peekable();
        while let Some(first) = parts.next() {
            let bucket = first.bucket / finest * finest;
            merged_in.clear();
            separate.clear();
            let mut merged = Part {
                bucket,
                size: finest,
                separable: false,
                markers: Vec::new(),
                writes: 0,
                values: Vec::new(),
                origin: 0,
            };
            let mut kept = Vec::new();
            let mut next = Some(first);
            while let Some(mut part) = next.take() {
                let (start, end) = (part.bucket, part.bucket.saturating_add(part.size));
                let overlaps = |ranges: Option<&Vec<(u64, u64)>>| {
                    ranges.is_some_and(|r| r.iter().any(|&(s, e)| s < end && start < e))
                };
                if part.separable {
                    let marker = part.markers[0];
                    if overlaps(merged_in.get(&marker)) || !separate.insert((marker, start)) {
                        self.report.duplicates += 1;
                        self.dropped.push((part.origin, part.bucket, marker));
                    } else if self.keep_separable {
                        part.bucket = bucket;
                        kept.push(part);
                    } else {
                        merged.absorb(part);
                    }
                } else {
                    if let Some(&marker) = part.markers.iter().find(|m| overlaps(merged_in.get(m)))
                    {
                        let marker = &self.markers[marker as usize];
                        return Err(WriteError::InseparableDuplicate {
                            agent_id: marker.agent_id.clone(),
                            sequence: marker.sequence,
                            series: series.to_string(),
                            bucket,
                        });
                    }
                    for &marker in &part.markers {
                        merged_in.entry(marker).or_default().push((start, end));
                    }
                    merged.absorb(part);
                }
                next = parts.next_if(|p| p.bucket / finest * finest == bucket);
            }
            merged.markers.sort_unstable();
            merged.markers.dedup();
            merged.values = sum_values(merged.values);
            if !merged.values.is_empty() {
                out.push(merged);
            }
            kept.sort_by(|a, b| a.markers.cmp(&b.markers));
            for mut part in kept {
                part.values.retain(|&(_, v)| v > 0);
                if !part.values.is_empty() {
                    out.push(part);
                }
            }
        }
        Ok(out)
    }

    /// The shape of the trie nodes that `values` use, children in frame-name order, with frame
    /// ids of this block's name table (interned by first use), and the new id of each trie node.
    fn canonical_shape<'n, 'v>(
        &mut self,
        trie: &Trie,
        values: impl Iterator<Item = &'v [(u32, u64)]>,
        name: &impl Fn(u32) -> &'n str,
    ) -> (Shape, Vec<u32>) {
        let mut used = vec![false; trie.len()];
        used[0] = true;
        for values in values {
            for &(node, _) in values {
                let mut at = node;
                while !used[at as usize] {
                    used[at as usize] = true;
                    at = trie.parents[at as usize];
                }
            }
        }
        let mut children: Vec<Vec<u32>> = vec![Vec::new(); trie.len()];
        for node in 1..trie.len() {
            if used[node] {
                children[trie.parents[node] as usize].push(node as u32);
            }
        }
        for list in &mut children {
            list.sort_by(|&a, &b| name(trie.frames[a as usize]).cmp(name(trie.frames[b as usize])));
        }
        let mut renumber = vec![u32::MAX; trie.len()];
        let mut shape = Shape::default();
        let mut pending = vec![(0u32, 0u32)];
        while let Some((node, parent)) = pending.pop() {
            renumber[node as usize] = shape.frames.len() as u32;
            let frame = match node {
                0 => NO_FRAME,
                _ => self.names.intern(name(trie.frames[node as usize])),
            };
            shape.frames.push(frame);
            shape.parents.push(parent);
            let id = renumber[node as usize];
            pending.extend(children[node as usize].iter().rev().map(|&c| (c, id)));
        }
        (shape, renumber)
    }

    /// The bytes written since the last call: append them to the block's file or upload.
    pub(crate) fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Appends the names, series, postings, markers, meta (and span index) sections, the
    /// directory and the tail, and returns the bytes not yet taken with what the block holds.
    pub(crate) fn finish(mut self) -> (Vec<u8>, WriteReport) {
        let trees_start = MAGIC.len() as u64;
        let trees_end = self.spans_start.unwrap_or(self.written);
        let mut entries = vec![Entry {
            kind: Kind::Trees as u8,
            required: true,
            codec: codec::Codec::None,
            offset: trees_start,
            stored_len: trees_end - trees_start,
            raw_len: trees_end - trees_start,
            crc: self.trees_crc.clone().finalize(),
        }];
        if let Some(start) = self.spans_start {
            entries.push(Entry {
                kind: Kind::Spans as u8,
                required: false,
                codec: codec::Codec::None,
                offset: start,
                stored_len: self.written - start,
                raw_len: self.written - start,
                crc: self.spans_crc.clone().finalize(),
            });
        }
        self.meta.names = self.names.names().len() as u64;
        self.meta.series = self.series.len() as u64;
        self.meta.trees = self.report.trees;
        self.meta.nodes = self.report.nodes;
        let (series, postings) = index::encode_series(&self.series, self.meta.start);
        let mut sections = vec![
            (Kind::Names, self.names.names().encode()),
            (Kind::Series, series),
            (Kind::Postings, postings),
            (Kind::Markers, index::encode_markers(&self.markers)),
            (Kind::Meta, self.meta.encode()),
        ];
        if !self.sources.is_empty() {
            let mut raw = Vec::new();
            put_varint(&mut raw, self.sources.len() as u64);
            for source in &self.sources {
                codec::put_str(&mut raw, source);
            }
            sections.push((Kind::Sources, raw));
        }
        if !self.deletions.is_empty() {
            let mut raw = Vec::new();
            put_varint(&mut raw, self.deletions.len() as u64);
            for deletion in &self.deletions {
                codec::put_str(&mut raw, &deletion.app);
                put_varint(&mut raw, deletion.horizon);
            }
            sections.push((Kind::Deletions, raw));
        }
        if !self.span_chunks.is_empty() {
            sections.push((Kind::SpanIndex, SpanIndex::encode(&self.span_chunks)));
        }
        for (kind, raw) in sections {
            let raw_len = raw.len() as u64;
            let (codec, stored) = codec::compress(raw);
            entries.push(Entry {
                kind: kind as u8,
                // Readers that predate the sources, deletions and span sections skip them.
                required: kind.required(),
                codec,
                offset: self.written,
                stored_len: stored.len() as u64,
                raw_len,
                crc: codec::crc(&stored),
            });
            self.out.extend_from_slice(&stored);
            self.written += stored.len() as u64;
        }
        let before = self.out.len();
        footer::write(&mut self.out, self.written, &entries);
        self.written += (self.out.len() - before) as u64;
        self.report.bytes = self.written;
        (self.out, self.report)
    }
}

impl Part {
    /// Adds `other`'s data to this merged tree.
    fn absorb(&mut self, other: Part) {
        self.markers.extend(other.markers);
        self.writes = self.writes.saturating_add(other.writes);
        self.values.extend(other.values);
    }
}

/// Sums values of the same node; drops zeros; sorts by node.
fn sum_values(mut values: Vec<(u32, u64)>) -> Vec<(u32, u64)> {
    values.sort_unstable_by_key(|&(node, _)| node);
    let mut out: Vec<(u32, u64)> = Vec::with_capacity(values.len());
    for (node, value) in values {
        match out.last_mut() {
            Some(last) if last.0 == node => last.1 = last.1.saturating_add(value),
            _ => out.push((node, value)),
        }
    }
    out.retain(|&(_, v)| v > 0);
    out
}

/// A dense sum over a shape's nodes that remembers which nodes it touched.
struct Sum {
    values: Vec<u64>,
    touched: Vec<u32>,
}

impl Sum {
    fn new(len: usize) -> Sum {
        Sum {
            values: vec![0; len],
            touched: Vec::new(),
        }
    }

    fn add(&mut self, values: &[(u32, u64)]) {
        for &(node, value) in values {
            let slot = &mut self.values[node as usize];
            if *slot == 0 {
                self.touched.push(node);
            }
            *slot = slot.saturating_add(value);
        }
    }

    /// The sum, sorted by node, and a reset.
    fn take(&mut self) -> Vec<(u32, u64)> {
        self.touched.sort_unstable();
        let out = self
            .touched
            .iter()
            .map(|&node| (node, std::mem::take(&mut self.values[node as usize])))
            .collect();
        self.touched.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ladders_climb_by_tens() {
        assert_eq!(ladder(10, 1_000, 2_000).unwrap(), [10, 100, 1_000]);
        assert_eq!(ladder(100, 100, 0).unwrap(), [100]);
        assert!(ladder(10, 500, 0).is_err());
        assert!(ladder(10, 1_000, 1_500).is_err());
        assert!(ladder(0, 1_000, 0).is_err());
    }
}
