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

fn push_request(labels: &[(&str, &str)], profile: Vec<u8>) -> wire::PushRequest {
    wire::PushRequest {
        series: vec![wire::RawProfileSeries {
            labels: labels
                .iter()
                .map(|(name, value)| wire::LabelPair {
                    name: (*name).to_owned(),
                    value: (*value).to_owned(),
                })
                .collect(),
            samples: vec![wire::RawSample {
                raw_profile: profile,
                id: "5f0c7c4e-4a3b-4f0e-9d1a-2b8c6d7e8f90".to_owned(),
            }],
        }],
    }
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
    let request = push_request(&labels, cpu_pprof(&[("main;pay", 4)], 100, true));
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

/// One bad request: what is sent, and what must come back.
struct Bad {
    what: &'static str,
    path: &'static str,
    query: Vec<(&'static str, &'static str)>,
    headers: Vec<(&'static str, &'static str)>,
    body: Vec<u8>,
    status: StatusCode,
    says: &'static str,
}

fn bad(
    what: &'static str,
    query: &[(&'static str, &'static str)],
    body: impl Into<Vec<u8>>,
    status: StatusCode,
    says: &'static str,
) -> Bad {
    Bad {
        what,
        path: "/ingest",
        query: query.to_vec(),
        headers: Vec::new(),
        body: body.into(),
        status,
        says,
    }
}

impl Bad {
    fn header(mut self, name: &'static str, value: &'static str) -> Bad {
        self.headers.push((name, value));
        self
    }

    fn push(mut self) -> Bad {
        self.path = "/push.v1.PusherService/Push";
        self
    }
}

#[tokio::test]
async fn bad_input_is_a_4xx_naming_the_problem_and_stores_nothing() {
    let mut config = Config::default();
    config.ingest.max_body_bytes = 4096;
    config.ingest.max_decompressed_bytes = 64 << 10;
    let agg = Aggregator::with_config(config).await;

    const BAD_REQUEST: StatusCode = StatusCode::BAD_REQUEST;
    const UNPROCESSABLE: StatusCode = StatusCode::UNPROCESSABLE_ENTITY;
    const TOO_LARGE: StatusCode = StatusCode::PAYLOAD_TOO_LARGE;
    const UNSUPPORTED: StatusCode = StatusCode::UNSUPPORTED_MEDIA_TYPE;
    let name = ("name", "shop.cpu");
    let pprof_format = ("format", "pprof");
    let form_type = "multipart/form-data; boundary=b0undary";
    let mut truncated = cpu_pprof(&[("main;work", 3)], 100, false);
    truncated.truncate(truncated.len() / 2);
    let truncated: &'static [u8] = truncated.leak();
    let good: &'static [u8] = cpu_pprof(&[("main;work", 3)], 100, true).leak();
    let bomb = gzip(&vec![b'a'; 1 << 20]);
    let pprof_bomb = gzip(&vec![0u8; 1 << 20]);
    let push_json = |labels: &str, raw: &str| {
        format!(r#"{{"series":[{{"labels":{labels},"samples":[{{"rawProfile":"{raw}"}}]}}]}}"#)
    };
    let good_b64 = STANDARD.encode(good);
    let truncated_b64 = STANDARD.encode(truncated);
    let service = r#"[{"name":"service_name","value":"shop"}]"#;

    let cases = vec![
        bad(
            "missing name",
            &[],
            "a;b 1",
            BAD_REQUEST,
            "missing required query parameter name",
        ),
        bad(
            "empty name",
            &[("name", "")],
            "a;b 1",
            BAD_REQUEST,
            "missing required query parameter name",
        ),
        bad(
            "bad app name",
            &[("name", "shop cpu{")],
            "a;b 1",
            BAD_REQUEST,
            "invalid name",
        ),
        bad(
            "bad label name",
            &[("name", "shop.cpu{a-b=1}")],
            "a;b 1",
            BAD_REQUEST,
            "invalid name",
        ),
        bad(
            "duplicate label",
            &[("name", "shop.cpu{a=1,a=2}")],
            "a;b 1",
            BAD_REQUEST,
            "invalid name",
        ),
        bad(
            "bad from",
            &[name, ("from", "yesterday")],
            "a;b 1",
            BAD_REQUEST,
            "invalid from",
        ),
        bad(
            "bad until",
            &[name, ("until", "now-5")],
            "a;b 1",
            BAD_REQUEST,
            "invalid until",
        ),
        bad(
            "until before from",
            &[name, ("from", "now"), ("until", "now-1h")],
            "a;b 1",
            BAD_REQUEST,
            "is before from",
        ),
        bad(
            "too many labels",
            &[(
                "name",
                Box::leak(
                    format!(
                        "app.cpu{{{}}}",
                        (0..31)
                            .map(|i| format!("l{i}=v"))
                            .collect::<Vec<_>>()
                            .join(",")
                    )
                    .into_boxed_str(),
                ),
            )],
            "a;b 1",
            UNPROCESSABLE,
            "more than ingest.max-labels-per-series (30)",
        ),
        bad(
            "label value too long",
            &[(
                "name",
                Box::leak(format!("app.cpu{{k={}}}", "v".repeat(2000)).into_boxed_str()),
            )],
            "a;b 1",
            UNPROCESSABLE,
            "longer than ingest.max-label-bytes (1024)",
        ),
        bad(
            "profile from the future",
            &[name, ("from", "now+1h"), ("until", "now+1h")],
            "a;b 1",
            BAD_REQUEST,
            "more than 600 s after the aggregator's clock",
        ),
        bad(
            "profile older than the retention",
            &[name, ("from", "now-60d"), ("until", "now-60d")],
            "a;b 1",
            BAD_REQUEST,
            "older than the retention (store.retention",
        ),
        bad(
            "zero sampleRate",
            &[name, ("sampleRate", "0")],
            "a;b 1",
            BAD_REQUEST,
            "invalid sampleRate",
        ),
        bad(
            "text sampleRate",
            &[name, ("sampleRate", "fast")],
            "a;b 1",
            BAD_REQUEST,
            "invalid sampleRate",
        ),
        bad(
            "negative sampleRate",
            &[name, ("sampleRate", "-100")],
            "a;b 1",
            BAD_REQUEST,
            "invalid sampleRate",
        ),
        bad(
            "bad aggregationType",
            &[name, ("aggregationType", "max")],
            "a;b 1",
            BAD_REQUEST,
            "invalid aggregationType",
        ),
        bad(
            "unknown format",
            &[name, ("format", "groups")],
            "a;b 1",
            BAD_REQUEST,
            "unknown format \"groups\"; supported formats: folded, lines, pprof",
        ),
        bad(
            "jfr that is not a recording",
            &[name, ("format", "jfr")],
            "a;b 1",
            UNPROCESSABLE,
            "invalid jfr body: not a JFR recording: no FLR magic at offset 0",
        ),
        bad(
            "trie",
            &[name, ("format", "trie")],
            "a;b 1",
            BAD_REQUEST,
            "format trie is not supported",
        ),
        bad(
            "speedscope",
            &[name, ("format", "speedscope")],
            "{}",
            BAD_REQUEST,
            "format speedscope is not supported",
        ),
        bad(
            "body over cap",
            &[name],
            vec![b'x'; 5000],
            TOO_LARGE,
            "limit of 4096 bytes (ingest.max-body-bytes)",
        ),
        bad(
            "gzip bomb",
            &[name],
            bomb,
            TOO_LARGE,
            "limit of 65536 bytes (ingest.max-decompressed-bytes)",
        )
        .header("content-encoding", "gzip"),
        bad(
            "bad gzip",
            &[name],
            "a;b 1\n",
            BAD_REQUEST,
            "invalid gzip body",
        )
        .header("content-encoding", "gzip"),
        bad(
            "truncated gzip",
            &[name],
            gzip(b"a;b 1\n")[..15].to_vec(),
            BAD_REQUEST,
            "invalid gzip body",
        )
        .header("content-encoding", "gzip"),
        bad(
            "unknown encoding",
            &[name],
            "a;b 1\n",
            UNSUPPORTED,
            "unsupported Content-Encoding \"br\"",
        )
        .header("content-encoding", "br"),
        bad(
            "folded line without count",
            &[name],
            "a;b 1\nmain;work\n",
            UNPROCESSABLE,
            "line 2: no count",
        ),
        bad(
            "negative count",
            &[name],
            "a;b -5\n",
            UNPROCESSABLE,
            "line 1: count \"-5\" is negative",
        ),
        bad(
            "count not a number",
            &[name],
            "a;b 1\na;c 1x\n",
            UNPROCESSABLE,
            "line 2: count \"1x\"",
        ),
        bad(
            "lines not utf-8",
            &[name, ("format", "lines")],
            b"a;\xff\n".to_vec(),
            UNPROCESSABLE,
            "line 1: invalid UTF-8",
        ),
        bad(
            "truncated pprof",
            &[name, pprof_format],
            truncated,
            UNPROCESSABLE,
            "invalid pprof body: invalid pprof protobuf",
        ),
        bad(
            "folded text as pprof",
            &[name, pprof_format],
            "a;b 1\n",
            UNPROCESSABLE,
            "invalid pprof body",
        ),
        bad(
            "pprof gzip bomb",
            &[name, pprof_format],
            pprof_bomb,
            TOO_LARGE,
            "larger than the limit of 65536 bytes",
        ),
        bad(
            "multipart without boundary",
            &[name],
            form("b0undary", &[("profile", good)]),
            UNPROCESSABLE,
            "invalid multipart form",
        )
        .header("content-type", "multipart/form-data"),
        bad(
            "multipart cut short",
            &[name],
            form("b0undary", &[("profile", good)])[..40].to_vec(),
            UNPROCESSABLE,
            "invalid multipart form",
        )
        .header("content-type", form_type),
        bad(
            "multipart without profile",
            &[name],
            form("b0undary", &[("prev_profile", good)]),
            UNPROCESSABLE,
            "no profile field (fields sent: prev_profile)",
        )
        .header("content-type", form_type),
        bad(
            "bad sample_type_config",
            &[name],
            form(
                "b0undary",
                &[("profile", good), ("sample_type_config", b"{not json")],
            ),
            UNPROCESSABLE,
            "invalid sample_type_config field",
        )
        .header("content-type", form_type),
        bad(
            "unknown aggregation in sample_type_config",
            &[name],
            form(
                "b0undary",
                &[
                    ("profile", good),
                    (
                        "sample_type_config",
                        br#"{"samples":{"aggregation":"max"}}"#,
                    ),
                ],
            ),
            UNPROCESSABLE,
            "unknown aggregation \"max\"",
        )
        .header("content-type", form_type),
        bad(
            "truncated prev_profile",
            &[name],
            form(
                "b0undary",
                &[("profile", good), ("prev_profile", truncated)],
            ),
            UNPROCESSABLE,
            "invalid prev_profile field",
        )
        .header("content-type", form_type),
        bad(
            "push with text/plain",
            &[],
            "{}",
            UNSUPPORTED,
            "unsupported Content-Type \"text/plain\"",
        )
        .push()
        .header("content-type", "text/plain"),
        bad(
            "push without content type",
            &[],
            "{}",
            UNSUPPORTED,
            "unsupported Content-Type",
        )
        .push(),
        bad(
            "push bad json",
            &[],
            "{\"series\": [",
            BAD_REQUEST,
            "invalid push request",
        )
        .push()
        .header("content-type", "application/json"),
        bad(
            "push bad base64",
            &[],
            push_json(service, "%%%"),
            BAD_REQUEST,
            "series[0].samples[0].rawProfile is not base64",
        )
        .push()
        .header("content-type", "application/json"),
        bad(
            "push without service_name",
            &[],
            push_json(r#"[{"name":"__name__","value":"process_cpu"}]"#, &good_b64),
            BAD_REQUEST,
            "series 0 has no service_name label",
        )
        .push()
        .header("content-type", "application/json"),
        bad(
            "push truncated profile",
            &[],
            push_json(service, &truncated_b64),
            BAD_REQUEST,
            "invalid series[0].samples[0].rawProfile",
        )
        .push()
        .header("content-type", "application/json"),
        bad(
            "push bad proto",
            &[],
            vec![0x0a, 0x05, 0x01],
            BAD_REQUEST,
            "invalid push request",
        )
        .push()
        .header("content-type", "application/proto"),
        bad(
            "push over cap",
            &[],
            vec![b'x'; 5000],
            TOO_LARGE,
            "ingest.max-body-bytes",
        )
        .push()
        .header("content-type", "application/proto"),
    ];
    assert!(cases.len() >= 20);

    for case in &cases {
        let mut request = agg
            .http
            .post(agg.url(case.path))
            .query(&case.query)
            .body(case.body.clone());
        for (name, value) in &case.headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("request");
        let status = response.status();
        let text = response.text().await.expect("response text");
        assert_eq!(status, case.status, "{}: {text}", case.what);
        // Connect errors carry the message in JSON; `/ingest` answers plain text.
        let message = if case.path == "/ingest" {
            text
        } else {
            let json: serde_json::Value = serde_json::from_str(&text)
                .unwrap_or_else(|err| panic!("{}: not a Connect error ({err}): {text}", case.what));
            assert!(json["code"].is_string(), "{}: {json}", case.what);
            json["message"].as_str().unwrap_or_default().to_owned()
        };
        assert!(
            message.contains(case.says),
            "{}: expected the answer to say {:?}, got {message:?}",
            case.what,
            case.says
        );
    }

    assert_eq!(stored(&agg).await, 0.0, "nothing is stored");
    // Its series appear with the first profile stored; the tests above read them by name.
    assert_eq!(
        Metrics::scrape(&agg.url("/metrics"))
            .await
            .find("smolder_aggregator_ingest_profiles_total", &[]),
        None
    );
    assert_eq!(
        metric(&agg, "smolder_aggregator_errors_total", &[]).await,
        cases.len() as f64,
        "every rejection is counted"
    );
    assert_eq!(
        metric(
            &agg,
            "smolder_aggregator_errors_total",
            &[("error_type", "body_too_large"), ("stage", "ingest")]
        )
        .await,
        4.0
    );
    let labels = agg
        .http
        .get(agg.url("/label-values"))
        .query(&[("label", "__name__")])
        .send()
        .await
        .expect("GET /label-values")
        .text()
        .await
        .expect("label values");
    assert_eq!(labels.trim(), "[]", "no app was created");

    // The aggregator is still healthy after all that.
    let (status, _) = post(&agg, &[name], &[], "a;b 1\n").await;
    assert_eq!(status, StatusCode::OK);
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
