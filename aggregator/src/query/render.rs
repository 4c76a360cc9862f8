//! `GET /render` (and `/pyroscope/render`): one flame graph of every series a selector matches,
//! merged over a range.
//!
//! | param | meaning |
//! |---|---|
//! | `query` | FlameQL selector, `app.cpu{env="prod"}`; or Pyroscope v1's `<profile type id>{selector}` (`process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name="app"}`), answered in the id's units with v1's metadata (see `typed_json`) |
//! | `name` | instead of `query`: an ingest-style key `app.cpu{env=prod}`, meaning the app's series with every given label equal (`query` wins when both are given) |
//! | `from`, `until` | the range, default `now-1h` and `now` |
//! | `format` | `json` (default), `collapsed` (folded text download), `pprof` (gzipped pprof download) |
//! | `maxNodes`, `max-nodes` | node budget: of the JSON flame graph (default `query.max-nodes-default`), and of the `collapsed` and `pprof` exports when given (whole otherwise); above `query.max-nodes-limit` it is capped, with a `Warning` header (see the module docs of `query`) |
//! | `groupBy` | a label name: `groups` gets one timeline per value of it |
//! | `spanSelector` | span ids, 16 hex digits each, comma-separated: the flame graph (and exports) of the samples that ran in those spans only (span profiles, as a trace's "profiles for this span" link opens them); the timeline still shows the whole selection, the activity the spans ran in |
//!
//! The JSON is Pyroscope v0.37's: `version`, `flamebearer`, `metadata` (`format`, `spyName`,
//! `sampleRate`, `units`, `name` = `"<app> <RFC 3339 start>"`, `appName`, `startTime`,
//! `endTime`, `query`, `maxNodes`), `timeline`, `groups`, `heatmap: null`, `annotations: []`.
//! Metadata comes from the matching series written most recently; when nothing matches the
//! answer is an empty flame graph with empty metadata (spy `""`, rate 0, units `""`) and a
//! timeline of zeros, as Pyroscope answers.
//!
//! The flame graph of `average` series (in-use memory, goroutines) is their merged tree divided
//! by the number of writes merged, as Pyroscope divides it; their timeline, like Pyroscope's,
//! shows the per-step sums of totals. Store buckets are read whole, so a range that cuts a 10 s
//! bucket includes all of it, where Pyroscope scaled a partly covered bucket down.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use smolder_common::flamebearer::{FlamebearerProfile, Metadata, Timeline};
use smolder_common::{ProfileTypeId, Selector, SpanId};

use super::typed::{self, LabelSelector};
use super::{
    NodeBudget, Params, Querier, QueryConfig, QueryError, RawQuery, an_hour_before, blocking,
    export, label_name, no_meta, respond, select_and_merge, selector_from_key, timeline, unix_secs,
    with_warning,
};
use crate::store::TimeRange;
use crate::tenant::Tenant;

/// What `/render` can answer with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Json,
    Collapsed,
    Pprof,
}

impl Format {
    /// The `format` label of `smolder_aggregator_query_duration_seconds`.
    fn label(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Collapsed => "collapsed",
            Format::Pprof => "pprof",
        }
    }

    fn parse(value: Option<&str>) -> Result<Format, QueryError> {
        match value {
            None | Some("json") => Ok(Format::Json),
            Some("collapsed") => Ok(Format::Collapsed),
            Some("pprof") => Ok(Format::Pprof),
            Some(other) => Err(QueryError::InvalidFormat {
                value: other.to_owned(),
                expected: "json, collapsed, pprof",
            }),
        }
    }
}

/// A parsed `/render` request.
struct Request {
    selector: Selector,
    range: TimeRange,
    format: Format,
    budget: NodeBudget,
    group_by: Option<String>,
    /// Only the samples of these spans (`spanSelector`).
    spans: Option<Vec<SpanId>>,
}

impl Request {
    fn parse(
        params: &Params,
        config: &QueryConfig,
        now: SystemTime,
    ) -> Result<Request, QueryError> {
        let selector = match (params.get("query"), params.get("name")) {
            (Some(_), _) => params.selector("query")?,
            (None, Some(key)) => selector_from_key(key)?,
            (None, None) => return Err(QueryError::MissingSelector),
        };
        Ok(Request {
            selector,
            range: params.range(("from", "until"), now, an_hour_before(now))?,
            format: Format::parse(params.get("format"))?,
            budget: params.node_budget(config)?,
            group_by: params
                .get("groupBy")
                .map(|value| label_name("groupBy", value))
                .transpose()?,
            spans: params.spans()?,
        })
    }
}

/// The handler.
pub(super) async fn handle(
    State(querier): State<Arc<Querier>>,
    tenant: Tenant,
    query: RawQuery,
) -> Response {
    let started = Instant::now();
    let result = render(&querier, tenant, query).await;
    respond(&querier, "render", started, result)
}

async fn render(
    querier: &Querier,
    tenant: Tenant,
    query: RawQuery,
) -> Result<(Response, &'static str), QueryError> {
    let params = Params::new(query)?;
    if let Some(query) = params.get("query").filter(|q| is_typed(q)) {
        let query = query.to_owned();
        return typed_json(querier, tenant, &params, &query).await;
    }
    let request = Request::parse(&params, &querier.config, SystemTime::now())?;
    let app = request.selector.app().to_owned();
    let name = export::profile_name(&app, request.range.from);
    let format = request.format;
    let metrics = querier.metrics.clone();
    let warning = request.budget.warning.clone();
    // Exports are whole unless the request names a budget.
    let export_nodes = request.budget.asked.then_some(request.budget.nodes);
    let response = match format {
        // Exports of up to a million nodes are CPU work: they are built on the blocking pool.
        Format::Collapsed => {
            let (selector, range, spans) = (request.selector, request.range, request.spans);
            blocking(querier, move |store| {
                let mut selected =
                    select_and_merge(store, &tenant, &selector, range, spans.as_deref())?;
                metrics.merged("render", selected.series.len(), selected.tree.len());
                if let Some(nodes) = export_nodes {
                    selected.tree = selected.tree.truncate(nodes);
                }
                Ok(export::collapsed(&selected.tree, &name))
            })
            .await?
        }
        Format::Pprof => {
            let (selector, range, spans) = (request.selector, request.range, request.spans);
            blocking(querier, move |store| {
                let mut selected =
                    select_and_merge(store, &tenant, &selector, range, spans.as_deref())?;
                metrics.merged("render", selected.series.len(), selected.tree.len());
                if let Some(nodes) = export_nodes {
                    selected.tree = selected.tree.truncate(nodes);
                }
                Ok(export::pprof(
                    &selected.tree,
                    &app,
                    selected.meta.as_ref(),
                    (range.from, range.until),
                    &name,
                ))
            })
            .await?
        }
        Format::Json => Json(json(querier, tenant, request, app, name).await?).into_response(),
    };
    Ok((with_warning(response, warning), format.label()))
}

/// Whether `query` is Pyroscope v1's `<profile type id>{selector}` rather than FlameQL: its
/// name part holds the id's `:`s, which no app name does.
pub(super) fn is_typed(query: &str) -> bool {
    query
        .split('{')
        .next()
        .is_some_and(|name| name.contains(':'))
}

/// A v1 query, `<profile type id>{selector}`, in parameter `param`.
pub(super) fn typed_query(
    param: &'static str,
    query: &str,
) -> Result<(ProfileTypeId, LabelSelector), QueryError> {
    let (id, selector) = query.split_at(query.find('{').unwrap_or(query.len()));
    let id: ProfileTypeId = id
        .trim()
        .parse()
        .map_err(|source| QueryError::InvalidProfileType { source })?;
    Ok((id, LabelSelector::parse(param, selector)?))
}

/// The metadata Pyroscope v1 gives a flame graph of `id` (`ExportToFlamebearer`): CPU is
/// `samples` at 10^9 per second, since its values are nanoseconds; object counts `objects`;
/// everything else its sample unit; the name is the sample type.
pub(super) fn typed_metadata(id: &ProfileTypeId) -> Metadata {
    let (units, sample_rate) = match id.sample_type.as_str() {
        "cpu" => ("samples", 1_000_000_000),
        "inuse_objects" | "alloc_objects" | "goroutine" | "samples" => ("objects", 100),
        _ => (id.sample_unit.as_str(), 100),
    };
    Metadata {
        spy_name: String::new(),
        sample_rate,
        units: units.to_owned(),
        name: id.sample_type.clone(),
        ..Metadata::default()
    }
}

/// `/pyroscope/render` of a v1 query, `process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name="api"}`,
/// as the Profiles Drilldown app sends it: the flame graph and timeline in the id's units, with
/// Pyroscope v1's metadata (`units` and `sampleRate` as its `ExportToFlamebearer` writes them:
/// CPU is `samples` at 10^9 per second, since values are nanoseconds). `format` is `json` only.
async fn typed_json(
    querier: &Querier,
    tenant: Tenant,
    params: &Params,
    query: &str,
) -> Result<(Response, &'static str), QueryError> {
    let (id, labels) = typed_query("query", query)?;
    let now = SystemTime::now();
    let range = params.range(("from", "until"), now, an_hour_before(now))?;
    let spans = params.spans()?;
    match params.get("format") {
        None | Some("json") => {}
        Some(other) => {
            return Err(QueryError::InvalidFormat {
                value: other.to_owned(),
                expected: "json",
            });
        }
    }
    let budget = params.node_budget(&querier.config)?;
    let max_nodes = budget.nodes;
    let metrics = querier.metrics.clone();
    let profile = blocking(querier, move |store| {
        let (tree, series) = typed::merge(store, &tenant, &id, &labels, range, spans.as_deref())?;
        metrics.merged("render", series.len(), tree.len());
        let step = timeline::step_for_range(range);
        let mut samples: Vec<u64> = Vec::new();
        let mut start = 0;
        for line in typed::timelines(store, &tenant, &id, &labels, range, step)? {
            start = line.start;
            if samples.len() < line.totals.len() {
                samples.resize(line.totals.len(), 0);
            }
            for (sum, total) in samples.iter_mut().zip(line.totals) {
                *sum = sum.saturating_add(total);
            }
        }
        let metadata = typed_metadata(&id);
        let timeline = Timeline {
            start_time: i64::try_from(start).unwrap_or(i64::MAX),
            samples,
            duration_delta: i64::try_from(step).unwrap_or(i64::MAX),
            watermarks: Default::default(),
        };
        let mut profile = FlamebearerProfile::single(&tree, max_nodes, metadata);
        profile.groups = Some([("*".to_owned(), timeline.clone())].into());
        profile.timeline = Some(timeline);
        Ok(profile)
    })
    .await?;
    Ok((
        with_warning(Json(profile).into_response(), budget.warning),
        "json",
    ))
}

/// The flamebearer JSON of a request.
async fn json(
    querier: &Querier,
    tenant: Tenant,
    request: Request,
    app: String,
    name: String,
) -> Result<FlamebearerProfile, QueryError> {
    let Request {
        selector,
        range,
        budget,
        group_by,
        spans,
        ..
    } = request;
    let max_nodes = budget.nodes;
    let query = selector.to_string();
    let max_groups = querier.config.max_groups;
    let metrics = querier.metrics.clone();
    // Merging, grouping and laying out up to a million nodes is CPU work: all of it runs on the
    // blocking pool, never on the runtime's workers.
    let profile = blocking(querier, move |store| {
        // Too many groups is refused from the series list, before any tree is merged.
        if let Some(label) = group_by.as_deref() {
            let series = store.series(&tenant, &selector, range)?;
            timeline::check_groups(&series, label, max_groups)?;
        }
        let selected = select_and_merge(store, &tenant, &selector, range, spans.as_deref())?;
        metrics.merged("render", selected.series.len(), selected.tree.len());
        let step = timeline::step_for_range(range);
        let (timeline, groups) =
            timeline::read(store, &tenant, &selector, range, step, group_by.as_deref())?;
        let meta = selected.meta.unwrap_or_else(no_meta);
        let metadata = Metadata {
            spy_name: meta.spy_name,
            sample_rate: meta.sample_rate,
            units: meta.units,
            name,
            app_name: Some(app),
            start_time: Some(unix_secs(range.from)),
            end_time: Some(unix_secs(range.until)),
            query: Some(query),
            max_nodes: Some(u64::try_from(max_nodes).unwrap_or(u64::MAX)),
            ..Metadata::default()
        };
        let mut profile = FlamebearerProfile::single(&selected.tree, max_nodes, metadata);
        profile.timeline = Some(timeline);
        profile.groups = Some(groups);
        profile.annotations = Some(Vec::new());
        Ok(profile)
    })
    .await?;
    Ok(profile)
}
