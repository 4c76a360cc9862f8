//! The agent → aggregator frame decoder on untrusted bytes, as the aggregator reads a stream:
//! header under caps, body, message of the header's kind, then a batch's profiles. Never
//! panics, and every batch it accepts survives a re-encode round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smolder_common::wire::frame;
use smolder_common::wire::{
    Ack, BatchMessage, FrameHeader, FrameKind, FrameLimits, Hello, Reject, Welcome,
};

fuzz_target!(|data: &[u8]| {
    let limits = FrameLimits {
        max_compressed: 1 << 20,
        max_uncompressed: 4 << 20,
    };
    let Ok((header, body)) = frame::split_header(data) else {
        return;
    };
    let Ok(header) = FrameHeader::parse(header, limits) else {
        return;
    };
    match header.kind {
        FrameKind::Batch => {
            let Ok(message) = header.decode::<BatchMessage>(body) else {
                return;
            };
            let (start, end) = message.window();
            let (agent, sequence) = (message.agent_id.clone(), message.sequence);
            let Ok(profiles) = message.into_profiles() else {
                return;
            };
            let again = BatchMessage::from_profiles(&agent, sequence, start, end, &profiles);
            let bytes = frame::encode(FrameKind::Batch, &again);
            let decoded: BatchMessage = frame::decode(&bytes, FrameKind::Batch, limits)
                .expect("a re-encoded batch decodes");
            let back = decoded.into_profiles().expect("a re-encoded batch is valid");
            assert_eq!(back.len(), profiles.len());
            for (a, b) in profiles.iter().zip(&back) {
                assert_eq!(a.series, b.series);
                assert_eq!(a.tree, b.tree);
            }
        }
        FrameKind::Hello => {
            let _ = header.decode::<Hello>(body);
        }
        FrameKind::Welcome => {
            let _ = header.decode::<Welcome>(body);
        }
        FrameKind::Ack => {
            let _ = header.decode::<Ack>(body);
        }
        FrameKind::Reject => {
            let _ = header.decode::<Reject>(body);
        }
        _ => {}
    }
});
