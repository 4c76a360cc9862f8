//! Query: flame graphs, diffs, timelines and label listings over stored profiles.

use axum::Router;
use serde::{Deserialize, Serialize};

use crate::app::AppState;

/// Limits and defaults of the query API.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueryConfig {
    /// Node budget of a flame graph when the request names none (`maxNodes`). Default 8192, as
    /// Pyroscope.
    pub max_nodes_default: usize,
    /// The largest node budget a request may ask for. Default 1 048 576, as Pyroscope.
    pub max_nodes_limit: usize,
}

impl Default for QueryConfig {
    fn default() -> Self {
        QueryConfig {
            max_nodes_default: 8192,
            max_nodes_limit: 1 << 20,
        }
    }
}

/// The query routes.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
}
