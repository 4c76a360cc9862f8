//! The query API Grafana speaks: Pyroscope's `querier.v1.QuerierService` over Connect (and
//! `settings.v1.SettingsService/Get`), answered from Smolder's series.
//!
//! Input: Connect unary requests ([`connect`](super::connect)) with the messages of
//! [`smolder_common::querier`]. Output: their answers, values in the units the profile type id
//! promises ([`typed`](super::typed): CPU sample counts become nanoseconds). Caller: the routes
//! of `query`, for Grafana's Pyroscope datasource (binary) and the Profiles Drilldown app
//! (JSON).
//!
//! | method | answer |
//! |---|---|
//! | `ProfileTypes` | the ids of apps with data in the range |
//! | `LabelNames`, `LabelValues`, `Series` | over the series any matcher selects, with `service_name`, `__name__` and `__profile_type__` shown |
//! | `SelectMergeStacktraces` | flame graph (default), tree bytes or pprof; `max_nodes`; a `stack_trace_selector` call site; a `span_selector` |
//! | `SelectMergeProfile` | pprof |
//! | `SelectSeries` | per `group_by` value set, totals per `step` (at least 10 s), `sum` or `average`, top `limit` |
//! | `Diff` | a diff flame graph of two selections |
//! | `GetProfileStats` | whether there is data, oldest and newest times |
//! | `SelectMergeSpanProfile` | the samples of the given spans: flame graph (default) or tree bytes; `max_nodes` |
//! | trace and profile id selectors | `unimplemented`: samples are kept per span, not per trace or profile id |
//! | `SelectHeatmap`, `AnalyzeQuery`, Go PGO, DOT | `unimplemented`, so that Grafana degrades |
//! | `settings.v1.SettingsService/Get` | no settings |
//!
//! Times are milliseconds; a start of 0 means the first stored data, an end of 0 now.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use prost::Message;
use serde::Serialize;
use serde::de::DeserializeOwned;
use smolder_common::pprof::{self, EncodeOptions, Period};
use smolder_common::querier::{
    AnalyzeQueryRequest, DiffRequest, DiffResponse, FlameGraph, FlameGraphDiff,
    GetProfileStatsRequest, GetProfileStatsResponse, GetSettingsRequest, GetSettingsResponse,
    LabelNamesRequest, LabelNamesResponse, LabelPair, LabelValuesRequest, LabelValuesResponse,
    Labels, Point, PprofProfile, ProfileFormat, ProfileType, ProfileTypesRequest,
    ProfileTypesResponse, SelectHeatmapRequest, SelectMergeProfileRequest,
    SelectMergeSpanProfileRequest, SelectMergeSpanProfileResponse, SelectMergeStacktracesRequest,
    SelectMergeStacktracesResponse, SelectSeriesRequest, SelectSeriesResponse, Series,
    SeriesRequest, SeriesResponse, TimeSeriesAggregationType, tree_bytes,
};
use smolder_common::{ProfileTypeId, SpanId, Tree};

use super::connect::{self, ConnectError};
use super::typed::{self, LabelSelector};
use super::{Querier, QueryConfig, QueryError, unix_secs};
use crate::store::{SeriesInfo, TimeRange};
use crate::tenant::Tenant;

/// Serves one unary call: reads the request, runs `answer`, writes the response in the
/// request's codec, and records the duration under `endpoint` or counts the error.
async fn unary<Req, Resp, F, Fut>(
    querier: Arc<Querier>,
    endpoint: &'static str,
    request: Request,
    answer: F,
) -> Response
where
    Req: Message + Default + DeserializeOwned,
    Resp: Message + Serialize,
    F: FnOnce(Arc<Querier>, Req) -> Fut,
    Fut: Future<Output = Result<Resp, ConnectError>>,
{
    let started = Instant::now();
    let result = async {
        let (codec, message) = connect::read::<Req>(request).await?;
        let answer = answer(Arc::clone(&querier), message).await?;
        Ok::<_, ConnectError>((codec, connect::respond(codec, &answer)))
    }
    .await;
    match result {
        Ok((codec, response)) => {
            querier.metrics.answered(endpoint, codec.label(), started);
            response
        }
        Err(error) => {
            querier.errors.inc("query", error.error_type);
            error.into_response()
        }
    }
}

/// Runs a blocking read of the store.
async fn read<T: Send + 'static>(
    querier: &Querier,
    work: impl FnOnce(&dyn crate::store::Store) -> Result<T, QueryError> + Send + 'static,
) -> Result<T, ConnectError> {
    Ok(super::blocking(querier, work).await?)
}

/// The range of a request in milliseconds: a start of 0 (or less) is the epoch, an end of 0
/// now.
fn range_ms(start: i64, end: i64) -> Result<TimeRange, QueryError> {
    let at = |ms: i64| UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    let range = TimeRange {
        from: at(start),
        until: if end <= 0 { SystemTime::now() } else { at(end) },
    };
    if range.until < range.from {
        return Err(QueryError::InvalidRange {
            from: "start",
            until: "end",
            from_unix: unix_secs(range.from),
            until_unix: unix_secs(range.until),
        });
    }
    Ok(range)
}

fn profile_type(value: &str) -> Result<ProfileTypeId, QueryError> {
    value
        .parse()
        .map_err(|source| QueryError::InvalidProfileType { source })
}

/// The node budget of an optional `max_nodes`, as `maxNodes` of `/render` reads it.
fn max_nodes(config: &QueryConfig, requested: Option<i64>) -> usize {
    let limit = config.max_nodes_limit;
    match requested {
        None => config.max_nodes_default.min(limit),
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|&n| n > 0)
            .map_or(limit, |n| n.min(limit)),
    }
}

/// The series any of `matchers` selects over `range` (every series without matchers).
fn select_any(
    store: &dyn crate::store::Store,
    tenant: &Tenant,
    matchers: &[String],
    range: TimeRange,
) -> Result<Vec<SeriesInfo>, QueryError> {
    let selectors = if matchers.iter().all(|m| m.trim().is_empty()) {
        vec![LabelSelector::default()]
    } else {
        matchers
            .iter()
            .map(|m| LabelSelector::parse("matchers", m))
            .collect::<Result<_, _>>()?
    };
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for selector in &selectors {
        for info in typed::series(store, tenant, None, selector, range)? {
            if seen.insert(info.series.clone()) {
                out.push(info);
            }
        }
    }
    Ok(out)
}

/// `ProfileTypes`.
pub(super) async fn profile_types(
    State(q): State<Arc<Querier>>,
    tenant: Tenant,
    r: Request,
) -> Response {
    unary(
        q,
        "profile_types",
        r,
        |q, req: ProfileTypesRequest| async move {
            let range = range_ms(req.start, req.end)?;
            let ids = read(&q, move |store| {
                let mut ids = BTreeMap::new();
                for info in typed::series(store, &tenant, None, &LabelSelector::default(), range)? {
                    let app = info.series.app();
                    let suffix = app.rsplit_once('.').map_or("", |(_, s)| s);
                    let id = ProfileTypeId::for_series(suffix, &info.meta.units);
                    ids.insert(id.to_string(), id);
                }
                Ok(ids)
            })
            .await?;
            Ok(ProfileTypesResponse {
                profile_types: ids
                    .into_iter()
                    .map(|(text, id)| ProfileType {
                        id: text,
                        name: id.name,
                        sample_type: id.sample_type,
                        sample_unit: id.sample_unit,
                        period_type: id.period_type,
                        period_unit: id.period_unit,
                    })
                    .collect(),
            })
        },
    )
    .await
}

/// `LabelNames`: every shown label name of the selected series, sorted.
pub(super) async fn label_names(
    State(q): State<Arc<Querier>>,
    tenant: Tenant,
    r: Request,
) -> Response {
    unary(
        q,
        "label_names",
        r,
        |q, req: LabelNamesRequest| async move {
            let range = range_ms(req.start, req.end)?;
            let names = read(&q, move |store| {
                let mut names = BTreeSet::new();
                for info in select_any(store, &tenant, &req.matchers, range)? {
                    names.extend(typed::shown_labels(&info).into_keys());
                }
                Ok(names)
            })
            .await?;
            Ok(LabelNamesResponse {
                names: names.into_iter().collect(),
            })
        },
    )
    .await
}

/// `LabelValues`: the values of one shown label among the selected series, sorted.
pub(super) async fn label_values(
    State(q): State<Arc<Querier>>,
    tenant: Tenant,
    r: Request,
) -> Response {
    unary(
        q,
        "label_values",
        r,
        |q, req: LabelValuesRequest| async move {
            let range = range_ms(req.start, req.end)?;
            let values = read(&q, move |store| {
                let mut values = BTreeSet::new();
                for info in select_any(store, &tenant, &req.matchers, range)? {
                    if let Some(value) = typed::shown_labels(&info).remove(&req.name) {
                        values.insert(value);
                    }
                }
                Ok(values)
            })
            .await?;
            Ok(LabelValuesResponse {
                names: values.into_iter().collect(),
            })
        },
    )
    .await
}

/// `Series`: the label sets of the selected series, only `label_names` when given.
pub(super) async fn series(State(q): State<Arc<Querier>>, tenant: Tenant, r: Request) -> Response {
    unary(q, "series", r, |q, req: SeriesRequest| async move {
        let range = range_ms(req.start, req.end)?;
        let sets = read(&q, move |store| {
            let mut sets = BTreeSet::new();
            for info in select_any(store, &tenant, &req.matchers, range)? {
                let mut labels = typed::shown_labels(&info);
                if !req.label_names.is_empty() {
                    labels.retain(|name, _| req.label_names.contains(name));
                }
                sets.insert(labels);
            }
            Ok(sets)
        })
        .await?;
        Ok(SeriesResponse {
            labels_set: sets
                .into_iter()
                .map(|labels| Labels {
                    labels: pairs(labels),
                })
                .collect(),
        })
    })
    .await
}

fn pairs(labels: BTreeMap<String, String>) -> Vec<LabelPair> {
    labels
        .into_iter()
        .map(|(name, value)| LabelPair { name, value })
        .collect()
}

/// What a stack-selecting request asks for, checked, before the store is read.
struct Selection {
    id: ProfileTypeId,
    labels: LabelSelector,
    range: TimeRange,
    call_site: Vec<String>,
    /// Only the samples of these spans (sorted); `None` for every sample.
    spans: Option<Vec<SpanId>>,
}

/// The span ids of a `span_selector`, sorted and without repeats.
fn span_ids(spans: &[String]) -> Result<Vec<SpanId>, QueryError> {
    let mut ids = spans
        .iter()
        .map(|s| s.trim().parse())
        .collect::<Result<Vec<SpanId>, _>>()
        .map_err(|source| QueryError::InvalidSpanSelector {
            name: "span_selector",
            source,
        })?;
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

impl Selection {
    /// Checks the parts of a selection that every `Select*` call shares, refusing the options
    /// that need data Smolder does not keep. A non-empty `spans` selects those spans' samples.
    fn new(
        id: &str,
        selector: &str,
        (start, end): (i64, i64),
        stack: Option<&smolder_common::querier::StackTraceSelector>,
        spans: &[String],
        ids: (&[String], &[String]),
    ) -> Result<Selection, ConnectError> {
        if !ids.0.is_empty() || !ids.1.is_empty() {
            return Err(ConnectError::unimplemented(
                "trace and profile id selectors are not served: samples are kept per span, not per trace or profile id",
            ));
        }
        if stack.is_some_and(|s| s.go_pgo.is_some()) {
            return Err(ConnectError::unimplemented(
                "Go PGO stack trace selectors are not served",
            ));
        }
        Ok(Selection {
            id: profile_type(id)?,
            labels: LabelSelector::parse("label_selector", selector)?,
            range: range_ms(start, end)?,
            call_site: stack
                .map(|s| s.call_site.iter().map(|l| l.name.clone()).collect())
                .unwrap_or_default(),
            spans: match spans.is_empty() {
                true => None,
                false => Some(span_ids(spans)?),
            },
        })
    }

    /// The merged tree in the id's units, call site applied, and the series merged.
    fn merge(
        &self,
        store: &dyn crate::store::Store,
        tenant: &Tenant,
    ) -> Result<(Tree, Vec<SeriesInfo>), QueryError> {
        if self.spans.as_ref().is_some_and(Vec::is_empty) {
            return Ok((Tree::new(), Vec::new()));
        }
        let spans = self.spans.as_deref();
        let (tree, series) =
            typed::merge(store, tenant, &self.id, &self.labels, self.range, spans)?;
        if self.call_site.is_empty() {
            return Ok((tree, series));
        }
        Ok((with_call_site(&tree, &self.call_site), series))
    }
}

/// The stacks of `tree` that start with the frames `call_site`, root first.
fn with_call_site(tree: &Tree, call_site: &[String]) -> Tree {
    let mut out = Tree::new();
    tree.for_each_stack(|stack, value| {
        let names: Vec<&str> = stack.iter().map(|&f| tree.frames().name(f)).collect();
        if names.len() >= call_site.len() && names.iter().zip(call_site).all(|(a, b)| a == b) {
            out.insert_names(&names, value);
        }
    });
    out
}

/// A tree as `google.v1.Profile` in the units of `id`: one sample type `id.sample_type` in
/// `id.sample_unit`, the id's period type with the period of the most recent series' sample
/// rate when its values are samples.
fn pprof_profile(
    tree: &Tree,
    id: &ProfileTypeId,
    series: &[SeriesInfo],
    range: TimeRange,
) -> pprof::Profile {
    let latest = series.iter().max_by_key(|info| info.last_seen);
    let period = latest
        .filter(|info| info.meta.units == "samples" && info.meta.sample_rate > 0)
        .map_or(0, |info| 1_000_000_000 / i64::from(info.meta.sample_rate));
    let nanos = |t: SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    };
    let options = EncodeOptions {
        period: (!id.period_type.is_empty()).then(|| Period {
            kind: id.period_type.clone(),
            unit: id.period_unit.clone(),
            value: period,
        }),
        time_nanos: nanos(range.from),
        duration_nanos: nanos(range.until).saturating_sub(nanos(range.from)),
        ..EncodeOptions::new(id.sample_type.clone(), id.sample_unit.clone())
    };
    pprof::encode(tree, &options)
}

/// `SelectMergeStacktraces`.
pub(super) async fn select_merge_stacktraces(
    State(q): State<Arc<Querier>>,
    tenant: Tenant,
    r: Request,
) -> Response {
    unary(
        q,
        "select_merge_stacktraces",
        r,
        |q, req: SelectMergeStacktracesRequest| async move {
            let selection = Selection::new(
                &req.profile_type_id,
                &req.label_selector,
                (req.start, req.end),
                req.stack_trace_selector.as_ref(),
                &req.span_selector,
                (&req.trace_id_selector, &req.profile_id_selector),
            )?;
            let format = ProfileFormat::try_from(req.format).unwrap_or(ProfileFormat::Unspecified);
            if format == ProfileFormat::Dot {
                return Err(ConnectError::unimplemented("the DOT format is not served"));
            }
            let max_nodes = max_nodes(&q.config, req.max_nodes);
            let metrics = q.metrics.clone();
            let response = read(&q, move |store| {
                let (tree, series) = selection.merge(store, &tenant)?;
                metrics.merged("select_merge_stacktraces", series.len(), tree.len());
                let mut response = SelectMergeStacktracesResponse::default();
                match format {
                    ProfileFormat::Tree => response.tree = tree_bytes(&tree, max_nodes),
                    ProfileFormat::Pprof => {
                        let profile = pprof_profile(
                            &tree.truncate(max_nodes),
                            &selection.id,
                            &series,
                            selection.range,
                        );
                        response.pprof = Some(PprofProfile {
                            profile: Some(profile),
                        });
                    }
                    _ => response.flamegraph = Some(FlameGraph::from_tree(&tree, max_nodes)),
                }
                Ok(response)
            })
            .await?;
            Ok(response)
        },
    )
    .await
}

/// `SelectMergeProfile`: pprof, untruncated unless `max_nodes` is given.
pub(super) async fn select_merge_profile(
    State(q): State<Arc<Querier>>,
    tenant: Tenant,
    r: Request,
) -> Response {
    unary(
        q,
        "select_merge_profile",
        r,
        |q, req: SelectMergeProfileRequest| async move {
            let selection = Selection::new(
                &req.profile_type_id,
                &req.label_selector,
                (req.start, req.end),
                req.stack_trace_selector.as_ref(),
                &[],
                (&req.trace_id_selector, &req.profile_id_selector),
            )?;
            let limit = q.config.max_nodes_limit;
            let max_nodes = req
                .max_nodes
                .map_or(limit, |n| max_nodes(&q.config, Some(n)));
            let metrics = q.metrics.clone();
            let profile = read(&q, move |store| {
                let (tree, series) = selection.merge(store, &tenant)?;
                metrics.merged("select_merge_profile", series.len(), tree.len());
                Ok(pprof_profile(
                    &tree.truncate(max_nodes),
                    &selection.id,
                    &series,
                    selection.range,
                ))
            })
            .await?;
            Ok(profile)
        },
    )
    .await
}

/// The points of one `SelectSeries` group: per step start (ms), the sum and the number of
/// series that had data there.
type Points = BTreeMap<i64, (u64, u64)>;

/// `SelectSeries`: one series per set of `group_by` values, a point per step with data.
pub(super) async fn select_series(
    State(q): State<Arc<Querier>>,
    tenant: Tenant,
    r: Request,
) -> Response {
    unary(
        q,
        "select_series",
        r,
        |q, req: SelectSeriesRequest| async move {
            let selection = Selection::new(
                &req.profile_type_id,
                &req.label_selector,
                (req.start, req.end),
                req.stack_trace_selector.as_ref(),
                &[],
                (&[], &[]),
            )?;
            if !selection.call_site.is_empty() {
                return Err(ConnectError::unimplemented(
                    "stack trace selectors are not served on SelectSeries",
                ));
            }
            if !(req.step.is_finite() && req.step >= 0.0) {
                return Err(QueryError::InvalidStep { step: req.step }.into());
            }
            // Whole seconds, at least one bucket.
            let step = (req.step.ceil() as u64).max(crate::store::BUCKET);
            let average = req.aggregation == Some(TimeSeriesAggregationType::Average as i32);
            let group_by = req.group_by;
            let limit = req
                .limit
                .and_then(|l| usize::try_from(l).ok())
                .filter(|&l| l > 0);
            let series = read(&q, move |store| {
                let timelines = typed::timelines(
                    store,
                    &tenant,
                    &selection.id,
                    &selection.labels,
                    selection.range,
                    step,
                )?;
                // Per group: its labels, and per point (start ms) the sum and the series counted.
                let mut groups: BTreeMap<Vec<(String, String)>, Points> = BTreeMap::new();
                for typed::SeriesTimeline {
                    info,
                    start,
                    step,
                    totals,
                } in timelines
                {
                    let labels = typed::shown_labels(&info);
                    let key: Vec<(String, String)> = group_by
                        .iter()
                        .filter_map(|name| labels.get(name).map(|v| (name.clone(), v.clone())))
                        .collect();
                    let points = groups.entry(key).or_default();
                    for (i, total) in totals.into_iter().enumerate().filter(|(_, t)| *t > 0) {
                        let ms =
                            i64::try_from((start + i as u64 * step) * 1000).unwrap_or(i64::MAX);
                        let point = points.entry(ms).or_default();
                        point.0 = point.0.saturating_add(total);
                        point.1 += 1;
                    }
                }
                let mut series: Vec<(u64, Series)> = groups
                    .into_iter()
                    .map(|(labels, points)| {
                        let total = points.values().fold(0u64, |sum, p| sum.saturating_add(p.0));
                        let points = points
                            .into_iter()
                            .map(|(timestamp, (sum, count))| Point {
                                value: if average {
                                    sum as f64 / count as f64
                                } else {
                                    sum as f64
                                },
                                timestamp,
                                annotations: vec![],
                                exemplars: vec![],
                            })
                            .collect();
                        let labels = labels
                            .into_iter()
                            .map(|(name, value)| LabelPair { name, value })
                            .collect();
                        (total, Series { labels, points })
                    })
                    .collect();
                if let Some(limit) = limit {
                    series.sort_by_key(|s| std::cmp::Reverse(s.0));
                    series.truncate(limit);
                }
                Ok(series.into_iter().map(|(_, s)| s).collect())
            })
            .await?;
            Ok(SelectSeriesResponse { series })
        },
    )
    .await
}

/// `Diff`: both sides merged in their id's units, aligned; the left side's `max_nodes`.
pub(super) async fn diff(State(q): State<Arc<Querier>>, tenant: Tenant, r: Request) -> Response {
    unary(q, "diff", r, |q, req: DiffRequest| async move {
        let missing = |side: &str| QueryError::MissingParameter {
            name: if side == "left" { "left" } else { "right" },
        };
        let left = req.left.ok_or_else(|| missing("left"))?;
        let right = req.right.ok_or_else(|| missing("right"))?;
        let side = |r: &SelectMergeStacktracesRequest| {
            Selection::new(
                &r.profile_type_id,
                &r.label_selector,
                (r.start, r.end),
                r.stack_trace_selector.as_ref(),
                &r.span_selector,
                (&r.trace_id_selector, &r.profile_id_selector),
            )
        };
        let (left_selection, right_selection) = (side(&left)?, side(&right)?);
        let max_nodes = max_nodes(&q.config, left.max_nodes);
        let flamegraph = read(&q, move |store| {
            let (l, _) = left_selection.merge(store, &tenant)?;
            let (r, _) = right_selection.merge(store, &tenant)?;
            Ok(FlameGraphDiff::from_combined(
                &Tree::combine(&l, &r),
                max_nodes,
            ))
        })
        .await?;
        Ok(DiffResponse {
            flamegraph: Some(flamegraph),
        })
    })
    .await
}

/// `GetProfileStats`: whether any series has data, and the oldest and newest data.
pub(super) async fn get_profile_stats(
    State(q): State<Arc<Querier>>,
    tenant: Tenant,
    r: Request,
) -> Response {
    unary(
        q,
        "get_profile_stats",
        r,
        |q, _: GetProfileStatsRequest| async move {
            let range = range_ms(0, 0)?;
            let series = read(&q, move |store| {
                typed::series(store, &tenant, None, &LabelSelector::default(), range)
            })
            .await?;
            let ms = |secs: u64| i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX);
            Ok(GetProfileStatsResponse {
                data_ingested: !series.is_empty(),
                oldest_profile_time: series.iter().map(|s| ms(s.first_seen)).min().unwrap_or(0),
                newest_profile_time: series.iter().map(|s| ms(s.last_seen)).max().unwrap_or(0),
            })
        },
    )
    .await
}

/// Answers a method this aggregator does not serve: Connect's `unimplemented` with `message`,
/// once a request of type `Req` has been read (a malformed one is refused as such).
async fn unserved<Req>(
    querier: Arc<Querier>,
    endpoint: &'static str,
    request: Request,
    message: &'static str,
) -> Response
where
    Req: Message + Default + DeserializeOwned,
{
    unary(querier, endpoint, request, |_, _: Req| async move {
        Err::<SelectMergeStacktracesResponse, _>(ConnectError::unimplemented(message))
    })
    .await
}

/// `SelectMergeSpanProfile`: the samples of the spans of `span_selector` (none selects
/// nothing, as in Pyroscope), as a flame graph (the default) or tree bytes.
pub(super) async fn select_merge_span_profile(
    State(q): State<Arc<Querier>>,
    tenant: Tenant,
    r: Request,
) -> Response {
    unary(
        q,
        "select_merge_span_profile",
        r,
        |q, req: SelectMergeSpanProfileRequest| async move {
            let mut selection = Selection::new(
                &req.profile_type_id,
                &req.label_selector,
                (req.start, req.end),
                None,
                &[],
                (&[], &[]),
            )?;
            selection.spans = Some(span_ids(&req.span_selector)?);
            let format = ProfileFormat::try_from(req.format).unwrap_or(ProfileFormat::Unspecified);
            if matches!(format, ProfileFormat::Dot | ProfileFormat::Pprof) {
                return Err(ConnectError::unimplemented(
                    "span profiles are served as a flame graph or tree bytes only",
                ));
            }
            let max_nodes = max_nodes(&q.config, req.max_nodes);
            let metrics = q.metrics.clone();
            let response = read(&q, move |store| {
                let (tree, series) = selection.merge(store, &tenant)?;
                metrics.merged("select_merge_span_profile", series.len(), tree.len());
                let mut response = SelectMergeSpanProfileResponse::default();
                match format {
                    ProfileFormat::Tree => response.tree = tree_bytes(&tree, max_nodes),
                    _ => response.flamegraph = Some(FlameGraph::from_tree(&tree, max_nodes)),
                }
                Ok(response)
            })
            .await?;
            Ok(response)
        },
    )
    .await
}

/// `SelectHeatmap`: not served (Pyroscope serves it from its v2 storage only).
///
/// This and the other unserved methods still take the request's tenant, so that a request
/// without one is refused here as on every route.
pub(super) async fn select_heatmap(
    State(q): State<Arc<Querier>>,
    _tenant: Tenant,
    r: Request,
) -> Response {
    unserved::<SelectHeatmapRequest>(q, "select_heatmap", r, "heatmaps are not served").await
}

/// `AnalyzeQuery`: not served.
pub(super) async fn analyze_query(
    State(q): State<Arc<Querier>>,
    _tenant: Tenant,
    r: Request,
) -> Response {
    unserved::<AnalyzeQueryRequest>(q, "analyze_query", r, "query analysis is not served").await
}

/// `settings.v1.SettingsService/Get`: Smolder keeps no per-tenant settings.
pub(super) async fn get_settings(
    State(q): State<Arc<Querier>>,
    _tenant: Tenant,
    r: Request,
) -> Response {
    unary(
        q,
        "get_settings",
        r,
        |_, _: GetSettingsRequest| async move { Ok(GetSettingsResponse::default()) },
    )
    .await
}
