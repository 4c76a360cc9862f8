//! The HTTP surface: the router that mounts ingest and query, the error type every handler
//! answers with, and the request metrics Pyroscope's dashboards read.

use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::app::AppState;
use crate::{ingest, query, rules, ui};

/// Every route of the aggregator.
pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .merge(ingest::routes())
        .merge(query::routes())
        .merge(rules::routes())
        .merge(ui::routes())
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .layer(middleware::from_fn_with_state(state.clone(), track))
        .with_state(state)
}

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
}

impl ApiError {
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

async fn metrics(State(state): State<AppState>) -> Response {
    match state.metrics.render() {
        Ok(text) => ([("content-type", prometheus::TEXT_FORMAT)], text).into_response(),
        Err(err) => ApiError::internal(err).into_response(),
    }
}

/// Records `pyroscope_request_duration_seconds` for every request, labelled the way Pyroscope's
/// dashboards expect.
async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let method = request.method().as_str().to_owned();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_owned(), |path| route_name(path.as_str()));
    let started = Instant::now();
    let response = next.run(request).await;
    state
        .metrics
        .request_duration
        .with_label_values(&[&method, &route, response.status().as_str(), "false"])
        .observe(started.elapsed().as_secs_f64());
    response
}

/// Pyroscope (dskit) names a route by its path, lower-cased, with every run of characters
/// other than letters and digits turned into `_`: `/push.v1.PusherService/Push` becomes
/// `push_v1_pusherservice_push`.
fn route_name(path: &str) -> String {
    let mut name = String::with_capacity(path.len());
    for c in path.chars() {
        if c.is_ascii_alphanumeric() {
            name.push(c.to_ascii_lowercase());
        } else if !name.is_empty() && !name.ends_with('_') {
            name.push('_');
        }
    }
    while name.ends_with('_') {
        name.pop();
    }
    if name.is_empty() {
        "root".to_owned()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_named_like_pyroscope() {
        assert_eq!(route_name("/ingest"), "ingest");
        assert_eq!(
            route_name("/push.v1.PusherService/Push"),
            "push_v1_pusherservice_push"
        );
        assert_eq!(route_name("/pyroscope/render"), "pyroscope_render");
        assert_eq!(route_name("/"), "root");
    }
}
