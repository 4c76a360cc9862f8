//! Ship: drains the spool to the aggregator over QUIC, oldest batch first.
//!
//! Input: batch frames from the [`Spool`]. Output: QUIC streams to the aggregator
//! (`ship.aggregator`, default `127.0.0.1:4041`), one per batch, and each batch's fate reported
//! back to the spool: deleted on its ack, sent again after a lost connection or a retryable
//! reject, dropped (and counted) on a reject that a retry cannot fix. Caller: `app::start`.
//! Owns one task ([`run`]), one UDP socket and at most one connection.
//!
//! A connection starts with a hello (agent id, hostname, version, token) that the aggregator
//! answers with a welcome or a reject. Up to `ship.max-batches-in-flight` batches are then in flight at
//! once, opened in sequence order. A failed connection is retried after an exponential backoff
//! with jitter ([`backoff`]) between `ship.backoff-min` and `ship.backoff-max`. TLS files and
//! the token are read again at every attempt, so an agent started before its aggregator (which
//! creates the development CA) connects once the files exist.

pub mod backoff;
mod metrics;
mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use smolder_common::wire::frame::{self, HEADER_LEN};
use smolder_common::wire::{
    Ack, FrameHeader, FrameKind, FrameLimits, Hello, Reject, Welcome, code,
};
use smolder_daemon::Heartbeat;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::spool::Spool;

use self::backoff::Backoff;
pub use self::metrics::ShipMetrics;

/// Where and how batches are shipped.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct ShipConfig {
    /// The aggregator's QUIC address, `host:port`. Default `127.0.0.1:4041`.
    pub aggregator: String,
    /// The name the aggregator's certificate must carry; empty means the host of
    /// `aggregator`. Default empty.
    pub server_name: String,
    /// PEM CA certificate(s) the aggregator's certificate must chain to. Default
    /// `./data/tls/ca.pem`: the development CA of an aggregator started in the same directory
    /// with its default data dir.
    pub ca: PathBuf,
    /// The token to present; empty means read `token-file`. Default empty.
    pub token: String,
    /// File holding the token, used when `token` is empty; a missing file is fine when a
    /// client certificate is configured. Default `./data/tls/agent-token`: the development
    /// token of an aggregator started in the same directory.
    pub token_file: PathBuf,
    /// PEM client certificate chain, for aggregators that authenticate agents by
    /// certificate (`ingest.quic.client-ca`). Default none.
    pub client_cert: Option<PathBuf>,
    /// PEM private key of `client-cert`. Default none.
    pub client_key: Option<PathBuf>,
    /// Batches sent and not yet answered at once, each on its own stream (the aggregator's
    /// `ingest.quic.max-batches-in-flight` bounds them too). Was `max-in-flight`, still read
    /// (deprecated). Default 4.
    #[serde(alias = "max-in-flight")]
    pub max_batches_in_flight: u32,
    /// First delay before reconnecting. Default `1s`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub backoff_min: Duration,
    /// Longest delay before reconnecting. Default `30s`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub backoff_max: Duration,
    /// How long a batch may wait for its ack before the connection is taken as broken.
    /// Default `30s`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub ack_timeout: Duration,
}

impl Default for ShipConfig {
    fn default() -> Self {
        ShipConfig {
            aggregator: "127.0.0.1:4041".to_owned(),
            server_name: String::new(),
            ca: PathBuf::from("./data/tls/ca.pem"),
            token: String::new(),
            token_file: PathBuf::from("./data/tls/agent-token"),
            client_cert: None,
            client_key: None,
            max_batches_in_flight: 4,
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            ack_timeout: Duration::from_secs(30),
        }
    }
}

impl ShipConfig {
    /// Checks that the files a connection reads can be used: `ca`, the client certificate and
    /// key if set, and the token file when there is no `token`. `check-config` runs it; the
    /// shipper itself reads them again at every attempt, waiting for files another process
    /// writes.
    ///
    /// # Errors
    ///
    /// [`ShipError::Tls`] or [`ShipError::Token`] naming the file and what is wrong with it.
    pub fn check_files(&self) -> Result<(), ShipError> {
        tls::client_config(self)?;
        token(self)?;
        Ok(())
    }
}

/// Why shipping failed; every variant is retried after a backoff.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShipError {
    /// A TLS file (`ship.ca`, `client-cert`, `client-key`) is missing or invalid.
    #[error("TLS setup: {reason}")]
    Tls {
        /// The file and what is wrong.
        reason: String,
    },
    /// `ship.token-file` cannot be read and no token or client certificate is configured.
    #[error("cannot read the token file {path} (ship.token-file)")]
    Token {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// `ship.aggregator` does not resolve.
    #[error("cannot resolve {address} (ship.aggregator): {reason}")]
    Resolve {
        /// The address.
        address: String,
        /// What the resolver said.
        reason: String,
    },
    /// The QUIC or TLS handshake failed (unreachable, wrong CA, refused client certificate).
    #[error("cannot connect to {address}: {reason}")]
    Connect {
        /// The address.
        address: String,
        /// What quinn said.
        reason: String,
    },
    /// The aggregator refused the hello (credentials, protocol version).
    #[error("the aggregator refused this agent: {reason}")]
    Refused {
        /// Its reason.
        reason: String,
    },
    /// The aggregator answered something this protocol does not allow there.
    #[error("protocol error: {reason}")]
    Protocol {
        /// What was wrong.
        reason: String,
    },
    /// The connection broke.
    #[error("connection lost: {reason}")]
    Connection {
        /// What quinn said.
        reason: String,
    },
    /// No answer within `ship.ack-timeout` (or the hello's 10 s).
    #[error("no answer to the {what} within {} s", .after.as_secs())]
    Timeout {
        /// `hello` or `batch`.
        what: &'static str,
        /// The timeout.
        after: Duration,
    },
    /// The spool failed.
    #[error("spool: {0}")]
    Spool(#[from] crate::spool::SpoolError),
}

impl ShipError {
    /// Every [`kind`](Self::kind), for the metrics.
    pub const KINDS: [&'static str; 9] = [
        "tls",
        "token",
        "resolve",
        "connect",
        "refused",
        "protocol",
        "connection",
        "timeout",
        "spool",
    ];

    /// A bounded name for the variant: the `error_type` of
    /// `smolder_agent_errors_total{stage="ship"}`.
    pub fn kind(&self) -> &'static str {
        match self {
            ShipError::Tls { .. } => "tls",
            ShipError::Token { .. } => "token",
            ShipError::Resolve { .. } => "resolve",
            ShipError::Connect { .. } => "connect",
            ShipError::Refused { .. } => "refused",
            ShipError::Protocol { .. } => "protocol",
            ShipError::Connection { .. } => "connection",
            ShipError::Timeout { .. } => "timeout",
            ShipError::Spool(_) => "spool",
        }
    }
}

/// How long the aggregator has to answer a hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Keep-alives on an idle connection, well inside both sides' idle timeouts.
const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// How long a connection may be silent before it is taken as lost. An aggregator that died
/// cannot say so (a restarted one does not know the old connection), so this is how long a
/// crash goes unnoticed when no batch is in flight.
const IDLE_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a stopping agent keeps shipping what it spooled last: long enough for a window's
/// batch and its fsync on a healthy link, short enough for systemd's stop timeout.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The aggregator's answer to a batch.
enum Answer {
    Ack(Ack),
    Reject(Reject),
}

/// Ships until `stop` turns true; then, if connected, goes on for up to 5 s to deliver what is
/// still waiting (the windows spooled as the agent stopped), and closes the connection. What is
/// not acknowledged by then stays in the spool for the next start.
///
/// Beats `heartbeat` while it waits for batches, connects and sends (each wait bounded by the
/// QUIC timeouts and `ship.ack-timeout`); without an aggregator it is degraded, never stuck.
pub async fn run(
    config: ShipConfig,
    spool: Spool,
    hostname: String,
    metrics: ShipMetrics,
    stop: watch::Receiver<bool>,
    heartbeat: Heartbeat,
) {
    let span = info_span!("ship", aggregator = %config.aggregator);
    async move {
        let mut stop = Stop::new(stop);
        let mut backoff = Backoff::new(config.backoff_min, config.backoff_max);
        let mut endpoint: Option<quinn::Endpoint> = None;
        loop {
            heartbeat.alive();
            if !spool.has_waiting() {
                if stop.requested() {
                    return;
                }
                heartbeat
                    .beating(async {
                        tokio::select! {
                            () = spool.waiting() => {}
                            () = stop.changed() => {}
                        }
                    })
                    .await;
                continue;
            }
            let connected = heartbeat
                .beating(async {
                    tokio::select! {
                        connected = connect(&config, &mut endpoint, &spool, &hostname) => Some(connected),
                        () = stop.grace_over() => None,
                    }
                })
                .await;
            let Some(connected) = connected else { return };
            match connected {
                Ok(conn) => {
                    backoff.reset();
                    heartbeat.beat();
                    metrics.connected.set(1);
                    let drained = heartbeat
                        .beating(drain(&conn, &config, &spool, &metrics, &mut stop, &mut backoff))
                        .await;
                    metrics.connected.set(0);
                    spool.retry_all();
                    match drained {
                        Ok(()) => {
                            conn.close(code::AGENT_SHUTDOWN.into(), b"agent shutting down");
                            if let Some(endpoint) = &endpoint {
                                let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
                            }
                            return;
                        }
                        Err(err) => {
                            metrics.tier.error(err.kind());
                            heartbeat.degraded(format_args!("lost the aggregator: {err}"));
                            warn!(error = %err, "lost the aggregator; reconnecting");
                        }
                    }
                }
                Err(err @ ShipError::Refused { .. }) => {
                    metrics.tier.error(err.kind());
                    heartbeat.degraded(format_args!("refused by the aggregator: {err}"));
                    error!(error = %err, "the aggregator refused this agent; check ship.token, ship.token-file or the client certificate");
                }
                Err(err) => {
                    metrics.tier.error(err.kind());
                    heartbeat.degraded(format_args!("cannot reach the aggregator: {err}"));
                    warn!(error = %err, "cannot reach the aggregator; batches stay in the spool");
                }
            }
            if stop.requested() {
                // The grace period is for a link that works; this one just failed.
                return;
            }
            metrics.reconnects.inc();
            let delay = backoff.next(rand::random());
            debug!(delay_ms = delay.as_millis() as u64, "reconnecting after a backoff");
            let over = heartbeat
                .beating(async {
                    tokio::select! {
                        () = tokio::time::sleep(delay) => false,
                        () = stop.grace_over() => true,
                    }
                })
                .await;
            if over {
                return;
            }
        }
    }
    .instrument(span)
    .await;
}

/// The stop request and the grace period it starts.
struct Stop {
    rx: watch::Receiver<bool>,
    deadline: Option<tokio::time::Instant>,
}

impl Stop {
    fn new(rx: watch::Receiver<bool>) -> Stop {
        Stop { rx, deadline: None }
    }

    /// Whether stop was asked; the first time it is seen, the grace period starts.
    fn requested(&mut self) -> bool {
        if self.deadline.is_none() && *self.rx.borrow() {
            self.deadline = Some(tokio::time::Instant::now() + SHUTDOWN_GRACE);
        }
        self.deadline.is_some()
    }

    /// Whether the grace period is over.
    fn expired(&self) -> bool {
        self.deadline
            .is_some_and(|deadline| tokio::time::Instant::now() >= deadline)
    }

    /// Resolves when stop is asked (starting the grace period; a sender gone counts as a
    /// request), and after that when the grace period ends.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the state changes only after the awaited event.
    async fn changed(&mut self) {
        match self.deadline {
            None => {
                let _ = self.rx.wait_for(|stop| *stop).await;
                self.deadline = Some(tokio::time::Instant::now() + SHUTDOWN_GRACE);
            }
            Some(deadline) => tokio::time::sleep_until(deadline).await,
        }
    }

    /// Resolves when the grace period after a stop request is over.
    async fn grace_over(&mut self) {
        while !self.expired() {
            self.changed().await;
        }
    }
}

/// Connects and says hello.
async fn connect(
    config: &ShipConfig,
    endpoint: &mut Option<quinn::Endpoint>,
    spool: &Spool,
    hostname: &str,
) -> Result<quinn::Connection, ShipError> {
    let mut client = tls::client_config(config)?;
    let token = token(config)?;
    let addr = resolve(&config.aggregator).await?;
    let mut transport = quinn::TransportConfig::default();
    transport
        .keep_alive_interval(Some(KEEP_ALIVE))
        .max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(IDLE_TIMEOUT).expect("15 s is a valid idle timeout"),
        ));
    client.transport_config(Arc::new(transport));
    let connect_error = |reason: String| ShipError::Connect {
        address: config.aggregator.clone(),
        reason,
    };
    let endpoint = match endpoint {
        Some(endpoint) => endpoint.clone(),
        None => {
            let bind: SocketAddr = if addr.is_ipv6() {
                "[::]:0".parse().expect("a valid address")
            } else {
                "0.0.0.0:0".parse().expect("a valid address")
            };
            let created = quinn::Endpoint::client(bind)
                .map_err(|err| connect_error(format!("binding a UDP socket: {err}")))?;
            endpoint.insert(created).clone()
        }
    };
    let conn = endpoint
        .connect_with(client, addr, &server_name(config))
        .map_err(|err| connect_error(err.to_string()))?
        .await
        .map_err(|err| connect_error(err.to_string()))?;

    let hello = Hello {
        agent_id: spool.agent_id().to_owned(),
        hostname: hostname.to_owned(),
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        token,
    };
    let exchange = async {
        let (mut send, mut recv) = conn.open_bi().await.map_err(lost)?;
        send.write_all(&frame::encode(FrameKind::Hello, &hello))
            .await
            .map_err(lost)?;
        let _ = send.finish();
        let bytes = recv
            .read_to_end(FrameLimits::CONTROL.max_compressed as usize + HEADER_LEN)
            .await
            .map_err(lost)?;
        let (header, body) = parse_control(&bytes)?;
        match header.kind {
            FrameKind::Welcome => {
                let welcome: Welcome = header.decode(body).map_err(protocol)?;
                Ok(welcome)
            }
            FrameKind::Reject => {
                let reject: Reject = header.decode(body).map_err(protocol)?;
                Err(ShipError::Refused {
                    reason: reject.reason,
                })
            }
            other => Err(ShipError::Protocol {
                reason: format!("expected a welcome, got a {} frame", other.as_str()),
            }),
        }
    };
    let answer = match tokio::time::timeout(HELLO_TIMEOUT, exchange).await {
        Ok(answer) => answer,
        Err(_) => Err(ShipError::Timeout {
            what: "hello",
            after: HELLO_TIMEOUT,
        }),
    };
    // A refusal may arrive as the connection's close rather than on the stream.
    let answer = match (answer, conn.close_reason()) {
        (
            Err(ShipError::Connection { .. }),
            Some(quinn::ConnectionError::ApplicationClosed(close)),
        ) if close.error_code == code::REFUSED.into() => Err(ShipError::Refused {
            reason: String::from_utf8_lossy(&close.reason).into_owned(),
        }),
        (answer, _) => answer,
    };
    match answer {
        Ok(welcome) => {
            info!(
                %addr,
                aggregator_version = %welcome.aggregator_version,
                max_batch_bytes = welcome.max_batch_bytes,
                agent_id = %spool.agent_id(),
                "connected to the aggregator"
            );
            Ok(conn)
        }
        Err(err) => {
            conn.close(code::AGENT_SHUTDOWN.into(), b"hello failed");
            Err(err)
        }
    }
}

fn lost(err: impl std::fmt::Display) -> ShipError {
    ShipError::Connection {
        reason: err.to_string(),
    }
}

fn protocol(err: impl std::fmt::Display) -> ShipError {
    ShipError::Protocol {
        reason: err.to_string(),
    }
}

/// Parses a whole control frame (welcome, ack, reject) held in memory.
fn parse_control(bytes: &[u8]) -> Result<(FrameHeader, &[u8]), ShipError> {
    let (header, body) = frame::split_header(bytes).map_err(protocol)?;
    let header = FrameHeader::parse(header, FrameLimits::CONTROL).map_err(protocol)?;
    Ok((header, body))
}

/// The token to present: `ship.token`, else `ship.token-file`'s content.
fn token(config: &ShipConfig) -> Result<String, ShipError> {
    if !config.token.is_empty() {
        return Ok(config.token.clone());
    }
    match std::fs::read_to_string(&config.token_file) {
        Ok(token) => Ok(token.trim().to_owned()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound && config.client_cert.is_some() => {
            Ok(String::new())
        }
        Err(source) => Err(ShipError::Token {
            path: config.token_file.clone(),
            source,
        }),
    }
}

/// The first address `ship.aggregator` resolves to.
async fn resolve(address: &str) -> Result<SocketAddr, ShipError> {
    let resolve_error = |reason: String| ShipError::Resolve {
        address: address.to_owned(),
        reason,
    };
    tokio::net::lookup_host(address)
        .await
        .map_err(|err| resolve_error(err.to_string()))?
        .next()
        .ok_or_else(|| resolve_error("no addresses".to_owned()))
}

/// `ship.server-name`, or the host part of `ship.aggregator`.
fn server_name(config: &ShipConfig) -> String {
    if !config.server_name.is_empty() {
        return config.server_name.clone();
    }
    let host = config
        .aggregator
        .rsplit_once(':')
        .map_or(config.aggregator.as_str(), |(host, _)| host);
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned()
}

/// Sends batches on `conn` until it breaks (an error) or `stop` (Ok).
async fn drain(
    conn: &quinn::Connection,
    config: &ShipConfig,
    spool: &Spool,
    metrics: &ShipMetrics,
    stop: &mut Stop,
    backoff: &mut Backoff,
) -> Result<(), ShipError> {
    let max = config.max_batches_in_flight.max(1) as usize;
    let mut in_flight: JoinSet<(u64, Result<Answer, ShipError>)> = JoinSet::new();
    let mut paused_until: Option<tokio::time::Instant> = None;
    loop {
        // Once stop is asked, the last windows (spooled as the agent stopped) still go out if
        // they can within the grace period.
        if stop.requested() && in_flight.is_empty() && !spool.has_waiting() {
            return Ok(());
        }
        if stop.expired() {
            warn!(
                grace_s = SHUTDOWN_GRACE.as_secs(),
                "stopping with batches unacknowledged; they stay in the spool for the next start"
            );
            return Ok(());
        }
        if paused_until.is_none() {
            while in_flight.len() < max {
                let Some((sequence, frame)) = spool.next()? else {
                    break;
                };
                in_flight.spawn(send_batch(
                    conn.clone(),
                    sequence,
                    frame,
                    config.ack_timeout,
                    metrics.clone(),
                ));
            }
        }
        metrics.rtt.set(conn.rtt().as_secs_f64());
        let pause = async {
            match paused_until {
                Some(until) => tokio::time::sleep_until(until).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(joined) = in_flight.join_next() => {
                let (sequence, answer) = match joined {
                    Ok(done) => done,
                    Err(err) => return Err(ShipError::Protocol { reason: format!("a send task failed: {err}") }),
                };
                match answer {
                    Ok(Answer::Ack(ack)) => {
                        spool.acked(sequence)?;
                        metrics.batches_acked.inc();
                        backoff.reset();
                        debug!(sequence, duplicate = ack.duplicate, "batch acknowledged");
                    }
                    Ok(Answer::Reject(reject)) if reject.retryable => {
                        spool.retry(sequence);
                        metrics.batches_rejected.with_label_values(&["true"]).inc();
                        let delay = backoff.next(rand::random());
                        paused_until = Some(tokio::time::Instant::now() + delay);
                        info!(sequence, reason = %reject.reason, delay_ms = delay.as_millis() as u64, "batch refused for now; pausing");
                    }
                    Ok(Answer::Reject(reject)) => {
                        spool.reject(sequence)?;
                        metrics.batches_rejected.with_label_values(&["false"]).inc();
                        error!(sequence, reason = %reject.reason, "the aggregator rejected a batch; it is dropped");
                    }
                    Err(err) => {
                        spool.retry(sequence);
                        metrics.batches_failed.inc();
                        return Err(err);
                    }
                }
            }
            () = spool.waiting(), if in_flight.len() < max && paused_until.is_none() => {}
            () = pause => paused_until = None,
            reason = conn.closed() => return Err(lost(reason)),
            () = stop.changed() => {}
        }
    }
}

/// Sends one batch on its own stream and reads the answer.
async fn send_batch(
    conn: quinn::Connection,
    sequence: u64,
    frame: Vec<u8>,
    timeout: Duration,
    metrics: ShipMetrics,
) -> (u64, Result<Answer, ShipError>) {
    let started = Instant::now();
    let exchange = async {
        let (mut send, mut recv) = conn.open_bi().await.map_err(lost)?;
        metrics.batches_sent.inc();
        metrics.bytes_sent.inc_by(frame.len() as u64);
        // An aggregator that refuses a batch early stops the stream while it is written; its
        // answer still follows on the other direction.
        if send.write_all(&frame).await.is_ok() {
            let _ = send.finish();
        }
        let bytes = recv
            .read_to_end(FrameLimits::CONTROL.max_compressed as usize + HEADER_LEN)
            .await
            .map_err(lost)?;
        let (header, body) = parse_control(&bytes)?;
        match header.kind {
            FrameKind::Ack => {
                let ack: Ack = header.decode(body).map_err(protocol)?;
                if ack.sequence != sequence {
                    return Err(ShipError::Protocol {
                        reason: format!(
                            "ack for batch {} on the stream of batch {sequence}",
                            ack.sequence
                        ),
                    });
                }
                Ok(Answer::Ack(ack))
            }
            FrameKind::Reject => Ok(Answer::Reject(header.decode(body).map_err(protocol)?)),
            other => Err(ShipError::Protocol {
                reason: format!("expected an ack, got a {} frame", other.as_str()),
            }),
        }
    };
    let answer = tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or(Err(ShipError::Timeout {
            what: "batch",
            after: timeout,
        }));
    if matches!(answer, Ok(Answer::Ack(_))) {
        metrics
            .ack_duration
            .observe(started.elapsed().as_secs_f64());
    }
    (sequence, answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_name_defaults_to_the_host() {
        let mut config = ShipConfig::default();
        assert_eq!(server_name(&config), "127.0.0.1");
        config.aggregator = "[::1]:4041".to_owned();
        assert_eq!(server_name(&config), "::1");
        config.aggregator = "agg.example:4041".to_owned();
        assert_eq!(server_name(&config), "agg.example");
        config.server_name = "other".to_owned();
        assert_eq!(server_name(&config), "other");
    }

    #[test]
    fn every_error_kind_is_listed_for_the_metrics() {
        let text = || "x".to_owned();
        let errors = [
            ShipError::Tls { reason: text() },
            ShipError::Token {
                path: PathBuf::from("token"),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            },
            ShipError::Resolve {
                address: text(),
                reason: text(),
            },
            ShipError::Connect {
                address: text(),
                reason: text(),
            },
            ShipError::Refused { reason: text() },
            ShipError::Protocol { reason: text() },
            ShipError::Connection { reason: text() },
            ShipError::Timeout {
                what: "batch",
                after: Duration::from_secs(1),
            },
            ShipError::Spool(crate::spool::SpoolError::Corrupt {
                key: text(),
                reason: "x",
            }),
        ];
        let kinds: Vec<&str> = errors.iter().map(ShipError::kind).collect();
        assert_eq!(kinds, ShipError::KINDS);
    }
}
