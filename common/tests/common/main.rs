//! Integration and property tests of `smolder-common`, one module per stage of the model.

mod selector;
mod series;
mod timestamp;
mod tree;
