//! Integration and property tests of `smolder-common`, one module per stage of the model.
//!
//! This file is the crate root of the one test binary, so its modules live in `common/` and are
//! named with `#[path]` (a crate root would otherwise look for them next to itself, where cargo
//! would also build each as a test binary of its own).

/// Folded and lines text: round trips, totals, never panicking on arbitrary bytes.
#[path = "common/folded.rs"]
mod folded;
/// The stack tree: encoding round trips, merge algebra, truncation.
#[path = "common/tree.rs"]
mod tree;
/// Generators and helpers shared by the modules above.
#[path = "common/util.rs"]
mod util;
