//! The store's planning, as pure functions: which bucket a profile lands in, which head range
//! it belongs to and when that range is cut into a block, which blocks compaction merges (and
//! downsamples), which blocks retention deletes, and how a timeline's points map to buckets.
//!
//! Input: times in Unix seconds, block names and sizes, the store's config. Output: plans the
//! block store (`blocks/`) carries out. No I/O, clock or sled, so the tests below check every
//! decision without a disk.
//!
//! Time is cut into **buckets** of [`BUCKET`] seconds. The head holds recent writes per **head
//! range** of [`HEAD_SPAN`] seconds; a range is cut into one block per tenant once it has been
//! closed for [`CUT_GRACE`]. Compaction merges blocks into the spans of [`SPANS`], ten times
//! larger at each step (about 17 min → 2.8 h → 28 h), each block with rollups ten times coarser
//! than its finest bucket up to its span (the block format's levels).

use std::collections::BTreeMap;
use std::time::Duration;

/// The finest bucket, in seconds.
pub(crate) const BUCKET: u64 = 10;

/// The span of a head range, and of a block cut from it.
pub(crate) const HEAD_SPAN: u64 = 1_000;

/// How long after a head range ends it is cut: windows that arrive late (an agent's window
/// after a reconnect) usually land within this and go into the range's one block.
pub(crate) const CUT_GRACE: u64 = 60;

/// Block spans, finest first: a cut's, then compaction's.
pub(crate) const SPANS: [u64; 3] = [HEAD_SPAN, 10 * HEAD_SPAN, 100 * HEAD_SPAN];

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

/// The start of the head range holding the 10 s bucket `bucket`.
pub(crate) fn head_range(bucket: u64) -> u64 {
    bucket / HEAD_SPAN * HEAD_SPAN
}

/// Whether the head range starting at `start` is due to be cut as of `now`.
pub(crate) fn cut_due(start: u64, now: u64) -> bool {
    start + HEAD_SPAN + CUT_GRACE <= now
}

/// What compaction knows of a block: its name's range, its resolution and size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BlockPlan {
    /// The block's id.
    pub(crate) id: String,
    /// Unix seconds of its start.
    pub(crate) start: u64,
    /// Its span.
    pub(crate) span: u64,
    /// Its finest bucket.
    pub(crate) finest: u64,
    /// Its length in bytes.
    pub(crate) bytes: u64,
}

/// One merge compaction runs: every block of one tenant that lies in `[start, start + span)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Compaction {
    /// The output's start.
    pub(crate) start: u64,
    /// The output's span.
    pub(crate) span: u64,
    /// The output's finest bucket: the coarsest of the inputs' and what downsampling asks.
    pub(crate) finest: u64,
    /// The ids of the inputs, sorted.
    pub(crate) inputs: Vec<String>,
}

/// When data is downsampled: to 100 s once older than `to_100s`, to 1000 s once older than
/// `to_1000s` (zero: never).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Downsampling {
    pub(crate) to_100s: Duration,
    pub(crate) to_1000s: Duration,
}

impl Downsampling {
    /// The finest bucket data ending at `end` keeps as of `now`.
    pub(crate) fn finest(&self, end: u64, now: u64) -> u64 {
        let age = now.saturating_sub(end);
        let older = |limit: Duration| !limit.is_zero() && age >= limit.as_secs();
        if older(self.to_1000s) {
            1_000
        } else if older(self.to_100s) {
            100
        } else {
            BUCKET
        }
    }
}

/// How long after a range of a compaction span ends its blocks are merged: past the cut's
/// grace, so that most late windows are in a block by then.
pub(crate) const COMPACTION_GRACE: u64 = 2 * CUT_GRACE;

/// The merges one tenant's blocks need as of `now`, smallest first.
///
/// Each block goes to the largest span of [`SPANS`] whose range containing it has closed (by
/// [`COMPACTION_GRACE`]): blocks of one such range are merged when there are several, when
/// the one there is smaller than the span, or when its data is old enough to be downsampled
/// further. A late block (cut after its range was compacted) joins the compacted block of its
/// range, so compaction always takes every block of the range it writes.
pub(crate) fn compactions(
    blocks: &[BlockPlan],
    now: u64,
    downsampling: &Downsampling,
) -> Vec<Compaction> {
    let mut groups: BTreeMap<(u64, u64), Vec<&BlockPlan>> = BTreeMap::new();
    for block in blocks {
        let target = SPANS
            .iter()
            .copied()
            .filter(|&span| span >= block.span)
            .rfind(|&span| block.start / span * span + span + COMPACTION_GRACE <= now)
            .unwrap_or(block.span);
        groups
            .entry((target, block.start / target * target))
            .or_default()
            .push(block);
    }
    let mut out = Vec::new();
    for ((span, start), group) in groups {
        let coarsest = group.iter().map(|b| b.finest).max().unwrap_or(BUCKET);
        let finest = coarsest.max(downsampling.finest(start + span, now));
        let needed = group.len() > 1 || group[0].span < span || group[0].finest < finest;
        if !needed || span % finest != 0 {
            continue;
        }
        let mut inputs: Vec<String> = group.iter().map(|b| b.id.clone()).collect();
        inputs.sort();
        out.push(Compaction {
            start,
            span,
            finest,
            inputs,
        });
    }
    out.sort_by_key(|c| (c.span, c.start));
    out
}

/// The blocks retention deletes as of `now`: those whose data all ended `retention` ago, then,
/// while the store (`other_bytes` beside the blocks) is larger than `max_bytes` (0: no limit),
/// the oldest of the rest, one whole block at a time.
pub(crate) fn retention(
    blocks: &[BlockPlan],
    now: u64,
    retention: u64,
    max_bytes: u64,
    other_bytes: u64,
) -> Vec<String> {
    let cutoff = now.saturating_sub(retention);
    let mut order: Vec<&BlockPlan> = blocks.iter().collect();
    order.sort_by_key(|b| (b.start + b.span, b.start));
    let mut total: u64 = other_bytes + blocks.iter().map(|b| b.bytes).sum::<u64>();
    let mut out = Vec::new();
    for block in order {
        let expired = block.start + block.span <= cutoff;
        let over = max_bytes > 0 && total > max_bytes;
        if !expired && !over {
            break;
        }
        total -= block.bytes;
        out.push(block.id.clone());
    }
    out
}

/// The time before which data is past its retention as of `now`.
pub(crate) fn retention_cutoff(now: u64, retention: u64) -> u64 {
    now.saturating_sub(retention)
}

/// How a timeline over a range is read: its points, and which bucket size feeds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TimelinePlan {
    /// Unix seconds of the first point.
    pub(crate) start: u64,
    /// Seconds per point, a whole number of 10 s buckets.
    pub(crate) step: u64,
    /// How many points.
    pub(crate) points: usize,
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
        TimelinePlan {
            start,
            step,
            points: usize::try_from(points).unwrap_or(usize::MAX),
            until,
        }
    }

    /// Of a block's bucket sizes (`levels`, finest first), the coarsest that divides the step
    /// and the start: the one whose totals feed the points (the finest when none does).
    pub(crate) fn level(&self, levels: &[u64]) -> usize {
        levels
            .iter()
            .rposition(|&size| self.step.is_multiple_of(size) && self.start.is_multiple_of(size))
            .unwrap_or(0)
    }

    /// The point a bucket starting at `bucket` adds to, if any.
    pub(crate) fn slot(&self, bucket: u64) -> Option<usize> {
        if bucket >= self.until {
            return None;
        }
        let slot = usize::try_from(bucket.checked_sub(self.start)? / self.step).ok()?;
        (slot < self.points).then_some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(id: &str, start: u64, span: u64, finest: u64) -> BlockPlan {
        BlockPlan {
            id: id.to_owned(),
            start,
            span,
            finest,
            bytes: 100,
        }
    }

    #[test]
    fn a_profile_lands_in_the_bucket_of_its_middle() {
        assert_eq!(bucket_of(36_005, 36_015), 36_010);
        assert_eq!(bucket_of(36_000, 36_010), 36_000);
        assert_eq!(bucket_of(36_009, 36_000), 36_000, "until before from");
    }

    #[test]
    fn ranges_widen_to_whole_buckets_of_the_resolution() {
        assert_eq!(align(1_005, 1_021, 10), (1_000, 1_030));
        assert_eq!(align(1_005, 1_021, 100), (1_000, 1_100));
        assert_eq!(align(1_005, 1_021, 0), (1_000, 1_030), "at least 10 s");
        assert_eq!(align(1_005, 1_021, 15), (1_000, 1_040));
        assert_eq!(align(0, u64::MAX, 10).0, 0, "no overflow");
    }

    #[test]
    fn a_head_range_is_cut_a_grace_after_it_closes() {
        assert_eq!(head_range(12_340), 12_000);
        assert!(!cut_due(12_000, 13_059));
        assert!(cut_due(12_000, 13_060));
    }

    #[test]
    fn closed_ranges_are_merged_upwards_and_late_blocks_join_them() {
        let none = Downsampling::default();
        // Ten cut blocks of one closed 10 000 s range, one of the next (still open).
        let mut blocks: Vec<BlockPlan> = (0..10)
            .map(|i| block(&format!("c{i}"), 20_000 + i * 1_000, 1_000, 10))
            .collect();
        blocks.push(block("open", 30_000, 1_000, 10));
        let plan = compactions(&blocks, 30_500, &none);
        assert_eq!(plan.len(), 1);
        assert_eq!(
            (plan[0].start, plan[0].span, plan[0].finest),
            (20_000, 10_000, 10)
        );
        assert_eq!(plan[0].inputs.len(), 10);
        // Once merged, nothing more until the 100 000 s range closes; a late block joins.
        let merged = vec![
            block("m", 20_000, 10_000, 10),
            block("late", 23_000, 1_000, 10),
        ];
        let plan = compactions(&merged, 30_500, &none);
        assert_eq!(plan[0].inputs, ["late", "m"]);
        assert_eq!(plan[0].span, 10_000);
        assert!(compactions(&merged[..1], 30_500, &none).is_empty());
        // The 100 000 s range closed: everything in it goes into one block.
        let plan = compactions(&merged, 100_000 + COMPACTION_GRACE, &none);
        assert_eq!((plan[0].start, plan[0].span), (0, 100_000));
        assert_eq!(plan[0].inputs, ["late", "m"]);
        // A range still open is left alone.
        assert!(compactions(&[block("x", 30_000, 1_000, 10)], 30_999, &none).is_empty());
    }

    #[test]
    fn old_blocks_are_downsampled_by_age() {
        let day = 86_400;
        let downsampling = Downsampling {
            to_100s: Duration::from_secs(7 * day),
            to_1000s: Duration::from_secs(30 * day),
        };
        let old = block("old", 0, 100_000, 10);
        assert!(
            compactions(std::slice::from_ref(&old), 100_000 + 6 * day, &downsampling).is_empty()
        );
        let plan = compactions(std::slice::from_ref(&old), 100_000 + 7 * day, &downsampling);
        assert_eq!(plan[0].finest, 100);
        let plan = compactions(
            &[block("old", 0, 100_000, 100)],
            100_000 + 31 * day,
            &downsampling,
        );
        assert_eq!(plan[0].finest, 1_000);
        assert!(
            compactions(
                &[block("old", 0, 100_000, 1_000)],
                100_000 + 31 * day,
                &downsampling
            )
            .is_empty()
        );
    }

    #[test]
    fn retention_deletes_whole_blocks_by_age_then_oldest_first_by_size() {
        let blocks = [
            block("a", 0, 10_000, 10),
            block("b", 10_000, 10_000, 10),
            block("c", 20_000, 1_000, 10),
        ];
        assert_eq!(retention(&blocks, 25_000, 10_000, 0, 0), ["a"]);
        assert!(retention(&blocks, 19_999, 10_000, 0, 0).is_empty());
        // 300 bytes of blocks and 50 of head, limit 200: the two oldest go.
        assert_eq!(retention(&blocks, 21_000, 100_000, 200, 50), ["a", "b"]);
        assert!(retention(&blocks, 21_000, 100_000, 350, 50).is_empty());
    }

    #[test]
    fn timelines_read_the_coarsest_level_that_divides_the_step() {
        let plan = TimelinePlan::new(1_000_005, 1_003_600, 10);
        assert_eq!((plan.start, plan.step, plan.points), (1_000_000, 10, 360));
        assert_eq!(plan.level(&[10, 100, 1_000]), 0);
        assert_eq!(plan.slot(1_003_590), Some(359));
        assert_eq!(plan.slot(1_003_600), None);
        assert_eq!(plan.slot(999_990), None);
        let plan = TimelinePlan::new(1_000_000, 1_000_000 + 86_400, 1_000);
        assert_eq!(plan.level(&[10, 100, 1_000, 10_000]), 2);
        assert_eq!(plan.points, 87);
        let plan = TimelinePlan::new(50, 50, 15);
        assert_eq!((plan.step, plan.points), (20, 1));
    }
}
