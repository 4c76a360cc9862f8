//! Properties of the wire protocol: batches round-trip through frames; no input, however
//! mangled, makes a decoder panic or allocate past its caps.

use std::time::{Duration, UNIX_EPOCH};

use proptest::prelude::*;
use smolder_common::wire::frame::{self, HEADER_LEN};
use smolder_common::wire::{
    Ack, BatchMessage, FrameError, FrameHeader, FrameKind, FrameLimits, Hello, Reject,
};
use smolder_common::{Aggregation, Labels, Profile, ProfileMeta, Series};

use crate::util::any_tree;

const LIMITS: FrameLimits = FrameLimits {
    max_compressed: 1 << 20,
    max_uncompressed: 4 << 20,
};

fn any_profile() -> impl Strategy<Value = Profile> {
    (
        "[a-z][a-z0-9_]{0,8}",
        prop::option::of("[a-z_]{1,8}"),
        prop::collection::btree_map("[a-z][a-z0-9_]{0,6}", "[a-zA-Z0-9._-]{1,8}", 0..4),
        any_tree(),
        0u32..1000,
        any::<bool>(),
    )
        .prop_map(|(service, kind, labels, tree, rate, average)| {
            let app = match kind {
                Some(kind) => format!("{service}.{kind}"),
                None => service,
            };
            Profile {
                series: Series::new(app, Labels::from_pairs(labels).unwrap()).unwrap(),
                meta: ProfileMeta {
                    spy_name: "ebpfspy".to_owned(),
                    sample_rate: rate,
                    units: "samples".to_owned(),
                    aggregation: if average {
                        Aggregation::Average
                    } else {
                        Aggregation::Sum
                    },
                },
                from: UNIX_EPOCH,
                until: UNIX_EPOCH,
                tree,
            }
        })
}

/// Decodes `bytes` as every kind it claims to be; only errors, never panics.
fn decode_any(bytes: &[u8]) -> Result<(), FrameError> {
    let (header, body) = frame::split_header(bytes)?;
    let header = FrameHeader::parse(header, LIMITS)?;
    match header.kind {
        FrameKind::Batch => {
            let message: BatchMessage = header.decode(body)?;
            let _ = message.into_profiles();
        }
        FrameKind::Hello => {
            header.decode::<Hello>(body)?;
        }
        FrameKind::Ack => {
            header.decode::<Ack>(body)?;
        }
        FrameKind::Reject => {
            header.decode::<Reject>(body)?;
        }
        _ => {}
    }
    Ok(())
}

proptest! {
    #[test]
    fn batches_round_trip_through_frames(
        profiles in prop::collection::vec(any_profile(), 0..4),
        sequence in 1u64..u64::MAX,
        start in 0u64..4_000_000_000,
        length in 0u64..3_600,
    ) {
        let start = UNIX_EPOCH + Duration::from_secs(start);
        let end = start + Duration::from_secs(length);
        let message = BatchMessage::from_profiles("agent-0", sequence, start, end, &profiles);
        let bytes = frame::encode(FrameKind::Batch, &message);
        let decoded: BatchMessage = frame::decode(&bytes, FrameKind::Batch, LIMITS).unwrap();
        prop_assert_eq!(&decoded, &message);
        let back = decoded.into_profiles().unwrap();
        prop_assert_eq!(back.len(), profiles.len());
        for (a, b) in profiles.iter().zip(&back) {
            prop_assert_eq!(&a.series, &b.series);
            prop_assert_eq!(&a.meta, &b.meta);
            prop_assert_eq!(&a.tree, &b.tree);
            prop_assert_eq!((b.from, b.until), (start, end));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_any(&bytes);
    }

    #[test]
    fn a_valid_header_on_arbitrary_bodies_never_panics(
        kind in 1u8..=5,
        compressed in 0u32..2_048,
        uncompressed in 0u32..1 << 20,
        body in prop::collection::vec(any::<u8>(), 0..2_048),
    ) {
        let mut bytes = Vec::from(frame::MAGIC);
        bytes.extend_from_slice(&[smolder_common::wire::PROTOCOL_VERSION, kind, 0, 0]);
        bytes.extend_from_slice(&compressed.to_le_bytes());
        bytes.extend_from_slice(&uncompressed.to_le_bytes());
        bytes.extend_from_slice(&body);
        let _ = decode_any(&bytes);
    }

    #[test]
    fn mangled_batches_never_panic_and_truncation_is_always_caught(
        profiles in prop::collection::vec(any_profile(), 1..3),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let message = BatchMessage::from_profiles("agent-0", 1, UNIX_EPOCH, UNIX_EPOCH, &profiles);
        let bytes = frame::encode(FrameKind::Batch, &message);
        let mut mangled = bytes.clone();
        for (at, byte) in flips {
            let at = at.index(mangled.len());
            mangled[at] ^= byte;
        }
        let _ = decode_any(&mangled);
        let short = &bytes[..cut.index(bytes.len())];
        let truncated = matches!(
            frame::decode::<BatchMessage>(short, FrameKind::Batch, LIMITS),
            Err(FrameError::Truncated { .. })
        );
        prop_assert!(truncated, "{} of {} bytes", short.len(), bytes.len());
        prop_assert!(bytes.len() > HEADER_LEN);
    }
}
