//! Admin: the writes of the HTTP API that are not ingest, today `DELETE /api/apps`.
//!
//! Input: `DELETE /api/apps` with body `{"name": "<app>"}`. Output: the app's data stamped before
//! now (rounded up to 10 s) deleted, durably and on every aggregator of the store, also what
//! arrives later with such timestamps (`Store::delete_app`); 200 with an empty body. 400 when
//! the body has no name; **404** when no series of that name has data to delete. Pyroscope
//! answers 200 there; a typo'd name that silently deletes nothing is worth telling the caller
//! about, and a script that wants idempotence can accept 404. **503** with `Retry-After` when
//! the store's bucket does not take the deletion within `store.object-store.upload-timeout`
//! (it may have been stored all the same; asking again is harmless). Caller: the router in `http.rs` mounts [`routes`]. Owns nothing;
//! depends on `store`, `metrics`, `api_error` and `tenant`. Failures are counted in
//! `smolder_aggregator_errors_total{stage="admin"}`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tracing::info;

use crate::api_error::{ApiError, chain};
use crate::auth::{Access, Routes, Scope};
use crate::metrics::Errors;
use crate::store::{Store, StoreError};
use crate::tenant::Tenant;

/// When a client refused for an unavailable store is told to come back.
const STORE_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// What the admin handlers share.
struct Admin {
    store: Arc<dyn Store>,
    errors: Errors,
}

/// The admin routes, writing to `store`, for credentials with scope `admin`.
pub(crate) fn routes(store: Arc<dyn Store>, errors: Errors) -> Routes {
    Routes::new()
        .delete("/api/apps", Access::Scope(Scope::Admin), delete_app)
        .with_state(Arc::new(Admin { store, errors }))
}

/// Why an admin request was refused.
#[derive(Debug, thiserror::Error)]
enum AdminError {
    /// The body of `DELETE /api/apps` is not `{"name": "<app>"}`.
    #[error("invalid body: {reason}; expected {{\"name\": \"<app>\"}}")]
    InvalidBody {
        /// What is wrong with it.
        reason: String,
    },
    /// `DELETE /api/apps` named an app with no series.
    #[error("no app named {name:?}")]
    AppNotFound {
        /// The name given.
        name: String,
    },
    /// The store failed; logged once where the response is built.
    #[error("writing the store failed")]
    Store(#[from] StoreError),
}

impl AdminError {
    /// The `error_type` label of `smolder_aggregator_errors_total{stage="admin"}`.
    fn error_type(&self) -> &'static str {
        match self {
            AdminError::InvalidBody { .. } => "invalid_body",
            AdminError::AppNotFound { .. } => "app_not_found",
            AdminError::Store(_) => "store",
        }
    }

    /// The answer: 404 for an unknown app, 503 while the store's bucket does not answer, 500
    /// for our own failures, 400 for the rest.
    fn into_api_error(self) -> ApiError {
        match self {
            AdminError::AppNotFound { .. } => ApiError::not_found(self.to_string()),
            AdminError::Store(StoreError::Unavailable { .. }) => {
                tracing::warn!(error = %chain(&self), "app deletion refused: the store is unavailable");
                ApiError::unavailable(
                    "the store is unavailable (its object store does not answer); the app may not be deleted, retry later",
                    STORE_RETRY_AFTER,
                )
            }
            AdminError::Store(source) => ApiError::internal(chain(&source)),
            AdminError::InvalidBody { .. } => ApiError::bad_request(self.to_string()),
        }
    }
}

/// The body of `DELETE /api/apps`.
#[derive(Deserialize)]
struct DeleteApp {
    #[serde(default)]
    name: Option<String>,
}

/// `DELETE /api/apps`.
async fn delete_app(State(admin): State<Arc<Admin>>, tenant: Tenant, body: Bytes) -> Response {
    let result = async {
        let request: DeleteApp =
            serde_json::from_slice(&body).map_err(|err| AdminError::InvalidBody {
                reason: err.to_string(),
            })?;
        let name = request
            .name
            .filter(|name| !name.is_empty())
            .ok_or_else(|| AdminError::InvalidBody {
                reason: "no `name`".to_owned(),
            })?;
        let deleted = admin.store.delete_app(&tenant, &name).await?;
        if deleted == 0 {
            return Err(AdminError::AppNotFound { name });
        }
        info!(app = %name, series = deleted, "deleted app");
        Ok(())
    }
    .await;
    match result {
        Ok(()) => ().into_response(),
        Err(err) => {
            admin.errors.inc("admin", err.error_type());
            err.into_api_error().into_response()
        }
    }
}
