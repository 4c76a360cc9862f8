//! The tree decoder on untrusted bytes: never panics, and whatever it accepts re-encodes to
//! bytes that decode to the same tree.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smolder_common::Tree;

fuzz_target!(|data: &[u8]| {
    if let Ok(tree) = Tree::decode(data) {
        let again = Tree::decode(&tree.encode()).expect("re-encoded tree decodes");
        assert_eq!(again, tree);
    }
});
