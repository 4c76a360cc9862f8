//! `ApiError`: the one way an HTTP handler says no.
//!
//! Input: a stage's refusal or failure. Output: a response with a status and a message that says
//! what was wrong. Callers: every handler (ingest, query, rules, admin) and the router's own
//! `/metrics`. Owns nothing; a leaf that depends on no other module of the crate, so that the
//! stages can answer HTTP without importing the router.

use std::error::Error;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An answer other than success: a status and a message that says what was wrong.
///
/// Client mistakes are 4xx with the reason in the body; only the aggregator's own failures are
/// 5xx, and those are logged here, once.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    /// 400: a parameter is missing or malformed.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    /// 404: nothing by that name.
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
        }
    }

    /// 409: the request conflicts with what exists (a name taken, a rule that is read-only).
    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::CONFLICT,
            message: message.into(),
        }
    }

    /// 500: the aggregator failed; the cause is logged, the client gets a generic message.
    pub(crate) fn internal(error: impl std::fmt::Display) -> Self {
        tracing::error!(%error, "request failed");
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: "internal error; see the aggregator's log".to_owned(),
        }
    }

    /// The status this error answers with.
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, format!("{}\n", self.message)).into_response()
    }
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
