//! The query API Grafana speaks, over real HTTP: Connect `querier.v1` in binary protobuf and in
//! JSON, answered from profiles pushed through `/ingest`, with values exact against `/render`
//! of the same data (40 CPU samples at 100 Hz are 4×10^8 ns). Grafana's calls are made twice:
//! with Smolder's own message types, and by clients that are not Smolder's (connect-python and
//! Google's protobuf runtime over Pyroscope's own protos, `tests/clients/pyroscope-api/`,
//! compiled by grpcio-tools).

use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;
use reqwest::StatusCode;
use serde_json::{Value, json};
use smolder_common::pprof;
use smolder_common::querier::*;

use crate::util::{Aggregator, gzip, python};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// A 10 s-aligned unix time half an hour ago.
fn base() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    (now - 1800) / 10 * 10
}

async fn ingest(agg: &Aggregator, name: &str, at: u64, body: &str, rate: &str) {
    let (from, until) = (at.to_string(), (at + 10).to_string());
    let response = agg
        .http
        .post(agg.url("/ingest"))
        .query(&[
            ("name", name),
            ("from", &from),
            ("until", &until),
            ("sampleRate", rate),
        ])
        .body(body.to_owned())
        .send()
        .await
        .expect("ingest request");
    assert_eq!(response.status(), StatusCode::OK, "ingest {name}");
}

/// Calls `method` of `service` in binary protobuf, as Grafana's datasource does.
pub(crate) async fn call<Req: Message, Resp: Message + Default>(
    agg: &Aggregator,
    method: &str,
    request: &Req,
) -> Resp {
    let response = agg
        .http
        .post(agg.url(&format!("/querier.v1.QuerierService/{method}")))
        .header("content-type", "application/proto")
        .header("connect-protocol-version", "1")
        .body(request.encode_to_vec())
        .send()
        .await
        .expect("connect request");
    assert_eq!(response.status(), StatusCode::OK, "{method}");
    assert_eq!(response.headers()["content-type"], "application/proto");
    Resp::decode(response.bytes().await.expect("body")).expect("answer decodes")
}

/// Calls `method` in JSON, as the Profiles Drilldown app does; the status and the JSON answer.
async fn call_json(agg: &Aggregator, path: &str, request: Value) -> (StatusCode, Value) {
    let response = agg
        .http
        .post(agg.url(path))
        .header("content-type", "application/json")
        .body(request.to_string())
        .send()
        .await
        .expect("connect request");
    let status = response.status();
    let body = response.text().await.expect("body");
    (
        status,
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}")),
    )
}

#[tokio::test]
async fn grafana_calls_answer_in_nanoseconds() {
    let agg = Aggregator::start().await;
    let at = base();
    ingest(
        &agg,
        "checkout.cpu{region=eu}",
        at,
        "main;work 30\nmain;idle 10\n",
        "100",
    )
    .await;
    ingest(
        &agg,
        "checkout.cpu{region=us}",
        at + 10,
        "main;work 4\n",
        "100",
    )
    .await;
    ingest(
        &agg,
        "billing.alloc_space{region=eu}",
        at,
        "main;alloc 512\n",
        "100",
    )
    .await;
    let (start, end) = ((at as i64 - 60) * 1000, (at as i64 + 60) * 1000);

    let types: ProfileTypesResponse =
        call(&agg, "ProfileTypes", &ProfileTypesRequest { start, end }).await;
    let ids: Vec<&str> = types.profile_types.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["memory:alloc_space:bytes:space:bytes", CPU]);
    assert_eq!(types.profile_types[1].name, "process_cpu");

    let selector = r#"{service_name="checkout"}"#;
    let names: LabelNamesResponse = call(
        &agg,
        "LabelNames",
        &LabelNamesRequest {
            matchers: vec![selector.into()],
            start,
            end,
        },
    )
    .await;
    assert_eq!(
        names.names,
        ["__name__", "__profile_type__", "region", "service_name"]
    );
    let values: LabelValuesResponse = call(
        &agg,
        "LabelValues",
        &LabelValuesRequest {
            name: "service_name".into(),
            matchers: vec![],
            start,
            end,
        },
    )
    .await;
    assert_eq!(values.names, ["billing", "checkout"]);

    // 40 samples at 100 Hz in region eu, 4 in us: 4.4e8 ns in all.
    let merged: SelectMergeStacktracesResponse = call(
        &agg,
        "SelectMergeStacktraces",
        &SelectMergeStacktracesRequest {
            profile_type_id: CPU.into(),
            label_selector: selector.into(),
            start,
            end,
            max_nodes: Some(16),
            ..Default::default()
        },
    )
    .await;
    let flamegraph = merged.flamegraph.expect("a flame graph");
    assert_eq!(flamegraph.total, 440_000_000);
    assert_eq!(flamegraph.names[0], "total");
    let render: Value = agg
        .http
        .get(agg.url("/render"))
        .query(&[
            ("query", "checkout.cpu{}"),
            ("from", &(at - 60).to_string()),
            ("until", &(at + 60).to_string()),
        ])
        .send()
        .await
        .expect("render")
        .json()
        .await
        .expect("json");
    assert_eq!(render["flamebearer"]["numTicks"], 44);
    let ticks = render["flamebearer"]["numTicks"].as_i64().expect("ticks");
    let rate = render["metadata"]["sampleRate"].as_i64().expect("rate");
    assert_eq!(
        flamegraph.total,
        ticks * 1_000_000_000 / rate,
        "exact against /render"
    );

    let eu = r#"{service_name="checkout", region="eu"}"#;
    let series: SelectSeriesResponse = call(
        &agg,
        "SelectSeries",
        &SelectSeriesRequest {
            profile_type_id: CPU.into(),
            label_selector: selector.into(),
            start,
            end,
            group_by: vec!["region".into()],
            step: 10.0,
            ..Default::default()
        },
    )
    .await;
    let by_region: Vec<(String, Vec<(i64, f64)>)> = series
        .series
        .iter()
        .map(|s| {
            (
                s.labels[0].value.clone(),
                s.points.iter().map(|p| (p.timestamp, p.value)).collect(),
            )
        })
        .collect();
    let ms = |t: u64| (t * 1000) as i64;
    assert_eq!(
        by_region,
        [
            ("eu".to_owned(), vec![(ms(at), 4e8)]),
            ("us".to_owned(), vec![(ms(at + 10), 4e7)])
        ]
    );

    let profile: pprof::Profile = call(
        &agg,
        "SelectMergeProfile",
        &SelectMergeProfileRequest {
            profile_type_id: CPU.into(),
            label_selector: eu.into(),
            start,
            end,
            ..Default::default()
        },
    )
    .await;
    let total: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total, 400_000_000);
    let strings: Vec<String> = profile
        .string_table
        .iter()
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    assert_eq!(strings[profile.sample_type[0].r#type as usize], "cpu");
    assert_eq!(profile.period, 10_000_000);

    let diff: DiffResponse = call(
        &agg,
        "Diff",
        &DiffRequest {
            left: Some(SelectMergeStacktracesRequest {
                profile_type_id: CPU.into(),
                label_selector: eu.into(),
                start,
                end,
                ..Default::default()
            }),
            right: Some(SelectMergeStacktracesRequest {
                profile_type_id: CPU.into(),
                label_selector: r#"{service_name="checkout", region="us"}"#.into(),
                start,
                end,
                ..Default::default()
            }),
        },
    )
    .await;
    let diff = diff.flamegraph.expect("diff");
    assert_eq!(
        (diff.left_ticks, diff.right_ticks),
        (400_000_000, 40_000_000)
    );

    let stats: GetProfileStatsResponse =
        call(&agg, "GetProfileStats", &GetProfileStatsRequest {}).await;
    assert!(stats.data_ingested);
    assert_eq!(stats.oldest_profile_time, ms(at));
}

#[tokio::test]
async fn drilldown_json_calls_read_both_spellings() {
    let agg = Aggregator::start().await;
    let at = base();
    ingest(&agg, "ride.cpu{vehicle=car}", at, "main;drive 40\n", "100").await;
    let (start, end) = (
        ((at - 60) * 1000).to_string(),
        ((at + 60) * 1000).to_string(),
    );
    let path = "/querier.v1.QuerierService/SelectMergeStacktraces";
    for request in [
        json!({"profileTypeID": CPU, "labelSelector": "{service_name=\"ride\"}", "start": start, "end": end, "maxNodes": "100"}),
        json!({"profile_typeID": CPU, "label_selector": "{service_name=\"ride\"}", "start": at * 1000 - 60_000, "end": end, "format": "PROFILE_FORMAT_FLAMEGRAPH"}),
    ] {
        let (status, answer) = call_json(&agg, path, request).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["flamegraph"]["total"], "400000000");
        assert_eq!(
            answer["flamegraph"]["names"],
            json!(["total", "main", "drive"])
        );
        assert_eq!(
            answer["flamegraph"]["levels"][2]["values"],
            json!(["0", "400000000", "400000000", "2"])
        );
    }
    let (status, answer) = call_json(
        &agg,
        "/querier.v1.QuerierService/Series",
        json!({"matchers": ["{service_name=\"ride\"}"], "labelNames": ["service_name", "vehicle"], "start": start, "end": end}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        answer,
        json!({"labelsSet": [{"labels": [{"name": "service_name", "value": "ride"}, {"name": "vehicle", "value": "car"}]}]})
    );
    let (status, answer) = call_json(&agg, "/settings.v1.SettingsService/Get", json!({})).await;
    assert_eq!((status, answer), (StatusCode::OK, json!({"settings": []})));

    // The JSON request gzipped, as Connect clients may send it.
    let response = agg
        .http
        .post(agg.url("/querier.v1.QuerierService/LabelValues"))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(gzip(br#"{"name": "vehicle"}"#))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.json::<Value>().await.expect("json"),
        json!({"names": ["car"]})
    );
}

#[tokio::test]
async fn errors_have_connects_shape() {
    let agg = Aggregator::start().await;
    for (path, request, status, code, words) in [
        (
            "SelectMergeStacktraces",
            json!({"profileTypeID": "cpu", "labelSelector": "{}"}),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "invalid profile type",
        ),
        (
            "SelectMergeStacktraces",
            json!({"profileTypeID": CPU, "labelSelector": "{service_name=api}"}),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "label_selector",
        ),
        (
            "SelectHeatmap",
            json!({}),
            StatusCode::NOT_IMPLEMENTED,
            "unimplemented",
            "heatmaps",
        ),
        (
            "AnalyzeQuery",
            json!({}),
            StatusCode::NOT_IMPLEMENTED,
            "unimplemented",
            "query analysis",
        ),
        (
            "SelectMergeStacktraces",
            json!({"profileTypeID": CPU, "traceIdSelector": ["4bf92f3577b34da6a3ce929d0e0e4736"]}),
            StatusCode::NOT_IMPLEMENTED,
            "unimplemented",
            "trace",
        ),
        (
            "SelectMergeSpanProfile",
            json!({"profileTypeID": CPU, "spanSelector": ["9a517183f26a089"]}),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "span_selector",
        ),
        (
            "LabelNames",
            json!({"start": "x"}),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "invalid json request",
        ),
    ] {
        let (got, answer) =
            call_json(&agg, &format!("/querier.v1.QuerierService/{path}"), request).await;
        assert_eq!(got, status, "{path}: {answer}");
        assert_eq!(answer["code"], code, "{path}");
        let message = answer["message"].as_str().expect("message");
        assert!(message.contains(words), "{path}: {message}");
    }
    let response = agg
        .http
        .post(agg.url("/querier.v1.QuerierService/ProfileTypes"))
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        response.json::<Value>().await.expect("json")["code"],
        "invalid_argument"
    );
}

#[tokio::test]
async fn pyroscope_render_reads_v1_queries() {
    let agg = Aggregator::start().await;
    let at = base();
    ingest(&agg, "ride.cpu{vehicle=car}", at, "main;drive 40\n", "100").await;
    ingest(&agg, "ride.cpu{vehicle=bike}", at, "main;pedal 4\n", "100").await;
    let answer: Value = agg
        .http
        .get(agg.url("/pyroscope/render"))
        .query(&[
            (
                "query",
                format!(r#"{CPU}{{service_name="ride", vehicle="car"}}"#),
            ),
            ("from", (at - 60).to_string()),
            ("until", (at + 60).to_string()),
            ("max-nodes", "100".to_owned()),
        ])
        .send()
        .await
        .expect("render")
        .json()
        .await
        .expect("json");
    assert_eq!(answer["flamebearer"]["numTicks"], 400_000_000, "{answer}");
    assert_eq!(
        answer["flamebearer"]["names"],
        json!(["total", "main", "drive"])
    );
    assert_eq!(answer["metadata"]["units"], "samples");
    assert_eq!(answer["metadata"]["sampleRate"], 1_000_000_000);
    let samples = answer["timeline"]["samples"].as_array().expect("timeline");
    let sum: u64 = samples.iter().map(|v| v.as_u64().expect("number")).sum();
    assert_eq!(sum, 400_000_000);
    assert_eq!(
        answer["groups"]["*"]["samples"],
        answer["timeline"]["samples"]
    );
    let bad = agg
        .http
        .get(agg.url("/pyroscope/render"))
        .query(&[("query", "process_cpu:cpu{}")])
        .send()
        .await
        .expect("render");
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn pyroscope_render_diff_reads_v1_queries() {
    let agg = Aggregator::start().await;
    let at = base();
    ingest(&agg, "ride.cpu{vehicle=car}", at, "main;drive 40\n", "100").await;
    ingest(&agg, "ride.cpu{vehicle=bike}", at, "main;pedal 4\n", "100").await;
    let side = |vehicle: &str| format!(r#"{CPU}{{service_name="ride", vehicle="{vehicle}"}}"#);
    let (from, until) = ((at - 60).to_string(), (at + 60).to_string());
    let answer: Value = agg
        .http
        .get(agg.url("/pyroscope/render-diff"))
        .query(&[
            ("leftQuery", side("car")),
            ("leftFrom", from.clone()),
            ("leftUntil", until.clone()),
            ("rightQuery", side("bike")),
            ("rightFrom", from),
            ("rightUntil", until),
        ])
        .send()
        .await
        .expect("render-diff")
        .json()
        .await
        .expect("json");
    assert_eq!(answer["leftTicks"], 400_000_000, "{answer}");
    assert_eq!(answer["rightTicks"], 40_000_000, "{answer}");
    assert_eq!(answer["metadata"]["format"], "double");
    assert_eq!(answer["metadata"]["sampleRate"], 1_000_000_000);
}

/// Runs the Connect client written by others (`tests/clients/querier_connect.py`) against `agg`
/// over `start..end` ms; its report, one object per mode (proto, proto-gzip, json, json-gzip).
async fn connect_python(agg: &Aggregator, start: i64, end: i64) -> Value {
    python(
        "querier_connect.py",
        vec![agg.url(""), start.to_string(), end.to_string()],
    )
    .await
}

/// `/render` of `query` over `at - 60 .. at + 60` with `extra` parameters, as JSON.
async fn render(agg: &Aggregator, query: &str, at: u64, extra: &[(&str, &str)]) -> Value {
    agg.http
        .get(agg.url("/render"))
        .query(&[
            ("query", query),
            ("from", &(at - 60).to_string()),
            ("until", &(at + 60).to_string()),
        ])
        .query(extra)
        .send()
        .await
        .expect("render")
        .json()
        .await
        .expect("json")
}

/// A flamebearer's levels in nanoseconds: every value but the name index times `ns`.
fn levels_in_ns(flamebearer: &Value, ns: i64) -> Value {
    let levels = flamebearer["levels"].as_array().expect("levels");
    Value::from(
        levels
            .iter()
            .map(|level| {
                let values = level.as_array().expect("a level");
                values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        let v = v.as_i64().expect("an integer");
                        if i % 4 == 3 { v } else { v * ns }
                    })
                    .collect::<Vec<i64>>()
            })
            .collect::<Vec<_>>(),
    )
}

#[tokio::test]
async fn connect_clients_not_ours_read_what_render_reads() {
    let agg = Aggregator::start().await;
    let at = base();
    ingest(
        &agg,
        "checkout.cpu{region=eu}",
        at,
        "main;work 30\nmain;idle 10\n",
        "100",
    )
    .await;
    ingest(
        &agg,
        "checkout.cpu{region=us}",
        at + 10,
        "main;work 4\n",
        "100",
    )
    .await;
    ingest(
        &agg,
        "billing.alloc_space{region=eu}",
        at,
        "main;alloc 512\n",
        "100",
    )
    .await;
    let (start, end) = ((at as i64 - 60) * 1000, (at as i64 + 60) * 1000);
    let report = connect_python(&agg, start, end).await;
    let answers = &report["proto"];
    for mode in ["proto-gzip", "json", "json-gzip"] {
        assert_eq!(
            report[mode], *answers,
            "{mode} answers as binary protobuf does"
        );
    }

    // The health check, and the pickers' listings.
    assert_eq!(
        answers["ProfileTypes"],
        json!([
            {"ID": "memory:alloc_space:bytes:space:bytes", "name": "memory", "sampleType": "alloc_space",
             "sampleUnit": "bytes", "periodType": "space", "periodUnit": "bytes"},
            {"ID": CPU, "name": "process_cpu", "sampleType": "cpu", "sampleUnit": "nanoseconds",
             "periodType": "cpu", "periodUnit": "nanoseconds"},
        ])
    );
    assert_eq!(
        answers["LabelNames"],
        json!(["__name__", "__profile_type__", "region", "service_name"])
    );
    assert_eq!(
        answers["LabelValues service_name"],
        json!(["billing", "checkout"])
    );
    assert_eq!(answers["LabelValues region"], json!(["eu", "us"]));
    assert_eq!(
        answers["Series"],
        json!([
            {"service_name": "checkout", "region": "eu"},
            {"service_name": "checkout", "region": "us"},
        ])
    );

    // Flame graphs: /render's levels, in nanoseconds at the series' rate (40 + 4 samples at
    // 100 Hz are 4.4e8 ns), with and without truncation.
    for max_nodes in ["16", "2"] {
        let rendered = render(&agg, "checkout.cpu{}", at, &[("maxNodes", max_nodes)]).await;
        let rate = rendered["metadata"]["sampleRate"].as_i64().expect("rate");
        let ns = 1_000_000_000 / rate;
        let fb = &rendered["flamebearer"];
        let got = &answers[format!("SelectMergeStacktraces max_nodes={max_nodes}")];
        assert_eq!(got["names"], fb["names"], "max_nodes={max_nodes}");
        assert_eq!(got["levels"], levels_in_ns(fb, ns), "max_nodes={max_nodes}");
        assert_eq!(got["total"], fb["numTicks"].as_i64().expect("ticks") * ns);
        assert_eq!(got["total"], 440_000_000);
        assert_eq!(
            got["maxSelf"],
            fb["maxSelf"].as_i64().expect("max self") * ns
        );
    }

    // The series per region, point for point against each region's /render timeline.
    let mut expected = Vec::new();
    for region in ["eu", "us"] {
        let rendered = render(
            &agg,
            &format!("checkout.cpu{{region=\"{region}\"}}"),
            at,
            &[],
        )
        .await;
        let ns = 1_000_000_000 / rendered["metadata"]["sampleRate"].as_i64().expect("rate");
        let timeline = &rendered["timeline"];
        let (first, step) = (
            timeline["startTime"].as_i64().expect("start"),
            timeline["durationDelta"].as_i64().expect("step"),
        );
        let points: Vec<Value> = timeline["samples"]
            .as_array()
            .expect("samples")
            .iter()
            .enumerate()
            .filter(|(_, v)| v.as_i64() != Some(0))
            .map(|(i, v)| {
                json!([
                    (first + i as i64 * step) * 1000,
                    (v.as_i64().expect("count") * ns) as f64
                ])
            })
            .collect();
        expected.push(json!({"labels": {"region": region}, "points": points}));
    }
    assert_eq!(answers["SelectSeries"], Value::from(expected));
    assert_eq!(
        answers["SelectSeries"][0]["points"],
        json!([[(at * 1000) as i64, 4e8]])
    );

    // The pprof profile: /render's folded stacks in nanoseconds.
    let collapsed = agg.collapsed("checkout.cpu{}").await;
    let folded: serde_json::Map<String, Value> = collapsed
        .lines()
        .map(|line| {
            let (stack, count) = line.rsplit_once(' ').expect("stack and count");
            let count: i64 = count.parse().expect("a count");
            (stack.to_owned(), Value::from(count * 10_000_000))
        })
        .collect();
    assert_eq!(
        answers["SelectMergeProfile"],
        json!({
            "sampleType": [["cpu", "nanoseconds"]],
            "periodType": ["cpu", "nanoseconds"],
            "period": 10_000_000,
            "folded": folded,
        })
    );
    assert_eq!(
        answers["SelectMergeProfile"]["folded"],
        json!({"main;idle": 100_000_000, "main;work": 340_000_000})
    );

    // The diff: /render-diff's levels of the two regions, in nanoseconds.
    let side = |region: &str| format!("checkout.cpu{{region=\"{region}\"}}");
    let (from, until) = ((at - 60).to_string(), (at + 60).to_string());
    let rendered: Value = agg
        .http
        .get(agg.url("/render-diff"))
        .query(&[
            ("leftQuery", side("eu")),
            ("leftFrom", from.clone()),
            ("leftUntil", until.clone()),
            ("rightQuery", side("us")),
            ("rightFrom", from),
            ("rightUntil", until),
        ])
        .send()
        .await
        .expect("render-diff")
        .json()
        .await
        .expect("json");
    let ns = 1_000_000_000 / rendered["metadata"]["sampleRate"].as_i64().expect("rate");
    let scaled: Vec<Vec<i64>> = rendered["flamebearer"]["levels"]
        .as_array()
        .expect("levels")
        .iter()
        .map(|level| {
            level
                .as_array()
                .expect("a level")
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let v = v.as_i64().expect("an integer");
                    if i % 7 == 6 { v } else { v * ns }
                })
                .collect()
        })
        .collect();
    let diff = &answers["Diff"];
    assert_eq!(diff["names"], rendered["flamebearer"]["names"], "{diff}");
    assert_eq!(diff["levels"], json!(scaled), "{diff}");
    assert_eq!(
        (&diff["leftTicks"], &diff["rightTicks"]),
        (&json!(400_000_000), &json!(40_000_000))
    );
    assert_eq!(
        diff["leftTicks"],
        rendered["leftTicks"].as_i64().expect("left") * ns
    );

    // A span nothing ran in has an empty profile (`spans.rs` tests spans that did run).
    let span = &answers["SelectMergeSpanProfile"];
    assert_eq!(span["total"], 0, "{span}");

    // Grafana's other calls: whether there is data, and what degrades rather than errors.
    let stats = &answers["GetProfileStats"];
    assert_eq!(stats["dataIngested"], true, "{stats}");
    let (oldest, newest) = (
        stats["oldest"].as_i64().expect("oldest"),
        stats["newest"].as_i64().expect("newest"),
    );
    assert!(
        start <= oldest && oldest <= at as i64 * 1000 && oldest <= newest && newest <= end,
        "{stats}"
    );
    for unserved in ["SelectHeatmap", "AnalyzeQuery"] {
        assert_eq!(
            answers[unserved]["code"], "unimplemented",
            "{unserved}: {}",
            answers[unserved]
        );
    }
    assert_eq!(answers["settings Get"], json!([]));
}

/// `/render`'s collapsed export of `query` (with `extra` parameters) over `at - 60 .. at + 60`
/// as stack → value in nanoseconds at 100 Hz.
async fn collapsed_ns(
    agg: &Aggregator,
    query: &str,
    at: u64,
    extra: &[(&str, &str)],
) -> std::collections::BTreeMap<String, i64> {
    let text = agg
        .http
        .get(agg.url("/render"))
        .query(&[
            ("query", query),
            ("from", &(at - 60).to_string()),
            ("until", &(at + 60).to_string()),
            ("format", "collapsed"),
        ])
        .query(extra)
        .send()
        .await
        .expect("render")
        .text()
        .await
        .expect("text");
    text.lines()
        .map(|line| {
            let (stack, count) = line.rsplit_once(' ').expect("stack and count");
            (
                stack.to_owned(),
                count.parse::<i64>().expect("a count") * 10_000_000,
            )
        })
        .collect()
}

/// Pyroscope's tree bytes (`pkg/model/tree.go`), read independently of Smolder's writer: per
/// node depth first, a varint name length, the name, a varint self value and a varint child
/// count; folded into stack → self value.
fn read_tree_bytes(bytes: &[u8]) -> std::collections::BTreeMap<String, i64> {
    fn varint(bytes: &[u8], at: &mut usize) -> u64 {
        let mut value = 0;
        for shift in (0..64).step_by(7) {
            let byte = bytes[*at];
            *at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        value
    }
    let mut out = std::collections::BTreeMap::new();
    let mut at = 0;
    // (path to the node, children still to read below it)
    let mut open: Vec<(Vec<String>, u64)> = Vec::new();
    while at < bytes.len() {
        let len = varint(bytes, &mut at) as usize;
        let name = String::from_utf8(bytes[at..at + len].to_vec()).expect("utf-8");
        at += len;
        let value = varint(bytes, &mut at) as i64;
        let children = varint(bytes, &mut at);
        while open.last().is_some_and(|(_, left)| *left == 0) {
            open.pop();
        }
        let mut path = match open.last_mut() {
            Some((path, left)) => {
                *left -= 1;
                path.clone()
            }
            None => Vec::new(),
        };
        if !open.is_empty() {
            path.push(name);
        }
        if value > 0 {
            *out.entry(path.join(";")).or_insert(0) += value;
        }
        open.push((path, children));
    }
    out
}

/// `SelectMergeStacktraces` in its TREE and PPROF formats, whole and truncated: the stacks of
/// `/render`'s collapsed export of the same data, in nanoseconds.
#[tokio::test]
async fn select_merge_stacktraces_tree_and_pprof_formats_match_render() {
    let agg = Aggregator::start().await;
    let at = base();
    ingest(
        &agg,
        "checkout.cpu{region=eu}",
        at,
        "main;work;parse 30\nmain;work;render 7\nmain;idle 10\nmain;gc 1\n",
        "100",
    )
    .await;
    ingest(
        &agg,
        "checkout.cpu{region=us}",
        at + 10,
        "main;work;parse 4\n",
        "100",
    )
    .await;
    let (start, end) = ((at as i64 - 60) * 1000, (at as i64 + 60) * 1000);
    let request = |format: ProfileFormat, max_nodes: Option<i64>| SelectMergeStacktracesRequest {
        profile_type_id: CPU.into(),
        label_selector: r#"{service_name="checkout"}"#.into(),
        start,
        end,
        max_nodes,
        format: format as i32,
        ..Default::default()
    };
    for (max_nodes, extra) in [(None, vec![]), (Some(3), vec![("maxNodes", "3")])] {
        let expected = collapsed_ns(&agg, "checkout.cpu{}", at, &extra).await;
        assert_eq!(
            expected.values().sum::<i64>(),
            520_000_000,
            "52 samples at 100 Hz"
        );
        let answer: SelectMergeStacktracesResponse = call(
            &agg,
            "SelectMergeStacktraces",
            &request(ProfileFormat::Tree, max_nodes),
        )
        .await;
        assert!(answer.flamegraph.is_none() && answer.pprof.is_none());
        assert_eq!(
            read_tree_bytes(&answer.tree),
            expected,
            "tree, {max_nodes:?}"
        );

        let answer: SelectMergeStacktracesResponse = call(
            &agg,
            "SelectMergeStacktraces",
            &request(ProfileFormat::Pprof, max_nodes),
        )
        .await;
        let profile = answer
            .pprof
            .and_then(|p| p.profile)
            .expect("a pprof profile");
        let strings: Vec<String> = profile
            .string_table
            .iter()
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        let names: std::collections::HashMap<u64, &str> = profile
            .function
            .iter()
            .map(|f| (f.id, strings[f.name as usize].as_str()))
            .collect();
        let locations: std::collections::HashMap<u64, Vec<&str>> = profile
            .location
            .iter()
            .map(|l| {
                (
                    l.id,
                    l.line
                        .iter()
                        .rev()
                        .map(|line| names[&line.function_id])
                        .collect(),
                )
            })
            .collect();
        let mut folded = std::collections::BTreeMap::new();
        for sample in &profile.sample {
            let stack: Vec<&str> = sample
                .location_id
                .iter()
                .rev()
                .flat_map(|id| locations[id].iter().copied())
                .collect();
            *folded.entry(stack.join(";")).or_insert(0) += sample.value[0];
        }
        assert_eq!(folded, expected, "pprof, {max_nodes:?}");
        let sample_type = &profile.sample_type[0];
        assert_eq!(
            (
                strings[sample_type.r#type as usize].as_str(),
                strings[sample_type.unit as usize].as_str()
            ),
            ("cpu", "nanoseconds")
        );
        assert_eq!(profile.period, 10_000_000);
    }
    agg.stop().await;
}

/// `SelectSeries` with `aggregation=AVERAGE` (per step, the mean of the series with data
/// there) and with `limit` (the groups of the largest totals): point for point against each
/// series' `/render` timeline.
#[tokio::test]
async fn select_series_average_and_limit_match_render() {
    let agg = Aggregator::start().await;
    let at = base();
    for (region, offset, body) in [
        ("eu", 0, "main;work 30\n"),
        ("eu", 10, "main;work 12\n"),
        ("us", 0, "main;work 6\n"),
        ("ap", 0, "main;work 3\n"),
        ("ap", 10, "main;work 1\n"),
    ] {
        let name = format!("checkout.cpu{{region={region}}}");
        ingest(&agg, &name, at + offset, body, "100").await;
    }
    let (start, end) = ((at as i64 - 60) * 1000, (at as i64 + 60) * 1000);
    // Each region's points from its /render timeline, in ns: step start (ms) → value.
    let mut by_region = std::collections::BTreeMap::new();
    for region in ["ap", "eu", "us"] {
        let rendered = render(
            &agg,
            &format!("checkout.cpu{{region=\"{region}\"}}"),
            at,
            &[],
        )
        .await;
        let ns = 1_000_000_000 / rendered["metadata"]["sampleRate"].as_i64().expect("rate");
        let timeline = &rendered["timeline"];
        let first = timeline["startTime"].as_i64().expect("start");
        let step = timeline["durationDelta"].as_i64().expect("step");
        let points: std::collections::BTreeMap<i64, f64> = timeline["samples"]
            .as_array()
            .expect("samples")
            .iter()
            .enumerate()
            .filter(|(_, v)| v.as_i64() != Some(0))
            .map(|(i, v)| {
                (
                    (first + i as i64 * step) * 1000,
                    (v.as_i64().expect("n") * ns) as f64,
                )
            })
            .collect();
        by_region.insert(region, points);
    }
    let select = |group_by: Vec<String>, aggregation: Option<TimeSeriesAggregationType>, limit| {
        SelectSeriesRequest {
            profile_type_id: CPU.into(),
            label_selector: r#"{service_name="checkout"}"#.into(),
            start,
            end,
            group_by,
            step: 10.0,
            aggregation: aggregation.map(|a| a as i32),
            limit,
            ..Default::default()
        }
    };

    // One group: per step, the mean over the series with data there.
    let answer: SelectSeriesResponse = call(
        &agg,
        "SelectSeries",
        &select(vec![], Some(TimeSeriesAggregationType::Average), None),
    )
    .await;
    assert_eq!(answer.series.len(), 1);
    let mut expected: std::collections::BTreeMap<i64, Vec<f64>> = Default::default();
    for points in by_region.values() {
        for (&t, &v) in points {
            expected.entry(t).or_default().push(v);
        }
    }
    let expected: Vec<(i64, f64)> = expected
        .into_iter()
        .map(|(t, values)| (t, values.iter().sum::<f64>() / values.len() as f64))
        .collect();
    let got: Vec<(i64, f64)> = answer.series[0]
        .points
        .iter()
        .map(|p| (p.timestamp, p.value))
        .collect();
    assert_eq!(got, expected);
    let ms = |t: u64| (t * 1000) as i64;
    assert_eq!(got, [(ms(at), 13e7), (ms(at + 10), 6.5e7)]);
    // The sum of the same: the totals.
    let answer: SelectSeriesResponse =
        call(&agg, "SelectSeries", &select(vec![], None, None)).await;
    let sums: Vec<(i64, f64)> = answer.series[0]
        .points
        .iter()
        .map(|p| (p.timestamp, p.value))
        .collect();
    assert_eq!(sums, [(ms(at), 39e7), (ms(at + 10), 13e7)]);

    // Per region, the two of the largest totals: eu (42 samples) and us (6), not ap (4).
    let answer: SelectSeriesResponse = call(
        &agg,
        "SelectSeries",
        &select(vec!["region".into()], None, Some(2)),
    )
    .await;
    let got: Vec<(String, Vec<(i64, f64)>)> = answer
        .series
        .iter()
        .map(|s| {
            (
                s.labels[0].value.clone(),
                s.points.iter().map(|p| (p.timestamp, p.value)).collect(),
            )
        })
        .collect();
    let expected: Vec<(String, Vec<(i64, f64)>)> = ["eu", "us"]
        .into_iter()
        .map(|r| {
            (
                r.to_owned(),
                by_region[r].iter().map(|(t, v)| (*t, *v)).collect(),
            )
        })
        .collect();
    assert_eq!(got, expected);
    // Without a limit, every region; a limit of 0 is no limit.
    for limit in [None, Some(0)] {
        let answer: SelectSeriesResponse = call(
            &agg,
            "SelectSeries",
            &select(vec!["region".into()], None, limit),
        )
        .await;
        assert_eq!(answer.series.len(), 3, "{limit:?}");
    }
    agg.stop().await;
}
