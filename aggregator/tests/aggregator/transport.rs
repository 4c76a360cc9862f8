//! Agents shipping to the aggregator over QUIC: real agents (in-process, with real spools on
//! disk) and real aggregators (in-process, or as processes killed with SIGKILL), on loopback.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use smolder_agent::app::{self as agent_app, Running as Agent};
use smolder_agent::config::Config as AgentConfig;
use smolder_common::{Profile, ProfileMeta, Tree};
use smolder_test_support::net::LOOPBACK_ANY_PORT;
use smolder_test_support::process::{Process, daemon};
use smolder_test_support::prometheus::Metrics;
use smolder_test_support::wait::eventually;

use crate::util::Aggregator;

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

/// An aggregator process. Its first start binds port 0 and reads its addresses from its log;
/// a restart (after a kill) binds those same addresses, so that it comes back where the agent
/// looks: the one place a test listener does not ask for port 0.
struct AggregatorProcess {
    data: PathBuf,
    http: SocketAddr,
    quic: SocketAddr,
    process: Option<Process>,
}

impl AggregatorProcess {
    fn new(data: PathBuf) -> AggregatorProcess {
        AggregatorProcess {
            data,
            http: LOOPBACK_ANY_PORT,
            quic: LOOPBACK_ANY_PORT,
            process: None,
        }
    }

    /// Starts the process; with `debug`, it logs QUIC ingest at debug level (see [`log`]).
    ///
    /// [`log`]: AggregatorProcess::log
    fn start(&mut self, debug: bool) {
        let config = self.data.with_extension("yaml");
        std::fs::write(
            &config,
            format!(
                "http:\n  listen: {}\ningest:\n  quic:\n    listen: {}\n",
                self.http, self.quic
            ),
        )
        .unwrap();
        let level = if debug {
            "warn,smolder_aggregator::ingest::quic=debug"
        } else {
            "warn"
        };
        let mut command = daemon(Path::new(env!("CARGO_BIN_EXE_smolder-aggregator")), level);
        command
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--config")
            .arg(&config);
        let process = Process::spawn(command);
        self.http = process.listening("http");
        self.quic = process.listening("quic");
        self.process = Some(process);
    }

    fn kill(&mut self) {
        self.process.take().expect("running").kill();
    }

    /// The JSON log of the running process.
    fn log(&self) -> String {
        self.process.as_ref().expect("running").log()
    }

    fn base(&self) -> String {
        format!("http://{}", self.http)
    }

    async fn wait_ready(&self, http: &reqwest::Client) {
        let url = format!("{}/healthz", self.base());
        eventually(Duration::from_secs(30), "aggregator ready", || async {
            matches!(http.get(&url).send().await, Ok(r) if r.status().is_success())
        })
        .await;
    }
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
    let submitter = agent.submitter();
    let producer = tokio::spawn(async move {
        let mut produced = 0;
        for i in 0..400u64 {
            let value = i % 7 + 1;
            submitter
                .submit(profile(
                    "exactly.cpu",
                    &format!("main;f{}", i % 5),
                    value,
                    SystemTime::now(),
                ))
                .await
                .unwrap();
            produced += value;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        produced
    });
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
