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
//! - [`series`]: series identity. A [`Series`] is an app name and sorted [`Labels`], parsed from
//!   Pyroscope ingest names (`checkout.cpu{env=prod}`) and displayed as the normalized key that
//!   the store indexes by.
//! - [`selector`]: FlameQL selectors. A [`Selector`] is an app name and [`Matcher`]s
//!   (`=`, `!=`, `=~`, `!~`) that [`matches`](Selector::matches) series; regexes are anchored as in
//!   Prometheus, and a missing label reads as the empty value.
//! - [`timestamp`]: the times Pyroscope's API accepts (`now-3h30m`, unix seconds to nanoseconds,
//!   `YYYYMMDD`, RFC 3339), [`parse`](timestamp::parse)d against a clock the caller passes in;
//!   malformed input is a [`TimeError`], never silently `now`.
//!
//! This crate is the bottom of the dependency graph: it must not depend on tokio, quinn, sled,
//! aya or axum, so that its parsers and codecs can be fuzzed and benchmarked alone
//! (`cargo tree -p smolder-common -e normal` checks it).

pub mod flamebearer;
pub mod selector;
pub mod series;
pub mod timestamp;
pub mod tree;

pub use selector::{MatchOp, Matcher, Selector, SelectorError};
pub use series::{Labels, Series, SeriesError};
pub use timestamp::TimeError;
pub use tree::{CombinedTree, DecodeError, FrameId, Frames, NodeId, Tree};
