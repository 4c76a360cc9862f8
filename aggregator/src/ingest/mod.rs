//! Ingest: Pyroscope's push APIs, turned into profiles for the store.
//!
//! Input: HTTP requests from Pyroscope's SDKs and tools. Output: [`Profile`]s, handed to
//! [`Store::write`](crate::store::Store::write) in one batch per request, so that a request is
//! stored whole or not at all. Caller: the router in `http`. Owns no tasks or files; parsing
//! runs on tokio's blocking pool.
//!
//! - `POST /ingest` (also `/pyroscope/ingest`): metadata in the query string ([`params`]),
//!   the profile in the body ([`body`] reads it under the caps of [`IngestConfig`]), as folded
//!   or `lines` text ([`folded`]), pprof, bare or in the Go SDK's multipart form ([`pprof`]),
//!   or a Java Flight Recorder recording, bare or in the Java agent's form ([`jfr`]).
//! - `POST /push.v1.PusherService/Push`: Connect's unary push of pprof profiles, binary or
//!   JSON ([`push`]).
//!
//! Authentication and tenancy headers that SDKs send (`Authorization: Bearer …` or `Basic …`,
//! `X-Scope-OrgID`, custom headers) are ignored: Smolder has no users or tenants yet, and an
//! SDK configured for Grafana Cloud must still be able to push to it unchanged.
//!
//! Every rejection is an [`IngestError`]: 400 for a bad parameter, 413 past a cap, 415 for a
//! content type or encoding not read here, 422 for a body that does not parse (400 on the
//! Connect route, as Connect's `invalid_argument`), 500 only when the store fails. Each is
//! counted in `smolder_aggregator_errors_total{stage="ingest"}` under a bounded `error_type`,
//! and logged at debug only: a client's mistake is not the operator's business.

mod body;
mod folded;
mod jfr;
mod params;
mod pprof;
mod push;
pub(crate) mod quic;

use std::collections::BTreeSet;
use std::error::Error as StdError;
use std::time::SystemTime;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::{Deserialize, Serialize};
use smolder_common::jfr::JfrError;
use smolder_common::{FoldedError, PprofError, Profile, SeriesError, TimeError};
use tracing::debug;

use crate::app::AppState;
use crate::http::ApiError;
use crate::store::{BatchMarker, StoreError, Written};

use self::params::{BodyFormat, IngestParams, SUPPORTED_FORMATS};

/// Limits on what clients may send.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct IngestConfig {
    /// Largest request body accepted as sent, in bytes; larger ones get 413. Default 16 MiB.
    pub max_body_bytes: usize,
    /// Largest body accepted after gzip decompression, in bytes; larger ones get 413. Default
    /// 64 MiB.
    pub max_decompressed_bytes: usize,
    /// Most series one request may write (a pprof body makes one per sample type and label
    /// set); more gets 422. Default 10 000.
    pub max_series_per_request: usize,
    /// Most labels one series may have; more gets 422. Default 30, as Pyroscope.
    pub max_labels_per_series: usize,
    /// Longest label name and value, in bytes; longer gets 422. Default 1024, as Pyroscope's
    /// name limit (every label is a key in the store's index).
    pub max_label_bytes: usize,
    /// The QUIC listener agents ship their batches to.
    pub quic: quic::QuicConfig,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            max_body_bytes: 16 << 20,
            max_decompressed_bytes: 64 << 20,
            max_series_per_request: 10_000,
            max_labels_per_series: 30,
            max_label_bytes: 1024,
            quic: quic::QuicConfig::default(),
        }
    }
}

/// The ingest routes.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/ingest", post(ingest))
        .route("/pyroscope/ingest", post(ingest))
        .route("/push.v1.PusherService/Push", post(push::push))
        // Bodies are read under `IngestConfig`'s caps by `body::read`; axum's own 2 MiB default
        // would otherwise cut multipart forms short with a different error.
        .layer(DefaultBodyLimit::disable())
}

/// Why an ingest request was rejected.
#[derive(Debug, thiserror::Error)]
pub(crate) enum IngestError {
    /// The `name` query parameter is absent or empty.
    #[error("missing required query parameter name")]
    MissingName,
    /// The query string is not `application/x-www-form-urlencoded`.
    #[error("malformed query string: {reason}")]
    BadQuery {
        /// What the decoder said.
        reason: String,
    },
    /// `name` is not a valid series name.
    #[error("invalid name {name:?}: {source}")]
    BadName {
        /// The parameter as sent.
        name: String,
        /// What is wrong, with its position.
        source: SeriesError,
    },
    /// `from` or `until` is not a time Pyroscope's API accepts.
    #[error("invalid {param} {value:?}: {source}")]
    BadTime {
        /// `from` or `until`.
        param: &'static str,
        /// The parameter as sent.
        value: String,
        /// What is wrong, with its position.
        source: TimeError,
    },
    /// A request's series are over one of the `ingest.max_*` limits on series and labels.
    #[error("{reason}")]
    SeriesLimit {
        /// Which limit, with the offending series.
        reason: String,
    },
    /// A profile's span ends more than [`MAX_CLOCK_SKEW`] after the aggregator's clock, or
    /// before the store's retention (`store.retention`), which would delete it at once.
    #[error("profile time out of range: {reason}")]
    TimeOutOfRange {
        /// Which bound, with the times involved.
        reason: String,
    },
    /// `until` is before `from`.
    #[error("until ({until}) is before from ({from})")]
    UntilBeforeFrom {
        /// `from` as sent.
        from: String,
        /// `until` as sent.
        until: String,
    },
    /// `sampleRate` is not a positive integer.
    #[error("invalid sampleRate {value:?}: expected a positive integer (Hz)")]
    BadSampleRate {
        /// The parameter as sent.
        value: String,
    },
    /// `aggregationType` is neither `sum` nor `average` (`avg`).
    #[error("invalid aggregationType {value:?}: expected sum, average or avg")]
    BadAggregation {
        /// The parameter as sent.
        value: String,
    },
    /// `format` is not a format Pyroscope knows.
    #[error("unknown format {format:?}; supported formats: {SUPPORTED_FORMATS}")]
    UnknownFormat {
        /// The parameter as sent.
        format: String,
    },
    /// `format` (or the legacy `Content-Type`) names a Pyroscope format Smolder does not read.
    #[error("format {format} is not supported; supported formats: {SUPPORTED_FORMATS}")]
    UnsupportedFormat {
        /// `trie`, `tree` or `speedscope`.
        format: String,
    },
    /// `Content-Encoding` is neither gzip nor identity.
    #[error("unsupported Content-Encoding {encoding:?}; only gzip is supported")]
    UnsupportedEncoding {
        /// The header as sent.
        encoding: String,
    },
    /// The body is larger than `ingest.max-body-bytes`.
    #[error("request body is larger than the limit of {limit} bytes (ingest.max-body-bytes)")]
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The body is larger than `ingest.max-decompressed-bytes` once gunzipped (either the
    /// `Content-Encoding` or a gzipped pprof).
    #[error(
        "decompressed body is larger than the limit of {limit} bytes (ingest.max-decompressed-bytes)"
    )]
    DecompressedTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// `Content-Encoding: gzip` but the body is not a valid gzip stream.
    #[error("invalid gzip body: {reason}")]
    BadGzip {
        /// What the decompressor said.
        reason: String,
    },
    /// The connection failed while the body was read.
    #[error("reading the request body failed: {reason}")]
    BodyRead {
        /// What hyper said.
        reason: String,
    },
    /// A folded or lines body does not parse.
    #[error("invalid {format} body: {source}")]
    Folded {
        /// `folded` or `lines`.
        format: &'static str,
        /// The line at fault and what is wrong with it.
        source: FoldedError,
    },
    /// A pprof profile, or the `sample_type_config` beside it, does not parse or is over a
    /// limit.
    #[error("invalid {part}: {}", chain(.source))]
    Pprof {
        /// Which part: `pprof body`, `profile field`, `prev_profile field`, ...
        part: String,
        /// What is wrong.
        source: PprofError,
    },
    /// A JFR recording does not parse.
    #[error("invalid {part}: {source}")]
    Jfr {
        /// Which part: `jfr body` or `jfr field`.
        part: &'static str,
        /// What is wrong, with its offset in the gunzipped recording.
        source: JfrError,
    },
    /// The Java agent's multipart form has no `jfr` field.
    #[error("multipart form has no jfr field (fields sent: {fields})")]
    MissingJfrField {
        /// The names of the fields that were sent.
        fields: String,
    },
    /// A pprof sample type's name suffix (its display name) makes an invalid app name.
    #[error("invalid profile name {name:?}: {source}")]
    BadProfileName {
        /// The app name built from the prefix and the suffix.
        name: String,
        /// What is wrong with it.
        source: SeriesError,
    },
    /// The multipart form is malformed.
    #[error("invalid multipart form: {reason}")]
    Multipart {
        /// What the multipart parser said.
        reason: String,
    },
    /// The multipart form has no `profile` field.
    #[error("multipart form has no profile field (fields sent: {fields})")]
    MissingProfileField {
        /// The names of the fields that were sent.
        fields: String,
    },
    /// A label from a pprof sample or a push series is not a valid label.
    #[error("invalid label {name:?}: {source}")]
    BadLabel {
        /// The label name.
        name: String,
        /// What is wrong with it.
        source: SeriesError,
    },
    /// The `Content-Type` is not one this route reads.
    #[error("unsupported Content-Type {content_type:?}; expected {expected}")]
    UnsupportedMediaType {
        /// The header as sent.
        content_type: String,
        /// What the route reads.
        expected: &'static str,
    },
    /// A Connect push body does not decode.
    #[error("invalid push request: {reason}")]
    PushBody {
        /// What the decoder said, with the field at fault where known.
        reason: String,
    },
    /// A pushed series has no `service_name` label, which names the app.
    #[error("series {series} has no service_name label")]
    MissingServiceName {
        /// The 0-based index of the series in the request.
        series: usize,
    },
    /// The store failed; the client is not at fault.
    #[error("storing the profiles failed")]
    Store {
        /// What the store said.
        source: StoreError,
    },
    /// A parse task panicked, which is a bug.
    #[error("parsing the body failed unexpectedly: {reason}")]
    Panicked {
        /// What tokio said.
        reason: String,
    },
}

impl IngestError {
    /// The HTTP status this error answers with on `/ingest`.
    pub(crate) fn status(&self) -> StatusCode {
        use IngestError::*;
        match self {
            MissingName
            | BadQuery { .. }
            | BadName { .. }
            | BadTime { .. }
            | UntilBeforeFrom { .. }
            | TimeOutOfRange { .. }
            | BadSampleRate { .. }
            | BadAggregation { .. }
            | UnknownFormat { .. }
            | UnsupportedFormat { .. }
            | BadGzip { .. }
            | BodyRead { .. }
            | PushBody { .. }
            | MissingServiceName { .. } => StatusCode::BAD_REQUEST,
            BodyTooLarge { .. } | DecompressedTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Pprof { source, .. } if is_size_limit(source) => StatusCode::PAYLOAD_TOO_LARGE,
            UnsupportedEncoding { .. } | UnsupportedMediaType { .. } => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            Folded { .. }
            | Pprof { .. }
            | Multipart { .. }
            | MissingProfileField { .. }
            | Jfr { .. }
            | MissingJfrField { .. }
            | BadLabel { .. }
            | SeriesLimit { .. }
            | BadProfileName { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Store { .. } | Panicked { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The bounded `error_type` label of `smolder_aggregator_errors_total`.
    pub(crate) fn error_type(&self) -> &'static str {
        use IngestError::*;
        match self {
            MissingName
            | BadQuery { .. }
            | BadName { .. }
            | BadTime { .. }
            | UntilBeforeFrom { .. }
            | TimeOutOfRange { .. }
            | BadSampleRate { .. }
            | BadAggregation { .. }
            | UnknownFormat { .. } => "bad_param",
            UnsupportedFormat { .. } => "unsupported_format",
            UnsupportedEncoding { .. } => "unsupported_encoding",
            UnsupportedMediaType { .. } => "unsupported_media_type",
            BodyTooLarge { .. } | DecompressedTooLarge { .. } => "body_too_large",
            Pprof { source, .. } if is_size_limit(source) => "body_too_large",
            BadGzip { .. } => "bad_gzip",
            BodyRead { .. } => "body_read",
            Folded { .. }
            | Pprof { .. }
            | Multipart { .. }
            | MissingProfileField { .. }
            | Jfr { .. }
            | MissingJfrField { .. }
            | PushBody { .. } => "bad_body",
            BadLabel { .. } | BadProfileName { .. } | MissingServiceName { .. } => "bad_labels",
            SeriesLimit { .. } => "series_limit",
            Store { .. } => "store",
            Panicked { .. } => "internal",
        }
    }
}

/// Whether a pprof error is about [`smolder_common::pprof::Limits`] (413) rather than a bad
/// profile (422).
fn is_size_limit(error: &PprofError) -> bool {
    matches!(
        error,
        PprofError::TooLarge { .. }
            | PprofError::TooManySamples { .. }
            | PprofError::TooManyEntries { .. }
    )
}

/// `error` and its sources, `: `-separated: pprof's errors keep prost's and flate2's detail
/// in their source, and the client needs it to find what is wrong.
fn chain(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// How far past the aggregator's clock a profile may end: agents' clocks drift, but a profile
/// from the future would sit in a bucket no query reaches and that retention never deletes.
pub(crate) const MAX_CLOCK_SKEW: std::time::Duration = std::time::Duration::from_secs(600);

/// Rejects a request over the limits on series and labels: each label becomes an index key in
/// the store, so these bound what one request can add to it.
fn check_series(
    profiles: &[(Profile, &'static str)],
    config: &IngestConfig,
) -> Result<(), IngestError> {
    if profiles.len() > config.max_series_per_request {
        return Err(IngestError::SeriesLimit {
            reason: format!(
                "the request makes {} series, more than ingest.max-series-per-request ({})",
                profiles.len(),
                config.max_series_per_request
            ),
        });
    }
    for (profile, _) in profiles {
        let labels = profile.series.labels();
        if labels.len() > config.max_labels_per_series {
            return Err(IngestError::SeriesLimit {
                reason: format!(
                    "series {} has {} labels, more than ingest.max-labels-per-series ({})",
                    profile.series.app(),
                    labels.len(),
                    config.max_labels_per_series
                ),
            });
        }
        if let Some((name, _)) = labels
            .iter()
            .find(|(name, value)| name.len().max(value.len()) > config.max_label_bytes)
        {
            return Err(IngestError::SeriesLimit {
                reason: format!(
                    "label {:?} of series {} is longer than ingest.max-label-bytes ({})",
                    name.chars().take(64).collect::<String>(),
                    profile.series.app(),
                    config.max_label_bytes
                ),
            });
        }
    }
    Ok(())
}

/// Rejects a profile stamped beyond [`MAX_CLOCK_SKEW`] or older than `retention`.
fn check_time(
    profile: &Profile,
    now: SystemTime,
    retention: std::time::Duration,
) -> Result<(), IngestError> {
    let unix = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    if profile.until > now + MAX_CLOCK_SKEW {
        return Err(IngestError::TimeOutOfRange {
            reason: format!(
                "until {} is more than {} s after the aggregator's clock ({})",
                unix(profile.until),
                MAX_CLOCK_SKEW.as_secs(),
                unix(now)
            ),
        });
    }
    if profile.until + retention < now {
        return Err(IngestError::TimeOutOfRange {
            reason: format!(
                "until {} is older than the retention (store.retention, {} s); it would be deleted at once",
                unix(profile.until),
                retention.as_secs()
            ),
        });
    }
    Ok(())
}

/// The profiles parsed from one request, with what the metrics need to know about them.
pub(crate) struct Batch {
    /// The `format` label of `smolder_aggregator_ingest_profiles_total`.
    format: &'static str,
    /// The body's size as sent.
    sent_bytes: usize,
    /// Each profile with the `type` label of the distributor metrics.
    profiles: Vec<(Profile, &'static str)>,
}

impl Batch {
    /// Writes the batch in one store write, then records the ingest metrics.
    ///
    /// # Errors
    ///
    /// [`IngestError::TimeOutOfRange`] when any profile is stamped too far in the future or
    /// older than the retention (nothing is stored then); [`IngestError::Store`] when the write
    /// fails.
    async fn store(self, state: &AppState) -> Result<Stored, IngestError> {
        self.store_marked(state, None).await
    }

    /// [`Batch::store`] of an agent's batch: with `marker`, the store keeps it at most once
    /// (see [`Store::write_batch`](crate::store::Store::write_batch)). A batch stored before
    /// is answered as [`Stored::duplicate`] and counted nowhere again.
    ///
    /// # Errors
    ///
    /// As [`Batch::store`].
    async fn store_marked(
        self,
        state: &AppState,
        marker: Option<BatchMarker>,
    ) -> Result<Stored, IngestError> {
        let Batch {
            format,
            sent_bytes,
            profiles,
        } = self;
        let now = SystemTime::now();
        check_series(&profiles, &state.config.ingest)?;
        for (profile, _) in &profiles {
            check_time(profile, now, state.config.store.retention)?;
        }
        let mut types = BTreeSet::new();
        let mut samples = Vec::with_capacity(profiles.len());
        let mut stored = Stored::default();
        let profiles: Vec<Profile> = profiles
            .into_iter()
            .map(|(profile, kind)| {
                let stacks = profile.tree.stack_count() as u64;
                samples.push((kind, stacks));
                types.insert(kind);
                stored.samples += stacks;
                profile
            })
            .collect();
        stored.profiles = profiles.len();
        if marker.is_none() && profiles.is_empty() {
            return Ok(stored);
        }
        // Rules are evaluated before the write, which takes the profiles, and counted only once
        // it is acknowledged: a refused write counts nowhere, a duplicate batch counts once.
        let rules = state.rules.current();
        let (profiles, increments) = if rules.is_empty() || profiles.is_empty() {
            (profiles, Default::default())
        } else {
            let engine = state.rules.clone();
            blocking(move || {
                let increments = engine.evaluate(&rules, &profiles);
                Ok((profiles, increments))
            })
            .await?
        };
        let written = match marker {
            None => state.store.write(profiles).await.map(|()| Written::Stored),
            Some(marker) => state.store.write_batch(profiles, marker).await,
        }
        .map_err(|source| IngestError::Store { source })?;
        if written == Written::Duplicate {
            stored.duplicate = true;
            return Ok(stored);
        }
        state.rules.apply(increments);
        let metrics = &state.metrics;
        metrics
            .ingest_profiles
            .with_label_values(&[format])
            .inc_by(stored.profiles as u64);
        // A body with several sample types counts its size under each, as Pyroscope counts a
        // pushed profile under its one `__name__`.
        for kind in types {
            metrics
                .received_compressed_bytes
                .with_label_values(&[kind])
                .observe(sent_bytes as f64);
        }
        for (kind, stacks) in samples {
            metrics
                .received_samples
                .with_label_values(&[kind])
                .observe(stacks as f64);
        }
        Ok(stored)
    }
}

/// What one request stored, for its debug event.
#[derive(Default)]
struct Stored {
    profiles: usize,
    samples: u64,
    /// The batch had been stored before (QUIC ingest only); nothing was written.
    duplicate: bool,
}

/// Counts and logs a request's outcome: `route` names it in the debug event.
fn record(state: &AppState, route: &'static str, outcome: &Result<Stored, IngestError>) {
    match outcome {
        Ok(stored) => debug!(
            route,
            profiles = stored.profiles,
            stacks = stored.samples,
            "ingested"
        ),
        Err(error) => {
            state
                .metrics
                .errors
                .with_label_values(&["ingest", error.error_type()])
                .inc();
            debug!(route, status = error.status().as_u16(), %error, "ingest rejected");
        }
    }
}

/// Runs a parser on the blocking pool: bodies run to tens of MiB, too long for a runtime
/// worker.
async fn blocking<T: Send + 'static>(
    parse: impl FnOnce() -> Result<T, IngestError> + Send + 'static,
) -> Result<T, IngestError> {
    tokio::task::spawn_blocking(parse)
        .await
        .map_err(|err| IngestError::Panicked {
            reason: err.to_string(),
        })?
}

/// `POST /ingest`.
async fn ingest(State(state): State<AppState>, request: Request) -> Response {
    let outcome = ingest_request(&state, request).await;
    record(&state, "ingest", &outcome);
    match outcome {
        Ok(_) => StatusCode::OK.into_response(),
        Err(IngestError::Store { source }) => ApiError::internal(chain(&source)).into_response(),
        Err(error @ IngestError::Panicked { .. }) => ApiError::internal(error).into_response(),
        Err(error) => (error.status(), format!("{error}\n")).into_response(),
    }
}

async fn ingest_request(state: &AppState, request: Request) -> Result<Stored, IngestError> {
    let (parts, body) = request.into_parts();
    let pairs: Vec<(String, String)> = Query::try_from_uri(&parts.uri)
        .map(|Query(pairs)| pairs)
        .map_err(|err| IngestError::BadQuery {
            reason: err.body_text(),
        })?;
    let content_type = content_type(&parts.headers);
    let params = IngestParams::parse(&pairs, &content_type, SystemTime::now())?;
    let config = &state.config.ingest;
    let body = body::read(&parts.headers, body, config).await?;
    let batch = match params.format {
        BodyFormat::Folded | BodyFormat::Lines => {
            blocking(move || folded::parse(&params, &body)).await?
        }
        BodyFormat::Pprof => {
            let limits = pprof::limits(config);
            blocking(move || pprof::parse_body(&params, &body, &limits)).await?
        }
        BodyFormat::PprofForm => {
            let form = pprof::read_form(parts, body.bytes.clone()).await?;
            let limits = pprof::limits(config);
            let sent_bytes = body.sent_bytes;
            blocking(move || pprof::parse_form(&params, form, sent_bytes, &limits)).await?
        }
        BodyFormat::Jfr => {
            let config = config.clone();
            blocking(move || jfr::parse_body(&params, &body, &config)).await?
        }
        BodyFormat::JfrForm => {
            let recording = jfr::read_form(parts, body.bytes.clone()).await?;
            let config = config.clone();
            let sent_bytes = body.sent_bytes;
            blocking(move || jfr::parse(&params, &recording, "jfr field", sent_bytes, &config))
                .await?
        }
    };
    batch.store(state).await
}

/// The `Content-Type` header, or empty.
fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}
