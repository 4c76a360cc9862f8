//! Listings: label names, label values and apps.
//!
//! - `GET /labels`, `GET /label-names`: a JSON array of label names (sorted, `__name__` not
//!   listed). `query` restricts it to the series of that selector's app (its matchers are
//!   ignored, as in Pyroscope).
//! - `GET /label-values?label=<name>`: a JSON array of that label's values (sorted). `label` is
//!   required; `label=__name__` lists app names. `query` restricts it to the series the selector
//!   matches, matchers included.
//! - `GET /api/apps`: `[{"name", "spyName", "sampleRate", "units"}]`, sorted by name, each with
//!   the metadata of the app's most recently written series. (`DELETE /api/apps` is `admin`'s.)
//!
//! Unlike Pyroscope, `from`/`until` are honoured by the listings: only series with data in the
//! range count. Without them the range is all stored data, which is what Pyroscope lists.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::{Params, Querier, RawQuery, blocking, respond};
use crate::tenant::Tenant;

/// `GET /labels` and `GET /label-names`.
pub(super) async fn names(
    State(querier): State<Arc<Querier>>,
    tenant: Tenant,
    query: RawQuery,
) -> Response {
    let started = Instant::now();
    let result = async {
        let params = Params::new(query)?;
        let range = params.range(("from", "until"), SystemTime::now(), UNIX_EPOCH)?;
        let app = match params.get("query") {
            Some(_) => Some(params.selector("query")?.app().to_owned()),
            None => None,
        };
        let names = blocking(&querier, move |store| {
            Ok(store.label_names(&tenant, app.as_deref(), range)?)
        })
        .await?;
        Ok((Json(names).into_response(), "json"))
    }
    .await;
    respond(&querier, "label_names", started, result)
}

/// `GET /label-values`.
pub(super) async fn values(
    State(querier): State<Arc<Querier>>,
    tenant: Tenant,
    query: RawQuery,
) -> Response {
    let started = Instant::now();
    let result = async {
        let params = Params::new(query)?;
        let label = params.require("label")?.to_owned();
        let range = params.range(("from", "until"), SystemTime::now(), UNIX_EPOCH)?;
        let selector = match params.get("query") {
            Some(_) => Some(params.selector("query")?),
            None => None,
        };
        let values = blocking(&querier, move |store| {
            Ok(store.label_values(&tenant, &label, selector.as_ref(), range)?)
        })
        .await?;
        Ok((Json(values).into_response(), "json"))
    }
    .await;
    respond(&querier, "label_values", started, result)
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
pub(super) async fn apps(State(querier): State<Arc<Querier>>, tenant: Tenant) -> Response {
    let started = Instant::now();
    let result = async {
        let apps = blocking(&querier, move |store| Ok(store.apps(&tenant)?)).await?;
        let apps: Vec<App> = apps
            .into_iter()
            .map(|app| App {
                name: app.name,
                spy_name: app.meta.spy_name,
                sample_rate: app.meta.sample_rate,
                units: app.meta.units,
            })
            .collect();
        Ok((Json(apps).into_response(), "json"))
    }
    .await;
    respond(&querier, "apps", started, result)
}
