//! `POST /ingest` and the Connect push over real HTTP: every body format, and every client
//! mistake answered with the right 4xx, a message naming it, and nothing stored.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use prost::Message;
use reqwest::StatusCode;
use smolder_aggregator::config::Config;
use smolder_common::pprof::{self, EncodeOptions};
use smolder_test_support::prometheus::Metrics;

use crate::util::{Aggregator, gzip, tree, wire};

/// Every client mistake answered with the right 4xx, a message naming it, and nothing stored.
mod refusals;

/// Metric `name` of `/metrics`, summed over its samples with `labels`; a missing one fails
/// the test.
async fn metric(agg: &Aggregator, name: &str, labels: &[(&str, &str)]) -> f64 {
    Metrics::scrape(&agg.url("/metrics"))
        .await
        .value(name, labels)
}

/// Profiles stored so far, by the store's own counter.
async fn stored(agg: &Aggregator) -> f64 {
    metric(agg, "smolder_aggregator_store_profiles_written_total", &[]).await
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
    let prod = "shop.cpu{env=\"prod\",k8s.pod.name=\"web-1\"}";
    assert_eq!(
        agg.collapsed(prod).await,
        "main;gc 5\nmain;handler;json.Marshal 37"
    );
    let meta = agg.metadata(prod).await;
    assert_eq!(meta["sampleRate"], 99, "{meta}");
    assert_eq!(meta["spyName"], "gospy", "{meta}");

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
    assert_eq!(
        agg.collapsed("shop.cpu{env=\"\"}").await,
        "main;a 5\nmain;b 1",
        "lines count identical stacks; gzip bodies merge in"
    );

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
            "smolder_aggregator_ingest_profiles_total",
            &[("format", "folded"), ("transport", "http")]
        )
        .await,
        2.0
    );
    assert_eq!(
        metric(
            &agg,
            "smolder_aggregator_ingest_profiles_total",
            &[("format", "lines"), ("transport", "http")]
        )
        .await,
        1.0
    );
    assert_eq!(
        metric(
            &agg,
            "pyroscope_distributor_received_samples_count",
            &[("type", "folded")]
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

fn cpu_pprof(stacks: &[(&str, u64)], rate: u32, gzip: bool) -> Vec<u8> {
    pprof::encode(&tree(stacks), &EncodeOptions::cpu_samples(rate)).to_bytes(gzip)
}

fn alloc_pprof(stacks: &[(&str, u64)]) -> Vec<u8> {
    pprof::encode(&tree(stacks), &EncodeOptions::new("alloc_space", "bytes")).to_bytes(true)
}

/// A multipart form as Go's `mime/multipart` writes it: file fields with a filename.
fn form(boundary: &str, fields: &[(&str, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, data) in fields {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; \
                 filename=\"{name}.pprof\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    body
}

#[tokio::test]
async fn pprof_bodies_become_one_series_per_sample_type() {
    let agg = Aggregator::start().await;
    let body = cpu_pprof(&[("main;work", 30), ("main;idle", 2)], 250, true);
    let (status, text) = post(
        &agg,
        &[
            ("name", "shop{env=prod,service.version=1.2}"),
            ("format", "pprof"),
        ],
        &[],
        body,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let plain = cpu_pprof(&[("main;work", 5)], 250, false);
    let (status, text) = post(
        &agg,
        &[
            ("name", "shop{env=prod,service.version=1.2}"),
            ("format", "pprof"),
        ],
        &[("content-encoding", "gzip")],
        gzip(&plain),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(
        agg.collapsed("shop.cpu{env=\"prod\",service.version=\"1.2\"}")
            .await,
        "main;idle 2\nmain;work 35"
    );
    let meta = agg.metadata("shop.cpu{}").await;
    assert_eq!(
        meta["sampleRate"], 250,
        "the rate comes from the period: {meta}"
    );
    assert_eq!(meta["units"], "samples");
    assert_eq!(
        metric(
            &agg,
            "pyroscope_distributor_received_samples_count",
            &[("type", "cpu")]
        )
        .await,
        2.0
    );
    agg.stop().await;
}

#[tokio::test]
async fn go_sdk_form_subtracts_prev_profile_and_reads_sample_type_config() {
    let agg = Aggregator::start().await;
    let prev = alloc_pprof(&[("main;a", 10), ("main;b", 5)]);
    let current = alloc_pprof(&[("main;a", 25), ("main;b", 5), ("main;c", 7)]);
    let boundary = "d6b8c3f1e0a94b2c";
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let (status, text) = post(
        &agg,
        &[("name", "shop{env=prod}"), ("spyName", "gospy")],
        &[("content-type", &content_type)],
        form(boundary, &[("profile", &current), ("prev_profile", &prev)]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(
        agg.collapsed("shop.alloc_space{env=\"prod\"}").await,
        "main;a 15\nmain;c 7"
    );

    let config = br#"{"alloc_space":{"units":"bytes","display-name":"alloc_bytes",
        "aggregation":"sum","cumulative":true}}"#;
    let (status, text) = post(
        &agg,
        &[("name", "shop{env=prod}")],
        &[("content-type", &content_type)],
        form(
            boundary,
            &[
                ("profile", &current),
                ("prev_profile", &prev),
                ("sample_type_config", config),
            ],
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(
        agg.collapsed("shop.alloc_bytes{}").await,
        "main;a 15\nmain;c 7"
    );
    assert_eq!(agg.metadata("shop.alloc_bytes{}").await["units"], "bytes");
    assert_eq!(
        metric(
            &agg,
            "smolder_aggregator_ingest_profiles_total",
            &[("format", "pprof"), ("transport", "http")]
        )
        .await,
        2.0
    );
    agg.stop().await;
}

async fn push(
    agg: &Aggregator,
    headers: &[(&str, &str)],
    body: impl Into<reqwest::Body>,
) -> (StatusCode, String) {
    let mut request = agg
        .http
        .post(agg.url("/push.v1.PusherService/Push"))
        .header("connect-protocol-version", "1")
        .body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("POST push");
    let status = response.status();
    (status, response.text().await.expect("response text"))
}

#[tokio::test]
async fn connect_push_binary_and_json() {
    let agg = Aggregator::start().await;
    let labels = [
        ("__name__", "process_cpu"),
        ("service_name", "checkout"),
        ("k8s.pod.name", "web-1"),
        // Not a valid label name: sanitized to `k8s_app`, not a reason to lose the profile.
        ("k8s-app", "shop"),
        ("pyroscope_spy", "gospy"),
        ("__delta__", "false"),
    ];
    let request = wire::push_request(&labels, cpu_pprof(&[("main;pay", 4)], 100, true));
    let (status, text) = push(
        &agg,
        &[("content-type", "application/proto")],
        request.encode_to_vec(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(text, "", "an empty PushResponse");

    let profile = cpu_pprof(&[("main;pay", 6)], 100, false);
    let json = serde_json::json!({
        "series": [{
            "labels": labels.iter().map(|(n, v)| serde_json::json!({"name": n, "value": v}))
                .collect::<Vec<_>>(),
            "samples": [{"rawProfile": STANDARD.encode(&profile), "ID": "x"}],
        }]
    });
    let (status, text) = push(
        &agg,
        &[
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
        ],
        gzip(json.to_string().as_bytes()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(text, "{}");
    assert_eq!(
        agg.collapsed("checkout.cpu{k8s.pod.name=\"web-1\", k8s_app=\"shop\"}")
            .await,
        "main;pay 10"
    );
    assert_eq!(agg.metadata("checkout.cpu{}").await["spyName"], "gospy");
    assert_eq!(
        metric(
            &agg,
            "smolder_aggregator_ingest_profiles_total",
            &[("format", "push"), ("transport", "http")]
        )
        .await,
        2.0
    );
    agg.stop().await;
}

#[tokio::test]
async fn a_request_stores_its_good_series_and_names_the_refused_ones() {
    let mut config = Config::default();
    config.ingest.max_series_per_request = 2;
    config.ingest.max_label_bytes = 64;
    config.ingest.max_active_series_per_tenant = 4;
    let agg = Aggregator::with_config(config).await;
    // A push of three series: one good, one with a label past 64 bytes, one past the two a
    // request may make.
    let long = "v".repeat(65);
    let series = |service: &str, version: &str| {
        let labels = [
            ("__name__", "process_cpu"),
            ("service_name", service),
            ("version", version),
        ];
        wire::push_request(&labels, cpu_pprof(&[("main;pay", 4)], 100, false))
            .series
            .remove(0)
    };
    let request = wire::PushRequest {
        series: vec![
            series("good", "1"),
            series("long", &long),
            series("over", "1"),
        ],
    };
    let response = agg
        .http
        .post(agg.url("/push.v1.PusherService/Push"))
        .header("connect-protocol-version", "1")
        .header("content-type", "application/proto")
        .body(request.encode_to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(headers["smolder-refused-series"], "2");
    let warnings: Vec<&str> = headers
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].contains("(label_too_long)")
            && warnings[0].contains("longer than ingest.max-label-bytes (64)"),
        "{warnings:?}"
    );
    assert!(warnings[1].contains("(too_many_series)"), "{warnings:?}");
    assert_eq!(agg.collapsed("good.cpu{}").await, "main;pay 4");
    assert_eq!(agg.collapsed("long.cpu{}").await, "");
    assert_eq!(agg.collapsed("over.cpu{}").await, "");

    // A pprof of three sample types makes three series, one past the two a request may make:
    // the answer's body names it.
    let mut profile = pprof::encode(
        &tree(&[("main;alloc", 64)]),
        &EncodeOptions::new("alloc_space", "bytes"),
    );
    for (kind, unit) in [("alloc_objects", "count"), ("inuse_space", "bytes")] {
        let at = profile.string_table.len() as i64;
        profile.string_table.push(kind.as_bytes().to_vec());
        profile.string_table.push(unit.as_bytes().to_vec());
        profile.sample_type.push(pprof::proto::ValueType {
            r#type: at,
            unit: at + 1,
        });
        for sample in &mut profile.sample {
            let first = sample.value[0];
            sample.value.push(first);
        }
    }
    let (status, text) = post(
        &agg,
        &[("name", "heap"), ("format", "pprof")],
        &[],
        profile.encode_to_vec(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(
        text.starts_with("stored all but 1 series; refused:\nseries 2 (too_many_series): "),
        "{text}"
    );
    assert!(text.contains("ingest.max-series-per-request (2)"), "{text}");

    // /ingest: new series until the tenant has four active, then 429; an active one still goes
    // in.
    let (status, text) = post(&agg, &[("name", "d.cpu")], &[], "main;x 1").await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, ""));
    let (status, text) = post(&agg, &[("name", "g.cpu")], &[], "main;x 1").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
    assert!(
        text.contains("has 4 active series, its limit (ingest.max-active-series-per-tenant)"),
        "{text}"
    );
    let (status, _) = post(&agg, &[("name", "d.cpu")], &[], "main;x 1").await;
    assert_eq!(status, StatusCode::OK);

    let dropped = |reason: &'static str| {
        let agg = &agg;
        async move {
            metric(
                agg,
                "smolder_aggregator_dropped_series_total",
                &[("stage", "ingest"), ("reason", reason)],
            )
            .await
        }
    };
    assert_eq!(dropped("label_too_long").await, 1.0);
    assert_eq!(dropped("too_many_series").await, 2.0);
    assert_eq!(dropped("tenant_series_limit").await, 1.0);
    agg.stop().await;
}

/// The data directory's filesystem is reported from the first retention pass on, which runs at
/// start: free space for the disk alerts (monitoring/prometheus/smolder-rules.yml).
#[tokio::test]
async fn reports_the_data_directory_filesystem() {
    let agg = Aggregator::start().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (mut free, mut size) = (0.0, 0.0);
    while std::time::Instant::now() < deadline && size == 0.0 {
        // Size first: the loop sets free, then size, so a size means free is there too.
        size = metric(&agg, "smolder_aggregator_store_filesystem_size_bytes", &[]).await;
        free = metric(&agg, "smolder_aggregator_store_filesystem_free_bytes", &[]).await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(size > 0.0, "no filesystem size reported");
    assert!(free > 0.0 && free <= size, "free {free} of {size}");
}
