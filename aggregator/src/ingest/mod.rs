//! Ingest: Pyroscope's push APIs, turned into profiles for the store.

use axum::Router;
use serde::{Deserialize, Serialize};

use crate::app::AppState;

/// Limits on what clients may send.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct IngestConfig {
    /// Largest request body accepted as sent, in bytes; larger ones get 413. Default 16 MiB.
    pub max_body_bytes: usize,
    /// Largest body accepted after gzip decompression, in bytes; larger ones get 413. Default
    /// 64 MiB.
    pub max_decompressed_bytes: usize,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            max_body_bytes: 16 << 20,
            max_decompressed_bytes: 64 << 20,
        }
    }
}

/// The ingest routes.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
}
