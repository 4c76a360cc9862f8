//! FlameQL selectors from query strings: never panics, and what parses prints back to a
//! selector that parses to the same thing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smolder_common::Selector;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(selector) = Selector::parse(text) {
        let printed = selector.to_string();
        let again = Selector::parse(&printed).expect("a printed selector parses");
        assert_eq!(again, selector, "{printed}");
    }
});
