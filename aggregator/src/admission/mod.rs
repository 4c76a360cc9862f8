//! Admission: how much work the aggregator takes on at once, so that load past what it can do is
//! refused (and retried by the client) instead of queued until memory runs out.
//!
//! Input: every HTTP request (its `Content-Length`, then its body's bytes as they arrive),
//! every ingest request's tenant, every agent batch's frame header, and the bytes decompressed
//! for them. Output: a [`Charge`] on the request (an extension) that holds its share of the
//! in-flight budget until its work is done, or a refusal: 503 with `Retry-After` when the
//! budget is spent (`admission.max-in-flight-bytes`), 429 with `Retry-After` when the tenant is
//! over its ingest rate (`admission.tenant-ingest-bytes-per-second`), and for agents a
//! retryable reject. Callers: `app` installs [`layer`] around the router; ingest's body reader
//! takes the tenant's rate ([`Admission::ingest`]) and charges what it decompresses; QUIC ingest
//! charges each batch from its header ([`Admission::batch`]). Owns the budget and the tenants'
//! buckets; no task. Depends on `api_error`, `metrics` and `tenant`.
//!
//! The budget is one for HTTP and QUIC, taken before a body is read: a request with a
//! `Content-Length` takes it at once, a chunked one as its bytes arrive, a batch its declared
//! sizes (as sent and decompressed) from its header. Decompressing takes more as it goes. What
//! the decoders build from those bytes (trees, interned names) is not counted; it is bounded by
//! the same bytes, a few times over (BENCHMARKS.md, "Admission").

mod budget;
mod rate;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{CONNECTION, CONTENT_LENGTH};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use prometheus::{IntCounter, Registry};
use serde::{Deserialize, Serialize};

use crate::api_error::{Protocol, Refusal};
use crate::metrics::Refused;
use crate::tenant::{Tenant, TenantLimits};
use smolder_daemon::metrics::gauge;

use self::budget::Budget;
pub(crate) use self::budget::Charge;
use self::rate::{Rate, TenantRates};

/// How long a client refused for the budget is asked to wait: requests in flight finish in
/// well under a second at the benchmarked ingest rates.
pub(crate) const BUDGET_RETRY: Duration = Duration::from_secs(1);
/// The most of a refused request's body read and thrown away after its answer, so that the
/// client reads the answer rather than a reset connection (a server that closes with unread
/// bytes in its socket resets it): as nginx's lingering close.
const DRAIN_BYTES: u64 = 64 << 20;
/// How long that may take.
const DRAIN_TIME: Duration = Duration::from_secs(10);

/// How much work the aggregator takes on at once.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct AdmissionConfig {
    /// Bytes that HTTP requests and agent batches may hold at once, as sent and as
    /// decompressed; past it a request gets 503 with `Retry-After` and a batch a retryable
    /// reject. At least one largest request (`ingest.max-body-bytes` +
    /// `ingest.max-decompressed-bytes`) and one largest batch (twice
    /// `ingest.quic.max-batch-bytes`). Default 256 MiB: on a 2-core machine ingest is
    /// CPU-bound well before (BENCHMARKS.md, "Admission").
    pub max_in_flight_bytes: u64,
    /// Bytes per second (as sent) each tenant may ingest over HTTP and QUIC together, with
    /// bursts of `tenant-ingest-burst-bytes`; past it a request gets 429 with `Retry-After`
    /// and a batch a retryable reject. 0 means no limit, the default: the in-flight budget
    /// protects the aggregator, this shares it between tenants.
    pub tenant_ingest_bytes_per_second: u64,
    /// The burst of `tenant-ingest-bytes-per-second`, in bytes. Default 64 MiB.
    pub tenant_ingest_burst_bytes: u64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            max_in_flight_bytes: 256 << 20,
            tenant_ingest_bytes_per_second: 0,
            tenant_ingest_burst_bytes: 64 << 20,
        }
    }
}

impl AdmissionConfig {
    /// Checks that the budget admits the largest request and batch the other limits allow.
    ///
    /// # Errors
    ///
    /// When either could never be admitted.
    pub(crate) fn check(&self, largest_request: u64, largest_batch: u64) -> anyhow::Result<()> {
        if self.max_in_flight_bytes < largest_request {
            anyhow::bail!(
                "admission.max-in-flight-bytes ({}) is below one largest request (ingest.max-body-bytes + ingest.max-decompressed-bytes = {largest_request}), which could never be admitted",
                self.max_in_flight_bytes
            );
        }
        if self.max_in_flight_bytes < largest_batch {
            anyhow::bail!(
                "admission.max-in-flight-bytes ({}) is below one largest agent batch (twice ingest.quic.max-batch-bytes = {largest_batch}), which could never be admitted",
                self.max_in_flight_bytes
            );
        }
        Ok(())
    }
}

/// Why work was refused for load: the client may send it again later.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Overload {
    /// The in-flight budget cannot take `wanted` more bytes now.
    #[error(
        "the aggregator is busy: {wanted} more bytes do not fit in its in-flight budget of {limit} bytes (admission.max-in-flight-bytes); retry shortly"
    )]
    Budget {
        /// The bytes asked for.
        wanted: u64,
        /// The budget.
        limit: u64,
    },
    /// The tenant sent more than its rate allows.
    #[error(
        "tenant {tenant} is over its ingest rate of {rate} bytes/s ({setting}); retry in {} s",
        crate::api_error::retry_after_secs(*retry_after)
    )]
    TenantRate {
        /// The tenant.
        tenant: String,
        /// Its rate.
        rate: u64,
        /// The setting that gives it.
        setting: String,
        /// When it may send again.
        retry_after: Duration,
    },
}

impl Overload {
    /// 503 for the budget (the aggregator is full), 429 for a tenant's rate (the client is).
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Overload::Budget { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Overload::TenantRate { .. } => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// When to try again.
    pub(crate) fn retry_after(&self) -> Duration {
        match self {
            Overload::Budget { .. } => BUDGET_RETRY,
            Overload::TenantRate { retry_after, .. } => *retry_after,
        }
    }

    /// The `reason` label of `smolder_aggregator_refused_total`.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Overload::Budget { .. } => "in_flight_bytes",
            Overload::TenantRate { .. } => "tenant_rate",
        }
    }

    /// The refusal in `protocol`.
    pub(crate) fn refusal(&self, protocol: Protocol) -> Refusal {
        Refusal::new(protocol, self.status(), self.to_string()).retry_after(self.retry_after())
    }

    /// The overload among `error`'s sources, if it is one (a body that stopped for the budget
    /// reaches its reader as an I/O error).
    pub(crate) fn find<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e Overload> {
        let mut current = Some(error);
        while let Some(error) = current {
            if let Some(overload) = error.downcast_ref::<Overload>() {
                return Some(overload);
            }
            current = error.source();
        }
        None
    }
}

/// The budget and the tenants' buckets.
pub(crate) struct Admission {
    budget: Arc<Budget>,
    /// Held to look up and charge one tenant, never across I/O.
    rates: Option<Mutex<TenantRates>>,
    refused: Refused,
    /// `smolder_aggregator_refused_total{stage="http",reason="too_large"}`.
    too_large: IntCounter,
}

impl Admission {
    /// Admission under `config` and the `tenants` with limits of their own; its gauge in
    /// `registry`, its refusals in `refused`.
    pub(crate) fn new(
        config: &AdmissionConfig,
        tenants: &HashMap<Tenant, TenantLimits>,
        registry: &Registry,
        refused: Refused,
    ) -> Self {
        let in_flight = gauge(
            registry,
            "smolder_aggregator_admission_in_flight_bytes",
            "Bytes HTTP requests and agent batches hold of admission.max-in-flight-bytes now, as sent and decompressed.",
        );
        let limit = gauge(
            registry,
            "smolder_aggregator_admission_max_in_flight_bytes",
            "admission.max-in-flight-bytes: the in-flight budget.",
        );
        limit.set(i64::try_from(config.max_in_flight_bytes).unwrap_or(i64::MAX));
        let default = Rate {
            per_second: config.tenant_ingest_bytes_per_second,
            burst: config.tenant_ingest_burst_bytes,
        };
        let own = tenants
            .iter()
            .map(|(tenant, limits)| {
                let rate = Rate {
                    per_second: limits.ingest_bytes_per_second.unwrap_or(default.per_second),
                    burst: limits.ingest_burst_bytes.unwrap_or(default.burst),
                };
                (tenant.clone(), rate)
            })
            .collect();
        let rates = TenantRates::new(default, own);
        Admission {
            budget: Arc::new(Budget::new(config.max_in_flight_bytes, in_flight)),
            rates: rates.any().then(|| Mutex::new(rates)),
            too_large: refused.counter("http", "too_large"),
            refused,
        }
    }

    /// An empty charge on the budget.
    pub(crate) fn charge(&self) -> Charge {
        Charge::new(Arc::clone(&self.budget))
    }

    /// Counts an overload refused by `stage`.
    pub(crate) fn count(&self, stage: &str, overload: &Overload) {
        self.refused.inc(stage, overload.reason());
    }

    /// Whether `tenant` may ingest now, charged `declared` bytes (a body of unknown length is
    /// charged with [`Admission::charge_tenant`] once read).
    ///
    /// # Errors
    ///
    /// [`Overload::TenantRate`] when the tenant is over its rate.
    pub(crate) fn tenant(&self, tenant: &Tenant, declared: Option<u64>) -> Result<(), Overload> {
        let Some(rates) = &self.rates else {
            return Ok(());
        };
        let now = Instant::now();
        let mut rates = rates
            .lock()
            .expect("tenant rates lock: held for one bucket");
        rates
            .admit(tenant, now)
            .map_err(|retry_after| Overload::TenantRate {
                tenant: tenant.to_string(),
                rate: rates.rate(tenant).per_second,
                setting: rates.setting(tenant),
                retry_after,
            })?;
        if let Some(bytes) = declared {
            rates.charge(tenant, bytes, now);
        }
        Ok(())
    }

    /// Charges `tenant` for `bytes` it sent without declaring them first.
    pub(crate) fn charge_tenant(&self, tenant: &Tenant, bytes: u64) {
        if let Some(rates) = &self.rates {
            rates
                .lock()
                .expect("tenant rates lock: held for one bucket")
                .charge(tenant, bytes, Instant::now());
        }
    }

    /// The charge of an agent batch of `bytes` (as sent plus as declared decompressed), taken
    /// from its frame header before its body is read.
    ///
    /// # Errors
    ///
    /// [`Overload::Budget`] when it does not fit now.
    pub(crate) fn batch(&self, bytes: u64) -> Result<Charge, Overload> {
        let charge = self.charge();
        if charge.take(bytes) {
            Ok(charge)
        } else {
            Err(Overload::Budget {
                wanted: bytes,
                limit: self.budget.limit(),
            })
        }
    }
}

/// The admission of one HTTP request, an extension of the request for the handlers that read
/// its body (and decompress it).
#[derive(Clone)]
pub(crate) struct Admitted {
    /// Its share of the in-flight budget.
    pub(crate) charge: Charge,
    /// The budget and the tenants' rates.
    pub(crate) admission: Arc<Admission>,
    /// Its `Content-Length`.
    pub(crate) declared: Option<u64>,
}

impl Admitted {
    /// Takes `bytes` more of the budget for what the request decompresses.
    ///
    /// # Errors
    ///
    /// [`Overload::Budget`] when they do not fit now.
    pub(crate) fn take(&self, bytes: u64) -> Result<(), Overload> {
        if self.charge.take(bytes) {
            Ok(())
        } else {
            Err(Overload::Budget {
                wanted: bytes,
                limit: self.charge.limit(),
            })
        }
    }
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// The admission layer: takes a request's `Content-Length` from the budget before its body is
/// read (503 if it does not fit now, 413 if it never could), then its body's bytes past that
/// as they arrive, and puts [`Admitted`] on it. The budget comes back when the response is
/// made and the body and its decoders are dropped.
pub(crate) async fn layer(
    State(admission): State<Arc<Admission>>,
    request: Request,
    next: Next,
) -> Response {
    let declared = declared_length(request.headers());
    let protocol = Protocol::of(request.uri().path(), request.headers());
    // HTTP/2 resets a stream whose body is not wanted; HTTP/1.1 can only close the connection.
    let http1 = request.version() < Version::HTTP_2;
    let charge = admission.charge();
    let (mut parts, body) = request.into_parts();
    let read = Arc::new(AtomicBool::new(http_body::Body::is_end_stream(&body)));
    // Wrapped before any refusal: a body dropped unread is drained, then.
    let body = Metered {
        inner: Some(body),
        charge: charge.clone(),
        paid: declared.unwrap_or(0),
        seen: 0,
        admission: Arc::clone(&admission),
        read: Arc::clone(&read),
        drain: http1,
    };
    if let Some(bytes) = declared {
        if bytes > admission.budget.limit() {
            admission.too_large.inc();
            return closing(
                http1,
                Refusal::new(
                    protocol,
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "request body of {bytes} bytes is larger than the in-flight budget of {} bytes (admission.max-in-flight-bytes)",
                        admission.budget.limit()
                    ),
                )
                .into_response(),
            );
        }
        if !charge.take(bytes) {
            let overload = Overload::Budget {
                wanted: bytes,
                limit: admission.budget.limit(),
            };
            admission.count("http", &overload);
            return closing(http1, overload.refusal(protocol).into_response());
        }
    }
    parts.extensions.insert(Admitted {
        charge,
        admission: Arc::clone(&admission),
        declared,
    });
    let response = next.run(Request::from_parts(parts, Body::new(body))).await;
    if read.load(Ordering::Acquire) {
        response
    } else {
        closing(http1, response)
    }
}

/// `response`, with `Connection: close` on HTTP/1.1: its request's body was not read to its end
/// (it was refused, or failed), so the rest of it is drained and the connection may not carry
/// another request.
fn closing(http1: bool, mut response: Response) -> Response {
    if http1 {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request body that takes its bytes past what was paid for from the budget as they arrive,
/// and ends with an [`Overload`] error when they do not fit. Dropped before its end (the
/// request was refused, or failed), over HTTP/1.1 it reads the rest and throws it away in the
/// background, at most [`DRAIN_BYTES`] for [`DRAIN_TIME`], so that the client gets its answer.
struct Metered {
    /// `None` once handed to the drain.
    inner: Option<Body>,
    /// Set once the body has been read to its end.
    read: Arc<AtomicBool>,
    /// Whether an unread rest is drained when dropped (HTTP/1.1).
    drain: bool,
    charge: Charge,
    /// Bytes taken already.
    paid: u64,
    /// Bytes seen so far.
    seen: u64,
    admission: Arc<Admission>,
}

impl http_body::Body for Metered {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = std::task::ready!(Pin::new(inner).poll_frame(cx));
        if frame.is_none() {
            self.read.store(true, Ordering::Release);
        }
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
        {
            self.seen += data.len() as u64;
            if self.seen > self.paid {
                let more = self.seen - self.paid;
                if !self.charge.take(more) {
                    let overload = Overload::Budget {
                        wanted: more,
                        limit: self.charge.limit(),
                    };
                    self.admission.count("http", &overload);
                    return Poll::Ready(Some(Err(axum::Error::new(overload))));
                }
                self.paid = self.seen;
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        if !self.drain || http_body::Body::is_end_stream(&inner) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(drain(inner));
        }
    }
}

/// Reads `body` to its end and throws it away, within [`DRAIN_BYTES`] and [`DRAIN_TIME`].
async fn drain(mut body: Body) {
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut read = 0u64;
        while let Some(Ok(frame)) = body.frame().await {
            read += frame.data_ref().map_or(0, |data| data.len() as u64);
            if read > DRAIN_BYTES {
                break;
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overloads_answer_with_when_to_retry() {
        let busy = Overload::Budget {
            wanted: 10,
            limit: 5,
        };
        assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(busy.to_string().contains("admission.max-in-flight-bytes"));
        let rate = Overload::TenantRate {
            tenant: "a".into(),
            rate: 1,
            setting: "admission.tenant-ingest-bytes-per-second".into(),
            retry_after: Duration::from_millis(2500),
        };
        assert_eq!(rate.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(rate.to_string().contains("retry in 3 s"), "{rate}");
        let wrapped: Box<dyn std::error::Error + Send + Sync> =
            Box::new(axum::Error::new(busy.clone()));
        assert_eq!(Overload::find(&*wrapped), Some(&busy));
        let other = axum::Error::new(std::io::Error::other("x"));
        assert_eq!(Overload::find(&other), None);
    }

    #[test]
    fn the_budget_must_admit_the_largest_request_and_batch() {
        let config = AdmissionConfig::default();
        assert!(config.check(80 << 20, 128 << 20).is_ok());
        let err = config.check(300 << 20, 0).unwrap_err().to_string();
        assert!(err.contains("ingest.max-body-bytes"), "{err}");
        let err = config.check(0, 300 << 20).unwrap_err().to_string();
        assert!(err.contains("ingest.quic.max-batch-bytes"), "{err}");
    }
}
