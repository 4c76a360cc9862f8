//! Rules over real HTTP: Pyroscope's documented example on `/exported-metrics` for folded, pprof,
//! Connect-push ingest and an agent's QUIC batches; the recording-rules API with persistence across a restart; every
//! invalid rule answered with a 4xx naming the rule and the problem.

use std::net::SocketAddr;

use prost::Message;
use reqwest::StatusCode;
use serde_json::json;
use smolder_aggregator::app;
use smolder_aggregator::config::Config;
use smolder_common::pprof::{self, EncodeOptions};
use smolder_test_support::prometheus::Metrics;
use smolder_test_support::rules::DOCUMENTED_RULES;

use crate::util::{Aggregator, tree, wire};

/// The Go example app's stacks: `slowFunction` does four times the work of `fastFunction`.
pub(crate) const PROD_STACKS: &[(&str, u64)] = &[
    ("runtime.main;main.main;main.slowFunction;main.work", 412),
    ("runtime.main;main.main;main.fastFunction;main.work", 103),
    ("runtime.main;main.main;main.slowFunction", 7),
    ("runtime.gcBgMarkWorker;runtime.gcDrain", 9),
];
pub(crate) const STAGING_STACKS: &[(&str, u64)] = &[
    ("runtime.main;main.main;main.slowFunction;main.work", 390),
    ("runtime.main;main.main;main.fastFunction;main.work", 98),
    ("runtime.gcBgMarkWorker;runtime.gcDrain", 4),
];

async fn exported(agg: &Aggregator) -> Metrics {
    let response = agg
        .http
        .get(agg.url("/exported-metrics"))
        .send()
        .await
        .expect("GET /exported-metrics");
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    Metrics::parse(&response.text().await.unwrap()).expect("Prometheus text")
}

async fn ingest(agg: &Aggregator, query: &[(&str, &str)], body: Vec<u8>) {
    let response = agg
        .http
        .post(agg.url("/ingest"))
        .query(query)
        .body(body)
        .send()
        .await
        .expect("POST /ingest");
    let status = response.status();
    assert_eq!(status, StatusCode::OK, "{}", response.text().await.unwrap());
}

fn folded(stacks: &[(&str, u64)]) -> Vec<u8> {
    stacks
        .iter()
        .map(|(stack, value)| format!("{stack} {value}\n"))
        .collect::<String>()
        .into_bytes()
}

/// CPU seconds of the stored stacks of `query` that contain `needle`, read back through
/// `/render`: computed from the stored data, independently of the rules.
async fn stored_seconds(agg: &Aggregator, query: &str, needle: &str, rate: f64) -> f64 {
    agg.collapsed(query)
        .await
        .lines()
        .filter(|line| line.contains(needle))
        .map(|line| line.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum::<f64>()
        / rate
}

fn documented_config() -> Config {
    serde_norway::from_str(DOCUMENTED_RULES).expect("the documented rules load unchanged")
}

fn assert_close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() < 1e-9, "{what}: got {got}, want {want}");
}

#[tokio::test]
async fn pyroscope_documentation_example_counts_the_seconds_of_matching_stacks() {
    let agg = Aggregator::with_config(documented_config()).await;
    // Before any data, the rules without labels are there at zero.
    let before = exported(&agg).await;
    assert_eq!(before.value("a_simple_app_total", &[]), 0.0);
    assert!(
        !before
            .samples()
            .iter()
            .any(|sample| sample.name == "a_simple_app_slow_env" && !sample.labels.is_empty())
    );

    // prod through folded at 100 Hz, staging through the Go SDK's pprof (CPU nanoseconds at
    // 100 Hz, converted to samples), a third series through Connect push.
    ingest(
        &agg,
        &[
            ("name", "simple.golang.app.cpu{env=prod}"),
            ("sampleRate", "100"),
        ],
        folded(PROD_STACKS),
    )
    .await;
    let pprof_body =
        pprof::encode(&tree(STAGING_STACKS), &EncodeOptions::cpu_samples(100)).to_bytes(true);
    ingest(
        &agg,
        &[
            ("name", "simple.golang.app{env=staging}"),
            ("format", "pprof"),
        ],
        pprof_body,
    )
    .await;
    let push = wire::PushRequest {
        series: vec![wire::RawProfileSeries {
            labels: [
                ("__name__", "process_cpu"),
                ("service_name", "simple.golang.app"),
                ("env", "dev"),
            ]
            .into_iter()
            .map(|(name, value)| wire::LabelPair {
                name: name.to_owned(),
                value: value.to_owned(),
            })
            .collect(),
            samples: vec![wire::RawSample {
                raw_profile: pprof::encode(
                    &tree(&[("main.main;main.slowFunction", 50)]),
                    &EncodeOptions::cpu_samples(100),
                )
                .to_bytes(false),
                id: String::new(),
            }],
        }],
    };
    let response = agg
        .http
        .post(agg.url("/push.v1.PusherService/Push"))
        .header("content-type", "application/proto")
        .body(push.encode_to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "{}",
        response.text().await.unwrap()
    );

    let got = exported(&agg).await;
    let all = "simple.golang.app.cpu{}";
    let prod = "simple.golang.app.cpu{env=\"prod\"}";
    let staging = "simple.golang.app.cpu{env=\"staging\"}";
    let dev = "simple.golang.app.cpu{env=\"dev\"}";
    assert_close(
        got.value("a_simple_app_total", &[]),
        stored_seconds(&agg, all, "", 100.0).await,
        "total",
    );
    assert_close(
        got.value("a_simple_app_total", &[]),
        10.73,
        "total, by hand",
    );
    assert_close(
        got.value("a_simple_app_slow_env_prod", &[]),
        stored_seconds(&agg, prod, "slowFunction", 100.0).await,
        "prod",
    );
    assert_close(
        got.value("a_simple_app_slow_env_prod", &[]),
        4.19,
        "prod, by hand",
    );
    for (env, query) in [("prod", prod), ("staging", staging), ("dev", dev)] {
        assert_close(
            got.value("a_simple_app_slow_env", &[("env", env)]),
            stored_seconds(&agg, query, "slowFunction", 100.0).await,
            env,
        );
    }
    agg.stop().await;
}

#[tokio::test]
async fn pyroscopes_example_server_config_loads_unchanged() {
    // `examples/metrics-export/pyroscope/server.yml` of Pyroscope v0.37, minus its log level.
    let config: Config = serde_norway::from_str(
        r#"
metrics-export-rules:
  # The metrics is a sum of all observed CPU samples of 'slowFunction'
  # of production app instance.
  app_slow_function_prod_cpu_seconds_total:
    expr: simple.golang.app.cpu{env="prod"}
    node: slowFunction

  # The metrics is a sum of all observed CPU samples of 'slowFunction'
  # with break down by 'env' tag.
  app_slow_function_env_cpu_seconds_total:
    expr: simple.golang.app.cpu
    node: slowFunction
    group_by: [env]

  app_cpu_seconds_total:
    expr: simple.golang.app.cpu

  app_alloc_space_bytes:
    expr: simple.golang.app.alloc_space
"#,
    )
    .unwrap();
    let agg = Aggregator::with_config(config).await;
    let pprof_body = pprof::encode(
        &tree(&[("main.main;main.slowFunction", 4096)]),
        &EncodeOptions::new("alloc_space", "bytes"),
    )
    .to_bytes(true);
    ingest(
        &agg,
        &[("name", "simple.golang.app{env=prod}"), ("format", "pprof")],
        pprof_body,
    )
    .await;
    let got = exported(&agg).await;
    assert_eq!(
        got.value("app_alloc_space_bytes", &[]),
        4096.0,
        "bytes stay bytes"
    );
    assert_eq!(got.value("app_cpu_seconds_total", &[]), 0.0);
    agg.stop().await;
}

async fn call(
    agg: &Aggregator,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> (StatusCode, String) {
    let mut request = agg.http.request(method, agg.url(path));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    (status, response.text().await.unwrap())
}

async fn list(agg: &Aggregator) -> serde_json::Value {
    let (status, text) = call(agg, reqwest::Method::GET, "/api/recording-rules", None).await;
    assert_eq!(status, StatusCode::OK);
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn recording_rules_are_created_listed_updated_deleted_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let start = |config: Config| {
        let mut config = config;
        config.http.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        config.ingest.quic.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        app::start(config, dir.path())
    };
    let running = start(documented_config()).await.unwrap();
    let base = format!("http://{}", running.addr());
    let http = reqwest::Client::new();
    let rule = json!({
        "name": "checkout_gc_seconds_total",
        "expr": "checkout.cpu{env=~\"prod|staging\"}",
        "node": "",
        "function": "runtime.gcBgMarkWorker",
        "group_by": ["env"],
    });
    let created = http
        .post(format!("{base}/api/recording-rules"))
        .json(&rule)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let mut expected = rule.clone();
    expected["provisioned"] = json!(false);
    assert_eq!(created.json::<serde_json::Value>().await.unwrap(), expected);

    // Data ingested after the rule counts.
    let response = http
        .post(format!("{base}/ingest"))
        .query(&[("name", "checkout.cpu{env=prod}"), ("sampleRate", "100")])
        .body("runtime.gcBgMarkWorker;runtime.gcDrain 30\nmain;serve 70\n")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = http
        .get(format!("{base}/exported-metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        Metrics::parse(&text)
            .expect("Prometheus text")
            .value("checkout_gc_seconds_total", &[("env", "prod")]),
        0.3
    );

    let listed: serde_json::Value = http
        .get(format!("{base}/api/recording-rules"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names: Vec<(&str, bool)> = listed["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap(),
                r["provisioned"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("a_simple_app_slow_env", true),
            ("a_simple_app_slow_env_prod", true),
            ("a_simple_app_total", true),
            ("checkout_gc_seconds_total", false),
        ]
    );

    // Update: the counter restarts under the new definition.
    let mut changed = rule.clone();
    changed["node"] = json!("gcDrain$");
    changed["group_by"] = json!([]);
    let updated = http
        .put(format!(
            "{base}/api/recording-rules/checkout_gc_seconds_total"
        ))
        .json(&changed)
        .send()
        .await
        .unwrap();
    assert_eq!(updated.status(), StatusCode::OK);
    assert_eq!(
        updated.json::<serde_json::Value>().await.unwrap()["node"],
        "gcDrain$"
    );
    let text = http
        .get(format!("{base}/exported-metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        Metrics::parse(&text)
            .expect("Prometheus text")
            .value("checkout_gc_seconds_total", &[]),
        0.0,
        "{text}"
    );

    // A second rule to delete after the restart.
    let other = json!({"name": "checkout_total", "expr": "checkout.cpu"});
    let created = http
        .post(format!("{base}/api/recording-rules"))
        .json(&other)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    running.stop().await.unwrap();

    // Restarted without the config file's rules: the API's rules are back, as updated.
    let running = start(Config::default()).await.unwrap();
    let base = format!("http://{}", running.addr());
    let listed: serde_json::Value = http
        .get(format!("{base}/api/recording-rules"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut changed_view = changed.clone();
    changed_view["provisioned"] = json!(false);
    let other_view = json!({
        "name": "checkout_total", "expr": "checkout.cpu", "node": "", "function": "",
        "group_by": [], "provisioned": false
    });
    assert_eq!(listed, json!({"rules": [changed_view, other_view]}));
    let deleted = http
        .delete(format!("{base}/api/recording-rules/checkout_total"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    running.stop().await.unwrap();

    let running = start(Config::default()).await.unwrap();
    let base = format!("http://{}", running.addr());
    let listed: serde_json::Value = http
        .get(format!("{base}/api/recording-rules"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["rules"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["rules"][0]["name"], "checkout_gc_seconds_total");
    running.stop().await.unwrap();
}

/// A method, a path and an optional JSON body.
type Request = (reqwest::Method, String, Option<serde_json::Value>);

#[tokio::test]
async fn invalid_rules_are_a_4xx_naming_the_rule_and_the_problem() {
    use reqwest::Method;
    let agg = Aggregator::with_config(documented_config()).await;
    let post =
        |body: serde_json::Value| (Method::POST, "/api/recording-rules".to_owned(), Some(body));
    let cases: Vec<(Request, StatusCode, &str)> = vec![
        (
            post(json!({"name": "slow", "node": "slow(Function"})),
            StatusCode::BAD_REQUEST,
            "rule \"slow\": invalid node regex \"slow(Function\"",
        ),
        (
            post(json!({"name": "9_lives"})),
            StatusCode::BAD_REQUEST,
            "rule \"9_lives\": invalid metric name",
        ),
        (
            post(json!({"name": "bad_expr", "expr": "app.cpu{env=prod}"})),
            StatusCode::BAD_REQUEST,
            "rule \"bad_expr\": invalid expr \"app.cpu{env=prod}\": label values must be double-quoted",
        ),
        (
            post(json!({"name": "bad_label", "group_by": ["service.name"]})),
            StatusCode::BAD_REQUEST,
            "rule \"bad_label\": invalid group_by label \"service.name\"",
        ),
        (
            post(json!({"name": "twice", "group_by": ["env", "env"]})),
            StatusCode::BAD_REQUEST,
            "rule \"twice\": group_by label \"env\" is listed twice",
        ),
        (
            post(json!({"expr": "app.cpu"})),
            StatusCode::BAD_REQUEST,
            "rule has no name",
        ),
        (
            post(json!({"name": "x", "nod": "typo"})),
            StatusCode::BAD_REQUEST,
            "invalid rule body: unknown field `nod`",
        ),
        (
            post(json!({"name": "a_simple_app_total"})),
            StatusCode::CONFLICT,
            "rule \"a_simple_app_total\" is provisioned from the config file",
        ),
        (
            (
                Method::PUT,
                "/api/recording-rules/a_simple_app_total".to_owned(),
                Some(json!({"expr": "x.cpu"})),
            ),
            StatusCode::CONFLICT,
            "rule \"a_simple_app_total\" is provisioned",
        ),
        (
            (
                Method::DELETE,
                "/api/recording-rules/a_simple_app_slow_env".to_owned(),
                None,
            ),
            StatusCode::CONFLICT,
            "rule \"a_simple_app_slow_env\" is provisioned",
        ),
        (
            (
                Method::DELETE,
                "/api/recording-rules/nothing_here".to_owned(),
                None,
            ),
            StatusCode::NOT_FOUND,
            "rule \"nothing_here\" does not exist",
        ),
        (
            (
                Method::PUT,
                "/api/recording-rules/nothing_here".to_owned(),
                Some(json!({"expr": "x.cpu"})),
            ),
            StatusCode::NOT_FOUND,
            "rule \"nothing_here\" does not exist",
        ),
    ];
    for ((method, path, body), status, message) in cases {
        let (got, text) = call(&agg, method.clone(), &path, body.clone()).await;
        assert_eq!(got, status, "{method} {path} {body:?}: {text}");
        assert!(
            text.starts_with(message),
            "{method} {path} {body:?}: {text}"
        );
    }

    // A duplicate of an API-made rule, and a rename through PUT.
    let (status, _) = call(
        &agg,
        Method::POST,
        "/api/recording-rules",
        Some(json!({"name": "mine"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, text) = call(
        &agg,
        Method::POST,
        "/api/recording-rules",
        Some(json!({"name": "mine"})),
    )
    .await;
    assert_eq!(
        (status, text.as_str()),
        (StatusCode::CONFLICT, "rule \"mine\" already exists\n")
    );
    let (status, text) = call(
        &agg,
        Method::PUT,
        "/api/recording-rules/mine",
        Some(json!({"name": "yours"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        text.starts_with("rule \"mine\": the body names rule \"yours\""),
        "{text}"
    );
    let listed = list(&agg).await;
    assert_eq!(
        listed["rules"].as_array().unwrap().len(),
        4,
        "nothing invalid was kept"
    );
    agg.stop().await;
}

#[tokio::test]
async fn an_invalid_provisioned_rule_stops_startup_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut config: Config = serde_norway::from_str(
        "metrics-export-rules:\n  app_slow:\n    expr: app.cpu\n    node: '(unclosed'\n",
    )
    .unwrap();
    config.http.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.ingest.quic.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    let err = app::start(config, dir.path()).await.err().expect("refused");
    let text = format!("{err:#}");
    assert!(
        text.contains("rule \"app_slow\": invalid node regex \"(unclosed\""),
        "{text}"
    );
}

#[tokio::test]
async fn pyroscope_documentation_example_counts_quic_batches_from_an_agent() {
    use smolder_test_support::wait::eventually;

    use crate::transport::{agent_config, profile};

    let agg = Aggregator::with_config(documented_config()).await;
    let state = tempfile::tempdir().unwrap();
    let agent =
        smolder_agent::app::start_in(agent_config(agg.quic_addr(), agg.dir()), state.path())
            .await
            .unwrap();
    let submitter = agent.submitter();
    let now = std::time::SystemTime::now();
    for (series, stacks) in [
        ("simple.golang.app.cpu{env=prod}", PROD_STACKS),
        ("simple.golang.app.cpu{env=staging}", STAGING_STACKS),
    ] {
        for (stack, value) in stacks {
            submitter
                .submit(profile(series, stack, *value, now))
                .await
                .unwrap();
        }
    }
    drop(submitter);
    let all = "simple.golang.app.cpu{}";
    let expected_samples: u64 = PROD_STACKS
        .iter()
        .chain(STAGING_STACKS)
        .map(|(_, v)| v)
        .sum();
    eventually(
        std::time::Duration::from_secs(20),
        "the batch is stored",
        || async {
            crate::transport::ticks(&agg.http, &agg.url(""), all).await == expected_samples
        },
    )
    .await;
    let got = exported(&agg).await;
    // The agent's eBPF-style profiles are sampled at 99 Hz.
    assert_close(
        got.value("a_simple_app_total", &[]),
        stored_seconds(&agg, all, "", 99.0).await,
        "total",
    );
    assert_close(
        got.value("a_simple_app_slow_env_prod", &[]),
        stored_seconds(
            &agg,
            "simple.golang.app.cpu{env=\"prod\"}",
            "slowFunction",
            99.0,
        )
        .await,
        "prod",
    );
    assert_close(
        got.value("a_simple_app_slow_env", &[("env", "staging")]),
        stored_seconds(
            &agg,
            "simple.golang.app.cpu{env=\"staging\"}",
            "slowFunction",
            99.0,
        )
        .await,
        "staging",
    );
    agent.stop().await.unwrap();
    agg.stop().await;
}
