//! Connect's unary protocol, as the query API speaks it: `POST /<package.Service>/<Method>`,
//! the request in binary protobuf (`application/proto`) or JSON (`application/json`), gzip
//! when `Content-Encoding` says so, the answer in the request's codec, errors as Connect's
//! JSON `{"code", "message"}` with the HTTP status of the code.

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use prost::Message;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::QueryError;
use crate::api_error::{ApiError, chain};

/// The largest request accepted, as sent and once gunzipped. Query requests are a selector
/// and a few numbers; a megabyte is thousands of times what Grafana sends.
const MAX_REQUEST_BYTES: usize = 1 << 20;

/// The two codecs of Connect's unary protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Codec {
    /// `application/proto`.
    Proto,
    /// `application/json`.
    Json,
}

impl Codec {
    /// The `format` label of the query metrics.
    pub(super) fn label(self) -> &'static str {
        match self {
            Codec::Proto => "proto",
            Codec::Json => "json",
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Codec::Proto => "application/proto",
            Codec::Json => "application/json",
        }
    }
}

/// Connect's error codes that the query API answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Code {
    /// The request is wrong (HTTP 400).
    InvalidArgument,
    /// The request is too large (HTTP 429, as Connect maps `resource_exhausted`).
    ResourceExhausted,
    /// The method, or the option asked for, is not served (HTTP 501).
    Unimplemented,
    /// The query took longer than `query.timeout` (HTTP 504).
    DeadlineExceeded,
    /// The aggregator is busy; retry (HTTP 503).
    Unavailable,
    /// The aggregator failed (HTTP 500).
    Internal,
}

impl Code {
    fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::ResourceExhausted => "resource_exhausted",
            Code::Unimplemented => "unimplemented",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::Unavailable => "unavailable",
            Code::Internal => "internal",
        }
    }

    fn status(self) -> StatusCode {
        match self {
            Code::InvalidArgument => StatusCode::BAD_REQUEST,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A Connect error: a code and what was wrong.
#[derive(Debug)]
pub(super) struct ConnectError {
    /// The code.
    pub(super) code: Code,
    /// The message.
    pub(super) message: String,
    /// The `error_type` of `smolder_aggregator_errors_total{stage="query"}`.
    pub(super) error_type: &'static str,
}

impl ConnectError {
    /// An option or method Smolder does not serve.
    pub(super) fn unimplemented(message: impl Into<String>) -> ConnectError {
        ConnectError {
            code: Code::Unimplemented,
            message: message.into(),
            error_type: "unimplemented",
        }
    }

    fn invalid(message: impl Into<String>, error_type: &'static str) -> ConnectError {
        ConnectError {
            code: Code::InvalidArgument,
            message: message.into(),
            error_type,
        }
    }
}

impl From<QueryError> for ConnectError {
    fn from(error: QueryError) -> ConnectError {
        let error_type = error.error_type();
        match error {
            QueryError::Store(source) => {
                // Logged once, here; the client gets the generic message.
                ApiError::internal(chain(&source));
                ConnectError {
                    code: Code::Internal,
                    message: "internal error; see the aggregator's log".to_owned(),
                    error_type,
                }
            }
            QueryError::Panicked => {
                ApiError::internal(&error);
                ConnectError {
                    code: Code::Internal,
                    message: "internal error; see the aggregator's log".to_owned(),
                    error_type,
                }
            }
            QueryError::Timeout { .. } => ConnectError {
                code: Code::DeadlineExceeded,
                message: error.to_string(),
                error_type,
            },
            QueryError::Busy { .. } => ConnectError {
                code: Code::Unavailable,
                message: error.to_string(),
                error_type,
            },
            other => ConnectError::invalid(other.to_string(), error_type),
        }
    }
}

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.code.name(), "message": self.message });
        (
            self.code.status(),
            [(CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response()
    }
}

/// The codec of a request's `Content-Type`.
fn codec(headers: &HeaderMap) -> Result<Codec, ConnectError> {
    let value = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "application/proto" | "application/protobuf" | "application/x-protobuf" => Ok(Codec::Proto),
        "application/json" => Ok(Codec::Json),
        _ => Err(ConnectError::invalid(
            format!(
                "unsupported Content-Type {value:?}; expected application/proto or application/json (Connect unary)"
            ),
            "unsupported_media_type",
        )),
    }
}

/// Reads a unary request: its codec, and its message decoded under [`MAX_REQUEST_BYTES`].
///
/// # Errors
///
/// `invalid_argument` for an unknown content type or encoding, a body that does not gunzip or
/// decode; `resource_exhausted` past the size cap.
pub(super) async fn read<M: Message + Default + DeserializeOwned>(
    request: Request,
) -> Result<(Codec, M), ConnectError> {
    let (parts, body) = request.into_parts();
    let codec = codec(&parts.headers)?;
    let gzip = match parts
        .headers
        .get(CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase())
    {
        None => false,
        Some(encoding) if encoding == "gzip" => true,
        Some(encoding) if encoding.is_empty() || encoding == "identity" => false,
        Some(encoding) => {
            return Err(ConnectError::invalid(
                format!("unsupported Content-Encoding {encoding:?}; only gzip is supported"),
                "unsupported_encoding",
            ));
        }
    };
    let bytes = read_body(body).await?;
    let bytes = if gzip { gunzip(&bytes)? } else { bytes };
    let message = match codec {
        Codec::Proto => M::decode(&bytes[..]).map_err(|err| {
            ConnectError::invalid(format!("invalid protobuf request: {err}"), "bad_request")
        })?,
        Codec::Json => serde_json::from_slice(&bytes).map_err(|err| {
            ConnectError::invalid(format!("invalid json request: {err}"), "bad_request")
        })?,
    };
    Ok((codec, message))
}

fn too_large() -> ConnectError {
    ConnectError {
        code: Code::ResourceExhausted,
        message: format!("request is larger than {MAX_REQUEST_BYTES} bytes"),
        error_type: "request_too_large",
    }
}

async fn read_body(body: Body) -> Result<Vec<u8>, ConnectError> {
    match Limited::new(body, MAX_REQUEST_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes().to_vec()),
        Err(err) if err.is::<LengthLimitError>() => Err(too_large()),
        Err(err) => Err(ConnectError::invalid(
            format!("reading the request failed: {err}"),
            "body_read",
        )),
    }
}

fn gunzip(bytes: &[u8]) -> Result<Vec<u8>, ConnectError> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .take(MAX_REQUEST_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|err| ConnectError::invalid(format!("invalid gzip body: {err}"), "bad_gzip"))?;
    if out.len() > MAX_REQUEST_BYTES {
        return Err(too_large());
    }
    Ok(out)
}

/// The answer `message` in `codec`.
pub(super) fn respond<M: Message + Serialize>(codec: Codec, message: &M) -> Response {
    let body = match codec {
        Codec::Proto => message.encode_to_vec(),
        // Plain structs with string keys: serde_json cannot fail on them.
        Codec::Json => serde_json::to_vec(message).expect("query answers serialize to json"),
    };
    ([(CONTENT_TYPE, codec.content_type())], body).into_response()
}
