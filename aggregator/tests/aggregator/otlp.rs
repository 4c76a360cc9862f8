//! OTLP profiles from a real client: PyPI's `opentelemetry-proto` classes (the release whose
//! `profiles/v1development` is opentelemetry-proto v1.10) build and send the requests
//! (`aggregator/tests/clients/otlp_export.py`), over HTTP as protobuf, JSON and gzip, and
//! twenty malformed ones, each refused with 400 or 413 and nothing of it stored. Samples with a
//! span link are span profiles.

use std::path::Path;

use serde_json::Value;
use smolder_aggregator::config::Config;
use smolder_common::querier::{SelectMergeSpanProfileRequest, SelectMergeSpanProfileResponse};

use crate::grafana::call;
use crate::util::Aggregator;

/// Runs the Python client against `agg` (over gRPC with `mode` `grpc`) and returns its report.
async fn export(agg: &Aggregator, prefix: &str, mode: &str) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/otlp_export.py");
    let url = agg.url("");
    let (prefix, mode) = (prefix.to_owned(), mode.to_owned());
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .arg(url)
            .arg(prefix)
            .args((!mode.is_empty()).then_some(mode))
            .output()
            .expect("python3 runs (scripts/test installs opentelemetry-proto)")
    })
    .await
    .expect("joined");
    assert!(
        output.status.success(),
        "the client failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the client prints json")
}

/// The 30 samples of `service` linked to span `0000000000000009` are that span's profile, in
/// `/render` and in `SelectMergeSpanProfile` (3e8 ns at 100 Hz); another span has none.
async fn assert_span_profile(agg: &Aggregator, service: &str, case: &str) {
    let render = |span: &'static str| {
        let query = format!("{service}.cpu{{}}");
        async move {
            agg.http
                .get(agg.url("/render"))
                .query(&[
                    ("query", query.as_str()),
                    ("from", "now-1h"),
                    ("until", "now+1m"),
                    ("format", "collapsed"),
                    ("spanSelector", span),
                ])
                .send()
                .await
                .expect("render")
                .text()
                .await
                .expect("text")
        }
    };
    assert_eq!(render("0000000000000009").await, "main;work 30\n", "{case}");
    assert_eq!(render("0000000000000008").await, "", "{case}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64;
    let answer: SelectMergeSpanProfileResponse = call(
        agg,
        "SelectMergeSpanProfile",
        &SelectMergeSpanProfileRequest {
            profile_type_id: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
            label_selector: format!("{{service_name=\"{service}\"}}"),
            span_selector: vec!["0000000000000009".into()],
            start: now - 3_600_000,
            end: now + 60_000,
            ..Default::default()
        },
    )
    .await;
    let flamegraph = answer.flamegraph.expect("a flame graph");
    assert_eq!(flamegraph.total, 300_000_000, "{case}");
    assert_eq!(flamegraph.names, ["total", "main", "work"], "{case}");
}

#[tokio::test]
async fn opentelemetry_proto_requests_are_stored_and_bad_ones_refused() {
    let mut config = Config::default();
    config.ingest.max_body_bytes = 1 << 20;
    config.ingest.max_decompressed_bytes = 4 << 20;
    let agg = Aggregator::with_config(config).await;
    let report = export(&agg, "otel", "").await;
    for kind in ["proto", "json", "gzip"] {
        assert_eq!(report["valid"][kind], 200, "{kind}: {report}");
        let service = format!("otel-{kind}");
        // 30 samples of main;work in a thread and a span, 10 through an unsymbolized frame.
        assert_eq!(
            agg.collapsed(&format!("{service}.cpu{{}}")).await,
            "main;work 30\nmain;work;libfoo.so+0x234 10",
            "{kind}"
        );
        assert_eq!(
            agg.collapsed(&format!("{service}.cpu{{thread.name=\"worker\"}}"))
                .await,
            "main;work 30",
            "{kind}"
        );
        let metadata = agg.metadata(&format!("{service}.cpu{{}}")).await;
        assert_eq!(metadata["sampleRate"], 100, "{kind}");
        assert_eq!(metadata["units"], "samples", "{kind}");
        assert_span_profile(&agg, &service, kind).await;
    }
    let refused = report["malformed"].as_object().expect("malformed statuses");
    assert_eq!(refused.len(), 22, "{report}");
    for (name, status) in refused {
        let status = status.as_u64().expect("a status");
        let expected: &[u64] = if name == "oversize" || name == "gzip bomb" {
            &[413]
        } else {
            &[400]
        };
        assert!(expected.contains(&status), "{name}: {status}");
    }
    let apps: Vec<String> = agg
        .http
        .get(agg.url("/label-values"))
        .query(&[("label", "__name__")])
        .send()
        .await
        .expect("label values")
        .json()
        .await
        .expect("json");
    assert_eq!(
        apps,
        ["otel-gzip.cpu", "otel-json.cpu", "otel-proto.cpu"],
        "nothing malformed stored"
    );
}

#[tokio::test]
async fn grpcio_exports_over_h2c_on_the_http_port() {
    let agg = Aggregator::start().await;
    let report = export(&agg, "otel", "grpc").await;
    assert_eq!(report["valid"]["grpc"], "OK", "{report}");
    assert_eq!(report["valid"]["grpc gzip"], "OK", "{report}");
    for (name, code) in report["malformed"].as_object().expect("malformed codes") {
        assert_eq!(code, "INVALID_ARGUMENT", "{name}");
    }
    for service in ["otel-grpc", "otel-grpcgz"] {
        assert_eq!(
            agg.collapsed(&format!("{service}.cpu{{}}")).await,
            "main;work 30\nmain;work;libfoo.so+0x234 10",
            "{service}"
        );
        assert_span_profile(&agg, service, service).await;
    }
    let apps: Vec<String> = agg
        .http
        .get(agg.url("/label-values"))
        .query(&[("label", "__name__")])
        .send()
        .await
        .expect("label values")
        .json()
        .await
        .expect("json");
    assert_eq!(
        apps,
        ["otel-grpc.cpu", "otel-grpcgz.cpu"],
        "nothing malformed stored"
    );
}
