//! A daemon's HTTP listener: its config section, binding it, and serving a router on it so that
//! every refusal has a body that says what was wrong.
//!
//! Input: [`HttpConfig`] and the daemon's [`Router`]. Output: a served listener. Caller: each
//! daemon's `app.rs`. Besides the router's own answers: a request for a path no route serves
//! gets a 404, and one with a method its route does not take a 405 (with `Allow`), each with a
//! one-line body; a request line whose target is not a valid URI (an unencoded `"`, a space)
//! gets a 400 naming the byte to percent-encode, where the HTTP server underneath would answer
//! with an empty body (`request_line.rs`).

mod request_line;

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use anyhow::Context;
use axum::Router;
use axum::http::{Method, StatusCode, Uri};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio::net::TcpListener;
use tracing::info;

/// A daemon's HTTP listener, `http:` in its config; its default address is
/// `127.0.0.1:<PORT>` when `LOOPBACK`, else `0.0.0.0:<PORT>`. Read and written as a section
/// with one key, `listen`, unknown keys refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpConfig<const LOOPBACK: bool, const PORT: u16> {
    /// Address and port to listen on; port 0 takes a free port, named in the `listening` log
    /// line. Default: the daemon's (`0.0.0.0:4040` for the aggregator, `127.0.0.1:4042` for the
    /// agent).
    pub listen: SocketAddr,
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
        }
    }
}

/// The section as written; serde's derive does not take const generics.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Section {
    listen: Option<SocketAddr>,
}

impl<'de, const LOOPBACK: bool, const PORT: u16> Deserialize<'de> for HttpConfig<LOOPBACK, PORT> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let section = Section::deserialize(deserializer)?;
        Ok(HttpConfig {
            listen: section.listen.unwrap_or(Self::default().listen),
        })
    }
}

impl<const LOOPBACK: bool, const PORT: u16> Serialize for HttpConfig<LOOPBACK, PORT> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Section {
            listen: Some(self.listen),
        }
        .serialize(serializer)
    }
}

impl<const LOOPBACK: bool, const PORT: u16> HttpConfig<LOOPBACK, PORT> {
    /// Binds the listener and logs its address.
    ///
    /// # Errors
    ///
    /// When the address cannot be bound (in use, not ours, no permission).
    pub async fn bind(&self) -> anyhow::Result<HttpListener> {
        let listener = TcpListener::bind(self.listen)
            .await
            .with_context(|| format!("binding {} (http.listen)", self.listen))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        listening("http", addr);
        Ok(HttpListener { listener, addr })
    }
}

/// Logs the one `listening` line of a listener: `listener` names it (`http`, `quic`), `addr`
/// is where it is bound, the actual port when port 0 was asked. Scripts and tests that bind
/// port 0 read the address from this line (target `smolder_daemon`, level info).
pub fn listening(listener: &'static str, addr: SocketAddr) {
    info!(listener, %addr, "listening");
}

/// A bound HTTP listener.
pub struct HttpListener {
    listener: TcpListener,
    addr: SocketAddr,
}

impl HttpListener {
    /// The address it is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves `router` until `stop` resolves, then lets requests in flight finish.
    ///
    /// # Errors
    ///
    /// When serving fails.
    pub async fn serve(
        self,
        router: Router,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let router = router
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed);
        axum::serve(request_line::Checked(self.listener), router)
            .with_graceful_shutdown(stop)
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
        let set: Config = serde_norway::from_str("listen: 0.0.0.0:1\n").unwrap();
        assert_eq!(
            serde_norway::to_string(&set).unwrap(),
            "listen: 0.0.0.0:1\n"
        );
        let err = serde_norway::from_str::<Config>("listne: 1.2.3.4:5\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `listne`"), "{err}");
    }
}
