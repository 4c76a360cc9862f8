//! Checking a whole block: every checksum, every index entry and every tree, as
//! `smolder-aggregator check` and the tests of damaged blocks do.

use std::collections::BTreeMap;

use crate::chunk::SeriesChunk;
use crate::codec;
use crate::error::{BlockError, Problem, Section};
use crate::footer::{Fetched, Limits, MAGIC, Tail};
use crate::merge::MergeInput;
use crate::spans::SpanChunk;

/// What a verified block holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// The format version that wrote it.
    pub version: u16,
    /// Series.
    pub series: u64,
    /// Trees, rollups included.
    pub trees: u64,
    /// Nodes of the finest-level trees.
    pub nodes: u64,
    /// Batch markers.
    pub markers: u64,
    /// Ids of the blocks it replaces (its sources section).
    pub sources: u64,
    /// App deletions it was built with (its deletions section).
    pub deletions: u64,
    /// Span trees (one per span and finest tree).
    pub spans: u64,
}

/// A series' finest trees: (bucket, separable, a separable tree's marker) → total.
type FinestTotals = BTreeMap<(u64, bool, Vec<u32>), u64>;

fn inconsistent(section: Section, field: &'static str, reason: &'static str) -> BlockError {
    BlockError::Malformed {
        section,
        offset: 0,
        problem: Problem::Invalid { field, reason },
    }
}

/// Reads all of `block` and checks that it is whole and consistent: the head and tail, that
/// the sections, directory and tail cover every byte exactly once, every section's and tree's
/// CRC, the postings against the series, every tree against its table entry, each rollup's total
/// against the trees below it, the meta's counts, and that every span entry belongs to a finest
/// tree of its series whose total none of its span trees passes.
///
/// # Errors
///
/// The first [`BlockError`] found, naming its section.
pub fn verify(block: &[u8], limits: &Limits) -> Result<VerifyReport, BlockError> {
    let len = block.len() as u64;
    let fetched = Fetched::whole(block);
    if block.get(..MAGIC.len()).is_some_and(|head| head != MAGIC) {
        return Err(BlockError::BadMagic {
            section: Section::Head,
        });
    }
    let input = MergeInput::decode(len, &fetched, limits)?;
    let tail = Tail::decode(len, &fetched)?;

    let mut at = MAGIC.len() as u64;
    let mut entries: Vec<_> = input.footer.entries().to_vec();
    entries.sort_by_key(|e| e.offset);
    for entry in &entries {
        if entry.offset != at {
            return Err(BlockError::OutOfBounds {
                section: Section::Directory,
                start: at,
                end: entry.offset,
                within: "a section: bytes between sections",
            });
        }
        let stored = fetched.get(entry.range(), entry.section())?;
        let computed = codec::crc(stored);
        if computed != entry.crc {
            return Err(BlockError::Checksum {
                section: entry.section(),
                stored: entry.crc,
                computed,
            });
        }
        at = entry.range().end;
    }
    if at != tail.directory_range().start {
        return Err(BlockError::OutOfBounds {
            section: Section::Directory,
            start: at,
            end: tail.directory_range().start,
            within: "a section: bytes before the directory",
        });
    }

    let sources = input.footer.sources(&fetched, limits)?;
    let deletions = input.footer.deletions(&fetched, limits)?;
    let index = &input.index;
    if index.derived_postings() != index.stored_postings() {
        return Err(inconsistent(
            Section::Postings,
            "postings",
            "differ from the series",
        ));
    }
    let meta = index.meta();
    let mut report = VerifyReport {
        version: tail.version(),
        series: index.series().len() as u64,
        markers: index.markers().len() as u64,
        sources: sources.len() as u64,
        deletions: deletions.len() as u64,
        ..VerifyReport::default()
    };
    // Per series with spans: its finest trees as (bucket, separable, a separable tree's
    // marker) → total.
    let mut finest_trees: BTreeMap<usize, FinestTotals> = BTreeMap::new();
    for (position, series) in index.series().iter().enumerate() {
        let section = Section::Chunk { series: position };
        let chunk = SeriesChunk::decode(index, position, &fetched, limits)?;
        if input.spans.chunk_range(position).is_some() {
            finest_trees.insert(
                position,
                chunk
                    .entries()
                    .iter()
                    .filter(|e| e.level == 0)
                    .map(|e| {
                        let marker = if e.separable {
                            e.markers.clone()
                        } else {
                            vec![]
                        };
                        ((e.bucket, e.separable, marker), e.total)
                    })
                    .collect(),
            );
        }
        // (level, bucket of the level above) → total of the trees of that level in it.
        let mut below: BTreeMap<(u8, u64), u64> = BTreeMap::new();
        let mut rollups: Vec<(u8, u64, u64)> = Vec::new();
        for (i, entry) in chunk.entries().iter().enumerate() {
            chunk.read_tree(i, &fetched)?;
            report.trees += 1;
            let level = usize::from(entry.level);
            if level == 0 {
                report.nodes += entry.nodes;
            } else {
                rollups.push((entry.level, entry.bucket, entry.total));
            }
            if let Some(&size) = meta.levels.get(level + 1) {
                let slot = below
                    .entry((entry.level, entry.bucket / size * size))
                    .or_default();
                *slot = slot.saturating_add(entry.total);
            }
        }
        for (level, bucket, total) in rollups {
            if below.get(&(level - 1, bucket)).copied().unwrap_or(0) != total {
                return Err(inconsistent(
                    section,
                    "rollup",
                    "total differs from the trees below it",
                ));
            }
        }
        let finest: Vec<u64> = chunk
            .entries()
            .iter()
            .filter(|e| e.level == 0)
            .map(|e| e.bucket)
            .collect();
        if finest.first() != Some(&series.first_bucket)
            || finest.last() != Some(&series.last_bucket)
        {
            return Err(inconsistent(
                Section::Series,
                "bucket span",
                "differs from the series' trees",
            ));
        }
    }
    if report.trees != meta.trees || report.nodes != meta.nodes {
        return Err(inconsistent(
            Section::Meta,
            "counts",
            "differ from the trees",
        ));
    }
    for (position, trees) in finest_trees {
        let chunk = SpanChunk::decode(index, &input.spans, position, &fetched, limits)?;
        for (i, entry) in chunk.entries().iter().enumerate() {
            let section = Section::SpanEntry {
                series: position,
                entry: i,
            };
            let key = (
                entry.bucket,
                entry.separable,
                entry.marker.into_iter().collect(),
            );
            let Some(&total) = trees.get(&key) else {
                return Err(inconsistent(
                    section,
                    "span entry",
                    "no finest tree of its series",
                ));
            };
            for (_, tree) in chunk.read_entry(i, &fetched)? {
                if tree.total() > total {
                    return Err(inconsistent(
                        section,
                        "span tree",
                        "more than its tree's total",
                    ));
                }
                report.spans += 1;
            }
        }
    }
    Ok(report)
}
