//! Each Pyroscope SDK's upload, byte for byte as the SDK sends it (method, path, query
//! parameters and their units, headers, multipart field names and filenames, gzip), read back
//! through `/render`. The upstream file each shape comes from is named on each test.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::Message;
use reqwest::StatusCode;
use smolder_common::pprof::{self, EncodeOptions, Period};

use crate::util::{Aggregator, gzip, tree, wire};

fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
}

pub(crate) fn push_body(labels: &[(&str, &str)], raw_profile: Vec<u8>) -> Vec<u8> {
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
                raw_profile,
                id: "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0".to_owned(),
            }],
        }],
    }
    .encode_to_vec()
}

/// A CPU profile as pyroscope-rs encodes it (`src/encode/pprof.rs`): one sample type
/// `cpu`/`nanoseconds`, period `1e9 / rate` ns, each value `count × period`, `time_nanos` and
/// `duration_nanos` of the 10 s window.
pub(crate) fn pyroscope_rs_cpu(stacks: &[(&str, u64)], rate: u32) -> Vec<u8> {
    let period = 1_000_000_000 / i64::from(rate);
    let scaled: Vec<(&str, u64)> = stacks
        .iter()
        .map(|(stack, count)| (*stack, count * period as u64))
        .collect();
    let until = now().as_secs() as i64;
    let options = EncodeOptions {
        period: Some(Period {
            kind: "cpu".to_owned(),
            unit: "nanoseconds".to_owned(),
            value: period,
        }),
        time_nanos: (until - 10) * 1_000_000_000,
        duration_nanos: 10_000_000_000,
        ..EncodeOptions::new("cpu", "nanoseconds")
    };
    pprof::encode(&tree(&scaled), &options).to_bytes(false)
}

/// Python (`pyroscope-io`), Ruby (`pyroscope` gem) and Rust all upload through pyroscope-rs'
/// session (`grafana/pyroscope-rs:src/session.rs`, `push`): `POST <server>/push.v1.PusherService/
/// Push`, the whole `PushRequest` gzipped, `Content-Type: application/proto`,
/// `Content-Encoding: gzip`, `User-Agent: pyroscope-rs/<spy> reqwest`, basic auth,
/// `X-Scope-OrgID`, no `Connect-Protocol-Version`; labels `service_name`, `__name__=process_cpu`
/// and the user's tags (dotted ones included, `tests/session.rs` checks `process.runtime.name`).
#[tokio::test]
async fn pyroscope_rs_push_from_python_ruby_and_rust_is_stored_as_cpu_samples() {
    let agg = Aggregator::start().await;
    let profile = pyroscope_rs_cpu(&[("main;work", 30), ("main;idle", 2)], 100);
    let body = gzip(&push_body(
        &[
            ("service_name", "py.checkout"),
            ("__name__", "process_cpu"),
            ("env", "prod"),
            ("process.runtime.name", "cpython"),
        ],
        profile,
    ));
    let response = agg
        .http
        .post(agg.url("/push.v1.PusherService/Push"))
        .header("User-Agent", "pyroscope-rs/pyspy reqwest")
        .header("Content-Type", "application/proto")
        .header("Content-Encoding", "gzip")
        .basic_auth("123456", Some("glc_token"))
        .header("X-Scope-OrgID", "tenant-1")
        .body(body)
        .send()
        .await
        .expect("POST push");
    let status = response.status();
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        response.text().await.unwrap_or_default()
    );
    let query = "py.checkout.cpu{env=\"prod\",process.runtime.name=\"cpython\"}";
    assert_eq!(
        agg.collapsed(query).await,
        "main;idle 2\nmain;work 30",
        "nanoseconds become sample counts"
    );
    let meta = agg.metadata(query).await;
    assert_eq!(meta["sampleRate"], 100, "{meta}");
    assert_eq!(meta["units"], "samples", "{meta}");
    agg.stop().await;
}

/// The Node.js SDK (`grafana/pyroscope-nodejs:src/pyroscope-api-exporter.ts`,
/// `src/utils/build-profile-multipart-body.ts`, `src/utils/date-to-unix-timestamp.ts`):
/// `POST <server>/ingest?from=<unix s>&name=<app>&spyName=nodespy&until=<unix s>&sampleRate=<Hz>`,
/// a multipart form with one part `profile` (filename `profile`, `application/octet-stream`),
/// a gzipped pprof whose V8 types are renamed to Go's (`sample` → `samples`,
/// `src/utils/process-profile.ts`) beside `wall`/`microseconds`; `Authorization: Bearer` or
/// `Basic`, `X-Scope-OrgID`. No `format`, no `sample_type_config`.
#[tokio::test]
async fn nodejs_multipart_wall_profile_is_stored_as_cpu() {
    let agg = Aggregator::start().await;
    // Node's wall profile: `samples`/`count` and `wall`/`microseconds`, 10 ms period.
    let wall = pprof::encode(
        &tree(&[("(program);main.js:handler:12", 40)]),
        &EncodeOptions {
            period: Some(Period {
                kind: "wall".to_owned(),
                unit: "microseconds".to_owned(),
                value: 10_000,
            }),
            ..EncodeOptions::new("samples", "count")
        },
    );
    let mut wall = wall;
    // Add the second sample type with each value × 10 000 µs, as V8's wall profile has it.
    let wall_type = wall.string_table.len() as i64;
    wall.string_table.push(b"wall".to_vec());
    wall.string_table.push(b"microseconds".to_vec());
    wall.sample_type.push(pprof::proto::ValueType {
        r#type: wall_type,
        unit: wall_type + 1,
    });
    for sample in &mut wall.sample {
        let count = sample.value[0];
        sample.value.push(count * 10_000);
    }
    let content = gzip(&wall.encode_to_vec());
    let boundary = "----pyroscope0123456789abcdef0123456789abcdef";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"profile\"; \
         filename=\"profile\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(&content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let until = now().as_secs();
    let response = agg
        .http
        .post(agg.url("/ingest"))
        .query(&[
            ("from", (until - 10).to_string().as_str()),
            ("name", "node.api{env=prod,service.namespace=shop}"),
            ("spyName", "nodespy"),
            ("until", until.to_string().as_str()),
            ("sampleRate", "100"),
        ])
        .header(
            "Content-Type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .header("authorization", "Bearer glc_token")
        .header("X-Scope-OrgID", "tenant-1")
        .body(body)
        .send()
        .await
        .expect("POST /ingest");
    let status = response.status();
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        response.text().await.unwrap_or_default()
    );
    let query = "node.api.cpu{env=\"prod\",service.namespace=\"shop\"}";
    assert_eq!(
        agg.collapsed(query).await,
        "(program);main.js:handler:12 40",
        "the samples series only: wall time is the same stacks again"
    );
    assert_eq!(agg.metadata(query).await["spyName"], "nodespy");
    agg.stop().await;
}

/// The .NET profiler since 0.14 (`grafana/pyroscope-dotnet`, `PyroscopePprofSink::upload`):
/// a binary Connect push of one series, labels `__name__=process_cpu`, `service_name`,
/// `spy_name=dotnetspy`, dotted `otel.scope.name` / `process.runtime.name` and the user's tags;
/// the pprof has `cpu`/`nanoseconds` (and `wall`, alloc, lock, exception types).
#[tokio::test]
async fn dotnet_push_cpu_nanoseconds_is_stored_as_cpu_samples() {
    let agg = Aggregator::start().await;
    let profile = pyroscope_rs_cpu(&[("Program.Main;Worker.Run", 7)], 100);
    let body = push_body(
        &[
            ("__name__", "process_cpu"),
            ("service_name", "dotnet-app"),
            ("spy_name", "dotnetspy"),
            ("otel.scope.name", "com.grafana.pyroscope/dotnet"),
            ("process.runtime.name", ".NET"),
            ("env", "e2e"),
        ],
        profile,
    );
    let response = agg
        .http
        .post(agg.url("/push.v1.PusherService/Push"))
        .header("Content-Type", "application/proto")
        .header("Authorization", "Bearer glc_token")
        .body(body)
        .send()
        .await
        .expect("POST push");
    let status = response.status();
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        response.text().await.unwrap_or_default()
    );
    assert_eq!(
        agg.collapsed(
            "dotnet-app.cpu{otel.scope.name=\"com.grafana.pyroscope/dotnet\",env=\"e2e\"}"
        )
        .await,
        "Program.Main;Worker.Run 7"
    );
    agg.stop().await;
}

/// Java agents with `PYROSCOPE_FORMAT=collapsed` (`grafana/pyroscope-java:agent/src/main/java/
/// io/pyroscope/javaagent/impl/PyroscopeExporter.java`, versions that have `Format.COLLAPSED`):
/// `POST <server>/ingest?name=<app>.<event>{labels}&units=samples&aggregationType=sum&
/// sampleRate=100&from=<unix s>&until=<unix s>&spyName=javaspy`, the folded text as the raw
/// body with no `Content-Type` and no `format`; basic auth and `X-Scope-OrgID`.
#[tokio::test]
async fn java_collapsed_upload_is_stored() {
    let agg = Aggregator::start().await;
    let until = now().as_secs();
    let response = agg
        .http
        .post(agg.url("/ingest"))
        .query(&[
            ("name", "java.shop.itimer{env=prod,k8s.pod.name=web-1}"),
            ("units", "samples"),
            ("aggregationType", "sum"),
            ("sampleRate", "100"),
            ("from", (until - 10).to_string().as_str()),
            ("until", until.to_string().as_str()),
            ("spyName", "javaspy"),
        ])
        .basic_auth("123456", Some("glc_token"))
        .header("X-Scope-OrgID", "tenant-1")
        .body("java/lang/Thread.run;com/shop/Cart.total 12\n")
        .send()
        .await
        .expect("POST /ingest");
    let status = response.status();
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        response.text().await.unwrap_or_default()
    );
    assert_eq!(
        agg.collapsed("java.shop.itimer{k8s.pod.name=\"web-1\"}")
            .await,
        "java/lang/Thread.run;com/shop/Cart.total 12"
    );
    agg.stop().await;
}

/// A JDK flight recording of a program that spends about two seconds in `Burn.spin`, as the
/// agent's async-profiler would send (the same event types and pools), recorded in a temp dir.
fn record_burn() -> Vec<u8> {
    const BURN: &str = "public class Burn {
        static long spin(long n) {
            long x = 0;
            for (long i = 0; i < n; i++) { x += (i * 31) ^ (x >>> 3); }
            return x;
        }
        public static void main(String[] args) {
            long end = System.nanoTime() + 2_000_000_000L;
            long sum = 0;
            while (System.nanoTime() < end) { sum += spin(1_000_000); }
            System.out.println(sum);
        }
    }";
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("Burn.java"), BURN).expect("write Burn.java");
    let run = |program: &str, args: &[&str]| {
        let output = std::process::Command::new(program)
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap_or_else(|err| {
                panic!(
                    "cannot run {program} ({err}): install openjdk-17-jdk-headless \
                     (scripts/test installs it)"
                )
            });
        assert!(
            output.status.success(),
            "{program} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    run("javac", &["Burn.java"]);
    let recording = dir.path().join("rec.jfr");
    let option = format!(
        "-XX:StartFlightRecording=filename={},settings=profile",
        recording.display()
    );
    run("java", &[&option, "Burn"]);
    std::fs::read(&recording).expect("read rec.jfr")
}

/// The Java agent's default (`PyroscopeExporter.java`): `format=jfr`, a multipart form with a
/// gzipped `jfr` part (filename `jfr`) and a `labels` part (filename `labels`,
/// `application/x-protobuf`, here an empty `LabelsSnapshot`, which Smolder does not read yet).
/// The recording's execution samples are stored under `<app>.cpu` with `name`'s labels.
#[tokio::test]
async fn java_jfr_default_upload_is_stored() {
    let recording = tokio::task::spawn_blocking(record_burn)
        .await
        .expect("recording task");
    let agg = Aggregator::start().await;
    let boundary = "5f0a4d2b-7c1e-4f3a-9b8d-0e6c2a1f3b4d";
    let mut body = Vec::new();
    for (name, ct, data) in [
        ("jfr", "application/octet-stream", gzip(&recording)),
        ("labels", "application/x-protobuf", gzip(b"")),
    ] {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; \
                 filename=\"{name}\"\r\nContent-Type: {ct}\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(&data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    let until = now().as_secs();
    let response = agg
        .http
        .post(agg.url("/ingest"))
        .query(&[
            ("name", "java.shop{env=prod}"),
            ("units", "samples"),
            ("aggregationType", "sum"),
            ("from", (until - 10).to_string().as_str()),
            ("until", until.to_string().as_str()),
            ("spyName", "javaspy"),
            ("sampleRate", "100"),
            ("format", "jfr"),
        ])
        .header(
            "Content-Type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .header("Authorization", "Bearer glc_token")
        .body(body)
        .send()
        .await
        .expect("POST /ingest");
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    assert_eq!(status, StatusCode::OK, "{text}");
    let collapsed = agg.collapsed("java.shop.cpu{env=\"prod\"}").await;
    let spin: u64 = collapsed
        .lines()
        .filter_map(|line| line.strip_prefix("Burn.main;Burn.spin "))
        .filter_map(|count| count.parse::<u64>().ok())
        .sum();
    assert!(spin > 50, "Burn.spin has {spin} samples:\n{collapsed}");
    let metadata = agg.metadata("java.shop.cpu{env=\"prod\"}").await;
    assert_eq!(metadata["units"], "samples", "{metadata}");
    assert_eq!(metadata["sampleRate"], 100, "{metadata}");
    agg.stop().await;
}
