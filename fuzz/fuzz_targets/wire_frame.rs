//! The agent → aggregator frame decoder on untrusted bytes, as the aggregator reads a stream:
//! header under caps, body, message of the header's kind, then a batch's series one by one.
//! Never panics; every series it accepts survives a re-encode round trip, and the split of the
//! accepted series into batches within the welcome's limits loses none of them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smolder_common::wire::frame;
use smolder_common::wire::{
    Ack, BatchLimits, BatchMessage, FrameHeader, FrameKind, FrameLimits, Hello, RefusalReason,
    Reject, SeriesMessage, Welcome, limits,
};

fuzz_target!(|data: &[u8]| {
    let caps = FrameLimits {
        max_compressed: 1 << 20,
        max_uncompressed: 4 << 20,
    };
    let Ok((header, body)) = frame::split_header(data) else {
        return;
    };
    let Ok(header) = FrameHeader::parse(header, caps) else {
        return;
    };
    match header.kind {
        FrameKind::Batch => {
            let Ok(message) = header.decode::<BatchMessage>(body) else {
                return;
            };
            let (start, end) = message.window();
            let (agent, sequence) = (message.agent_id.clone(), message.sequence);
            let Ok(series) = message.into_series() else {
                return;
            };
            let profiles: Vec<_> = series.into_iter().filter_map(Result::ok).collect();
            let again = BatchMessage::from_profiles(&agent, sequence, start, end, &profiles);
            let bytes = frame::encode(FrameKind::Batch, &again);
            let decoded: BatchMessage = frame::decode(&bytes, FrameKind::Batch, caps)
                .expect("a re-encoded batch decodes");
            let back = decoded.into_profiles().expect("a re-encoded batch is valid");
            assert_eq!(back.len(), profiles.len());
            for (a, b) in profiles.iter().zip(&back) {
                assert_eq!(a.series, b.series);
                assert_eq!(a.tree, b.tree);
            }
            // Limits from the input itself, small enough to split.
            let limits = BatchLimits {
                max_batch_bytes: 2_048 + u64::from(data[0]) * 64,
                max_series: u32::from(data[1] % 8),
                max_labels: u32::from(data[2] % 4),
                max_label_bytes: u32::from(data[3] % 16),
            };
            let messages: Vec<SeriesMessage> =
                profiles.iter().map(SeriesMessage::from_profile).collect();
            let split = limits::split(messages, &limits);
            let kept: usize = split.batches.iter().map(Vec::len).sum();
            assert_eq!(kept + split.refused.len(), profiles.len());
            for batch in &split.batches {
                assert!(!batch.is_empty() && batch.len() <= limits.max_series.max(1) as usize);
            }
        }
        FrameKind::Hello => {
            let _ = header.decode::<Hello>(body);
        }
        FrameKind::Welcome => {
            if let Ok(welcome) = header.decode::<Welcome>(body) {
                let _ = BatchLimits::from_welcome(&welcome).series_budget();
            }
        }
        FrameKind::Ack => {
            if let Ok(ack) = header.decode::<Ack>(body) {
                for refusal in &ack.refused {
                    let _ = RefusalReason::parse(&refusal.reason);
                }
            }
        }
        FrameKind::Reject => {
            let _ = header.decode::<Reject>(body);
        }
        _ => {}
    }
});
