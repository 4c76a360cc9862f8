//! The rules' HTTP surface: `GET /exported-metrics` and the recording-rules API.
//!
//! | route | answer |
//! |---|---|
//! | `GET /exported-metrics` | the tenant's counters of every rule, Prometheus text format, each series labelled `tenant` under multitenancy |
//! | `GET /api/recording-rules` | `{"rules": [rule, ...]}` |
//! | `POST /api/recording-rules` | 201 and the rule; 409 if the name is taken |
//! | `PUT /api/recording-rules/{name}` | 200 and the rule, replaced whole (what the body leaves out takes its default); 404 if there is none |
//! | `DELETE /api/recording-rules/{name}` | 204; 404 if there is none |
//!
//! A rule is `{"name", "expr", "node", "function", "group_by", "provisioned"}`; `provisioned`
//! is read-only and true for the config file's rules, which answer 409 to `PUT` and `DELETE`.
//! An invalid rule answers 400 with a message that names the rule and what is wrong. Every
//! route serves the request's tenant (`X-Scope-OrgID` under multitenancy): a rule made
//! through the API is that tenant's, counts that tenant's profiles only and is listed, changed
//! and deleted by that tenant only; the config file's rules are every tenant's.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use smolder_common::rules::RuleSpec;

use std::sync::Arc;

use super::{Rules, RulesError};
use crate::api_error::{self, ApiError};
use crate::auth::{Access, Routes, Scope};
use crate::store::StoreError;
use crate::tenant::Tenant;

/// The largest rule body accepted: a rule is a name, a selector and a regex.
const MAX_RULE_BYTES: usize = 64 << 10;

/// When a client may try again a change the bucket did not take (object-storage mode).
const STORE_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// The rules' routes, answered from `rules`: reading for credentials with scope `read`,
/// changing for those with `admin`.
pub(crate) fn routes(rules: Arc<Rules>) -> Routes {
    let (read, admin) = (Access::Scope(Scope::Read), Access::Scope(Scope::Admin));
    Routes::new()
        .get("/exported-metrics", read, exported_metrics)
        .get("/api/recording-rules", read, list)
        .post("/api/recording-rules", admin, create)
        .put("/api/recording-rules/{name}", admin, update)
        .delete("/api/recording-rules/{name}", admin, delete)
        .layer(DefaultBodyLimit::max(MAX_RULE_BYTES))
        .with_state(rules)
}

/// A rule as a client sends it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleBody {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    expr: String,
    #[serde(default)]
    node: String,
    #[serde(default)]
    function: String,
    #[serde(default, alias = "labels")]
    group_by: Vec<String>,
    /// Read-only: accepted so that a rule read from the API can be sent back, but ignored.
    #[serde(default)]
    #[expect(dead_code, reason = "read-only field, accepted and ignored")]
    provisioned: Option<bool>,
}

impl RuleBody {
    fn parse(body: &[u8]) -> Result<RuleBody, ApiError> {
        serde_json::from_slice(body)
            .map_err(|err| ApiError::bad_request(format!("invalid rule body: {err}")))
    }

    fn spec(self) -> (Option<String>, RuleSpec) {
        (
            self.name,
            RuleSpec {
                expr: self.expr,
                node: self.node,
                function: self.function,
                group_by: self.group_by,
            },
        )
    }
}

impl From<RulesError> for ApiError {
    fn from(err: RulesError) -> ApiError {
        match err {
            RulesError::Invalid(_) => ApiError::bad_request(err.to_string()),
            RulesError::NotFound { .. } => ApiError::not_found(err.to_string()),
            RulesError::Exists { .. } | RulesError::Provisioned { .. } => {
                ApiError::conflict(err.to_string())
            }
            // Object-storage mode: the bucket did not take the change; nothing changed.
            RulesError::Store(StoreError::Unavailable { .. }) => {
                tracing::warn!(error = %api_error::chain(&err), "rule change refused: the store is unavailable");
                ApiError::unavailable(
                    "the store is unavailable (its object store does not answer); the rule was not changed, retry later",
                    STORE_RETRY_AFTER,
                )
            }
            RulesError::Stored { .. }
            | RulesError::Store(_)
            | RulesError::RemoteWriteUrl { .. }
            | RulesError::RemoteWriteLabel { .. } => ApiError::internal(err),
        }
    }
}

async fn exported_metrics(State(rules): State<Arc<Rules>>, tenant: Tenant) -> Response {
    (
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        rules.render(&tenant),
    )
        .into_response()
}

async fn list(State(rules): State<Arc<Rules>>, tenant: Tenant) -> Response {
    Json(serde_json::json!({ "rules": rules.list(&tenant) })).into_response()
}

async fn create(
    State(rules): State<Arc<Rules>>,
    tenant: Tenant,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (name, spec) = RuleBody::parse(&body)?.spec();
    let name = name
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request("rule has no name: set \"name\" to a metric name"))?;
    let rule = rules.put(&tenant, name, spec, false).await?;
    Ok((StatusCode::CREATED, Json(rule)).into_response())
}

async fn update(
    State(rules): State<Arc<Rules>>,
    tenant: Tenant,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (body_name, spec) = RuleBody::parse(&body)?.spec();
    if let Some(body_name) = body_name.filter(|n| *n != name) {
        return Err(ApiError::bad_request(format!(
            "rule {name:?}: the body names rule {body_name:?}; a rule cannot be renamed, create the new name and delete the old"
        )));
    }
    let rule = rules.put(&tenant, name, spec, true).await?;
    Ok(Json(rule).into_response())
}

async fn delete(
    State(rules): State<Arc<Rules>>,
    tenant: Tenant,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    rules.delete(&tenant, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
