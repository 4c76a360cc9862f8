//! The read side: finding series, merging their trees over a range, their timelines, label
//! listings, apps and stored rules. Each function reads sled's consistent snapshot of each key
//! on the caller's thread.

use std::collections::{BTreeMap, BTreeSet};

use smolder_common::{Aggregation, Selector, Tree};

use super::keys::{self, DIRTY, SeriesId, TOTAL, TREE};
use super::series::SeriesRecord;
use super::writer::decode_total;
use crate::store::plan::{self, BUCKET, TimelinePlan};
use crate::store::{AppInfo, Merged, MergedTrees, SeriesInfo, StoreError, TimeRange, Timelines};

/// Series whose app name and labels match `selector` and that have data in `range`.
pub(super) fn series(
    data: &sled::Tree,
    selector: &Selector,
    range: TimeRange,
) -> Result<Vec<SeriesInfo>, StoreError> {
    let mut found = Vec::new();
    for_each_match(data, selector, range.aligned(BUCKET), |_, _, info| {
        found.push(info);
        Ok(())
    })?;
    Ok(found)
}

/// The trees of the series `selector` matches, merged over `range` widened to whole buckets of
/// `resolution`, each series read as the fewest whole buckets that cover its part of the range
/// (see [`plan::cover`]).
pub(super) fn merge(
    data: &sled::Tree,
    selector: &Selector,
    range: TimeRange,
    resolution: u64,
) -> Result<Merged, StoreError> {
    let (from, until) = range.aligned(resolution);
    let mut merged = Merged::default();
    for_each_match(data, selector, (from, until), |id, record, info| {
        let part = match info.meta.aggregation {
            Aggregation::Average => &mut merged.average,
            Aggregation::Sum => &mut merged.sum,
        };
        // Only the span the series has data in: a range of centuries costs no more than the
        // data it covers.
        let from = from.max(record.first_seen / BUCKET * BUCKET);
        let until = until.min(record.last_seen + BUCKET);
        for (level, start) in plan::cover(from, until) {
            read_bucket(data, id, level, start, part)?;
        }
        merged.series.push(info);
        Ok(())
    })?;
    Ok(merged)
}

/// Adds one bucket to `merged`: its tree if it has one that is up to date, else (a rollup still
/// marked dirty) its ten children, recursively.
fn read_bucket(
    data: &sled::Tree,
    id: SeriesId,
    level: usize,
    start: u64,
    merged: &mut MergedTrees,
) -> Result<(), StoreError> {
    if level > 0 && data.contains_key(keys::bucket(DIRTY, level, id, start))? {
        for (child_level, child_start) in plan::children(level, start) {
            read_bucket(data, id, child_level, child_start, merged)?;
        }
        return Ok(());
    }
    let tree_key = keys::bucket(TREE, level, id, start);
    let Some(value) = data.get(tree_key)? else {
        return Ok(());
    };
    let payload = keys::open(&tree_key, &value)?;
    let tree = Tree::decode(payload).map_err(|_| StoreError::Corrupt {
        key: keys::printable(&tree_key),
        reason: "tree does not decode",
    })?;
    merged.tree.merge(&tree);
    let total_key = keys::bucket(TOTAL, level, id, start);
    if let Some(value) = data.get(total_key)? {
        merged.writes += decode_total(&total_key, keys::open(&total_key, &value)?)?.1;
    }
    Ok(())
}

/// The totals of the series `selector` matches over `range`, summed per `step`, per value of
/// label `group_by`. Reads bucket totals only, from the level [`TimelinePlan`] picks.
pub(super) fn timelines(
    data: &sled::Tree,
    selector: &Selector,
    range: TimeRange,
    step: u64,
    group_by: Option<&str>,
) -> Result<Timelines, StoreError> {
    let (from, until) = range.aligned(BUCKET);
    let plan = TimelinePlan::new(from, until, step);
    let mut groups: BTreeMap<Option<String>, Vec<u64>> = BTreeMap::new();
    for_each_match(data, selector, (from, until), |id, _, info| {
        let value = group_by
            .and_then(|label| info.series.labels().get(label))
            .map(str::to_owned);
        let samples = groups.entry(value).or_insert_with(|| vec![0; plan.points]);
        let begin = keys::bucket(TOTAL, plan.level, id, plan.start);
        let end = keys::bucket(TOTAL, plan.level, id, plan.until);
        for entry in data.range(begin..end) {
            let (key, value) = entry?;
            let bucket = keys::bucket_start(&key)?;
            let (total, _) = decode_total(&key, keys::open(&key, &value)?)?;
            if let Some(sample) = plan.slot(bucket).and_then(|slot| samples.get_mut(slot)) {
                *sample = sample.saturating_add(total);
            }
        }
        Ok(())
    })?;
    Ok(Timelines {
        start: plan.start,
        step: plan.step,
        points: plan.points,
        groups,
    })
}

/// Label names of series with data in `range`, of app `app` when given, sorted. `__name__` is
/// not listed.
pub(super) fn label_names(
    data: &sled::Tree,
    app: Option<&str>,
    range: TimeRange,
) -> Result<Vec<String>, StoreError> {
    let (from, until) = range.aligned(BUCKET);
    let mut names = BTreeSet::new();
    for_each_series_of(data, app, |_, _, record| {
        if record.overlaps(from, until) {
            names.extend(record.labels.iter().map(|(name, _)| name.clone()));
        }
        Ok(())
    })?;
    Ok(names.into_iter().collect())
}

/// Values of label `name` among series with data in `range` that `selector` matches (all series
/// without one), sorted. `__name__` lists app names.
pub(super) fn label_values(
    data: &sled::Tree,
    name: &str,
    selector: Option<&Selector>,
    range: TimeRange,
) -> Result<Vec<String>, StoreError> {
    let (from, until) = range.aligned(BUCKET);
    let mut values = BTreeSet::new();
    for_each_series_of(data, selector.map(Selector::app), |_, key, record| {
        if !record.overlaps(from, until) {
            return Ok(());
        }
        if let Some(selector) = selector
            && !selector.matches(&record.info(key)?.series)
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
pub(super) fn apps(data: &sled::Tree) -> Result<Vec<AppInfo>, StoreError> {
    let mut apps: BTreeMap<String, (u64, AppInfo)> = BTreeMap::new();
    for_each_series_of(data, None, |_, _, record| {
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

/// Every stored recording rule as (name, rule), in name order.
pub(super) fn rules(data: &sled::Tree) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let mut rules = Vec::new();
    for entry in data.scan_prefix([keys::RULE]) {
        let (key, value) = entry?;
        let name = std::str::from_utf8(&key[1..]).map_err(|_| StoreError::Corrupt {
            key: keys::printable(&key),
            reason: "rule name is not UTF-8",
        })?;
        rules.push((name.to_owned(), keys::open(&key, &value)?.to_vec()));
    }
    Ok(rules)
}

/// Calls `f` with every series of `selector`'s app that has data in `[from, until)` (Unix
/// seconds, whole buckets) and that `selector` matches.
fn for_each_match(
    data: &sled::Tree,
    selector: &Selector,
    (from, until): (u64, u64),
    mut f: impl FnMut(SeriesId, &SeriesRecord, SeriesInfo) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    for_each_series_of(data, Some(selector.app()), |id, key, record| {
        if record.overlaps(from, until) {
            let info = record.info(key)?;
            if selector.matches(&info.series) {
                f(id, record, info)?;
            }
        }
        Ok(())
    })
}

/// Calls `f` with every series record of `app`, or of every app.
fn for_each_series_of(
    data: &sled::Tree,
    app: Option<&str>,
    mut f: impl FnMut(SeriesId, &[u8], &SeriesRecord) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    match app {
        Some(app) => {
            let prefix = keys::label_prefix(smolder_common::series::NAME_LABEL, Some(app));
            for entry in data.scan_prefix(prefix) {
                let (key, _) = entry?;
                let (_, _, id) = keys::parse_label(&key)?;
                let record_key = keys::series(id);
                if let Some(value) = data.get(record_key)? {
                    f(id, &record_key, &SeriesRecord::decode(&record_key, &value)?)?;
                }
            }
        }
        None => {
            for entry in data.scan_prefix([keys::SERIES]) {
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
