//! Refusals: every client mistake on `/ingest` and the Connect push answered with the right
//! 4xx, a message naming it, and nothing stored.

use super::*;

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
