//! What the aggregators of one bucket share besides the data, against real Garage nodes: a
//! recording rule made through one aggregator counts on another within a poll, outlives the
//! first's data directory and is deleted everywhere through any; the rules a data directory held
//! before move into the bucket at its first start there; aggregators started at the same moment
//! on an empty bucket settle on one development CA and one agent and admin token, and one agent
//! with that CA and token ships to each of them.

use std::time::{Duration, SystemTime};

use reqwest::{Method, StatusCode};
use serde_json::json;
use smolder_aggregator::app;
use smolder_aggregator::config::{Config, S3Config};
use smolder_test_support::garage::Garage;
use smolder_test_support::prometheus::Metrics;
use smolder_test_support::wait::eventually;

use crate::object_store::{config, current_aggregator, garage, s3};
use crate::util::Aggregator;

/// The rule the tests make through the API.
const RULE: &str = "shared_seconds_total";

/// The sample rate the tests push at: a sample is 10 ms of CPU.
const RATE: f64 = 100.0;

/// `store.object-store` on `garage`'s bucket, polled every 200 ms.
fn on_bucket(garage: &Garage) -> Config {
    config(S3Config {
        poll_interval: Duration::from_millis(200),
        orphan_after: Duration::from_secs(2),
        ..s3(garage)
    })
}

/// `method path` on `agg` with a JSON `body`; the status.
async fn call(agg: &Aggregator, method: Method, path: &str, body: serde_json::Value) -> StatusCode {
    agg.http
        .request(method, agg.url(path))
        .json(&body)
        .send()
        .await
        .expect("request")
        .status()
}

/// The rules `agg` lists, as `/api/recording-rules` answers.
async fn rules_of(agg: &Aggregator) -> serde_json::Value {
    agg.http
        .get(agg.url("/api/recording-rules"))
        .send()
        .await
        .expect("GET /api/recording-rules")
        .json()
        .await
        .expect("json")
}

/// The names of the rules `agg` lists.
async fn listed(agg: &Aggregator) -> Vec<String> {
    rules_of(agg).await["rules"]
        .as_array()
        .expect("a list of rules")
        .iter()
        .map(|rule| rule["name"].as_str().expect("a name").to_owned())
        .collect()
}

/// [`RULE`] on `agg`'s `/exported-metrics`; `None` when it is not there.
async fn exported(agg: &Aggregator) -> Option<f64> {
    agg.exported(RULE).await
}

/// Pushes `samples` samples of `shared.cpu` to `agg`; the CPU seconds they are, computed from
/// what `/render` then reads back of them (the stored truth, independent of the rules).
async fn push(agg: &Aggregator, samples: u64) -> f64 {
    let before = stored(agg).await;
    let response = agg
        .http
        .post(agg.url("/ingest"))
        .query(&[("name", "shared.cpu"), ("sampleRate", "100")])
        .body(format!("main;work {samples}\n"))
        .send()
        .await
        .expect("POST /ingest");
    assert_eq!(response.status(), StatusCode::OK);
    (stored(agg).await - before) as f64 / RATE
}

/// Asserts that the rule's counter is there and `want`, up to rounding.
fn assert_close(got: Option<f64>, want: f64) {
    let got = got.expect("the rule's counter on /exported-metrics");
    assert!((got - want).abs() < 1e-9, "counted {got}, stored {want}");
}

/// Samples of `shared.cpu` stored from an hour ago to a minute ahead.
async fn stored(agg: &Aggregator) -> u64 {
    crate::transport::ticks(&agg.http, &agg.url(""), "shared.cpu").await
}

/// A rule made through A and deleted through B before B's poll found it: B answers that it
/// deleted it (the bucket has it), and it is gone everywhere.
#[tokio::test(flavor = "multi_thread")]
async fn a_rule_made_through_one_aggregator_is_deleted_through_another_before_its_poll() {
    let garage = garage().await;
    let a = Aggregator::with_config(on_bucket(&garage)).await;
    // B polls the bucket once a minute: within the test it does not learn of the rule.
    let mut slow = on_bucket(&garage);
    if let smolder_aggregator::config::ObjectStoreConfig::S3(s3) = &mut slow.store.object_store {
        s3.poll_interval = Duration::from_secs(60);
        s3.orphan_after = Duration::from_secs(180);
    }
    let b = Aggregator::with_config(slow).await;
    let rule = json!({"name": RULE, "expr": "shared.cpu"});
    assert_eq!(
        call(&a, Method::POST, "/api/recording-rules", rule).await,
        StatusCode::CREATED
    );
    assert!(listed(&b).await.is_empty(), "B has not polled");
    let path = format!("/api/recording-rules/{RULE}");
    assert_eq!(
        call(&b, Method::DELETE, &path, json!({})).await,
        StatusCode::NO_CONTENT
    );
    eventually(Duration::from_secs(10), "the rule gone from A", || async {
        listed(&a).await.is_empty()
    })
    .await;
    assert_eq!(
        call(&b, Method::DELETE, &path, json!({})).await,
        StatusCode::NOT_FOUND,
        "gone from the bucket too"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rule_made_through_one_aggregator_counts_on_another_and_outlives_a_lost_data_directory() {
    let garage = garage().await;
    let a = Aggregator::with_config(on_bucket(&garage)).await;
    let b = Aggregator::with_config(on_bucket(&garage)).await;
    let rule = json!({"name": RULE, "expr": "shared.cpu"});
    assert_eq!(
        call(&a, Method::POST, "/api/recording-rules", rule.clone()).await,
        StatusCode::CREATED
    );
    assert_eq!(listed(&a).await, [RULE]);
    // In force on B within a few polls; counting there what is pushed to B.
    eventually(Duration::from_secs(10), "the rule listed by B", || async {
        listed(&b).await == [RULE]
    })
    .await;
    eventually(
        Duration::from_secs(10),
        "the rule's counter on B",
        || async { exported(&b).await == Some(0.0) },
    )
    .await;
    let seconds = push(&b, 7).await;
    assert!(seconds > 0.0);
    assert_close(exported(&b).await, seconds);
    // Made again through B: taken.
    assert_eq!(
        call(&b, Method::POST, "/api/recording-rules", rule.clone()).await,
        StatusCode::CONFLICT
    );

    // A loses its data directory: a new one on the bucket has the rule from the start.
    let lost = a.stop().await;
    std::fs::remove_dir_all(&lost).unwrap();
    let a = Aggregator::with_config(on_bucket(&garage)).await;
    assert_eq!(listed(&a).await, [RULE]);
    let seconds = push(&a, 3).await;
    assert_close(exported(&a).await, seconds);

    // Changed through A, then deleted through B: gone from A too.
    let changed = json!({"expr": "shared.cpu", "function": "work"});
    let path = format!("/api/recording-rules/{RULE}");
    assert_eq!(call(&a, Method::PUT, &path, changed).await, StatusCode::OK);
    eventually(Duration::from_secs(10), "B has the change", || async {
        rules_of(&b).await["rules"][0]["function"] == "work"
    })
    .await;
    assert_eq!(
        call(&b, Method::DELETE, &path, json!({})).await,
        StatusCode::NO_CONTENT
    );
    assert!(listed(&b).await.is_empty());
    eventually(Duration::from_secs(10), "the rule gone from A", || async {
        listed(&a).await.is_empty() && exported(&a).await.is_none()
    })
    .await;
    // A's own change was in force at once; B's deletion is the one change A's polls found.
    let metrics = Metrics::scrape(&a.url("/metrics")).await;
    assert_eq!(
        metrics.value("smolder_aggregator_store_shared_rules", &[]),
        0.0
    );
    assert_eq!(
        metrics.value("smolder_aggregator_store_shared_rule_changes_total", &[]),
        1.0
    );
    assert_eq!(
        metrics.value("smolder_aggregator_rules_reloads_total", &[]),
        1.0
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rules_of_a_data_directory_move_to_the_bucket_at_its_first_start_there() {
    let garage = garage().await;
    let dir = tempfile::tempdir().unwrap();
    let start = |config: Config| {
        let mut config = config;
        config.http.listen = smolder_test_support::net::LOOPBACK_ANY_PORT;
        config.ingest.quic.listen = smolder_test_support::net::LOOPBACK_ANY_PORT;
        app::start(config, dir.path())
    };
    // A rule made in local mode.
    let local = start(Config::default()).await.unwrap();
    let made = reqwest::Client::new()
        .post(format!("http://{}/api/recording-rules", local.addr()))
        .json(&json!({"name": RULE, "expr": "shared.cpu"}))
        .send()
        .await
        .unwrap();
    assert_eq!(made.status(), StatusCode::CREATED);
    local.stop().await.unwrap();

    // The same data directory on a bucket: the rule is uploaded, and another aggregator on the
    // bucket has it.
    let moved = start(on_bucket(&garage)).await.unwrap();
    let other = Aggregator::with_config(on_bucket(&garage)).await;
    assert_eq!(listed(&other).await, [RULE]);
    assert_eq!(
        call(
            &other,
            Method::DELETE,
            &format!("/api/recording-rules/{RULE}"),
            json!({})
        )
        .await,
        StatusCode::NO_CONTENT
    );
    moved.stop().await.unwrap();
    // Deleted through the other, it does not come back from the data directory.
    let again = start(on_bucket(&garage)).await.unwrap();
    let rules: serde_json::Value = reqwest::Client::new()
        .get(format!("http://{}/api/recording-rules", again.addr()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(rules["rules"], json!([]));
    again.stop().await.unwrap();
    other.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn aggregators_started_together_share_one_ca_and_tokens_and_one_agent_ships_to_each() {
    let garage = garage().await;
    let (a, b) = tokio::join!(
        Aggregator::with_config(on_bucket(&garage)),
        Aggregator::with_config(on_bucket(&garage))
    );
    let read = |agg: &Aggregator, file: &str| {
        std::fs::read(agg.dir().join("tls").join(file))
            .unwrap_or_else(|err| panic!("{file}: {err}"))
    };
    for file in ["ca.pem", "ca.key", "agent-token", "admin-token"] {
        assert_eq!(read(&a, file), read(&b, file), "{file} differs");
    }
    // Each signs its own server certificate with the one CA.
    assert_ne!(read(&a, "server.pem"), read(&b, "server.pem"));
    // B takes A's admin token as its own (not merely as a client on its host).
    let admin = String::from_utf8(read(&a, "admin-token")).unwrap();
    let session: serde_json::Value = b.get_json_as("/api/session", admin.trim()).await;
    assert_eq!(session["name"], "development admin token", "{session}");

    // One agent with A's CA and token, configured with both.
    let mut agent_config = crate::transport::agent_config(a.quic_addr(), a.dir());
    agent_config.ship.aggregator = smolder_agent::config::ShipConfig::default().aggregator;
    agent_config.ship.aggregators = [&a, &b]
        .iter()
        .map(|agg| agg.quic_addr().to_string())
        .collect();
    let state = tempfile::tempdir().unwrap();
    let agent = smolder_agent::app::start_in(agent_config, state.path())
        .await
        .unwrap();
    let submitter = agent.submitter();
    let acked = || async {
        crate::transport::agent_metrics(&agent)
            .await
            .value("smolder_agent_ship_batches_acked_total", &[])
    };
    let submit = |i: u64| {
        let submitter = submitter.clone();
        async move {
            let profile = crate::transport::profile(
                "identity.cpu",
                "main;work",
                i % 5 + 1,
                SystemTime::now(),
            );
            submitter.submit(profile).await.unwrap();
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let mut i = 0;
    while acked().await < 2.0 {
        submit(i).await;
        i += 1;
        assert!(i < 80, "no batch acknowledged in 20 s");
    }
    let first = current_aggregator(&agent)
        .await
        .expect("a current aggregator");
    let (first, second) = if first == a.quic_addr() {
        (a, b)
    } else {
        (b, a)
    };
    // The one it ships to goes: it ships to the other, verified by the same CA and token.
    let before = acked().await;
    first.stop().await;
    let stopped = std::time::Instant::now();
    while !(current_aggregator(&agent).await == Some(second.quic_addr()) && acked().await > before)
    {
        submit(i).await;
        i += 1;
        assert!(
            stopped.elapsed() < Duration::from_secs(30),
            "no batch acknowledged by the other aggregator 30 s after the first stopped"
        );
    }
    let metrics = crate::transport::agent_metrics(&agent).await;
    assert_eq!(
        metrics.value("smolder_agent_ship_batches_rejected_total", &[]),
        0.0,
        "{metrics:?}"
    );
    drop(submitter);
    agent.stop().await.unwrap();
    second.stop().await;
}
