//! Agents shipping to the aggregator over QUIC: real agents (in-process, with real spools on
//! disk) and real aggregators (in-process, or as processes killed with SIGKILL or cut off in a
//! network namespace), on loopback or a veth pair.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use smolder_agent::app::{self as agent_app, Running as Agent};
use smolder_agent::config::Config as AgentConfig;
use smolder_common::{Profile, ProfileMeta, Tree};
use smolder_test_support::health::{probe, until};
use smolder_test_support::net::LOOPBACK_ANY_PORT;
use smolder_test_support::netns::Netns;
use smolder_test_support::prometheus::Metrics;
use smolder_test_support::wait::eventually;

use crate::util::{Aggregator, AggregatorProcess};

/// An agent configuration shipping to `quic` with the development CA and token of the
/// aggregator whose data directory is `data`; short windows so that tests see batches soon.
pub(crate) fn agent_config(quic: SocketAddr, data: &Path) -> AgentConfig {
    let mut config = AgentConfig {
        hostname: "test-host".to_owned(),
        ..AgentConfig::default()
    };
    config.http.listen = LOOPBACK_ANY_PORT;
    // These tests count the batches of the profiles they submit; the eBPF CPU source would add
    // the host's own.
    config.ebpf.enabled = false;
    config.window.length = Duration::from_millis(250);
    config.window.settle = Duration::ZERO;
    config.ship.aggregator = quic.to_string();
    config.ship.ca = data.join("tls/ca.pem");
    config.ship.token_file = data.join("tls/agent-token");
    config.ship.backoff_min = Duration::from_millis(50);
    config.ship.backoff_max = Duration::from_millis(500);
    config.ship.ack_timeout = Duration::from_secs(10);
    config
}

/// A profile of one stack (`;`-separated, root first) ending at `at`.
pub(crate) fn profile(series: &str, stack: &str, value: u64, at: SystemTime) -> Profile {
    let mut tree = Tree::new();
    tree.insert_names(stack.split(';'), value);
    Profile {
        series: series.parse().unwrap(),
        meta: ProfileMeta {
            spy_name: "ebpfspy".to_owned(),
            sample_rate: 99,
            units: "samples".to_owned(),
            ..ProfileMeta::default()
        },
        from: at - Duration::from_millis(1),
        until: at,
        tree,
    }
}

/// Submits profiles of `series` to `agent`, one every `every` (each of one of five stacks,
/// values 1 to 7), until `stop` completes, from a task whose result is the samples submitted.
pub(crate) fn steady_profiles(
    agent: &Agent,
    series: &'static str,
    every: Duration,
    stop: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<u64> {
    let submitter = agent.submitter();
    tokio::spawn(async move {
        tokio::pin!(stop);
        let mut produced = 0;
        for i in 0.. {
            let value = i % 7 + 1;
            submitter
                .submit(profile(
                    series,
                    &format!("main;f{}", i % 5),
                    value,
                    SystemTime::now(),
                ))
                .await
                .unwrap();
            produced += value;
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = &mut stop => break,
            }
        }
        produced
    })
}

/// `/metrics` of an agent.
pub(crate) async fn agent_metrics(agent: &Agent) -> Metrics {
    Metrics::scrape(&format!("http://{}/metrics", agent.addr())).await
}

/// Total samples of `query` stored from an hour ago to a minute ahead.
pub(crate) async fn ticks(http: &reqwest::Client, base: &str, query: &str) -> u64 {
    let response = http
        .get(format!("{base}/render"))
        .query(&[("query", query), ("from", "now-1h"), ("until", "now+1m")])
        .send()
        .await;
    let Ok(response) = response else { return 0 };
    let Ok(json) = response.json::<serde_json::Value>().await else {
        return 0;
    };
    json["flamebearer"]["numTicks"].as_u64().unwrap_or(0)
}

#[tokio::test]
async fn batches_from_an_agent_appear_in_render() {
    let aggregator = Aggregator::start().await;
    let state = tempfile::tempdir().unwrap();
    let config = agent_config(aggregator.quic_addr(), aggregator.dir());
    let agent = agent_app::start_in(config, state.path()).await.unwrap();
    let now = SystemTime::now();
    let submitter = agent.submitter();
    for (stack, value) in [("main;work;hash", 5), ("main;work", 7), ("main;gc", 11)] {
        submitter
            .submit(profile("shipped.cpu{env=test}", stack, value, now))
            .await
            .unwrap();
    }
    // The window loop runs until every submitter is gone.
    drop(submitter);
    let base = aggregator.url("");
    eventually(Duration::from_secs(20), "the batch is stored", || async {
        ticks(&aggregator.http, &base, "shipped.cpu").await == 23
    })
    .await;
    assert_eq!(
        aggregator.collapsed(r#"shipped.cpu{env="test"}"#).await,
        "main;gc 11\nmain;work 7\nmain;work;hash 5"
    );
    let metadata = aggregator.metadata("shipped.cpu").await;
    assert_eq!(metadata["spyName"], "ebpfspy");
    assert_eq!(metadata["sampleRate"], 99);

    // Stored before acknowledged: the agent hears of it a moment after render shows it.
    eventually(
        Duration::from_secs(10),
        "the batch is acknowledged",
        || async {
            agent_metrics(&agent)
                .await
                .value("smolder_agent_spool_batches", &[])
                == 0.0
        },
    )
    .await;
    let text = agent_metrics(&agent).await;
    assert_eq!(
        text.value("smolder_agent_ship_batches_acked_total", &[]),
        1.0,
        "{text:?}"
    );
    assert_eq!(
        text.value("smolder_agent_spool_batches", &[]),
        0.0,
        "{text:?}"
    );
    assert_eq!(
        text.value("smolder_agent_ship_connected", &[]),
        1.0,
        "{text:?}"
    );
    assert!(
        text.value("smolder_agent_ship_rtt_seconds", &[]) > 0.0,
        "{text:?}"
    );
    let served = Metrics::scrape(&aggregator.url("/metrics")).await;
    assert_eq!(
        served.value("smolder_aggregator_ingest_quic_batches_acked_total", &[]),
        1.0
    );
    assert_eq!(
        served.value(
            "smolder_aggregator_ingest_profiles_total",
            &[("format", "wire"), ("transport", "quic")]
        ),
        1.0,
        "QUIC batches go through ingest's metrics: {served:?}"
    );
    agent.stop().await.unwrap();
    aggregator.stop().await;
}

#[tokio::test]
async fn a_stopping_agent_ships_its_last_window_first() {
    let aggregator = Aggregator::start().await;
    let state = tempfile::tempdir().unwrap();
    let mut config = agent_config(aggregator.quic_addr(), aggregator.dir());
    // A window longer than the test (yet short enough that its end is not refused as being
    // from the future): only stopping closes it.
    config.window.length = Duration::from_secs(60);
    let agent = agent_app::start_in(config, state.path()).await.unwrap();
    agent
        .submitter()
        .submit(profile("last.cpu", "main;exit", 9, SystemTime::now()))
        .await
        .unwrap();
    agent.stop().await.unwrap();
    let base = aggregator.url("");
    assert_eq!(
        ticks(&aggregator.http, &base, "last.cpu").await,
        9,
        "shipped before the agent returned"
    );
    aggregator.stop().await;
}

#[tokio::test]
async fn a_rate_limited_agent_is_paced_and_loses_nothing() {
    let mut config = smolder_aggregator::config::Config::default();
    config.ingest.quic.max_batches_per_second = 2;
    let aggregator = Aggregator::with_config(config).await;
    let state = tempfile::tempdir().unwrap();
    let agent = agent_app::start_in(
        agent_config(aggregator.quic_addr(), aggregator.dir()),
        state.path(),
    )
    .await
    .unwrap();
    // Ten windows at once, five times what the aggregator takes per second.
    let first = SystemTime::now() - Duration::from_secs(30);
    let mut produced = 0;
    for i in 0..10u64 {
        let at = first + Duration::from_millis(250 * i + 100);
        agent
            .submitter()
            .submit(profile("paced.cpu", "main;work", i + 1, at))
            .await
            .unwrap();
        produced += i + 1;
    }
    let base = aggregator.url("");
    eventually(Duration::from_secs(30), "every batch delivered", || async {
        ticks(&aggregator.http, &base, "paced.cpu").await == produced
    })
    .await;
    let text = agent_metrics(&agent).await;
    assert!(
        text.value(
            "smolder_agent_ship_batches_rejected_total",
            &[("retryable", "true")]
        ) >= 1.0,
        "{text:?}"
    );
    assert_eq!(text.value("smolder_agent_dropped_batches_total", &[]), 0.0);
    eventually(Duration::from_secs(10), "the spool drains", || async {
        agent_metrics(&agent)
            .await
            .value("smolder_agent_spool_batches", &[])
            == 0.0
    })
    .await;
    agent.stop().await.unwrap();
    aggregator.stop().await;
}

#[tokio::test]
async fn kill_9_mid_stream_stores_every_batch_exactly_once() {
    let root = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let mut aggregator = AggregatorProcess::new(root.path().join("data"));
    aggregator.start(false);
    aggregator.wait_ready(&http).await;
    let config = agent_config(aggregator.quic, &aggregator.data);
    let agent = agent_app::start_in(config, &root.path().join("agent"))
        .await
        .unwrap();

    // A steady stream of profiles, four windows a second, while the aggregator is killed and
    // restarted twice.
    let producer = steady_profiles(
        &agent,
        "exactly.cpu",
        Duration::from_millis(20),
        tokio::time::sleep(Duration::from_secs(8)),
    );
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        aggregator.kill();
        tokio::time::sleep(Duration::from_millis(500)).await;
        aggregator.start(false);
    }
    let produced = producer.await.unwrap();
    aggregator.wait_ready(&http).await;
    let base = aggregator.base();
    eventually(Duration::from_secs(60), "every batch stored", || async {
        let text = agent_metrics(&agent).await;
        text.value("smolder_agent_spool_batches", &[]) == 0.0
            && ticks(&http, &base, "exactly.cpu").await >= produced
    })
    .await;
    // Stored once: not a sample more than was produced, even after resends.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ticks(&http, &base, "exactly.cpu").await, produced);
    let text = agent_metrics(&agent).await;
    assert!(
        text.value("smolder_agent_ship_reconnects_total", &[]) >= 1.0,
        "{text:?}"
    );
    assert_eq!(
        text.value("smolder_agent_dropped_batches_total", &[]),
        0.0,
        "{text:?}"
    );
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn an_aggregator_down_for_minutes_gets_everything_in_order_when_it_returns() {
    let root = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let mut aggregator = AggregatorProcess::new(root.path().join("data"));
    aggregator.start(true);
    aggregator.wait_ready(&http).await;
    let mut config = agent_config(aggregator.quic, &aggregator.data);
    config.window.length = Duration::from_secs(1);
    // One batch at a time, so that the order of acks is the order of storing.
    config.ship.max_batches_in_flight = 1;
    let agent = agent_app::start_in(config, &root.path().join("agent"))
        .await
        .unwrap();
    aggregator.kill();

    let outage = Duration::from_secs(120);
    let started = Instant::now();
    let mut produced = 0;
    let mut i = 0u64;
    while started.elapsed() < outage {
        let value = i % 3 + 1;
        agent
            .submitter()
            .submit(profile(
                "outage.cpu",
                &format!("main;g{}", i % 4),
                value,
                SystemTime::now(),
            ))
            .await
            .unwrap();
        produced += value;
        i += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Let the last window close into the spool.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let text = agent_metrics(&agent).await;
    let spooled = text.value("smolder_agent_spool_batches", &[]);
    assert!(
        spooled >= 100.0,
        "two minutes of 1 s windows spooled: {text:?}"
    );
    assert!(
        text.value("smolder_agent_spool_oldest_age_seconds", &[]) >= 100.0,
        "{text:?}"
    );

    aggregator.start(true);
    aggregator.wait_ready(&http).await;
    let base = aggregator.base();
    eventually(Duration::from_secs(90), "the spool drains", || async {
        agent_metrics(&agent)
            .await
            .value("smolder_agent_spool_batches", &[])
            == 0.0
    })
    .await;
    assert_eq!(ticks(&http, &base, "outage.cpu").await, produced);

    // The acks of the second run, in the order the aggregator stored them, count up.
    let text = aggregator.log();
    let acked: Vec<u64> = text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event["fields"]["message"] == "batch acknowledged")
        .filter_map(|event| event["fields"]["sequence"].as_u64())
        .collect();
    assert!(acked.len() as f64 >= spooled, "{} acks", acked.len());
    let tail = &acked[acked.len() - spooled as usize..];
    assert!(tail.windows(2).all(|w| w[0] < w[1]), "in order: {tail:?}");
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn a_full_spool_drops_the_oldest_batches_only() {
    let root = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let mut aggregator = AggregatorProcess::new(root.path().join("data"));
    // Started once to learn its addresses, then down while the agent spools.
    aggregator.start(false);
    aggregator.kill();
    let mut config = agent_config(aggregator.quic, &aggregator.data);
    // Room for a handful of these small batches (about 200 bytes each).
    config.spool.max_bytes = 1_200;
    let agent = agent_app::start_in(config, &root.path().join("agent"))
        .await
        .unwrap();

    // Twenty windows in the recent past, one at a time, each a batch of its own.
    let first = SystemTime::now() - Duration::from_secs(60);
    let first =
        UNIX_EPOCH + Duration::from_secs(first.duration_since(UNIX_EPOCH).unwrap().as_secs());
    for i in 0..20u64 {
        let at = first + Duration::from_millis(250 * i + 100);
        agent
            .submitter()
            .submit(profile("full.cpu", &format!("main;w{i:02}"), 100 + i, at))
            .await
            .unwrap();
        let written = i as f64 + 1.0;
        eventually(Duration::from_secs(10), "window spooled", || async {
            agent_metrics(&agent)
                .await
                .value("smolder_agent_spool_batches_written_total", &[])
                == written
        })
        .await;
    }
    let text = agent_metrics(&agent).await;
    let dropped = text.value("smolder_agent_dropped_batches_total", &[("reason", "full")]);
    let kept = text.value("smolder_agent_spool_batches", &[]);
    assert!(dropped >= 1.0, "{text:?}");
    assert_eq!(dropped + kept, 20.0, "{text:?}");
    assert!(
        text.value("smolder_agent_spool_bytes", &[]) <= 1_200.0,
        "{text:?}"
    );

    aggregator.start(false);
    aggregator.wait_ready(&http).await;
    let base = aggregator.base();
    eventually(Duration::from_secs(30), "the spool drains", || async {
        agent_metrics(&agent)
            .await
            .value("smolder_agent_spool_batches", &[])
            == 0.0
    })
    .await;
    let collapsed = http
        .get(format!("{base}/render"))
        .query(&[
            ("query", "full.cpu"),
            ("from", "now-1h"),
            ("until", "now+1m"),
            ("format", "collapsed"),
        ])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut lines: Vec<&str> = collapsed.lines().collect();
    lines.sort_unstable();
    let expected: Vec<String> = (dropped as u64..20)
        .map(|i| format!("main;w{i:02} {}", 100 + i))
        .collect();
    assert_eq!(lines, expected, "the oldest {dropped} went, nothing else");
    agent.stop().await.unwrap();
}

/// Submits one profile per series of `series` into the agent's window of `at`, stack `main;<i>`
/// with value `i + 1`; returns the sum of their values.
async fn submit_series(agent: &Agent, series: &[String], at: SystemTime) -> u64 {
    let mut total = 0;
    for (i, name) in series.iter().enumerate() {
        let value = i as u64 + 1;
        agent
            .submitter()
            .submit(profile(name, &format!("main;f{i}"), value, at))
            .await
            .unwrap();
        total += value;
    }
    total
}

/// Submits forty series, each with a long frame name, into the agent's window of `at` (with
/// `app` as their app); returns the sum of their values.
async fn forty_long_series(agent: &Agent, app: &str, at: SystemTime) -> u64 {
    let mut produced = 0;
    for i in 0..40u64 {
        let value = i + 1;
        let stack = format!("main;{}{i}", "x".repeat(200));
        agent
            .submitter()
            .submit(profile(&format!("{app}{{n={i}}}"), &stack, value, at))
            .await
            .unwrap();
        produced += value;
    }
    produced
}

#[tokio::test]
async fn a_window_over_the_aggregators_limits_is_split_and_stored_once() {
    let mut config = smolder_aggregator::config::Config::default();
    config.ingest.max_series_per_request = 5;
    config.ingest.quic.max_batch_bytes = 4 << 10;
    let aggregator = Aggregator::with_config(config).await;
    let state = tempfile::tempdir().unwrap();
    let agent = agent_app::start_in(
        agent_config(aggregator.quic_addr(), aggregator.dir()),
        state.path(),
    )
    .await
    .unwrap();
    let base = aggregator.url("");
    // The first window is spooled before the agent has heard the aggregator's limits, to v0.1's
    // defaults: one batch, over 4 KiB. The aggregator refuses it from its header alone (nothing
    // read, nothing stored), and the agent splits it to the limits of the welcome.
    let first = forty_long_series(&agent, "before.cpu", SystemTime::now()).await;
    eventually(
        Duration::from_secs(20),
        "the first window stored",
        || async { ticks(&aggregator.http, &base, "before.cpu").await == first },
    )
    .await;
    // The next is split as it is spooled.
    let second = forty_long_series(&agent, "after.cpu", SystemTime::now()).await;
    eventually(
        Duration::from_secs(20),
        "the second window stored",
        || async { ticks(&aggregator.http, &base, "after.cpu").await == second },
    )
    .await;
    eventually(Duration::from_secs(10), "the spool drains", || async {
        agent_metrics(&agent)
            .await
            .value("smolder_agent_spool_batches", &[])
            == 0.0
    })
    .await;
    let text = agent_metrics(&agent).await;
    let written = text.value("smolder_agent_spool_batches_written_total", &[]);
    assert!(
        written >= 1.0 + 8.0 + 8.0,
        "one whole, then forty series five a batch, twice: {text:?}"
    );
    assert_eq!(
        text.value("smolder_agent_dropped_series_total", &[]),
        0.0,
        "{text:?}"
    );
    assert_eq!(text.value("smolder_agent_dropped_batches_total", &[]), 0.0);
    let served = Metrics::scrape(&aggregator.url("/metrics")).await;
    assert_eq!(
        served.value("smolder_aggregator_ingest_quic_batches_acked_total", &[]),
        text.value("smolder_agent_ship_batches_acked_total", &[]),
        "one ack per batch: {served:?}"
    );
    assert_eq!(
        served.value("smolder_aggregator_ingest_quic_batches_rejected_total", &[]),
        1.0,
        "only the batch spooled before the welcome was too large: {served:?}"
    );
    assert_eq!(
        text.value(
            "smolder_agent_ship_batches_rejected_total",
            &[("retryable", "false")]
        ),
        1.0
    );
    // Stored once: not a sample more after the resends a split could cause.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ticks(&aggregator.http, &base, "before.cpu").await, first);
    assert_eq!(ticks(&aggregator.http, &base, "after.cpu").await, second);
    agent.stop().await.unwrap();
    aggregator.stop().await;
}

#[tokio::test]
async fn series_over_the_limits_are_dropped_counted_and_the_rest_stored() {
    let mut config = smolder_aggregator::config::Config::default();
    config.ingest.max_labels_per_series = 2;
    config.ingest.max_active_series_per_tenant = 6;
    let aggregator = Aggregator::with_config(config).await;
    let state = tempfile::tempdir().unwrap();
    let agent = agent_app::start_in(
        agent_config(aggregator.quic_addr(), aggregator.dir()),
        state.path(),
    )
    .await
    .unwrap();
    let at = SystemTime::now() - Duration::from_secs(5);
    // Three with too many labels (the agent's own limit check refuses them once it knows the
    // aggregator's; before, the aggregator does), eight within them, of which the tenant's
    // limit takes six.
    let wide: Vec<String> = (0..3)
        .map(|i| format!("wide.cpu{{a={i},b=x,c=y}}"))
        .collect();
    let narrow: Vec<String> = (0..8).map(|i| format!("narrow.cpu{{n={i}}}")).collect();
    submit_series(&agent, &wide, at).await;
    let all: u64 = (1..=8).sum();
    for (i, name) in narrow.iter().enumerate() {
        let value = i as u64 + 1;
        agent
            .submitter()
            .submit(profile(name, "main;narrow", value, at))
            .await
            .unwrap();
    }
    eventually(Duration::from_secs(20), "the window is shipped", || async {
        let text = agent_metrics(&agent).await;
        text.value("smolder_agent_spool_batches_written_total", &[]) >= 1.0
            && text.value("smolder_agent_spool_batches", &[]) == 0.0
    })
    .await;
    let text = agent_metrics(&agent).await;
    let dropped =
        |reason: &str| text.value("smolder_agent_dropped_series_total", &[("reason", reason)]);
    assert_eq!(dropped("too_many_labels"), 3.0, "{text:?}");
    assert_eq!(dropped("tenant_series_limit"), 2.0, "{text:?}");
    assert_eq!(text.value("smolder_agent_dropped_batches_total", &[]), 0.0);
    let base = aggregator.url("");
    let stored = ticks(&aggregator.http, &base, "narrow.cpu").await;
    let (least, most): (u64, u64) = ((1..=6).sum(), (3..=8).sum());
    assert!(
        stored < all && (least..=most).contains(&stored),
        "six of eight series: {stored}"
    );
    assert_eq!(ticks(&aggregator.http, &base, "wide.cpu").await, 0);
    let served = Metrics::scrape(&aggregator.url("/metrics")).await;
    assert_eq!(
        served.value(
            "smolder_aggregator_dropped_series_total",
            &[("reason", "tenant_series_limit")]
        ),
        2.0,
        "the aggregator counts what the agent counts: {served:?}"
    );
    agent.stop().await.unwrap();
    aggregator.stop().await;
}

/// A partition: the aggregator (a process in a network namespace) and the agent lose the link
/// between them for `SMOLDER_PARTITION_SECONDS` (default 75; 300 for BENCHMARKS.md) while the
/// agent closes a window a second. During the cut the shipper is degraded, not dead, the agent
/// stays live and ready, and the spool holds every window written and not acknowledged. Once
/// the link is back, every window of the partition arrives, each exactly once, and the
/// aggregator's count of stored batches (acks less duplicates) is the agent's.
#[tokio::test(flavor = "multi_thread")]
async fn a_partitioned_agent_delivers_every_window_once_after_the_link_heals() {
    let seconds: u64 = std::env::var("SMOLDER_PARTITION_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(75);
    let netns = Netns::create();
    let root = tempfile::tempdir().unwrap();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut aggregator = AggregatorProcess::new(root.path().join("data"));
    aggregator.http = SocketAddr::from((netns.inside, 0));
    aggregator.quic = SocketAddr::from((netns.inside, 0));
    aggregator.wrapper = netns.exec();
    aggregator.start(false);
    aggregator.wait_ready(&http).await;
    // Seen from the namespace, the test is not on the aggregator's host: without credentials
    // configured, its API answers only the development admin token.
    let token = std::fs::read_to_string(aggregator.data.join("tls/admin-token")).unwrap();
    let bearer =
        reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.trim())).unwrap();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .default_headers(reqwest::header::HeaderMap::from_iter([(
            reqwest::header::AUTHORIZATION,
            bearer,
        )]))
        .build()
        .unwrap();
    let mut config = agent_config(aggregator.quic, &aggregator.data);
    config.window.length = Duration::from_secs(1);
    let agent = agent_app::start_in(config, &root.path().join("agent"))
        .await
        .unwrap();
    let agent_base = format!("http://{}", agent.addr());

    // One profile every 250 ms, each its own stack, until told to stop.
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let submitter = agent.submitter();
    let producer = tokio::spawn(async move {
        let mut sent = Vec::new();
        let mut i = 0u64;
        while !*stopped.borrow() {
            let value = i % 5 + 1;
            submitter
                .submit(profile(
                    "partition.cpu",
                    &format!("main;p{i:05}"),
                    value,
                    SystemTime::now(),
                ))
                .await
                .unwrap();
            sent.push((format!("main;p{i:05}"), value));
            i += 1;
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
                _ = stopped.changed() => {}
            }
        }
        sent
    });
    eventually(
        Duration::from_secs(30),
        "shipping before the cut",
        || async {
            agent_metrics(&agent)
                .await
                .value("smolder_agent_ship_batches_acked_total", &[])
                >= 3.0
        },
    )
    .await;

    let before = agent_metrics(&agent).await;
    let written_before = before.value("smolder_agent_spool_batches_written_total", &[]);
    netns.cut();
    let cut = Instant::now();
    let degraded = until(&agent_base, "/readyz", "the shipper degraded", |a| {
        a.status == 200 && a.is("ship", "degraded")
    })
    .await;
    assert!(
        degraded.row("ship").detail.contains("aggregator"),
        "{}",
        degraded.body
    );
    eprintln!(
        "the shipper was degraded {:.1} s into the cut",
        cut.elapsed().as_secs_f64()
    );
    while cut.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let live = probe(&agent_base, "/healthz").await;
        assert_eq!(live.status, 200, "live through the cut: {}", live.body);
        let ready = probe(&agent_base, "/readyz").await;
        assert!(
            ready.status == 200 && ready.is("ship", "degraded"),
            "ready, the shipper degraded: {}",
            ready.body
        );
    }
    // The spool holds what was written and not acknowledged, and nothing was dropped.
    let text = agent_metrics(&agent).await;
    let written = text.value("smolder_agent_spool_batches_written_total", &[]);
    let acked = text.value("smolder_agent_ship_batches_acked_total", &[]);
    let held = text.value("smolder_agent_spool_batches", &[]);
    assert_eq!(held, written - acked, "{text:?}");
    // Nothing written since the cut was acknowledged: the spool holds all of it.
    assert!(
        written > written_before && held >= written - written_before,
        "{held} windows held, {written} written, {written_before} before the cut: {text:?}"
    );
    assert!(
        text.value("smolder_agent_spool_oldest_age_seconds", &[]) >= seconds as f64 - 20.0,
        "{text:?}"
    );
    assert_eq!(text.value("smolder_agent_dropped_batches_total", &[]), 0.0);
    assert!(
        text.value("smolder_agent_errors_total", &[("stage", "ship")]) >= 1.0,
        "the failures are counted: {text:?}"
    );
    eprintln!(
        "{held} windows held after {:.0} s of partition, {} bytes",
        cut.elapsed().as_secs_f64(),
        text.value("smolder_agent_spool_bytes", &[])
    );

    netns.heal();
    let healed = Instant::now();
    eventually(Duration::from_secs(120), "the spool drains", || async {
        agent_metrics(&agent)
            .await
            .value("smolder_agent_spool_batches", &[])
            == 0.0
    })
    .await;
    eprintln!(
        "drained {:.1} s after the link came back",
        healed.elapsed().as_secs_f64()
    );
    until(&agent_base, "/readyz", "the shipper running again", |a| {
        a.is("ship", "running")
    })
    .await;
    stop.send_replace(true);
    let sent = producer.await.unwrap();
    // The last windows close and ship.
    let render = || async {
        http.get(format!("{}/render", aggregator.base()))
            .query(&[
                ("query", "partition.cpu"),
                ("from", "now-1h"),
                ("until", "now+1m"),
                ("format", "collapsed"),
                ("max-nodes", "0"),
            ])
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let total: u64 = sent.iter().map(|(_, v)| v).sum();
    eventually(Duration::from_secs(30), "the last windows ship", || async {
        ticks(&http, &aggregator.base(), "partition.cpu").await >= total
    })
    .await;
    let collapsed = render().await;
    let stored: std::collections::BTreeMap<&str, u64> = collapsed
        .lines()
        .filter_map(|line| {
            let (stack, value) = line.rsplit_once(' ')?;
            Some((stack, value.parse().ok()?))
        })
        .collect();
    let expected: std::collections::BTreeMap<&str, u64> =
        sent.iter().map(|(s, v)| (s.as_str(), *v)).collect();
    let wrong: Vec<String> = expected
        .iter()
        .filter(|(stack, value)| stored.get(*stack) != Some(*value))
        .map(|(stack, value)| format!("{stack}: sent {value}, stored {:?}", stored.get(stack)))
        .chain(
            stored
                .iter()
                .filter(|(stack, _)| !expected.contains_key(*stack))
                .map(|(stack, value)| format!("{stack}: never sent, stored {value}")),
        )
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} profiles not stored exactly once: {wrong:#?}",
        wrong.len(),
        expected.len()
    );

    let text = agent_metrics(&agent).await;
    let served = Metrics::scrape(&format!("{}/metrics", aggregator.base())).await;
    assert_eq!(
        served.value("smolder_aggregator_ingest_quic_batches_acked_total", &[])
            - served.value(
                "smolder_aggregator_ingest_quic_batches_duplicate_total",
                &[]
            ),
        text.value("smolder_agent_ship_batches_acked_total", &[]),
        "stored batches, by both sides: {served:?}"
    );
    assert_eq!(text.value("smolder_agent_dropped_batches_total", &[]), 0.0);
    eprintln!(
        "{} profiles in {} batches, each stored once",
        expected.len(),
        text.value("smolder_agent_ship_batches_acked_total", &[])
    );
    agent.stop().await.unwrap();
    aggregator.kill();
}
