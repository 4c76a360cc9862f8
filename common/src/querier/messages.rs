//! `querier.v1`: the requests and responses of `QuerierService`
//! (`grafana/pyroscope:api/querier/v1/querier.proto`). Field numbers are the protocol.
//!
//! Left out, because Smolder serves nothing for them and prost and serde skip unknown fields:
//! the experimental `async` fields of `SelectMergeStacktraces` (9 in the request, 4 in the
//! response).

use serde::{Deserialize, Serialize};

use super::types::{
    ExemplarType, HeatmapSeries, Labels, ProfileType, Series, StackTraceSelector,
    TimeSeriesAggregationType,
};
use crate::pprof::proto::Profile as PprofProfileMessage;
use crate::protojson::{self, ProtoEnum};

/// `ProfileTypes`: the profile types with data in a time range.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProfileTypesRequest {
    /// Milliseconds since the Unix epoch; 0 for no bound.
    #[prost(int64, tag = "1")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub start: i64,
    /// Milliseconds since the Unix epoch; 0 for no bound.
    #[prost(int64, tag = "2")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub end: i64,
}

/// The answer to `ProfileTypes`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProfileTypesResponse {
    /// The profile types, sorted by id.
    #[prost(message, repeated, tag = "1")]
    #[serde(alias = "profile_types", deserialize_with = "protojson::nullable")]
    pub profile_types: Vec<ProfileType>,
}

/// `Series`: the label sets of the series matching the selectors.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SeriesRequest {
    /// Label selectors; a series matching any of them counts.
    #[prost(string, repeated, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub matchers: Vec<String>,
    /// The labels to return; empty returns every label.
    #[prost(string, repeated, tag = "2")]
    #[serde(alias = "label_names", deserialize_with = "protojson::nullable")]
    pub label_names: Vec<String>,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "3")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub start: i64,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "4")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub end: i64,
}

/// The answer to `Series`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SeriesResponse {
    /// One label set per series.
    #[prost(message, repeated, tag = "2")]
    #[serde(alias = "labels_set", deserialize_with = "protojson::nullable")]
    pub labels_set: Vec<Labels>,
}

/// The form of a merged profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ProfileFormat {
    /// Not said: a flame graph.
    Unspecified = 0,
    /// A flame graph (`FlameGraph`).
    Flamegraph = 1,
    /// Pyroscope's tree bytes.
    Tree = 2,
    /// A Graphviz graph.
    Dot = 3,
    /// A pprof profile.
    Pprof = 4,
}

impl ProtoEnum for ProfileFormat {
    const VALUES: &'static [(&'static str, i32)] = &[
        ("PROFILE_FORMAT_UNSPECIFIED", 0),
        ("PROFILE_FORMAT_FLAMEGRAPH", 1),
        ("PROFILE_FORMAT_TREE", 2),
        ("PROFILE_FORMAT_DOT", 3),
        ("PROFILE_FORMAT_PPROF", 4),
    ];
}

/// `SelectMergeStacktraces`: the merged stacks of the series matching a selector.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SelectMergeStacktracesRequest {
    /// The profile type id.
    #[prost(string, tag = "1")]
    #[serde(
        rename = "profileTypeID",
        alias = "profile_typeID",
        deserialize_with = "protojson::nullable"
    )]
    pub profile_type_id: String,
    /// A label selector, `{service_name="api"}`.
    #[prost(string, tag = "2")]
    #[serde(alias = "label_selector", deserialize_with = "protojson::nullable")]
    pub label_selector: String,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "3")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub start: i64,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "4")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub end: i64,
    /// The node budget; unset for the server's default.
    #[prost(int64, optional, tag = "5")]
    #[serde(
        alias = "max_nodes",
        skip_serializing_if = "Option::is_none",
        serialize_with = "protojson::optional_as_string",
        deserialize_with = "protojson::optional_integer"
    )]
    pub max_nodes: Option<i64>,
    /// The form of the answer.
    #[prost(enumeration = "ProfileFormat", tag = "6")]
    #[serde(
        serialize_with = "protojson::enum_name::<ProfileFormat, _>",
        deserialize_with = "protojson::enumeration::<ProfileFormat, _>"
    )]
    pub format: i32,
    /// Only stacks starting with these frames.
    #[prost(message, optional, tag = "7")]
    #[serde(
        alias = "stack_trace_selector",
        skip_serializing_if = "Option::is_none"
    )]
    pub stack_trace_selector: Option<StackTraceSelector>,
    /// Only these individual profiles.
    #[prost(string, repeated, tag = "8")]
    #[serde(
        alias = "profile_id_selector",
        deserialize_with = "protojson::nullable"
    )]
    pub profile_id_selector: Vec<String>,
    /// Only samples of these traces (32 hex digits each).
    #[prost(string, repeated, tag = "10")]
    #[serde(alias = "trace_id_selector", deserialize_with = "protojson::nullable")]
    pub trace_id_selector: Vec<String>,
    /// Only samples of these spans (16 hex digits each).
    #[prost(string, repeated, tag = "11")]
    #[serde(alias = "span_selector", deserialize_with = "protojson::nullable")]
    pub span_selector: Vec<String>,
}

/// The answer to `SelectMergeStacktraces`: one of its fields, by the request's format.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SelectMergeStacktracesResponse {
    /// The flame graph.
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flamegraph: Option<FlameGraph>,
    /// Pyroscope's tree bytes ([`tree_bytes`](super::tree_bytes)).
    #[prost(bytes = "vec", tag = "2")]
    #[serde(with = "protojson::base64")]
    pub tree: Vec<u8>,
    /// A Graphviz graph.
    #[prost(string, tag = "3")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub dot: String,
    /// The pprof profile.
    #[prost(message, optional, tag = "5")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pprof: Option<PprofProfile>,
}

/// A pprof profile as an answer.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PprofProfile {
    /// The profile.
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<PprofProfileMessage>,
}

/// `SelectMergeSpanProfile`: the merged stacks of the given spans.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SelectMergeSpanProfileRequest {
    /// The profile type id.
    #[prost(string, tag = "1")]
    #[serde(
        rename = "profileTypeID",
        alias = "profile_typeID",
        deserialize_with = "protojson::nullable"
    )]
    pub profile_type_id: String,
    /// A label selector.
    #[prost(string, tag = "2")]
    #[serde(alias = "label_selector", deserialize_with = "protojson::nullable")]
    pub label_selector: String,
    /// The span ids, 16 hex digits each.
    #[prost(string, repeated, tag = "3")]
    #[serde(alias = "span_selector", deserialize_with = "protojson::nullable")]
    pub span_selector: Vec<String>,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "4")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub start: i64,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "5")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub end: i64,
    /// The node budget; unset for the server's default.
    #[prost(int64, optional, tag = "6")]
    #[serde(
        alias = "max_nodes",
        skip_serializing_if = "Option::is_none",
        serialize_with = "protojson::optional_as_string",
        deserialize_with = "protojson::optional_integer"
    )]
    pub max_nodes: Option<i64>,
    /// The form of the answer: flame graph or tree.
    #[prost(enumeration = "ProfileFormat", tag = "7")]
    #[serde(
        serialize_with = "protojson::enum_name::<ProfileFormat, _>",
        deserialize_with = "protojson::enumeration::<ProfileFormat, _>"
    )]
    pub format: i32,
}

/// The answer to `SelectMergeSpanProfile`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SelectMergeSpanProfileResponse {
    /// The flame graph.
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flamegraph: Option<FlameGraph>,
    /// Pyroscope's tree bytes.
    #[prost(bytes = "vec", tag = "2")]
    #[serde(with = "protojson::base64")]
    pub tree: Vec<u8>,
}

/// `Diff`: two selections compared.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DiffRequest {
    /// The baseline; its format is ignored.
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub left: Option<SelectMergeStacktracesRequest>,
    /// The comparison; its format is ignored.
    #[prost(message, optional, tag = "2")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub right: Option<SelectMergeStacktracesRequest>,
}

/// The answer to `Diff`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DiffResponse {
    /// The diff flame graph.
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flamegraph: Option<FlameGraphDiff>,
}

/// A flame graph: the flamebearer layout of [`flamebearer`](crate::flamebearer), four values
/// per bar (`[x delta, total, self, name index]`), `names[0]` = `"total"`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct FlameGraph {
    /// Frame names.
    #[prost(string, repeated, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub names: Vec<String>,
    /// Bars per depth.
    #[prost(message, repeated, tag = "2")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub levels: Vec<Level>,
    /// The root's total.
    #[prost(int64, tag = "3")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub total: i64,
    /// The largest self value shown.
    #[prost(int64, tag = "4")]
    #[serde(
        alias = "max_self",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub max_self: i64,
}

/// A diff flame graph: seven values per bar (`[xL, totalL, selfL, xR, totalR, selfR, name]`).
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct FlameGraphDiff {
    /// Frame names.
    #[prost(string, repeated, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub names: Vec<String>,
    /// Bars per depth.
    #[prost(message, repeated, tag = "2")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub levels: Vec<Level>,
    /// Both roots' totals added.
    #[prost(int64, tag = "3")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub total: i64,
    /// The largest self value shown, either side.
    #[prost(int64, tag = "4")]
    #[serde(
        alias = "max_self",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub max_self: i64,
    /// The left root's total.
    #[prost(int64, tag = "5")]
    #[serde(
        rename = "leftTicks",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub left_ticks: i64,
    /// The right root's total.
    #[prost(int64, tag = "6")]
    #[serde(
        rename = "rightTicks",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub right_ticks: i64,
}

/// One depth of a flame graph.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Level {
    /// The bars' values, flattened.
    #[prost(int64, repeated, tag = "1")]
    #[serde(
        serialize_with = "protojson::as_strings",
        deserialize_with = "protojson::integers"
    )]
    pub values: Vec<i64>,
}

/// `SelectMergeProfile`: the merged stacks as pprof.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SelectMergeProfileRequest {
    /// The profile type id.
    #[prost(string, tag = "1")]
    #[serde(
        rename = "profileTypeID",
        alias = "profile_typeID",
        deserialize_with = "protojson::nullable"
    )]
    pub profile_type_id: String,
    /// A label selector.
    #[prost(string, tag = "2")]
    #[serde(alias = "label_selector", deserialize_with = "protojson::nullable")]
    pub label_selector: String,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "3")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub start: i64,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "4")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub end: i64,
    /// The node budget; unset for no truncation.
    #[prost(int64, optional, tag = "5")]
    #[serde(
        alias = "max_nodes",
        skip_serializing_if = "Option::is_none",
        serialize_with = "protojson::optional_as_string",
        deserialize_with = "protojson::optional_integer"
    )]
    pub max_nodes: Option<i64>,
    /// Only stacks starting with these frames.
    #[prost(message, optional, tag = "6")]
    #[serde(
        alias = "stack_trace_selector",
        skip_serializing_if = "Option::is_none"
    )]
    pub stack_trace_selector: Option<StackTraceSelector>,
    /// Only these individual profiles.
    #[prost(string, repeated, tag = "7")]
    #[serde(
        alias = "profile_id_selector",
        deserialize_with = "protojson::nullable"
    )]
    pub profile_id_selector: Vec<String>,
    /// Only samples of these traces.
    #[prost(string, repeated, tag = "8")]
    #[serde(alias = "trace_id_selector", deserialize_with = "protojson::nullable")]
    pub trace_id_selector: Vec<String>,
}

/// `SelectSeries`: the totals of the matching series over time.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SelectSeriesRequest {
    /// The profile type id.
    #[prost(string, tag = "1")]
    #[serde(
        rename = "profileTypeID",
        alias = "profile_typeID",
        deserialize_with = "protojson::nullable"
    )]
    pub profile_type_id: String,
    /// A label selector.
    #[prost(string, tag = "2")]
    #[serde(alias = "label_selector", deserialize_with = "protojson::nullable")]
    pub label_selector: String,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "3")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub start: i64,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "4")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub end: i64,
    /// Labels to split the series by.
    #[prost(string, repeated, tag = "5")]
    #[serde(alias = "group_by", deserialize_with = "protojson::nullable")]
    pub group_by: Vec<String>,
    /// The step, in seconds.
    #[prost(double, tag = "6")]
    #[serde(
        serialize_with = "protojson::as_double",
        deserialize_with = "protojson::double"
    )]
    pub step: f64,
    /// Sum (unset) or average within a step.
    #[prost(enumeration = "TimeSeriesAggregationType", optional, tag = "7")]
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "protojson::optional_enum_name::<TimeSeriesAggregationType, _>",
        deserialize_with = "protojson::optional_enumeration::<TimeSeriesAggregationType, _>"
    )]
    pub aggregation: Option<i32>,
    /// Only stacks starting with these frames.
    #[prost(message, optional, tag = "8")]
    #[serde(
        alias = "stack_trace_selector",
        skip_serializing_if = "Option::is_none"
    )]
    pub stack_trace_selector: Option<StackTraceSelector>,
    /// Only the top series by total.
    #[prost(int64, optional, tag = "9")]
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "protojson::optional_as_string",
        deserialize_with = "protojson::optional_integer"
    )]
    pub limit: Option<i64>,
    /// Which exemplars to attach.
    #[prost(enumeration = "ExemplarType", tag = "10")]
    #[serde(
        alias = "exemplar_type",
        serialize_with = "protojson::enum_name::<ExemplarType, _>",
        deserialize_with = "protojson::enumeration::<ExemplarType, _>"
    )]
    pub exemplar_type: i32,
}

/// The answer to `SelectSeries`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SelectSeriesResponse {
    /// One series per `group_by` value set.
    #[prost(message, repeated, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub series: Vec<Series>,
}

/// What a heatmap counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum HeatmapQueryType {
    /// Not said.
    Unspecified = 0,
    /// Individual profiles.
    Individual = 1,
    /// Span profiles.
    Span = 2,
}

impl ProtoEnum for HeatmapQueryType {
    const VALUES: &'static [(&'static str, i32)] = &[
        ("HEATMAP_QUERY_TYPE_UNSPECIFIED", 0),
        ("HEATMAP_QUERY_TYPE_INDIVIDUAL", 1),
        ("HEATMAP_QUERY_TYPE_SPAN", 2),
    ];
}

/// `SelectHeatmap`: individual or span profiles bucketed by value and time.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SelectHeatmapRequest {
    /// The profile type id.
    #[prost(string, tag = "1")]
    #[serde(
        rename = "profileTypeID",
        alias = "profile_typeID",
        deserialize_with = "protojson::nullable"
    )]
    pub profile_type_id: String,
    /// A label selector.
    #[prost(string, tag = "2")]
    #[serde(alias = "label_selector", deserialize_with = "protojson::nullable")]
    pub label_selector: String,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "3")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub start: i64,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "4")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub end: i64,
    /// The step, in seconds.
    #[prost(double, tag = "5")]
    #[serde(
        serialize_with = "protojson::as_double",
        deserialize_with = "protojson::double"
    )]
    pub step: f64,
    /// Labels to split by.
    #[prost(string, repeated, tag = "6")]
    #[serde(alias = "group_by", deserialize_with = "protojson::nullable")]
    pub group_by: Vec<String>,
    /// Individual or span profiles.
    #[prost(enumeration = "HeatmapQueryType", tag = "7")]
    #[serde(
        alias = "query_type",
        serialize_with = "protojson::enum_name::<HeatmapQueryType, _>",
        deserialize_with = "protojson::enumeration::<HeatmapQueryType, _>"
    )]
    pub query_type: i32,
    /// Which exemplars to attach.
    #[prost(enumeration = "ExemplarType", tag = "8")]
    #[serde(
        alias = "exemplar_type",
        serialize_with = "protojson::enum_name::<ExemplarType, _>",
        deserialize_with = "protojson::enumeration::<ExemplarType, _>"
    )]
    pub exemplar_type: i32,
    /// Only the top series by total.
    #[prost(int64, optional, tag = "9")]
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "protojson::optional_as_string",
        deserialize_with = "protojson::optional_integer"
    )]
    pub limit: Option<i64>,
}

/// The answer to `SelectHeatmap`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SelectHeatmapResponse {
    /// The heatmap's series.
    #[prost(message, repeated, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub series: Vec<HeatmapSeries>,
}

/// `AnalyzeQuery`: what a query would read.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AnalyzeQueryRequest {
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "2")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub start: i64,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "3")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub end: i64,
    /// The query, `<profile type id>{<selector>}`.
    #[prost(string, tag = "4")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub query: String,
}

/// The answer to `AnalyzeQuery`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AnalyzeQueryResponse {
    /// Per component that would take part.
    #[prost(message, repeated, tag = "1")]
    #[serde(alias = "query_scopes", deserialize_with = "protojson::nullable")]
    pub query_scopes: Vec<QueryScope>,
    /// The summary.
    #[prost(message, optional, tag = "2")]
    #[serde(alias = "query_impact", skip_serializing_if = "Option::is_none")]
    pub query_impact: Option<QueryImpact>,
}

/// What one kind of component would read for a query.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct QueryScope {
    /// The component, for example `short term storage`.
    #[prost(string, tag = "1")]
    #[serde(alias = "component_type", deserialize_with = "protojson::nullable")]
    pub component_type: String,
    /// How many components of this kind.
    #[prost(uint64, tag = "2")]
    #[serde(
        alias = "component_count",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub component_count: u64,
    /// Blocks read.
    #[prost(uint64, tag = "3")]
    #[serde(
        alias = "block_count",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub block_count: u64,
    /// Series read.
    #[prost(uint64, tag = "4")]
    #[serde(
        alias = "series_count",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub series_count: u64,
    /// Profiles read.
    #[prost(uint64, tag = "5")]
    #[serde(
        alias = "profile_count",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub profile_count: u64,
    /// Samples read.
    #[prost(uint64, tag = "6")]
    #[serde(
        alias = "sample_count",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub sample_count: u64,
    /// Index bytes read.
    #[prost(uint64, tag = "7")]
    #[serde(
        alias = "index_bytes",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub index_bytes: u64,
    /// Profile bytes read.
    #[prost(uint64, tag = "8")]
    #[serde(
        alias = "profile_bytes",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub profile_bytes: u64,
    /// Symbol bytes read.
    #[prost(uint64, tag = "9")]
    #[serde(
        alias = "symbol_bytes",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub symbol_bytes: u64,
}

/// The summary of what a query would read.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct QueryImpact {
    /// Bytes in the range.
    #[prost(uint64, tag = "2")]
    #[serde(
        alias = "total_bytes_in_time_range",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub total_bytes_in_time_range: u64,
    /// Series read.
    #[prost(uint64, tag = "3")]
    #[serde(
        alias = "total_queried_series",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub total_queried_series: u64,
    /// Whether replicas would have to be deduplicated.
    #[prost(bool, tag = "4")]
    #[serde(
        alias = "deduplication_needed",
        deserialize_with = "protojson::nullable"
    )]
    pub deduplication_needed: bool,
}
