//! Ingest names (`app.cpu{k=v}`): never panics, and the normalized key parses back to the same
//! series.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smolder_common::Series;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(series) = Series::parse(text) {
        let key = series.to_string();
        let again = Series::parse(&key).expect("a normalized key parses");
        assert_eq!(again, series, "{key}");
    }
});
