//! QUIC ingest: agents' batches over authenticated QUIC, acknowledged once durable.
//!
//! Input: QUIC connections from agents speaking [`smolder_common::wire`]. Output: each
//! batch's profiles as a [`ProfileSet`](super::ProfileSet), through the same
//! [`Ingester`] as `POST /ingest` (same checks, rules, metrics and store write), with the
//! batch's (agent id, sequence) marker in the same atomic store write, so that a batch is
//! stored at most once across retries and restarts. Caller: `app::start`, which hands it the
//! `Ingester`, its config, the data directory, its metrics and the tier's errors counter, and
//! nothing else. Owns the UDP socket (`ingest.quic.listen`, default `0.0.0.0:4041`), one task
//! per connection and one per batch stream, and, without a configured certificate, the
//! development TLS identity in `<data-dir>/tls/` ([`tls`]).
//!
//! A connection's first stream is the agent's hello: protocol version (in the frame header),
//! agent id, and a token unless the agent presented a client certificate signed by
//! `ingest.quic.client-ca`. Anything else is refused with a reason on that stream and in the
//! connection's close. The connection's batches are stored for the tenant of its token
//! (`ingest.quic.tenant-tokens`; `anonymous` for `tokens` and client certificates): the agent
//! names no tenant, so that it cannot pick another's. Each later stream is one batch ([`connection`]): its header is checked
//! against `ingest.quic.max-batch-bytes` before the body is read, the body is decompressed and
//! decoded on the blocking pool, and the answer is an ack after the store's fsync or a reject
//! saying why and whether a retry can help.

mod connection;
mod metrics;
mod tls;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use quinn::crypto::rustls::QuicServerConfig;
use serde::{Deserialize, Serialize};
use smolder_common::wire::code;
use tokio::task::JoinHandle;
use tracing::{Instrument, info_span, warn};

use super::Ingester;
use crate::metrics::Errors;
use crate::tenant::{Tenant, TenantError};

pub(crate) use self::metrics::QuicMetrics;

/// The QUIC listener agents ship their batches to.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct QuicConfig {
    /// UDP address and port. Default `0.0.0.0:4041`.
    pub listen: SocketAddr,
    /// PEM certificate chain of the listener. With neither `cert` nor `key`, a development CA
    /// and server certificate are generated into `<data-dir>/tls/` on first start (agents on
    /// this host trust `<data-dir>/tls/ca.pem`). Default none.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`. Default none.
    pub key: Option<PathBuf>,
    /// PEM CA certificates; an agent presenting a client certificate signed by one of them is
    /// authenticated without a token. Default none.
    pub client_ca: Option<PathBuf>,
    /// Tokens agents may present in their hello; their batches are the `anonymous` tenant's.
    /// With none here, none in `tenant-tokens` and no `client-ca`, one is generated into
    /// `<data-dir>/tls/agent-token` on first start. Default none.
    pub tokens: Vec<String>,
    /// Tokens by the tenant their agents ship for (`{team-a: [token, ...]}`), with
    /// `tenant.multitenancy-enabled`: the tenant comes from the token, so that an agent cannot
    /// pick another. A token may appear once over `tokens` and `tenant-tokens`. Agents
    /// authenticated by a client certificate ship for `anonymous`. Default none.
    pub tenant_tokens: BTreeMap<String, Vec<String>>,
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

    /// Every configured token with the tenant its agents ship for.
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
    /// A TLS file or the development identity's directory cannot be read or written.
    #[error("cannot use {path}")]
    Io {
        /// The path at fault.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
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
    /// The development identity cannot be generated.
    #[error("generating the development certificate failed: {reason}")]
    Generate {
        /// What rcgen said.
        reason: String,
    },
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

/// Binds the listener and accepts connections in the background; their batches go to
/// `ingester`.
///
/// # Errors
///
/// When the TLS identity cannot be loaded or created, or the socket cannot bind.
pub(crate) fn start(
    ingester: Arc<Ingester>,
    config: QuicConfig,
    data_dir: &Path,
    metrics: QuicMetrics,
    errors: Errors,
) -> anyhow::Result<Listener> {
    let (crypto, credentials) =
        tls::server_config(&config, data_dir).context("setting up QUIC ingest's TLS")?;
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
    let shared = Arc::new(connection::Shared {
        ingester,
        credentials,
        config,
        metrics,
        errors,
    });
    let accept = tokio::spawn(
        accept_loop(endpoint.clone(), shared).instrument(info_span!("quic_ingest", %addr)),
    );
    Ok(Listener { endpoint, accept })
}

/// Accepts connections until the endpoint closes, one task each.
async fn accept_loop(endpoint: quinn::Endpoint, shared: Arc<connection::Shared>) {
    while let Some(incoming) = endpoint.accept().await {
        let remote = incoming.remote_address();
        let shared = Arc::clone(&shared);
        tokio::spawn(
            connection::serve(incoming, shared).instrument(info_span!("quic_connection", %remote)),
        );
    }
    warn!("QUIC ingest endpoint closed");
}
