//! Smolder's block format: the profiles of one tenant over one time range, immutable, compact,
//! checksummed, and readable in parts with ranged reads, from a local file or an object store.
//!
//! A block holds, per series, one [`Shape`] (the union of the nodes of all its trees, frame ids
//! into the block's one [`Names`] table) and its trees as self values of shape nodes: one per
//! finest bucket (10 s unless downsampled) and one per rollup bucket (100 s, 1000 s, … up to
//! the block's span), with the [`Marker`]s of the agent batches whose data they hold. The
//! [`Index`] lists the series with their metadata, label postings and markers; a fixed-size
//! [`Tail`] at the end points to the section [`Footer`]. ARCHITECTURE.md gives the byte layout.
//!
//! Everything here is sans-IO: a reader step says which byte range it needs and decodes the
//! bytes it is given ([`Fetched`]), so one code path serves a file and an S3 object:
//!
//! 1. [`Tail::range`] → [`Tail::decode`] → [`Tail::directory_range`] → [`Footer::decode`];
//! 2. [`Footer::index_range`] → [`Index::decode`], then [`Index::select`] finds series;
//! 3. [`Footer::names_range`] → [`Names::decode`];
//! 4. per series, [`Index::chunk_header_range`] → [`SeriesChunk::decode`], then
//!    [`SeriesChunk::plan`] picks the fewest trees covering a range, [`SeriesChunk::tree_range`]
//!    → [`SeriesChunk::read_tree`], and an [`Accumulator`] sums them into a
//!    [`Tree`](smolder_common::Tree).
//!
//! Writing: a [`BlockBuilder`] takes trees per series and bucket (a cut of the aggregator's
//! head) and writes the block; [`Merger`] (and [`merge`], [`downsample`]) compact blocks into
//! one, counting each batch once. [`verify`] checks a whole block. Damaged input of any kind is a
//! [`BlockError`] naming the section at fault, never a panic, and nothing is allocated past
//! [`Limits`] or the size of the bytes given.
//!
//! The aggregator's head log, the write path in front of blocks, frames its records with
//! [`RecordRef::frame`] and reads them back with [`HeadRecord::unframe`].
//!
//! This crate depends on `smolder-common` and small pure crates only: no runtime, no I/O.

mod builder;
mod chunk;
mod codec;
mod error;
mod footer;
mod head_log;
mod index;
mod merge;
mod names;
mod shape;
mod spans;
mod tree;
mod verify;
mod writer;

pub use builder::{BlockBuilder, Contribution, NodeMap, ShapeSource};
pub use chunk::{SeriesChunk, TreeEntry};
pub use error::{BlockError, MergeError, Problem, Section, WriteError};
pub use footer::{
    Deletion, Fetched, Footer, Limits, MAGIC, MIN_BLOCK_LEN, TAIL_LEN, Tail, VERSION,
};
pub use head_log::{HeadProfile, HeadRecord, RecordRef};
pub use index::{BlockMeta, Index, Marker, SeriesEntry};
pub use merge::{MergeInput, MergeOptions, Merger, downsample, merge};
pub use names::Names;
pub use shape::Shape;
pub use spans::{SpanChunk, SpanEntry, SpanIndex};
pub use tree::{Accumulator, SparseTree};
pub use verify::{VerifyReport, verify};
pub use writer::WriteReport;
