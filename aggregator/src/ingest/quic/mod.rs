//! QUIC ingest: agents' batches over authenticated QUIC, acknowledged once durable.
//!
//! Input: QUIC connections from agents speaking [`smolder_common::wire`]. Output: each
//! batch's profiles as a [`ProfileSet`](super::ProfileSet), through the same
//! [`Ingester`] as `POST /ingest` (same checks, rules, metrics and store write), with the
//! batch's (agent id, sequence) marker in the same atomic store write, so that a batch is
//! stored at most once across retries and restarts. Caller: `app::start`, which hands it the
//! `Ingester`, its config, the data directory, its metrics, the tier's errors and refused
//! counters, the credentials (`auth`) and the in-flight budget (`admission`), and nothing
//! else. Owns the UDP socket (`ingest.quic.listen`, default `0.0.0.0:4041`), one task per
//! connection (at most `ingest.quic.max-connections`; more are refused at once) and one per
//! batch stream, and, without a configured certificate, the development TLS identity in
//! `<data-dir>/tls/` ([`tls`]).
//!
//! A connection's first stream is the agent's hello: protocol version (in the frame header),
//! agent id, and a token (of an `auth` credential with scope `ingest`) unless the agent
//! presented a client certificate signed by `ingest.quic.client-ca`. Anything else is refused
//! with a reason on that stream and in the connection's close. The connection's batches are
//! stored for the tenant of its token's credential (`anonymous` without one, and for client
//! certificates): the agent names no tenant, so that it cannot pick another's. Each later
//! stream is one batch ([`connection`]): the token checked to be still in force (else the
//! connection is closed), its header checked against `ingest.quic.max-batch-bytes`, its sizes
//! taken from the in-flight budget and its tenant's ingest rate before the body is read (either
//! refused as retryable), the body decompressed and decoded on the blocking pool, and the
//! answer an ack after the store's fsync or a reject saying why and whether a retry can help.

mod connection;
mod metrics;
mod tls;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus::IntCounter;
use quinn::crypto::rustls::QuicServerConfig;
use serde::{Deserialize, Serialize};
use smolder_common::wire::code;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info_span, warn};

use super::Ingester;
use crate::admission::Admission;
use crate::auth::Auth;
use crate::identity::IdentityError;
use crate::metrics::{Errors, Refused};
use crate::tenant::{Tenant, TenantError};

pub(crate) use self::metrics::QuicMetrics;

/// The QUIC listener agents ship their batches to.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct QuicConfig {
    /// UDP address and port. Default `0.0.0.0:4041`.
    pub listen: SocketAddr,
    /// PEM certificate chain of the listener. With neither `cert` nor `key`, a development CA
    /// is generated into `<data-dir>/tls/` on first start (shared by the aggregators of one
    /// bucket in object-storage mode) and signs a server certificate for this host at every
    /// start (agents trust `<data-dir>/tls/ca.pem`). Default none.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`. Default none.
    pub key: Option<PathBuf>,
    /// PEM CA certificates; an agent presenting a client certificate signed by one of them is
    /// authenticated without a token. Default none.
    pub client_ca: Option<PathBuf>,
    /// Deprecated: tokens agents may present, read as `auth.credentials` with scope `ingest`
    /// for the `anonymous` tenant; move them there. With no credentials configured at all
    /// and no `client-ca`, a development token is generated into `<data-dir>/tls/agent-token`
    /// on first start (shared like the development CA). Default none.
    pub tokens: Vec<String>,
    /// Deprecated: tokens by the tenant their agents ship for (`{team-a: [token, ...]}`), read
    /// as `auth.credentials` with scope `ingest` and that tenant; move them there. Default
    /// none.
    pub tenant_tokens: BTreeMap<String, Vec<String>>,
    /// Agent connections open at once (handshakes included); past it a new one is refused at
    /// once, counted, and the agent retries later. Default 4096.
    pub max_connections: u32,
    /// Batches one connection may have in flight at once, each on its own stream; more wait for
    /// QUIC flow control. Told to agents in the welcome. Was `max-concurrent-streams`, still
    /// read (deprecated). Default 16.
    #[serde(alias = "max-concurrent-streams")]
    pub max_batches_in_flight: u32,
    /// Largest batch accepted, in bytes, both as sent and decompressed; a larger one is
    /// refused from its header. Default 64 MiB.
    pub max_batch_bytes: u32,
    /// Batches per second one connection may send, with bursts of as many; more are refused
    /// as retryable. 0 means no limit. Default 50.
    pub max_batches_per_second: u32,
    /// How long a connection may stay silent before it is closed (agents send keep-alives
    /// more often). Default `30s`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub idle_timeout: Duration,
}

impl QuicConfig {
    /// Checks the TLS files the section names (`cert` with `key`, `client-ca`), creating
    /// nothing; `check-config` runs it.
    ///
    /// # Errors
    ///
    /// When a file is missing, is not PEM of the right kind, or the key is not the
    /// certificate's.
    pub(crate) fn check_files(&self) -> anyhow::Result<()> {
        tls::check_files(self).context("checking the TLS files of ingest.quic")
    }

    /// Every token of the deprecated `tokens` and `tenant-tokens` with the tenant its agents
    /// ship for.
    ///
    /// # Errors
    ///
    /// [`QuicError::Tenant`] for a `tenant-tokens` key that is not a valid tenant id,
    /// [`QuicError::TokenTwice`] for a token given twice or empty.
    pub(crate) fn token_tenants(&self) -> Result<Vec<(String, Tenant)>, QuicError> {
        let mut out: Vec<(String, Tenant)> = self
            .tokens
            .iter()
            .map(|token| (token.clone(), Tenant::anonymous()))
            .collect();
        for (id, tokens) in &self.tenant_tokens {
            let tenant = Tenant::new(id).map_err(|source| QuicError::Tenant {
                id: id.clone(),
                source,
            })?;
            out.extend(tokens.iter().map(|token| (token.clone(), tenant.clone())));
        }
        let mut seen = BTreeSet::new();
        for (token, tenant) in &out {
            if token.is_empty() || !seen.insert(token.as_str()) {
                return Err(QuicError::TokenTwice {
                    tenant: tenant.to_string(),
                });
            }
        }
        Ok(out)
    }
}

impl Default for QuicConfig {
    fn default() -> Self {
        QuicConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], 4041)),
            cert: None,
            key: None,
            client_ca: None,
            tokens: Vec::new(),
            tenant_tokens: BTreeMap::new(),
            max_connections: 4096,
            max_batches_in_flight: 16,
            max_batch_bytes: 64 << 20,
            max_batches_per_second: 50,
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// Why the QUIC listener cannot start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QuicError {
    /// A PEM file (`ingest.quic.cert`, `key`, `client-ca`) does not hold what it should.
    #[error("invalid PEM file {path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Only one of `ingest.quic.cert` and `ingest.quic.key` is set.
    #[error("ingest.quic.cert and ingest.quic.key must be set together")]
    HalfIdentity,
    /// rustls refuses the certificate, key or CA.
    #[error("invalid TLS configuration: {reason}")]
    Tls {
        /// What rustls said.
        reason: String,
    },
    /// A key of `ingest.quic.tenant-tokens` is not a tenant id.
    #[error("ingest.quic.tenant-tokens: {id:?} is not a tenant id")]
    Tenant {
        /// The key.
        id: String,
        /// The rule it breaks.
        #[source]
        source: TenantError,
    },
    /// A token is empty or given twice over `ingest.quic.tokens` and `tenant-tokens`, so that
    /// its tenant would be ambiguous. The token itself is a secret and not shown.
    #[error(
        "ingest.quic: a token of tenant {tenant:?} is empty or appears twice over tokens and tenant-tokens"
    )]
    TokenTwice {
        /// The tenant of its second appearance.
        tenant: String,
    },
    /// The development identity cannot be read, made or written.
    #[error(transparent)]
    Identity(#[from] IdentityError),
}

/// The running listener.
pub(crate) struct Listener {
    endpoint: quinn::Endpoint,
    accept: JoinHandle<()>,
}

impl Listener {
    /// The bound UDP address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.endpoint
            .local_addr()
            .expect("a bound endpoint has an address")
    }

    /// Stops accepting, closes every connection (agents resend what was not acknowledged) and
    /// waits up to a second for the close to reach them.
    pub(crate) async fn close(self) {
        self.accept.abort();
        self.endpoint
            .close(code::SHUTDOWN.into(), b"aggregator shutting down");
        let _ = tokio::time::timeout(Duration::from_secs(1), self.endpoint.wait_idle()).await;
    }
}

/// What QUIC ingest works with besides its config.
pub(crate) struct Parts {
    /// Where batches go.
    pub(crate) ingester: Arc<Ingester>,
    /// Who may ship.
    pub(crate) auth: Arc<Auth>,
    /// The in-flight budget and the tenants' rates.
    pub(crate) admission: Arc<Admission>,
    /// Its metrics.
    pub(crate) metrics: QuicMetrics,
    /// The tier's errors counter.
    pub(crate) errors: Errors,
    /// The tier's refused counter.
    pub(crate) refused: Refused,
}

/// Binds the listener and accepts connections in the background; their batches go to
/// `parts.ingester`.
///
/// # Errors
///
/// When the TLS identity cannot be loaded or created, or the socket cannot bind.
pub(crate) fn start(config: QuicConfig, data_dir: &Path, parts: Parts) -> anyhow::Result<Listener> {
    let crypto = tls::server_config(&config, data_dir).context("setting up QUIC ingest's TLS")?;
    let crypto = QuicServerConfig::try_from(crypto)
        .map_err(|err| anyhow::anyhow!("QUIC refuses the TLS configuration: {err}"))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(config.max_batches_in_flight.into())
        .max_concurrent_uni_streams(0u32.into())
        .max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(config.idle_timeout)
                .context("ingest.quic.idle-timeout is too long")?,
        ));
    server.transport_config(Arc::new(transport));
    let endpoint = quinn::Endpoint::server(server, config.listen)
        .with_context(|| format!("binding QUIC ingest on {}/udp", config.listen))?;
    let addr = endpoint.local_addr().context("reading the bound address")?;
    smolder_daemon::listening("quic", addr);
    let slots = Arc::new(Semaphore::new(config.max_connections.max(1) as usize));
    let full = parts.refused.counter("quic", "connections");
    let shared = Arc::new(connection::Shared {
        client_ca: config.client_ca.is_some(),
        config,
        ingester: parts.ingester,
        auth: parts.auth,
        admission: parts.admission,
        metrics: parts.metrics,
        errors: parts.errors,
    });
    let accept = tokio::spawn(
        accept_loop(endpoint.clone(), shared, slots, full)
            .instrument(info_span!("quic_ingest", %addr)),
    );
    Ok(Listener { endpoint, accept })
}

/// Accepts connections until the endpoint closes, one task each, at most `slots` at once;
/// those past it are refused before their handshake and counted in `full`.
async fn accept_loop(
    endpoint: quinn::Endpoint,
    shared: Arc<connection::Shared>,
    slots: Arc<Semaphore>,
    full: IntCounter,
) {
    while let Some(incoming) = endpoint.accept().await {
        let remote = incoming.remote_address();
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            full.inc();
            debug!(%remote, "QUIC connection refused: ingest.quic.max-connections reached");
            incoming.refuse();
            continue;
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(
            async move {
                connection::serve(incoming, shared).await;
                drop(slot);
            }
            .instrument(info_span!("quic_connection", %remote)),
        );
    }
    warn!("QUIC ingest endpoint closed");
}
