//! Ingest: Pyroscope's push APIs, turned into profiles for the store.
//!
//! Input: HTTP requests from Pyroscope's SDKs and tools, and agents' batches over QUIC
//! ([`quic`]). Output: each request's [`Profile`](smolder_common::Profile)s as one
//! [`ProfileSet`], handed to the [`Ingester`] (`ingester.rs`: limits per series, rules, one store
//! write, metrics), so that a request's series within the limits are stored together and the
//! others refused one by one, named in the answer. Callers: the router in `http` mounts [`routes`]; `app` builds
//! the `Ingester` and starts [`quic`]. Owns no tasks or files; parsing runs on tokio's blocking
//! pool. Depends on `store`, `rules`, `metrics`, `api_error` and `tenant`.
//!
//! - `POST /ingest` (also `/pyroscope/ingest`): metadata in the query string ([`params`]),
//!   the profile in the body ([`body`] reads it under the caps of [`IngestConfig`]), as folded
//!   or `lines` text ([`folded`]), pprof, bare or in the Go SDK's multipart form ([`pprof`]),
//!   or a Java Flight Recorder recording, bare or in the Java agent's form ([`jfr`]).
//! - `POST /push.v1.PusherService/Push`: Connect's unary push of pprof profiles, binary or
//!   JSON ([`push`]).
//! - `POST /v1development/profiles`: OTLP profiles (`profiles/v1development`, v1.10), binary or
//!   JSON, and the same over gRPC, `ProfilesService/Export` on this port over h2c ([`otlp`]).
//!
//! Every route needs a credential with scope `ingest` (`auth`: what SDKs send as `authToken` or
//! basic auth) and stores for the request's tenant, from `tenant`'s extractor: the credential's,
//! else `X-Scope-OrgID` under `tenant.multitenancy-enabled`, else `anonymous` with the header
//! ignored. Bodies are read after the tenant's ingest rate is checked, within the in-flight
//! budget, and decompressed within one budget per request (`body.rs`, `admission`); a refusal
//! for load is 503 or 429 with `Retry-After`.
//!
//! Every rejection is an [`IngestError`]: 400 for a bad parameter, 413 past a cap, 415 for a
//! content type or encoding not read here, 422 for a body that does not parse (400 on the
//! Connect route, as Connect's `invalid_argument`), 500 only when the store fails. A request
//! whose every series is refused is [`IngestError::Refused`] (422 for a series limit, 400 for a
//! time out of range, 429 for the tenant's series limit); one with some series refused is a 200
//! naming them ([`refused_headers`], [`refused_text`]). Each is
//! counted in `smolder_aggregator_errors_total{stage="ingest"}` under a bounded `error_type`,
//! and logged at debug only: a client's mistake is not the operator's business.

mod active;
mod body;
mod folded;
mod ingester;
mod jfr;
mod limits;
mod metrics;
mod otlp;
mod params;
mod pprof;
mod push;
pub(crate) mod quic;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::header::{CONTENT_TYPE, WARNING};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use smolder_common::jfr::JfrError;
use smolder_common::wire::RefusalReason;
use smolder_common::wire::limits::{MAX_MESSAGE_CHARS, MAX_MESSAGES};
use smolder_common::{FoldedError, PprofError, SeriesError, TimeError};

use crate::admission::Overload;
use crate::api_error::{ApiError, Protocol, Refusal, chain};
use crate::auth::{Access, Routes, Scope};
use crate::store::StoreError;
use crate::tenant::Tenant;

pub(crate) use self::ingester::{AgentBatch, Ingester, ProfileSet, Refused, Stored, Transport};
pub(crate) use self::limits::Limits;
pub(crate) use self::metrics::IngestMetrics;
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
    /// Most series one request or agent batch may write (a pprof body makes one per sample type
    /// and label set); the series past it are refused, the others stored. Agents are told in
    /// the welcome and split their windows to it. Default 10 000.
    pub max_series_per_request: usize,
    /// Most labels one series may have; a series with more is refused. Default 30, as
    /// Pyroscope.
    pub max_labels_per_series: usize,
    /// Longest label name and value, in bytes; a series with a longer one is refused. Default
    /// 1024, as Pyroscope's name limit (every label is a key in the store's index).
    pub max_label_bytes: usize,
    /// Most series one tenant may have active (written in the last hour) at once; a new series
    /// past it is refused (429 when a request has nothing else), its active ones are still
    /// stored. 0 means no limit. Default 100 000.
    pub max_active_series_per_tenant: usize,
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
            max_active_series_per_tenant: 100_000,
            quic: quic::QuicConfig::default(),
        }
    }
}

/// The ingest routes, served by `ingester`, each for credentials with scope `ingest`.
pub(crate) fn routes(ingester: Arc<Ingester>) -> Routes {
    let access = Access::Scope(Scope::Ingest);
    Routes::new()
        .post("/ingest", access, ingest)
        .post("/pyroscope/ingest", access, ingest)
        .post("/push.v1.PusherService/Push", access, push::push)
        .post("/v1development/profiles", access, otlp::export)
        .post(otlp::GRPC_PATH, access, otlp::export_grpc)
        // Bodies are read under `IngestConfig`'s caps by `body::read`; axum's own 2 MiB default
        // would otherwise cut multipart forms short with a different error.
        .layer(DefaultBodyLimit::disable())
        .with_state(ingester)
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
    /// Every series of the request was refused (over a limit on series or labels, the
    /// tenant's active series, out of the time range, or, in an agent batch, undecodable);
    /// nothing is stored. The first refusal's reason sets the status.
    #[error("{}", refused_message(.refused))]
    Refused {
        /// Each series with why, by index; never empty.
        refused: Vec<Refused>,
    },
    /// An agent batch's window ends more than [`MAX_CLOCK_SKEW`](limits::MAX_CLOCK_SKEW)
    /// after the aggregator's clock: the agent's clock is ahead. Nothing is stored; the agent
    /// sends the batch again later.
    #[error("clock skew: {reason}")]
    ClockSkew {
        /// The times involved.
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
    /// The request's gunzipped parts together (the body under `Content-Encoding`, gzipped
    /// pprof, push samples, form fields, a gRPC message) are larger than
    /// `ingest.max-decompressed-bytes`.
    #[error(
        "decompressed body is larger than the limit of {limit} bytes (ingest.max-decompressed-bytes); a request's compressed parts count together"
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
    /// An OTLP profiles request does not fit the v1.10 schema, or is past a limit.
    #[error("invalid otlp profiles request: {}", chain(.source))]
    Otlp {
        /// What is wrong, naming the field.
        source: smolder_common::otlp::OtlpError,
    },
    /// A gRPC request is not one length-prefixed message.
    #[error("invalid grpc request: {reason}")]
    GrpcFrame {
        /// What is wrong with the framing.
        reason: String,
    },
    /// A pushed series has no `service_name` label, which names the app.
    #[error("series {series} has no service_name label")]
    MissingServiceName {
        /// The 0-based index of the series in the request.
        series: usize,
    },
    /// The aggregator is at its in-flight budget, or the tenant over its ingest rate
    /// (`admission`): nothing was stored, and the client may send it again later.
    #[error("{source}")]
    Overloaded {
        /// Which limit, and when to retry.
        source: Overload,
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
            | ClockSkew { .. }
            | BadSampleRate { .. }
            | BadAggregation { .. }
            | UnknownFormat { .. }
            | UnsupportedFormat { .. }
            | BadGzip { .. }
            | BodyRead { .. }
            | PushBody { .. }
            | GrpcFrame { .. }
            | MissingServiceName { .. } => StatusCode::BAD_REQUEST,
            BodyTooLarge { .. } | DecompressedTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Pprof { source, .. } if is_size_limit(source) => StatusCode::PAYLOAD_TOO_LARGE,
            Otlp { source } => otlp::status(source),
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
            | BadProfileName { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Refused { refused } => match first_reason(refused) {
                RefusalReason::TooOld | RefusalReason::ClockSkew => StatusCode::BAD_REQUEST,
                RefusalReason::TenantSeriesLimit => StatusCode::TOO_MANY_REQUESTS,
                _ => StatusCode::UNPROCESSABLE_ENTITY,
            },
            Overloaded { source } => source.status(),
            Store {
                source: StoreError::Unavailable { .. } | StoreError::Busy { .. },
            } => StatusCode::SERVICE_UNAVAILABLE,
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
            | BadSampleRate { .. }
            | BadAggregation { .. }
            | UnknownFormat { .. } => "bad_param",
            ClockSkew { .. } => "clock_skew",
            Refused { refused } => match first_reason(refused) {
                RefusalReason::TooOld => "bad_param",
                RefusalReason::ClockSkew => "clock_skew",
                RefusalReason::TenantSeriesLimit => "tenant_series_limit",
                RefusalReason::Invalid | RefusalReason::TooLarge => "bad_batch",
                _ => "series_limit",
            },
            UnsupportedFormat { .. } => "unsupported_format",
            UnsupportedEncoding { .. } => "unsupported_encoding",
            UnsupportedMediaType { .. } => "unsupported_media_type",
            BodyTooLarge { .. } | DecompressedTooLarge { .. } => "body_too_large",
            Pprof { source, .. } if is_size_limit(source) => "body_too_large",
            Otlp { source } if source.is_too_large() => "body_too_large",
            BadGzip { .. } => "bad_gzip",
            BodyRead { .. } => "body_read",
            Folded { .. }
            | Pprof { .. }
            | Multipart { .. }
            | MissingProfileField { .. }
            | Jfr { .. }
            | MissingJfrField { .. }
            | Otlp { .. }
            | GrpcFrame { .. }
            | PushBody { .. } => "bad_body",
            BadLabel { .. } | BadProfileName { .. } | MissingServiceName { .. } => "bad_labels",
            Overloaded { .. } => "overloaded",
            Store { .. } => "store",
            Panicked { .. } => "internal",
        }
    }
}

/// Headers of a request stored in part: `Smolder-Refused-Series` with how many series were
/// refused, and a `Warning: 299` for each of the first few (as the node budget's warning).
pub(crate) fn refused_headers(refused: &[Refused]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        REFUSED_SERIES,
        HeaderValue::from(u64::try_from(refused.len()).unwrap_or(u64::MAX)),
    );
    for r in refused.iter().take(MAX_MESSAGES) {
        // A header value is visible ASCII; a quoted string escapes its quotes.
        let text: String = r
            .refusal
            .message
            .chars()
            .take(MAX_MESSAGE_CHARS)
            .map(|c| match c {
                '"' | '\\' => '\'',
                c if c.is_ascii_graphic() || c == ' ' => c,
                _ => '?',
            })
            .collect();
        let warning = format!(
            "299 - \"series {} refused ({}): {text}\"",
            r.index,
            r.refusal.reason.as_str()
        );
        if let Ok(value) = HeaderValue::try_from(warning) {
            headers.append(WARNING, value);
        }
    }
    headers
}

/// The body of a request stored in part: which series were refused and why, one per line, the
/// first few named.
pub(crate) fn refused_text(refused: &[Refused]) -> String {
    let mut text = format!("stored all but {} series; refused:\n", refused.len());
    for r in refused.iter().take(MAX_MESSAGES) {
        text.push_str(&format!(
            "series {} ({}): {}\n",
            r.index,
            r.refusal.reason.as_str(),
            r.refusal.message
        ));
    }
    if refused.len() > MAX_MESSAGES {
        text.push_str(&format!("and {} more\n", refused.len() - MAX_MESSAGES));
    }
    text
}

/// The header that counts the series a request stored in part had refused.
pub(crate) const REFUSED_SERIES: HeaderName = HeaderName::from_static("smolder-refused-series");

/// The reason of the first refusal, which sets a refused request's status.
fn first_reason(refused: &[Refused]) -> RefusalReason {
    refused
        .first()
        .map_or(RefusalReason::Invalid, |r| r.refusal.reason)
}

/// A refused request's message: the one series' refusal, or how many with the first.
fn refused_message(refused: &[Refused]) -> String {
    match refused {
        [] => "no series".to_owned(),
        [one] => one.refusal.message.clone(),
        [first, ..] => format!(
            "all {} series were refused; series {}: {}",
            refused.len(),
            first.index,
            first.refusal.message
        ),
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
async fn ingest(
    State(ingester): State<Arc<Ingester>>,
    tenant: Tenant,
    request: Request,
) -> Response {
    let outcome = ingest_request(&ingester, &tenant, request).await;
    ingester.record("ingest", &outcome);
    match outcome {
        Ok(stored) if stored.refused.is_empty() => StatusCode::OK.into_response(),
        Ok(stored) => (
            refused_headers(&stored.refused),
            refused_text(&stored.refused),
        )
            .into_response(),
        Err(IngestError::Overloaded { source }) => source.refusal(Protocol::Plain).into_response(),
        Err(IngestError::Store { source }) => store_failure(&source, Protocol::Plain),
        Err(error @ IngestError::Panicked { .. }) => ApiError::internal(error).into_response(),
        Err(error) => (error.status(), format!("{error}\n")).into_response(),
    }
}

/// What a client waits before it resends a write the store could not take: a few polls of the
/// bucket, shorter than an agent's window, so that a retry neither hammers a store that is down
/// nor waits long once it is back.
const STORE_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The answer, in `protocol`, to a failed write: 503 with `Retry-After` when the store is
/// unavailable (the bucket unreachable: nothing was stored, the same request may succeed
/// later), else 500 with the cause logged.
pub(crate) fn store_failure(source: &StoreError, protocol: Protocol) -> Response {
    let refusal = match source {
        StoreError::Unavailable { .. } => {
            tracing::warn!(error = %chain(source), "write refused: the store is unavailable");
            Refusal::new(
                protocol,
                StatusCode::SERVICE_UNAVAILABLE,
                "the store is unavailable (its object store does not answer); nothing was stored, retry later",
            )
            .retry_after(STORE_RETRY_AFTER)
        }
        StoreError::Busy { .. } => {
            tracing::warn!(error = %chain(source), "write refused: the store's head is full");
            Refusal::new(
                protocol,
                StatusCode::SERVICE_UNAVAILABLE,
                "the store is busy (writes arrive faster than it moves them into blocks); nothing was stored, retry later",
            )
            .retry_after(STORE_RETRY_AFTER)
        }
        _ => {
            tracing::error!(error = %chain(source), "request failed");
            Refusal::new(
                protocol,
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error; see the aggregator's log",
            )
        }
    };
    refusal.into_response()
}

async fn ingest_request(
    ingester: &Ingester,
    tenant: &Tenant,
    request: Request,
) -> Result<Stored, IngestError> {
    let (parts, body) = request.into_parts();
    let pairs: Vec<(String, String)> = Query::try_from_uri(&parts.uri)
        .map(|Query(pairs)| pairs)
        .map_err(|err| IngestError::BadQuery {
            reason: err.body_text(),
        })?;
    let content_type = content_type(&parts.headers);
    let params = IngestParams::parse(&pairs, &content_type, SystemTime::now())?;
    let config = ingester.config();
    let body = body::read(&parts, tenant, body, config, body::Encoding::Header).await?;
    let set = match params.format {
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
            blocking(move || pprof::parse_form(&params, form, &body, &limits)).await?
        }
        BodyFormat::Jfr => blocking(move || jfr::parse_body(&params, &body)).await?,
        BodyFormat::JfrForm => {
            let recording = jfr::read_form(parts, body.bytes.clone()).await?;
            blocking(move || jfr::parse(&params, &recording, "jfr field", &body)).await?
        }
    };
    ingester.ingest(tenant, set, None).await
}

/// The media type of a `Content-Type` value, lowercase, without its parameters
/// (`application/json; charset=utf-8` is `application/json`).
fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// The `Content-Type` header, or empty.
fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}
