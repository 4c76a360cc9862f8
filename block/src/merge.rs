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

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use smolder_common::Series;

use crate::chunk::SeriesChunk;
use crate::error::{BlockError, MergeError, Problem, Section};
use crate::footer::{Fetched, Footer, Limits, Tail};
use crate::index::{Index, Marker};
use crate::names::{Interner, Names};
use crate::writer::{BlockWriter, Part, SeriesParts, WriteReport, ladder};

/// A block to merge: its footer, index and names, decoded.
#[derive(Clone, Debug)]
pub struct MergeInput {
    /// Its section directory.
    pub footer: Footer,
    /// Its index.
    pub index: Index,
    /// Its frame names.
    pub names: Names,
}

impl MergeInput {
    /// Decodes a block's footer, index and names from `fetched`, which must cover the tail,
    /// [`Tail::directory_range`], [`Footer::index_range`] and [`Footer::names_range`].
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
        inputs: Vec<MergeInput>,
        options: MergeOptions,
        limits: Limits,
    ) -> Result<Merger, MergeError> {
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
        })
    }

    /// Records the ids of the blocks the output replaces, written as its sources section; see
    /// [`Footer::sources`].
    pub fn set_sources(&mut self, sources: Vec<String>) {
        self.writer.set_sources(sources);
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
            let shape = chunk.shape();
            let mut nodes = vec![0u32; shape.len()];
            for node in 1..shape.len() {
                let name = block.names.get(shape.frames[node]).ok_or_else(|| {
                    wrap(BlockError::Malformed {
                        section: Section::Names,
                        offset: 0,
                        problem: Problem::Invalid {
                            field: "name table",
                            reason: "a shape names a frame id the table does not have",
                        },
                    })
                })?;
                let parent = nodes[shape.parents[node] as usize];
                nodes[node] = data.trie.child(parent, names.intern(name));
            }
            let size = block.index.meta().finest();
            for (i, entry) in chunk.entries().iter().enumerate() {
                if entry.level != 0 {
                    continue;
                }
                let tree = chunk.read_tree(i, fetched).map_err(wrap)?;
                data.parts.push(Part {
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
        self.writer
            .push_series(key, data, |id| names.name(id))
            .map_err(MergeError::Write)
    }

    /// The output written since the last call: append it to the new block's file or upload.
    pub fn take_output(&mut self) -> Vec<u8> {
        self.writer.take_output()
    }

    /// Finishes the output and returns its remaining bytes with what it holds.
    ///
    /// # Errors
    ///
    /// [`MergeError::Misuse`] when a series was not merged.
    pub fn finish(self) -> Result<(Vec<u8>, WriteReport), MergeError> {
        if self.next != self.order.len() {
            return Err(MergeError::Misuse {
                series: self.next,
                given: 0,
                needed: self.order[self.next].1.len(),
            });
        }
        Ok(self.writer.finish())
    }
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
