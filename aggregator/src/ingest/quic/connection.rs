//! One agent connection: the hello and its authentication, then one task per batch stream.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use smolder_common::wire::frame::{self, HEADER_LEN};
use smolder_common::wire::{
    self, Ack, BatchError, BatchMessage, FrameError, FrameHeader, FrameKind, FrameLimits, Hello,
    RateLimiter, Refusal, RefusalReason, Reject, Welcome, code, limits, reject,
};
use tracing::{debug, error, info, warn};

use super::{QuicConfig, QuicMetrics};
use crate::admission::{Admission, Overload};
use crate::api_error::chain;
use crate::auth::{Auth, CredentialKey};
use crate::ingest::{
    AgentBatch, IngestError, Ingester, ProfileSet, Refused, Stored, Transport, pprof::type_label,
};
use crate::metrics::Errors;
use crate::store::{BatchMarker, StoreError, unix};
use crate::tenant::Tenant;

/// What every connection task shares.
pub(super) struct Shared {
    pub(super) ingester: Arc<Ingester>,
    pub(super) auth: Arc<Auth>,
    pub(super) admission: Arc<Admission>,
    /// Whether `ingest.quic.client-ca` is set, so that a verified client certificate suffices.
    pub(super) client_ca: bool,
    pub(super) config: QuicConfig,
    pub(super) metrics: QuicMetrics,
    pub(super) errors: Errors,
}

/// How a connection's agent proved itself.
#[derive(Clone, Debug)]
enum Proof {
    /// A client certificate `ingest.quic.client-ca` signed.
    Certificate,
    /// The token of this credential, checked again for every batch.
    Token(CredentialKey),
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
    /// The in-flight budget cannot take the batch now, or its tenant is over its ingest rate.
    #[error("{0}")]
    Overloaded(Overload),
    /// The credential of the connection's token was removed since the hello.
    #[error("the connection's token is no longer in force")]
    Revoked,
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
            StreamError::Read { .. }
            | StreamError::Timeout
            | StreamError::RateLimited { .. }
            | StreamError::Overloaded(_)
            | StreamError::Revoked => true,
            StreamError::Ingest(err) => matches!(
                err,
                IngestError::Store { .. }
                    | IngestError::Panicked { .. }
                    | IngestError::ClockSkew { .. }
                    | IngestError::Overloaded { .. }
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
            StreamError::Overloaded(overload) => overload.reason(),
            StreamError::Revoked => "revoked",
            StreamError::Ingest(err) => err.error_type(),
        }
    }

    /// The reject's `code`: the reason label, except that a batch whose every series was refused
    /// is `refused` (its series' reasons follow in the reject), and one the object store could
    /// not take is `unavailable`, on which an agent with other aggregators moves on at once.
    fn code(&self) -> &'static str {
        match self {
            StreamError::Ingest(IngestError::Refused { .. }) => "refused",
            StreamError::Ingest(IngestError::Store {
                source: StoreError::Unavailable { .. } | StoreError::Busy { .. },
            }) => reject::UNAVAILABLE,
            other => other.error_type(),
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
    let (hello, tenant, proof) = match handshake(&conn, &shared).await {
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
                    Stream {
                        conn: conn.clone(),
                        agent: Arc::clone(&agent),
                        tenant: tenant.clone(),
                        proof: proof.clone(),
                        limiter: Arc::clone(&limiter),
                    },
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

/// What a batch stream knows of its connection.
struct Stream {
    conn: quinn::Connection,
    agent: Arc<str>,
    tenant: Tenant,
    proof: Proof,
    limiter: Arc<Mutex<RateLimiter>>,
}

/// Reads and checks the hello; answers a welcome, or a reject and closes the connection. The
/// tenant is the token's.
async fn handshake(
    conn: &quinn::Connection,
    shared: &Shared,
) -> Result<(Hello, Tenant, Proof), String> {
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
    let (tenant, proof) = match authenticate(&hello, has_cert, shared) {
        Ok(accepted) => accepted,
        Err(reason) => {
            shared.auth.count_refusal("agent");
            return Err(refuse(conn, send, format!("agent {}: {reason}", hello.agent_id)).await);
        }
    };
    let limits = shared.ingester.batch_limits();
    let welcome = Welcome {
        aggregator_version: env!("CARGO_PKG_VERSION").to_owned(),
        max_batch_bytes: limits.max_batch_bytes,
        max_batches_in_flight: shared.config.max_batches_in_flight,
        max_series_per_batch: limits.max_series,
        max_labels_per_series: limits.max_labels,
        max_label_bytes: limits.max_label_bytes,
        clock_unix_nanos: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
        max_clock_skew_seconds: u32::try_from(crate::ingest::limits::MAX_CLOCK_SKEW.as_secs())
            .unwrap_or(u32::MAX),
    };
    reply(send, &frame::encode(FrameKind::Welcome, &welcome)).await;
    Ok((hello, tenant, proof))
}

/// Whether a hello may ship, and for which tenant: a verified client certificate suffices (for
/// `anonymous`), else its token must be a credential in force with scope `ingest` (for the
/// credential's tenant, `anonymous` without one).
fn authenticate(hello: &Hello, has_cert: bool, shared: &Shared) -> Result<(Tenant, Proof), String> {
    if has_cert {
        return Ok((Tenant::anonymous(), Proof::Certificate));
    }
    match shared.auth.agent(&hello.token) {
        Ok((tenant, key, name)) => {
            debug!(agent_id = %hello.agent_id, credential = %name, "agent authenticated");
            Ok((tenant, Proof::Token(key)))
        }
        Err(reason) if shared.client_ca => Err(format!(
            "{reason}, or a client certificate signed by ingest.quic.client-ca"
        )),
        Err(reason) => Err(reason.to_owned()),
    }
}

/// Answers a refused hello on its stream and closes the connection with the same reason.
async fn refuse(conn: &quinn::Connection, send: quinn::SendStream, reason: String) -> String {
    let reject = Reject {
        sequence: 0,
        reason: reason.clone(),
        code: "refused_hello".to_owned(),
        ..Reject::default()
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
    let header = read_header(recv, limits).await?;
    let body = read_body(recv, &header).await?;
    Ok((header, body))
}

/// Reads a frame's header and checks it under `limits`.
async fn read_header(
    recv: &mut quinn::RecvStream,
    limits: FrameLimits,
) -> Result<FrameHeader, StreamError> {
    let mut header = [0u8; HEADER_LEN];
    read_exact(recv, &mut header, "header").await?;
    Ok(FrameHeader::parse(&header, limits)?)
}

/// Reads exactly the body `header` declares, which must end the stream.
async fn read_body(
    recv: &mut quinn::RecvStream,
    header: &FrameHeader,
) -> Result<Vec<u8>, StreamError> {
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
        Ok(None) => Ok(body),
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
    stream: Stream,
    send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let started = Instant::now();
    let metrics = &shared.metrics;
    let agent = &stream.agent;
    let mut sequence = 0;
    let outcome = tokio::time::timeout(
        STREAM_TIMEOUT,
        receive(&shared, &stream, &mut recv, &mut sequence),
    )
    .await
    .unwrap_or(Err(StreamError::Timeout));
    let answer = match outcome {
        Ok(stored) => {
            let duplicate = stored.duplicate;
            if duplicate {
                metrics.batches_duplicate.inc();
            }
            metrics.batches_acked.inc();
            metrics
                .batch_duration
                .observe(started.elapsed().as_secs_f64());
            debug!(
                agent_id = %agent,
                sequence,
                duplicate,
                refused = stored.refused.len(),
                "batch acknowledged"
            );
            let (refused, unlisted) = answer_refusals(&stored.refused);
            frame::encode(
                FrameKind::Ack,
                &Ack {
                    sequence,
                    duplicate,
                    refused,
                    unlisted,
                },
            )
        }
        Err(err) => {
            let error_type = err.error_type();
            metrics
                .batches_rejected
                .with_label_values(&[error_type])
                .inc();
            // Ingest's own refusals are counted by `Ingester::record`, refusals for load in
            // the refused counter; count the stream's other failures here.
            match &err {
                StreamError::Ingest(_) => {}
                StreamError::Overloaded(overload) => shared.admission.count("quic", overload),
                StreamError::Revoked => shared.auth.count_refusal("revoked"),
                _ => shared.errors.inc("ingest", error_type),
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
                StreamError::Ingest(IngestError::ClockSkew { reason }) => warn!(
                    agent_id = %agent,
                    sequence,
                    %reason,
                    "the agent's clock is ahead of this aggregator's; its batch waits at the agent"
                ),
                _ if retryable => {
                    debug!(agent_id = %agent, sequence, %err, "batch refused for now")
                }
                _ => info!(agent_id = %agent, sequence, %err, "batch rejected"),
            }
            // Whatever is still coming on this stream is not wanted.
            let _ = recv.stop(code::PROTOCOL.into());
            let (refused, unlisted) = match &err {
                StreamError::Ingest(IngestError::Refused { refused }) => answer_refusals(refused),
                _ => Default::default(),
            };
            frame::encode(
                FrameKind::Reject,
                &Reject {
                    sequence,
                    reason: err.to_string(),
                    retryable,
                    code: err.code().to_owned(),
                    refused,
                    unlisted,
                },
            )
        }
    };
    reply(send, &answer).await;
}

/// The refusals of a batch as its answer carries them.
fn answer_refusals(
    refused: &[Refused],
) -> (
    Vec<smolder_common::wire::SeriesRefusal>,
    Vec<smolder_common::wire::RefusalTally>,
) {
    limits::answer_refusals(refused.iter().map(|r| (r.index, &r.refusal)))
}

/// Closes a connection whose credential was removed: the agent's next hello is refused, and
/// what it has not had acknowledged stays in its spool.
fn close_revoked(conn: &quinn::Connection, agent: &str) {
    warn!(agent_id = %agent, "closing the connection: its token's credential was removed");
    conn.close(
        code::REFUSED.into(),
        b"the token's credential is no longer in force",
    );
}

/// Reads, decodes and stores one batch; what it stored (a duplicate when it had been stored
/// before). Sets `sequence` as soon as it is known, for the answer.
async fn receive(
    shared: &Shared,
    stream: &Stream,
    recv: &mut quinn::RecvStream,
    sequence: &mut u64,
) -> Result<Stored, StreamError> {
    let (agent, tenant) = (&*stream.agent, &stream.tenant);
    if let Proof::Token(key) = &stream.proof
        && !shared.auth.still(key)
    {
        close_revoked(&stream.conn, agent);
        return Err(StreamError::Revoked);
    }
    let allowed = stream
        .limiter
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
    let header = read_header(recv, limits)
        .await?
        .check_kind(FrameKind::Batch)?;
    // The batch's memory, as sent and decompressed, is taken before its body is read; held
    // until it is stored.
    let declared = u64::from(header.compressed_len) + u64::from(header.uncompressed_len);
    let _charge = shared
        .admission
        .batch(declared)
        .map_err(StreamError::Overloaded)?;
    shared
        .admission
        .tenant(tenant, Some(u64::from(header.compressed_len)))
        .map_err(StreamError::Overloaded)?;
    let body = read_body(recv, &header).await?;
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
        let series = message.into_series();
        Ok::<_, StreamError>((sequence, agent_id, end, series))
    })
    .await
    .map_err(|err| {
        StreamError::Ingest(IngestError::Panicked {
            reason: err.to_string(),
        })
    })??;
    let (number, agent_id, end, series) = decoded;
    *sequence = number;
    let series = series?;
    if agent_id != agent {
        return Err(StreamError::AgentMismatch {
            batch: agent_id,
            connection: agent.to_owned(),
        });
    }
    // A series that does not decode is refused alone; the batch's others are stored.
    let mut refused = Vec::new();
    let mut profiles = Vec::with_capacity(series.len());
    for (index, series) in series.into_iter().enumerate() {
        match series {
            Ok(profile) => {
                let kind = type_label(profile.series.profile_type().unwrap_or_default());
                profiles.push((profile, kind));
            }
            Err(err) => refused.push(Refused {
                index,
                refusal: Refusal {
                    reason: RefusalReason::Invalid,
                    message: err.to_string(),
                },
            }),
        }
    }
    let set = ProfileSet {
        transport: Transport::Quic,
        format: "wire",
        sent_bytes,
        profiles,
        // Agents' batches carry no span ids: eBPF samples are not tagged with spans.
        spans: Vec::new(),
    };
    let batch = AgentBatch {
        marker: BatchMarker {
            agent_id,
            sequence: number,
            window_end: unix(end),
        },
        refused,
    };
    let outcome = shared.ingester.ingest(tenant, set, Some(batch)).await;
    shared.ingester.record("quic", &outcome);
    outcome.map_err(StreamError::Ingest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overload_and_revocation_are_retryable() {
        assert!(
            StreamError::Overloaded(Overload::Budget {
                wanted: 1,
                limit: 0
            })
            .retryable()
        );
        assert!(
            StreamError::Revoked.retryable(),
            "the agent keeps its batch"
        );
    }

    #[test]
    fn retryable_errors_are_the_transient_ones() {
        assert!(StreamError::RateLimited { limit: 1 }.retryable());
        assert!(StreamError::Timeout.retryable());
        assert!(!StreamError::Frame(FrameError::UnsupportedVersion { version: 2 }).retryable());
        assert!(
            StreamError::Ingest(IngestError::ClockSkew {
                reason: String::new()
            })
            .retryable(),
            "the agent's clock is ahead: its batch can wait"
        );
        let refused = StreamError::Ingest(IngestError::Refused {
            refused: vec![Refused {
                index: 0,
                refusal: Refusal {
                    reason: RefusalReason::TooOld,
                    message: String::new(),
                },
            }],
        });
        assert!(!refused.retryable(), "older than the retention stays so");
        assert_eq!(refused.code(), "refused");
        assert_eq!(
            StreamError::Frame(FrameError::TooLarge {
                which: "compressed",
                size: 2,
                limit: 1
            })
            .code(),
            "too_large",
            "the agent splits the batch on this code"
        );
        let unavailable = StreamError::Ingest(IngestError::Store {
            source: StoreError::Unavailable {
                reason: String::new(),
            },
        });
        assert!(unavailable.retryable());
        assert_eq!(
            unavailable.code(),
            "unavailable",
            "an agent with other aggregators moves on at once on this code"
        );
        let broken = StreamError::Ingest(IngestError::Store {
            source: StoreError::Closed,
        });
        assert!(broken.retryable());
        assert_eq!(
            broken.code(),
            "store",
            "not taken for an unreachable bucket"
        );
    }
}
