//! The aggregator's credential files and `Authorization`/`Cookie` headers on untrusted text:
//! never panics, a refused file's error shows none of its secrets, and every credential of an
//! accepted file is found when presented as a client would. The first byte picks whether
//! multitenancy is on.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smolder_aggregator::fuzzing;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    fuzzing::credential_file(rest, flags & 1 == 1);
    if let Ok(text) = std::str::from_utf8(rest) {
        fuzzing::headers(text);
    }
});
