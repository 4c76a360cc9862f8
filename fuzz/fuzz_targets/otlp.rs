//! The OTLP profiles reader on untrusted bytes, as protobuf and as JSON: never panics, and
//! every profile it converts is consistent (each span's tree is part of its profile's tree).
#![no_main]

use std::time::UNIX_EPOCH;

use libfuzzer_sys::fuzz_target;
use smolder_common::otlp::{self, Limits};

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_bytes: 1 << 20,
        ..Limits::default()
    };
    for decoded in [
        otlp::decode_protobuf(data, &limits),
        otlp::decode_json(data, &limits),
    ] {
        let Ok(request) = decoded else { continue };
        let Ok(converted) = otlp::convert(&request, &limits, UNIX_EPOCH) else {
            continue;
        };
        for c in converted {
            for (_, span) in c.spans.iter() {
                assert!(span.total() <= c.profile.tree.total());
            }
        }
    }
});
