//! Merging blocks into one, and downsampling: compaction as pure functions.
//!
//! Inputs may overlap in time and may hold the same batch more than once (late data, a retry
//! stored twice, a cut repeated after a crash). The output has one name table, one shape per
//! series, one tree per finest bucket summing every batch once, and every rollup built once from
//! those. Its resolution is the coarsest of the inputs' and the one asked for, so that old data
//! can be kept at 100 s or 1000 s only.
//!
//! A [`Merger`] works one series at a time and asks for each input's chunk of that series by
//! byte range, so that a merge of large blocks never holds them whole; [`merge`] and
//! [`downsample`] do the same for blocks already in memory.
//!
//! Span profiles follow their trees: once every series is merged, the span chunks are merged
//! the same way, one series at a time ([`Merger::span_ranges`], [`Merger::merge_spans`]); a
//! separable tree dropped as a copy of a batch takes its spans with it, and everything else is
//! summed per finest bucket and span, downsampled buckets included. Rollups keep no spans.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use smolder_common::Series;

use crate::chunk::SeriesChunk;
use crate::error::{BlockError, MergeError, Problem, Section};
use crate::footer::{Deletion, Fetched, Footer, Limits, Tail, canonical_deletions, horizon_of};
use crate::index::{Index, Marker};
use crate::names::{Interner, Names};
use crate::shape::Shape;
use crate::spans::{SpanChunk, SpanIndex};
use crate::writer::{
    BlockWriter, Part, Pushed, SeriesParts, SeriesSpans, SpanPart, WriteReport, ladder,
};

/// A block to merge: its footer, index, names, span index and deletions, decoded.
#[derive(Clone, Debug)]
pub struct MergeInput {
    /// Its section directory.
    pub footer: Footer,
    /// Its index.
    pub index: Index,
    /// Its frame names.
    pub names: Names,
    /// Where its span chunks are (empty without span profiles).
    pub spans: SpanIndex,
    /// The app deletions it was built with ([`Footer::deletions`]; empty without them).
    pub deletions: Vec<Deletion>,
}

impl MergeInput {
    /// Decodes a block's footer, index, names, span index and deletions from `fetched`, which
    /// must cover the tail, [`Tail::directory_range`], [`Footer::index_range`],
    /// [`Footer::names_range`], [`Footer::span_index_range`] and [`Footer::deletions_range`].
    ///
    /// # Errors
    ///
    /// A [`BlockError`] naming the section at fault.
    pub fn decode(
        block_len: u64,
        fetched: &Fetched<'_>,
        limits: &Limits,
    ) -> Result<MergeInput, BlockError> {
        let tail = Tail::decode(block_len, fetched)?;
        let footer = Footer::decode(&tail, fetched)?;
        let index = Index::decode(&footer, fetched, limits)?;
        let names = Names::decode(&footer, fetched, limits)?;
        let spans = SpanIndex::decode(&footer, &index, fetched, limits)?;
        let deletions = footer.deletions(fetched, limits)?;
        if names.len() as u64 != index.meta().names {
            return Err(BlockError::Malformed {
                section: Section::Names,
                offset: 0,
                problem: Problem::Invalid {
                    field: "name count",
                    reason: "differs from the meta section's",
                },
            });
        }
        Ok(MergeInput {
            footer,
            index,
            names,
            spans,
            deletions,
        })
    }
}

/// The range and resolution of a merge's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MergeOptions {
    /// Unix seconds of the output's start, a multiple of `span`.
    pub start: u64,
    /// The output's span in seconds; every input must lie inside it.
    pub span: u64,
    /// The finest bucket to keep, in seconds: `None` keeps the inputs' resolution (the coarsest
    /// of them), `Some(100)` or `Some(1000)` downsamples.
    pub finest: Option<u64>,
}

/// Merges blocks one series at a time. See the [module documentation](self).
pub struct Merger {
    inputs: Vec<MergeInput>,
    limits: Limits,
    /// Output series in order, each with the (input, series position) pairs that hold it.
    order: Vec<(Series, Vec<(usize, usize)>)>,
    /// Per input: its marker positions in the output's markers.
    markers: Vec<Vec<u32>>,
    writer: BlockWriter,
    next: usize,
    /// Per output series merged so far: what writing its trees did, which its spans follow.
    pushed: Vec<Pushed>,
    /// The next series whose spans to merge.
    next_spans: usize,
    /// The app deletions the output applies (canonical).
    deletions: Vec<Deletion>,
}

impl Merger {
    /// Plans the merge of `inputs` into the range and resolution of `options`.
    ///
    /// # Errors
    ///
    /// [`MergeError::NoInputs`], [`MergeError::TenantMismatch`], [`MergeError::DoesNotFit`]
    /// when an input lies outside the output or its resolution does not divide the output's,
    /// [`MergeError::Write`] when the output's range and resolution make no level ladder.
    pub fn new(
        mut inputs: Vec<MergeInput>,
        options: MergeOptions,
        limits: Limits,
    ) -> Result<Merger, MergeError> {
        for input in &mut inputs {
            input.deletions = canonical_deletions(std::mem::take(&mut input.deletions));
        }
        let first = inputs.first().ok_or(MergeError::NoInputs)?;
        let tenant = first.index.meta().tenant.clone();
        let finest = inputs
            .iter()
            .map(|input| input.index.meta().finest())
            .chain(options.finest)
            .max()
            .expect("at least one input");
        let levels = ladder(finest, options.span, options.start)?;
        let end = options.start + options.span;
        let mut series: BTreeMap<Series, Vec<(usize, usize)>> = BTreeMap::new();
        let mut markers = BTreeSet::new();
        let mut compactions = 0;
        for (i, input) in inputs.iter().enumerate() {
            let meta = input.index.meta();
            if meta.tenant != tenant {
                return Err(MergeError::TenantMismatch {
                    input: i,
                    expected: tenant,
                    found: meta.tenant.clone(),
                });
            }
            let misfit = |reason| MergeError::DoesNotFit {
                input: i,
                start: meta.start,
                end: meta.end(),
                finest: meta.finest(),
                reason,
            };
            if meta.start < options.start || meta.end() > end {
                return Err(misfit("range"));
            }
            if !finest.is_multiple_of(meta.finest()) {
                return Err(misfit("resolution"));
            }
            for (position, entry) in input.index.series().iter().enumerate() {
                series
                    .entry(entry.series.clone())
                    .or_default()
                    .push((i, position));
            }
            markers.extend(input.index.markers().iter().cloned());
            compactions = compactions.max(meta.compactions.saturating_add(1));
        }
        let markers: Vec<Marker> = markers.into_iter().collect();
        let maps = inputs
            .iter()
            .map(|input| {
                input
                    .index
                    .markers()
                    .iter()
                    .map(|m| markers.binary_search(m).expect("the union holds it") as u32)
                    .collect()
            })
            .collect();
        Ok(Merger {
            writer: BlockWriter::new(&tenant, options.start, levels, markers, compactions, false),
            inputs,
            limits,
            order: series.into_iter().collect(),
            markers: maps,
            next: 0,
            pushed: Vec::new(),
            next_spans: 0,
            deletions: Vec::new(),
        })
    }

    /// Records the ids of the blocks the output replaces, written as its sources section; see
    /// [`Footer::sources`].
    pub fn set_sources(&mut self, sources: Vec<String>) {
        self.writer.set_sources(sources);
    }

    /// Applies app deletions to every input: the trees (and their spans) of a deleted app's
    /// series whose bucket starts before the deletion's horizon are left out, and the output
    /// lists the deletions (its deletions section; one per app, the latest horizon winning).
    /// An input that lists a deletion of the app at least as late was built with it and holds
    /// nothing stamped before the horizon: it is taken whole, a downsampled bucket straddling
    /// the horizon included. Call before merging any series.
    pub fn set_deletions(&mut self, deletions: Vec<Deletion>) {
        self.deletions = canonical_deletions(deletions);
        self.writer.set_deletions(self.deletions.clone());
    }

    /// Leaves out of the output every series of input `input` for which `drop` is true: data
    /// deleted since that input was written (an app deletion). Call before merging any series.
    pub fn drop_series(&mut self, drop: impl Fn(usize, &Series) -> bool) {
        for (series, sources) in &mut self.order {
            sources.retain(|&(input, _)| !drop(input, series));
        }
        self.order.retain(|(_, sources)| !sources.is_empty());
    }

    /// How many series the output may have (an input series whose trees are all dropped is not
    /// written).
    pub fn series_count(&self) -> usize {
        self.order.len()
    }

    /// For output series `series`: each input that holds it, with the byte range of its chunk
    /// there. Fetch them and pass them, in this order, to [`Merger::merge_series`].
    ///
    /// # Panics
    ///
    /// If `series` is not below [`Merger::series_count`].
    pub fn chunk_ranges(&self, series: usize) -> Vec<(usize, Range<u64>)> {
        self.order[series]
            .1
            .iter()
            .map(|&(input, position)| (input, self.inputs[input].index.chunk_range(position)))
            .collect()
    }

    /// Merges output series `series` from its chunks, fetched as [`Merger::chunk_ranges`] says.
    /// Series are merged in order, from 0.
    ///
    /// # Errors
    ///
    /// [`MergeError::Input`] naming the input whose chunk is damaged,
    /// [`MergeError::Write`] for a batch summed into two inputs' trees of one bucket,
    /// [`MergeError::Misuse`] for a series out of order or the wrong number of chunks.
    pub fn merge_series(
        &mut self,
        series: usize,
        chunks: &[Fetched<'_>],
    ) -> Result<(), MergeError> {
        let sources = self.order.get(series).map_or(0, |(_, s)| s.len());
        if series != self.next || chunks.len() != sources {
            return Err(MergeError::Misuse {
                series,
                given: chunks.len(),
                needed: sources,
            });
        }
        self.next += 1;
        let (key, sources) = &self.order[series];
        let mut names = Interner::default();
        let mut data = SeriesParts::default();
        for (&(input, position), fetched) in sources.iter().zip(chunks) {
            let wrap = |source| MergeError::Input { input, source };
            let block = &self.inputs[input];
            let chunk =
                SeriesChunk::decode(&block.index, position, fetched, &self.limits).map_err(wrap)?;
            let nodes = trie_nodes(chunk.shape(), &block.names, &mut names, &mut data.trie)
                .map_err(wrap)?;
            let size = block.index.meta().finest();
            let cutoff = self.cutoff(input, key.app());
            for (i, entry) in chunk.entries().iter().enumerate() {
                if entry.level != 0 || entry.bucket < cutoff {
                    continue;
                }
                let tree = chunk.read_tree(i, fetched).map_err(wrap)?;
                data.parts.push(Part {
                    origin: input as u32,
                    bucket: entry.bucket,
                    size,
                    separable: entry.separable,
                    markers: entry
                        .markers
                        .iter()
                        .map(|&m| self.markers[input][m as usize])
                        .collect(),
                    writes: entry.writes,
                    values: tree
                        .values
                        .iter()
                        .map(|&(node, value)| (nodes[node as usize], value))
                        .collect(),
                });
            }
            let entry = &block.index.series()[position];
            if data
                .meta
                .as_ref()
                .is_none_or(|(newest, _)| entry.last_bucket >= *newest)
            {
                data.meta = Some((entry.last_bucket, entry.meta.clone()));
            }
        }
        let pushed = self
            .writer
            .push_series(key, data, |id| names.name(id))
            .map_err(MergeError::Write)?;
        self.pushed.push(pushed);
        Ok(())
    }

    /// Whether any input has span profiles, which then are merged after every series' trees
    /// ([`Merger::merge_spans`]).
    pub fn has_spans(&self) -> bool {
        self.inputs.iter().any(|input| !input.spans.is_empty())
    }

    /// For output series `series`: each input that holds span profiles of it, with the byte
    /// range of its span chunk there. Fetch them and pass them, in this order, to
    /// [`Merger::merge_spans`].
    ///
    /// # Panics
    ///
    /// If `series` is not below [`Merger::series_count`].
    pub fn span_ranges(&self, series: usize) -> Vec<(usize, Range<u64>)> {
        self.order[series]
            .1
            .iter()
            .filter_map(|&(input, position)| {
                let range = self.inputs[input].spans.chunk_range(position)?;
                Some((input, range))
            })
            .collect()
    }

    /// Merges output series `series`' span profiles from its inputs' span chunks, fetched as
    /// [`Merger::span_ranges`] says. Call once every series' trees are merged, for every
    /// series in order, from 0, when [`Merger::has_spans`].
    ///
    /// # Errors
    ///
    /// [`MergeError::Input`] naming the input whose span chunk is damaged,
    /// [`MergeError::Misuse`] for a series out of order, before the trees are done, or with
    /// the wrong number of chunks.
    pub fn merge_spans(&mut self, series: usize, chunks: &[Fetched<'_>]) -> Result<(), MergeError> {
        let ranges = if series < self.order.len() {
            self.span_ranges(series)
        } else {
            Vec::new()
        };
        if self.next != self.order.len()
            || series != self.next_spans
            || chunks.len() != ranges.len()
        {
            return Err(MergeError::Misuse {
                series,
                given: chunks.len(),
                needed: ranges.len(),
            });
        }
        self.next_spans += 1;
        let app = self.order[series].0.app();
        let mut names = Interner::default();
        let mut data = SeriesSpans::default();
        for (&(input, _), fetched) in ranges.iter().zip(chunks) {
            let wrap = |source| MergeError::Input { input, source };
            let block = &self.inputs[input];
            let position = self.order[series]
                .1
                .iter()
                .find(|&&(i, _)| i == input)
                .expect("a range per input that has the series")
                .1;
            let chunk =
                SpanChunk::decode(&block.index, &block.spans, position, fetched, &self.limits)
                    .map_err(wrap)?;
            let nodes = trie_nodes(chunk.shape(), &block.names, &mut names, &mut data.trie)
                .map_err(wrap)?;
            let cutoff = self.cutoff(input, app);
            for (i, entry) in chunk.entries().iter().enumerate() {
                if entry.bucket < cutoff {
                    continue;
                }
                let spans = chunk.read_entry(i, fetched).map_err(wrap)?;
                data.parts.push(SpanPart {
                    origin: input as u32,
                    bucket: entry.bucket,
                    separable: entry.separable,
                    marker: entry.marker.map(|m| self.markers[input][m as usize]),
                    spans: spans
                        .into_iter()
                        .map(|(span, tree)| {
                            let values = tree
                                .values()
                                .iter()
                                .map(|&(node, value)| (nodes[node as usize], value))
                                .collect();
                            (span, values)
                        })
                        .collect(),
                });
            }
        }
        self.writer
            .push_spans(&self.pushed[series], data, |id| names.name(id));
        Ok(())
    }

    /// The bucket before which input `input`'s trees of `app` are left out: the horizon of
    /// the merge's deletion of `app` (0: none), unless the input lists a deletion of `app` at
    /// least as late. Such an input was built with it and holds nothing stamped before the
    /// horizon; a bucket of it starting before the horizon is a downsampled one (100 s or
    /// 1000 s) holding data stamped after it, which stays. Any other input holding buckets
    /// before the horizon was built before the deletion: those go whole, even a coarse one
    /// straddling the horizon, whose data before it cannot be told from the rest (a store
    /// hides such an input's app wholesale anyway, [`Footer::deletions`]).
    fn cutoff(&self, input: usize, app: &str) -> u64 {
        let Some(horizon) = horizon_of(&self.deletions, app) else {
            return 0;
        };
        let listed = horizon_of(&self.inputs[input].deletions, app);
        if listed.is_some_and(|listed| listed >= horizon) {
            0
        } else {
            horizon
        }
    }

    /// The output written since the last call: append it to the new block's file or upload.
    pub fn take_output(&mut self) -> Vec<u8> {
        self.writer.take_output()
    }

    /// Finishes the output and returns its remaining bytes with what it holds.
    ///
    /// # Errors
    ///
    /// [`MergeError::Misuse`] when a series' trees, or with [`Merger::has_spans`] its spans,
    /// were not merged.
    pub fn finish(self) -> Result<(Vec<u8>, WriteReport), MergeError> {
        if self.next != self.order.len() {
            return Err(MergeError::Misuse {
                series: self.next,
                given: 0,
                needed: self.order[self.next].1.len(),
            });
        }
        if self.has_spans() && self.next_spans != self.order.len() {
            return Err(MergeError::Misuse {
                series: self.next_spans,
                given: 0,
                needed: self.span_ranges(self.next_spans).len(),
            });
        }
        Ok(self.writer.finish())
    }
}

/// Adds the nodes of `shape` (frames named by `names`) to `trie` (frames interned in
/// `interner`); returns each shape node's trie node.
fn trie_nodes(
    shape: &Shape,
    names: &Names,
    interner: &mut Interner,
    trie: &mut crate::shape::Trie,
) -> Result<Vec<u32>, BlockError> {
    let mut nodes = vec![0u32; shape.len()];
    for node in 1..shape.len() {
        let name = names.get(shape.frames[node]).ok_or(BlockError::Malformed {
            section: Section::Names,
            offset: 0,
            problem: Problem::Invalid {
                field: "name table",
                reason: "a shape names a frame id the table does not have",
            },
        })?;
        let parent = nodes[shape.parents[node] as usize];
        nodes[node] = trie.child(parent, interner.intern(name));
    }
    Ok(nodes)
}

/// Merges whole blocks held in memory. See the [module documentation](self).
///
/// # Errors
///
/// As [`Merger::new`] and [`Merger::merge_series`]; a block that cannot be read is
/// [`MergeError::Input`].
pub fn merge(
    blocks: &[&[u8]],
    options: MergeOptions,
    limits: &Limits,
) -> Result<(Vec<u8>, WriteReport), MergeError> {
    let inputs = blocks
        .iter()
        .enumerate()
        .map(|(input, block)| {
            MergeInput::decode(block.len() as u64, &Fetched::whole(block), limits)
                .map_err(|source| MergeError::Input { input, source })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut merger = Merger::new(inputs, options, *limits)?;
    let mut out = Vec::new();
    for series in 0..merger.series_count() {
        let chunks: Vec<Fetched<'_>> = merger
            .chunk_ranges(series)
            .into_iter()
            .map(|(input, _)| Fetched::whole(blocks[input]))
            .collect();
        merger.merge_series(series, &chunks)?;
        out.extend(merger.take_output());
    }
    if merger.has_spans() {
        for series in 0..merger.series_count() {
            let chunks: Vec<Fetched<'_>> = merger
                .span_ranges(series)
                .into_iter()
                .map(|(input, _)| Fetched::whole(blocks[input]))
                .collect();
            merger.merge_spans(series, &chunks)?;
            out.extend(merger.take_output());
        }
    }
    let (tail, report) = merger.finish()?;
    out.extend(tail);
    Ok((out, report))
}

/// Rewrites `block` keeping only buckets of `finest` seconds and coarser: its finest trees are
/// summed into buckets of `finest`, and finer rollups are dropped.
///
/// # Errors
///
/// As [`merge`]; [`MergeError::Write`] when `finest` does not climb by tens to the block's span.
pub fn downsample(
    block: &[u8],
    finest: u64,
    limits: &Limits,
) -> Result<(Vec<u8>, WriteReport), MergeError> {
    let input = MergeInput::decode(block.len() as u64, &Fetched::whole(block), limits)
        .map_err(|source| MergeError::Input { input: 0, source })?;
    let meta = input.index.meta();
    let options = MergeOptions {
        start: meta.start,
        span: meta.span(),
        finest: Some(finest),
    };
    merge(&[block], options, limits)
}
