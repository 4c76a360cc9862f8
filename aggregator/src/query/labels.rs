//! Listings: label names, label values and apps; and deleting an app.
//!
//! - `GET /labels`, `GET /label-names`: a JSON array of label names (sorted, `__name__` not
//!   listed). `query` restricts it to the series of that selector's app (its matchers are
//!   ignored, as in Pyroscope).
//! - `GET /label-values?label=<name>`: a JSON array of that label's values (sorted). `label` is
//!   required; `label=__name__` lists app names. `query` restricts it to the series the selector
//!   matches, matchers included.
//! - `GET /api/apps`: `[{"name", "spyName", "sampleRate", "units"}]`, sorted by name, each with
//!   the metadata of the app's most recently written series.
//! - `DELETE /api/apps` with body `{"name": "<app>"}`: deletes every series of the app and all
//!   its data; 200 with an empty body. 400 when the body has no name; **404** when no series of
//!   that name exists. Pyroscope answers 200 there; a typo'd name that silently deletes nothing
//!   is worth telling the caller about, and a script that wants idempotence can accept 404.
//!
//! Unlike Pyroscope, `from`/`until` are honoured by the listings: only series with data in the
//! range count. Without them the range is all stored data, which is what Pyroscope lists.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::{Params, QueryError, RawQuery, blocking, respond};
use crate::app::AppState;

/// `GET /labels` and `GET /label-names`.
pub(super) async fn names(State(state): State<AppState>, query: RawQuery) -> Response {
    let result = async {
        let params = Params::new(query)?;
        let range = params.range(("from", "until"), SystemTime::now(), UNIX_EPOCH)?;
        let app = match params.get("query") {
            Some(_) => Some(params.selector("query")?.app().to_owned()),
            None => None,
        };
        let names = blocking(&state.store, move |store| {
            Ok(store.label_names(app.as_deref(), range)?)
        })
        .await?;
        Ok(Json(names).into_response())
    }
    .await;
    respond(&state, result)
}

/// `GET /label-values`.
pub(super) async fn values(State(state): State<AppState>, query: RawQuery) -> Response {
    let result = async {
        let params = Params::new(query)?;
        let label = params.require("label")?.to_owned();
        let range = params.range(("from", "until"), SystemTime::now(), UNIX_EPOCH)?;
        let selector = match params.get("query") {
            Some(_) => Some(params.selector("query")?),
            None => None,
        };
        let values = blocking(&state.store, move |store| {
            Ok(store.label_values(&label, selector.as_ref(), range)?)
        })
        .await?;
        Ok(Json(values).into_response())
    }
    .await;
    respond(&state, result)
}

/// One entry of `GET /api/apps`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct App {
    name: String,
    spy_name: String,
    sample_rate: u32,
    units: String,
}

/// `GET /api/apps`.
pub(super) async fn apps(State(state): State<AppState>) -> Response {
    let result = async {
        let apps = blocking(&state.store, |store| Ok(store.apps()?)).await?;
        let apps: Vec<App> = apps
            .into_iter()
            .map(|app| App {
                name: app.name,
                spy_name: app.meta.spy_name,
                sample_rate: app.meta.sample_rate,
                units: app.meta.units,
            })
            .collect();
        Ok(Json(apps).into_response())
    }
    .await;
    respond(&state, result)
}

/// The body of `DELETE /api/apps`.
#[derive(Deserialize)]
struct DeleteApp {
    #[serde(default)]
    name: Option<String>,
}

/// `DELETE /api/apps`.
pub(super) async fn delete_app(State(state): State<AppState>, body: Bytes) -> Response {
    let result = async {
        let request: DeleteApp =
            serde_json::from_slice(&body).map_err(|err| QueryError::InvalidBody {
                reason: err.to_string(),
            })?;
        let name = request
            .name
            .filter(|name| !name.is_empty())
            .ok_or_else(|| QueryError::InvalidBody {
                reason: "no `name`".to_owned(),
            })?;
        let deleted = state.store.delete_app(&name).await?;
        if deleted == 0 {
            return Err(QueryError::AppNotFound { name });
        }
        tracing::info!(app = %name, series = deleted, "deleted app");
        Ok(().into_response())
    }
    .await;
    respond(&state, result)
}
