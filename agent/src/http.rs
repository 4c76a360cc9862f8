//! The agent's HTTP port: `/metrics` for Prometheus, `/exported-metrics` for the rules' counters,
//! `/targets` for the pprof scraper's targets and their health, and `/healthz` (liveness) and
//! `/readyz` (readiness), which name each loop's state (`smolder_daemon::health`).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::metrics::Metrics;
use crate::rules::Exported;

/// What every handler can reach.
#[derive(Clone)]
pub struct HttpState {
    /// The agent's metrics.
    pub metrics: Arc<Metrics>,
    /// The pprof scraper's targets, for `/targets`.
    pub targets: crate::scrape::Status,
    /// The counters of the rules, for `/exported-metrics`.
    pub exported: Arc<Exported>,
}

/// Every route of the agent.
pub fn router(state: HttpState) -> Router {
    let health = state.metrics.health.routes();
    Router::new()
        .route("/metrics", get(metrics))
        .route("/targets", get(targets))
        .route("/exported-metrics", get(exported_metrics))
        .with_state(state)
        .merge(health)
}

async fn metrics(State(state): State<HttpState>) -> Response {
    match state.metrics.render() {
        Ok(text) => ([("content-type", prometheus::TEXT_FORMAT)], text).into_response(),
        Err(err) => {
            tracing::error!(error = %err, "encoding metrics failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "encoding metrics failed\n",
            )
                .into_response()
        }
    }
}

/// Every scrape target with its labels, health, last scrape and last error; dropped targets
/// with why; each discovery source's last refresh.
async fn targets(
    State(state): State<HttpState>,
) -> axum::Json<crate::scrape::status::TargetsDocument> {
    axum::Json(state.targets.snapshot())
}

async fn exported_metrics(State(state): State<HttpState>) -> Response {
    (
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        state.exported.render(),
    )
        .into_response()
}
