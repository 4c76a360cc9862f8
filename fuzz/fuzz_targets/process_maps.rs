//! The `/proc/PID/maps` parser (`ProcessMap::parse`) on arbitrary text: a path in it is any
//! file name a process mapped (spaces, newlines' neighbours, ` (deleted)`). Never panics; the
//! mappings it keeps are sorted, non-empty ranges, and `find` finds only a mapping that holds
//! the address.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smolder_agent::ebpf::process::ProcessMap;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let map = ProcessMap::parse(text);
    assert!(map.mappings.windows(2).all(|w| w[0].start <= w[1].start));
    for mapping in &map.mappings {
        for addr in [mapping.start, mapping.end.wrapping_sub(1), mapping.end] {
            if let Some(found) = map.find(addr) {
                assert!(found.start <= addr && addr < found.end, "{found:?} for {addr:#x}");
            }
        }
    }
});
