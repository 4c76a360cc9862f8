//! Smolder's profile model and every format both tiers speak.
//!
//! The agent and the aggregator exchange one thing: a [`Tree`] of stack frames per series and
//! window. This crate holds that tree and the formats it is read from and written to.
//!
//! - [`tree`]: the stack tree. Frames are interned to [`FrameId`]s; each node holds self and
//!   total; trees merge by summing, truncate to a node budget the way Pyroscope does, combine for a
//!   diff, and encode to a compact versioned binary form used on the wire and at rest.
//! - [`flamebearer`]: the flame-graph JSON of Pyroscope's `/render` and `/render-diff`, laid out
//!   exactly as Pyroscope lays it out, from a [`Tree`] or a [`CombinedTree`].
//! - [`pprof`]: Google's profile format, as Pyroscope's SDKs push it and Go serves it. Untrusted
//!   bodies, gzipped or not, decode under [`pprof::Limits`] into one [`ProfileSeries`] per sample
//!   type and label set, named the way Pyroscope names them; a tree encodes back to a profile
//!   that `go tool pprof` opens.
//!
//! This crate is the bottom of the dependency graph: it must not depend on tokio, quinn, sled,
//! aya or axum, so that its parsers and codecs can be fuzzed and benchmarked alone
//! (`cargo tree -p smolder-common -e normal` checks it).

pub mod flamebearer;
pub mod pprof;
pub mod tree;

pub use pprof::{PprofError, ProfileSeries, SampleTypes};
pub use tree::{CombinedTree, DecodeError, FrameId, Frames, NodeId, Tree};
