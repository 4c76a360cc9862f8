//! Integration and property tests of `smolder-common`, one module per stage of the model.

// pprof: tree round trips through pprof, and the decoder on arbitrary bytes.
mod pprof;
mod tree;
