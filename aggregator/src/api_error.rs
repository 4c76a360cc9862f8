//! `ApiError`: the one way an HTTP handler says no, and [`Refusal`], the way the layers in front
//! of the handlers (authentication, the tenant, admission) say it in the request's protocol.
//!
//! Input: a stage's refusal or failure. Output: a response with a status and a message that says
//! what was wrong. Callers: every handler (ingest, query, rules, admin), the router's own
//! `/metrics`, and `auth`, `tenant` and `admission`. Owns nothing; a leaf that depends on no
//! other module of the crate, so that the stages can answer HTTP without importing the router.

use std::error::Error;
use std::time::Duration;

use axum::http::header::{CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// An answer other than success: a status and a message that says what was wrong.
///
/// Client mistakes are 4xx with the reason in the body; only the aggregator's own failures are
/// 5xx, and those are logged here, once.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
    retry_after: Option<Duration>,
}

impl ApiError {
    /// 400: a parameter is missing or malformed.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// `status` with `message`.
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 503 with `Retry-After`: the aggregator is busy; the same request may succeed later.
    pub(crate) fn unavailable(message: impl Into<String>, after: Duration) -> Self {
        ApiError {
            retry_after: Some(after),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
        }
    }

    /// 404: nothing by that name.
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    /// 409: the request conflicts with what exists (a name taken, a rule that is read-only).
    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::CONFLICT, message)
    }

    /// 500: the aggregator failed; the cause is logged, the client gets a generic message.
    pub(crate) fn internal(error: impl std::fmt::Display) -> Self {
        tracing::error!(%error, "request failed");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal error; see the aggregator's log",
        )
    }

    /// The status this error answers with.
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, format!("{}\n", self.message)).into_response();
        if let Some(after) = self.retry_after {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
        }
        response
    }
}

/// A request refused before (or instead of) its handler, answered in the protocol the request
/// speaks: a gRPC status for gRPC, Connect's JSON error for a Connect procedure
/// (`/<package>.<Service>/<Method>`), plain text for the rest. A refusal for load carries
/// `Retry-After`; a 401 carries `WWW-Authenticate: Bearer`.
#[derive(Debug)]
pub(crate) struct Refusal {
    status: StatusCode,
    message: String,
    protocol: Protocol,
    retry_after: Option<Duration>,
}

/// How a refused request wants its error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// gRPC (`content-type: application/grpc...`): trailers-only, HTTP 200.
    Grpc,
    /// A Connect unary procedure: `{"code", "message"}`.
    Connect,
    /// Anything else: the message as text.
    Plain,
}

impl Protocol {
    /// The protocol of a request to `path` with `headers`.
    pub(crate) fn of(path: &str, headers: &HeaderMap) -> Protocol {
        let grpc = headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"));
        // A Connect or gRPC procedure's path is `/<package>.<Service>/<Method>`.
        let procedure = path
            .trim_start_matches('/')
            .split('/')
            .next()
            .is_some_and(|service| service.contains('.'));
        match (grpc, procedure) {
            (true, _) => Protocol::Grpc,
            (false, true) => Protocol::Connect,
            (false, false) => Protocol::Plain,
        }
    }
}

impl Refusal {
    /// A refusal with `status` and `message` in `protocol`.
    pub(crate) fn new(protocol: Protocol, status: StatusCode, message: impl Into<String>) -> Self {
        Refusal {
            status,
            message: message.into(),
            protocol,
            retry_after: None,
        }
    }

    /// The same, telling the client when to try again (`Retry-After`, whole seconds, at
    /// least 1).
    #[must_use]
    pub(crate) fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }
}

/// `Retry-After`'s value: whole seconds, rounded up, at least 1.
pub(crate) fn retry_after_secs(after: Duration) -> u64 {
    (after.as_secs() + u64::from(after.subsec_nanos() > 0)).max(1)
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response = match self.protocol {
            Protocol::Plain => (self.status, format!("{}\n", self.message)).into_response(),
            Protocol::Connect => {
                let body = serde_json::json!({
                    "code": connect_code(self.status),
                    "message": self.message,
                });
                (
                    self.status,
                    [(CONTENT_TYPE, "application/json")],
                    body.to_string(),
                )
                    .into_response()
            }
            Protocol::Grpc => {
                // A trailers-only answer: HTTP 200, the status in the headers.
                let mut response = StatusCode::OK.into_response();
                let headers = response.headers_mut();
                headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
                headers.insert("grpc-status", HeaderValue::from(grpc_code(self.status)));
                if let Ok(message) = HeaderValue::from_str(&grpc_message(&self.message)) {
                    headers.insert("grpc-message", message);
                }
                response
            }
        };
        let headers = response.headers_mut();
        if let Some(after) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"smolder\""),
            );
        }
        response
    }
}

/// Connect's code for an HTTP status.
pub(crate) fn connect_code(status: StatusCode) -> &'static str {
    match status {
        StatusCode::UNAUTHORIZED => "unauthenticated",
        StatusCode::FORBIDDEN => "permission_denied",
        StatusCode::TOO_MANY_REQUESTS | StatusCode::PAYLOAD_TOO_LARGE => "resource_exhausted",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        StatusCode::GATEWAY_TIMEOUT => "deadline_exceeded",
        status if status.is_client_error() => "invalid_argument",
        _ => "internal",
    }
}

/// gRPC's status code for an HTTP status.
fn grpc_code(status: StatusCode) -> u32 {
    match status {
        StatusCode::UNAUTHORIZED => 16,
        StatusCode::FORBIDDEN => 7,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::PAYLOAD_TOO_LARGE => 8,
        StatusCode::SERVICE_UNAVAILABLE => 14,
        StatusCode::GATEWAY_TIMEOUT => 4,
        status if status.is_client_error() => 3,
        _ => 13,
    }
}

/// gRPC's `grpc-message` encoding: bytes outside printable ASCII, and `%`, percent-encoded.
pub(crate) fn grpc_message(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `error` and its sources, `: `-separated: the detail a 500's log line or a client's 4xx needs
/// is often in a source (prost's, flate2's, sled's).
pub(crate) fn chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2001)), 3);
        assert_eq!(grpc_message("50% \u{fc}"), "50%25 %C3%BC");
    }

    #[test]
    fn the_protocol_follows_the_path_and_content_type() {
        let mut grpc = HeaderMap::new();
        grpc.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        assert_eq!(Protocol::of("/a.B/C", &grpc), Protocol::Grpc);
        assert_eq!(
            Protocol::of("/querier.v1.QuerierService/Series", &HeaderMap::new()),
            Protocol::Connect
        );
        assert_eq!(Protocol::of("/render", &HeaderMap::new()), Protocol::Plain);
        let refused = Refusal::new(Protocol::Grpc, StatusCode::SERVICE_UNAVAILABLE, "busy")
            .retry_after(Duration::from_millis(1500))
            .into_response();
        assert_eq!(refused.status(), StatusCode::OK);
        assert_eq!(refused.headers()["grpc-status"], "14");
        assert_eq!(refused.headers()[RETRY_AFTER], "2");
    }
}
