//! One agent connection: the hello and its authentication, then one task per batch stream.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use smolder_common::wire::frame::{self, HEADER_LEN};
use smolder_common::wire::{
    self, Ack, BatchError, BatchMessage, FrameError, FrameHeader, FrameKind, FrameLimits, Hello,
    RateLimiter, Reject, Welcome, code,
};
use tracing::{debug, error, info, warn};

use super::tls::Credentials;
use super::{QuicConfig, QuicMetrics};
use crate::api_error::chain;
use crate::ingest::{IngestError, Ingester, ProfileSet, Transport, pprof::type_label};
use crate::metrics::Errors;
use crate::store::{BatchMarker, unix};
use crate::tenant::Tenant;

/// What every connection task shares.
pub(super) struct Shared {
    pub(super) ingester: Arc<Ingester>,
    pub(super) credentials: Credentials,
    pub(super) config: QuicConfig,
    pub(super) metrics: QuicMetrics,
    pub(super) errors: Errors,
}

/// How long an agent has to send its hello after the handshake.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one batch stream may take from its first byte to its last: a stream that trickles
/// slower than this holds a stream slot for nothing.
const STREAM_TIMEOUT: Duration = Duration::from_secs(60);
/// The most a body buffer reserves before its bytes arrive.
const BODY_CHUNK: usize = 1 << 20;
/// How long a refusal waits for the agent to read it before the connection closes.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// Why a batch stream was refused.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    /// The frame is malformed, of another version or kind, or over `ingest.quic.max-batch-bytes`.
    #[error("{0}")]
    Frame(#[from] FrameError),
    /// The batch decoded but a field is invalid.
    #[error("{0}")]
    Batch(#[from] BatchError),
    /// The stream broke while it was read.
    #[error("reading the stream failed: {reason}")]
    Read {
        /// What quinn said.
        reason: String,
    },
    /// The stream took longer than [`STREAM_TIMEOUT`].
    #[error("the batch was not received within {} s", STREAM_TIMEOUT.as_secs())]
    Timeout,
    /// The batch names another agent than the connection's hello.
    #[error("batch agent id {batch:?} differs from the connection's agent id {connection:?}")]
    AgentMismatch {
        /// The batch's agent id.
        batch: String,
        /// The hello's agent id.
        connection: String,
    },
    /// The connection is over `ingest.quic.max-batches-per-second`.
    #[error(
        "rate limit: more than {limit} batches per second (ingest.quic.max-batches-per-second)"
    )]
    RateLimited {
        /// The limit.
        limit: u32,
    },
    /// The ingest path refused the batch or the store failed.
    #[error("{0}")]
    Ingest(IngestError),
}

impl StreamError {
    /// Whether the agent may send the same batch again later.
    fn retryable(&self) -> bool {
        match self {
            StreamError::Read { .. } | StreamError::Timeout | StreamError::RateLimited { .. } => {
                true
            }
            StreamError::Ingest(err) => matches!(
                err,
                IngestError::Store { .. } | IngestError::Panicked { .. }
            ),
            StreamError::Frame(_) | StreamError::Batch(_) | StreamError::AgentMismatch { .. } => {
                false
            }
        }
    }

    /// The bounded `reason` label of the reject counter.
    fn error_type(&self) -> &'static str {
        match self {
            StreamError::Frame(
                FrameError::TooLarge { .. } | FrameError::ImpossibleRatio { .. },
            ) => "too_large",
            StreamError::Frame(FrameError::UnsupportedVersion { .. }) => "version",
            StreamError::Frame(_) => "bad_frame",
            StreamError::Batch(_) | StreamError::AgentMismatch { .. } => "bad_batch",
            StreamError::Read { .. } => "stream_read",
            StreamError::Timeout => "timeout",
            StreamError::RateLimited { .. } => "rate_limited",
            StreamError::Ingest(err) => err.error_type(),
        }
    }
}

/// Serves one connection until it closes.
pub(super) async fn serve(incoming: quinn::Incoming, shared: Arc<Shared>) {
    let metrics = &shared.metrics;
    let conn = match incoming.await {
        Ok(conn) => conn,
        Err(err) => {
            metrics
                .connections_total
                .with_label_values(&["handshake_failed"])
                .inc();
            info!(error = %err, "QUIC handshake failed");
            return;
        }
    };
    let (hello, tenant) = match handshake(&conn, &shared).await {
        Ok(accepted) => accepted,
        Err(reason) => {
            metrics
                .connections_total
                .with_label_values(&["refused"])
                .inc();
            warn!(%reason, "agent refused");
            return;
        }
    };
    metrics
        .connections_total
        .with_label_values(&["accepted"])
        .inc();
    metrics.connections_open.inc();
    info!(
        agent_id = %hello.agent_id,
        hostname = %hello.hostname,
        agent_version = %hello.agent_version,
        %tenant,
        "agent connected"
    );
    let rate = shared.config.max_batches_per_second;
    let limiter = Arc::new(Mutex::new(RateLimiter::new(rate, rate, Instant::now())));
    let agent: Arc<str> = hello.agent_id.into();
    let reason = loop {
        match conn.accept_bi().await {
            Ok((send, recv)) => {
                tokio::spawn(batch_stream(
                    Arc::clone(&shared),
                    Arc::clone(&agent),
                    tenant.clone(),
                    Arc::clone(&limiter),
                    send,
                    recv,
                ));
            }
            Err(err) => break err,
        }
    };
    metrics.connections_open.dec();
    info!(agent_id = %agent, %reason, "agent disconnected");
}

/// Reads and checks the hello; answers a welcome, or a reject and closes the connection. The
/// tenant is the token's.
async fn handshake(conn: &quinn::Connection, shared: &Shared) -> Result<(Hello, Tenant), String> {
    let (send, mut recv) = match tokio::time::timeout(HELLO_TIMEOUT, conn.accept_bi()).await {
        Ok(Ok(streams)) => streams,
        Ok(Err(err)) => return Err(format!("connection lost before its hello: {err}")),
        Err(_) => {
            let reason = format!("no hello within {} s", HELLO_TIMEOUT.as_secs());
            conn.close(code::REFUSED.into(), reason.as_bytes());
            return Err(reason);
        }
    };
    let read = tokio::time::timeout(HELLO_TIMEOUT, read_frame(&mut recv, FrameLimits::CONTROL));
    let hello = match read.await {
        Err(_) => Err(StreamError::Timeout),
        Ok(Err(err)) => Err(err),
        Ok(Ok((header, body))) => header
            .check_kind(FrameKind::Hello)
            .and_then(|header| header.decode::<Hello>(&body))
            .map_err(StreamError::Frame),
    };
    let hello = match hello {
        Ok(hello) => hello,
        Err(err) => return Err(refuse(conn, send, format!("invalid hello: {err}")).await),
    };
    if let Err(err) = wire::batch::check_agent_id(&hello.agent_id) {
        return Err(refuse(conn, send, err.to_string()).await);
    }
    let has_cert = conn.peer_identity().is_some();
    let tenant = match authenticate(&hello, has_cert, &shared.credentials) {
        Ok(tenant) => tenant,
        Err(reason) => {
            return Err(refuse(conn, send, format!("agent {}: {reason}", hello.agent_id)).await);
        }
    };
    let welcome = Welcome {
        aggregator_version: env!("CARGO_PKG_VERSION").to_owned(),
        max_batch_bytes: u64::from(shared.config.max_batch_bytes),
        max_batches_in_flight: shared.config.max_batches_in_flight,
    };
    reply(send, &frame::encode(FrameKind::Welcome, &welcome)).await;
    Ok((hello, tenant))
}

/// Whether a hello may ship, and for which tenant: a verified client certificate suffices (for
/// `anonymous`), else its token must be one of the configured ones (for the token's tenant).
fn authenticate(
    hello: &Hello,
    has_cert: bool,
    credentials: &Credentials,
) -> Result<Tenant, String> {
    if has_cert {
        return Ok(Tenant::anonymous());
    }
    let how = if credentials.client_ca {
        "a token from ingest.quic.tokens or a client certificate signed by ingest.quic.client-ca"
    } else {
        "a token from ingest.quic.tokens"
    };
    if hello.token.is_empty() {
        return Err(format!("no credentials; present {how}"));
    }
    // Every token is compared, so that the time taken does not tell which one matched.
    let mut found = None;
    for (token, tenant) in &credentials.tokens {
        if same(token.as_bytes(), hello.token.as_bytes()) {
            found = Some(tenant);
        }
    }
    found
        .cloned()
        .ok_or_else(|| format!("invalid token; present {how}"))
}

/// Compares in time independent of where the inputs differ, so that a token cannot be guessed
/// byte by byte from response times.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Answers a refused hello on its stream and closes the connection with the same reason.
async fn refuse(conn: &quinn::Connection, send: quinn::SendStream, reason: String) -> String {
    let reject = Reject {
        sequence: 0,
        reason: reason.clone(),
        retryable: false,
    };
    reply_and_wait(send, &frame::encode(FrameKind::Reject, &reject)).await;
    // Close reasons must fit in one packet.
    let cut: String = reason.chars().take(512).collect();
    conn.close(code::REFUSED.into(), cut.as_bytes());
    reason
}

/// Writes `bytes` and finishes the stream; a peer that went away gets nothing, which is fine.
async fn reply(mut send: quinn::SendStream, bytes: &[u8]) {
    if send.write_all(bytes).await.is_ok() {
        let _ = send.finish();
    }
}

/// [`reply`], then waits briefly for the peer to have read it.
async fn reply_and_wait(mut send: quinn::SendStream, bytes: &[u8]) {
    if send.write_all(bytes).await.is_ok() && send.finish().is_ok() {
        let _ = tokio::time::timeout(REFUSAL_LINGER, send.stopped()).await;
    }
}

/// Reads one frame that must end the stream: header, checked under `limits` before anything
/// else is read, then exactly the declared body.
async fn read_frame(
    recv: &mut quinn::RecvStream,
    limits: FrameLimits,
) -> Result<(FrameHeader, Vec<u8>), StreamError> {
    let mut header = [0u8; HEADER_LEN];
    read_exact(recv, &mut header, "header").await?;
    let header = FrameHeader::parse(&header, limits)?;
    // Grown as bytes arrive rather than allocated from the header: a client that declares a
    // large body and sends nothing holds nothing.
    let declared = header.compressed_len as usize;
    let mut body = Vec::with_capacity(declared.min(BODY_CHUNK));
    while body.len() < declared {
        match recv.read_chunk(declared - body.len(), true).await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk.bytes),
            Ok(None) => {
                return Err(FrameError::Truncated {
                    part: "body",
                    expected: declared,
                    actual: body.len(),
                }
                .into());
            }
            Err(err) => {
                return Err(StreamError::Read {
                    reason: err.to_string(),
                });
            }
        }
    }
    let mut extra = [0u8; 64];
    match recv.read(&mut extra).await {
        Ok(None) => Ok((header, body)),
        Ok(Some(extra)) => Err(FrameError::TrailingBytes { extra }.into()),
        Err(err) => Err(StreamError::Read {
            reason: err.to_string(),
        }),
    }
}

async fn read_exact(
    recv: &mut quinn::RecvStream,
    buf: &mut [u8],
    part: &'static str,
) -> Result<(), StreamError> {
    match recv.read_exact(buf).await {
        Ok(()) => Ok(()),
        Err(quinn::ReadExactError::FinishedEarly(actual)) => Err(FrameError::Truncated {
            part,
            expected: buf.len(),
            actual,
        }
        .into()),
        Err(quinn::ReadExactError::ReadError(err)) => Err(StreamError::Read {
            reason: err.to_string(),
        }),
    }
}

/// Receives, stores and answers one batch stream.
async fn batch_stream(
    shared: Arc<Shared>,
    agent: Arc<str>,
    tenant: Tenant,
    limiter: Arc<Mutex<RateLimiter>>,
    send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let started = Instant::now();
    let metrics = &shared.metrics;
    let mut sequence = 0;
    let outcome = tokio::time::timeout(
        STREAM_TIMEOUT,
        receive(&shared, &agent, &tenant, &limiter, &mut recv, &mut sequence),
    )
    .await
    .unwrap_or(Err(StreamError::Timeout));
    let answer = match outcome {
        Ok(duplicate) => {
            if duplicate {
                metrics.batches_duplicate.inc();
            }
            metrics.batches_acked.inc();
            metrics
                .batch_duration
                .observe(started.elapsed().as_secs_f64());
            debug!(agent_id = %agent, sequence, duplicate, "batch acknowledged");
            frame::encode(
                FrameKind::Ack,
                &Ack {
                    sequence,
                    duplicate,
                },
            )
        }
        Err(err) => {
            let error_type = err.error_type();
            metrics
                .batches_rejected
                .with_label_values(&[error_type])
                .inc();
            // Ingest's own refusals are counted by `Ingester::record`; count the stream's here.
            if !matches!(err, StreamError::Ingest(_)) {
                shared.errors.inc("ingest", error_type);
            }
            let retryable = err.retryable();
            match &err {
                // The aggregator's own failures are the operator's business.
                StreamError::Ingest(IngestError::Store { source }) => error!(
                    agent_id = %agent,
                    sequence,
                    error = %chain(source),
                    "storing a batch failed; the agent will resend it"
                ),
                StreamError::Ingest(IngestError::Panicked { reason }) => error!(
                    agent_id = %agent,
                    sequence,
                    %reason,
                    "decoding a batch panicked; the agent will resend it"
                ),
                _ if retryable => {
                    debug!(agent_id = %agent, sequence, %err, "batch refused for now")
                }
                _ => info!(agent_id = %agent, sequence, %err, "batch rejected"),
            }
            // Whatever is still coming on this stream is not wanted.
            let _ = recv.stop(code::PROTOCOL.into());
            frame::encode(
                FrameKind::Reject,
                &Reject {
                    sequence,
                    reason: err.to_string(),
                    retryable,
                },
            )
        }
    };
    reply(send, &answer).await;
}

/// Reads, decodes and stores one batch; `Ok(true)` when it had been stored before. Sets
/// `sequence` as soon as it is known, for the answer.
async fn receive(
    shared: &Shared,
    agent: &str,
    tenant: &Tenant,
    limiter: &Mutex<RateLimiter>,
    recv: &mut quinn::RecvStream,
    sequence: &mut u64,
) -> Result<bool, StreamError> {
    let allowed = limiter
        .lock()
        .expect("rate limiter lock: held only to take a token")
        .try_take(Instant::now());
    if !allowed {
        return Err(StreamError::RateLimited {
            limit: shared.config.max_batches_per_second,
        });
    }
    let max = shared.config.max_batch_bytes;
    let limits = FrameLimits {
        max_compressed: max,
        max_uncompressed: max,
    };
    let (header, body) = read_frame(recv, limits).await?;
    let header = header.check_kind(FrameKind::Batch)?;
    let sent_bytes = HEADER_LEN + body.len();
    let metrics = &shared.metrics;
    metrics.batches_received.inc();
    metrics.bytes_received.inc_by(sent_bytes as u64);

    // Decompressing and decoding tens of MiB is too long for a runtime worker.
    let decoded = tokio::task::spawn_blocking(move || {
        let message: BatchMessage = header.decode(&body)?;
        let sequence = message.sequence;
        let agent_id = message.agent_id.clone();
        let (_, end) = message.window();
        let profiles = message.into_profiles();
        Ok::<_, StreamError>((sequence, agent_id, end, profiles))
    })
    .await
    .map_err(|err| {
        StreamError::Ingest(IngestError::Panicked {
            reason: err.to_string(),
        })
    })??;
    let (number, agent_id, end, profiles) = decoded;
    *sequence = number;
    let profiles = profiles?;
    if agent_id != agent {
        return Err(StreamError::AgentMismatch {
            batch: agent_id,
            connection: agent.to_owned(),
        });
    }
    let set = ProfileSet {
        transport: Transport::Quic,
        format: "wire",
        sent_bytes,
        profiles: profiles
            .into_iter()
            .map(|profile| {
                let kind = type_label(profile.series.profile_type().unwrap_or_default());
                (profile, kind)
            })
            .collect(),
    };
    let marker = BatchMarker {
        agent_id,
        sequence: number,
        window_end: unix(end),
    };
    let outcome = shared.ingester.ingest(tenant, set, Some(marker)).await;
    shared.ingester.record("quic", &outcome);
    outcome
        .map(|stored| stored.duplicate)
        .map_err(StreamError::Ingest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(token: &str) -> Hello {
        Hello {
            agent_id: "a1".into(),
            hostname: "h".into(),
            agent_version: "0".into(),
            token: token.into(),
        }
    }

    fn credentials(client_ca: bool) -> Credentials {
        Credentials {
            tokens: vec![
                ("secret".into(), Tenant::anonymous()),
                ("other".into(), Tenant::new("team-b").unwrap()),
            ],
            client_ca,
        }
    }

    #[test]
    fn tokens_and_certificates_authenticate() {
        assert_eq!(
            authenticate(&hello("secret"), false, &credentials(false)),
            Ok(Tenant::anonymous())
        );
        assert_eq!(
            authenticate(&hello("other"), false, &credentials(false)),
            Ok(Tenant::new("team-b").unwrap())
        );
        assert_eq!(
            authenticate(&hello(""), true, &credentials(true)),
            Ok(Tenant::anonymous())
        );
        let missing = authenticate(&hello(""), false, &credentials(true)).unwrap_err();
        assert!(missing.starts_with("no credentials"), "{missing}");
        assert!(missing.contains("client-ca"), "{missing}");
        let wrong = authenticate(&hello("secreT"), false, &credentials(false)).unwrap_err();
        assert!(wrong.starts_with("invalid token"), "{wrong}");
        assert!(!wrong.contains("client-ca"), "{wrong}");
    }

    #[test]
    fn retryable_errors_are_the_transient_ones() {
        assert!(StreamError::RateLimited { limit: 1 }.retryable());
        assert!(StreamError::Timeout.retryable());
        assert!(!StreamError::Frame(FrameError::UnsupportedVersion { version: 2 }).retryable());
        assert!(
            !StreamError::Ingest(IngestError::TimeOutOfRange {
                reason: String::new()
            })
            .retryable()
        );
    }
}
