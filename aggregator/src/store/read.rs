//! The read side: finding series, merging their trees over a range, and their timelines.

use std::collections::{BTreeMap, BTreeSet};

use smolder_common::{Selector, Tree};

use super::keys::{self, BUCKET, DIRTY, LEVELS, TOTAL, TREE};
use super::series::SeriesRecord;
use super::writer::decode_total;
use super::{AppInfo, SeriesInfo, Store, StoreError, TimeRange};

/// The trees of some series merged over a range.
#[derive(Debug)]
pub(crate) struct Merged {
    /// The sum of every bucket read.
    pub(crate) tree: Tree,
    /// How many writes those buckets sum; a range of `average` series is `tree / writes`.
    pub(crate) writes: u64,
}

/// Totals per step over a range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Timeline {
    /// Unix seconds of the first point.
    pub(crate) start: u64,
    /// Seconds per point.
    pub(crate) step: u64,
    /// The sum of totals in each step.
    pub(crate) samples: Vec<u64>,
}

impl Store {
    /// Series whose app name and labels match `selector` and that have data in `range`.
    ///
    /// # Errors
    ///
    /// When sled fails or a record is corrupt.
    pub(crate) fn select(
        &self,
        selector: &Selector,
        range: TimeRange,
    ) -> Result<Vec<SeriesInfo>, StoreError> {
        let (from, until) = range.buckets();
        let mut found = Vec::new();
        self.for_each_series_of(Some(selector.app()), |id, key, record| {
            if record.overlaps(from, until) {
                let info = record.info(id, key)?;
                if selector.matches(&info.series) {
                    found.push(info);
                }
            }
            Ok(())
        })?;
        Ok(found)
    }

    /// The trees of `series` merged over `range`, read as the fewest whole buckets that cover
    /// it (see `keys::LEVELS`).
    ///
    /// # Errors
    ///
    /// When sled fails or a bucket is corrupt (the error names its key).
    pub(crate) fn merge(
        &self,
        series: &[SeriesInfo],
        range: TimeRange,
    ) -> Result<Merged, StoreError> {
        let (from, until) = range.buckets();
        let mut merged = Merged {
            tree: Tree::new(),
            writes: 0,
        };
        for info in series {
            // Only the span the series has data in: a range of centuries costs no more than
            // the data it covers.
            let from = from.max(info.first_seen / BUCKET * BUCKET);
            let until = until.min(info.last_seen + BUCKET);
            for (level, start) in plan(from, until) {
                self.read_bucket(info.id, level, start, &mut merged)?;
            }
        }
        Ok(merged)
    }

    /// Adds one bucket to `merged`: its tree if it has one that is up to date, else (a rollup
    /// still marked dirty) its ten children, recursively.
    fn read_bucket(
        &self,
        id: keys::SeriesId,
        level: usize,
        start: u64,
        merged: &mut Merged,
    ) -> Result<(), StoreError> {
        if level > 0
            && self
                .inner
                .data
                .contains_key(keys::bucket(DIRTY, level, id, start))?
        {
            let child = LEVELS[level - 1];
            for child_start in (start..start + LEVELS[level]).step_by(child as usize) {
                self.read_bucket(id, level - 1, child_start, merged)?;
            }
            return Ok(());
        }
        let tree_key = keys::bucket(TREE, level, id, start);
        let Some(value) = self.inner.data.get(tree_key)? else {
            return Ok(());
        };
        let payload = keys::open(&tree_key, &value)?;
        let tree = Tree::decode(payload).map_err(|_| StoreError::Corrupt {
            key: keys::printable(&tree_key),
            reason: "tree does not decode",
        })?;
        merged.tree.merge(&tree);
        let total_key = keys::bucket(TOTAL, level, id, start);
        if let Some(value) = self.inner.data.get(total_key)? {
            merged.writes += decode_total(&total_key, keys::open(&total_key, &value)?)?.1;
        }
        Ok(())
    }

    /// The totals of `series` over `range`, summed per `step` seconds (rounded up to a multiple
    /// of 10 s). Reads bucket totals only, never trees, from the coarsest level whose buckets
    /// divide the step.
    ///
    /// # Errors
    ///
    /// When sled fails or a total is corrupt.
    pub(crate) fn timeline(
        &self,
        series: &[SeriesInfo],
        range: TimeRange,
        step: u64,
    ) -> Result<Timeline, StoreError> {
        let step = step.max(BUCKET).div_ceil(BUCKET) * BUCKET;
        let (from, until) = range.buckets();
        let start = from / step * step;
        let points = until.saturating_sub(start).div_ceil(step).max(1);
        let level = LEVELS
            .iter()
            .rposition(|&size| step.is_multiple_of(size) && start.is_multiple_of(size))
            .unwrap_or(0);
        let mut samples = vec![0u64; points as usize];
        for info in series {
            let begin = keys::bucket(TOTAL, level, info.id, start);
            let end = keys::bucket(TOTAL, level, info.id, until);
            for entry in self.inner.data.range(begin..end) {
                let (key, value) = entry?;
                let bucket = keys::bucket_start(&key)?;
                let (total, _) = decode_total(&key, keys::open(&key, &value)?)?;
                let slot = ((bucket - start) / step) as usize;
                if let Some(sample) = samples.get_mut(slot) {
                    *sample = sample.saturating_add(total);
                }
            }
        }
        Ok(Timeline {
            start,
            step,
            samples,
        })
    }

    /// Label names of series with data in `range`, of app `app` when given, sorted. `__name__`
    /// is not listed.
    ///
    /// # Errors
    ///
    /// When sled fails or a record is corrupt.
    pub(crate) fn label_names(
        &self,
        app: Option<&str>,
        range: TimeRange,
    ) -> Result<Vec<String>, StoreError> {
        let (from, until) = range.buckets();
        let mut names = BTreeSet::new();
        self.for_each_series_of(app, |_, _, record| {
            if record.overlaps(from, until) {
                names.extend(record.labels.iter().map(|(name, _)| name.clone()));
            }
            Ok(())
        })?;
        Ok(names.into_iter().collect())
    }

    /// Values of label `name` among series with data in `range` that `selector` matches (all
    /// series without one), sorted. `__name__` lists app names.
    ///
    /// # Errors
    ///
    /// When sled fails or a record is corrupt.
    pub(crate) fn label_values(
        &self,
        name: &str,
        selector: Option<&Selector>,
        range: TimeRange,
    ) -> Result<Vec<String>, StoreError> {
        let (from, until) = range.buckets();
        let mut values = BTreeSet::new();
        self.for_each_series_of(selector.map(Selector::app), |id, key, record| {
            if !record.overlaps(from, until) {
                return Ok(());
            }
            if let Some(selector) = selector
                && !selector.matches(&record.info(id, key)?.series)
            {
                return Ok(());
            }
            if name == smolder_common::series::NAME_LABEL {
                values.insert(record.app.clone());
            } else if let Some((_, value)) = record.labels.iter().find(|(n, _)| n == name) {
                values.insert(value.clone());
            }
            Ok(())
        })?;
        Ok(values.into_iter().collect())
    }

    /// Every app name with the metadata of its most recently written series, sorted by name.
    ///
    /// # Errors
    ///
    /// When sled fails or a record is corrupt.
    pub(crate) fn apps(&self) -> Result<Vec<AppInfo>, StoreError> {
        let mut apps: BTreeMap<String, (u64, AppInfo)> = BTreeMap::new();
        self.for_each_series_of(None, |_, _, record| {
            let newest = apps
                .get(&record.app)
                .is_none_or(|(seen, _)| record.last_seen >= *seen);
            if newest {
                let info = AppInfo {
                    name: record.app.clone(),
                    meta: record.meta(),
                };
                apps.insert(record.app.clone(), (record.last_seen, info));
            }
            Ok(())
        })?;
        Ok(apps.into_values().map(|(_, info)| info).collect())
    }

    /// Calls `f` with every series record of `app`, or of every app.
    fn for_each_series_of(
        &self,
        app: Option<&str>,
        mut f: impl FnMut(u64, &[u8], &SeriesRecord) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        match app {
            Some(app) => {
                let prefix = keys::label_prefix(smolder_common::series::NAME_LABEL, Some(app));
                for entry in self.inner.data.scan_prefix(prefix) {
                    let (key, _) = entry?;
                    let (_, _, id) = keys::parse_label(&key)?;
                    let record_key = keys::series(id);
                    if let Some(value) = self.inner.data.get(record_key)? {
                        f(id, &record_key, &SeriesRecord::decode(&record_key, &value)?)?;
                    }
                }
            }
            None => {
                for entry in self.inner.data.scan_prefix([keys::SERIES]) {
                    let (key, value) = entry?;
                    let id = key
                        .get(1..)
                        .and_then(|b| b.try_into().ok())
                        .map(u64::from_be_bytes)
                        .ok_or_else(|| StoreError::Corrupt {
                            key: keys::printable(&key),
                            reason: "series key is not 9 bytes",
                        })?;
                    f(id, &key, &SeriesRecord::decode(&key, &value)?)?;
                }
            }
        }
        Ok(())
    }
}

/// The fewest whole buckets that cover `[from, until)` (both multiples of 10 s): at each point
/// the largest level whose bucket starts there and ends inside the range. Lazy, so that its
/// memory does not grow with the range.
fn plan(from: u64, until: u64) -> impl Iterator<Item = (usize, u64)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_uses_the_coarsest_buckets_that_fit() {
        assert_eq!(plan(0, 10).collect::<Vec<_>>(), [(0, 0)]);
        assert_eq!(plan(0, 100).collect::<Vec<_>>(), [(1, 0)]);
        assert_eq!(
            plan(90, 210).collect::<Vec<_>>(),
            [(0, 90), (1, 100), (0, 200)]
        );
        let day: Vec<_> = plan(1_700_000_000 / 10 * 10, 1_700_086_400 / 10 * 10).collect();
        assert!(day.len() <= 62, "{} buckets for a day", day.len());
        let covered: u64 = day.iter().map(|&(level, _)| LEVELS[level]).sum();
        assert_eq!(covered, 86_400);
    }
}
