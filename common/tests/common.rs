//! Integration and property tests of `smolder-common`, one module per stage of the model.
//!
//! This file is the crate root of the one test binary, so a plain `mod x;` would look for
//! `tests/x.rs`; the `#[path]`s point into `tests/common/` instead.

#[path = "common/selector.rs"]
mod selector;
#[path = "common/series.rs"]
mod series;
#[path = "common/timestamp.rs"]
mod timestamp;
#[path = "common/tree.rs"]
mod tree;
