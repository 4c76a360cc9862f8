//! Integration and property tests of `smolder-block`, one module per concern.

/// Bad blocks: truncated, a flipped byte in each section, a newer version; errors name the
/// section and nothing panics.
mod damage;
/// Merging and downsampling: merged blocks read as the sum of their inputs, each batch once.
mod merge;
/// Building and reading: every range of a built block reads back as the trees put in.
mod round_trip;
/// Generators of batches and the reference sums the tests compare against.
mod util;
