//! Selections the way Pyroscope v1 names them: a profile type id
//! (`process_cpu:cpu:nanoseconds:cpu:nanoseconds`) and a label selector
//! (`{service_name="api", env=~"prod|stage"}`), read from Smolder's series.
//!
//! A series shows itself to these queries with its own labels plus three that Smolder does not
//! store: `service_name` (its app name before the profile type suffix), and Pyroscope's private
//! `__name__` (the id's name, `process_cpu`) and `__profile_type__` (the whole id). Matchers may
//! name any of them. Values come back in the id's units: every series' tree is scaled by its
//! own [`ValueScale`] before series are merged, so CPU sample counts become nanoseconds at each
//! series' sample rate.

use std::collections::BTreeMap;

use smolder_common::profile_type::ValueScale;
use smolder_common::{MatchOp, Matcher, ProfileTypeId, Selector, SpanId, Tree};

use super::{QueryError, merge_trees};
use crate::store::{SeriesInfo, Store, TimeRange};
use crate::tenant::Tenant;

/// The label that names a series' application in Pyroscope's API.
pub(super) const SERVICE_NAME: &str = "service_name";
/// Pyroscope's private label holding the profile type id's name.
pub(super) const PROFILE_NAME: &str = "__name__";
/// Pyroscope's private label holding the whole profile type id.
pub(super) const PROFILE_TYPE: &str = "__profile_type__";
/// What `__name__` is called while a selector is parsed: Smolder's selector parser reserves
/// `__name__` for app names.
const PROFILE_NAME_STANDIN: &str = "__profile_name__";

/// Label matchers of a Pyroscope label selector, on real and shown labels alike.
#[derive(Clone, Debug, Default)]
pub(super) struct LabelSelector {
    matchers: Vec<Matcher>,
}

impl LabelSelector {
    /// Parses `{name op "value", ...}` (`=`, `!=`, `=~`, `!~`, anchored regexes); an empty
    /// string or `{}` matches everything.
    ///
    /// # Errors
    ///
    /// [`QueryError::InvalidSelector`] naming `param`.
    pub(super) fn parse(param: &'static str, text: &str) -> Result<LabelSelector, QueryError> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(LabelSelector::default());
        }
        let selector = Selector::parse(&format!("x{}", standin(text))).map_err(|source| {
            QueryError::InvalidSelector {
                name: param,
                source,
            }
        })?;
        Ok(LabelSelector {
            matchers: selector.matchers().to_vec(),
        })
    }

    /// Whether the matchers on shown labels accept an app that shows `labels`, a missing
    /// label reading as empty.
    fn accepts(&self, labels: &BTreeMap<String, String>) -> bool {
        self.shown().all(|m| {
            let name = if m.name() == PROFILE_NAME_STANDIN {
                PROFILE_NAME
            } else {
                m.name()
            };
            m.matches(labels.get(name).map_or("", String::as_str))
        })
    }

    /// The matchers on stored labels, for the store to apply.
    fn stored(&self) -> Vec<Matcher> {
        self.matchers
            .iter()
            .filter(|m| !is_shown(m.name()))
            .cloned()
            .collect()
    }

    /// The matchers on shown labels, checked per app.
    fn shown(&self) -> impl Iterator<Item = &Matcher> {
        self.matchers.iter().filter(|m| is_shown(m.name()))
    }
}

/// `__name__` as a matcher name replaced by [`PROFILE_NAME_STANDIN`], outside quoted values.
fn standin(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut quoted = false;
    let mut escaped = false;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if !quoted && rest.starts_with(PROFILE_NAME) {
            let after = rest[PROFILE_NAME.len()..].trim_start();
            if after.starts_with(['=', '!']) {
                out.push_str(PROFILE_NAME_STANDIN);
                rest = &rest[PROFILE_NAME.len()..];
                continue;
            }
        }
        match c {
            '\\' if quoted && !escaped => escaped = true,
            '"' if !escaped => {
                quoted = !quoted;
                escaped = false;
            }
            _ => escaped = false,
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Whether `name` is a label Smolder shows but does not store.
fn is_shown(name: &str) -> bool {
    matches!(
        name,
        SERVICE_NAME | PROFILE_NAME | PROFILE_TYPE | PROFILE_NAME_STANDIN
    )
}

/// An app's name split into its service and profile type suffix, and its profile type id.
pub(super) struct App {
    /// The app name, `checkout.cpu`.
    pub(super) name: String,
    /// `checkout`.
    pub(super) service: String,
    /// `cpu`.
    pub(super) suffix: String,
    /// Its profile type id.
    pub(super) id: ProfileTypeId,
}

impl App {
    fn new(name: String, units: &str) -> App {
        let (service, suffix) = match name.rsplit_once('.') {
            Some((service, suffix)) => (service.to_owned(), suffix.to_owned()),
            None => (name.clone(), String::new()),
        };
        let id = ProfileTypeId::for_series(&suffix, units);
        App {
            name,
            service,
            suffix,
            id,
        }
    }

    /// The labels every series of the app shows besides its own.
    fn shown(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (SERVICE_NAME.to_owned(), self.service.clone()),
            (PROFILE_NAME.to_owned(), self.id.name.clone()),
            (PROFILE_TYPE.to_owned(), self.id.to_string()),
        ])
    }
}

/// Every label a series shows: its own and [`App::shown`]'s.
pub(super) fn shown_labels(info: &SeriesInfo) -> BTreeMap<String, String> {
    let app = App::new(info.series.app().to_owned(), &info.meta.units);
    let mut labels = app.shown();
    for (name, value) in info.series.labels().iter() {
        labels.insert(name.to_owned(), value.to_owned());
    }
    labels
}

/// One app's part of a selection: the store selector of its matching series.
pub(super) struct Part {
    /// Its series that match, as the store selects them.
    pub(super) selector: Selector,
}

/// The apps of `tenant` whose shown labels `labels` matches and whose profile type `id`
/// selects (any, without `id`), each with the store selector of its matching series.
///
/// # Errors
///
/// When the store fails.
pub(super) fn parts(
    store: &dyn Store,
    tenant: &Tenant,
    id: Option<&ProfileTypeId>,
    labels: &LabelSelector,
) -> Result<Vec<Part>, QueryError> {
    let mut out = Vec::new();
    for info in store.apps(tenant)? {
        let app = App::new(info.name, &info.meta.units);
        if id.is_some_and(|id| !id.selects(&app.suffix, &info.meta.units)) {
            continue;
        }
        if !labels.accepts(&app.shown()) {
            continue;
        }
        // App names in the store are valid selector app names.
        let Ok(selector) = Selector::new(app.name, labels.stored()) else {
            continue;
        };
        out.push(Part { selector });
    }
    Ok(out)
}

/// The series of `tenant` with data in `range` that the selection matches.
///
/// # Errors
///
/// When the store fails.
pub(super) fn series(
    store: &dyn Store,
    tenant: &Tenant,
    id: Option<&ProfileTypeId>,
    labels: &LabelSelector,
    range: TimeRange,
) -> Result<Vec<SeriesInfo>, QueryError> {
    let mut out = Vec::new();
    for part in parts(store, tenant, id, labels)? {
        out.extend(store.series(tenant, &part.selector, range)?);
    }
    Ok(out)
}

/// A selector for exactly the series `info` among `all`: its own labels equal, every other
/// label of `all` absent, on top of `base`.
fn exactly(base: &Selector, info: &SeriesInfo, all: &[SeriesInfo]) -> Result<Selector, QueryError> {
    let mut matchers = base.matchers().to_vec();
    let own = info.series.labels();
    let invalid = |source| QueryError::InvalidSelector {
        name: "label_selector",
        source,
    };
    for (name, value) in own.iter() {
        matchers.push(Matcher::new(name, MatchOp::Equal, value).map_err(invalid)?);
    }
    let mut others: Vec<&str> = all
        .iter()
        .flat_map(|other| other.series.labels().iter().map(|(name, _)| name))
        .filter(|name| !own.contains(name))
        .collect();
    others.sort_unstable();
    others.dedup();
    for name in others {
        matchers.push(Matcher::new(name, MatchOp::Equal, "").map_err(invalid)?);
    }
    Selector::new(base.app(), matchers).map_err(invalid)
}

/// The series of one app's part, grouped by the scale their values take.
fn by_scale(series: Vec<SeriesInfo>) -> BTreeMap<(u64, u64), Vec<SeriesInfo>> {
    let mut groups: BTreeMap<(u64, u64), Vec<SeriesInfo>> = BTreeMap::new();
    for info in series {
        let scale = ValueScale::of(&info.meta);
        groups
            .entry((scale.numerator, scale.denominator))
            .or_default()
            .push(info);
    }
    groups
}

/// The merged tree of the selection over `range` in the id's units, and the series merged:
/// of every sample, or with `spans` of those spans' samples only (and only the series that
/// had any). Series of one app that share a scale are merged by one store read; an app whose
/// series have different sample rates is read a series at a time. Blocking.
///
/// # Errors
///
/// When the store fails.
pub(super) fn merge(
    store: &dyn Store,
    tenant: &Tenant,
    id: &ProfileTypeId,
    labels: &LabelSelector,
    range: TimeRange,
    spans: Option<&[SpanId]>,
) -> Result<(Tree, Vec<SeriesInfo>), QueryError> {
    let mut out = Tree::new();
    let mut merged_series = Vec::new();
    for part in parts(store, tenant, Some(id), labels)? {
        let all = store.series(tenant, &part.selector, range)?;
        let groups = by_scale(all.clone());
        let single = groups.len() == 1;
        for ((numerator, denominator), infos) in groups {
            let (mut tree, series) = if single {
                merge_trees(store, tenant, &part.selector, range, spans)?
            } else {
                let mut tree = Tree::new();
                let mut series = Vec::new();
                for info in &infos {
                    let exact = exactly(&part.selector, info, &all)?;
                    let (one, merged) = merge_trees(store, tenant, &exact, range, spans)?;
                    tree.merge(&one);
                    series.extend(merged);
                }
                (tree, series)
            };
            if numerator != denominator {
                tree.scale(numerator, denominator);
            }
            out.merge(&tree);
            // Of span profiles, only the series that had the spans.
            if spans.is_some() {
                merged_series.extend(series);
            }
        }
        if spans.is_none() {
            merged_series.extend(all);
        }
    }
    Ok((out, merged_series))
}

/// One series' totals over time.
pub(super) struct SeriesTimeline {
    /// The series.
    pub(super) info: SeriesInfo,
    /// Unix seconds of the first point.
    pub(super) start: u64,
    /// Seconds per point.
    pub(super) step: u64,
    /// The totals, in the profile type's units.
    pub(super) totals: Vec<u64>,
}

/// Per series of the selection, its totals per `step` seconds over `range`, in the id's units.
/// Blocking.
///
/// # Errors
///
/// When the store fails.
pub(super) fn timelines(
    store: &dyn Store,
    tenant: &Tenant,
    id: &ProfileTypeId,
    labels: &LabelSelector,
    range: TimeRange,
    step: u64,
) -> Result<Vec<SeriesTimeline>, QueryError> {
    let mut out = Vec::new();
    for part in parts(store, tenant, Some(id), labels)? {
        let all = store.series(tenant, &part.selector, range)?;
        for info in &all {
            let exact = exactly(&part.selector, info, &all)?;
            let timelines = store.timelines(tenant, &exact, range, step, None)?;
            let scale = ValueScale::of(&info.meta);
            let mut totals = vec![0; timelines.points];
            for samples in timelines.groups.values() {
                for (total, sample) in totals.iter_mut().zip(samples) {
                    *total = scale.apply(*sample).saturating_add(*total);
                }
            }
            out.push(SeriesTimeline {
                info: info.clone(),
                start: timelines.start,
                step: timelines.step,
                totals,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn selectors_match_shown_and_stored_labels() {
        let labels = shown(&[
            ("service_name", "api"),
            ("__name__", "process_cpu"),
            (
                "__profile_type__",
                "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            ),
        ]);
        for (text, expected, stored) in [
            ("", true, 0),
            ("{}", true, 0),
            (r#"{service_name="api"}"#, true, 0),
            (r#"{service_name=~"a.*", env!="dev"}"#, true, 1),
            (r#"{__name__="process_cpu"}"#, true, 0),
            (r#"{__name__ = "memory"}"#, false, 0),
            (r#"{env="__name__=x"}"#, true, 1),
            (
                r#"{__profile_type__=~"process_cpu:.*", region=""}"#,
                true,
                1,
            ),
        ] {
            let selector = LabelSelector::parse("label_selector", text).unwrap();
            assert_eq!(selector.accepts(&labels), expected, "{text}");
            assert_eq!(selector.stored().len(), stored, "{text}");
        }
        assert!(LabelSelector::parse("label_selector", "{env=prod}").is_err());
        assert_eq!(
            standin(r#"{env="__name__=", __name__="a"}"#),
            r#"{env="__name__=", __profile_name__="a"}"#
        );
    }
}
