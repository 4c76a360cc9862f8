//! OTLP profiles over HTTP, `POST /v1development/profiles`, and over gRPC,
//! `ProfilesService/Export` on the same port (HTTP/2 without TLS, "h2c"), as OpenTelemetry
//! profilers and the Collector's OTLP exporters send them.
//!
//! Input: an `ExportProfilesServiceRequest` of `profiles/v1development` (opentelemetry-proto
//! v1.10), binary protobuf (`application/x-protobuf`, `application/protobuf`) or OTLP JSON
//! (`application/json`), optionally `Content-Encoding: gzip`, read under ingest's caps.
//! Output: a [`ProfileSet`] of the request's profiles; those over a limit are refused one by
//! one and counted in the answer's `partial_success`. Reading and
//! conversion are [`smolder_common::otlp`]'s: sizes capped before decoding, every field checked
//! against the v1.10 schema, everything that does not fit refused with the field at fault.
//!
//! Success is 200 with an `ExportProfilesServiceResponse` in the request's encoding, empty, or
//! with `partial_success` (how many profiles were refused, and the first reasons).
//! Errors are 400 (the request does not fit the schema, with the reason), 413 past a cap, 415
//! for another content type, 500 when the store fails. Over gRPC the request is one
//! length-prefixed message (gzip when `grpc-encoding` says so, read under the same caps); the
//! answer carries `grpc-status` 0, or `INVALID_ARGUMENT`, `RESOURCE_EXHAUSTED` or `INTERNAL`
//! with the reason in `grpc-message`, as a trailers-only response. Samples with a span link
//! are kept per span too (span profiles), never as series labels.

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, Full};
use prost::Message;
use smolder_common::otlp::{
    self, ExportProfilesPartialSuccess, ExportProfilesServiceResponse, Limits,
};

use super::body::{self, RequestBody};
use super::pprof::{Converted, type_label};
use super::{
    IngestError, Ingester, ProfileSet, Stored, blocking, content_type, media_type, refused_text,
};
use crate::api_error::{self, ApiError, Protocol};
use crate::tenant::Tenant;

/// How the request body is encoded; the answer uses the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    Protobuf,
    Json,
}

/// What this route reads, for the 415 message.
const EXPECTED: &str =
    "application/x-protobuf, application/protobuf or application/json (OTLP/HTTP)";

/// The limits of one request: a profile may be as large as a decompressed body.
fn limits(ingester: &Ingester) -> Limits {
    Limits {
        max_bytes: ingester.config().max_decompressed_bytes,
        ..Limits::default()
    }
}

/// `POST /v1development/profiles`.
pub(crate) async fn export(
    State(ingester): State<Arc<Ingester>>,
    tenant: Tenant,
    request: Request,
) -> Response {
    let mut encoding = Encoding::Protobuf;
    let outcome = export_request(&ingester, &tenant, request, &mut encoding).await;
    ingester.record("otlp", &outcome);
    match outcome {
        Ok(stored) => {
            let response = answer(&stored);
            match encoding {
                Encoding::Protobuf => (
                    [(CONTENT_TYPE, "application/x-protobuf")],
                    response.encode_to_vec(),
                )
                    .into_response(),
                Encoding::Json => (
                    [(CONTENT_TYPE, "application/json")],
                    serde_json::to_string(&response).expect("a response serializes"),
                )
                    .into_response(),
            }
        }
        Err(IngestError::Overloaded { source }) => source.refusal(Protocol::Plain).into_response(),
        Err(IngestError::Store { source }) => super::store_failure(&source, Protocol::Plain),
        Err(error @ IngestError::Panicked { .. }) => ApiError::internal(error).into_response(),
        Err(error) => (error.status(), format!("{error}\n")).into_response(),
    }
}

async fn export_request(
    ingester: &Ingester,
    tenant: &Tenant,
    request: Request,
    encoding: &mut Encoding,
) -> Result<Stored, IngestError> {
    let (parts, body) = request.into_parts();
    let content_type = content_type(&parts.headers);
    let essence = media_type(&content_type);
    *encoding = match essence.as_str() {
        "application/x-protobuf" | "application/protobuf" => Encoding::Protobuf,
        "application/json" => Encoding::Json,
        _ => {
            return Err(IngestError::UnsupportedMediaType {
                content_type,
                expected: EXPECTED,
            });
        }
    };
    let encoding = *encoding;
    let body = body::read(
        &parts,
        tenant,
        body,
        ingester.config(),
        body::Encoding::Header,
    )
    .await?;
    let limits = limits(ingester);
    let set = blocking(move || convert(encoding, &body, &limits)).await?;
    ingester.ingest(tenant, set, None).await
}

/// Decodes and converts `body`.
fn convert(
    encoding: Encoding,
    body: &RequestBody,
    limits: &Limits,
) -> Result<ProfileSet, IngestError> {
    let request = match encoding {
        Encoding::Protobuf => otlp::decode_protobuf(&body.bytes, limits),
        Encoding::Json => otlp::decode_json(&body.bytes, limits),
    }
    .map_err(|source| IngestError::Otlp { source })?;
    let converted = otlp::convert(&request, limits, SystemTime::now())
        .map_err(|source| IngestError::Otlp { source })?;
    let mut out = Converted::default();
    for c in converted {
        let kind = type_label(c.profile.series.profile_type().unwrap_or_default());
        out.push(c.profile, kind, c.spans);
    }
    Ok(out.into_set("otlp", body.sent_bytes))
}

/// The answer to a stored request: empty, or its `partial_success` when series were refused.
fn answer(stored: &Stored) -> ExportProfilesServiceResponse {
    if stored.refused.is_empty() {
        return ExportProfilesServiceResponse::default();
    }
    ExportProfilesServiceResponse {
        partial_success: Some(ExportProfilesPartialSuccess {
            rejected_profiles: i64::try_from(stored.refused.len()).unwrap_or(i64::MAX),
            error_message: refused_text(&stored.refused),
        }),
    }
}

/// The path of gRPC's `ProfilesService/Export`.
pub(crate) const GRPC_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// gRPC's status codes that the export answers with.
const GRPC_OK: u32 = 0;
const GRPC_INVALID_ARGUMENT: u32 = 3;
const GRPC_RESOURCE_EXHAUSTED: u32 = 8;
const GRPC_INTERNAL: u32 = 13;

/// `ProfilesService/Export` over gRPC.
pub(crate) async fn export_grpc(
    State(ingester): State<Arc<Ingester>>,
    tenant: Tenant,
    request: Request,
) -> Response {
    let outcome = grpc_request(&ingester, &tenant, request).await;
    ingester.record("otlp_grpc", &outcome);
    match outcome {
        Ok(stored) => grpc_answer(&answer(&stored).encode_to_vec()),
        Err(IngestError::Overloaded { source }) => source.refusal(Protocol::Grpc).into_response(),
        Err(IngestError::Store { source }) => super::store_failure(&source, Protocol::Grpc),
        Err(error @ IngestError::Panicked { .. }) => {
            ApiError::internal(&error);
            grpc_status(GRPC_INTERNAL, "internal error; see the aggregator's log")
        }
        Err(error) => {
            let code = if matches!(
                error.status(),
                StatusCode::PAYLOAD_TOO_LARGE | StatusCode::TOO_MANY_REQUESTS
            ) {
                GRPC_RESOURCE_EXHAUSTED
            } else {
                GRPC_INVALID_ARGUMENT
            };
            grpc_status(code, &error.to_string())
        }
    }
}

async fn grpc_request(
    ingester: &Ingester,
    tenant: &Tenant,
    request: Request,
) -> Result<Stored, IngestError> {
    let (parts, body) = request.into_parts();
    let content_type = content_type(&parts.headers);
    if !content_type.starts_with("application/grpc") {
        return Err(IngestError::UnsupportedMediaType {
            content_type,
            expected: "application/grpc",
        });
    }
    let config = ingester.config();
    let framed = body::read(&parts, tenant, body, config, body::Encoding::Framed).await?;
    let message = grpc_message(&framed.bytes)?;
    let compressed = framed.bytes[0] == 1;
    let bytes = if compressed {
        let encoding = parts
            .headers
            .get("grpc-encoding")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("identity");
        if encoding != "gzip" {
            return Err(IngestError::UnsupportedEncoding {
                encoding: format!("grpc-encoding {encoding}"),
            });
        }
        if !message.starts_with(&[0x1f, 0x8b]) {
            return Err(IngestError::BadGzip {
                reason: "the message is flagged compressed but is not gzip".to_owned(),
            });
        }
        let inflate = framed.inflate.clone();
        let message = Bytes::copy_from_slice(message);
        blocking(move || Ok(Bytes::from(inflate.gunzip(&message)?.into_owned()))).await?
    } else {
        Bytes::copy_from_slice(message)
    };
    let body = RequestBody {
        sent_bytes: framed.sent_bytes,
        bytes,
        inflate: framed.inflate,
    };
    let limits = limits(ingester);
    let set = blocking(move || convert(Encoding::Protobuf, &body, &limits)).await?;
    ingester.ingest(tenant, set, None).await
}

/// The one message of a unary gRPC request: a compression flag, a 4-byte big-endian length,
/// then that many bytes, and nothing after.
fn grpc_message(framed: &[u8]) -> Result<&[u8], IngestError> {
    let bad = |reason: String| IngestError::GrpcFrame { reason };
    if framed.len() < 5 {
        return Err(bad(format!(
            "{} bytes, shorter than a message header",
            framed.len()
        )));
    }
    if framed[0] > 1 {
        return Err(bad(format!("compression flag {}", framed[0])));
    }
    let len = u32::from_be_bytes([framed[1], framed[2], framed[3], framed[4]]) as usize;
    if framed.len() - 5 != len {
        return Err(bad(format!(
            "the header says {len} bytes but {} follow (one message per call)",
            framed.len() - 5
        )));
    }
    Ok(&framed[5..])
}

/// A successful gRPC answer: `message` framed, then `grpc-status: 0` as a trailer.
fn grpc_answer(message: &[u8]) -> Response {
    let mut framed = Vec::with_capacity(5 + message.len());
    framed.push(0);
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from(GRPC_OK));
    let body = Full::new(Bytes::from(framed)).with_trailers(async move { Some(Ok(trailers)) });
    ([(CONTENT_TYPE, "application/grpc")], Body::new(body)).into_response()
}

/// A gRPC error as a trailers-only answer: the status and message in the headers, no body.
fn grpc_status(code: u32, message: &str) -> Response {
    let encoded = api_error::grpc_message(message);
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(code));
    if let Ok(value) = HeaderValue::from_str(&encoded) {
        headers.insert("grpc-message", value);
    }
    (headers, ()).into_response()
}

/// The status of an OTLP error: 413 past a limit, 400 otherwise.
pub(super) fn status(error: &otlp::OtlpError) -> StatusCode {
    if error.is_too_large() {
        StatusCode::PAYLOAD_TOO_LARGE
    } else {
        StatusCode::BAD_REQUEST
    }
}
