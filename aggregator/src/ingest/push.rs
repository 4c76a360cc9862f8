//! Connect's unary push, `POST /push.v1.PusherService/Push`, as Pyroscope v1+ SDKs and Alloy
//! send it.
//!
//! Input: a `push.v1.PushRequest` (`grafana/pyroscope:api/push/v1/push.proto`) as binary
//! protobuf (`application/proto`) or protojson (`application/json`, bytes in base64, field
//! names `rawProfile` and `ID`, or the proto names), the body optionally
//! `Content-Encoding: gzip`. Output: a [`ProfileSet`] of profiles; those over a limit are
//! refused one by one and named in the answer's headers (`PushResponse` has no field for them).
//!
//! Each `RawProfileSeries` names its app with the `service_name` label, which is required:
//! `__name__` in a push is the profile type (`process_cpu`, `memory`), not an app, so it
//! cannot stand in. Characters outside the app-name set `[A-Za-z0-9_.-]` become `_`, so that
//! Alloy's `namespace/container` service names are kept rather than rejected. Every other
//! label not starting with `__` becomes a series label (OpenTelemetry-style dotted names
//! included), but for the span labels (`span_id`, `span_name`, `trace_id`): a series'
//! `span_id` puts its samples without a span of their own in that span, and the samples'
//! `span_id` labels (what `pyroscope-io` with `pyroscope-otel` sends) put them in theirs. Each `RawSample` is a pprof profile, gzipped or not, converted with the SDK
//! sample types (`pprof::sdk_sample_types`: the defaults plus `cpu`, `wall` and .NET's types)
//! into `<service_name>.<suffix>` series exactly as `/ingest?format=pprof` does; its
//! `time_nanos` and `duration_nanos` give the span (now when absent). The spy name is the
//! `pyroscope_spy` label (`spy_name` from .NET), else `unknown`. Cumulative sample types are stored as sent: a push
//! has no `prev_profile` to subtract.
//!
//! Success is 200 with an empty `PushResponse` in the request's encoding. Errors follow
//! Connect: a JSON body `{"code", "message"}`, 400 (`invalid_argument`) for anything wrong
//! with the request, 413 (`resource_exhausted`) past a cap, 415 for another content type.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD_PAD_INDIFFERENT, URL_SAFE_PAD_INDIFFERENT};
use prost::Message;
use serde::Deserialize;
use smolder_common::pprof::{self, Limits};
use smolder_common::span::{self as spans, SpanId};
use smolder_common::{Labels, ProfileMeta, Series};

use super::body::{self, RequestBody};
use super::pprof::{
    Converted, Prefix, limits, normalize_sdk_series, sdk_sample_types, to_profiles_under,
};
use super::{
    IngestError, Ingester, ProfileSet, Stored, blocking, content_type, media_type, refused_headers,
};
use crate::api_error::{ApiError, Protocol};
use crate::tenant::Tenant;

/// `push.v1.PushRequest`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct PushRequest {
    /// The profiles, grouped by label set.
    #[prost(message, repeated, tag = "1")]
    pub(crate) series: Vec<RawProfileSeries>,
}

/// `push.v1.PushResponse`: empty.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct PushResponse {}

/// `push.v1.RawProfileSeries`; `annotations` (field 3) are dropped, as Pyroscope drops them.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct RawProfileSeries {
    /// The series' labels, `service_name` and `__name__` among them.
    #[prost(message, repeated, tag = "1")]
    pub(crate) labels: Vec<LabelPair>,
    /// The pprof profiles of the series.
    #[prost(message, repeated, tag = "2")]
    pub(crate) samples: Vec<RawSample>,
}

/// `types.v1.LabelPair`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct LabelPair {
    /// The label name.
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    /// The label value.
    #[prost(string, tag = "2")]
    pub(crate) value: String,
}

/// `push.v1.RawSample`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct RawSample {
    /// A pprof profile, gzipped or not.
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) raw_profile: Vec<u8>,
    /// The profile's unique id (a UUID); not used.
    #[prost(string, tag = "2")]
    pub(crate) id: String,
}

/// `PushRequest` as protojson writes it; unknown fields are ignored, as Connect's codec does.
#[derive(Deserialize)]
struct JsonRequest {
    #[serde(default)]
    series: Option<Vec<JsonSeries>>,
}

#[derive(Deserialize)]
struct JsonSeries {
    #[serde(default)]
    labels: Option<Vec<JsonLabel>>,
    #[serde(default)]
    samples: Option<Vec<JsonSample>>,
}

#[derive(Deserialize)]
struct JsonLabel {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    value: Option<String>,
}

#[derive(Deserialize)]
struct JsonSample {
    #[serde(default, rename = "rawProfile", alias = "raw_profile")]
    raw_profile: Option<String>,
}

/// How the request body is encoded; the reply uses the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Codec {
    Proto,
    Json,
}

/// What this route reads, for the 415 message.
const EXPECTED: &str = "application/proto or application/json (Connect unary)";

/// `POST /push.v1.PusherService/Push`.
pub(crate) async fn push(
    State(ingester): State<Arc<Ingester>>,
    tenant: Tenant,
    request: Request,
) -> Response {
    let mut codec = Codec::Json;
    let outcome = push_request(&ingester, &tenant, request, &mut codec).await;
    ingester.record("push", &outcome);
    match outcome {
        Ok(stored) => {
            // Series refused one by one are named in headers: PushResponse has no field for them.
            let refused = if stored.refused.is_empty() {
                HeaderMap::new()
            } else {
                refused_headers(&stored.refused)
            };
            match codec {
                Codec::Proto => (
                    refused,
                    [(CONTENT_TYPE, "application/proto")],
                    PushResponse {}.encode_to_vec(),
                )
                    .into_response(),
                Codec::Json => {
                    (refused, [(CONTENT_TYPE, "application/json")], "{}").into_response()
                }
            }
        }
        Err(error) => connect_error(error),
    }
}

async fn push_request(
    ingester: &Ingester,
    tenant: &Tenant,
    request: Request,
    codec: &mut Codec,
) -> Result<Stored, IngestError> {
    let (parts, body) = request.into_parts();
    let content_type = content_type(&parts.headers);
    let essence = media_type(&content_type);
    *codec = match essence.as_str() {
        "application/proto" | "application/protobuf" | "application/x-protobuf" => Codec::Proto,
        "application/json" => Codec::Json,
        _ => {
            return Err(IngestError::UnsupportedMediaType {
                content_type,
                expected: EXPECTED,
            });
        }
    };
    let codec = *codec;
    let config = ingester.config();
    let body = body::read(&parts, tenant, body, config, body::Encoding::Header).await?;
    let limits = limits(config);
    let set = blocking(move || {
        let request = decode(codec, &body)?;
        convert(request, &body, &limits, SystemTime::now())
    })
    .await?;
    ingester.ingest(tenant, set, None).await
}

/// Decodes the body in `codec`.
fn decode(codec: Codec, body: &RequestBody) -> Result<PushRequest, IngestError> {
    match codec {
        Codec::Proto => PushRequest::decode(&body.bytes[..]).map_err(|err| IngestError::PushBody {
            reason: err.to_string(),
        }),
        Codec::Json => {
            let json: JsonRequest =
                serde_json::from_slice(&body.bytes).map_err(|err| IngestError::PushBody {
                    reason: err.to_string(),
                })?;
            from_json(json)
        }
    }
}

/// The protobuf message a protojson request stands for; bytes are base64, standard or
/// URL-safe, padded or not, as protojson accepts them.
fn from_json(json: JsonRequest) -> Result<PushRequest, IngestError> {
    let mut series = Vec::new();
    for (i, s) in json.series.unwrap_or_default().into_iter().enumerate() {
        let labels = s
            .labels
            .unwrap_or_default()
            .into_iter()
            .map(|l| LabelPair {
                name: l.name.unwrap_or_default(),
                value: l.value.unwrap_or_default(),
            })
            .collect();
        let mut samples = Vec::new();
        for (j, sample) in s.samples.unwrap_or_default().into_iter().enumerate() {
            let text = sample.raw_profile.unwrap_or_default();
            let raw_profile = STANDARD_PAD_INDIFFERENT
                .decode(&text)
                .or_else(|_| URL_SAFE_PAD_INDIFFERENT.decode(&text))
                .map_err(|err| IngestError::PushBody {
                    reason: format!("series[{i}].samples[{j}].rawProfile is not base64: {err}"),
                })?;
            samples.push(RawSample {
                raw_profile,
                id: String::new(),
            });
        }
        series.push(RawProfileSeries { labels, samples });
    }
    Ok(PushRequest { series })
}

/// Converts every series and sample; the first bad one rejects the request.
fn convert(
    request: PushRequest,
    body: &RequestBody,
    limits: &Limits,
    now: SystemTime,
) -> Result<ProfileSet, IngestError> {
    let mut out = Converted::default();
    for (i, series) in request.series.into_iter().enumerate() {
        let mut service = None;
        let mut spy = None;
        let mut span = None;
        let mut labels = Labels::new();
        for pair in &series.labels {
            match pair.name.as_str() {
                "service_name" => service = Some(pair.value.as_str()),
                name if name.starts_with("__") => continue,
                spans::SPAN_ID_LABEL => span = SpanId::from_label(&pair.value),
                name if spans::is_span_label(name) => continue,
                name => {
                    // Pyroscope's SDKs say `pyroscope_spy`; .NET's profiler says `spy_name`.
                    if name == "pyroscope_spy" || (name == "spy_name" && spy.is_none()) {
                        spy = Some(pair.value.clone());
                    }
                    labels
                        .insert(super::pprof::label_name(name), &pair.value)
                        .map_err(|source| IngestError::BadLabel {
                            name: name.to_owned(),
                            source,
                        })?;
                }
            }
        }
        let service = service
            .filter(|s| !s.is_empty())
            .ok_or(IngestError::MissingServiceName { series: i })?;
        let app = app_name(service);
        let prefix = Series::new(app.clone(), labels)
            .map_err(|source| IngestError::BadProfileName { name: app, source })?;
        let meta = ProfileMeta {
            spy_name: spy.unwrap_or_else(|| ProfileMeta::default().spy_name),
            ..ProfileMeta::default()
        };
        for (j, sample) in series.samples.iter().enumerate() {
            let part = || format!("series[{i}].samples[{j}].rawProfile");
            let raw = body.inflate.gunzip_part(&sample.raw_profile, &part())?;
            let profile = pprof::decode(&raw, limits).map_err(|source| IngestError::Pprof {
                part: part(),
                source,
            })?;
            let mut converted =
                pprof::to_series(&profile, &sdk_sample_types(), limits).map_err(|source| {
                    IngestError::Pprof {
                        part: part(),
                        source,
                    }
                })?;
            normalize_sdk_series(&mut converted, meta.sample_rate);
            let prefix = Prefix {
                series: &prefix,
                span,
                meta: &meta,
                range: covered(profile.time_nanos, profile.duration_nanos, now),
            };
            to_profiles_under(&prefix, converted, &mut out)?;
        }
    }
    Ok(out.into_set("push", body.sent_bytes))
}

/// `service` with every character outside the app-name set replaced by `_`.
fn app_name(service: &str) -> String {
    smolder_common::series::sanitize_app_name(service)
}

/// The time a profile covers: from its `time_nanos` for `duration_nanos`, or `now` when the
/// profile has no time.
fn covered(time_nanos: i64, duration_nanos: i64, now: SystemTime) -> (SystemTime, SystemTime) {
    let Ok(start) = u64::try_from(time_nanos) else {
        return (now, now);
    };
    if start == 0 {
        return (now, now);
    }
    let from = UNIX_EPOCH + Duration::from_nanos(start);
    let length = Duration::from_nanos(u64::try_from(duration_nanos).unwrap_or(0));
    (from, from.checked_add(length).unwrap_or(from))
}

/// A Connect error: `{"code", "message"}` with the HTTP status Connect uses for the code.
fn connect_error(error: IngestError) -> Response {
    match &error {
        IngestError::Overloaded { source } => {
            return source.refusal(Protocol::Connect).into_response();
        }
        IngestError::Store { source } => return super::store_failure(source, Protocol::Connect),
        _ => {}
    }
    let (status, code, message) = match error.status() {
        StatusCode::PAYLOAD_TOO_LARGE => (
            StatusCode::PAYLOAD_TOO_LARGE,
            "resource_exhausted",
            error.to_string(),
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_argument",
            error.to_string(),
        ),
        StatusCode::TOO_MANY_REQUESTS => (
            StatusCode::TOO_MANY_REQUESTS,
            "resource_exhausted",
            error.to_string(),
        ),
        status if status.is_server_error() => return internal(error.to_string()),
        _ => (
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            error.to_string(),
        ),
    };
    let body = serde_json::json!({ "code": code, "message": message });
    (
        status,
        [(CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// A 500 as Connect's `internal`, the cause logged once by [`ApiError::internal`].
fn internal(cause: String) -> Response {
    let logged = ApiError::internal(cause);
    let body = serde_json::json!({
        "code": "internal",
        "message": "internal error; see the aggregator's log",
    });
    (
        logged.status(),
        [(CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_become_app_names() {
        assert_eq!(app_name("shop-api.v2"), "shop-api.v2");
        assert_eq!(app_name("prod/checkout"), "prod_checkout");
    }

    #[test]
    fn span_falls_back_to_now() {
        let now = UNIX_EPOCH + Duration::from_secs(100);
        assert_eq!(covered(0, 10, now), (now, now));
        assert_eq!(covered(-5, 10, now), (now, now));
        let from = UNIX_EPOCH + Duration::from_secs(50);
        assert_eq!(
            covered(50_000_000_000, 10_000_000_000, now),
            (from, from + Duration::from_secs(10))
        );
    }

    #[test]
    fn json_bytes_accept_both_base64_alphabets() {
        let json: JsonRequest = serde_json::from_str(
            r#"{"series":[{"labels":[{"name":"service_name","value":"a"}],
                "samples":[{"rawProfile":"-_8"},{"raw_profile":"+/8="}]}]}"#,
        )
        .expect("valid json");
        let request = from_json(json).expect("valid base64");
        let samples = &request.series[0].samples;
        assert_eq!(samples[0].raw_profile, vec![0xfb, 0xff]);
        assert_eq!(samples[1].raw_profile, vec![0xfb, 0xff]);
    }
}
