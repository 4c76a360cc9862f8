//! Ship: drains the spool to the aggregator over QUIC, oldest batch first.
//!
//! Input: batch frames from the [`Spool`]. Output: QUIC streams to an aggregator
//! (`ship.aggregators`, or the one `ship.aggregator`, default `127.0.0.1:4041`), one per batch,
//! and each batch's fate reported
//! back to the spool: deleted on its ack, sent again after a lost connection or a retryable
//! reject, split on a reject for its size, dropped (and counted) on a reject that a retry
//! cannot fix. Caller: `app::start`. Owns one task ([`run`]), one UDP socket and at most one
//! connection.
//!
//! A connection starts with a hello (agent id, hostname, version, token) that the aggregator
//! answers with a welcome or a reject. The welcome's limits ([`BatchLimits`]) go to the spool,
//! which splits the windows it spools from then on to them; its clock gives this host's offset
//! (`smolder_agent_ship_clock_offset_seconds`). Up to `ship.max-batches-in-flight` batches are
//! then in flight at once, opened in sequence order. An ack may name series the aggregator
//! refused one by one (over its limits, its tenant's series limit, too old): they are counted in
//! `smolder_agent_dropped_series_total{stage="ship",reason}`, and the rest is stored. A batch
//! refused because this host's clock is ahead of the aggregator's (`clock_skew`) waits and is
//! sent again, like any retryable reject: the agent never rewrites the times it measured, and
//! says loudly that its clock is off. A failed connection is retried after an exponential
//! backoff with jitter ([`backoff`]) between `ship.backoff-min` and `ship.backoff-max`.
//!
//! With several aggregators (a list, or a name with several DNS records) the agent starts at the
//! address its agent id picks, so that a fleet spreads over them, and fails over ([`rotation`]):
//! a connection that cannot be made or is lost, or a batch refused as `unavailable` (the
//! aggregator cannot store now: its bucket does not take writes), moves it to the next address
//! at once; it backs off only after every address failed with nothing stored in between. The
//! spool keeps every unacknowledged batch meanwhile, and sends it to the next aggregator (which
//! drops a copy that the last one stored, by agent id and sequence, in object-storage mode). TLS
//! files and the token are read again at every attempt, so an agent started before its
//! aggregator (which creates the development CA) connects once the files exist.
//!
//! [`connect`] (TLS, hello, welcome) and [`send_batch`] (one batch's stream and its answer) are
//! public so that `smolder-fleet`, the load generator of the fleet benchmark and soak tests,
//! speaks the protocol with this code rather than a copy of it.

pub mod backoff;
mod metrics;
pub mod rotation;
mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use smolder_common::wire::frame::{self, HEADER_LEN};
use smolder_common::wire::{
    Ack, BatchLimits, FrameHeader, FrameKind, FrameLimits, Hello, RefusalTally, Reject,
    SeriesRefusal, Welcome, code, limits, reject,
};
use smolder_daemon::Heartbeat;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::spool::Spool;

use self::backoff::Backoff;
pub use self::metrics::ShipMetrics;
use self::rotation::{Next, Rotation, Target};

/// Where and how batches are shipped.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct ShipConfig {
    /// The aggregator's QUIC address, `host:port`, when there is one; `aggregators` lists
    /// several. Default `127.0.0.1:4041`.
    pub aggregator: String,
    /// Several aggregators' QUIC addresses, `host:port` each (a name with several DNS records
    /// counts as each of them): the agent starts at the one its agent id picks and fails over
    /// to the next. When set, `aggregator` must be left at its default. Default none.
    pub aggregators: Vec<String>,
    /// The name the aggregator's certificate must carry; empty means the host of the address
    /// connected to. Default empty.
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
            aggregators: Vec::new(),
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
    /// The addresses to ship to, as configured: `aggregators`, else `aggregator`.
    pub fn addresses(&self) -> Vec<String> {
        if self.aggregators.is_empty() {
            vec![self.aggregator.clone()]
        } else {
            self.aggregators.clone()
        }
    }

    /// Checks the addresses: `host:port` each, and not both `aggregator` (changed from its
    /// default) and `aggregators`.
    ///
    /// # Errors
    ///
    /// Naming the key and the address at fault.
    pub fn validate(&self) -> Result<(), String> {
        if !self.aggregators.is_empty() && self.aggregator != ShipConfig::default().aggregator {
            return Err(format!(
                "ship.aggregator ({}) and ship.aggregators are both set: list every address in ship.aggregators and remove ship.aggregator",
                self.aggregator
            ));
        }
        let key = if self.aggregators.is_empty() {
            "ship.aggregator"
        } else {
            "ship.aggregators"
        };
        for address in self.addresses() {
            let port = address
                .rsplit_once(':')
                .map(|(host, port)| (host, port.parse::<u16>()));
            if !matches!(port, Some((host, Ok(_))) if !host.is_empty()) {
                return Err(format!("{key}: {address:?} is not host:port"));
            }
        }
        Ok(())
    }

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
    /// No address of `ship.aggregator` or `ship.aggregators` resolves.
    #[error("cannot resolve {address} (ship.aggregators): {reason}")]
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
    /// The aggregator refused a batch as `unavailable`: it cannot store now (its object store
    /// does not take writes). With other aggregators configured, the agent moves to the next.
    #[error("{address} cannot store now: {reason}")]
    Unavailable {
        /// The aggregator's address.
        address: SocketAddr,
        /// Its reason.
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
    pub const KINDS: [&'static str; 10] = [
        "tls",
        "token",
        "resolve",
        "connect",
        "refused",
        "protocol",
        "connection",
        "unavailable",
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
            ShipError::Unavailable { .. } => "unavailable",
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
#[derive(Debug)]
pub enum Answer {
    /// Stored durably (or stored before: a resend).
    Ack(Ack),
    /// Refused, saying why and whether a retry can help.
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
    let addresses = config.addresses();
    let span = info_span!("ship", aggregators = %addresses.join(","));
    async move {
        let mut stop = Stop::new(stop);
        let mut backoff = Backoff::new(config.backoff_min, config.backoff_max);
        let mut endpoint: Option<quinn::Endpoint> = None;
        let mut rotation = Rotation::new(spool.agent_id());
        let mut shown: Option<SocketAddr> = None;
        let mut resolve_again = true;
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
            if resolve_again {
                let resolved = heartbeat
                    .beating(async {
                        tokio::select! {
                            resolved = resolve_all(&addresses) => Some(resolved),
                            () = stop.grace_over() => None,
                        }
                    })
                    .await;
                let Some(resolved) = resolved else { return };
                match resolved {
                    Ok(targets) => {
                        rotation.update(targets);
                        resolve_again = false;
                    }
                    Err(err) => {
                        metrics.tier.error(err.kind());
                        heartbeat.degraded(format_args!("cannot reach an aggregator: {err}"));
                        warn!(error = %err, "cannot resolve the aggregators; batches stay in the spool");
                        if stop.requested() {
                            return;
                        }
                        metrics.reconnects.inc();
                        if !pause(&mut backoff, &mut stop, &heartbeat).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            let target = rotation
                .current()
                .expect("resolve_all returns at least one address")
                .clone();
            metrics.show_current(&mut shown, target.addr);
            let attempt = attempt(
                &config,
                &target,
                &mut endpoint,
                &spool,
                &hostname,
                &metrics,
                &mut stop,
                &mut backoff,
                &mut rotation,
                &heartbeat,
            );
            let reason = match attempt.await {
                Attempt::Stopped => return,
                Attempt::Failed(reason) => reason,
            };
            let next = rotation.failed();
            if let Some(to) = rotation.current()
                && to.addr != target.addr
            {
                metrics.failovers.with_label_values(&[reason]).inc();
                info!(from = %target.addr, to = %to.addr, reason, "moving to the next aggregator");
            }
            if stop.requested() {
                // The grace period is for a link that works; this one just failed.
                return;
            }
            metrics.reconnects.inc();
            if next == Next::Now {
                continue;
            }
            // Every address failed in turn: wait, and resolve the list again (DNS may have
            // changed) before the next pass.
            resolve_again = true;
            if !pause(&mut backoff, &mut stop, &heartbeat).await {
                return;
            }
        }
    }
    .instrument(span)
    .await;
}

/// Waits the backoff's next delay; false when the grace period after a stop request ends first.
async fn pause(backoff: &mut Backoff, stop: &mut Stop, heartbeat: &Heartbeat) -> bool {
    let delay = backoff.next(rand::random());
    debug!(
        delay_ms = delay.as_millis() as u64,
        "reconnecting after a backoff"
    );
    heartbeat
        .beating(async {
            tokio::select! {
                () = tokio::time::sleep(delay) => true,
                () = stop.grace_over() => false,
            }
        })
        .await
}

/// How one attempt at an aggregator ended.
enum Attempt {
    /// Stop was asked and the spool drained, or the grace period is over.
    Stopped,
    /// The attempt failed, for the `reason` of `smolder_agent_ship_failovers_total`.
    Failed(&'static str),
}

/// Connects to `target` and ships until the connection fails or stop is asked, logging and
/// counting a failure once.
#[allow(
    clippy::too_many_arguments,
    reason = "the shipper's state, borrowed for one attempt"
)]
async fn attempt(
    config: &ShipConfig,
    target: &Target,
    endpoint: &mut Option<quinn::Endpoint>,
    spool: &Spool,
    hostname: &str,
    metrics: &ShipMetrics,
    stop: &mut Stop,
    backoff: &mut Backoff,
    rotation: &mut Rotation,
    heartbeat: &Heartbeat,
) -> Attempt {
    let addr = target.addr;
    let connected = heartbeat
        .beating(async {
            tokio::select! {
                connected = connect_to(config, target, endpoint, spool.agent_id(), hostname, metrics) => Some(connected),
                () = stop.grace_over() => None,
            }
        })
        .await;
    let Some(connected) = connected else {
        return Attempt::Stopped;
    };
    let (conn, limits) = match connected {
        Ok(connected) => connected,
        Err(err @ ShipError::Refused { .. }) => {
            metrics.tier.error(err.kind());
            heartbeat.degraded(format_args!("refused by the aggregator {addr}: {err}"));
            error!(%addr, error = %err, "the aggregator refused this agent; check ship.token, ship.token-file or the client certificate");
            return Attempt::Failed("refused");
        }
        Err(err) => {
            metrics.tier.error(err.kind());
            heartbeat.degraded(format_args!("cannot reach the aggregator {addr}: {err}"));
            warn!(%addr, error = %err, "cannot reach the aggregator; batches stay in the spool");
            return Attempt::Failed("connect");
        }
    };
    if let Err(err) = spool.set_limits(limits).await {
        // They apply to this run all the same.
        warn!(error = %err, "storing the aggregator's limits failed");
    }
    heartbeat.beat();
    metrics.connected.set(1);
    let failover = rotation.len() > 1;
    let drained = heartbeat
        .beating(drain(
            &conn, addr, config, spool, metrics, stop, backoff, rotation, failover, heartbeat,
        ))
        .await;
    metrics.connected.set(0);
    spool.retry_all();
    match drained {
        Ok(()) => {
            conn.close(code::AGENT_SHUTDOWN.into(), b"agent shutting down");
            if let Some(endpoint) = endpoint {
                let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
            }
            Attempt::Stopped
        }
        Err(err @ ShipError::Unavailable { .. }) => {
            conn.close(code::AGENT_FAILOVER.into(), b"moving to another aggregator");
            metrics.tier.error(err.kind());
            heartbeat.degraded(format_args!("{err}"));
            warn!(error = %err, "the aggregator cannot store now; moving to the next");
            Attempt::Failed("unavailable")
        }
        Err(err) => {
            metrics.tier.error(err.kind());
            heartbeat.degraded(format_args!("lost the aggregator {addr}: {err}"));
            warn!(%addr, error = %err, "lost the aggregator; reconnecting");
            Attempt::Failed("lost")
        }
    }
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

/// Connects to the first address of `ship.aggregators` (or `ship.aggregator`) from `endpoint`
/// (a client endpoint on an ephemeral UDP port, created on the first call) and says hello as
/// `agent_id` on `hostname`, reading the TLS files and the token again; records the clock offset
/// the welcome shows in `metrics` and returns the connection with the welcome's limits, which
/// the batches sent on it must keep to. The shipper itself goes round every address
/// ([`rotation`]).
///
/// # Cancel safety
///
/// Cancel safe: a connection not yet welcomed is dropped, which closes it.
///
/// # Errors
///
/// [`ShipError::Refused`] when the aggregator refuses the hello; any other variant when the
/// files, the address, the handshake or the hello exchange fail. All are worth a retry after a
/// backoff.
pub async fn connect(
    config: &ShipConfig,
    endpoint: &mut Option<quinn::Endpoint>,
    agent_id: &str,
    hostname: &str,
    metrics: &ShipMetrics,
) -> Result<(quinn::Connection, BatchLimits), ShipError> {
    let entry = config.addresses().swap_remove(0);
    let addr = resolve(&entry)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| ShipError::Resolve {
            address: entry.clone(),
            reason: "no addresses".to_owned(),
        })?;
    connect_to(
        config,
        &Target { entry, addr },
        endpoint,
        agent_id,
        hostname,
        metrics,
    )
    .await
}

/// [`connect`] to `target`.
async fn connect_to(
    config: &ShipConfig,
    target: &Target,
    endpoint: &mut Option<quinn::Endpoint>,
    agent_id: &str,
    hostname: &str,
    metrics: &ShipMetrics,
) -> Result<(quinn::Connection, BatchLimits), ShipError> {
    let mut client = tls::client_config(config)?;
    let token = token(config)?;
    let addr = target.addr;
    let mut transport = quinn::TransportConfig::default();
    transport
        .keep_alive_interval(Some(KEEP_ALIVE))
        .max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(IDLE_TIMEOUT).expect("15 s is a valid idle timeout"),
        ));
    client.transport_config(Arc::new(transport));
    let connect_error = |reason: String| ShipError::Connect {
        address: addr.to_string(),
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
        .connect_with(client, addr, &server_name(config, &target.entry))
        .map_err(|err| connect_error(err.to_string()))?
        .await
        .map_err(|err| connect_error(err.to_string()))?;

    let hello = Hello {
        agent_id: agent_id.to_owned(),
        hostname: hostname.to_owned(),
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        token,
    };
    let exchange = async {
        let (mut send, mut recv) = conn.open_bi().await.map_err(lost)?;
        let sent = SystemTime::now();
        send.write_all(&frame::encode(FrameKind::Hello, &hello))
            .await
            .map_err(lost)?;
        let _ = send.finish();
        let bytes = read_answer(&mut recv).await?;
        let (header, body) = parse_control(&bytes)?;
        match header.kind {
            FrameKind::Welcome => {
                let welcome: Welcome = header.decode(body).map_err(protocol)?;
                Ok((welcome, sent, SystemTime::now()))
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
        Ok((welcome, sent, received)) => {
            let limits = BatchLimits::from_welcome(&welcome);
            info!(
                %addr,
                aggregator_version = %welcome.aggregator_version,
                max_batch_bytes = limits.max_batch_bytes,
                max_series_per_batch = limits.max_series,
                %agent_id,
                "connected to the aggregator"
            );
            if let Some(offset) = clock_offset(&welcome, sent, received) {
                metrics.clock_offset.set(offset);
                let skew = f64::from(welcome.max_clock_skew_seconds);
                // Offset is the aggregator's clock minus this host's: negative when this host
                // is ahead, which is what the aggregator refuses.
                if skew > 0.0 && -offset > skew / 2.0 {
                    error!(
                        offset_s = offset,
                        max_skew_s = skew,
                        "this host's clock is ahead of the aggregator's; batches more than max_skew_s ahead are refused and wait in the spool until their time comes: fix the clock (NTP)"
                    );
                } else if offset.abs() > 1.0 {
                    warn!(
                        offset_s = offset,
                        "this host's clock differs from the aggregator's"
                    );
                }
            }
            Ok((conn, limits))
        }
        Err(err) => {
            conn.close(code::AGENT_SHUTDOWN.into(), b"hello failed");
            Err(err)
        }
    }
}

/// The aggregator's clock minus this host's, in seconds, from a welcome received at `received`
/// for a hello sent at `sent`: the welcome's clock is taken at the middle of the exchange.
/// `None` from an aggregator that does not send its clock (v0.1).
fn clock_offset(welcome: &Welcome, sent: SystemTime, received: SystemTime) -> Option<f64> {
    if welcome.clock_unix_nanos == 0 {
        return None;
    }
    let secs = |t: SystemTime| match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(before) => -before.duration().as_secs_f64(),
    };
    let middle = (secs(sent) + secs(received)) / 2.0;
    Some(welcome.clock_unix_nanos as f64 / 1e9 - middle)
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

/// Reads the aggregator's answer on a stream: at most one control frame's bytes.
async fn read_answer(recv: &mut quinn::RecvStream) -> Result<Vec<u8>, ShipError> {
    recv.read_to_end(FrameLimits::CONTROL.max_compressed as usize + HEADER_LEN)
        .await
        .map_err(lost)
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

/// Every address `entry` (`host:port`) resolves to.
async fn resolve(entry: &str) -> Result<Vec<SocketAddr>, ShipError> {
    let resolve_error = |reason: String| ShipError::Resolve {
        address: entry.to_owned(),
        reason,
    };
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(entry)
        .await
        .map_err(|err| resolve_error(err.to_string()))?
        .collect();
    if addrs.is_empty() {
        return Err(resolve_error("no addresses".to_owned()));
    }
    Ok(addrs)
}

/// Every address of every entry of `addresses`, in list order. An entry that does not resolve
/// is logged and left out of this pass.
///
/// # Errors
///
/// [`ShipError::Resolve`] (the last entry's) when none resolves.
async fn resolve_all(addresses: &[String]) -> Result<Vec<Target>, ShipError> {
    let mut targets = Vec::new();
    let mut last = None;
    for entry in addresses {
        match resolve(entry).await {
            Ok(addrs) => targets.extend(addrs.into_iter().map(|addr| Target {
                entry: entry.clone(),
                addr,
            })),
            Err(err) => {
                if addresses.len() > 1 {
                    warn!(error = %err, "an aggregator's address does not resolve; trying the others");
                }
                last = Some(err);
            }
        }
    }
    match last {
        Some(err) if targets.is_empty() => Err(err),
        _ => Ok(targets),
    }
}

/// `ship.server-name`, or the host part of `entry`.
fn server_name(config: &ShipConfig, entry: &str) -> String {
    if !config.server_name.is_empty() {
        return config.server_name.clone();
    }
    let host = entry.rsplit_once(':').map_or(entry, |(host, _)| host);
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned()
}

/// Sends batches on `conn` (to `addr`) until it breaks (an error) or `stop` (Ok). With
/// `failover` (other aggregators to go to), a batch refused as `unavailable` ends it too.
#[allow(
    clippy::too_many_arguments,
    reason = "the shipper's state, borrowed for one connection"
)]
async fn drain(
    conn: &quinn::Connection,
    addr: SocketAddr,
    config: &ShipConfig,
    spool: &Spool,
    metrics: &ShipMetrics,
    stop: &mut Stop,
    backoff: &mut Backoff,
    rotation: &mut Rotation,
    failover: bool,
    heartbeat: &Heartbeat,
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
                let Some((sequence, frame)) = spool.next().await? else {
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
                        metrics.batches_acked.inc();
                        spool.acked(sequence).await?;
                        backoff.reset();
                        rotation.stored();
                        heartbeat.beat();
                        count_refused(metrics, sequence, &ack.refused, &ack.unlisted);
                        debug!(sequence, duplicate = ack.duplicate, refused = ack.refused.len(), "batch acknowledged");
                    }
                    Ok(Answer::Reject(reject)) if reject.retryable && failover && reject.code == reject::UNAVAILABLE => {
                        spool.retry(sequence);
                        metrics.batches_rejected.with_label_values(&["true"]).inc();
                        return Err(ShipError::Unavailable { address: addr, reason: reject.reason });
                    }
                    Ok(Answer::Reject(reject)) if reject.retryable => {
                        spool.retry(sequence);
                        metrics.batches_rejected.with_label_values(&["true"]).inc();
                        let delay = backoff.next(rand::random());
                        paused_until = Some(tokio::time::Instant::now() + delay);
                        if reject.code == reject::CLOCK_SKEW {
                            heartbeat.degraded(format_args!(
                                "batches wait: this host's clock is ahead of the aggregator's ({})",
                                reject.reason
                            ));
                            warn!(sequence, reason = %reject.reason, delay_ms = delay.as_millis() as u64, "batch refused: this host's clock is ahead of the aggregator's; it waits in the spool (fix the clock)");
                        } else {
                            info!(sequence, reason = %reject.reason, delay_ms = delay.as_millis() as u64, "batch refused for now; pausing");
                        }
                    }
                    // A v0.1 aggregator says no code: a batch over the limit its welcome announced
                    // was refused for its size all the same, from its header, nothing of it read.
                    // `resplit` splits only such a batch, and drops any other as rejected.
                    Ok(Answer::Reject(reject)) if reject.code == reject::TOO_LARGE || reject.code.is_empty() => {
                        metrics.batches_rejected.with_label_values(&["false"]).inc();
                        match spool.resplit(sequence).await? {
                            0 => error!(sequence, reason = %reject.reason, "the aggregator rejected a batch; it is dropped"),
                            parts => warn!(sequence, parts, reason = %reject.reason, "the aggregator refused a batch as too large; split into parts within its limits"),
                        }
                    }
                    Ok(Answer::Reject(reject)) => {
                        spool.reject(sequence).await?;
                        metrics.batches_rejected.with_label_values(&["false"]).inc();
                        count_refused(metrics, sequence, &reject.refused, &reject.unlisted);
                        error!(sequence, reason = %reject.reason, code = %reject.code, "the aggregator rejected a batch; it is dropped");
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

/// Counts the series the aggregator refused in the answer to `sequence`, by reason (a code of a
/// newer aggregator as `other`), and logs the first.
fn count_refused(
    metrics: &ShipMetrics,
    sequence: u64,
    listed: &[SeriesRefusal],
    unlisted: &[RefusalTally],
) {
    let counts = limits::count_refusals(listed, unlisted);
    if counts.is_empty() {
        return;
    }
    let mut total = 0;
    for (reason, count) in counts {
        metrics.refused(reason, count);
        total += count;
    }
    let first = listed.first().map_or("", |r| r.message.as_str());
    warn!(sequence, refused = total, first = %first, "the aggregator refused series of a batch; the others are stored");
}

/// Sends one batch `frame` (as the spool holds it) on its own stream of `conn` and reads the
/// answer, counting the send in `metrics` and the ack's latency. Returns `sequence` with the
/// outcome, so that many can run in a `JoinSet`.
///
/// # Cancel safety
///
/// Cancel safe in that nothing is lost: a batch whose answer was not read is unacknowledged and
/// is sent again (the aggregator drops a copy it already stored).
///
/// # Errors
///
/// The outcome is an error when the stream breaks, the answer is not a valid ack or reject for
/// this batch, or none comes within `timeout` ([`ShipError::Timeout`]).
pub async fn send_batch(
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
        let bytes = read_answer(&mut recv).await?;
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
        assert_eq!(server_name(&config, "127.0.0.1:4041"), "127.0.0.1");
        assert_eq!(server_name(&config, "[::1]:4041"), "::1");
        assert_eq!(server_name(&config, "agg.example:4041"), "agg.example");
        config.server_name = "other".to_owned();
        assert_eq!(server_name(&config, "agg.example:4041"), "other");
    }

    #[test]
    fn the_list_replaces_the_one_address_and_both_set_is_an_error() {
        let mut config = ShipConfig::default();
        assert_eq!(config.addresses(), ["127.0.0.1:4041"]);
        config.aggregators = vec!["a:4041".to_owned(), "[::1]:4041".to_owned()];
        assert_eq!(config.addresses(), ["a:4041", "[::1]:4041"]);
        assert_eq!(config.validate(), Ok(()));
        config.aggregator = "b:4041".to_owned();
        let err = config.validate().unwrap_err();
        assert!(err.contains("both set"), "{err}");
        config.aggregator = ShipConfig::default().aggregator;
        config.aggregators.push("no-port".to_owned());
        let err = config.validate().unwrap_err();
        assert!(
            err.contains("ship.aggregators") && err.contains("no-port"),
            "{err}"
        );
        config.aggregators = Vec::new();
        config.aggregator = ":4041".to_owned();
        assert!(config.validate().unwrap_err().contains("ship.aggregator:"));
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
            ShipError::Unavailable {
                address: "127.0.0.1:1".parse().unwrap(),
                reason: text(),
            },
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

    #[test]
    fn the_clock_offset_is_taken_at_the_middle_of_the_hello() {
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        let welcome = |ms: i64| Welcome {
            clock_unix_nanos: ms * 1_000_000,
            ..Welcome::default()
        };
        let offset = clock_offset(&welcome(10_000), at(1_000), at(1_200)).unwrap();
        assert!((offset - 8.9).abs() < 1e-9, "{offset}");
        let offset = clock_offset(&welcome(500), at(1_000), at(1_000)).unwrap();
        assert!((offset + 0.5).abs() < 1e-9, "this host ahead: {offset}");
        assert_eq!(
            clock_offset(&Welcome::default(), at(1), at(2)),
            None,
            "v0.1"
        );
    }
}
