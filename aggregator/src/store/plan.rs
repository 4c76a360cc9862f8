//! The store's planning, as pure functions: which buckets a write touches, which rollups it
//! marks dirty, which buckets cover a read, which rollups are due to be rebuilt, what
//! retention deletes, and how a timeline's points map to buckets.
//!
//! Input: times in Unix seconds, profiles, the store's config. Output: plans that a backend
//! carries out against its own storage. No I/O, clock or sled: the sled backend
//! (`sled/writer.rs`, `sled/read.rs`) and a block store (issue 17) share these decisions, and
//! the tests below check them without a disk.
//!
//! Time is cut into **buckets** of [`BUCKET`] seconds; every level of [`LEVELS`] holds buckets
//! ten times the size of the level below (Pyroscope's segment levels), and a bucket above the
//! first is a **rollup**: the merge of its ten children, rebuilt once it has closed.

use std::collections::{BTreeMap, BTreeSet};

use smolder_common::Profile;

use super::unix;

/// Bucket sizes in seconds, finest first: 10 s, and rollups of 10^k of them. A range is read as
/// the fewest whole buckets that cover it ([`cover`]), so a query of any span reads at most nine
/// buckets per level at each edge plus one per 10 000 s in between: 24 h is at most 62 trees per
/// series.
pub(crate) const LEVELS: [u64; 4] = [10, 100, 1_000, 10_000];

/// The finest bucket, in seconds.
pub(crate) const BUCKET: u64 = LEVELS[0];

/// How long after a rollup's bucket ends it is rebuilt: late profiles (an agent's window that
/// arrives after a reconnect) usually land within this, so most rollups are built once.
pub(crate) const ROLLUP_GRACE: u64 = 60;

/// The 10 s bucket of a profile spanning `[from, until)`: the one holding the middle of its
/// span, so that a profile taken over `[10:00:05, 10:00:15)` is not counted as older than it
/// mostly is.
pub(crate) fn bucket_of(from: u64, until: u64) -> u64 {
    let middle = from + until.saturating_sub(from) / 2;
    middle / BUCKET * BUCKET
}

/// `step` made a whole number of 10 s buckets, at least one.
pub(crate) fn whole_buckets(step: u64) -> u64 {
    step.max(BUCKET).div_ceil(BUCKET) * BUCKET
}

/// `[from, until)` widened to whole buckets of `resolution` (rounded to whole 10 s buckets):
/// the start rounded down, the end rounded up, so that every bucket the range touches is read.
pub(crate) fn align(from: u64, until: u64, resolution: u64) -> (u64, u64) {
    let resolution = whole_buckets(resolution);
    let from = from / resolution * resolution;
    let until = until.div_ceil(resolution).saturating_mul(resolution);
    (from, until.max(from))
}

/// The bucket of each level that contains the 10 s bucket starting at `bucket`, finest first,
/// as (level, start). Level 0 is the bucket itself.
pub(crate) fn containing(bucket: u64) -> impl Iterator<Item = (usize, u64)> {
    LEVELS
        .iter()
        .enumerate()
        .map(move |(level, size)| (level, bucket / size * size))
}

/// The ten children, one level down, of the rollup at (`level`, `start`), as (level, start).
///
/// # Panics
///
/// When `level` is 0: a 10 s bucket has no children.
pub(crate) fn children(level: usize, start: u64) -> impl Iterator<Item = (usize, u64)> {
    assert!(level > 0, "a 10 s bucket has no children");
    let child = LEVELS[level - 1];
    (start..start + LEVELS[level])
        .step_by(child as usize)
        .map(move |child_start| (level - 1, child_start))
}

/// The fewest whole buckets that cover `[from, until)` (both multiples of 10 s): at each point
/// the largest level whose bucket starts there and ends inside the range. Lazy, so that its
/// memory does not grow with the range.
pub(crate) fn cover(from: u64, until: u64) -> impl Iterator<Item = (usize, u64)> {
    let mut at = from;
    std::iter::from_fn(move || {
        if at >= until {
            return None;
        }
        let level = LEVELS
            .iter()
            .rposition(|&size| at.is_multiple_of(size) && at + size <= until)
            .unwrap_or(0);
        let bucket = (level, at);
        at += LEVELS[level];
        Some(bucket)
    })
}

/// Whether the dirty rollup at (`level`, `start`) is due to be rebuilt as of `now` (Unix
/// seconds): its bucket ended at least [`ROLLUP_GRACE`] ago. Rebuilding goes finest level first,
/// so that each level reads children that are up to date.
pub(crate) fn rollup_due(level: usize, start: u64, now: u64) -> bool {
    start + LEVELS[level] <= now.saturating_sub(ROLLUP_GRACE)
}

/// What one write request changes, per series, before anything is read: the plan a backend
/// applies by adding these deltas to what it has stored.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct WritePlan {
    /// Each series the request writes, in the order the request first names it (the order new
    /// series get their ids in).
    pub(crate) series: Vec<SeriesWrite>,
}

/// One series' part of a [`WritePlan`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SeriesWrite {
    /// The normalized series key (`app{k=v}`).
    pub(crate) key: String,
    /// Its profiles, as indices into the request, in request order, each with its 10 s bucket:
    /// the metadata of the last one wins, as Pyroscope keeps the last.
    pub(crate) profiles: Vec<(usize, u64)>,
    /// The 10 s buckets whose trees change, each with the profiles merged into it.
    pub(crate) trees: BTreeMap<u64, Vec<usize>>,
    /// What each bucket of every level gains, keyed by (level, start): the sum of the profiles'
    /// totals and the number of profiles (writes).
    pub(crate) totals: BTreeMap<(usize, u64), (u64, u64)>,
    /// The rollups (levels above 0) the write marks dirty, to be rebuilt once closed.
    pub(crate) dirty: BTreeSet<(usize, u64)>,
}

impl WritePlan {
    /// Plans the write of `profiles`, one request's, applied all or nothing.
    pub(crate) fn new(profiles: &[Profile]) -> WritePlan {
        let mut index: BTreeMap<String, usize> = BTreeMap::new();
        let mut plan = WritePlan::default();
        for (i, profile) in profiles.iter().enumerate() {
            let bucket = bucket_of(unix(profile.from), unix(profile.until));
            let key = profile.series.to_string();
            let slot = *index.entry(key.clone()).or_insert_with(|| {
                plan.series.push(SeriesWrite {
                    key,
                    profiles: Vec::new(),
                    trees: BTreeMap::new(),
                    totals: BTreeMap::new(),
                    dirty: BTreeSet::new(),
                });
                plan.series.len() - 1
            });
            let write = &mut plan.series[slot];
            write.profiles.push((i, bucket));
            write.trees.entry(bucket).or_default().push(i);
            let total = profile.tree.total();
            for (level, start) in containing(bucket) {
                let entry = write.totals.entry((level, start)).or_default();
                entry.0 = entry.0.saturating_add(total);
                entry.1 += 1;
                if level > 0 {
                    write.dirty.insert((level, start));
                }
            }
        }
        plan
    }
}

/// The time before which retention deletes data, as of `now` (Unix seconds): `retention` ago,
/// or, when the store is over its size limit, at least the end of the coarsest bucket holding
/// the oldest data (`oldest`, the earliest first-seen of any series), so that every pass past
/// the limit deletes one 10 000 s bucket more.
pub(crate) fn retention_cutoff(
    now: u64,
    retention: u64,
    over_size: bool,
    oldest: Option<u64>,
) -> u64 {
    let by_age = now.saturating_sub(retention);
    if !over_size {
        return by_age;
    }
    let coarsest = LEVELS[LEVELS.len() - 1];
    let oldest = oldest.unwrap_or(by_age);
    by_age.max((oldest / coarsest + 1) * coarsest)
}

/// What retention does to one series, given its first and last 10 s buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SeriesRetention {
    /// All its data is before the cutoff: the series goes, with everything about it.
    Delete,
    /// Some of it is: delete its buckets that [`bucket_expired`], and its data now starts at
    /// `first_seen`.
    Trim {
        /// The new first bucket.
        first_seen: u64,
    },
    /// None of it is.
    Keep,
}

/// Plans retention of a series whose data spans the 10 s buckets `first_seen..=last_seen`.
pub(crate) fn series_retention(first_seen: u64, last_seen: u64, cutoff: u64) -> SeriesRetention {
    if last_seen + BUCKET <= cutoff {
        SeriesRetention::Delete
    } else if first_seen < cutoff {
        SeriesRetention::Trim {
            first_seen: cutoff / BUCKET * BUCKET,
        }
    } else {
        SeriesRetention::Keep
    }
}

/// Whether the bucket of `level` starting at `start` ends by the cutoff, and retention deletes
/// it.
pub(crate) fn bucket_expired(level: usize, start: u64, cutoff: u64) -> bool {
    start + LEVELS[level] <= cutoff
}

/// How a timeline over a range is read: its points, and which level's bucket totals feed them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TimelinePlan {
    /// Unix seconds of the first point.
    pub(crate) start: u64,
    /// Seconds per point, a whole number of 10 s buckets.
    pub(crate) step: u64,
    /// How many points.
    pub(crate) points: usize,
    /// The coarsest level whose buckets divide the step and the start.
    pub(crate) level: usize,
    /// The end of the range, exclusive: buckets from here on are not read.
    pub(crate) until: u64,
}

impl TimelinePlan {
    /// Plans a timeline of `[from, until)` in steps of `step` seconds (rounded up to whole
    /// 10 s buckets); the range is widened to whole 10 s buckets.
    pub(crate) fn new(from: u64, until: u64, step: u64) -> TimelinePlan {
        let step = whole_buckets(step);
        let (from, until) = align(from, until, BUCKET);
        let start = from / step * step;
        let points = until.saturating_sub(start).div_ceil(step).max(1);
        let level = LEVELS
            .iter()
            .rposition(|&size| step.is_multiple_of(size) && start.is_multiple_of(size))
            .unwrap_or(0);
        TimelinePlan {
            start,
            step,
            points: usize::try_from(points).unwrap_or(usize::MAX),
            level,
            until,
        }
    }

    /// The point a bucket of [`TimelinePlan::level`] starting at `bucket` adds to, if any.
    pub(crate) fn slot(&self, bucket: u64) -> Option<usize> {
        let slot = usize::try_from(bucket.checked_sub(self.start)? / self.step).ok()?;
        (slot < self.points).then_some(slot)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use smolder_common::{ProfileMeta, Series, Tree};

    use super::*;

    fn profile(series: &str, from: u64, until: u64, value: u64) -> Profile {
        let mut tree = Tree::new();
        tree.insert_names(["main"], value);
        Profile {
            series: Series::parse(series).unwrap(),
            meta: ProfileMeta::default(),
            from: UNIX_EPOCH + Duration::from_secs(from),
            until: UNIX_EPOCH + Duration::from_secs(until),
            tree,
        }
    }

    #[test]
    fn a_profile_lands_in_the_bucket_of_its_middle() {
        assert_eq!(bucket_of(36_005, 36_015), 36_010);
        assert_eq!(bucket_of(36_000, 36_010), 36_000);
        assert_eq!(bucket_of(36_000, 36_000), 36_000);
        assert_eq!(bucket_of(36_009, 36_000), 36_000, "until before from");
    }

    #[test]
    fn ranges_widen_to_whole_buckets_of_the_resolution() {
        assert_eq!(align(1_005, 1_021, 10), (1_000, 1_030));
        assert_eq!(align(1_005, 1_021, 100), (1_000, 1_100));
        assert_eq!(align(1_000, 1_000, 10), (1_000, 1_000));
        assert_eq!(align(1_005, 1_021, 0), (1_000, 1_030), "at least 10 s");
        assert_eq!(
            align(1_005, 1_021, 15),
            (1_000, 1_040),
            "whole 10 s buckets"
        );
        assert_eq!(align(0, u64::MAX, 10).0, 0, "no overflow");
    }

    #[test]
    fn a_bucket_is_contained_once_per_level() {
        assert_eq!(
            containing(123_450).collect::<Vec<_>>(),
            [(0, 123_450), (1, 123_400), (2, 123_000), (3, 120_000)]
        );
    }

    #[test]
    fn a_rollup_has_ten_children_one_level_down() {
        assert_eq!(
            children(2, 3_000).collect::<Vec<_>>(),
            (0..10).map(|i| (1, 3_000 + i * 100)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn cover_uses_the_coarsest_buckets_that_fit() {
        assert_eq!(cover(0, 10).collect::<Vec<_>>(), [(0, 0)]);
        assert_eq!(cover(0, 100).collect::<Vec<_>>(), [(1, 0)]);
        assert_eq!(
            cover(90, 210).collect::<Vec<_>>(),
            [(0, 90), (1, 100), (0, 200)]
        );
        assert_eq!(cover(50, 50).count(), 0);
        let day: Vec<_> = cover(1_700_000_000 / 10 * 10, 1_700_086_400 / 10 * 10).collect();
        assert!(day.len() <= 62, "{} buckets for a day", day.len());
        let covered: u64 = day.iter().map(|&(level, _)| LEVELS[level]).sum();
        assert_eq!(covered, 86_400);
    }

    #[test]
    fn rollups_are_due_a_grace_period_after_they_close() {
        // The 100 s rollup [1000, 1100) closes at 1100 and is due from 1160.
        assert!(!rollup_due(1, 1_000, 1_159));
        assert!(rollup_due(1, 1_000, 1_160));
        assert!(!rollup_due(3, 0, 10_059));
        assert!(rollup_due(3, 0, 10_060));
        assert!(!rollup_due(1, 0, 0), "no underflow");
    }

    #[test]
    fn a_write_plan_groups_by_series_and_bucket() {
        let profiles = [
            profile("app.cpu{env=prod}", 100_000, 100_010, 2),
            profile("app.cpu{env=dev}", 100_000, 100_010, 5),
            profile("app.cpu{env=prod}", 100_002, 100_008, 3),
            profile("app.cpu{env=prod}", 100_095, 100_105, 7),
        ];
        let plan = WritePlan::new(&profiles);
        let keys: Vec<_> = plan.series.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(
            keys,
            ["app.cpu{env=prod}", "app.cpu{env=dev}"],
            "first-named order"
        );
        let prod = &plan.series[0];
        assert_eq!(
            prod.profiles,
            [(0, 100_000), (2, 100_000), (3, 100_100)],
            "request order, each with its bucket"
        );
        assert_eq!(
            prod.trees,
            BTreeMap::from([(100_000, vec![0, 2]), (100_100, vec![3])])
        );
        assert_eq!(prod.totals[&(0, 100_000)], (5, 2));
        assert_eq!(prod.totals[&(1, 100_000)], (5, 2));
        assert_eq!(prod.totals[&(1, 100_100)], (7, 1));
        assert_eq!(prod.totals[&(2, 100_000)], (12, 3));
        assert_eq!(prod.totals[&(3, 100_000)], (12, 3));
        assert_eq!(
            prod.dirty,
            BTreeSet::from([(1, 100_000), (1, 100_100), (2, 100_000), (3, 100_000)]),
            "every rollup above a written bucket, never a 10 s bucket"
        );
        assert_eq!(plan.series[1].totals[&(3, 100_000)], (5, 1));
        assert_eq!(WritePlan::new(&[]), WritePlan::default());
    }

    #[test]
    fn retention_cuts_by_age_and_past_the_size_limit_by_the_oldest_rollup() {
        let day = 86_400;
        assert_eq!(retention_cutoff(10 * day, day, false, Some(0)), 9 * day);
        // Over the size limit: the oldest data (at 5) goes with its whole 10 000 s bucket.
        assert_eq!(retention_cutoff(20_000, 19_000, true, Some(5)), 10_000);
        assert_eq!(retention_cutoff(20_000, 19_000, true, Some(10_000)), 20_000);
        // Unless age alone cuts further.
        assert_eq!(retention_cutoff(10 * day, day, true, Some(5)), 9 * day);
        assert_eq!(retention_cutoff(100, day, false, None), 0, "no underflow");
        assert_eq!(retention_cutoff(100, day, true, None), 10_000);
    }

    #[test]
    fn retention_deletes_trims_or_keeps_a_series() {
        assert_eq!(series_retention(100, 990, 1_000), SeriesRetention::Delete);
        assert_eq!(
            series_retention(100, 1_000, 1_005),
            SeriesRetention::Trim { first_seen: 1_000 }
        );
        assert_eq!(series_retention(1_000, 2_000, 1_000), SeriesRetention::Keep);
        assert!(bucket_expired(0, 990, 1_000));
        assert!(!bucket_expired(0, 1_000, 1_000));
        assert!(bucket_expired(1, 900, 1_000));
        assert!(!bucket_expired(2, 0, 999));
    }

    #[test]
    fn timelines_read_the_coarsest_level_that_divides_the_step() {
        let plan = TimelinePlan::new(1_000_005, 1_003_600, 10);
        assert_eq!(plan.start, 1_000_000);
        assert_eq!((plan.step, plan.level), (10, 0));
        assert_eq!(plan.points, 360);
        assert_eq!(plan.slot(1_000_000), Some(0));
        assert_eq!(plan.slot(1_003_590), Some(359));
        assert_eq!(plan.slot(1_003_600), None);
        assert_eq!(plan.slot(999_990), None);

        let plan = TimelinePlan::new(1_000_000, 1_000_000 + 86_400, 1_000);
        assert_eq!((plan.step, plan.level), (1_000, 2));
        assert_eq!(plan.points, 87);
        // A start that is not a multiple of 1000 s reads 100 s totals.
        let plan = TimelinePlan::new(1_000_100, 1_010_100, 100);
        assert_eq!(plan.level, 1);
        // Steps are whole 10 s buckets; an empty range still has one point.
        let plan = TimelinePlan::new(50, 50, 15);
        assert_eq!((plan.step, plan.points), (20, 1));
    }
}
