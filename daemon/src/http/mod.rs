//! A daemon's HTTP listener: its config section, binding it, and serving a router on it so that
//! every refusal has a body that says what was wrong.
//!
//! Input: [`HttpConfig`] and the daemon's [`Router`]. Output: a served listener. Caller: each
//! daemon's `app.rs`. Besides the router's own answers: a request for a path no route serves
//! gets a 404, and one with a method its route does not take a 405 (with `Allow`), each with a
//! one-line body; a request line whose target is not a valid URI (an unencoded `"`, a space)
//! gets a 400 naming the byte to percent-encode, where the HTTP server underneath would answer
//! with an empty body (`request_line.rs`).
//!
//! The listener bounds what clients can hold (`serve.rs`): at most `max-connections`
//! connections at once (one more gets a 503 with `Retry-After`, or is closed on HTTPS), a
//! request's head within [`HEADER_READ_TIMEOUT`] (which also closes idle kept-alive
//! connections), a TLS handshake within [`TLS_HANDSHAKE_TIMEOUT`], and `max-streams-per-connection`
//! HTTP/2 streams per connection. With `cert` and `key` it speaks HTTPS (`tls.rs`: TLS 1.2 and
//! 1.3 through rustls, the files read again when they change). Every request carries the
//! [`Peer`] it came from as an extension, for the routes that decide by it.

mod request_line;
mod serve;
mod tls;

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::http::{Method, StatusCode, Uri};
use prometheus::{IntCounter, IntGauge};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio::net::TcpListener;
use tracing::info;

/// How long a client may take to send a request's head (request line and headers) once it
/// started one, or to start the next on a kept-alive connection: hyper's recommended 30 s.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client may take to finish a TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A daemon's HTTP listener, `http:` in its config; its default address is
/// `127.0.0.1:<PORT>` when `LOOPBACK`, else `0.0.0.0:<PORT>`. Unknown keys are refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpConfig<const LOOPBACK: bool, const PORT: u16> {
    /// Address and port to listen on; port 0 takes a free port, named in the `listening` log
    /// line. Default: the daemon's (`0.0.0.0:4040` for the aggregator, `127.0.0.1:4042` for the
    /// agent).
    pub listen: SocketAddr,
    /// PEM certificate chain; with `key`, the listener speaks HTTPS only (TLS 1.2 and 1.3,
    /// HTTP/2 and HTTP/1.1 by ALPN), and reads both files again within a minute of a change.
    /// Default none: plain HTTP (and HTTP/2 without TLS, h2c).
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`. Default none.
    pub key: Option<PathBuf>,
    /// Connections open at once; past it a new one is answered 503 with `Retry-After: 1` (on
    /// HTTPS, closed) and counted. Default 1024.
    pub max_connections: usize,
    /// HTTP/2 streams, requests in flight, one connection may have at once. Default 100.
    pub max_streams_per_connection: u32,
}

impl<const LOOPBACK: bool, const PORT: u16> Default for HttpConfig<LOOPBACK, PORT> {
    fn default() -> Self {
        let ip = if LOOPBACK {
            Ipv4Addr::LOCALHOST
        } else {
            Ipv4Addr::UNSPECIFIED
        };
        HttpConfig {
            listen: SocketAddr::V4(SocketAddrV4::new(ip, PORT)),
            cert: None,
            key: None,
            max_connections: 1024,
            max_streams_per_connection: 100,
        }
    }
}

/// The section as written; serde's derive does not take const generics.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Section {
    listen: Option<SocketAddr>,
    #[serde(default)]
    cert: Option<PathBuf>,
    #[serde(default)]
    key: Option<PathBuf>,
    max_connections: Option<usize>,
    max_streams_per_connection: Option<u32>,
}

impl<'de, const LOOPBACK: bool, const PORT: u16> Deserialize<'de> for HttpConfig<LOOPBACK, PORT> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let section = Section::deserialize(deserializer)?;
        let default = Self::default();
        Ok(HttpConfig {
            listen: section.listen.unwrap_or(default.listen),
            cert: section.cert,
            key: section.key,
            max_connections: section.max_connections.unwrap_or(default.max_connections),
            max_streams_per_connection: section
                .max_streams_per_connection
                .unwrap_or(default.max_streams_per_connection),
        })
    }
}

impl<const LOOPBACK: bool, const PORT: u16> Serialize for HttpConfig<LOOPBACK, PORT> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Section {
            listen: Some(self.listen),
            cert: self.cert.clone(),
            key: self.key.clone(),
            max_connections: Some(self.max_connections),
            max_streams_per_connection: Some(self.max_streams_per_connection),
        }
        .serialize(serializer)
    }
}

impl<const LOOPBACK: bool, const PORT: u16> HttpConfig<LOOPBACK, PORT> {
    /// Binds the listener, loads its TLS identity if it has one, and logs its address.
    ///
    /// # Errors
    ///
    /// When the address cannot be bound (in use, not ours, no permission), or the TLS files
    /// cannot be read or do not belong together.
    pub async fn bind(&self) -> anyhow::Result<HttpListener> {
        let tls = self.tls()?;
        let listener = TcpListener::bind(self.listen)
            .await
            .with_context(|| format!("binding {} (http.listen)", self.listen))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        listening("http", addr);
        Ok(HttpListener {
            listener,
            addr,
            tls,
            limits: serve::Limits {
                max_connections: self.max_connections.max(1),
                max_streams: self.max_streams_per_connection.max(1),
            },
            metrics: ListenerMetrics::unregistered(),
        })
    }

    /// Checks the TLS files the section names, as [`HttpConfig::bind`] reads them; what
    /// `check-config` runs.
    ///
    /// # Errors
    ///
    /// Only one of `cert` and `key`, a file missing or not PEM of its kind, a key that is not
    /// the certificate's.
    pub fn check_files(&self) -> anyhow::Result<()> {
        self.tls().map(|_| ())
    }

    fn tls(&self) -> anyhow::Result<Option<Arc<tls::Acceptor>>> {
        match (&self.cert, &self.key) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => Ok(Some(Arc::new(
                tls::Acceptor::load(cert, key).context("loading http.cert and http.key")?,
            ))),
            _ => anyhow::bail!("http.cert and http.key must be set together"),
        }
    }
}

/// Logs the one `listening` line of a listener: `listener` names it (`http`, `quic`), `addr`
/// is where it is bound, the actual port when port 0 was asked. Scripts and tests that bind
/// port 0 read the address from this line (target `smolder_daemon`, level info).
pub fn listening(listener: &'static str, addr: SocketAddr) {
    info!(listener, %addr, "listening");
}

/// Where a request came from: an extension of every request the listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The client's address as the connection shows it (a proxy's, behind one).
    pub addr: SocketAddr,
    /// Whether the connection is TLS.
    pub tls: bool,
}

/// What the listener counts; each daemon names them in its own registry.
#[derive(Clone)]
pub struct ListenerMetrics {
    /// Connections open now.
    pub connections_open: IntGauge,
    /// Connections refused at `max-connections`.
    pub connections_refused: IntCounter,
    /// TLS handshakes that failed or timed out.
    pub tls_failures: IntCounter,
}

impl ListenerMetrics {
    /// Metrics in no registry, for a daemon that does not export them.
    pub fn unregistered() -> Self {
        let gauge = |name: &str| IntGauge::new(name, name).expect("a valid metric name");
        let counter = |name: &str| IntCounter::new(name, name).expect("a valid metric name");
        ListenerMetrics {
            connections_open: gauge("connections_open"),
            connections_refused: counter("connections_refused"),
            tls_failures: counter("tls_failures"),
        }
    }
}

/// A bound HTTP listener.
pub struct HttpListener {
    listener: TcpListener,
    addr: SocketAddr,
    tls: Option<Arc<tls::Acceptor>>,
    limits: serve::Limits,
    metrics: ListenerMetrics,
}

impl HttpListener {
    /// The address it is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether it speaks HTTPS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Counts its connections in `metrics` rather than in unregistered ones.
    #[must_use]
    pub fn with_metrics(mut self, metrics: ListenerMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Serves `router` until `stop` resolves, then lets requests in flight finish.
    ///
    /// # Errors
    ///
    /// When accepting connections fails for good.
    pub async fn serve(
        self,
        router: Router,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let router = router
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed);
        serve::run(
            self.listener,
            self.tls,
            self.limits,
            self.metrics,
            router,
            stop,
        )
        .await
        .context("serving HTTP")
    }
}

async fn not_found(uri: Uri) -> (StatusCode, String) {
    (
        StatusCode::NOT_FOUND,
        format!("no route for {}\n", uri.path()),
    )
}

/// The router adds `Allow` with the methods the path takes.
async fn method_not_allowed(method: Method, uri: Uri) -> (StatusCode, String) {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "method {method} is not allowed on {}; the allow header lists those that are\n",
            uri.path()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    type Config = HttpConfig<true, 4042>;

    #[test]
    fn the_section_reads_with_defaults_and_refuses_unknown_keys() {
        let default: Config = serde_norway::from_str("{}").unwrap();
        assert_eq!(default.listen, "127.0.0.1:4042".parse().unwrap());
        assert_eq!(
            HttpConfig::<false, 4040>::default().listen,
            "0.0.0.0:4040".parse().unwrap()
        );
        assert_eq!(default.max_connections, 1024);
        assert!(default.cert.is_none() && default.key.is_none());
        let set: Config =
            serde_norway::from_str("listen: 0.0.0.0:1\nmax-connections: 7\n").unwrap();
        assert_eq!(set.max_connections, 7);
        assert_eq!(
            serde_norway::from_str::<Config>(&serde_norway::to_string(&set).unwrap()).unwrap(),
            set
        );
        let err = serde_norway::from_str::<Config>("listne: 1.2.3.4:5\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `listne`"), "{err}");
    }
}
