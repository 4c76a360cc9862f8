//! `POST /ingest` and the Connect push over real HTTP: every body format, and every client
//! mistake answered with the right 4xx, a message naming it, and nothing stored.

use std::io::Write;

use reqwest::StatusCode;

use crate::util::Aggregator;

/// The value of the first sample line of `/metrics` that starts with `prefix` (name and labels),
/// or 0 when there is none.
async fn metric(agg: &Aggregator, prefix: &str) -> f64 {
    let text = agg
        .http
        .get(agg.url("/metrics"))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .filter(|line| line.starts_with(prefix))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Profiles stored so far, by the store's own counter.
async fn stored(agg: &Aggregator) -> f64 {
    metric(agg, "smolder_aggregator_store_profiles_written_total").await
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).expect("in memory");
    enc.finish().expect("in memory")
}

/// POSTs `body` to `/ingest?<query>` with optional extra headers.
async fn post(
    agg: &Aggregator,
    query: &[(&str, &str)],
    headers: &[(&str, &str)],
    body: impl Into<reqwest::Body>,
) -> (StatusCode, String) {
    let mut request = agg.http.post(agg.url("/ingest")).query(query).body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("POST /ingest");
    let status = response.status();
    (status, response.text().await.expect("response text"))
}

#[tokio::test]
async fn folded_lines_and_gzip_bodies_are_stored() {
    let agg = Aggregator::start().await;
    let (status, body) = post(
        &agg,
        &[
            ("name", "shop.cpu{env=prod,k8s.pod.name=web-1}"),
            ("from", "now-10s"),
            ("until", "now"),
            ("sampleRate", "99"),
            ("spyName", "gospy"),
        ],
        &[],
        "main;handler;json.Marshal 37\nmain;gc 5\n",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(stored(&agg).await, 1.0);

    let (status, body) = post(
        &agg,
        &[("name", "shop.cpu"), ("format", "lines")],
        &[],
        "main;a\nmain;a\nmain;b\n",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(stored(&agg).await, 2.0);

    let (status, body) = post(
        &agg,
        &[("name", "shop.cpu")],
        &[("content-encoding", "gzip")],
        gzip(b"main;a 3\n"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(stored(&agg).await, 3.0);

    let (status, _) = post(&agg, &[("name", "shop.cpu")], &[], "").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an empty body is fine and stores nothing"
    );
    assert_eq!(stored(&agg).await, 3.0);

    assert_eq!(
        metric(
            &agg,
            "smolder_aggregator_ingest_profiles_total{format=\"folded\"}"
        )
        .await,
        2.0
    );
    assert_eq!(
        metric(
            &agg,
            "smolder_aggregator_ingest_profiles_total{format=\"lines\"}"
        )
        .await,
        1.0
    );
    assert_eq!(
        metric(
            &agg,
            "pyroscope_distributor_received_samples_count{type=\"folded\"}"
        )
        .await,
        2.0
    );
    agg.stop().await;
}

#[tokio::test]
async fn pyroscope_ingest_prefix_is_served() {
    let agg = Aggregator::start().await;
    let response = agg
        .http
        .post(agg.url("/pyroscope/ingest"))
        .query(&[("name", "shop.cpu")])
        .body("a;b 1\n")
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(stored(&agg).await, 1.0);
    agg.stop().await;
}
