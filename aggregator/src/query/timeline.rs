//! The timeline of `/render`: totals over the range in Pyroscope's steps, and one timeline per
//! value of the `groupBy` label.

use std::collections::BTreeMap;

use smolder_common::flamebearer::Timeline;

use super::QueryError;
use crate::store::{self, SeriesInfo, Store, TimeRange};

/// Pyroscope's finest timeline step and the base of every coarser one, in seconds.
const BASE_STEP: u64 = 10;
/// The timeline aims at more than this many points: the step is the largest one below
/// `range / POINTS`.
const POINTS: u64 = 1024;
/// The key of `groups` for series without the `groupBy` label (all series, without `groupBy`).
pub(super) const OTHERS: &str = "*";

/// The timeline step for a range of `range_secs` (already widened to whole 10 s buckets): the
/// largest 10 s × 10^k strictly below `range_secs / 1024`, or 10 s when none is, as Pyroscope's
/// `GenerateTimeline`.
pub(super) fn step_for(range_secs: u64) -> u64 {
    let mut step = BASE_STEP;
    let mut candidate = BASE_STEP;
    // `candidate < range / 1024` without losing the fraction: `candidate * 1024 < range`.
    while candidate
        .checked_mul(POINTS)
        .is_some_and(|scaled| scaled < range_secs)
    {
        step = candidate;
        match candidate.checked_mul(10) {
            Some(next) => candidate = next,
            None => break,
        }
    }
    step
}

/// The step for `range`, measured the way the store reads it (whole 10 s buckets).
pub(super) fn step_for_range(range: TimeRange) -> u64 {
    let (from, until) = range.buckets();
    step_for(until - from)
}

/// The timeline of `series` over `range` in steps of `step` seconds. Blocking.
pub(super) fn read(
    store: &Store,
    series: &[SeriesInfo],
    range: TimeRange,
    step: u64,
) -> Result<Timeline, QueryError> {
    let store::Timeline {
        start,
        step,
        samples,
    } = store.timeline(series, range, step)?;
    Ok(Timeline {
        start_time: i64::try_from(start).unwrap_or(i64::MAX),
        samples,
        duration_delta: i64::try_from(step).unwrap_or(i64::MAX),
        watermarks: BTreeMap::new(),
    })
}

/// `groups`: one timeline per value of label `group_by` among `series`, and under `"*"` the
/// series without it; without `group_by`, `"*"` holds every series. `"*"` is always present, as
/// in Pyroscope. Blocking.
pub(super) fn groups(
    store: &Store,
    series: &[SeriesInfo],
    group_by: Option<&str>,
    range: TimeRange,
    step: u64,
    max_groups: usize,
) -> Result<BTreeMap<String, Timeline>, QueryError> {
    let mut by_value: BTreeMap<String, Vec<SeriesInfo>> = BTreeMap::new();
    by_value.insert(OTHERS.to_owned(), Vec::new());
    for info in series {
        let value = group_by
            .and_then(|label| info.series.labels().get(label))
            .unwrap_or(OTHERS);
        by_value
            .entry(value.to_owned())
            .or_default()
            .push(info.clone());
        // "*" is always there and does not count.
        if by_value.len() > max_groups + 1 {
            return Err(QueryError::TooManyGroups {
                label: group_by.unwrap_or_default().to_owned(),
                limit: max_groups,
            });
        }
    }
    by_value
        .into_iter()
        .map(|(value, members)| Ok((value, read(store, &members, range, step)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_is_the_largest_power_of_ten_strictly_below_a_1024th() {
        // Short ranges: nothing below range/1024 but 10 s itself, or not even that.
        assert_eq!(step_for(0), 10);
        assert_eq!(step_for(10), 10);
        assert_eq!(step_for(3600), 10);
        // range/1024 = 10 exactly: 10 is not strictly below it, so the fallback, still 10.
        assert_eq!(step_for(10_240), 10);
        // 100 s is below range/1024 only once the range passes 102 400 s.
        assert_eq!(step_for(102_400), 10);
        assert_eq!(step_for(102_410), 100);
        // A day: 86 400 / 1024 = 84.4, so 10 s (8640 points).
        assert_eq!(step_for(86_400), 10);
        // Thirty days: 2530 s per point at most, so 1000 s (2592 points).
        assert_eq!(step_for(30 * 86_400), 1000);
        // A year: 30 796 s, so 10 000 s.
        assert_eq!(step_for(365 * 86_400), 10_000);
        // No overflow at the far end.
        assert!(step_for(u64::MAX) >= 10);
    }
}
