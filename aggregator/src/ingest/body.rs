//! Reading request bodies under the configured caps, and undoing `Content-Encoding: gzip`.
//!
//! Input: the request's head and body. Output: the body's bytes as the parsers need them, with
//! the request's decompression budget ([`Inflate`]) for the parts inside it. Nothing here
//! allocates past [`IngestConfig`]'s caps, whatever the client claims or sends, and every byte
//! read or decompressed is taken from the in-flight budget (`admission`) first.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, Request};
use axum::http::header::{CONTENT_ENCODING, CONTENT_LENGTH};
use axum::http::request::Parts;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use super::{IngestConfig, IngestError};
use crate::admission::{Admitted, Overload};
use crate::tenant::Tenant;

/// How long a body may take to arrive: one that trickles slower holds a connection and its
/// share of the in-flight budget for nothing (as a QUIC batch stream's limit).
pub(crate) const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// How much is inflated at a time, between two checks of the budgets.
const INFLATE_CHUNK: usize = 64 << 10;

/// The first two bytes of every gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// A request body as sent, and as decoded.
pub(crate) struct RequestBody {
    /// The size as sent, for `pyroscope_distributor_received_compressed_bytes`.
    pub(crate) sent_bytes: usize,
    /// The body after `Content-Encoding` is undone.
    pub(crate) bytes: Bytes,
    /// What the parts inside it may still decompress.
    pub(crate) inflate: Inflate,
}

/// Whether the body's `Content-Encoding` applies (gRPC compresses its messages instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// `Content-Encoding` gzip or identity.
    Header,
    /// Ignored: the framing inside says.
    Framed,
}

/// Reads `body` for `tenant` in full, at most `config.max_body_bytes` of it, then gunzips it if
/// `Content-Encoding` says so (and `encoding` is [`Encoding::Header`]), within the request's
/// decompression budget. First the tenant's ingest rate is checked (`admission`).
///
/// # Errors
///
/// [`IngestError::Overloaded`] when the tenant is over its rate or the in-flight budget is
/// spent, [`IngestError::BodyTooLarge`] (checked against `Content-Length` before reading, too),
/// [`IngestError::DecompressedTooLarge`], [`IngestError::BadGzip`],
/// [`IngestError::UnsupportedEncoding`] for an encoding other than gzip or identity, and
/// [`IngestError::BodyRead`] when the connection fails mid-body or the body takes longer than
/// [`BODY_TIMEOUT`].
pub(crate) async fn read(
    parts: &Parts,
    tenant: &Tenant,
    body: Body,
    config: &IngestConfig,
    encoding: Encoding,
) -> Result<RequestBody, IngestError> {
    let admitted = parts.extensions.get::<Admitted>().cloned();
    if let Some(admitted) = &admitted
        && let Err(overload) = admitted.admission.tenant(tenant, admitted.declared)
    {
        admitted.admission.count("http", &overload);
        return Err(IngestError::Overloaded { source: overload });
    }
    let headers = &parts.headers;
    let limit = config.max_body_bytes;
    let content_encoding = match encoding {
        Encoding::Header => headers.get(CONTENT_ENCODING).map(|v| v.to_str()),
        Encoding::Framed => None,
    };
    let gzip = match content_encoding {
        None => false,
        Some(Ok(enc)) if enc.trim().eq_ignore_ascii_case("gzip") => true,
        Some(Ok(enc)) if enc.trim().is_empty() || enc.trim().eq_ignore_ascii_case("identity") => {
            false
        }
        Some(Ok(enc)) => {
            return Err(IngestError::UnsupportedEncoding {
                encoding: enc.to_owned(),
            });
        }
        Some(Err(_)) => {
            return Err(IngestError::UnsupportedEncoding {
                encoding: "<not text>".to_owned(),
            });
        }
    };
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(IngestError::BodyTooLarge { limit });
    }
    let collected = tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, limit).collect());
    let sent = match collected.await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(err)) if err.is::<LengthLimitError>() => {
            return Err(IngestError::BodyTooLarge { limit });
        }
        Ok(Err(err)) => {
            // The admission layer stopped it (and counted it): the budget is spent.
            if let Some(overload) = Overload::find(&*err) {
                return Err(IngestError::Overloaded {
                    source: overload.clone(),
                });
            }
            return Err(IngestError::BodyRead {
                reason: err.to_string(),
            });
        }
        Err(_) => {
            return Err(IngestError::BodyRead {
                reason: format!(
                    "the body did not arrive within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
            });
        }
    };
    let sent_bytes = sent.len();
    if let Some(admitted) = &admitted
        && admitted.declared.is_none()
    {
        admitted
            .admission
            .charge_tenant(tenant, u64::try_from(sent_bytes).unwrap_or(u64::MAX));
    }
    let inflate = Inflate::new(config.max_decompressed_bytes, admitted);
    let bytes = if gzip {
        if !sent.starts_with(&GZIP_MAGIC) {
            return Err(IngestError::BadGzip {
                reason: "body does not start with the gzip magic bytes".to_owned(),
            });
        }
        // Up to `max_decompressed_bytes` of inflating: CPU work, for the blocking pool.
        let budget = inflate.clone();
        tokio::task::spawn_blocking(move || {
            budget.gunzip(&sent).map(|b| Bytes::from(b.into_owned()))
        })
        .await
        .map_err(|err| IngestError::Panicked {
            reason: err.to_string(),
        })??
    } else {
        sent
    };
    Ok(RequestBody {
        sent_bytes,
        bytes,
        inflate,
    })
}

/// One request's decompression budget: every part of it that is gunzipped (the body under
/// `Content-Encoding: gzip`, each sample of a push, each field of a form, a gzipped pprof or
/// JFR, a gRPC message) draws from the same `ingest.max-decompressed-bytes`, so that a request
/// of many gzip bombs costs no more inflating than one; and each inflated byte is taken from
/// the in-flight budget before it is kept. Cheap to clone: the clones share the budget.
#[derive(Clone, Debug)]
pub(crate) struct Inflate(Arc<InflateState>);

#[derive(Debug)]
struct InflateState {
    limit: usize,
    used: AtomicUsize,
    admitted: Option<Admitted>,
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("taken", &self.charge.taken())
            .finish_non_exhaustive()
    }
}

impl Inflate {
    /// A budget of `limit` bytes, charging `admitted`'s share of the in-flight budget too.
    pub(crate) fn new(limit: usize, admitted: Option<Admitted>) -> Inflate {
        Inflate(Arc::new(InflateState {
            limit,
            used: AtomicUsize::new(0),
            admitted,
        }))
    }

    /// `bytes` gunzipped (every gzip layer, and concatenated members as one stream, as Go
    /// reads them) when they start with the gzip magic, else as they are. Inflating stops as
    /// soon as the request's decompressed bytes pass `ingest.max-decompressed-bytes`, so that a
    /// bomb costs at most that much work and memory. Blocking: call it on the blocking pool.
    ///
    /// # Errors
    ///
    /// [`IngestError::DecompressedTooLarge`] past the budget, [`IngestError::Overloaded`] when
    /// the in-flight budget cannot take the bytes, [`IngestError::BadGzip`] for a corrupt
    /// stream.
    pub(crate) fn gunzip<'a>(&self, bytes: &'a [u8]) -> Result<Cow<'a, [u8]>, IngestError> {
        let mut current = Cow::Borrowed(bytes);
        while current.starts_with(&GZIP_MAGIC) {
            current = Cow::Owned(self.inflate(&current)?);
        }
        Ok(current)
    }

    fn inflate(&self, gzipped: &[u8]) -> Result<Vec<u8>, IngestError> {
        let state = &self.0;
        let mut reader = flate2::read::MultiGzDecoder::new(gzipped);
        let mut out = Vec::with_capacity(gzipped.len().saturating_mul(4).min(INFLATE_CHUNK * 16));
        let mut chunk = vec![0u8; INFLATE_CHUNK];
        loop {
            let n = match reader.read(&mut chunk) {
                Ok(0) => return Ok(out),
                Ok(n) => n,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(err) => {
                    return Err(IngestError::BadGzip {
                        reason: err.to_string(),
                    });
                }
            };
            let used = state.used.fetch_add(n, Ordering::AcqRel) + n;
            if used > state.limit {
                return Err(IngestError::DecompressedTooLarge { limit: state.limit });
            }
            if let Some(admitted) = &state.admitted
                && let Err(overload) = admitted.take(n as u64)
            {
                admitted.admission.count("http", &overload);
                return Err(IngestError::Overloaded { source: overload });
            }
            out.extend_from_slice(&chunk[..n]);
        }
    }

    /// [`Inflate::gunzip`] of one named part of the request (`series[0].samples[1]`, `profile
    /// field`): a corrupt stream's error names it.
    ///
    /// # Errors
    ///
    /// As [`Inflate::gunzip`].
    pub(crate) fn gunzip_part<'a>(
        &self,
        bytes: &'a [u8],
        part: &str,
    ) -> Result<Cow<'a, [u8]>, IngestError> {
        self.gunzip(bytes).map_err(|err| match err {
            IngestError::BadGzip { reason } => IngestError::BadGzip {
                reason: format!("{part}: {reason}"),
            },
            other => other,
        })
    }
}

/// The fields of a multipart form, by name (of a repeated name the first wins), and every name
/// sent, for an error that says what the form held instead.
pub(crate) struct FormFields {
    fields: HashMap<String, Bytes>,
    names: Vec<String>,
}

impl FormFields {
    /// Reads the form in `body` (already read under the caps and gunzipped), with the request's
    /// headers for its boundary.
    ///
    /// # Errors
    ///
    /// [`IngestError::Multipart`] for a malformed form (no boundary, broken parts).
    pub(crate) async fn read(parts: Parts, body: Bytes) -> Result<FormFields, IngestError> {
        let malformed = |err: axum::extract::multipart::MultipartError| IngestError::Multipart {
            reason: err.body_text(),
        };
        let request = Request::from_parts(parts, Body::from(body));
        let mut multipart =
            Multipart::from_request(request, &())
                .await
                .map_err(|err| IngestError::Multipart {
                    reason: err.body_text(),
                })?;
        let mut form = FormFields {
            fields: HashMap::new(),
            names: Vec::new(),
        };
        while let Some(field) = multipart.next_field().await.map_err(malformed)? {
            let name = field.name().unwrap_or_default().to_owned();
            let data = field.bytes().await.map_err(malformed)?;
            form.names.push(name.clone());
            form.fields.entry(name).or_insert(data);
        }
        Ok(form)
    }

    /// Takes the field `name` out of the form.
    pub(crate) fn take(&mut self, name: &str) -> Option<Bytes> {
        self.fields.remove(name)
    }

    /// The names of every field sent, in order, or `none`.
    pub(crate) fn sent(&self) -> String {
        if self.names.is_empty() {
            "none".to_owned()
        } else {
            self.names.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(data).expect("in memory");
        enc.finish().expect("in memory")
    }

    #[test]
    fn one_budget_covers_every_part_of_a_request() {
        let bomb = gz(&vec![0u8; 1 << 20]);
        let inflate = Inflate::new(1000, None);
        let err = inflate.gunzip(&bomb).err();
        assert!(matches!(
            err,
            Some(IngestError::DecompressedTooLarge { limit: 1000 })
        ));
        let shared = Inflate::new(3 << 20, None);
        let part = gz(&vec![1u8; 1 << 20]);
        for _ in 0..3 {
            assert_eq!(shared.gunzip(&part).unwrap().len(), 1 << 20);
        }
        assert!(
            matches!(
                shared.gunzip(&part),
                Err(IngestError::DecompressedTooLarge { .. })
            ),
            "the fourth part is past the request's budget"
        );
        let (once, twice) = (gz(b"a;b 1\n"), gz(&gz(b"x")));
        let ok = Inflate::new(100, None).gunzip(&once).unwrap();
        assert_eq!(&ok[..], b"a;b 1\n");
        let inner = Inflate::new(100, None).gunzip(&twice).unwrap();
        assert_eq!(&inner[..], b"x", "every layer");
        assert!(matches!(
            Inflate::new(100, None).gunzip(b"plain"),
            Ok(Cow::Borrowed(_))
        ));
    }

    #[test]
    fn gunzip_rejects_what_is_not_gzip() {
        let mut truncated = gz(b"a;b 1\n");
        truncated.truncate(12);
        assert!(matches!(
            Inflate::new(100, None).gunzip(&truncated),
            Err(IngestError::BadGzip { .. })
        ));
    }
}
