//! The timeline of `/render`: totals over the range in Pyroscope's steps, and one timeline per
//! value of the `groupBy` label.

use std::collections::{BTreeMap, BTreeSet};

use smolder_common::Selector;
use smolder_common::flamebearer::Timeline;

use super::QueryError;
use crate::store::{BUCKET, SeriesInfo, Store, TimeRange, Timelines};
use crate::tenant::Tenant;

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
    let (from, until) = range.aligned(BUCKET);
    step_for(until - from)
}

/// Refuses a `groupBy` on `label` that splits `series` into more than `max_groups` values.
/// `"*"`, always present, does not count.
pub(super) fn check_groups(
    series: &[SeriesInfo],
    label: &str,
    max_groups: usize,
) -> Result<(), QueryError> {
    let mut values = BTreeSet::from([OTHERS]);
    for info in series {
        values.insert(info.series.labels().get(label).unwrap_or(OTHERS));
        if values.len() > max_groups + 1 {
            return Err(QueryError::TooManyGroups {
                label: label.to_owned(),
                limit: max_groups,
            });
        }
    }
    Ok(())
}

/// The timeline of the series `selector` matches over `range` in steps of `step` seconds, and
/// `groups`: one timeline per value of label `group_by`, and under `"*"` the series without it;
/// without `group_by`, `"*"` holds every series and is the timeline itself. `"*"` is always
/// present, as in Pyroscope. Blocking.
pub(super) fn read(
    store: &dyn Store,
    tenant: &Tenant,
    selector: &Selector,
    range: TimeRange,
    step: u64,
    group_by: Option<&str>,
) -> Result<(Timeline, BTreeMap<String, Timeline>), QueryError> {
    let Timelines {
        start,
        step,
        points,
        groups,
    } = store.timelines(tenant, selector, range, step, group_by)?;
    let timeline = |samples: Vec<u64>| Timeline {
        start_time: i64::try_from(start).unwrap_or(i64::MAX),
        samples,
        duration_delta: i64::try_from(step).unwrap_or(i64::MAX),
        watermarks: BTreeMap::new(),
    };
    let mut all = vec![0u64; points];
    let mut by_value: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    by_value.insert(OTHERS.to_owned(), vec![0; points]);
    for (value, samples) in groups {
        add(&mut all, &samples);
        // A label whose value is "*" shares the group of the series without the label.
        let key = value.unwrap_or_else(|| OTHERS.to_owned());
        match by_value.get_mut(&key) {
            Some(sum) => add(sum, &samples),
            None => {
                by_value.insert(key, samples);
            }
        }
    }
    let groups = by_value
        .into_iter()
        .map(|(value, samples)| (value, timeline(samples)))
        .collect();
    Ok((timeline(all), groups))
}

/// Adds `samples` into `sum`, point by point.
fn add(sum: &mut [u64], samples: &[u64]) {
    for (total, sample) in sum.iter_mut().zip(samples) {
        *total = total.saturating_add(*sample);
    }
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
