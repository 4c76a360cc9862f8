//! The aggregator's head log records on untrusted bytes (a log is only as trustworthy as the
//! disk): never panics, never allocates past its limit, and every record it accepts frames and
//! encodes back to a record that reads the same. The checksum is recomputed on a copy so that
//! mutations reach the decompression and record checks behind it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smolder_block::{HeadRecord, Limits};

/// Small enough that a fuzzer's inputs cannot make it allocate much.
const LIMITS: Limits = Limits {
    max_section_bytes: 1 << 20,
};

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut framed = (data.len() as u32).to_le_bytes().to_vec();
    framed.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    framed.extend_from_slice(data);
    check(&framed);
    if let Ok(record) = HeadRecord::decode(data, 10) {
        // Not byte for byte: an overlong varint or unsorted labels read fine and write canonical.
        let bytes = record.as_ref().encode();
        let again = HeadRecord::decode(&bytes, 10).expect("an encoded record decodes");
        assert_eq!(again.as_ref().encode(), bytes, "a canonical record re-encodes to itself");
    }
});

fn check(data: &[u8]) {
    let Ok((record, len)) = HeadRecord::unframe(data, 10, &LIMITS) else {
        return;
    };
    assert!(len <= data.len());
    let again = record.as_ref().frame();
    let (back, again_len) = HeadRecord::unframe(&again, 10, &LIMITS).expect("a framed record reads");
    assert_eq!(back.as_ref().encode(), record.as_ref().encode());
    assert_eq!(again_len, again.len());
}
