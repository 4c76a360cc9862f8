//! The query API Grafana speaks: Pyroscope's `querier.v1.QuerierService`, with the `types.v1`
//! and `settings.v1` messages it uses, written by hand for prost like
//! [`wire`](crate::wire)'s messages, so that no protoc or build script is needed.
//!
//! Input: request bodies of Connect unary calls, binary protobuf (`application/proto`, prost's
//! `decode`) or JSON (`application/json`, serde, with the proto3 JSON mapping of
//! [`protojson`](crate::protojson): lowerCamelCase or proto names, 64-bit integers as strings,
//! enums by name or number). Output: the responses, in the same two codecs, and the stack forms
//! they carry, built from trees: [`FlameGraph`] and [`FlameGraphDiff`] (the flamebearer
//! layout), [`tree_bytes`] (Pyroscope's tree format) and pprof
//! ([`pprof::proto::Profile`](crate::pprof::proto::Profile), `google.v1.Profile` on the wire).
//! Caller: the aggregator's query stage, which serves the methods.
//!
//! | method | request | response |
//! |---|---|---|
//! | `ProfileTypes` | [`ProfileTypesRequest`] | [`ProfileTypesResponse`] |
//! | `LabelNames` | [`LabelNamesRequest`] | [`LabelNamesResponse`] |
//! | `LabelValues` | [`LabelValuesRequest`] | [`LabelValuesResponse`] |
//! | `Series` | [`SeriesRequest`] | [`SeriesResponse`] |
//! | `SelectMergeStacktraces` | [`SelectMergeStacktracesRequest`] | [`SelectMergeStacktracesResponse`] |
//! | `SelectMergeProfile` | [`SelectMergeProfileRequest`] | `google.v1.Profile` |
//! | `SelectSeries` | [`SelectSeriesRequest`] | [`SelectSeriesResponse`] |
//! | `Diff` | [`DiffRequest`] | [`DiffResponse`] |
//! | `SelectMergeSpanProfile` | [`SelectMergeSpanProfileRequest`] | [`SelectMergeSpanProfileResponse`] |
//! | `GetProfileStats` | [`GetProfileStatsRequest`] | [`GetProfileStatsResponse`] |
//! | `SelectHeatmap` | [`SelectHeatmapRequest`] | [`SelectHeatmapResponse`] |
//! | `AnalyzeQuery` | [`AnalyzeQueryRequest`] | [`AnalyzeQueryResponse`] |
//! | `settings.v1.SettingsService/Get` | [`GetSettingsRequest`] | [`GetSettingsResponse`] |
//!
//! Every field number is Pyroscope's (`grafana/pyroscope:api/querier/v1/querier.proto`,
//! `api/types/v1/types.proto`, `api/settings/v1/setting.proto`, v2.2): never renumber one.
//!
//! ```
//! use prost::Message;
//! use smolder_common::querier::SelectMergeStacktracesRequest;
//!
//! // Grafana's datasource sends binary protobuf; the Drilldown app sends JSON.
//! let json = r#"{"profileTypeID": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
//!                "label_selector": "{service_name=\"api\"}", "start": "1000", "end": 2000,
//!                "maxNodes": "16384"}"#;
//! let request: SelectMergeStacktracesRequest = serde_json::from_str(json)?;
//! assert_eq!(request.max_nodes, Some(16384));
//! let binary = request.encode_to_vec();
//! assert_eq!(SelectMergeStacktracesRequest::decode(&binary[..])?, request);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod flamegraph;
mod messages;
mod settings;
mod types;

pub use flamegraph::tree_bytes;
pub use messages::{
    AnalyzeQueryRequest, AnalyzeQueryResponse, DiffRequest, DiffResponse, FlameGraph,
    FlameGraphDiff, HeatmapQueryType, Level, PprofProfile, ProfileFormat, ProfileTypesRequest,
    ProfileTypesResponse, QueryImpact, QueryScope, SelectHeatmapRequest, SelectHeatmapResponse,
    SelectMergeProfileRequest, SelectMergeSpanProfileRequest, SelectMergeSpanProfileResponse,
    SelectMergeStacktracesRequest, SelectMergeStacktracesResponse, SelectSeriesRequest,
    SelectSeriesResponse, SeriesRequest, SeriesResponse,
};
pub use settings::{GetSettingsRequest, GetSettingsResponse, Setting};
pub use types::{
    Exemplar, ExemplarType, GetProfileStatsRequest, GetProfileStatsResponse, GoPgo, HeatmapSeries,
    HeatmapSlot, LabelNamesRequest, LabelNamesResponse, LabelPair, LabelValuesRequest,
    LabelValuesResponse, Labels, Location, Point, ProfileAnnotation, ProfileType, Series,
    StackTraceSelector, TimeSeriesAggregationType,
};
