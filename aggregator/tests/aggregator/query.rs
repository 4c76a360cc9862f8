//! The query API over real HTTP: profiles go in through `/ingest`, and `/render`,
//! `/render-diff` and the listings must answer exactly as Pyroscope's reference examples do.

use std::time::{SystemTime, UNIX_EPOCH};

use reqwest::StatusCode;
use serde_json::{Value, json};
use smolder_common::pprof::{self, Limits, SampleTypes};
use smolder_common::{FoldedFormat, FoldedLimits, Tree, parse_folded, to_folded};
use smolder_test_support::prometheus::Metrics;

use crate::util::Aggregator;

/// Label and app listings, and deleting an app.
mod listings;

/// The reference's worked example (§2.4).
const EXAMPLE: &str = "foo;bar 2\nfoo;baz 3\nfoo 1\nqux 4\n";

/// A 10 s-aligned unix time half an hour ago: recent enough for retention, far enough from now
/// that `until` defaults never cut it.
fn base() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    (now - 1800) / 10 * 10
}

/// Pushes folded `body` for series `name` over `[at, at + 10)`, with extra ingest parameters.
async fn ingest(agg: &Aggregator, name: &str, at: u64, body: &str, extra: &[(&str, &str)]) {
    let (from, until) = (at.to_string(), (at + 10).to_string());
    let mut query = vec![("name", name), ("from", &from), ("until", &until)];
    query.extend_from_slice(extra);
    let response = agg
        .http
        .post(agg.url("/ingest"))
        .query(&query)
        .body(body.to_owned())
        .send()
        .await
        .expect("ingest request");
    assert_eq!(response.status(), StatusCode::OK, "ingest {name}");
}

/// GETs `path` with `query` and returns the status and body.
async fn get(agg: &Aggregator, path: &str, query: &[(&str, &str)]) -> (StatusCode, String) {
    let response = agg
        .http
        .get(agg.url(path))
        .query(query)
        .send()
        .await
        .expect("request");
    let status = response.status();
    (status, response.text().await.expect("body"))
}

/// GETs `path` and parses a 200 answer as JSON.
async fn get_json(agg: &Aggregator, path: &str, query: &[(&str, &str)]) -> Value {
    let (status, body) = get(agg, path, query).await;
    assert_eq!(status, StatusCode::OK, "{path} {query:?}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

fn folded_tree(text: &str) -> Tree {
    parse_folded(
        text.as_bytes(),
        FoldedFormat::Folded,
        &FoldedLimits::default(),
    )
    .expect("valid folded text")
}

#[tokio::test]
async fn render_returns_the_reference_flamebearer() {
    let agg = Aggregator::start().await;
    let t = base();
    ingest(
        &agg,
        "app.cpu{env=prod}",
        t,
        EXAMPLE,
        &[("spyName", "gospy")],
    )
    .await;
    let (from, until) = ((t - 60).to_string(), (t + 60).to_string());
    let body = get_json(
        &agg,
        "/render",
        &[("query", "app.cpu{}"), ("from", &from), ("until", &until)],
    )
    .await;

    assert_eq!(body["version"], 1);
    assert_eq!(
        body["flamebearer"],
        json!({
            "names": ["total", "qux", "foo", "baz", "bar"],
            "levels": [[0, 10, 0, 0], [0, 6, 1, 2, 0, 4, 4, 1], [1, 2, 2, 4, 0, 3, 3, 3]],
            "numTicks": 10,
            "maxSelf": 4,
        })
    );
    let start = rfc3339(t - 60);
    assert_eq!(
        body["metadata"],
        json!({
            "format": "single",
            "spyName": "gospy",
            "sampleRate": 100,
            "units": "samples",
            "name": format!("app.cpu {start}"),
            "appName": "app.cpu",
            "startTime": t - 60,
            "endTime": t + 60,
            "query": "app.cpu{}",
            "maxNodes": 8192,
        })
    );
    assert_eq!(body["heatmap"], Value::Null);
    assert_eq!(body["annotations"], json!([]));
    let timeline = &body["timeline"];
    assert_eq!(timeline["durationDelta"], 10);
    assert_eq!(timeline["watermarks"], json!({}));
    let samples: Vec<u64> = serde_json::from_value(timeline["samples"].clone()).expect("samples");
    assert_eq!(samples.len(), 12, "120 s in 10 s steps");
    assert_eq!(samples.iter().sum::<u64>(), 10);
    let start_time = timeline["startTime"].as_u64().expect("startTime");
    let slot = usize::try_from((t - start_time) / 10).expect("small");
    assert_eq!(samples[slot], 10, "the write lands in its own step");
    assert_eq!(body["groups"], json!({ "*": timeline.clone() }));

    // `/pyroscope/render` is the same handler.
    let again = get_json(
        &agg,
        "/pyroscope/render",
        &[("query", "app.cpu{}"), ("from", &from), ("until", &until)],
    )
    .await;
    assert_eq!(again["flamebearer"], body["flamebearer"]);
}

/// What Go's `time.RFC3339` writes for unix seconds `secs` in UTC, computed here by walking
/// the calendar rather than with the server's algorithm, so that the two check each other.
fn rfc3339(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Walk years and months; fine for a test, the dates are recent.
    let mut year = 1970;
    let mut days_left = days;
    loop {
        let len = if is_leap(year) { 366 } else { 365 };
        if days_left < len {
            break;
        }
        days_left -= len;
        year += 1;
    }
    let months = [
        31,
        if is_leap(year) { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let mut month = 0;
    while days_left >= months[month] {
        days_left -= months[month];
        month += 1;
    }
    format!(
        "{year:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        month + 1,
        days_left + 1,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn is_leap(year: u64) -> bool {
    (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400)
}

#[tokio::test]
async fn name_selects_series_by_label_equality_and_empty_selections_are_empty() {
    let agg = Aggregator::start().await;
    let t = base();
    ingest(&agg, "app.cpu{env=prod,region=eu}", t, "a;b 7\n", &[]).await;
    ingest(&agg, "app.cpu{env=dev,region=eu}", t, "a;c 3\n", &[]).await;
    let (from, until) = ((t - 60).to_string(), (t + 60).to_string());
    let range = [("from", from.as_str()), ("until", until.as_str())];

    let prod = get_json(
        &agg,
        "/render",
        &[&range[..], &[("name", "app.cpu{env=prod}")]].concat(),
    )
    .await;
    assert_eq!(prod["flamebearer"]["numTicks"], 7);
    assert_eq!(prod["metadata"]["query"], r#"app.cpu{env="prod"}"#);
    let eu = get_json(
        &agg,
        "/render",
        &[&range[..], &[("name", "app.cpu{region=eu}")]].concat(),
    )
    .await;
    assert_eq!(eu["flamebearer"]["numTicks"], 10);
    let regex = get_json(
        &agg,
        "/render",
        &[&range[..], &[("query", r#"app.cpu{env=~"d.*"}"#)]].concat(),
    )
    .await;
    assert_eq!(regex["flamebearer"]["numTicks"], 3);

    // Nothing matches: an empty flame graph, not an error.
    let none = get_json(
        &agg,
        "/render",
        &[&range[..], &[("query", "nothing.cpu")]].concat(),
    )
    .await;
    assert_eq!(
        none["flamebearer"],
        json!({"names": ["total"], "levels": [[0, 0, 0, 0]], "numTicks": 0, "maxSelf": 0})
    );
    assert_eq!(none["metadata"]["units"], "");
    assert_eq!(none["metadata"]["sampleRate"], 0);
    assert!(
        none["timeline"]["samples"]
            .as_array()
            .is_some_and(|s| !s.is_empty())
    );
}

#[tokio::test]
async fn collapsed_and_pprof_exports_hold_the_same_stacks() {
    let agg = Aggregator::start().await;
    let t = base();
    ingest(&agg, "app.cpu", t, EXAMPLE, &[("sampleRate", "99")]).await;
    let (from, until) = ((t - 60).to_string(), (t + 60).to_string());
    let expected = folded_tree(EXAMPLE);

    let response = agg
        .http
        .get(agg.url("/render"))
        .query(&[
            ("query", "app.cpu"),
            ("from", &from),
            ("until", &until),
            ("format", "collapsed"),
        ])
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::OK);
    let disposition = response
        .headers()
        .get("content-disposition")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        disposition.starts_with("attachment; filename=\"app.cpu ")
            && disposition.ends_with(".collapsed.txt\""),
        "{disposition}"
    );
    let text = response.text().await.expect("body");
    assert_eq!(to_folded(&folded_tree(&text)), to_folded(&expected));

    let response = agg
        .http
        .get(agg.url("/render"))
        .query(&[
            ("query", "app.cpu"),
            ("from", &from),
            ("until", &until),
            ("format", "pprof"),
        ])
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.bytes().await.expect("body");
    let profile = pprof::decode(&bytes, &Limits::default()).expect("a valid pprof");
    let period_type = profile
        .period_type
        .as_ref()
        .expect("a CPU profile has a period");
    let string = |i: i64| profile.string_table[usize::try_from(i).expect("index")].clone();
    assert_eq!(
        String::from_utf8(string(period_type.r#type))
            .ok()
            .as_deref(),
        Some("cpu")
    );
    assert_eq!(profile.period, 1_000_000_000 / 99);
    let series =
        pprof::to_series(&profile, &SampleTypes::default(), &Limits::default()).expect("converts");
    assert_eq!(series.len(), 1);
    assert_eq!(series[0].name_suffix, "cpu");
    assert_eq!(series[0].sample_rate, Some(99));
    assert_eq!(to_folded(&series[0].tree), to_folded(&expected));
}

#[tokio::test]
async fn group_by_splits_the_timeline_by_label_value() {
    let agg = Aggregator::start().await;
    let t = base();
    ingest(&agg, "app.cpu{env=prod}", t, "a 10\n", &[]).await;
    ingest(&agg, "app.cpu{env=dev}", t + 20, "a 5\n", &[]).await;
    ingest(&agg, "app.cpu{host=h1}", t, "a 3\n", &[]).await;
    let (from, until) = ((t - 60).to_string(), (t + 60).to_string());
    let body = get_json(
        &agg,
        "/render",
        &[
            ("query", "app.cpu"),
            ("from", &from),
            ("until", &until),
            ("groupBy", "env"),
        ],
    )
    .await;
    let groups = body["groups"].as_object().expect("groups");
    let sum = |key: &str| -> u64 {
        groups[key]["samples"]
            .as_array()
            .expect("samples")
            .iter()
            .filter_map(Value::as_u64)
            .sum()
    };
    let mut keys: Vec<&str> = groups.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["*", "dev", "prod"]);
    assert_eq!((sum("*"), sum("dev"), sum("prod")), (3, 5, 10));
    let total: u64 = body["timeline"]["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(total, 18);
}

#[tokio::test]
async fn max_nodes_folds_small_nodes_into_other() {
    let agg = Aggregator::start().await;
    let t = base();
    let body: String = (1..=20).map(|i| format!("main;f{i:02} {i}\n")).collect();
    ingest(&agg, "app.cpu", t, &body, &[]).await;
    let (from, until) = ((t - 60).to_string(), (t + 60).to_string());
    for param in ["maxNodes", "max-nodes"] {
        let fb = get_json(
            &agg,
            "/render",
            &[
                ("query", "app.cpu"),
                ("from", &from),
                ("until", &until),
                (param, "5"),
            ],
        )
        .await;
        let names = fb["flamebearer"]["names"].as_array().expect("names");
        assert!(names.contains(&json!("other")), "{param}: {names:?}");
        assert!(names.len() < 10, "{param}: {names:?}");
        assert_eq!(fb["flamebearer"]["numTicks"], 210);
        assert_eq!(fb["metadata"]["maxNodes"], 5);
    }
}

#[tokio::test]
async fn exports_keep_a_node_budget_only_when_asked_and_a_capped_one_says_so() {
    let mut config = smolder_aggregator::config::Config::default();
    config.query.max_nodes_limit = 8;
    let agg = Aggregator::with_config(config).await;
    let t = base();
    let body: String = (1..=20).map(|i| format!("main;f{i:02} {i}\n")).collect();
    ingest(&agg, "app.cpu", t, &body, &[]).await;
    let (from, until) = ((t - 60).to_string(), (t + 60).to_string());
    let range = [("query", "app.cpu"), ("from", &from), ("until", &until)];
    let mut query = range.to_vec();
    query.push(("format", "collapsed"));
    // Without maxNodes, the export is whole; with it, folded into `other` as the JSON is.
    let (_, whole) = get(&agg, "/render", &query).await;
    assert_eq!(whole.lines().count(), 20, "{whole}");
    query.push(("maxNodes", "5"));
    let (_, cut) = get(&agg, "/render", &query).await;
    assert!(cut.lines().count() < 10, "{cut}");
    assert!(
        cut.lines().any(|line| line.starts_with("main;other ")),
        "{cut}"
    );
    let total = |text: &str| -> u64 {
        text.lines()
            .map(|line| line.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(total(&cut), total(&whole));

    // Above query.max-nodes-limit: capped, and the answer says so.
    for format in ["json", "collapsed"] {
        let mut query = range.to_vec();
        query.extend([("format", format), ("maxNodes", "100")]);
        let response = agg
            .http
            .get(agg.url("/render"))
            .query(&query)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()["warning"],
            "299 - \"maxNodes 100 is above query.max-nodes-limit; 8 nodes used\"",
            "{format}"
        );
    }
    let response = agg
        .http
        .get(agg.url("/render"))
        .query(&range)
        .send()
        .await
        .unwrap();
    assert!(response.headers().get("warning").is_none());
}

#[tokio::test]
async fn average_series_are_divided_by_their_writes() {
    let agg = Aggregator::start().await;
    let t = base();
    for at in [t, t + 10, t + 20] {
        ingest(
            &agg,
            "app.inuse_space",
            at,
            "main;alloc 300\n",
            &[("units", "bytes"), ("aggregationType", "average")],
        )
        .await;
    }
    let (from, until) = ((t - 60).to_string(), (t + 60).to_string());
    let body = get_json(
        &agg,
        "/render",
        &[
            ("query", "app.inuse_space"),
            ("from", &from),
            ("until", &until),
        ],
    )
    .await;
    assert_eq!(body["flamebearer"]["numTicks"], 300);
    assert_eq!(body["metadata"]["units"], "bytes");
}

#[tokio::test]
async fn render_diff_returns_the_reference_diff() {
    let agg = Aggregator::start().await;
    let t = base();
    ingest(&agg, "app.cpu", t, "a;b 2\na;c 2\n", &[]).await;
    ingest(&agg, "app.cpu", t + 600, "a;b 6\na;c 2\n", &[]).await;
    let left = ((t - 60).to_string(), (t + 60).to_string());
    let right = ((t + 540).to_string(), (t + 660).to_string());
    let body = get_json(
        &agg,
        "/render-diff",
        &[
            ("leftQuery", "app.cpu"),
            ("leftFrom", &left.0),
            ("leftUntil", &left.1),
            ("rightQuery", "app.cpu"),
            ("rightFrom", &right.0),
            ("rightUntil", &right.1),
        ],
    )
    .await;
    let fb = &body["flamebearer"];
    assert_eq!(fb["names"], json!(["total", "a", "c", "b"]));
    assert_eq!(
        fb["levels"][2],
        json!([0, 2, 2, 0, 6, 6, 3, 0, 2, 2, 0, 2, 2, 2])
    );
    assert_eq!(fb["numTicks"], 12);
    assert_eq!(body["leftTicks"], 4);
    assert_eq!(body["rightTicks"], 8);
    assert_eq!(body["timeline"], Value::Null);
    assert_eq!(body["metadata"]["format"], "double");
    assert_eq!(body["metadata"]["appName"], "diff_app.cpu");
    assert_eq!(body["metadata"]["startTime"], t - 60);
    assert_eq!(body["metadata"]["endTime"], t + 660);

    // `/pyroscope/render-diff` with `maxNodes` is the same handler.
    let (status, _) = get(
        &agg,
        "/pyroscope/render-diff",
        &[
            ("leftQuery", "app.cpu"),
            ("rightQuery", "app.cpu"),
            ("maxNodes", "10"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn render_diff_rejects_sides_that_measure_different_things() {
    let agg = Aggregator::start().await;
    let t = base();
    ingest(&agg, "app.cpu", t, "a 1\n", &[]).await;
    ingest(&agg, "app.alloc_space", t, "a 1\n", &[("units", "bytes")]).await;
    ingest(&agg, "fast.cpu", t, "a 1\n", &[("sampleRate", "1000")]).await;
    let (from, until) = ((t - 60).to_string(), (t + 60).to_string());
    let diff = |left: &'static str, right: &'static str| {
        let (from, until) = (from.clone(), until.clone());
        let agg = &agg;
        async move {
            get(
                agg,
                "/render-diff",
                &[
                    ("leftQuery", left),
                    ("leftFrom", &from),
                    ("leftUntil", &until),
                    ("rightQuery", right),
                    ("rightFrom", &from),
                    ("rightUntil", &until),
                ],
            )
            .await
        }
    };
    let (status, body) = diff("app.cpu", "app.alloc_space").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("units"), "{body}");
    let (status, body) = diff("app.cpu", "fast.cpu").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("sample rate"), "{body}");
    // An empty side takes the other's metadata.
    let (status, body) = diff("app.cpu", "nothing.cpu").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let body: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(body["metadata"]["appName"], "diff_app.cpu_nothing.cpu");
    assert_eq!(body["leftTicks"], 1);
}

#[tokio::test]
async fn bad_parameters_are_400s_that_name_the_parameter() {
    let agg = Aggregator::start().await;
    // (path, query, the parameter the error must name)
    type Case = (
        &'static str,
        &'static [(&'static str, &'static str)],
        &'static str,
    );
    let cases: &[Case] = &[
        ("/render", &[], "query"),
        ("/render", &[("query", "app.cpu{env=prod}")], "query"),
        ("/render", &[("name", "app.cpu{env")], "name"),
        (
            "/render",
            &[("query", "app.cpu"), ("from", "yesterday")],
            "from",
        ),
        (
            "/render",
            &[("query", "app.cpu"), ("until", "now-1x")],
            "until",
        ),
        (
            "/render",
            &[("query", "app.cpu"), ("from", "now"), ("until", "now-1h")],
            "until",
        ),
        (
            "/render",
            &[("query", "app.cpu"), ("format", "html")],
            "format",
        ),
        (
            "/render",
            &[("query", "app.cpu"), ("maxNodes", "many")],
            "maxNodes",
        ),
        (
            "/render",
            &[("query", "app.cpu"), ("max-nodes", "1.5")],
            "max-nodes",
        ),
        (
            "/render",
            &[("query", "app.cpu"), ("groupBy", "a-b")],
            "groupBy",
        ),
        ("/render-diff", &[("rightQuery", "app.cpu")], "leftQuery"),
        ("/render-diff", &[("leftQuery", "app.cpu")], "rightQuery"),
        (
            "/render-diff",
            &[
                ("leftQuery", "a.cpu"),
                ("rightQuery", "a.cpu"),
                ("rightFrom", "soon"),
            ],
            "rightFrom",
        ),
        (
            "/render-diff",
            &[
                ("leftQuery", "a.cpu"),
                ("rightQuery", "a.cpu"),
                ("format", "collapsed"),
            ],
            "format",
        ),
        ("/label-values", &[], "label"),
        (
            "/label-values",
            &[("label", "env"), ("query", "{")],
            "query",
        ),
        ("/labels", &[("from", "tomorrow")], "from"),
    ];
    for (path, query, parameter) in cases {
        let (status, body) = get(&agg, path, query).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {query:?}: {body}");
        assert!(
            body.contains(&format!("`{parameter}`")),
            "{path} {query:?}: {body:?} should name `{parameter}`"
        );
    }
    let metrics = Metrics::scrape(&agg.url("/metrics")).await;
    assert_eq!(
        metrics.value(
            "smolder_aggregator_errors_total",
            &[("error_type", "invalid_time"), ("stage", "query")]
        ),
        4.0
    );
}

#[tokio::test]
async fn group_by_past_max_groups_is_refused() {
    let mut config = smolder_aggregator::config::Config::default();
    config.query.max_groups = 2;
    let agg = Aggregator::with_config(config).await;
    let at = base();
    for host in ["a", "b", "c"] {
        ingest(
            &agg,
            &format!("app.cpu{{host={host}}}"),
            at,
            "main 1\n",
            &[],
        )
        .await;
    }
    let range = [("from", at.to_string()), ("until", (at + 10).to_string())];
    let query: Vec<(&str, &str)> = [("query", "app.cpu"), ("groupBy", "host")]
        .into_iter()
        .chain(range.iter().map(|(k, v)| (*k, v.as_str())))
        .collect();
    let (status, body) = get(&agg, "/render", &query).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("query.max-groups"), "{body}");
}

#[tokio::test]
async fn answered_queries_are_timed_by_endpoint_and_format_and_measure_what_they_merged() {
    let agg = Aggregator::start().await;
    let at = base();
    ingest(&agg, "app.cpu{env=prod}", at, EXAMPLE, &[]).await;
    ingest(&agg, "app.cpu{env=dev}", at, "foo;bar 5\n", &[]).await;
    let range = [("from", at.to_string()), ("until", (at + 10).to_string())];
    let range: Vec<(&str, &str)> = range.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let with = |extra: &[(&'static str, &'static str)]| -> Vec<(&str, &str)> {
        range.iter().copied().chain(extra.iter().copied()).collect()
    };
    get_json(&agg, "/render", &with(&[("query", "app.cpu")])).await;
    let (status, _) = get(
        &agg,
        "/render",
        &with(&[("query", "app.cpu"), ("format", "collapsed")]),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    get_json(&agg, "/label-values", &[("label", "env")]).await;
    // A refused query is counted as an error, not timed.
    let (status, _) = get(&agg, "/render", &[("query", "app.cpu"), ("from", "soon")]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let metrics = Metrics::scrape(&agg.url("/metrics")).await;
    for (endpoint, format) in [
        ("render", "json"),
        ("render", "collapsed"),
        ("label_values", "json"),
    ] {
        assert_eq!(
            metrics.value(
                "smolder_aggregator_query_duration_seconds_count",
                &[("endpoint", endpoint), ("format", format)]
            ),
            1.0,
            "{endpoint} {format}"
        );
    }
    let render = [("endpoint", "render")];
    // Two renders, each of both series: 4 series in all.
    assert_eq!(
        metrics.value("smolder_aggregator_query_series_merged_sum", &render),
        4.0
    );
    assert_eq!(
        metrics.value("smolder_aggregator_query_series_merged_count", &render),
        2.0
    );
    // foo, bar, baz and qux (the root is not a node of a tree's length): 4 per render.
    assert_eq!(
        metrics.value("smolder_aggregator_query_nodes_merged_sum", &render),
        8.0
    );
}
