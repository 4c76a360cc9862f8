//! Folded and lines bodies from `/ingest`: never panics, and what parses writes back to folded
//! text that parses to the same tree.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smolder_common::{FoldedFormat, FoldedLimits, parse_folded, to_folded};

fuzz_target!(|data: &[u8]| {
    let limits = FoldedLimits { max_line_bytes: 4096 };
    let _ = parse_folded(data, FoldedFormat::Lines, &limits);
    if let Ok(tree) = parse_folded(data, FoldedFormat::Folded, &limits) {
        let text = to_folded(&tree);
        let again = parse_folded(text.as_bytes(), FoldedFormat::Folded, &FoldedLimits::default())
            .expect("written folded text parses");
        assert_eq!(to_folded(&again), text);
    }
});
