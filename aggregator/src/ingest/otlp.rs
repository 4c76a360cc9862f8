//! OTLP profiles over HTTP, `POST /v1development/profiles`, and over gRPC,
//! `ProfilesService/Export` on the same port (HTTP/2 without TLS, "h2c"), as OpenTelemetry
//! profilers and the Collector's OTLP exporters send them.
//!
//! Input: an `ExportProfilesServiceRequest` of `profiles/v1development` (opentelemetry-proto
//! v1.10), binary protobuf (`application/x-protobuf`, `application/protobuf`) or OTLP JSON
//! (`application/json`), optionally `Content-Encoding: gzip`, read under ingest's caps.
//! Output: a [`ProfileSet`] of the request's profiles, stored whole or not at all. Reading and
//! conversion are [`smolder_common::otlp`]'s: sizes capped before decoding, every field checked
//! against the v1.10 schema, everything that does not fit refused with the field at fault.
//!
//! Success is 200 with an empty `ExportProfilesServiceResponse` in the request's encoding.
//! Errors are 400 (the request does not fit the schema, with the reason), 413 past a cap, 415
//! for another content type, 500 when the store fails. Over gRPC the request is one
//! length-prefixed message (gzip when `grpc-encoding` says so, read under the same caps); the
//! answer carries `grpc-status` 0, or `INVALID_ARGUMENT`, `RESOURCE_EXHAUSTED` or `INTERNAL`
//! with the reason in `grpc-message`, as a trailers-only response. The samples' span links are
//! read and checked, but span trees are not stored yet.

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, Full};
use prost::Message;
use smolder_common::otlp::{self, ExportProfilesServiceResponse, Limits};

use super::body::{self, RequestBody};
use super::pprof::type_label;
use super::{
    IngestError, Ingester, ProfileSet, Stored, Transport, blocking, content_type, media_type,
};
use crate::api_error::{ApiError, chain};
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
        Ok(_) => match encoding {
            Encoding::Protobuf => (
                [(CONTENT_TYPE, "application/x-protobuf")],
                ExportProfilesServiceResponse::default().encode_to_vec(),
            )
                .into_response(),
            Encoding::Json => ([(CONTENT_TYPE, "application/json")], "{}").into_response(),
        },
        Err(IngestError::Store { source }) => ApiError::internal(chain(&source)).into_response(),
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
    let body = body::read(&parts.headers, body, ingester.config()).await?;
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
    let profiles = converted
        .into_iter()
        .map(|c| {
            let kind = type_label(c.profile.series.profile_type().unwrap_or_default());
            (c.profile, kind)
        })
        .collect();
    Ok(ProfileSet {
        transport: Transport::Http,
        format: "otlp",
        sent_bytes: body.sent_bytes,
        profiles,
    })
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
        Ok(_) => grpc_answer(&ExportProfilesServiceResponse::default().encode_to_vec()),
        Err(IngestError::Store { source }) => {
            ApiError::internal(chain(&source));
            grpc_status(GRPC_INTERNAL, "internal error; see the aggregator's log")
        }
        Err(error @ IngestError::Panicked { .. }) => {
            ApiError::internal(&error);
            grpc_status(GRPC_INTERNAL, "internal error; see the aggregator's log")
        }
        Err(error) => {
            let code = if error.status() == StatusCode::PAYLOAD_TOO_LARGE {
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
    let framed = body::read(&HeaderMap::new(), body, config).await?;
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
        Bytes::from(body::gunzip_if_gzipped(message, config)?.into_owned())
    } else {
        Bytes::copy_from_slice(message)
    };
    let body = RequestBody {
        sent_bytes: framed.sent_bytes,
        bytes,
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
    // grpc-message is percent-encoded: everything outside printable ASCII, and `%`.
    let mut encoded = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
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
