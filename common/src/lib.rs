//! Smolder's profile model and every format both tiers speak.
//!
//! The agent and the aggregator exchange one thing: a [`Tree`] of stack frames per series and
//! window. This crate holds that tree and the formats it is read from and written to.
//!
//! - [`tree`]: the stack tree. Frames are interned to [`FrameId`]s; each node holds self and
//!   total; trees merge by summing, truncate to a node budget the way Pyroscope does, combine for a
//!   diff, and encode to a compact versioned binary form used on the wire and at rest.
//! - [`series`]: series identity. A [`Series`] is an app name and sorted [`Labels`], parsed from
//!   Pyroscope ingest names (`checkout.cpu{env=prod}`) and displayed as the normalized key that
//!   the store indexes by.
//! - [`selector`]: FlameQL selectors. A [`Selector`] is an app name and [`Matcher`]s
//!   (`=`, `!=`, `=~`, `!~`) that [`matches`](Selector::matches) series; regexes are anchored as in
//!   Prometheus, and a missing label reads as the empty value.
//! - [`timestamp`]: the times Pyroscope's API accepts (`now-3h30m`, unix seconds to nanoseconds,
//!   `YYYYMMDD`, RFC 3339), [`parse`](timestamp::parse)d against a clock the caller passes in;
//!   malformed input is a [`TimeError`], never silently `now`.
//! - [`profile`]: a [`Profile`] is one series' tree over a span of time with the
//!   [`ProfileMeta`] that says what its values mean (units, sample rate, [`Aggregation`]).
//! - [`folded`]: the folded ("collapsed") and `lines` text formats, Pyroscope's default `/ingest`
//!   bodies. Bodies parse into a [`Tree`] (all or nothing, errors naming the line) and trees
//!   write back out as folded text.
//! - [`flamebearer`]: the flame-graph JSON of Pyroscope's `/render` and `/render-diff`, laid out
//!   exactly as Pyroscope lays it out, from a [`Tree`] or a [`CombinedTree`].
//! - [`pprof`]: Google's profile format, as Pyroscope's SDKs push it and Go serves it. Untrusted
//!   bodies, gzipped or not, decode under [`pprof::Limits`] into one [`ProfileSeries`] per sample
//!   type and label set, named the way Pyroscope names them; a tree encodes back to a profile
//!   that `go tool pprof` opens.
//! - [`jfr`]: Java Flight Recorder recordings as the Pyroscope Java agent pushes them, converted
//!   to one [`Tree`] per profile type (`cpu`, allocations, locks) the way Pyroscope converts
//!   them; untrusted input, bounded work, typed errors.
//! - [`rules`]: metrics from profiles. A [`RuleSet`](rules::RuleSet) of Pyroscope-style
//!   `metrics-export-rules` (selector, node regex or function, `group_by`) evaluates each
//!   [`Profile`] into counter increments, which [`Counters`](rules::Counters) add up and write
//!   out in Prometheus' text format.
//! - [`prometheus`]: Prometheus' naming rules for metric and label names, which rules,
//!   relabelling and remote write check against.
//! - [`wire`]: the agent → aggregator protocol: framed, lz4-compressed protobuf messages
//!   (hello, batch, ack, reject) with a protocol version, size caps checked before anything is
//!   allocated, and the conversion between a window's profiles and a batch.
//! - [`profile_type`]: Pyroscope's profile type ids (`process_cpu:cpu:nanoseconds:cpu:nanoseconds`)
//!   and the series suffixes they stand for, one table for every source; CPU sample counts
//!   become nanoseconds by [`ValueScale`].
//! - [`span`]: span profiles: a [`SpanTrees`] beside a profile's tree keeps the samples of each
//!   traced span, by [`SpanId`], without making span ids series labels.
//! - [`otlp`]: OTLP profiles (`profiles/v1development`, opentelemetry-proto v1.10): export
//!   requests read from untrusted protobuf or JSON with sizes capped before decoding and every
//!   field checked against the schema, then converted into profiles and span trees.
//! - [`querier`]: the query API Grafana speaks, Pyroscope's Connect `querier.v1` (with
//!   `types.v1` and `settings.v1`): its messages in binary protobuf and JSON, and the flame
//!   graph, diff and tree forms of its answers.
//! - [`protojson`]: the proto3 JSON mapping as serde helpers, for the messages above.
//! - [`varint`]: LEB128 varints, which protobuf and Smolder's own encodings write.
//! - [`corpus`]: a seeded synthetic profile generator for tests and benchmarks: unique stacks
//!   that share prefixes like real call trees, drawn Zipf-distributed by rank.
//!
//! This crate is the bottom of the dependency graph: it must not depend on tokio, quinn, sled,
//! aya or axum, so that its parsers and codecs can be fuzzed and benchmarked alone
//! (`cargo tree -p smolder-common -e normal` checks it).

pub mod corpus;
pub mod flamebearer;
pub mod folded;
pub mod jfr;
pub mod otlp;
pub mod pprof;
pub mod profile;
pub mod profile_type;
pub mod prometheus;
pub mod protojson;
pub mod querier;
pub mod rules;
pub mod selector;
pub mod series;
pub mod span;
pub mod timestamp;
pub mod tree;
pub mod varint;
pub mod wire;

pub use corpus::{Corpus, CorpusConfig, Sampler};
pub use folded::{
    FoldedError, FoldedFormat, FoldedLimits, parse_folded, parse_folded_into, to_folded,
    write_folded, write_lines,
};
pub use pprof::{PprofError, ProfileSeries, SampleTypes};
pub use profile::{Aggregation, Profile, ProfileMeta};
pub use profile_type::{ProfileTypeId, ValueScale};
pub use selector::{MatchOp, Matcher, Selector, SelectorError};
pub use series::{Labels, Series, SeriesError};
pub use span::{SpanId, SpanTrees};
pub use timestamp::TimeError;
pub use tree::{CombinedTree, DecodeError, FrameId, Frames, NodeId, Tree};
