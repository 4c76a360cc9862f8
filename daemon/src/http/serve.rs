//! The accept loop: connections under a cap, each served by hyper (HTTP/1.1 or HTTP/2, by
//! ALPN or by the HTTP/2 preface) on a task of its own, over TLS when configured, every
//! request tagged with its [`Peer`].

use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tower::ServiceExt;
use tracing::{debug, warn};

use super::request_line::CheckedStream;
use super::tls::Acceptor;
use super::{HEADER_READ_TIMEOUT, ListenerMetrics, Peer, TLS_HANDSHAKE_TIMEOUT};

/// How long a refused connection's 503 may take to write.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 pings on a quiet connection, to find peers that went away without closing it.
const H2_KEEP_ALIVE: Duration = Duration::from_secs(60);

/// What one listener allows.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// Connections open at once.
    pub(super) max_connections: usize,
    /// HTTP/2 streams per connection.
    pub(super) max_streams: u32,
}

/// Accepts until `stop` resolves, then asks every connection to finish its requests in flight
/// and waits for them.
pub(super) async fn run(
    listener: TcpListener,
    tls: Option<Arc<Acceptor>>,
    limits: Limits,
    metrics: ListenerMetrics,
    router: Router,
    stop: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    // Connections wait for `signal_tx` to close (shutdown); `close_rx` clones held by them tell
    // when the last one is done.
    let (signal_tx, signal_rx) = watch::channel(());
    let (close_tx, close_rx) = watch::channel(());
    let mut stop = pin!(stop);
    loop {
        let (stream, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: wait for some to free up.
                    warn!(%error, "accepting an HTTP connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            metrics.connections_refused.inc();
            debug!(%addr, "connection refused: http.max-connections reached");
            tokio::spawn(refuse(stream, tls.is_some(), limits.max_connections));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let peer = Peer {
            addr,
            tls: tls.is_some(),
        };
        let connection = Connection {
            peer,
            router: router.clone(),
            max_streams: limits.max_streams,
            signal: signal_tx.clone(),
            metrics: metrics.clone(),
        };
        let tls = tls.clone();
        let close = close_rx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let _close = close;
            connection.metrics.connections_open.inc();
            match tls {
                None => connection.serve(stream).await,
                Some(tls) => {
                    let handshake = tls.acceptor().accept(stream);
                    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, handshake).await {
                        Ok(Ok(stream)) => connection.serve(stream).await,
                        Ok(Err(error)) => {
                            connection.metrics.tls_failures.inc();
                            debug!(%addr, %error, "TLS handshake failed");
                        }
                        Err(_) => {
                            connection.metrics.tls_failures.inc();
                            debug!(%addr, "TLS handshake timed out");
                        }
                    }
                }
            }
            connection.metrics.connections_open.dec();
        });
    }
    drop(listener);
    drop(signal_rx);
    drop(close_rx);
    close_tx.closed().await;
    Ok(())
}

/// One accepted connection and what serving it needs.
struct Connection {
    peer: Peer,
    router: Router,
    max_streams: u32,
    signal: watch::Sender<()>,
    metrics: ListenerMetrics,
}

impl Connection {
    async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(&self, stream: S) {
        let peer = self.peer;
        let service = self
            .router
            .clone()
            .map_request(move |request: Request<Incoming>| {
                let mut request = request.map(Body::new);
                request.extensions_mut().insert(peer);
                request
            });
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(self.max_streams)
            .keep_alive_interval(H2_KEEP_ALIVE);
        let io = TokioIo::new(CheckedStream::new(stream));
        let mut connection =
            pin!(builder.serve_connection_with_upgrades(io, TowerToHyperService::new(service)));
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(error) = served {
                    debug!(addr = %peer.addr, %error, "HTTP connection ended with an error");
                }
                return;
            }
            () = self.signal.closed() => {}
        }
        connection.as_mut().graceful_shutdown();
        let _ = connection.await;
    }
}

/// Answers a connection over the cap: a 503 on plain HTTP (the client's request is not read),
/// nothing on HTTPS, where a plain answer would be garbage to the client.
async fn refuse(mut stream: TcpStream, tls: bool, max: usize) {
    if !tls {
        let body =
            format!("too many connections: {max} are open (http.max-connections); retry later\n");
        let answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\n\
             content-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = tokio::time::timeout(REFUSAL_TIMEOUT, async {
            stream.write_all(answer.as_bytes()).await?;
            stream.shutdown().await
        })
        .await;
    }
}
