//! Traces to profiles: samples labelled with the span they ran in are kept per span, never as
//! series labels, and the profile of given spans is what `SelectMergeSpanProfile` and
//! `/render?spanSelector=` answer. The must-show: a Python app traced with the OpenTelemetry
//! SDK, profiled by `pyroscope-io` with `pyroscope-otel`'s span processor (PyPI's packages,
//! pinned in `scripts/test`, `tests/clients/span_app.py`), read back by connect-python
//! (`tests/clients/querier_connect.py`). Then every other shape a span id arrives in.

use std::collections::BTreeMap;

use prost::Message;
use reqwest::StatusCode;
use serde_json::{Value, json};
use smolder_common::pprof::proto::Label;
use smolder_common::pprof::{self, EncodeOptions};
use smolder_common::querier::{
    ProfileFormat, SelectMergeSpanProfileRequest, SelectMergeSpanProfileResponse,
    SelectMergeStacktracesRequest, SelectMergeStacktracesResponse,
};

use crate::grafana::call;
use crate::util::{Aggregator, python, tree, wire};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// `/render` of `query` over `from..until` (Unix seconds) with `extra` parameters, as folded
/// stacks and counts.
async fn collapsed(
    agg: &Aggregator,
    query: &str,
    (from, until): (i64, i64),
    extra: &[(&str, &str)],
) -> BTreeMap<String, i64> {
    let response = agg
        .http
        .get(agg.url("/render"))
        .query(&[
            ("query", query),
            ("from", &from.to_string()),
            ("until", &until.to_string()),
            ("format", "collapsed"),
        ])
        .query(extra)
        .send()
        .await
        .expect("render");
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.expect("text");
    text.lines()
        .map(|line| {
            let (stack, count) = line.rsplit_once(' ').expect("stack and count");
            (stack.to_owned(), count.parse().expect("a count"))
        })
        .collect()
}

/// Whether any stack of `stacks` runs `function`.
fn runs(stacks: &BTreeMap<String, i64>, function: &str) -> bool {
    stacks.keys().any(|s| s.split(';').any(|f| f == function))
}

/// The must-show of issue 19: the profile of one span holds that span's function and not the
/// other span's, through the Connect API a trace's link calls and through `/render`, values
/// exact between the two.
#[tokio::test]
async fn a_python_apps_span_profiles_hold_their_own_functions() {
    let agg = Aggregator::start().await;
    let run = python("span_app.py", vec![agg.url(""), "8".to_owned()]).await;
    let ids = |name: &str| -> Vec<String> {
        run["spans"][name]
            .as_array()
            .expect("span ids")
            .iter()
            .map(|id| id.as_str().expect("hex").to_owned())
            .collect()
    };
    let (alpha, beta) = (ids("alpha"), ids("beta"));
    assert!(alpha.len() >= 5 && beta.len() >= 5, "{run}");
    let start_ms = run["start_ms"].as_i64().expect("start") - 60_000;
    let end_ms = run["end_ms"].as_i64().expect("end") + 60_000;
    let range = (start_ms / 1000, end_ms / 1000 + 1);

    // The app's profile holds both functions, in one series: no span id made a label.
    let whole = collapsed(&agg, "spanapp.cpu{}", range, &[]).await;
    assert!(
        runs(&whole, "alpha_work") && runs(&whole, "beta_work"),
        "{whole:?}"
    );
    let labels: Vec<String> = agg
        .http
        .get(agg.url("/labels"))
        .query(&[("query", "spanapp.cpu{}")])
        .send()
        .await
        .expect("labels")
        .json()
        .await
        .expect("json");
    for label in ["span_id", "span_name", "trace_id"] {
        assert!(!labels.iter().any(|l| l == label), "{labels:?}");
    }
    let series: Vec<Value> = agg
        .http
        .get(agg.url("/label-values"))
        .query(&[("label", "env"), ("query", "spanapp.cpu{}")])
        .send()
        .await
        .expect("label values")
        .json()
        .await
        .expect("json");
    assert_eq!(series, [json!("test")]);

    // One span's link: a span of the middle of the run that the sampler caught.
    let mut one = None;
    for span in &alpha[alpha.len() / 2..] {
        let stacks = collapsed(&agg, "spanapp.cpu{}", range, &[("spanSelector", span)]).await;
        if !stacks.is_empty() {
            one = Some(span.clone());
            break;
        }
    }
    let one = one.expect("a span with samples");
    let selector = r#"{service_name="spanapp"}"#;
    let cases = [
        ("alpha", alpha.clone(), "alpha_work", "beta_work"),
        ("beta", beta.clone(), "beta_work", "alpha_work"),
        ("one alpha span", vec![one], "alpha_work", "beta_work"),
    ];
    for (case, spans, own, other) in cases {
        let mut args = vec![
            agg.url(""),
            start_ms.to_string(),
            end_ms.to_string(),
            "spans".to_owned(),
            selector.to_owned(),
        ];
        args.extend(spans.iter().cloned());
        let report = python("querier_connect.py", args).await;
        let answers = &report["proto"];
        for mode in ["proto-gzip", "json", "json-gzip"] {
            assert_eq!(
                report[mode], *answers,
                "{case}: {mode} answers as proto does"
            );
        }
        let flamegraph = &answers["SelectMergeSpanProfile"];
        let names: Vec<&str> = flamegraph["names"]
            .as_array()
            .unwrap_or_else(|| panic!("{case}: {flamegraph}"))
            .iter()
            .map(|n| n.as_str().expect("a name"))
            .collect();
        assert!(names.contains(&own), "{case}: {names:?}");
        assert!(!names.contains(&other), "{case}: {names:?}");
        assert_eq!(
            answers["SelectMergeStacktraces span_selector"], *flamegraph,
            "{case}: a span_selector selects the same"
        );

        // /render of the same spans: the same stacks, in samples at 100 Hz.
        let selected = spans.join(",");
        let rendered =
            collapsed(&agg, "spanapp.cpu{}", range, &[("spanSelector", &selected)]).await;
        assert!(
            runs(&rendered, own) && !runs(&rendered, other),
            "{case}: {rendered:?}"
        );
        let ns: BTreeMap<String, i64> = rendered
            .iter()
            .map(|(stack, count)| (stack.clone(), count * 10_000_000))
            .collect();
        assert_eq!(
            answers["SelectMergeSpanProfile tree"],
            serde_json::to_value(&ns).expect("json"),
            "{case}: exact against /render"
        );
        assert_eq!(
            flamegraph["total"],
            ns.values().sum::<i64>(),
            "{case}: exact against /render"
        );
        // Every span's samples are part of the app's.
        for (stack, count) in &rendered {
            assert!(
                whole.get(stack).is_some_and(|all| all >= count),
                "{case}: {stack}"
            );
        }
    }
    agg.stop().await;
}

/// A CPU pprof of `stacks` at 100 Hz whose samples carry the labels `labels` gives the
/// stack's leaf.
fn labelled_pprof(stacks: &[(&str, u64)], labels: &[(&str, &[(&str, &str)])]) -> Vec<u8> {
    let mut profile = pprof::encode(&tree(stacks), &EncodeOptions::cpu_samples(100));
    let mut string = |text: &str| {
        let at = profile
            .string_table
            .iter()
            .position(|s| s == text.as_bytes());
        at.unwrap_or_else(|| {
            profile.string_table.push(text.as_bytes().to_vec());
            profile.string_table.len() - 1
        }) as i64
    };
    let mut keyed = Vec::new();
    for (leaf, pairs) in labels {
        let pairs: Vec<Label> = pairs
            .iter()
            .map(|(key, value)| Label {
                key: string(key),
                str: string(value),
                ..Label::default()
            })
            .collect();
        keyed.push((string(leaf), pairs));
    }
    let strings = profile.string_table.clone();
    for sample in &mut profile.sample {
        let location = profile
            .location
            .iter()
            .find(|l| l.id == sample.location_id[0])
            .expect("a location");
        let function = profile
            .function
            .iter()
            .find(|f| f.id == location.line[0].function_id)
            .expect("a function");
        for (leaf, pairs) in &keyed {
            if strings[*leaf as usize] == strings[function.name as usize] {
                sample.label.extend(pairs.iter().cloned());
            }
        }
    }
    profile.to_bytes(true)
}

const ALPHA: &str = "00f067aa0ba902b7";
const BETA: &str = "5a561accaab40cf2";

/// Every way a span id reaches the aggregator: pprof sample labels in `/ingest?format=pprof`,
/// the Go SDK's multipart form and the Connect push (pyroscope-io's shape), a push series'
/// `span_id` label and an `/ingest` name's (older SDKs' per-span uploads). Each gives span
/// profiles, and no span label becomes a series label.
#[tokio::test]
async fn every_shape_a_span_id_comes_in_gives_span_profiles_not_series() {
    let agg = Aggregator::start().await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64;
    let range = (now - 600, now + 60);
    let stacks = [("main;alpha", 30), ("main;beta", 20), ("main;idle", 5)];
    let labels: [(&str, &[(&str, &str)]); 2] = [
        (
            "alpha",
            &[
                ("span_id", ALPHA),
                ("span_name", "GET /a"),
                ("trace_id", "0af7651916cd43dd8448eb211c80319c"),
            ],
        ),
        ("beta", &[("span_id", BETA), ("span_name", "GET /b")]),
    ];
    let pprof = labelled_pprof(&stacks, &labels);
    let ingest = |name: &str| {
        agg.http
            .post(agg.url("/ingest"))
            .query(&[("name", name), ("format", "pprof")])
    };
    let response = ingest("bare")
        .body(pprof.clone())
        .send()
        .await
        .expect("ingest");
    assert_eq!(response.status(), StatusCode::OK);
    let boundary = "b0undary";
    let mut form = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"profile\"; filename=\"profile.pprof\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    form.extend_from_slice(&pprof);
    form.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let response = ingest("form")
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(form)
        .send()
        .await
        .expect("ingest");
    assert_eq!(response.status(), StatusCode::OK);
    for request in [
        wire::push_request(
            &[("service_name", "push"), ("__name__", "process_cpu")],
            pprof.clone(),
        ),
        // A series' span id: its samples without their own go to it.
        wire::push_request(
            &[
                ("service_name", "pushed-span"),
                ("span_id", BETA),
                ("span_name", "GET /b"),
            ],
            pprof::encode(
                &tree(&[("main;beta", 20)]),
                &EncodeOptions::cpu_samples(100),
            )
            .to_bytes(false),
        ),
    ] {
        let response = agg
            .http
            .post(agg.url("/push.v1.PusherService/Push"))
            .header("content-type", "application/proto")
            .body(request.encode_to_vec())
            .send()
            .await
            .expect("push");
        assert_eq!(response.status(), StatusCode::OK);
    }
    for (name, body) in [
        (
            format!("named.cpu{{span_id={ALPHA},span_name=a}}"),
            "main;alpha 30\n",
        ),
        (
            format!("named.cpu{{span_id={BETA},trace_id=x}}"),
            "main;beta 20\n",
        ),
        ("named.cpu{}".to_owned(), "main;idle 5\n"),
    ] {
        let response = agg
            .http
            .post(agg.url("/ingest"))
            .query(&[("name", name.as_str())])
            .body(body)
            .send()
            .await
            .expect("ingest");
        assert_eq!(response.status(), StatusCode::OK);
    }

    for app in ["bare.cpu", "form.cpu", "push.cpu", "named.cpu"] {
        let query = format!("{app}{{}}");
        let whole = collapsed(&agg, &query, range, &[]).await;
        assert_eq!(
            whole,
            BTreeMap::from([
                ("main;alpha".to_owned(), 30),
                ("main;beta".to_owned(), 20),
                ("main;idle".to_owned(), 5)
            ]),
            "{app}: one series holds every sample"
        );
        for (span, stack, count) in [(ALPHA, "main;alpha", 30), (BETA, "main;beta", 20)] {
            assert_eq!(
                collapsed(&agg, &query, range, &[("spanSelector", span)]).await,
                BTreeMap::from([(stack.to_owned(), count)]),
                "{app}: span {span}"
            );
        }
        let both = format!("{ALPHA},{BETA}");
        assert_eq!(
            collapsed(&agg, &query, range, &[("spanSelector", &both)])
                .await
                .len(),
            2,
            "{app}"
        );
    }
    assert_eq!(
        collapsed(&agg, "pushed-span.cpu{}", range, &[("spanSelector", BETA)]).await,
        BTreeMap::from([("main;beta".to_owned(), 20)])
    );
    let names: Vec<String> = agg
        .http
        .get(agg.url("/label-names"))
        .send()
        .await
        .expect("label names")
        .json()
        .await
        .expect("json");
    for label in ["span_id", "span_name", "trace_id"] {
        assert!(!names.iter().any(|n| n == label), "{names:?}");
    }

    // The Connect calls of a trace's link, in binary, exact against /render (30 samples at
    // 100 Hz are 3e8 ns); a bad span id is refused with the field named.
    let (start, end) = (range.0 * 1000, range.1 * 1000);
    let request = |format: ProfileFormat| SelectMergeSpanProfileRequest {
        profile_type_id: CPU.into(),
        label_selector: r#"{service_name=~"bare|named"}"#.into(),
        span_selector: vec![ALPHA.to_uppercase()],
        start,
        end,
        max_nodes: None,
        format: format as i32,
    };
    let answer: SelectMergeSpanProfileResponse = call(
        &agg,
        "SelectMergeSpanProfile",
        &request(ProfileFormat::Flamegraph),
    )
    .await;
    let flamegraph = answer.flamegraph.expect("a flame graph");
    assert_eq!(flamegraph.total, 2 * 300_000_000);
    assert_eq!(flamegraph.names, ["total", "main", "alpha"]);
    let answer: SelectMergeSpanProfileResponse = call(
        &agg,
        "SelectMergeSpanProfile",
        &request(ProfileFormat::Tree),
    )
    .await;
    assert!(answer.flamegraph.is_none() && !answer.tree.is_empty());
    let mut nothing = request(ProfileFormat::Flamegraph);
    nothing.span_selector.clear();
    let answer: SelectMergeSpanProfileResponse =
        call(&agg, "SelectMergeSpanProfile", &nothing).await;
    assert_eq!(
        answer.flamegraph.expect("a flame graph").total,
        0,
        "no span, no samples"
    );
    let answer: SelectMergeStacktracesResponse = call(
        &agg,
        "SelectMergeStacktraces",
        &SelectMergeStacktracesRequest {
            profile_type_id: CPU.into(),
            label_selector: r#"{service_name="push"}"#.into(),
            start,
            end,
            span_selector: vec![BETA.into()],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(answer.flamegraph.expect("a flame graph").total, 200_000_000);
    let response = agg
        .http
        .get(agg.url("/render"))
        .query(&[("query", "bare.cpu{}"), ("spanSelector", "xyz")])
        .send()
        .await
        .expect("render");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(
        response
            .text()
            .await
            .expect("text")
            .contains("spanSelector"),
        "the parameter named"
    );
    agg.stop().await;
}
