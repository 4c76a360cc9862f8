//! Reading request bodies under the configured caps, and undoing `Content-Encoding: gzip`.
//!
//! Input: the request's headers and body. Output: the body's bytes as the parsers need them.
//! Nothing here allocates past [`IngestConfig`]'s caps, whatever the client claims or sends.

use std::collections::HashMap;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, Request};
use axum::http::HeaderMap;
use axum::http::header::{CONTENT_ENCODING, CONTENT_LENGTH};
use axum::http::request::Parts;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use smolder_common::PprofError;
use smolder_common::pprof::{self, Limits};

use super::{IngestConfig, IngestError};

/// The first two bytes of every gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// A request body as sent, and as decoded.
pub(crate) struct RequestBody {
    /// The size as sent, for `pyroscope_distributor_received_compressed_bytes`.
    pub(crate) sent_bytes: usize,
    /// The body after `Content-Encoding` is undone.
    pub(crate) bytes: Bytes,
}

/// Reads `body` in full, at most `config.max_body_bytes` of it, then gunzips it if
/// `Content-Encoding` says so, at most `config.max_decompressed_bytes`.
///
/// # Errors
///
/// [`IngestError::BodyTooLarge`] (checked against `Content-Length` before reading, too),
/// [`IngestError::DecompressedTooLarge`], [`IngestError::BadGzip`],
/// [`IngestError::UnsupportedEncoding`] for an encoding other than gzip or identity, and
/// [`IngestError::BodyRead`] when the connection fails mid-body.
pub(crate) async fn read(
    headers: &HeaderMap,
    body: Body,
    config: &IngestConfig,
) -> Result<RequestBody, IngestError> {
    let limit = config.max_body_bytes;
    let gzip = match headers.get(CONTENT_ENCODING).map(|v| v.to_str()) {
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
    let sent = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.is::<LengthLimitError>() => {
            return Err(IngestError::BodyTooLarge { limit });
        }
        Err(err) => {
            return Err(IngestError::BodyRead {
                reason: err.to_string(),
            });
        }
    };
    let sent_bytes = sent.len();
    let bytes = if gzip {
        // Up to `max_decompressed_bytes` of inflating: CPU work, for the blocking pool.
        let config = config.clone();
        tokio::task::spawn_blocking(move || gunzip(&sent, &config))
            .await
            .map_err(|err| IngestError::Panicked {
                reason: err.to_string(),
            })??
    } else {
        sent
    };
    Ok(RequestBody { sent_bytes, bytes })
}

/// `bytes` gunzipped under `config.max_decompressed_bytes` when they start with the gzip magic
/// (multipart parts carry no `Content-Encoding`, so the JFR form's parts are sniffed), else as
/// they are.
///
/// # Errors
///
/// As [`gunzip`].
pub(crate) fn gunzip_if_gzipped<'a>(
    bytes: &'a [u8],
    config: &IngestConfig,
) -> Result<std::borrow::Cow<'a, [u8]>, IngestError> {
    if bytes.starts_with(&GZIP_MAGIC) {
        Ok(std::borrow::Cow::Owned(gunzip(bytes, config)?.to_vec()))
    } else {
        Ok(std::borrow::Cow::Borrowed(bytes))
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

/// Gunzips a `Content-Encoding: gzip` body, stopping one byte past
/// `config.max_decompressed_bytes` so that a gzip bomb costs at most that much memory.
fn gunzip(sent: &[u8], config: &IngestConfig) -> Result<Bytes, IngestError> {
    if !sent.starts_with(&GZIP_MAGIC) {
        return Err(IngestError::BadGzip {
            reason: "body does not start with the gzip magic bytes".to_owned(),
        });
    }
    let limits = Limits {
        max_bytes: config.max_decompressed_bytes,
        ..Limits::default()
    };
    // pprof's bounded gunzip is the one we want: it only gunzips when the magic is there,
    // which we checked above.
    match pprof::decompress(sent, &limits) {
        Ok(bytes) => Ok(Bytes::from(bytes.into_owned())),
        Err(PprofError::TooLarge { limit }) => Err(IngestError::DecompressedTooLarge { limit }),
        Err(PprofError::Gzip { source }) => Err(IngestError::BadGzip {
            reason: source.to_string(),
        }),
        Err(other) => Err(IngestError::BadGzip {
            reason: other.to_string(),
        }),
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

    fn config(max_body: usize, max_decompressed: usize) -> IngestConfig {
        IngestConfig {
            max_body_bytes: max_body,
            max_decompressed_bytes: max_decompressed,
            ..IngestConfig::default()
        }
    }

    #[test]
    fn gunzip_stops_at_the_cap() {
        let bomb = gz(&vec![0u8; 1 << 20]);
        let err = gunzip(&bomb, &config(1 << 20, 1000)).err();
        assert!(matches!(
            err,
            Some(IngestError::DecompressedTooLarge { limit: 1000 })
        ));
        let ok = gunzip(&gz(b"a;b 1\n"), &config(100, 100)).expect("small body");
        assert_eq!(&ok[..], b"a;b 1\n");
    }

    #[test]
    fn gunzip_rejects_what_is_not_gzip() {
        assert!(matches!(
            gunzip(b"a;b 1\n", &config(100, 100)),
            Err(IngestError::BadGzip { .. })
        ));
        let mut truncated = gz(b"a;b 1\n");
        truncated.truncate(12);
        assert!(matches!(
            gunzip(&truncated, &config(100, 100)),
            Err(IngestError::BadGzip { .. })
        ));
    }
}
