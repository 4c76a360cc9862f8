//! Segments: the durable half of the head in object-storage mode.
//!
//! Input: the records of one group commit (what the local head log would append); output: one
//! object `segments/<unix ms>-<writer>-<n>.seg` in the bucket, written before any of the group's
//! writes is acknowledged, and read back by every aggregator (`sync.rs`). Owned by the writer
//! thread, which builds a [`Pending`] per group and uploads it at its flush.
//!
//! A segment is [`MAGIC`] then records framed as the local head log frames them
//! (`smolder_block::RecordRef::frame`: length, CRC-32, lz4), in write order. An object is
//! written whole or not at all, so unlike a log a segment never ends in a torn frame: any frame
//! that does not decode is damage, and the segment is refused whole ([`decode`]).
//!
//! Keys sort by the writer's clock (milliseconds, 13 digits), so that a listing that starts just
//! before the last poll's time finds what was added since; the writer id and a per-run counter
//! keep two segments of one millisecond apart.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use smolder_block::Marker;

use super::wal::{Record, unframe};
use crate::tenant::Tenant;

/// The first bytes of every segment: "SMOLSEG" and format version 1.
pub(crate) const MAGIC: &[u8; 8] = b"SMOLSEG\x01";

/// Where segments are, under the bucket's prefix.
pub(crate) const PREFIX: &str = "segments/";

/// What a segment is named after: when, by whom, which of that writer's uploads.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct SegmentKey {
    /// Unix milliseconds of the upload, by the writer's clock.
    pub(crate) millis: u64,
    /// The writer's id.
    pub(crate) writer: String,
    /// Its upload number in that run.
    pub(crate) number: u64,
}

impl SegmentKey {
    /// The bucket key.
    pub(crate) fn key(&self) -> String {
        format!(
            "{PREFIX}{:013}-{}-{:010}.seg",
            self.millis, self.writer, self.number
        )
    }

    /// Parses a bucket key; `None` for one that is not a segment's.
    pub(crate) fn parse(key: &str) -> Option<SegmentKey> {
        let stem = key.strip_prefix(PREFIX)?.strip_suffix(".seg")?;
        let mut fields = stem.splitn(3, '-');
        let millis = fields.next()?.parse().ok()?;
        let writer = fields.next()?;
        let number = fields.next()?.parse().ok()?;
        let valid = !writer.is_empty() && writer.bytes().all(|b| b.is_ascii_alphanumeric());
        valid.then(|| SegmentKey {
            millis,
            writer: writer.to_owned(),
            number,
        })
    }

    /// The key a listing starts after to find segments uploaded from `millis` on.
    pub(crate) fn listing_start(millis: u64) -> String {
        format!("{PREFIX}{millis:013}")
    }
}

/// Decodes a segment's bytes into its records, each with its head range.
///
/// # Errors
///
/// What is wrong, for the log: not a segment, or a record that does not decode.
pub(crate) fn decode(bytes: &[u8]) -> Result<Vec<(u64, Record)>, String> {
    let mut at = MAGIC.len();
    if bytes.get(..at) != Some(MAGIC.as_slice()) {
        return Err("not a segment (no SMOLSEG\\x01 at its start)".into());
    }
    let mut records = Vec::new();
    while at < bytes.len() {
        let (record, len) =
            unframe(&bytes[at..]).map_err(|reason| format!("at byte {at}: {reason}"))?;
        let range = record
            .profiles
            .first()
            .map(|profile| super::plan::head_range(profile.bucket))
            .ok_or_else(|| format!("at byte {at}: a record without profiles"))?;
        if record
            .profiles
            .iter()
            .any(|profile| super::plan::head_range(profile.bucket) != range)
        {
            return Err(format!("at byte {at}: a record spanning two head ranges"));
        }
        records.push((range, record));
        at += len;
    }
    Ok(records)
}

/// The segment a group commit is building.
#[derive(Default)]
pub(crate) struct Pending {
    bytes: Vec<u8>,
    /// What each record holds: (tenant, head range, marker).
    held: Vec<Held>,
}

/// One record of a segment, as the segment index keeps it: enough to tell when blocks hold
/// it, or app deletions removed all of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) tenant: Tenant,
    /// Its head range.
    pub(crate) range: u64,
    pub(crate) marker: Marker,
    /// Each app it has profiles of, with the newest bucket of that app.
    pub(crate) apps: Vec<(String, u64)>,
}

impl Held {
    /// What record `record` of head range `range` holds.
    pub(crate) fn of(range: u64, record: &Record) -> Held {
        let mut apps: BTreeMap<&str, u64> = BTreeMap::new();
        for profile in &record.profiles {
            let newest = apps.entry(profile.profile.series.app()).or_insert(0);
            *newest = (*newest).max(profile.bucket);
        }
        Held {
            tenant: record.tenant.clone(),
            range,
            marker: record.marker.clone(),
            apps: apps
                .into_iter()
                .map(|(app, newest)| (app.to_owned(), newest))
                .collect(),
        }
    }
}

impl Pending {
    /// Appends a record of head range `range` framed as `frame`.
    pub(crate) fn push(&mut self, range: u64, record: &Record, frame: &[u8]) {
        if self.bytes.is_empty() {
            self.bytes.extend_from_slice(MAGIC);
        }
        self.bytes.extend_from_slice(frame);
        self.held.push(Held::of(range, record));
    }

    /// The bytes to upload and what they hold.
    pub(crate) fn take(&mut self) -> (Vec<u8>, Vec<Held>) {
        (
            std::mem::take(&mut self.bytes),
            std::mem::take(&mut self.held),
        )
    }
}

/// The segments this aggregator must delete once blocks hold them: its own and those it
/// adopted, with what each record holds.
#[derive(Default)]
pub(crate) struct Owned {
    segments: BTreeMap<String, Vec<Held>>,
}

impl Owned {
    /// Adds segment `key`, holding `held`.
    pub(crate) fn add(&mut self, key: String, held: Vec<Held>) {
        self.segments.entry(key).or_default().extend(held);
    }

    /// Forgets what `covered` says is settled (a block holds it, deletions or retention removed
    /// it); returns the segments left holding nothing, to delete.
    pub(crate) fn settle(&mut self, covered: impl Fn(&Held) -> bool) -> Vec<String> {
        let mut done = Vec::new();
        for (key, held) in &mut self.segments {
            held.retain(|h| !covered(h));
            if held.is_empty() {
                done.push(key.clone());
            }
        }
        for key in &done {
            self.segments.remove(key);
        }
        done
    }

    /// Puts back segment `key`, whose deletion failed, to try again at the next settle.
    pub(crate) fn retry(&mut self, key: String) {
        self.segments.entry(key).or_default();
    }

    /// Their keys.
    pub(crate) fn keys(&self) -> Vec<String> {
        self.segments.keys().cloned().collect()
    }

    /// Segments still waiting for blocks.
    pub(crate) fn len(&self) -> usize {
        self.segments.len()
    }
}

/// How long after a failed upload a segment may still land: past it, a full listing that does
/// not show the segment settles that it never will. A PUT given up at `upload-timeout` may be
/// committed by the store after the client left; stores commit within seconds of the body's
/// end, so this is generous.
pub(crate) const LATE_LANDING: Duration = Duration::from_secs(30);

/// This writer's segments whose upload failed, which may be in the bucket all the same: their
/// writes were refused, but the store may have committed the PUT after the client gave up.
/// Until settled, the sync loop reads them like another writer's segments; one found in the
/// bucket is taken into the own head (as an adopted segment is), so that every aggregator shows
/// it and a cut settles it; one that a full listing [`LATE_LANDING`] after the failure does not
/// show is forgotten.
#[derive(Default)]
pub(crate) struct Doubtful {
    segments: BTreeMap<String, Instant>,
}

impl Doubtful {
    /// Notes segment `key`, whose upload failed now.
    pub(crate) fn add(&mut self, key: String) {
        self.segments.insert(key, Instant::now());
    }

    /// Whether segment `key` is in doubt.
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.segments.contains_key(key)
    }

    /// Settles `key`, found in the bucket and read.
    pub(crate) fn remove(&mut self, key: &str) {
        self.segments.remove(key);
    }

    /// Forgets the segments that a full listing started at `listed_at` does not show although
    /// [`LATE_LANDING`] had passed since their failure; returns how many.
    pub(crate) fn forget_absent(&mut self, listed: &BTreeSet<String>, listed_at: Instant) -> usize {
        let before = self.segments.len();
        self.segments.retain(|key, failed| {
            listed.contains(key) || listed_at.saturating_duration_since(*failed) < LATE_LANDING
        });
        before - self.segments.len()
    }

    /// Segments in doubt.
    pub(crate) fn len(&self) -> usize {
        self.segments.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use smolder_block::HeadProfile;
    use smolder_common::{Profile, ProfileMeta, Series, SpanTrees, Tree};

    use super::*;

    #[test]
    fn a_doubtful_segment_is_forgotten_only_when_a_late_listing_misses_it() {
        let mut doubtful = Doubtful::default();
        doubtful.add("a".into());
        doubtful.add("b".into());
        let listed: BTreeSet<String> = ["b".to_owned()].into();
        // A listing right after the failure proves nothing: the PUT may land yet.
        assert_eq!(doubtful.forget_absent(&listed, Instant::now()), 0);
        let late = Instant::now() + LATE_LANDING;
        assert_eq!(doubtful.forget_absent(&listed, late), 1);
        assert!(!doubtful.contains("a"));
        // Listed: it landed, and stays in doubt until the sync loop reads it.
        assert!(doubtful.contains("b"));
        doubtful.remove("b");
        assert_eq!(doubtful.len(), 0);
    }

    fn record(sequence: u64, bucket: u64) -> Record {
        let mut tree = Tree::new();
        tree.insert_names(["main", "work"], sequence + 1);
        let from = UNIX_EPOCH + Duration::from_secs(bucket);
        Record {
            tenant: Tenant::new("anonymous").unwrap(),
            marker: Marker {
                agent_id: "agent".into(),
                sequence,
            },
            window_end: Some(bucket + 10),
            write: sequence,
            profiles: vec![HeadProfile {
                bucket,
                profile: Profile {
                    series: Series::parse("app.cpu{host=a}").unwrap(),
                    meta: ProfileMeta::default(),
                    from,
                    until: from + Duration::from_secs(10),
                    tree,
                },
                spans: SpanTrees::default(),
            }],
        }
    }

    #[test]
    fn segments_round_trip_and_refuse_damage() {
        let mut pending = Pending::default();
        for (sequence, bucket) in [(1, 1_000), (2, 1_990), (3, 2_000)] {
            let record = record(sequence, bucket);
            let range = super::super::plan::head_range(bucket);
            pending.push(range, &record, &record.frame());
        }
        let (bytes, held) = pending.take();
        assert!(pending.take().1.is_empty());
        assert_eq!(
            held.iter()
                .map(|h| (h.range, h.marker.sequence))
                .collect::<Vec<_>>(),
            [(1_000, 1), (1_000, 2), (2_000, 3)]
        );
        assert_eq!(held[1].apps, [("app.cpu".to_owned(), 1_990)]);
        let back = decode(&bytes).unwrap();
        assert_eq!(
            back.iter()
                .map(|(range, r)| (
                    *range,
                    r.marker.sequence,
                    r.profiles[0].profile.tree.total()
                ))
                .collect::<Vec<_>>(),
            [(1_000, 1, 2), (1_000, 2, 3), (2_000, 3, 4)]
        );
        assert!(decode(b"").unwrap_err().contains("not a segment"));
        assert!(
            decode(&bytes[..bytes.len() - 1])
                .unwrap_err()
                .contains("at byte")
        );
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(decode(&flipped).is_err());
        assert_eq!(decode(MAGIC).unwrap().len(), 0);
    }

    #[test]
    fn keys_sort_by_time_and_parse_back() {
        let key = SegmentKey {
            millis: 1_700_000_000_123,
            writer: "00ff".into(),
            number: 7,
        };
        assert_eq!(key.key(), "segments/1700000000123-00ff-0000000007.seg");
        assert_eq!(SegmentKey::parse(&key.key()), Some(key.clone()));
        assert!(SegmentKey::listing_start(1_700_000_000_000) < key.key());
        assert!(SegmentKey::listing_start(1_700_000_000_124) > key.key());
        for bad in [
            "segments/x-00ff-1.seg",
            "segments/1-00ff-1.block",
            "blocks/1-00ff-1.seg",
            "segments/1--1.seg",
            "segments/1-0/f-1.seg",
        ] {
            assert_eq!(SegmentKey::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn owned_segments_go_once_every_record_is_in_a_block() {
        let tenant = Tenant::new("anonymous").unwrap();
        let held = |sequence| Held {
            tenant: tenant.clone(),
            range: 1_000,
            marker: Marker {
                agent_id: "agent".into(),
                sequence,
            },
            apps: vec![("app.cpu".into(), 1_000)],
        };
        let mut owned = Owned::default();
        owned.add("a".into(), vec![held(1), held(2)]);
        owned.add("b".into(), vec![held(3)]);
        assert_eq!(
            owned.settle(|h| h.marker.sequence == 1),
            Vec::<String>::new()
        );
        assert_eq!(owned.settle(|h| h.marker.sequence <= 2), ["a"]);
        assert_eq!(owned.len(), 1);
        owned.retry("a".into());
        assert_eq!(owned.settle(|_| false), ["a"]);
        assert_eq!(owned.settle(|_| true), ["b"]);
        assert_eq!(owned.len(), 0);
    }
}
