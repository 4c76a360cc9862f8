//! The JFR parser on untrusted bytes: never panics, and every series it returns has a tree.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smolder_common::jfr;

fuzz_target!(|data: &[u8]| {
    if let Ok(series) = jfr::parse(data) {
        for s in series {
            assert!(!s.tree.is_empty());
        }
    }
});
