//! Integration and property tests of `smolder-common`, one module per stage of the model.

/// Flame-graph layout: reads back to its tree; truncation agrees with the tree's.
mod flamebearer;
/// Folded and lines text: round trips, totals, never panicking on arbitrary bytes.
mod folded;
/// JFR: the JDK's own recordings convert with the sample counts `jfr` reports; the parser
/// never panics on arbitrary bytes.
mod jfr;
/// OTLP profiles: generated requests convert to the stacks, labels and spans they hold, in
/// protobuf and JSON; no input makes the reader panic.
mod otlp;
/// pprof: trees round-trip through pprof; the decoder never panics on arbitrary bytes.
mod pprof;
/// The query API's codecs: messages round-trip through protobuf and JSON, both spellings.
mod querier;
/// Rules: evaluation agrees with the naive definition; arbitrary rule maps never panic.
mod rules;
/// FlameQL selectors: print/parse round trips, matching a series by its own labels.
mod selector;
/// Ingest names: normalized keys parse back to the same series.
mod series;
/// Time expressions: compound offsets, digit-length rules, never panicking.
mod timestamp;
/// The stack tree: encoding round trips, merge algebra, truncation.
mod tree;
/// Generators and helpers shared by the modules above.
mod util;
/// The wire protocol: batches round-trip through frames; mangled frames only ever error.
mod wire;
