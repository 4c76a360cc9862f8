//! pprof: reading profiles pushed by Pyroscope's SDKs and scraped from Go's `net/http/pprof`, and
//! writing stack trees back out for `go tool pprof`.
//!
//! Input is an untrusted body, gzipped or not. [`parse`] reads it into a [`Profile`] (the
//! [`proto`] messages, decoded with prost) under [`Limits`], then turns the profile into one
//! [`ProfileSeries`] per converted sample type and per distinct set of string labels, each with
//! its [`Tree`]. Which sample types are converted, and under what name, units and aggregation, is
//! the [`SampleTypes`] table: Pyroscope's defaults, or the `sample_type_config` an SDK sends.
//! Callers that need the raw profile use [`decode`] and [`to_series`] separately.
//!
//! [`encode`] goes the other way: one tree with one sample type becomes a [`Profile`], and
//! [`Profile::to_bytes`] serializes it.
//!
//! # Frames
//!
//! `Sample.location_id` lists locations leaf first, and a location's lines are innermost first
//! (inlined functions, then the function they were inlined into); trees are built root first,
//! so both lists are read backwards. A frame is its function's name, or its system name when
//! the name is empty. A location with no named function (an unsymbolized one) becomes
//! `<mapping file basename>+0x<file offset>`, or `0x<address>` when it has no mapping or the
//! mapping has no file name, so that no frame is ever empty.
//!
//! # Labels
//!
//! String labels (`Label.str`) become series labels, sorted by key; when a key repeats within
//! a sample, its last value wins. Numeric labels (`Label.num`, such as the `bytes` label of Go
//! heap profiles) are ignored, as Pyroscope ignores them: they would give every allocation size
//! its own series. Labels with an empty key or value are ignored too. The span labels
//! (`span_id`, `span_name`, `trace_id`, [`crate::span`]) are not series labels either: a
//! sample with a valid `span_id` is added to that span's tree as well as to its series' tree
//! ([`ProfileSeries::spans`]), so that a trace can open the profile of its span.
//!
//! # Values
//!
//! Values of zero add nothing. Negative values are an error rather than a wrapped-around huge
//! count. Cumulative sample types are returned as they are, flagged
//! [`cumulative`](ProfileSeries::cumulative): subtracting the previous profile is the ingest
//! path's business.
//!
//! ```
//! use smolder_common::pprof::{self, Limits, SampleTypes};
//! use smolder_common::Tree;
//!
//! let mut tree = Tree::new();
//! tree.insert_names(["main", "work"], 30);
//! let profile = pprof::encode(&tree, &pprof::EncodeOptions::cpu_samples(100));
//! let body = profile.to_bytes(true);
//!
//! let series = pprof::parse(&body, &SampleTypes::default(), &Limits::default()).unwrap();
//! assert_eq!(series.len(), 1);
//! assert_eq!(series[0].name_suffix, "cpu");
//! assert_eq!(series[0].sample_rate, Some(100));
//! assert_eq!(series[0].tree, tree);
//! ```

mod decode;
mod encode;
pub mod proto;
mod sample_type;

use std::io;

pub(crate) use decode::address_frame;
pub use decode::{ProfileSeries, decode, decompress, parse, to_series};
pub use encode::{EncodeOptions, Period, encode};
pub use proto::Profile;
pub use sample_type::{SampleTypeConfig, SampleTypes};

/// Bounds on what one profile may cost to read.
///
/// The defaults fit every real profile we know of with room to spare. Peak memory while
/// decoding is bounded by roughly 16 × [`max_bytes`](Self::max_bytes) in the worst case (prost
/// expands the smallest messages about that much), plus the trees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest protobuf accepted, after gunzip, in bytes. Default 64 MiB.
    pub max_bytes: usize,
    /// The most samples accepted in one profile. Default 1 Mi (2^20).
    pub max_samples: usize,
    /// The most entries accepted in the string, location, function and mapping tables
    /// together. Default 2 Mi (2^21).
    pub max_entries: usize,
    /// The deepest stack kept, in frames after inlined lines are expanded. Deeper stacks keep
    /// their root-most frames, as Pyroscope's `max_profile_stacktrace_depth` does. Default 1000,
    /// Pyroscope's default.
    pub max_stack_depth: usize,
    /// The most nodes the span trees of one profile hold in all
    /// ([`ProfileSeries::spans`]); once they do, later samples keep no span (they stay in
    /// their series' tree). Span trees share no nodes with each other, so without this a
    /// profile of many spans with deep stacks costs far more memory than its bytes. Default
    /// 1 Mi (2^20), about 40 MiB.
    pub max_span_nodes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 64 << 20,
            max_samples: 1 << 20,
            max_entries: 1 << 21,
            max_stack_depth: 1000,
            max_span_nodes: 1 << 20,
        }
    }
}

/// Why a pprof body or a `sample_type_config` could not be read.
///
/// Every variant means the input is bad (HTTP 422 at ingest) except those about [`Limits`],
/// which mean it is too big (HTTP 413).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PprofError {
    /// The protobuf, after gunzip, is larger than [`Limits::max_bytes`].
    #[error("profile is larger than the limit of {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The profile has more samples than [`Limits::max_samples`].
    #[error("profile has {count} samples, more than the limit of {limit}")]
    TooManySamples {
        /// The number of samples.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// The profile's tables have more entries than [`Limits::max_entries`].
    #[error("profile has {count} table entries, more than the limit of {limit}")]
    TooManyEntries {
        /// Strings, locations, functions and mappings together.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// The body starts with the gzip magic but is not a valid gzip stream.
    #[error("invalid gzip stream")]
    Gzip {
        /// The decompressor's error.
        source: io::Error,
    },
    /// The body is not a pprof protobuf.
    #[error("invalid pprof protobuf")]
    Protobuf {
        /// prost's error.
        source: prost::DecodeError,
    },
    /// A string index points outside the string table.
    #[error("string index {index} in {field} is outside the string table of {len} entries")]
    StringIndex {
        /// The field holding the index, for example `function.name`.
        field: &'static str,
        /// The index found.
        index: i64,
        /// The size of the string table.
        len: usize,
    },
    /// A sample names a location id the profile does not define.
    #[error("sample {sample} refers to unknown location id {id}")]
    UnknownLocation {
        /// The index of the sample.
        sample: usize,
        /// The location id.
        id: u64,
    },
    /// A location, first used by a sample, names a function id the profile does not define.
    #[error("location {location} (used by sample {sample}) refers to unknown function id {id}")]
    UnknownFunction {
        /// The index of the first sample using the location.
        sample: usize,
        /// The location id.
        location: u64,
        /// The function id.
        id: u64,
    },
    /// A location, first used by a sample, names a mapping id the profile does not define.
    #[error("location {location} (used by sample {sample}) refers to unknown mapping id {id}")]
    UnknownMapping {
        /// The index of the first sample using the location.
        sample: usize,
        /// The location id.
        location: u64,
        /// The mapping id.
        id: u64,
    },
    /// A sample has a different number of values than the profile has sample types.
    #[error("sample {sample} has {found} values, expected one per sample type ({expected})")]
    ValueCount {
        /// The index of the sample.
        sample: usize,
        /// The number of sample types.
        expected: usize,
        /// The number of values found.
        found: usize,
    },
    /// A sample has a negative value for a converted sample type.
    #[error("sample {sample} has negative value {value} for sample type {sample_type}")]
    NegativeValue {
        /// The index of the sample.
        sample: usize,
        /// The sample type, for example `alloc_space`.
        sample_type: String,
        /// The value found.
        value: i64,
    },
    /// The `sample_type_config` field is not a JSON object of sample-type settings.
    #[error("invalid sample_type_config json")]
    SampleTypeConfig {
        /// serde_json's error, with line and column.
        source: serde_json::Error,
    },
    /// The `sample_type_config` field names an aggregation other than sum or average.
    #[error(
        "unknown aggregation {aggregation:?} for sample type {sample_type} in sample_type_config"
    )]
    UnknownAggregation {
        /// The sample type whose entry is wrong.
        sample_type: String,
        /// The aggregation found.
        aggregation: String,
    },
}
