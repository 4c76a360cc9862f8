//! The HTTP surface: one listener, the stages' routes mounted side by side, `/metrics`,
//! `/healthz` and `/readyz` (each loop's state, `smolder_daemon::health`), and the request
//! metrics Pyroscope's dashboards read.
//!
//! Input: the routes of the stages (ingest, query, rules, admin, ui, auth), each already
//! holding its own state and naming who may call it (`auth::Routes`). Output: one [`Router`]
//! for the listener and the table of every route with its access. Caller: `app`. Owns
//! [`HttpConfig`], `pyroscope_request_duration_seconds` and the listener's connection
//! metrics; knows nothing of the stages, so that none of them depends on it (the one way a
//! handler says no is `api_error`).

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use prometheus::{HistogramVec, Registry};
use smolder_daemon::http::ListenerMetrics;
use smolder_daemon::metrics::{counter, gauge, histogram_vec, latency_buckets};

use crate::admission::{self, Admission};
use crate::api_error::ApiError;
use crate::auth::{self, Auth, Route, Routes};
use crate::metrics::Metrics;

/// The HTTP listener of the API, the UI and `/metrics`, by default on `0.0.0.0:4040`.
pub type HttpConfig = smolder_daemon::HttpConfig<false, 4040>;

/// `pyroscope_request_duration_seconds{method,route,status_code,ws}`, labelled the way
/// Pyroscope's dashboards expect.
#[derive(Clone)]
pub(crate) struct RequestMetrics(HistogramVec);

impl RequestMetrics {
    /// Creates the request metric in `registry`.
    pub(crate) fn new(registry: &Registry) -> Self {
        RequestMetrics(histogram_vec(
            registry,
            "pyroscope_request_duration_seconds",
            "Time to answer an HTTP request.",
            latency_buckets(),
            &["method", "route", "status_code", "ws"],
        ))
    }
}

/// What the router's own handlers use.
#[derive(Clone)]
struct Shared {
    metrics: Arc<Metrics>,
    requests: RequestMetrics,
}

/// The listener's connection metrics: `smolder_aggregator_http_connections_open`, refusals at
/// `http.max-connections` in `smolder_aggregator_refused_total{stage="http",
/// reason="connections"}`, and `smolder_aggregator_http_tls_failures_total`.
pub(crate) fn listener_metrics(metrics: &Metrics) -> ListenerMetrics {
    let registry = metrics.registry();
    ListenerMetrics {
        connections_open: gauge(
            registry,
            "smolder_aggregator_http_connections_open",
            "HTTP connections open now (http.max-connections).",
        ),
        connections_refused: metrics.refused.counter("http", "connections"),
        tls_failures: counter(
            registry,
            "smolder_aggregator_http_tls_failures_total",
            "HTTPS connections whose TLS handshake failed or timed out.",
        ),
    }
}

/// Every route of the aggregator: the stages' `routes`, `/metrics` from `metrics` (open to
/// `metrics_access`), and `/healthz` and `/readyz` from its health (open to `health_access`);
/// with the table of them all. Around every route, outermost first: the request metrics
/// (`requests`), authentication (`auth`), admission (`admission`).
pub(crate) fn router(
    stages: impl IntoIterator<Item = Routes>,
    metrics: Arc<Metrics>,
    requests: RequestMetrics,
    auth: Arc<Auth>,
    admission: Arc<Admission>,
) -> (Router, Vec<Route>) {
    let (metrics_access, health_access) = (
        auth.config().metrics_access(),
        auth.config().health_access(),
    );
    let health = Routes::mount(
        metrics.health.routes(),
        health_access,
        &[(Method::GET, "/healthz"), (Method::GET, "/readyz")],
    );
    let shared = Shared { metrics, requests };
    let own = Routes::new()
        .get("/metrics", metrics_access, serve_metrics)
        .with_state(shared.clone())
        .merge(health);
    let (router, table) = stages.into_iter().fold(own, Routes::merge).into_parts();
    let router = router
        .layer(middleware::from_fn_with_state(admission, admission::layer))
        .layer(middleware::from_fn_with_state(auth, auth::layer))
        .layer(middleware::from_fn_with_state(shared, track));
    (router, table)
}

async fn serve_metrics(State(shared): State<Shared>) -> Response {
    match shared.metrics.render() {
        Ok(text) => ([("content-type", prometheus::TEXT_FORMAT)], text).into_response(),
        Err(err) => ApiError::internal(err).into_response(),
    }
}

/// Records `pyroscope_request_duration_seconds` for every request.
async fn track(State(shared): State<Shared>, request: Request, next: Next) -> Response {
    let method = request.method().as_str().to_owned();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_owned(), |path| route_name(path.as_str()));
    let started = Instant::now();
    let response = next.run(request).await;
    shared
        .requests
        .0
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
