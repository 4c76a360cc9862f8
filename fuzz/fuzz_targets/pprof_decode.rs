//! The pprof decoder on untrusted bytes, plain and behind a gzip header: never panics, and every
//! tree it produces survives an encode/decode round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smolder_common::pprof::{self, Limits, SampleTypes};

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_bytes: 1 << 20,
        ..Limits::default()
    };
    let Ok(series) = pprof::parse(data, &SampleTypes::default(), &limits) else {
        return;
    };
    for s in series {
        let options = pprof::EncodeOptions::new(s.sample_type, s.units);
        let bytes = pprof::encode(&s.tree, &options).to_bytes(false);
        let mut types = SampleTypes::empty();
        types.insert(options.sample_type.clone(), Default::default());
        let again = pprof::parse(&bytes, &types, &Limits::default()).expect("encoded profile parses");
        // Sums past i64::MAX are written clamped, so only smaller trees must come back equal.
        if i64::try_from(s.tree.total()).is_ok() {
            assert_eq!(again.len(), 1);
            assert_eq!(again[0].tree, s.tree);
        }
    }
});
