//! OTLP profiles over HTTP: `POST /v1development/profiles`, as OpenTelemetry profilers and
//! the Collector's OTLP/HTTP exporter send them.
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
//! for another content type, 500 when the store fails. The samples' span links are read and
//! checked, but span trees are not stored yet.

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use prost::Message;
use smolder_common::otlp::{self, ExportProfilesServiceResponse, Limits};

use super::body::{self, RequestBody};
use super::pprof::type_label;
use super::{IngestError, Ingester, ProfileSet, Stored, Transport, blocking, content_type};
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
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
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

/// The status of an OTLP error: 413 past a limit, 400 otherwise.
pub(super) fn status(error: &otlp::OtlpError) -> StatusCode {
    if error.is_too_large() {
        StatusCode::PAYLOAD_TOO_LARGE
    } else {
        StatusCode::BAD_REQUEST
    }
}
