//! The records of the aggregator's head log: one acknowledged write's profiles of one head
//! range, as the aggregator appends them to `<data-dir>/head/log/<range>.log` before it
//! acknowledges the write and reads them back at a restart.
//!
//! A frame is the payload's length (u32 LE), its CRC-32 (u32 LE), and the payload: the record
//! lz4-compressed with its decompressed length prepended (u32 LE). A record of version 1 is:
//! tenant, marker agent id, marker sequence, window end + 1 (0: none), write number, profile
//! count, and per profile its bucket, app, label count and (name, value) pairs, spy name, sample
//! rate, units, aggregation (0 sum, 1 average), tree length and tree ([`Tree::encode`]).
//! Integers are LEB128, strings a byte length and UTF-8.
//!
//! Version 2 adds span profiles: the record starts with a zero byte (which no version 1 record
//! starts with: its tenant is never empty) and the version (2), then the version 1 layout with,
//! after each profile's tree, its span count and per span its id (8 bytes, big-endian), tree
//! length and tree. A record without spans (and with a tenant) is written as version 1, so that
//! its bytes are those of the aggregators before span profiles.
//!
//! Input: bytes read from a disk, so anything; output: a [`HeadRecord`] or a [`BlockError`]
//! naming [`Section::HeadRecord`]. Nothing is allocated past [`Limits::max_section_bytes`], past
//! what lz4 can expand the stored bytes to, or past what the bytes can hold. Caller: the
//! aggregator's head (`store::blocks::wal`), which owns the files.

use std::time::{Duration, UNIX_EPOCH};

use smolder_common::{Aggregation, Labels, Profile, ProfileMeta, Series, SpanId, SpanTrees, Tree};

use crate::codec::{Reader, crc, put_str, put_varint};
use crate::error::{BlockError, Problem, Section};
use crate::footer::Limits;
use crate::index::Marker;

/// The most bytes lz4's block format expands one stored byte to (a match of 255+ bytes costs
/// at least one byte), so a frame cannot honestly claim more.
const LZ4_MAX_RATIO: u64 = 255;

/// Bytes a profile takes at least in a record: eight one-byte fields and a tree.
const MIN_PROFILE_BYTES: usize = 9;

/// Bytes a span takes at least in a record: its id, a tree length and a tree.
const MIN_SPAN_BYTES: usize = 10;

/// The record version with span profiles; see the [module documentation](self).
const SPANS_VERSION: u64 = 2;

/// Most profiles or labels reserved for before they are read: counts are checked against the
/// bytes left, but an item in memory is far larger than its fewest bytes on disk.
const MAX_RESERVED: usize = 256;

const SECTION: Section = Section::HeadRecord;

/// One write's profiles of one head range, as borrowed for [`RecordRef::frame`].
#[derive(Clone, Copy, Debug)]
pub struct RecordRef<'a> {
    /// The tenant's name.
    pub tenant: &'a str,
    /// The agent batch, or the aggregator's own marker of an HTTP write.
    pub marker: &'a Marker,
    /// An agent batch's window end, unix seconds; `None` for the aggregator's own writes.
    pub window_end: Option<u64>,
    /// The write's number, in the order the aggregator applied writes.
    pub write: u64,
    /// Each profile with its bucket's start and its span trees.
    pub profiles: &'a [HeadProfile],
}

/// One profile of a head record.
#[derive(Clone, Debug)]
pub struct HeadProfile {
    /// Unix seconds of its bucket's start; the profile spans its bucket.
    pub bucket: u64,
    /// The profile.
    pub profile: Profile,
    /// The trees of the spans its samples ran in (empty for most profiles).
    pub spans: SpanTrees,
}

/// One write's profiles of one head range, as read back from a log.
#[derive(Clone, Debug)]
pub struct HeadRecord {
    /// The tenant's name (unchecked: the aggregator validates it).
    pub tenant: String,
    /// The agent batch, or the aggregator's own marker of an HTTP write.
    pub marker: Marker,
    /// An agent batch's window end, unix seconds; `None` for the aggregator's own writes.
    pub window_end: Option<u64>,
    /// The write's number.
    pub write: u64,
    /// Each profile with its bucket's start and its span trees.
    pub profiles: Vec<HeadProfile>,
}

impl HeadRecord {
    /// The record as [`RecordRef`] borrows it.
    pub fn as_ref(&self) -> RecordRef<'_> {
        RecordRef {
            tenant: &self.tenant,
            marker: &self.marker,
            window_end: self.window_end,
            write: self.write,
            profiles: &self.profiles,
        }
    }

    /// Reads the frame at the start of `bytes`: the record and the frame's length. Profiles
    /// span `bucket_secs` from their bucket. A torn frame (the bytes end inside it) is a
    /// [`Problem::Truncated`] error.
    pub fn unframe(
        bytes: &[u8],
        bucket_secs: u64,
        limits: &Limits,
    ) -> Result<(HeadRecord, usize), BlockError> {
        let mut r = Reader::new(bytes, SECTION);
        let len = r.u32_le("frame length")?;
        let stored = r.u32_le("frame checksum")?;
        let payload = r.take(len as usize, "frame payload")?;
        let computed = crc(payload);
        if computed != stored {
            return Err(BlockError::Checksum {
                section: SECTION,
                stored,
                computed,
            });
        }
        let mut p = Reader::new(payload, SECTION);
        let plain_len = u64::from(p.u32_le("decompressed length")?);
        let limit = limits
            .max_section_bytes
            .min((p.remaining() as u64).saturating_mul(LZ4_MAX_RATIO));
        if plain_len > limit {
            return Err(BlockError::TooLarge {
                section: SECTION,
                len: plain_len,
                limit,
            });
        }
        let mut plain = vec![0; plain_len as usize];
        match lz4_flex::block::decompress_into(&payload[4..], &mut plain) {
            Ok(written) if written as u64 == plain_len => {}
            _ => return Err(BlockError::Decompress { section: SECTION }),
        }
        Ok((HeadRecord::decode(&plain, bucket_secs)?, 8 + len as usize))
    }

    /// Decodes a record's (decompressed) bytes, of either version; profiles span
    /// `bucket_secs` from their bucket.
    pub fn decode(bytes: &[u8], bucket_secs: u64) -> Result<HeadRecord, BlockError> {
        let mut r = Reader::new(bytes, SECTION);
        let with_spans = bytes.first() == Some(&0);
        if with_spans {
            r.byte("version marker")?;
            if r.varint("record version")? != SPANS_VERSION {
                return Err(r.invalid("record version", "not a version this build reads"));
            }
        }
        let tenant = r.str("tenant")?.to_owned();
        let agent_id = r.str("marker agent id")?.to_owned();
        let sequence = r.varint("marker sequence")?;
        let window_end = r.varint("window end")?.checked_sub(1);
        let write = r.varint("write number")?;
        let count = r.count("profiles", MIN_PROFILE_BYTES)?;
        let mut profiles = Vec::with_capacity(count.min(MAX_RESERVED));
        for _ in 0..count {
            let bucket = r.varint("bucket")?;
            let app = r.str("app")?.to_owned();
            let labels = r.count("labels", 2)?;
            let mut pairs = Vec::with_capacity(labels.min(MAX_RESERVED));
            for _ in 0..labels {
                pairs.push((
                    r.str("label name")?.to_owned(),
                    r.str("label value")?.to_owned(),
                ));
            }
            let labels =
                Labels::from_pairs(pairs).map_err(|_| r.invalid("labels", "not valid labels"))?;
            let series =
                Series::new(app, labels).map_err(|_| r.invalid("series", "not a valid series"))?;
            let spy_name = r.str("spy name")?.to_owned();
            let sample_rate = r.varint_u32("sample rate")?;
            let units = r.str("units")?.to_owned();
            let aggregation = match r.byte("aggregation")? {
                0 => Aggregation::Sum,
                1 => Aggregation::Average,
                _ => return Err(r.invalid("aggregation", "neither 0 (sum) nor 1 (average)")),
            };
            let len = r.count("tree", 1)?;
            let tree = Tree::decode(r.take(len, "tree")?)
                .map_err(|_| r.invalid("tree", "not a valid tree"))?;
            let mut spans = SpanTrees::new();
            if with_spans {
                for _ in 0..r.count("spans", MIN_SPAN_BYTES)? {
                    let id = r.take(8, "span id")?;
                    let id = SpanId::from_bytes(id.try_into().expect("8 bytes"))
                        .ok_or_else(|| r.invalid("span id", "all zeros"))?;
                    let len = r.count("span tree", 1)?;
                    let tree = Tree::decode(r.take(len, "span tree")?)
                        .map_err(|_| r.invalid("span tree", "not a valid tree"))?;
                    if spans.get(id).is_some() {
                        return Err(r.invalid("span id", "listed twice"));
                    }
                    spans.add(id, &tree);
                }
            }
            let from = UNIX_EPOCH
                .checked_add(Duration::from_secs(bucket))
                .ok_or_else(|| {
                    r.error(Problem::Invalid {
                        field: "bucket",
                        reason: "past the end of time",
                    })
                })?;
            let until = from
                .checked_add(Duration::from_secs(bucket_secs))
                .unwrap_or(from);
            profiles.push(HeadProfile {
                bucket,
                profile: Profile {
                    series,
                    meta: ProfileMeta {
                        spy_name,
                        sample_rate,
                        units,
                        aggregation,
                    },
                    from,
                    until,
                    tree,
                },
                spans,
            });
        }
        r.finish()?;
        Ok(HeadRecord {
            tenant,
            marker: Marker { agent_id, sequence },
            window_end,
            write,
            profiles,
        })
    }
}

impl RecordRef<'_> {
    /// The record's bytes, as [`HeadRecord::decode`] reads them: version 2 when a profile
    /// has spans (or the tenant is empty, which version 1 cannot tell from the version marker),
    /// else version 1.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let with_spans =
            self.tenant.is_empty() || self.profiles.iter().any(|p| !p.spans.is_empty());
        if with_spans {
            out.push(0);
            put_varint(&mut out, SPANS_VERSION);
        }
        put_str(&mut out, self.tenant);
        put_str(&mut out, &self.marker.agent_id);
        put_varint(&mut out, self.marker.sequence);
        put_varint(
            &mut out,
            self.window_end.map_or(0, |end| end.saturating_add(1)),
        );
        put_varint(&mut out, self.write);
        put_varint(&mut out, self.profiles.len() as u64);
        for HeadProfile {
            bucket,
            profile,
            spans,
        } in self.profiles
        {
            put_varint(&mut out, *bucket);
            put_str(&mut out, profile.series.app());
            put_varint(&mut out, profile.series.labels().len() as u64);
            for (name, value) in profile.series.labels().iter() {
                put_str(&mut out, name);
                put_str(&mut out, value);
            }
            put_str(&mut out, &profile.meta.spy_name);
            put_varint(&mut out, u64::from(profile.meta.sample_rate));
            put_str(&mut out, &profile.meta.units);
            out.push(match profile.meta.aggregation {
                Aggregation::Sum => 0,
                Aggregation::Average => 1,
            });
            let tree = profile.tree.encode();
            put_varint(&mut out, tree.len() as u64);
            out.extend_from_slice(&tree);
            if with_spans {
                put_varint(&mut out, spans.len() as u64);
                for (span, tree) in spans.iter() {
                    out.extend_from_slice(&span.to_bytes());
                    let tree = tree.encode();
                    put_varint(&mut out, tree.len() as u64);
                    out.extend_from_slice(&tree);
                }
            }
        }
        out
    }

    /// The record as a log frames it (a record is mostly its trees' frame names, which repeat
    /// from write to write, so lz4 pays).
    pub fn frame(&self) -> Vec<u8> {
        let payload = lz4_flex::block::compress_prepend_size(&self.encode());
        let mut out = Vec::with_capacity(8 + payload.len());
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> HeadRecord {
        let mut tree = Tree::new();
        tree.insert_names(["main", "work"], 7);
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        HeadRecord {
            tenant: "anonymous".into(),
            marker: Marker {
                agent_id: "host-1".into(),
                sequence: 9,
            },
            window_end: Some(1_700_000_010),
            write: 3,
            profiles: vec![HeadProfile {
                bucket: 1_700_000_000,
                profile: Profile {
                    series: Series::parse("app.cpu{env=prod}").unwrap(),
                    meta: ProfileMeta::default(),
                    from: at,
                    until: at + Duration::from_secs(10),
                    tree,
                },
                spans: SpanTrees::new(),
            }],
        }
    }

    /// [`record`] with two spans on its profile.
    fn record_with_spans() -> HeadRecord {
        let mut record = record();
        let spans = &mut record.profiles[0].spans;
        spans
            .tree_mut("00f067aa0ba902b7".parse().unwrap())
            .insert_names(["main", "work"], 5);
        spans
            .tree_mut("5a561accaab40cf2".parse().unwrap())
            .insert_names(["main", "work"], 2);
        record
    }

    #[test]
    fn records_round_trip_and_refuse_truncation() {
        let record = record();
        let bytes = record.as_ref().encode();
        let back = HeadRecord::decode(&bytes, 10).unwrap();
        assert_eq!(back.as_ref().encode(), bytes);
        assert_eq!(
            (&back.tenant, &back.marker),
            (&record.tenant, &record.marker)
        );
        assert_eq!(
            (back.window_end, back.write),
            (record.window_end, record.write)
        );
        let HeadProfile {
            bucket, profile, ..
        } = &back.profiles[0];
        let original = &record.profiles[0];
        assert_eq!(*bucket, original.bucket);
        assert_eq!(profile.tree, original.profile.tree);
        assert_eq!(profile.series, original.profile.series);
        assert_eq!(
            (profile.from, profile.until),
            (original.profile.from, original.profile.until)
        );
        for len in 0..bytes.len() {
            assert!(
                HeadRecord::decode(&bytes[..len], 10).is_err(),
                "truncated at {len}"
            );
        }
        let frame = record.as_ref().frame();
        let (back, len) = HeadRecord::unframe(&frame, 10, &Limits::default()).unwrap();
        assert_eq!(back.as_ref().frame(), frame);
        assert_eq!(len, frame.len());
        for len in 0..frame.len() {
            assert!(HeadRecord::unframe(&frame[..len], 10, &Limits::default()).is_err());
        }
    }

    #[test]
    fn records_with_spans_are_version_2_and_old_records_still_read() {
        let plain = record().as_ref().encode();
        assert_ne!(plain[0], 0, "without spans, the version 1 layout");
        let record = record_with_spans();
        let bytes = record.as_ref().encode();
        assert_eq!(&bytes[..2], [0, 2]);
        assert_eq!(&bytes[2..plain.len() + 2 - 1], &plain[..plain.len() - 1]);
        let back = HeadRecord::decode(&bytes, 10).unwrap();
        assert_eq!(back.profiles[0].spans, record.profiles[0].spans);
        assert_eq!(back.as_ref().encode(), bytes);
        assert!(
            HeadRecord::decode(&plain, 10).unwrap().profiles[0]
                .spans
                .is_empty()
        );
        for len in 0..bytes.len() {
            assert!(
                HeadRecord::decode(&bytes[..len], 10).is_err(),
                "truncated at {len}"
            );
        }
        let mut newer = bytes.clone();
        newer[1] = 3;
        assert!(
            HeadRecord::decode(&newer, 10)
                .unwrap_err()
                .to_string()
                .contains("record version")
        );
        // An empty tenant cannot be told from the version marker in version 1.
        let mut empty = self::record();
        empty.tenant = String::new();
        let bytes = empty.as_ref().encode();
        assert_eq!(HeadRecord::decode(&bytes, 10).unwrap().tenant, "");
    }

    #[test]
    fn a_frame_claiming_more_than_lz4_can_expand_is_refused_before_allocating() {
        let mut payload = u32::MAX.to_le_bytes().to_vec();
        payload.extend_from_slice(&[0; 16]);
        let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&crc(&payload).to_le_bytes());
        frame.extend_from_slice(&payload);
        let err = HeadRecord::unframe(&frame, 10, &Limits::default()).unwrap_err();
        assert_eq!(
            err,
            BlockError::TooLarge {
                section: SECTION,
                len: u64::from(u32::MAX),
                limit: 16 * LZ4_MAX_RATIO,
            }
        );
        assert!(err.to_string().starts_with("head log record: "), "{err}");
    }

    #[test]
    fn a_flipped_byte_is_a_checksum_error() {
        let mut frame = record().as_ref().frame();
        let last = frame.len() - 1;
        frame[last] ^= 1;
        assert!(matches!(
            HeadRecord::unframe(&frame, 10, &Limits::default()),
            Err(BlockError::Checksum { .. })
        ));
    }

    proptest::proptest! {
        /// Whatever a damaged disk holds, reading a head log never panics, behind the
        /// checksum or in front of it.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = HeadRecord::unframe(&bytes, 10, &Limits::default());
            let _ = HeadRecord::decode(&bytes, 10);
            let mut framed = (bytes.len() as u32).to_le_bytes().to_vec();
            framed.extend_from_slice(&crc(&bytes).to_le_bytes());
            framed.extend_from_slice(&bytes);
            let _ = HeadRecord::unframe(&framed, 10, &Limits::default());
        }

        /// Version 2's span trees on arbitrary bytes: an error or a record that encodes back
        /// to what it reads as, never a panic.
        #[test]
        fn arbitrary_version_2_records_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let mut record = vec![0, 2];
            record.extend_from_slice(&bytes);
            if let Ok(read) = HeadRecord::decode(&record, 10) {
                let again = read.as_ref().encode();
                let back = HeadRecord::decode(&again, 10).expect("an encoded record decodes");
                proptest::prop_assert_eq!(back.as_ref().encode(), again);
            }
        }

        /// A valid record with spans, then every byte of it changed: never a panic.
        #[test]
        fn changed_version_2_records_never_panic(at in 0usize..4096, value in proptest::num::u8::ANY) {
            let mut bytes = record_with_spans().as_ref().encode();
            let at = at % bytes.len();
            bytes[at] = value;
            let _ = HeadRecord::decode(&bytes, 10);
        }
    }
}
