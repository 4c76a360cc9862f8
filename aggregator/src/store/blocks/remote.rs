//! The remote head: the records of other writers' segments (object-storage mode), held in
//! memory beside the own head and read with it until a block holds them.
//!
//! Input: segments the sync loop read (`sync.rs`), applied by the writer thread; output: a
//! [`Head`] that reads use beside the own one, the markers it holds (so that a batch stored by
//! another aggregator is answered `Duplicate` here), and the segments of a writer that this
//! aggregator adopts. Owned by the store's state lock.
//!
//! Every (tenant, marker) is held once: a record whose marker is held already, here, in the own
//! head or in a block of its range, is left out (rules 2 and 3 of ARCHITECTURE.md's "Exactly
//! once across aggregators"), and records a new block holds leave.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use smolder_block::Marker;

use super::deletions::Deletions;
use super::head::Head;
use super::segment::{Held, SegmentKey};
use super::wal::Record;
use crate::tenant::Tenant;

/// Other writers' records. See the [module documentation](self).
#[derive(Default)]
pub(crate) struct Remote {
    /// `store.max-spans-per-bucket`, applied to other writers' records as to the own: their
    /// spans past it were counted as dropped by the writer that accepted them.
    max_spans: usize,
    segments: BTreeMap<String, RemoteSegment>,
    /// Their records, for reads.
    pub(crate) head: Head,
    /// The (tenant, marker) of every record in `head`.
    markers: HashSet<(Tenant, Marker)>,
}

struct RemoteSegment {
    writer: String,
    records: Vec<(u64, Record)>,
}

/// A segment taken out for its adoption: its key, its records, what they hold.
pub(crate) type Taken = (String, Vec<(u64, Record)>, Vec<Held>);

/// What [`Remote::add`] did with a segment's records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Added {
    /// Records added to the remote head.
    pub(crate) records: usize,
    /// Records left out: their marker is held already (another segment, the own head).
    pub(crate) duplicates: usize,
    /// Records left out: a block holds them.
    pub(crate) in_blocks: usize,
}

impl Remote {
    /// An empty remote head keeping at most `max_spans` span trees per series and bucket.
    pub(crate) fn new(max_spans: usize) -> Remote {
        Remote {
            max_spans,
            ..Remote::default()
        }
    }

    /// Adds the records of segment `key` (of another writer), leaving out each whose (tenant,
    /// marker) `held` says is held elsewhere (`Some(true)`: in a block; `Some(false)`: in the own
    /// head) or this head holds already, and the profiles `deletions` remove (a record they
    /// remove whole is kept without profiles, its marker held).
    pub(crate) fn add(
        &mut self,
        key: &SegmentKey,
        records: Vec<(u64, Record)>,
        deletions: &Deletions,
        held: impl Fn(&Tenant, u64, &Marker) -> Option<bool>,
    ) -> Added {
        let mut added = Added::default();
        let mut kept = Vec::with_capacity(records.len());
        // One write's records of several head ranges share a marker: a marker is a duplicate
        // only when another segment brought it.
        let mut brought: HashSet<(Tenant, Marker)> = HashSet::new();
        for (range, mut record) in records {
            deletions.filter(&mut record);
            let id = (record.tenant.clone(), record.marker.clone());
            match held(&record.tenant, range, &record.marker) {
                Some(true) => added.in_blocks += 1,
                Some(false) => added.duplicates += 1,
                None if self.markers.contains(&id) && !brought.contains(&id) => {
                    added.duplicates += 1;
                }
                None => {
                    self.head.add(range, &record, self.max_spans);
                    self.markers.insert(id.clone());
                    brought.insert(id);
                    kept.push((range, record));
                    added.records += 1;
                }
            }
        }
        self.segments.insert(
            key.key(),
            RemoteSegment {
                writer: key.writer.clone(),
                records: kept,
            },
        );
        added
    }

    /// Drops the profiles of `app` of `tenant` in buckets before `horizon` (an app deletion);
    /// returns the series that lost data.
    pub(crate) fn delete(
        &mut self,
        tenant: &Tenant,
        app: &str,
        horizon: u64,
    ) -> BTreeSet<smolder_common::Series> {
        let deleted = self.head.deletable(tenant, app, horizon);
        if !deleted.is_empty() {
            for segment in self.segments.values_mut() {
                for (_, record) in &mut segment.records {
                    if record.tenant == *tenant {
                        record
                            .profiles
                            .retain(|p| p.profile.series.app() != app || p.bucket >= horizon);
                    }
                }
            }
            self.rebuild();
        }
        deleted
    }

    /// Whether a record of `tenant` with `marker` is held.
    pub(crate) fn holds(&self, tenant: &Tenant, marker: &Marker) -> bool {
        self.markers.contains(&(tenant.clone(), marker.clone()))
    }

    /// Drops every record `covered` says a block holds (given its tenant, head range and
    /// marker), and rebuilds the head if any went; returns how many.
    pub(crate) fn forget(&mut self, covered: &impl Fn(&Tenant, u64, &Marker) -> bool) -> usize {
        let mut dropped = 0;
        for segment in self.segments.values_mut() {
            let before = segment.records.len();
            segment
                .records
                .retain(|(range, r)| !covered(&r.tenant, *range, &r.marker));
            dropped += before - segment.records.len();
        }
        if dropped > 0 {
            self.rebuild();
        }
        dropped
    }

    /// Takes the segments of the writers `writers` out (their adoption): each key with its
    /// records and what they hold.
    pub(crate) fn take(&mut self, writers: &BTreeSet<String>) -> Vec<Taken> {
        let keys: Vec<String> = self
            .segments
            .iter()
            .filter(|(_, s)| writers.contains(&s.writer))
            .map(|(key, _)| key.clone())
            .collect();
        let mut taken = Vec::with_capacity(keys.len());
        for key in keys {
            let segment = self.segments.remove(&key).expect("listed above");
            let held = segment
                .records
                .iter()
                .map(|(range, r)| Held::of(*range, r))
                .collect();
            taken.push((key, segment.records, held));
        }
        if !taken.is_empty() {
            self.rebuild();
        }
        taken
    }

    /// Forgets the segments no listing shows any more (deleted by their writer or adopter once
    /// blocks held them, or app deletions removed them: their records left with those blocks,
    /// or hold nothing); returns how many.
    pub(crate) fn retain_listed(&mut self, listed: &BTreeSet<String>) -> usize {
        let before = self.segments.len();
        self.segments.retain(|key, segment| {
            listed.contains(key) || segment.records.iter().any(|(_, r)| !r.profiles.is_empty())
        });
        before - self.segments.len()
    }

    /// Writers with segments here, with the upload time of their newest (from its key).
    pub(crate) fn writers(&self) -> BTreeMap<String, u64> {
        let mut writers = BTreeMap::new();
        for key in self.segments.keys() {
            if let Some(key) = SegmentKey::parse(key) {
                let newest = writers.entry(key.writer).or_insert(0);
                *newest = (*newest).max(key.millis);
            }
        }
        writers
    }

    /// Segments held and their records.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let records = self.segments.values().map(|s| s.records.len()).sum();
        (self.segments.len(), records)
    }

    fn rebuild(&mut self) {
        self.head = Head::default();
        self.markers.clear();
        for segment in self.segments.values() {
            for (range, record) in &segment.records {
                self.head.add(*range, record, self.max_spans);
                self.markers
                    .insert((record.tenant.clone(), record.marker.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use smolder_block::HeadProfile;
    use smolder_common::{Profile, ProfileMeta, Series, SpanTrees, Tree};

    use super::*;

    fn record(agent: &str, sequence: u64, bucket: u64) -> (u64, Record) {
        let mut tree = Tree::new();
        tree.insert_names(["main", "work"], 1);
        let from = UNIX_EPOCH + Duration::from_secs(bucket);
        let record = Record {
            tenant: Tenant::new("anonymous").unwrap(),
            marker: Marker {
                agent_id: agent.into(),
                sequence,
            },
            window_end: Some(bucket + 10),
            write: sequence,
            profiles: vec![HeadProfile {
                bucket,
                profile: Profile {
                    series: Series::parse("app.cpu").unwrap(),
                    meta: ProfileMeta::default(),
                    from,
                    until: from + Duration::from_secs(10),
                    tree,
                },
                spans: SpanTrees::default(),
            }],
        };
        (bucket / 1000 * 1000, record)
    }

    fn key(writer: &str, number: u64) -> SegmentKey {
        SegmentKey {
            millis: 1_000 + number,
            writer: writer.into(),
            number,
        }
    }

    fn total(remote: &Remote) -> u64 {
        let tenant = Tenant::new("anonymous").unwrap();
        remote
            .head
            .ranges_of(&tenant, 1_000, 0, u64::MAX)
            .flat_map(|range| {
                range
                    .series
                    .values()
                    .filter_map(|s| range.sum(s, 0, u64::MAX))
                    .map(|(tree, _)| tree.total())
                    .collect::<Vec<_>>()
            })
            .sum()
    }

    #[test]
    fn each_marker_counts_once_until_a_block_holds_it() {
        let mut remote = Remote::default();
        let nowhere = |_: &Tenant, _: u64, _: &Marker| None;
        let none = Deletions::default();
        let added = remote.add(
            &key("b", 1),
            vec![record("agent", 1, 1_000), record("agent", 2, 1_010)],
            &none,
            nowhere,
        );
        assert_eq!(added.records, 2);
        // Another writer accepted batch 2 as well (the race), and batch 3, which the own head
        // has, and batch 4, which a block holds.
        let added = remote.add(
            &key("c", 1),
            vec![
                record("agent", 2, 1_010),
                record("agent", 3, 1_020),
                record("agent", 4, 1_030),
            ],
            &none,
            |_, _, marker| match marker.sequence {
                3 => Some(false),
                4 => Some(true),
                _ => None,
            },
        );
        assert_eq!(
            added,
            Added {
                records: 0,
                duplicates: 2,
                in_blocks: 1
            }
        );
        assert_eq!(total(&remote), 2);
        let tenant = Tenant::new("anonymous").unwrap();
        let two = Marker {
            agent_id: "agent".into(),
            sequence: 2,
        };
        assert!(remote.holds(&tenant, &two));
        assert_eq!(
            remote.forget(&|_, _, marker: &Marker| marker.sequence == 1),
            1
        );
        assert_eq!(total(&remote), 1);
        assert_eq!(remote.counts(), (2, 1));
        assert_eq!(
            remote.writers(),
            BTreeMap::from([("b".into(), 1_001), ("c".into(), 1_001)])
        );
        let taken = remote.take(&BTreeSet::from(["b".to_owned()]));
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].2, [Held::of(1_000, &record("agent", 2, 1_010).1)]);
        assert_eq!(total(&remote), 0);
        assert!(!remote.holds(&tenant, &two));
        // Segment c holds nothing and is gone from the bucket: forgotten.
        assert_eq!(remote.retain_listed(&BTreeSet::new()), 1);
        assert_eq!(remote.counts(), (0, 0));
    }

    #[test]
    fn one_write_over_two_head_ranges_is_not_its_own_duplicate() {
        let mut remote = Remote::default();
        let (first, mut second) = (record("agent", 1, 1_990), record("agent", 1, 2_000));
        second.1.marker = first.1.marker.clone();
        let added = remote.add(
            &key("b", 1),
            vec![first, second],
            &Deletions::default(),
            |_, _, _| None,
        );
        assert_eq!(added.records, 2);
        assert_eq!(total(&remote), 2);
    }

    #[test]
    fn a_deletion_drops_the_older_profiles_and_keeps_every_marker_held() {
        let mut remote = Remote::default();
        let tenant = Tenant::new("anonymous").unwrap();
        let mut deletions = Deletions::default();
        deletions.learn(&tenant, "app.cpu", 1_010);
        // Batch 1 (bucket 1 000) arrives after the deletion: dropped, its marker still held.
        let added = remote.add(
            &key("b", 1),
            vec![record("agent", 1, 1_000), record("agent", 2, 1_010)],
            &deletions,
            |_, _, _| None,
        );
        assert_eq!(added.records, 2);
        assert_eq!(total(&remote), 1);
        let one = Marker {
            agent_id: "agent".into(),
            sequence: 1,
        };
        assert!(remote.holds(&tenant, &one));
        // A later deletion, learnt now, takes batch 2 too.
        let deleted = remote.delete(&tenant, "app.cpu", 1_020);
        assert_eq!(deleted.len(), 1);
        assert_eq!(total(&remote), 0);
        assert!(remote.delete(&tenant, "app.cpu", 1_020).is_empty());
        // Gone from the bucket (its writer found nothing left to cut): forgotten.
        assert_eq!(remote.retain_listed(&BTreeSet::new()), 1);
        assert_eq!(remote.counts(), (0, 0));
    }
}
