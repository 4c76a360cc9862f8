//! Properties of the wire protocol: batches round-trip through frames; a window splits into
//! batches within any limits without losing or reordering a series; messages of v0.1 and of
//! this release read each other; no input, however mangled, makes a decoder panic or allocate
//! past its caps.

use std::time::{Duration, UNIX_EPOCH};

use proptest::prelude::*;
use prost::Message;
use smolder_common::wire::frame::{self, HEADER_LEN};
use smolder_common::wire::{
    Ack, BatchLimits, BatchMessage, FrameError, FrameHeader, FrameKind, FrameLimits, Hello,
    RefusalReason, RefusalTally, Reject, SeriesMessage, SeriesRefusal, Welcome, limits,
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

/// Whether two series of `series` are equal, which makes positions ambiguous.
fn has_twins(series: &[SeriesMessage]) -> bool {
    series
        .iter()
        .enumerate()
        .any(|(i, s)| series[i + 1..].contains(s))
}

/// Decodes `bytes` as every kind it claims to be; only errors, never panics.
fn decode_any(bytes: &[u8]) -> Result<(), FrameError> {
    let (header, body) = frame::split_header(bytes)?;
    let header = FrameHeader::parse(header, LIMITS)?;
    match header.kind {
        FrameKind::Batch => {
            let message: BatchMessage = header.decode(body)?;
            let _ = message.into_series();
        }
        FrameKind::Hello => {
            header.decode::<Hello>(body)?;
        }
        FrameKind::Welcome => {
            header.decode::<Welcome>(body)?;
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

/// The messages as v0.1 wrote them, field for field: what an agent or aggregator of the
/// previous release sends and reads.
mod v0_1 {
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Welcome {
        #[prost(string, tag = "1")]
        pub(crate) aggregator_version: String,
        #[prost(uint64, tag = "2")]
        pub(crate) max_batch_bytes: u64,
        #[prost(uint32, tag = "3")]
        pub(crate) max_batches_in_flight: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Ack {
        #[prost(uint64, tag = "1")]
        pub(crate) sequence: u64,
        #[prost(bool, tag = "2")]
        pub(crate) duplicate: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Reject {
        #[prost(uint64, tag = "1")]
        pub(crate) sequence: u64,
        #[prost(string, tag = "2")]
        pub(crate) reason: String,
        #[prost(bool, tag = "3")]
        pub(crate) retryable: bool,
    }
}

fn any_refusal() -> impl Strategy<Value = SeriesRefusal> {
    (
        any::<u32>(),
        prop::sample::select(&RefusalReason::ALL[..]),
        "[ -~]{0,40}",
    )
        .prop_map(|(index, reason, message)| SeriesRefusal {
            index,
            reason: reason.as_str().to_owned(),
            message,
        })
}

/// Limits small enough that windows of a few series split.
fn any_limits() -> impl Strategy<Value = BatchLimits> {
    (2_048u64..16_384, 1u32..5, 0u32..4, 1u32..10).prop_map(
        |(max_batch_bytes, max_series, max_labels, max_label_bytes)| BatchLimits {
            max_batch_bytes,
            max_series,
            max_labels,
            max_label_bytes,
        },
    )
}

proptest! {
    #[test]
    fn windows_split_within_the_limits_losing_and_reordering_nothing(
        profiles in prop::collection::vec(any_profile(), 0..12),
        limits in any_limits(),
        sequence in 1u64..1_000,
    ) {
        let series: Vec<SeriesMessage> = profiles.iter().map(SeriesMessage::from_profile).collect();
        let split = limits::split(series.clone(), &limits);
        let caps = FrameLimits {
            max_compressed: limits.max_batch_bytes as u32,
            max_uncompressed: limits.max_batch_bytes as u32,
        };
        let mut kept = Vec::new();
        for (i, batch) in split.batches.iter().enumerate() {
            prop_assert!(!batch.is_empty());
            prop_assert!(batch.len() <= limits.max_series as usize);
            let message = BatchMessage::from_series(
                &"a".repeat(128),
                sequence + i as u64,
                UNIX_EPOCH,
                UNIX_EPOCH + Duration::from_secs(10),
                batch.clone(),
            );
            // Within the cap both as sent and decompressed: the aggregator reads it.
            let bytes = frame::encode(FrameKind::Batch, &message);
            let decoded: BatchMessage = frame::decode(&bytes, FrameKind::Batch, caps).unwrap();
            prop_assert_eq!(decoded.into_profiles().unwrap().len(), batch.len());
            kept.extend(batch.iter().cloned());
        }
        for (message, refusal) in &split.refused {
            let labels = message.labels.len();
            let longest = message
                .labels
                .iter()
                .map(|l| l.name.len().max(l.value.len()))
                .max()
                .unwrap_or(0);
            match refusal.reason {
                RefusalReason::TooManyLabels => prop_assert!(labels > limits.max_labels as usize),
                RefusalReason::LabelTooLong => {
                    prop_assert!(longest > limits.max_label_bytes as usize)
                }
                RefusalReason::TooLarge => prop_assert!(
                    BatchMessage::from_series("a", 1, UNIX_EPOCH, UNIX_EPOCH, vec![message.clone()])
                        .encoded_len()
                        > limits.series_budget()
                ),
                other => prop_assert!(false, "unexpected reason {other:?}"),
            }
        }
        // Kept series keep their order, and with the refused ones make up the window.
        let order: Vec<usize> = kept
            .iter()
            .map(|s| series.iter().position(|t| t == s).unwrap())
            .collect();
        prop_assert!(order.windows(2).all(|w| w[0] < w[1]) || has_twins(&series));
        prop_assert_eq!(kept.len() + split.refused.len(), series.len());
    }

    #[test]
    fn messages_of_v0_1_and_of_this_release_read_each_other(
        version in "[0-9.]{1,8}",
        max_batch_bytes in any::<u64>(),
        in_flight in any::<u32>(),
        limits in (any::<u32>(), any::<u32>(), any::<u32>(), any::<i64>(), any::<u32>()),
        sequence in any::<u64>(),
        duplicate in any::<bool>(),
        refused in prop::collection::vec(any_refusal(), 0..4),
        reason in "[ -~]{0,40}",
        retryable in any::<bool>(),
        code in "[a-z_]{0,12}",
    ) {
        // This release's welcome, read by v0.1: the fields it knows are there.
        let welcome = Welcome {
            aggregator_version: version.clone(),
            max_batch_bytes,
            max_batches_in_flight: in_flight,
            max_series_per_batch: limits.0,
            max_labels_per_series: limits.1,
            max_label_bytes: limits.2,
            clock_unix_nanos: limits.3,
            max_clock_skew_seconds: limits.4,
        };
        let old: v0_1::Welcome = frame::decode(
            &frame::encode(FrameKind::Welcome, &welcome), FrameKind::Welcome, FrameLimits::CONTROL,
        ).unwrap();
        prop_assert_eq!(
            old.clone(),
            v0_1::Welcome { aggregator_version: version, max_batch_bytes, max_batches_in_flight: in_flight }
        );
        // v0.1's welcome, read by this release: what it did not announce reads as zero, which
        // the limits take as v0.1's defaults.
        let new: Welcome = frame::decode(
            &frame::encode(FrameKind::Welcome, &old), FrameKind::Welcome, FrameLimits::CONTROL,
        ).unwrap();
        prop_assert_eq!(new.max_series_per_batch, 0);
        prop_assert_eq!(new.clock_unix_nanos, 0);
        let read = BatchLimits::from_welcome(&new);
        prop_assert_eq!(read.max_series, BatchLimits::V0_1.max_series);
        prop_assert_eq!(read.max_labels, BatchLimits::V0_1.max_labels);

        let unlisted = vec![RefusalTally { reason: "too_old".to_owned(), count: 3 }];
        let ack = Ack { sequence, duplicate, refused: refused.clone(), unlisted: unlisted.clone() };
        let old: v0_1::Ack = frame::decode(
            &frame::encode(FrameKind::Ack, &ack), FrameKind::Ack, FrameLimits::CONTROL,
        ).unwrap();
        prop_assert_eq!(old.clone(), v0_1::Ack { sequence, duplicate });
        let new: Ack = frame::decode(
            &frame::encode(FrameKind::Ack, &old), FrameKind::Ack, FrameLimits::CONTROL,
        ).unwrap();
        prop_assert_eq!(new, Ack { sequence, duplicate, ..Ack::default() });

        let reject = Reject { sequence, reason: reason.clone(), retryable, code, refused, unlisted };
        let old: v0_1::Reject = frame::decode(
            &frame::encode(FrameKind::Reject, &reject), FrameKind::Reject, FrameLimits::CONTROL,
        ).unwrap();
        prop_assert_eq!(old.clone(), v0_1::Reject { sequence, reason: reason.clone(), retryable });
        let new: Reject = frame::decode(
            &frame::encode(FrameKind::Reject, &old), FrameKind::Reject, FrameLimits::CONTROL,
        ).unwrap();
        prop_assert_eq!(new, Reject { sequence, reason, retryable, ..Reject::default() });
    }

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
