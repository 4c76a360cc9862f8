//! `types.v1`: the messages `querier.v1` shares with Pyroscope's other services
//! (`grafana/pyroscope:api/types/v1/types.proto`). Field numbers are the protocol.

use serde::{Deserialize, Serialize};

use crate::protojson::{self, ProtoEnum};

/// A label: name and value.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LabelPair {
    /// The label name, for example `service_name`.
    #[prost(string, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub name: String,
    /// The label value.
    #[prost(string, tag = "2")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub value: String,
}

/// A profile type, as `ProfileTypes` lists them (see [`ProfileTypeId`](crate::ProfileTypeId)).
#[derive(Clone, PartialEq, Eq, Hash, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProfileType {
    /// The whole id, `name:sample_type:sample_unit:period_type:period_unit`.
    #[prost(string, tag = "1")]
    #[serde(rename = "ID", deserialize_with = "protojson::nullable")]
    pub id: String,
    /// The profile's name, `process_cpu`.
    #[prost(string, tag = "2")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub name: String,
    /// The sample type, `cpu`.
    #[prost(string, tag = "4")]
    #[serde(alias = "sample_type", deserialize_with = "protojson::nullable")]
    pub sample_type: String,
    /// The sample unit, `nanoseconds`.
    #[prost(string, tag = "5")]
    #[serde(alias = "sample_unit", deserialize_with = "protojson::nullable")]
    pub sample_unit: String,
    /// The period type, `cpu`.
    #[prost(string, tag = "6")]
    #[serde(alias = "period_type", deserialize_with = "protojson::nullable")]
    pub period_type: String,
    /// The period unit, `nanoseconds`.
    #[prost(string, tag = "7")]
    #[serde(alias = "period_unit", deserialize_with = "protojson::nullable")]
    pub period_unit: String,
}

/// A label set: one series.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Labels {
    /// The labels, sorted by name.
    #[prost(message, repeated, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub labels: Vec<LabelPair>,
}

/// A time series: its labels and its points.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Series {
    /// The series' labels (the `group_by` labels, for `SelectSeries`).
    #[prost(message, repeated, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub labels: Vec<LabelPair>,
    /// The points, by time.
    #[prost(message, repeated, tag = "2")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub points: Vec<Point>,
}

/// One point of a [`Series`].
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Point {
    /// The value, in the profile type's unit.
    #[prost(double, tag = "1")]
    #[serde(
        serialize_with = "protojson::as_double",
        deserialize_with = "protojson::double"
    )]
    pub value: f64,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "2")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub timestamp: i64,
    /// Annotations of the profiles behind the point; Smolder writes none.
    #[prost(message, repeated, tag = "3")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub annotations: Vec<ProfileAnnotation>,
    /// Exemplars: individual profiles behind the point; Smolder writes none.
    #[prost(message, repeated, tag = "4")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub exemplars: Vec<Exemplar>,
}

/// An annotation of a profile.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProfileAnnotation {
    /// The key.
    #[prost(string, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub key: String,
    /// The value.
    #[prost(string, tag = "2")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub value: String,
}

/// `LabelValues`: the values of one label among the series matching the selectors.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LabelValuesRequest {
    /// The label name.
    #[prost(string, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub name: String,
    /// Label selectors (`{service_name="api"}`); a series matching any of them counts.
    #[prost(string, repeated, tag = "2")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub matchers: Vec<String>,
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

/// The answer to `LabelValues`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LabelValuesResponse {
    /// The values, sorted.
    #[prost(string, repeated, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub names: Vec<String>,
}

/// `LabelNames`: the label names of the series matching the selectors.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LabelNamesRequest {
    /// Label selectors; a series matching any of them counts.
    #[prost(string, repeated, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub matchers: Vec<String>,
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
}

/// The answer to `LabelNames`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LabelNamesResponse {
    /// The names, sorted.
    #[prost(string, repeated, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub names: Vec<String>,
}

/// How `SelectSeries` combines the profiles within a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum TimeSeriesAggregationType {
    /// The sum of the values.
    Sum = 0,
    /// The average of the values.
    Average = 1,
}

impl ProtoEnum for TimeSeriesAggregationType {
    const VALUES: &'static [(&'static str, i32)] = &[
        ("TIME_SERIES_AGGREGATION_TYPE_SUM", 0),
        ("TIME_SERIES_AGGREGATION_TYPE_AVERAGE", 1),
    ];
}

/// Which exemplars a series query asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ExemplarType {
    /// Not said: none.
    Unspecified = 0,
    /// None.
    None = 1,
    /// Individual profiles.
    Individual = 2,
    /// Span profiles.
    Span = 3,
}

impl ProtoEnum for ExemplarType {
    const VALUES: &'static [(&'static str, i32)] = &[
        ("EXEMPLAR_TYPE_UNSPECIFIED", 0),
        ("EXEMPLAR_TYPE_NONE", 1),
        ("EXEMPLAR_TYPE_INDIVIDUAL", 2),
        ("EXEMPLAR_TYPE_SPAN", 3),
    ];
}

/// Selects stack traces by their root-most frames.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StackTraceSelector {
    /// The frames a stack must start with, root first; empty selects every stack.
    #[prost(message, repeated, tag = "1")]
    #[serde(alias = "call_site", deserialize_with = "protojson::nullable")]
    pub call_site: Vec<Location>,
    /// Go PGO trimming; when set, `call_site` is ignored.
    #[prost(message, optional, tag = "2")]
    #[serde(alias = "go_pgo", skip_serializing_if = "Option::is_none")]
    pub go_pgo: Option<GoPgo>,
}

/// One frame of a [`StackTraceSelector`].
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Location {
    /// The function name.
    #[prost(string, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub name: String,
}

/// Go PGO options (`types.v1.GoPGO`).
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GoPgo {
    /// Leaf locations to keep.
    #[prost(uint32, tag = "1")]
    #[serde(alias = "keep_locations", deserialize_with = "protojson::integer")]
    pub keep_locations: u32,
    /// Whether callee line numbers are ignored.
    #[prost(bool, tag = "2")]
    #[serde(alias = "aggregate_callees", deserialize_with = "protojson::nullable")]
    pub aggregate_callees: bool,
}

/// `GetProfileStats`: no fields.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GetProfileStatsRequest {}

/// The answer to `GetProfileStats`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GetProfileStatsResponse {
    /// Whether the tenant has any data at all.
    #[prost(bool, tag = "1")]
    #[serde(alias = "data_ingested", deserialize_with = "protojson::nullable")]
    pub data_ingested: bool,
    /// The oldest profile's time, in milliseconds since the Unix epoch.
    #[prost(int64, tag = "2")]
    #[serde(
        alias = "oldest_profile_time",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub oldest_profile_time: i64,
    /// The newest profile's time, in milliseconds since the Unix epoch.
    #[prost(int64, tag = "3")]
    #[serde(
        alias = "newest_profile_time",
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub newest_profile_time: i64,
}

/// An individual profile behind an aggregated point.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Exemplar {
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "1")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub timestamp: i64,
    /// The profile's id.
    #[prost(string, tag = "2")]
    #[serde(alias = "profile_id", deserialize_with = "protojson::nullable")]
    pub profile_id: String,
    /// The span's id, 16 hex digits.
    #[prost(string, tag = "3")]
    #[serde(alias = "span_id", deserialize_with = "protojson::nullable")]
    pub span_id: String,
    /// The profile's total value.
    #[prost(int64, tag = "4")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub value: i64,
    /// Labels of the exemplar that the series does not have.
    #[prost(message, repeated, tag = "5")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub labels: Vec<LabelPair>,
    /// The trace's id, 32 hex digits.
    #[prost(string, tag = "6")]
    #[serde(alias = "trace_id", deserialize_with = "protojson::nullable")]
    pub trace_id: String,
}

/// A heatmap's series.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HeatmapSeries {
    /// Its labels.
    #[prost(message, repeated, tag = "1")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub labels: Vec<LabelPair>,
    /// Its slots, by time.
    #[prost(message, repeated, tag = "2")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub slots: Vec<HeatmapSlot>,
}

/// One time slot of a heatmap.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HeatmapSlot {
    /// The slot's right edge, milliseconds since the Unix epoch.
    #[prost(int64, tag = "1")]
    #[serde(
        serialize_with = "protojson::as_string",
        deserialize_with = "protojson::integer"
    )]
    pub timestamp: i64,
    /// The lower bound of each bucket.
    #[prost(double, repeated, tag = "2")]
    #[serde(alias = "y_min", deserialize_with = "protojson::nullable")]
    pub y_min: Vec<f64>,
    /// The number of profiles in each bucket.
    #[prost(int32, repeated, tag = "3")]
    #[serde(deserialize_with = "protojson::integers")]
    pub counts: Vec<i32>,
    /// Exemplars of the slot.
    #[prost(message, repeated, tag = "4")]
    #[serde(deserialize_with = "protojson::nullable")]
    pub exemplars: Vec<Exemplar>,
}
