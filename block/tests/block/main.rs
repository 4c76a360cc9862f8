//! Integration and property tests of `smolder-block`, one module per concern.

/// Bad blocks: truncated, a flipped byte in each section, a newer version; errors name the
/// section and nothing panics.
mod damage;
/// App deletions: a cut's and a merge's deleted buckets left out, the deletion listed.
mod deletions;
/// Merging and downsampling: merged blocks read as the sum of their inputs, each batch once.
mod merge;
/// Building and reading: every range of a built block reads back as the trees put in.
mod round_trip;
/// Span profiles: each span's tree reads back, each batch once, through merges.
mod spans;
/// Generators of batches and the reference sums the tests compare against.
mod util;
