//! Query: flame graphs, diffs, timelines and label listings over stored profiles, served the way
//! Pyroscope v0.37 serves them.
//!
//! Input: HTTP GET requests with Pyroscope's parameters. Output: flamebearer JSON
//! ([`FlamebearerProfile`](smolder_common::flamebearer::FlamebearerProfile)), folded text,
//! pprof, or JSON arrays of names. Caller: the router in `http.rs` mounts [`routes`], served by
//! a [`Querier`] that `app` builds: the store, [`QueryConfig`], the query metrics
//! (`metrics.rs`) and the tier's errors counter. Owns nothing else: every read goes to the
//! store's interface, on the blocking pool, since store reads are synchronous. Depends on
//! `store`, `metrics`, `api_error` and `tenant`.
//!
//! | route | module |
//! |---|---|
//! | `GET /render`, `/pyroscope/render` | `render.rs` (+ `timeline.rs`, `export.rs`) |
//! | `GET /render-diff`, `/pyroscope/render-diff` | `diff.rs` |
//! | `GET /labels`, `/label-names`, `/label-values`, `GET /api/apps` | `labels.rs` |
//! | `POST /querier.v1.QuerierService/*`, `/settings.v1.SettingsService/Get` (Connect, what Grafana speaks) | `grafana.rs` (+ `connect.rs` the protocol, `typed.rs` selections by profile type id) |
//!
//! Every store read runs on the blocking pool under the query limits ([`blocking`]): at most
//! `query.max-concurrent` at once (more wait, at most `query.max-queued`, past which 503 with
//! `Retry-After`), each within `query.timeout` from its arrival (504 past it) and matching at
//! most `query.max-series` series per read (400 past it). A read whose time is up, or whose
//! client went away (its handler dropped), is cancelled: the store stops merging at its next
//! series and the partial answer is dropped.
//!
//! (`DELETE /api/apps`, a write, is `admin`'s.) This file holds what the routes share: the
//! parameters (`query`/`name`, `from`/`until`, `maxNodes`), [`QueryError`] and how each error
//! answers and is counted.
//!
//! # Parameters shared by the routes
//!
//! - Times (`from`, `until`, `leftFrom`, ...) take every format of
//!   [`smolder_common::timestamp`]. `/render` and `/render-diff` default to `now-1h` and `now`;
//!   the listings default to all stored data (`from` = the epoch, `until` = now), as Pyroscope's
//!   listings ignore time altogether. `until` before `from` is a 400.
//! - An empty parameter (`from=`) is treated as absent, as Pyroscope does.
//! - `maxNodes` (or `max-nodes`; `maxNodes` wins when both are given) is the node budget: a
//!   positive integer, capped at `query.max-nodes-limit` (the answer then carries
//!   `Warning: 299 - "maxNodes N is above query.max-nodes-limit; L nodes used"`); 0 or a
//!   negative number asks for no truncation, which means the limit. Anything else is a 400. The
//!   JSON flame graphs always keep the budget (the default when none is asked); the `collapsed`
//!   and `pprof` exports are whole unless the request names one.
//! - `spanSelector` (on `/render`) is a comma-separated list of span ids, 16 hex digits each:
//!   the flame graph then holds only the samples that ran in those spans (span profiles,
//!   traces to profiles). A malformed id is a 400.

mod connect;
mod diff;
mod export;
mod grafana;
mod labels;
mod metrics;
mod render;
mod timeline;
mod typed;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::http::header::WARNING;
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::{Deserialize, Serialize};
use smolder_common::series;
use smolder_common::span::BadSpanId;
use smolder_common::{
    Aggregation, MatchOp, Matcher, ProfileMeta, Selector, SelectorError, Series, SeriesError,
    SpanId, TimeError, Tree,
};
use tokio::sync::Semaphore;

use crate::api_error::{ApiError, chain};
use crate::auth::{Access, Routes, Scope};
use crate::metrics::{Errors, Refused};
use crate::store::{BUCKET, ReadLimits, SeriesInfo, Store, StoreError, TimeRange, with_limits};
use crate::tenant::Tenant;

pub(crate) use self::metrics::QueryMetrics;

/// Limits and defaults of the query API.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct QueryConfig {
    /// Node budget of a flame graph when the request names none (`maxNodes`). Default 8192, as
    /// Pyroscope.
    pub max_nodes_default: usize,
    /// The largest node budget a request may ask for. Default 1 048 576, as Pyroscope.
    pub max_nodes_limit: usize,
    /// The most label values `groupBy` may split a render into (each is a timeline of up to
    /// 10 240 points). Default 1000.
    pub max_groups: usize,
    /// The most series one read of a query may match (a diff reads twice); more gets 400
    /// naming the limit, and the read stops as soon as it is passed. 0 means no limit.
    /// Default 100 000, the series a tenant may have active (`ingest`'s limit).
    pub max_series: usize,
    /// How long a query may take from its arrival, waiting for a slot included; past it the
    /// read is cancelled and the answer is 504. Default `30s`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub timeout: Duration,
    /// Store reads running at once, each on a thread of the blocking pool. Default 4: two per
    /// core of a 2-core machine, where merges are CPU-bound.
    pub max_concurrent: usize,
    /// Queries waiting for a slot at once; past it a query gets 503 with `Retry-After`.
    /// Default 64.
    pub max_queued: usize,
}

impl Default for QueryConfig {
    fn default() -> Self {
        QueryConfig {
            max_nodes_default: 8192,
            max_nodes_limit: 1 << 20,
            max_groups: 1000,
            max_series: 100_000,
            timeout: Duration::from_secs(30),
            max_concurrent: 4,
            max_queued: 64,
        }
    }
}

/// What the query handlers share: the store they read, their config, their metrics, and the
/// slots of the reads running.
pub(crate) struct Querier {
    store: Arc<dyn Store>,
    config: QueryConfig,
    metrics: QueryMetrics,
    errors: Errors,
    refused: Refused,
    /// One permit per read that may run at once.
    slots: Arc<Semaphore>,
    /// Queries waiting for a slot.
    queued: AtomicUsize,
}

impl Querier {
    /// A query path reading `store` under `config`.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        config: QueryConfig,
        metrics: QueryMetrics,
        errors: Errors,
        refused: Refused,
    ) -> Querier {
        Querier {
            slots: Arc::new(Semaphore::new(config.max_concurrent.max(1))),
            queued: AtomicUsize::new(0),
            store,
            config,
            metrics,
            errors,
            refused,
        }
    }
}

/// The query routes, served by `querier`, each for credentials with scope `read`.
pub(crate) fn routes(querier: Arc<Querier>) -> Routes {
    let read = Access::Scope(Scope::Read);
    Routes::new()
        .get("/render", read, render::handle)
        .get("/pyroscope/render", read, render::handle)
        .get("/render-diff", read, diff::handle)
        .get("/pyroscope/render-diff", read, diff::handle)
        .get("/labels", read, labels::names)
        .get("/label-names", read, labels::names)
        .get("/label-values", read, labels::values)
        .get("/api/apps", read, labels::apps)
        .merge(connect_routes())
        .with_state(querier)
}

/// The Connect routes of the query API Grafana speaks ([`grafana`]).
fn connect_routes() -> Routes<Arc<Querier>> {
    const SERVICE: &str = "/querier.v1.QuerierService";
    let read = Access::Scope(Scope::Read);
    let methods: [(&str, axum::routing::MethodRouter<Arc<Querier>>); 12] = [
        ("ProfileTypes", post(grafana::profile_types)),
        ("LabelNames", post(grafana::label_names)),
        ("LabelValues", post(grafana::label_values)),
        ("Series", post(grafana::series)),
        (
            "SelectMergeStacktraces",
            post(grafana::select_merge_stacktraces),
        ),
        ("SelectMergeProfile", post(grafana::select_merge_profile)),
        ("SelectSeries", post(grafana::select_series)),
        ("Diff", post(grafana::diff)),
        (
            "SelectMergeSpanProfile",
            post(grafana::select_merge_span_profile),
        ),
        ("GetProfileStats", post(grafana::get_profile_stats)),
        ("SelectHeatmap", post(grafana::select_heatmap)),
        ("AnalyzeQuery", post(grafana::analyze_query)),
    ];
    methods
        .into_iter()
        .fold(Routes::new(), |routes, (method, handler)| {
            routes.method(Method::POST, &format!("{SERVICE}/{method}"), read, handler)
        })
        .post(
            "/settings.v1.SettingsService/Get",
            read,
            grafana::get_settings,
        )
}

/// Why a query could not be answered. Every variant but [`QueryError::Store`] and
/// [`QueryError::Panicked`] is the client's mistake and answers 4xx with this message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum QueryError {
    /// A required parameter is absent or empty (`label` of `/label-values`, `leftQuery`...).
    #[error("missing parameter `{name}`")]
    MissingParameter {
        /// The parameter.
        name: &'static str,
    },
    /// `/render` got neither `query` nor `name`.
    #[error(
        "missing parameter `query` (a FlameQL selector such as app.cpu{{env=\"prod\"}}) or `name`"
    )]
    MissingSelector,
    /// The query string itself is not `key=value&...` (bad percent-encoding).
    #[error("malformed query string: {reason}")]
    MalformedQueryString {
        /// What axum's decoder said.
        reason: String,
    },
    /// A time parameter does not parse.
    #[error("invalid `{name}` {value:?}: {source}")]
    InvalidTime {
        /// The parameter.
        name: &'static str,
        /// What was sent.
        value: String,
        /// Why it does not parse.
        source: TimeError,
    },
    /// `until` is before `from`.
    #[error("`{until}` ({until_unix}) is before `{from}` ({from_unix})")]
    InvalidRange {
        /// The start parameter's name.
        from: &'static str,
        /// The end parameter's name.
        until: &'static str,
        /// The start, unix seconds.
        from_unix: i64,
        /// The end, unix seconds.
        until_unix: i64,
    },
    /// A FlameQL parameter (`query`, `leftQuery`, ...) does not parse.
    #[error("invalid `{name}`: {source}")]
    InvalidSelector {
        /// The parameter.
        name: &'static str,
        /// Why it does not parse.
        source: SelectorError,
    },
    /// The ingest-style `name` parameter does not parse.
    #[error("invalid `name`: {source}")]
    InvalidName {
        /// Why it does not parse.
        source: SeriesError,
    },
    /// `format` is not one the route serves.
    #[error("invalid `format` {value:?}: expected one of {expected}")]
    InvalidFormat {
        /// What was sent.
        value: String,
        /// The formats the route serves.
        expected: &'static str,
    },
    /// `maxNodes`/`max-nodes` is not an integer.
    #[error("invalid `{name}` {value:?}: expected an integer node budget")]
    InvalidMaxNodes {
        /// The parameter.
        name: &'static str,
        /// What was sent.
        value: String,
    },
    /// `groupBy` or `label` is not a label name.
    #[error("invalid `{name}` {value:?}: expected a label name of letters, digits, '_' and '.'")]
    InvalidLabelName {
        /// The parameter.
        name: &'static str,
        /// What was sent.
        value: String,
    },
    /// `groupBy` has more distinct values than `query.max-groups` allows.
    #[error("groupBy {label:?} has more than {limit} values (query.max-groups); narrow the query")]
    TooManyGroups {
        /// The label grouped by.
        label: String,
        /// The configured limit.
        limit: usize,
    },
    /// The two sides of a diff measure different things.
    #[error("cannot diff: left {what} ({left}) does not match right {what} ({right})")]
    Incompatible {
        /// `units` or `sample rate`.
        what: &'static str,
        /// The left side's value.
        left: String,
        /// The right side's value.
        right: String,
    },
    /// A profile type id (`profile_typeID`) is not `name:sample_type:sample_unit:period_type:period_unit`.
    #[error("invalid profile type: {source}")]
    InvalidProfileType {
        /// Why.
        source: smolder_common::profile_type::BadProfileTypeId,
    },
    /// A `SelectSeries` step that is negative or not a number.
    #[error("invalid step {step}: expected a number of seconds")]
    InvalidStep {
        /// The step sent.
        step: f64,
    },
    /// A span selector (`spanSelector`, `span_selector`) holds something other than span ids.
    #[error("invalid `{name}`: {source}")]
    InvalidSpanSelector {
        /// The parameter or field.
        name: &'static str,
        /// The first item that is not a span id.
        source: BadSpanId,
    },
    /// A read matched more series than `query.max-series`.
    #[error(
        "the query matches more than {limit} series (query.max-series); narrow its selector or time range"
    )]
    TooManySeries {
        /// The limit.
        limit: usize,
    },
    /// The query took longer than `query.timeout`; its read was cancelled.
    #[error(
        "the query took longer than {} s (query.timeout) and was stopped; narrow its selector or time range",
        limit.as_secs_f64()
    )]
    Timeout {
        /// The limit.
        limit: Duration,
    },
    /// `query.max-queued` queries are waiting for a slot already.
    #[error(
        "the aggregator is busy: {queued} queries are waiting (query.max-queued); retry shortly"
    )]
    Busy {
        /// The limit.
        queued: usize,
    },
    /// The store failed; logged once where the response is built.
    #[error("reading the store failed")]
    Store(#[from] StoreError),
    /// A blocking read panicked; a bug.
    #[error("a store read panicked")]
    Panicked,
}

impl QueryError {
    /// The `error_type` label of `smolder_aggregator_errors_total{stage="query"}`: one value per
    /// variant, so the label stays bounded.
    pub(super) fn error_type(&self) -> &'static str {
        match self {
            QueryError::MissingParameter { .. } | QueryError::MissingSelector => {
                "missing_parameter"
            }
            QueryError::MalformedQueryString { .. } => "malformed_query_string",
            QueryError::InvalidTime { .. } => "invalid_time",
            QueryError::InvalidRange { .. } => "invalid_range",
            QueryError::InvalidSelector { .. } | QueryError::InvalidName { .. } => {
                "invalid_selector"
            }
            QueryError::InvalidFormat { .. } => "invalid_format",
            QueryError::InvalidMaxNodes { .. } => "invalid_max_nodes",
            QueryError::InvalidLabelName { .. } => "invalid_label_name",
            QueryError::TooManyGroups { .. } => "too_many_groups",
            QueryError::Incompatible { .. } => "incompatible_diff",
            QueryError::InvalidProfileType { .. } => "invalid_profile_type",
            QueryError::InvalidStep { .. } => "invalid_step",
            QueryError::InvalidSpanSelector { .. } => "invalid_span_selector",
            QueryError::TooManySeries { .. } => "too_many_series",
            QueryError::Timeout { .. } => "timeout",
            QueryError::Busy { .. } => "busy",
            QueryError::Store(_) => "store",
            QueryError::Panicked => "panicked",
        }
    }

    /// The answer: 500 for our own failures, 504 past the timeout, 503 when busy, 400 for
    /// the rest.
    fn into_api_error(self) -> ApiError {
        match self {
            QueryError::Store(source) => ApiError::internal(chain(&source)),
            QueryError::Panicked => ApiError::internal(&self),
            QueryError::Timeout { .. } => {
                ApiError::new(StatusCode::GATEWAY_TIMEOUT, self.to_string())
            }
            QueryError::Busy { .. } => ApiError::unavailable(self.to_string(), BUSY_RETRY),
            other => ApiError::bad_request(other.to_string()),
        }
    }
}

/// Turns a handler's result, an answer and its format, into a response: an answer's duration
/// is recorded under `endpoint`, a failure counted.
fn respond(
    querier: &Querier,
    endpoint: &'static str,
    started: Instant,
    result: Result<(Response, &'static str), QueryError>,
) -> Response {
    match result {
        Ok((response, format)) => {
            querier.metrics.answered(endpoint, format, started);
            response
        }
        Err(err) => {
            querier.errors.inc("query", err.error_type());
            err.into_api_error().into_response()
        }
    }
}

/// The query string as the handlers take it: every pair in order, or why it does not decode.
type RawQuery = Result<Query<Vec<(String, String)>>, QueryRejection>;

/// The request's query parameters, with empty values treated as absent.
struct Params(HashMap<String, String>);

impl Params {
    /// Reads the extractor's result; a malformed query string is a client error like any other.
    /// Of a repeated parameter the first counts, as Go's `url.Values.Get` (and our ingest) read
    /// it.
    fn new(query: RawQuery) -> Result<Self, QueryError> {
        match query {
            Ok(Query(pairs)) => {
                let mut map = HashMap::new();
                for (name, value) in pairs {
                    map.entry(name).or_insert(value);
                }
                Ok(Params(map))
            }
            Err(rejection) => Err(QueryError::MalformedQueryString {
                reason: rejection.body_text(),
            }),
        }
    }

    /// The value of `name`, if present and not empty.
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// The value of `name`, which must be present.
    fn require(&self, name: &'static str) -> Result<&str, QueryError> {
        self.get(name).ok_or(QueryError::MissingParameter { name })
    }

    /// The time in `name`, or `default` when absent.
    fn time(
        &self,
        name: &'static str,
        now: SystemTime,
        default: SystemTime,
    ) -> Result<SystemTime, QueryError> {
        match self.get(name) {
            None => Ok(default),
            Some(value) => smolder_common::timestamp::parse(value, now).map_err(|source| {
                QueryError::InvalidTime {
                    name,
                    value: value.to_owned(),
                    source,
                }
            }),
        }
    }

    /// The range `[from, until)` in the parameters named so, with defaults for absent ends.
    fn range(
        &self,
        (from, until): (&'static str, &'static str),
        now: SystemTime,
        default_from: SystemTime,
    ) -> Result<TimeRange, QueryError> {
        let range = TimeRange {
            from: self.time(from, now, default_from)?,
            until: self.time(until, now, now)?,
        };
        if range.until < range.from {
            return Err(QueryError::InvalidRange {
                from,
                until,
                from_unix: unix_secs(range.from),
                until_unix: unix_secs(range.until),
            });
        }
        Ok(range)
    }

    /// The FlameQL selector in `name`, which must be present.
    fn selector(&self, name: &'static str) -> Result<Selector, QueryError> {
        Selector::parse(self.require(name)?)
            .map_err(|source| QueryError::InvalidSelector { name, source })
    }

    /// The node budget of `maxNodes` or `max-nodes`, or the configured default, with how it was
    /// chosen: asked for or not, and capped or not.
    /// `spanSelector`: the span ids, sorted; `None` when absent or empty.
    fn spans(&self) -> Result<Option<Vec<SpanId>>, QueryError> {
        let Some(text) = self.get("spanSelector") else {
            return Ok(None);
        };
        let spans = SpanId::parse_list(text).map_err(|source| QueryError::InvalidSpanSelector {
            name: "spanSelector",
            source,
        })?;
        Ok((!spans.is_empty()).then_some(spans))
    }

    fn node_budget(&self, config: &QueryConfig) -> Result<NodeBudget, QueryError> {
        let given = ["maxNodes", "max-nodes"]
            .into_iter()
            .find_map(|name| self.get(name).map(|value| (name, value)));
        let Some((name, value)) = given else {
            return Ok(NodeBudget {
                nodes: config.max_nodes_default.min(config.max_nodes_limit),
                asked: false,
                warning: None,
            });
        };
        let parsed: i64 = value
            .trim()
            .parse()
            .map_err(|_| QueryError::InvalidMaxNodes {
                name,
                value: value.to_owned(),
            })?;
        let limit = config.max_nodes_limit;
        let asked = usize::try_from(parsed).ok().filter(|&n| n > 0);
        let warning = asked.filter(|&n| n > limit).map(|_| {
            format!("299 - \"{name} {parsed} is above query.max-nodes-limit; {limit} nodes used\"")
        });
        Ok(NodeBudget {
            nodes: asked.map_or(limit, |n| n.min(limit)),
            asked: true,
            warning,
        })
    }
}

/// A request's node budget.
struct NodeBudget {
    /// The nodes a flame graph (or an export asked to) keeps.
    nodes: usize,
    /// Whether the request named a budget; exports are whole unless it did.
    asked: bool,
    /// A `Warning` header value when the request asked for more than `query.max-nodes-limit`.
    warning: Option<String>,
}

/// `response` with a `Warning: 299` header carrying `warning`, if any: what the answer changed
/// from what was asked, in a header, so that the body keeps Pyroscope's format.
fn with_warning(mut response: Response, warning: Option<String>) -> Response {
    if let Some(value) = warning.and_then(|w| HeaderValue::from_str(&w).ok()) {
        response.headers_mut().insert(WARNING, value);
    }
    response
}

/// The default start of `/render` ranges: an hour before `now`.
fn an_hour_before(now: SystemTime) -> SystemTime {
    now.checked_sub(Duration::from_secs(3600))
        .unwrap_or(UNIX_EPOCH)
}

/// Unix seconds of `t`, negative before the epoch.
fn unix_secs(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

/// A selector for Pyroscope's ingest-style `name` (`app.cpu{env=prod}`): the app's series that
/// carry every given label with exactly that value.
fn selector_from_key(key: &str) -> Result<Selector, QueryError> {
    let series = Series::parse(key).map_err(|source| QueryError::InvalidName { source })?;
    let matchers = series
        .labels()
        .iter()
        .map(|(name, value)| Matcher::new(name, MatchOp::Equal, value))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| QueryError::InvalidSelector {
            name: "name",
            source,
        })?;
    Selector::new(series.app(), matchers).map_err(|source| QueryError::InvalidSelector {
        name: "name",
        source,
    })
}

/// Checks that `value` of parameter `name` is a label name by the rule series labels follow
/// ([`series::is_label_name`]); an empty parameter never gets here, it reads as absent.
fn label_name(name: &'static str, value: &str) -> Result<String, QueryError> {
    if value != series::NAME_LABEL && series::is_label_name(value) {
        Ok(value.to_owned())
    } else {
        Err(QueryError::InvalidLabelName {
            name,
            value: value.to_owned(),
        })
    }
}

/// How long a query refused for a full queue is asked to wait.
const BUSY_RETRY: Duration = Duration::from_secs(1);

/// Runs a store read on the blocking pool under the query limits: it waits for one of
/// `query.max-concurrent` slots (refused past `query.max-queued` waiting), must be done within
/// `query.timeout` of the call, and matches at most `query.max-series` series. A read past its
/// time, or whose caller dropped this future (the client went away), is cancelled: the store
/// stops at its next series, and what it had merged is dropped. The slot is held until the
/// read has stopped, so that a cancelled read still counts while it winds down.
///
/// # Errors
///
/// What `read` answers; [`QueryError::Busy`], [`QueryError::Timeout`],
/// [`QueryError::TooManySeries`], or [`QueryError::Panicked`].
///
/// # Cancel safety
///
/// Dropping it cancels the read (counted as `cancelled`).
async fn blocking<T: Send + 'static>(
    querier: &Querier,
    read: impl FnOnce(&dyn Store) -> Result<T, QueryError> + Send + 'static,
) -> Result<T, QueryError> {
    let config = &querier.config;
    let deadline = tokio::time::Instant::now() + config.timeout;
    let limits = ReadLimits::new(config.max_series);
    let mut watch = Watch {
        limits: limits.clone(),
        refused: &querier.refused,
        done: false,
    };
    let slot = {
        let waiting = querier.queued.fetch_add(1, Ordering::AcqRel);
        let _queued = Queued(&querier.queued, &querier.metrics);
        querier.metrics.queued.inc();
        if waiting >= config.max_queued {
            watch.done = true;
            querier.refused.inc("query", "busy");
            return Err(QueryError::Busy {
                queued: config.max_queued,
            });
        }
        let acquire = Arc::clone(&querier.slots).acquire_owned();
        match tokio::time::timeout_at(deadline, acquire).await {
            Ok(slot) => slot.expect("the query slots are never closed"),
            Err(_) => {
                watch.done = true;
                querier.refused.inc("query", "timeout");
                return Err(QueryError::Timeout {
                    limit: config.timeout,
                });
            }
        }
    };
    let store = Arc::clone(&querier.store);
    let running = querier.metrics.running.clone();
    let task_limits = limits.clone();
    let task = tokio::task::spawn_blocking(move || {
        // Counted down when the read ends, by a panic too.
        struct Running(prometheus::IntGauge);
        impl Drop for Running {
            fn drop(&mut self) {
                self.0.dec();
            }
        }
        running.inc();
        let _running = Running(running);
        let answer = with_limits(&task_limits, || read(store.as_ref()));
        drop(slot);
        answer
    });
    let outcome = tokio::time::timeout_at(deadline, task).await;
    watch.done = true;
    match outcome {
        Err(_) => {
            limits.cancel();
            querier.refused.inc("query", "timeout");
            Err(QueryError::Timeout {
                limit: config.timeout,
            })
        }
        Ok(Err(_)) => Err(QueryError::Panicked),
        Ok(Ok(_)) if limits.exceeded() => {
            querier.refused.inc("query", "series");
            Err(QueryError::TooManySeries {
                limit: config.max_series,
            })
        }
        Ok(Ok(answer)) => answer,
    }
}

/// Cancels a read whose future is dropped before it is done: its client went away.
struct Watch<'q> {
    limits: ReadLimits,
    refused: &'q Refused,
    done: bool,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.limits.cancel();
            self.refused.inc("query", "cancelled");
        }
    }
}

/// One query waiting for a slot, counted until it has one or gives up.
struct Queued<'q>(&'q AtomicUsize, &'q QueryMetrics);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
        self.1.queued.dec();
    }
}

/// The metadata of a query that matched nothing: empty, as Pyroscope's empty answer.
fn no_meta() -> ProfileMeta {
    ProfileMeta {
        spy_name: String::new(),
        sample_rate: 0,
        units: String::new(),
        aggregation: Aggregation::Sum,
    }
}

/// The matching series of one side of a query, merged over a range.
struct Selected {
    /// The merged tree; `average` series are averaged over their writes.
    tree: Tree,
    /// The metadata of the most recently written series, as Pyroscope takes the last one;
    /// `None` when nothing matched.
    meta: Option<ProfileMeta>,
    /// The series that matched.
    series: Vec<SeriesInfo>,
}

/// Selects and merges the series `selector` matches over `range`, in 10 s buckets: every
/// sample, or with `spans` only those of these spans. Blocking.
fn select_and_merge(
    store: &dyn Store,
    tenant: &Tenant,
    selector: &Selector,
    range: TimeRange,
    spans: Option<&[SpanId]>,
) -> Result<Selected, QueryError> {
    let (tree, series) = merge_trees(store, tenant, selector, range, spans)?;
    let meta = series
        .iter()
        .max_by_key(|info| info.last_seen)
        .map(|info| info.meta.clone());
    Ok(Selected { tree, meta, series })
}

/// The merged tree of the series `selector` matches over `range` (of every sample, or with
/// `spans` of those spans' samples), and the series merged. Blocking.
///
/// Pyroscope divides by the number of writes when the (last) series is `average`; here the
/// `average` series are merged and divided apart from the `sum` ones, so that mixing the two
/// (which Pyroscope does not reconcile) still gives each its meaning.
fn merge_trees(
    store: &dyn Store,
    tenant: &Tenant,
    selector: &Selector,
    range: TimeRange,
    spans: Option<&[SpanId]>,
) -> Result<(Tree, Vec<SeriesInfo>), QueryError> {
    let merged = match spans {
        None => store.merge(tenant, selector, range, BUCKET)?,
        Some(spans) => store.merge_spans(tenant, selector, range, spans)?,
    };
    let mut tree = merged.sum.tree;
    let mut average = merged.average;
    if average.writes > 1 {
        average.tree.scale(1, average.writes);
    }
    tree.merge(&average.tree);
    Ok((tree, merged.series))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> Params {
        Params(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn max_nodes_defaults_caps_and_rejects() {
        let config = QueryConfig {
            max_nodes_default: 100,
            max_nodes_limit: 1000,
            ..QueryConfig::default()
        };
        assert_eq!(
            params(&[]).node_budget(&config).ok().map(|b| b.nodes),
            Some(100)
        );
        assert_eq!(
            params(&[("max-nodes", "7")])
                .node_budget(&config)
                .ok()
                .map(|b| b.nodes),
            Some(7)
        );
        assert_eq!(
            params(&[("maxNodes", "5"), ("max-nodes", "7")])
                .node_budget(&config)
                .ok()
                .map(|b| b.nodes),
            Some(5)
        );
        assert_eq!(
            params(&[("maxNodes", "5000")])
                .node_budget(&config)
                .ok()
                .map(|b| b.nodes),
            Some(1000)
        );
        assert_eq!(
            params(&[("maxNodes", "-1")])
                .node_budget(&config)
                .ok()
                .map(|b| b.nodes),
            Some(1000)
        );
        let capped = params(&[("maxNodes", "5000")])
            .node_budget(&config)
            .unwrap();
        assert_eq!(
            capped.warning.as_deref(),
            Some("299 - \"maxNodes 5000 is above query.max-nodes-limit; 1000 nodes used\"")
        );
        assert!(capped.asked);
        let unasked = params(&[]).node_budget(&config).unwrap();
        assert!(!unasked.asked && unasked.warning.is_none());
        assert!(
            params(&[("maxNodes", "0")])
                .node_budget(&config)
                .unwrap()
                .warning
                .is_none()
        );
        assert!(matches!(
            params(&[("maxNodes", "lots")])
                .node_budget(&config)
                .map(|b| b.nodes),
            Err(QueryError::InvalidMaxNodes {
                name: "maxNodes",
                ..
            })
        ));
    }

    #[test]
    fn the_first_of_a_repeated_parameter_counts() {
        let pairs = [("from", "now-2h"), ("from", "now-1h"), ("query", "")];
        let query = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let params = Params::new(Ok(Query(query))).expect("decodes");
        assert_eq!(params.get("from"), Some("now-2h"));
        assert_eq!(params.get("query"), None, "empty is absent");
    }

    #[test]
    fn name_keys_become_equality_selectors() {
        let selector = selector_from_key("app.cpu{env=prod,region=eu}").expect("parses");
        assert_eq!(selector.to_string(), r#"app.cpu{env="prod", region="eu"}"#);
        assert!(matches!(
            selector_from_key("app.cpu{env"),
            Err(QueryError::InvalidName { .. })
        ));
    }

    #[test]
    fn inverted_ranges_are_rejected() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let err = params(&[("from", "now"), ("until", "now-1h")])
            .range(("from", "until"), now, an_hour_before(now))
            .expect_err("inverted");
        assert!(err.to_string().contains("`until`"), "{err}");
    }
}
