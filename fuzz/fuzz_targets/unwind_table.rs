//! The unwind-table cache reader on untrusted bytes (a cache directory is only as trustworthy
//! as the disk): never panics, never allocates past its limits, and every table it accepts
//! re-encodes to the same bytes and answers lookups. The checksum is recomputed on a copy so
//! that mutations reach the structural checks behind it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smolder_unwind::{Limits, cache};

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_rows: 1 << 16, max_pages: 1 << 10 };
    check(data, &limits);
    if data.len() >= 4 {
        let mut fixed = data.to_vec();
        let body = fixed.len() - 4;
        let crc = crc32fast::hash(&fixed[..body]);
        fixed[body..].copy_from_slice(&crc.to_le_bytes());
        check(&fixed, &limits);
    }
});

fn check(data: &[u8], limits: &Limits) {
    let Ok(table) = cache::decode(data, limits) else {
        return;
    };
    assert_eq!(cache::encode(&table), data, "an accepted file re-encodes to itself");
    let first = u64::from(table.first_page()) << smolder_unwind::PAGE_BITS;
    for (pc, rule) in table.rows() {
        assert_eq!(table.lookup(pc), rule);
    }
    for delta in [0, 1, 0xffff, 0x10000, 0x12345] {
        let _ = table.lookup(first.wrapping_add(delta));
        let _ = table.lookup(first.wrapping_sub(delta));
    }
}
