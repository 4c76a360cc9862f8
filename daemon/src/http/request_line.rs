//! The first request line of each connection, checked before the HTTP server reads it.
//!
//! hyper answers a request target that is not a valid URI (an unencoded `"` or space in a
//! query, as `curl 'http://host/render?query=app.cpu{env="prod"}'` sends it) with a 400 and an
//! empty body, and offers no hook to say more. [`CheckedStream`] reads each connection's first
//! line itself: a target that `http`'s URI parser (the one hyper uses) refuses is answered
//! here, with a body naming the byte to encode, and the connection closed; any other line is
//! handed to the server unchanged, byte for byte, and the connection is passed through from
//! then on. A later request on a kept-alive connection is not checked (clients that reuse
//! connections, browsers and SDKs, encode their URLs).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::http::Uri;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A request line longer than this is left to the server, which limits it itself.
const MAX_LINE: usize = 16 * 1024;

/// A connection whose first request line is checked before the server sees it.
pub(super) struct CheckedStream<S> {
    inner: S,
    state: State,
}

enum State {
    /// Reading the first request line; what came so far.
    Line(Vec<u8>),
    /// The line is the server's: these bytes go to it before anything else is read.
    Replay(Vec<u8>, usize),
    /// The line was refused: this answer is being written, then the stream ends.
    Refuse(Vec<u8>, usize),
    /// Passed through.
    Pass,
    /// Answered and closed: reads see the end of the stream.
    Done,
}

impl<S> CheckedStream<S> {
    pub(super) fn new(inner: S) -> Self {
        CheckedStream {
            inner,
            state: State::Line(Vec::new()),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for CheckedStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Pass => return Pin::new(&mut this.inner).poll_read(cx, buf),
                State::Done => return Poll::Ready(Ok(())),
                State::Replay(bytes, sent) => {
                    let n = buf.remaining().min(bytes.len() - *sent);
                    buf.put_slice(&bytes[*sent..*sent + n]);
                    *sent += n;
                    if *sent == bytes.len() {
                        this.state = State::Pass;
                    }
                    return Poll::Ready(Ok(()));
                }
                State::Line(bytes) => {
                    let mut chunk = [0u8; 4096];
                    let mut read = ReadBuf::new(&mut chunk);
                    ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
                    let eof = read.filled().is_empty();
                    bytes.extend_from_slice(read.filled());
                    this.state = match check(bytes) {
                        Verdict::NeedMore if !eof && bytes.len() < MAX_LINE => continue,
                        Verdict::Refuse(body) => State::Refuse(answer(&body), 0),
                        _ if bytes.is_empty() => State::Pass,
                        _ => State::Replay(std::mem::take(bytes), 0),
                    };
                }
                State::Refuse(answer, written) => {
                    while *written < answer.len() {
                        let n =
                            ready!(Pin::new(&mut this.inner).poll_write(cx, &answer[*written..]))?;
                        if n == 0 {
                            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                        }
                        *written += n;
                    }
                    ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
                    // The answer is out; a failed shutdown only means the peer left first.
                    let _ = ready!(Pin::new(&mut this.inner).poll_shutdown(cx));
                    this.state = State::Done;
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for CheckedStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// What to do with the bytes read so far.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// No whole line yet.
    NeedMore,
    /// Not ours to judge: the server reads it (a valid target, or a line malformed otherwise).
    Pass,
    /// A target the server would refuse without saying why: this message says why.
    Refuse(String),
}

fn check(bytes: &[u8]) -> Verdict {
    // Servers skip empty lines before a request (RFC 9112, 2.2).
    let start = bytes
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(bytes.len());
    let Some(end) = bytes[start..].iter().position(|&b| b == b'\n') else {
        return Verdict::NeedMore;
    };
    let line = bytes[start..start + end]
        .strip_suffix(b"\r")
        .unwrap_or(&bytes[start..start + end]);
    // `METHOD SP target SP HTTP/x.y`: a target with a space in it has more than two spaces.
    let (Some(first), Some(last)) = (
        line.iter().position(|&b| b == b' '),
        line.iter().rposition(|&b| b == b' '),
    ) else {
        return Verdict::Pass;
    };
    if first == last || !line[last + 1..].starts_with(b"HTTP/") {
        return Verdict::Pass;
    }
    let target = &line[first + 1..last];
    if Uri::try_from(target).is_ok() {
        return Verdict::Pass;
    }
    match offending_byte(target) {
        Some((position, byte)) => Verdict::Refuse(format!(
            "malformed request target: {} at byte {position} must be percent-encoded \
             (with curl: -G and --data-urlencode 'name=value' for each parameter)\n",
            describe(byte)
        )),
        None => Verdict::Refuse(format!(
            "malformed request target: {:?} is not a valid URI\n",
            String::from_utf8_lossy(target)
        )),
    }
}

/// The first byte of `target` that the URI parser refuses on its own, where it stands (in the
/// path or in the query); non-ASCII bytes are left to the whole-target check.
fn offending_byte(target: &[u8]) -> Option<(usize, u8)> {
    let query = target.iter().position(|&b| b == b'?');
    target.iter().enumerate().find_map(|(i, &b)| {
        if b >= 0x80 || Some(i) == query {
            return None;
        }
        let probe = if query.is_some_and(|q| i > q) {
            vec![b'/', b'?', b]
        } else {
            vec![b'/', b]
        };
        Uri::try_from(probe).is_err().then_some((i, b))
    })
}

fn describe(byte: u8) -> String {
    if byte.is_ascii_graphic() {
        format!("{:?}", char::from(byte))
    } else {
        format!("byte 0x{byte:02x}")
    }
}

fn answer(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[test]
    fn valid_and_foreign_lines_pass_and_bad_targets_are_named() {
        assert_eq!(check(b"GET /render?query=a"), Verdict::NeedMore);
        assert_eq!(check(b"\r\nGET /x HTTP/1.1\r\nHost"), Verdict::Pass);
        assert_eq!(
            check(b"GET /render?query=app.cpu{env=prod} HTTP/1.1\r\n"),
            Verdict::Pass
        );
        assert_eq!(check(b"garbage\r\n"), Verdict::Pass);
        let Verdict::Refuse(message) =
            check(b"GET /render?query=app.cpu{env=\"prod\"} HTTP/1.1\r\n")
        else {
            panic!("a quote in the query is refused");
        };
        assert!(message.contains("'\"' at byte 26"), "{message}");
        let Verdict::Refuse(message) = check(b"GET /a b HTTP/1.1\n") else {
            panic!("a space in the target is refused");
        };
        assert!(
            message.contains("' '") || message.contains("0x20"),
            "{message}"
        );
    }

    async fn exchange(request: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let mut checked = CheckedStream::new(server);
        let (mut client_read, mut client_write) = tokio::io::split(client);
        client_write.write_all(request).await.unwrap();
        client_write.shutdown().await.unwrap();
        let mut seen = Vec::new();
        checked.read_to_end(&mut seen).await.unwrap();
        drop(checked);
        let mut answered = Vec::new();
        client_read.read_to_end(&mut answered).await.unwrap();
        (seen, answered)
    }

    #[tokio::test]
    async fn a_good_request_reaches_the_server_byte_for_byte() {
        let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".repeat(3);
        let (seen, answered) = exchange(&request).await;
        assert_eq!(seen, request);
        assert!(answered.is_empty());
    }

    #[tokio::test]
    async fn a_bad_target_is_answered_with_a_body_and_never_reaches_the_server() {
        let (seen, answered) = exchange(b"GET /render?q=\"x\" HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(seen.is_empty());
        let answered = String::from_utf8(answered).unwrap();
        assert!(
            answered.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{answered}"
        );
        assert!(answered.ends_with("must be percent-encoded (with curl: -G and --data-urlencode 'name=value' for each parameter)\n"), "{answered}");
    }
}
