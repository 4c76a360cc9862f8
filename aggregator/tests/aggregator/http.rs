//! The HTTP surface's own refusals, over a raw socket where a client library would correct the
//! request: each answer has a body that says what was wrong.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::util::Aggregator;

/// Sends `request` as written and reads the whole answer (the server closes the connection).
async fn raw(agg: &Aggregator, request: &str) -> String {
    let mut stream = TcpStream::connect(agg.addr()).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

#[tokio::test]
async fn an_unencoded_quote_in_a_query_is_a_400_that_says_to_encode_it() {
    let agg = Aggregator::start().await;
    let answer = raw(
        &agg,
        "GET /render?query=app.cpu{env=\"prod\"} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains("'\"' at byte 26 must be percent-encoded"),
        "{answer}"
    );
    // The same request, encoded, is served.
    let answer = raw(
        &agg,
        "GET /render?query=app.cpu{env=%22prod%22} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    agg.stop().await;
}

#[tokio::test]
async fn a_wrong_method_or_path_is_answered_with_a_body() {
    let agg = Aggregator::start().await;
    let response = agg.http.get(agg.url("/ingest")).send().await.unwrap();
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers()["allow"], "POST");
    assert_eq!(
        response.text().await.unwrap(),
        "method GET is not allowed on /ingest; the allow header lists those that are\n"
    );
    let response = agg.http.get(agg.url("/nowhere")).send().await.unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(response.text().await.unwrap(), "no route for /nowhere\n");
    agg.stop().await;
}
