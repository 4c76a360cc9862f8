//! The errors of reading, writing and merging blocks, each naming the part of the block at fault.

use std::fmt;

/// A part of a block, as errors name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Section {
    /// The 8 bytes at the start of every block.
    Head,
    /// The fixed-size tail at the end of every block.
    Tail,
    /// The section directory that the tail points to.
    Directory,
    /// The block's tenant, time range, levels and counts.
    Meta,
    /// The frame-name table.
    Names,
    /// The series index.
    Series,
    /// The label postings.
    Postings,
    /// The batch markers.
    Markers,
    /// The trees section as a whole.
    Trees,
    /// The ids of the blocks a merged block replaces.
    Sources,
    /// The app deletions a block was built with.
    Deletions,
    /// The span chunks as a whole.
    Spans,
    /// Where each series' span chunk is.
    SpanIndex,
    /// The header of one series' span chunk (its shape and entry table).
    SpanChunk {
        /// The series' position in the series index.
        series: usize,
    },
    /// The body of one entry of one series' span chunk.
    SpanEntry {
        /// The series' position in the series index.
        series: usize,
        /// The entry's position in the span chunk's table.
        entry: usize,
    },
    /// The header of one series' chunk in the trees section (its shape and tree table).
    Chunk {
        /// The series' position in the series index.
        series: usize,
    },
    /// An optional section of a kind this build does not read (a newer format's).
    Optional {
        /// Its kind.
        kind: u8,
    },
    /// A record of the aggregator's head log (not part of a block; read with the same
    /// primitives, so its errors are a block's).
    HeadRecord,
    /// One tree of one series.
    Tree {
        /// The series' position in the series index.
        series: usize,
        /// The tree's position in the series' tree table.
        entry: usize,
    },
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Section::Head => f.write_str("head"),
            Section::Tail => f.write_str("tail"),
            Section::Directory => f.write_str("section directory"),
            Section::Meta => f.write_str("meta section"),
            Section::Names => f.write_str("names section"),
            Section::Series => f.write_str("series section"),
            Section::Postings => f.write_str("postings section"),
            Section::Markers => f.write_str("markers section"),
            Section::Trees => f.write_str("trees section"),
            Section::Sources => f.write_str("sources section"),
            Section::Deletions => f.write_str("deletions section"),
            Section::Spans => f.write_str("spans section"),
            Section::SpanIndex => f.write_str("span index section"),
            Section::SpanChunk { series } => write!(f, "span chunk header of series {series}"),
            Section::SpanEntry { series, entry } => {
                write!(f, "span entry {entry} of series {series}")
            }
            Section::Chunk { series } => write!(f, "chunk header of series {series}"),
            Section::Optional { kind } => write!(f, "optional section of kind {kind}"),
            Section::HeadRecord => f.write_str("head log record"),
            Section::Tree { series, entry } => write!(f, "tree {entry} of series {series}"),
        }
    }
}

/// What is wrong inside a section whose checksum matched (or that has none to check).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// The bytes end in the middle of a field.
    #[error("truncated while reading {field}")]
    Truncated {
        /// The field being read.
        field: &'static str,
    },
    /// A varint is longer than ten bytes or does not fit in 64 bits.
    #[error("malformed varint in {field}")]
    BadVarint {
        /// The field being read.
        field: &'static str,
    },
    /// A count claims more items than the remaining bytes could hold.
    #[error("{field} count {count} is more than the remaining bytes can hold")]
    CountTooLarge {
        /// What is counted.
        field: &'static str,
        /// The count claimed.
        count: u64,
    },
    /// A string is not UTF-8.
    #[error("{field} is not valid UTF-8")]
    InvalidUtf8 {
        /// The field being read.
        field: &'static str,
    },
    /// Bytes remain after the last field.
    #[error("{extra} trailing bytes")]
    TrailingBytes {
        /// How many.
        extra: usize,
    },
    /// A field holds a value the format does not allow.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// Why a block, or the part of it a caller fetched, could not be read.
///
/// Every variant names the [`Section`] at fault, so that an operator can tell a truncated
/// upload from a flipped bit from a block written by a newer Smolder.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BlockError {
    /// The block is shorter than its fixed head and tail.
    #[error("block of {len} bytes is too short to be a block (at least {min})")]
    TooShort {
        /// The block's length.
        len: u64,
        /// The shortest possible block.
        min: u64,
    },
    /// The head or tail does not carry the block magic: not a block, or truncated.
    #[error("{section} does not carry the block magic: not a Smolder block, or truncated")]
    BadMagic {
        /// [`Section::Head`] or [`Section::Tail`].
        section: Section,
    },
    /// The block was written by a newer format version than this build reads.
    #[error(
        "block format version {found} is not readable by this build (it reads 1 to {supported})"
    )]
    UnsupportedVersion {
        /// The version in the tail.
        found: u16,
        /// The newest version this build reads.
        supported: u16,
    },
    /// A required section of a kind this build does not know: written by a newer Smolder.
    #[error("required section of unknown kind {kind}: written by a newer format")]
    UnknownRequiredSection {
        /// The section kind.
        kind: u8,
    },
    /// A section this format requires is absent from the directory.
    #[error("the {section} is missing from the directory")]
    MissingSection {
        /// The missing section.
        section: Section,
    },
    /// Stored bytes do not match their CRC-32.
    #[error("{section}: checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum {
        /// Where.
        section: Section,
        /// The CRC the block records.
        stored: u32,
        /// The CRC of the bytes read.
        computed: u32,
    },
    /// A byte range recorded in the block lies outside the block or its section.
    #[error("{section}: byte range {start}..{end} lies outside {within}")]
    OutOfBounds {
        /// Where the range was recorded.
        section: Section,
        /// Its start.
        start: u64,
        /// Its end.
        end: u64,
        /// What it must lie within.
        within: &'static str,
    },
    /// A section would decompress to more than [`Limits::max_section_bytes`](crate::Limits).
    #[error("{section}: {len} bytes decompressed exceeds the limit of {limit}")]
    TooLarge {
        /// Where.
        section: Section,
        /// The size it claims.
        len: u64,
        /// The configured limit.
        limit: u64,
    },
    /// Compressed bytes do not decompress to the recorded length.
    #[error("{section}: compressed bytes are damaged")]
    Decompress {
        /// Where.
        section: Section,
    },
    /// The bytes inside a section are malformed.
    #[error("{section}: {problem} (at byte {offset})")]
    Malformed {
        /// Where.
        section: Section,
        /// The offset inside the section's (decompressed) bytes.
        offset: u64,
        /// What is wrong.
        problem: Problem,
    },
    /// The caller passed bytes that do not cover the range a step needs.
    #[error("{section}: bytes {start}..{end} were needed but not given")]
    NotFetched {
        /// What was being read.
        section: Section,
        /// The start of the range needed.
        start: u64,
        /// Its end.
        end: u64,
    },
}

/// Why a block could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// A bucket lies outside the block's time range.
    #[error("bucket {bucket} lies outside the block's range {start}..{end}")]
    BucketOutsideBlock {
        /// Unix seconds of the bucket.
        bucket: u64,
        /// The block's start.
        start: u64,
        /// The block's end.
        end: u64,
    },
    /// The resolution and span do not make a ladder of levels: each level is ten times the one
    /// before, the span is the last, and the start is a multiple of the span.
    #[error("resolution {finest} s and span {span} s at start {start} do not make a level ladder")]
    BadLevels {
        /// The finest level, in seconds.
        finest: u64,
        /// The block's span, in seconds.
        span: u64,
        /// The block's start.
        start: u64,
    },
    /// Two merged (not separable) trees of one bucket both hold the same batch: its data was
    /// summed into both and cannot be taken out of either, so it would be counted twice.
    #[error(
        "batch {agent_id}/{sequence} is summed into two trees of series {series} at bucket {bucket}; refusing to count it twice"
    )]
    InseparableDuplicate {
        /// The batch's agent.
        agent_id: String,
        /// The batch's sequence number.
        sequence: u64,
        /// The series, as its normalized key.
        series: String,
        /// Unix seconds of the bucket.
        bucket: u64,
    },
}

/// Why blocks could not be merged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MergeError {
    /// An input block could not be read.
    #[error("input block {input}")]
    Input {
        /// The input's position in the list given.
        input: usize,
        /// What is wrong with it.
        #[source]
        source: BlockError,
    },
    /// The output could not be written (including a batch summed into two inputs).
    #[error("writing the merged block")]
    Write(#[from] WriteError),
    /// Inputs belong to different tenants.
    #[error("input block {input} belongs to tenant {found:?}, not {expected:?}")]
    TenantMismatch {
        /// The input's position.
        input: usize,
        /// The tenant of the first input.
        expected: String,
        /// The tenant of this one.
        found: String,
    },
    /// An input's range does not lie inside the output's, or its resolution does not divide the
    /// output's.
    #[error("input block {input} ({start}..{end} at {finest} s) does not fit the output {reason}")]
    DoesNotFit {
        /// The input's position.
        input: usize,
        /// The input's start.
        start: u64,
        /// The input's end.
        end: u64,
        /// The input's finest level.
        finest: u64,
        /// Which constraint it breaks.
        reason: &'static str,
    },
    /// No input block was given.
    #[error("nothing to merge: no input blocks")]
    NoInputs,
    /// A series was merged out of order, or before the chunks it needs were given.
    #[error("series {series} merged out of order or with {given} chunks for {needed} inputs")]
    Misuse {
        /// The series' position in the merged order.
        series: usize,
        /// How many chunks were given.
        given: usize,
        /// How many inputs hold the series.
        needed: usize,
    },
}
