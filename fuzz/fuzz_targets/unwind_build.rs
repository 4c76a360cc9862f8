//! The unwind-table builder on untrusted ELF bytes (the agent builds tables from whatever
//! executables processes map): never panics, and every table it builds passes its own
//! validation and round-trips through the cache format.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smolder_unwind::{Elf, Limits, cache};

fuzz_target!(|data: &[u8]| {
    let Ok(elf) = Elf::parse(data) else {
        return;
    };
    let _ = elf.id();
    let _ = elf.bias(0x7f00_0000_0000, 0);
    let limits = Limits { max_rows: 1 << 16, max_pages: 1 << 10 };
    let Ok(table) = smolder_unwind::build(&elf, None, &limits) else {
        return;
    };
    let bytes = cache::encode(&table);
    assert_eq!(cache::decode(&bytes, &limits).expect("a built table decodes"), table);
});
