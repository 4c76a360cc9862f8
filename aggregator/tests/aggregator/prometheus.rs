//! A real Prometheus (Debian's `prometheus` package, started here on loopback) scrapes
//! `/exported-metrics` of a real agent fed with a steady CPU profile and of the real aggregator
//! it ships to over QUIC, and its `rate()` returns the CPU seconds per second that were sent on
//! both tiers; with remote write enabled on the aggregator, the same series arrive in
//! Prometheus' remote-write receiver.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use smolder_aggregator::config::Config;
use smolder_common::{Profile, ProfileMeta, Tree};
use smolder_test_support::net::LOOPBACK_ANY_PORT;
use smolder_test_support::process::Process;
use smolder_test_support::prometheus::Metrics;
use smolder_test_support::rules::DOCUMENTED_RULES;

use crate::transport::agent_config;
use crate::util::Aggregator;

/// A Prometheus server on port 0, killed when dropped.
struct Prometheus {
    _process: Process,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus scraping `/exported-metrics` every second for each of `jobs`, whose
    /// targets it discovers from a file that [`target`](Prometheus::target) writes, with its
    /// remote-write receiver on.
    async fn start(jobs: &[&str]) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n",
        );
        for job in jobs {
            config.push_str(&format!(
                "  - job_name: {job}\n    metrics_path: /exported-metrics\n    \
                 file_sd_configs:\n      - files: ['{}']\n        refresh_interval: 1s\n",
                dir.path().join(format!("{job}.json")).display()
            ));
        }
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let mut command = Command::new("prometheus");
        command
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={LOOPBACK_ANY_PORT}"))
            .arg("--web.enable-remote-write-receiver")
            .args(["--log.level=info", "--log.format=json"])
            .stdout(Stdio::null());
        // The Debian package `prometheus`; scripts/test installs it.
        let process = Process::spawn(command);
        // "Start listening for connections" names the address asked for; "Listening on" the
        // one bound.
        let line = process.wait_for_line("its listening address", |line| {
            line.contains(r#""msg":"Listening on""#)
        });
        let json: serde_json::Value = serde_json::from_str(&line).unwrap();
        let addr: SocketAddr = json["address"].as_str().unwrap().parse().unwrap();
        let prometheus = Prometheus {
            _process: process,
            addr,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(response) = reqwest::get(format!("http://{addr}/-/ready")).await
                && response.status().is_success()
            {
                return prometheus;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus on {addr} not ready after 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Points `job` at `addr`, through its discovery file (written whole, then renamed).
    fn target(&self, job: &str, addr: SocketAddr) {
        let path: PathBuf = self.dir.path().join(format!("{job}.json"));
        let partial = path.with_extension("partial");
        std::fs::write(&partial, format!("[{{\"targets\": [\"{addr}\"]}}]")).unwrap();
        std::fs::rename(&partial, &path).unwrap();
    }

    /// The values of an instant query's result vector.
    async fn query(&self, query: &str) -> Vec<f64> {
        let answer: serde_json::Value = reqwest::Client::new()
            .get(format!("http://{}/api/v1/query", self.addr))
            .query(&[("query", query)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["status"], "success", "{query}: {answer}");
        answer["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["value"][1].as_str().unwrap().parse().unwrap())
            .collect()
    }
}

/// Every 250 ms the agent's source submits 20 samples of `slowFunction` and 5 of
/// `fastFunction` at 100 Hz: 0.8 CPU seconds per second of `slowFunction`, 1.0 in all. The
/// aggregator sees them only through the agent's QUIC batches.
const TICK: Duration = Duration::from_millis(250);
const SLOW_PER_SECOND: f64 = 0.8;
const FOLDED: &str =
    "main.main;main.slowFunction;main.work 20\nmain.main;main.fastFunction;main.work 5\n";

#[tokio::test]
async fn prometheus_rates_match_the_cpu_sent_on_both_tiers_and_remote_write_arrives() {
    // Prometheus must exist before the aggregator remote-writes to it; the tiers, on port 0,
    // become its targets once bound.
    let prometheus = Prometheus::start(&["aggregator", "agent"]).await;

    let config: Config = serde_norway::from_str(&format!(
        "{DOCUMENTED_RULES}\nrules:\n  remote-write-url: http://{}/api/v1/write\n  \
         remote-write-interval: 1s\n  remote-write-labels:\n    source: remote_write\n",
        prometheus.addr
    ))
    .unwrap();
    let agg = Aggregator::with_config(config).await;
    prometheus.target("aggregator", agg.addr());

    let rules: smolder_agent::config::Config = serde_norway::from_str(DOCUMENTED_RULES).unwrap();
    let mut agent_config = agent_config(agg.quic_addr(), agg.dir());
    agent_config.metrics_export_rules = rules.metrics_export_rules;
    let agent = smolder_agent::app::start(agent_config).await.unwrap();
    prometheus.target("agent", agent.addr());
    let submitter = agent.submitter();
    let mut tree = Tree::new();
    for line in FOLDED.lines() {
        let (stack, value) = line.rsplit_once(' ').unwrap();
        tree.insert_names(stack.split(';'), value.parse().unwrap());
    }

    let mut ticker = tokio::time::interval(TICK);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(16) {
        ticker.tick().await;
        let now = SystemTime::now();
        submitter
            .submit(Profile {
                series: "simple.golang.app.cpu{env=prod}".parse().unwrap(),
                meta: ProfileMeta {
                    sample_rate: 100,
                    ..ProfileMeta::default()
                },
                from: now - TICK,
                until: now,
                tree: tree.clone(),
            })
            .await
            .unwrap();
    }

    for (job, selector) in [
        ("aggregator", "job=\"aggregator\""),
        ("agent", "job=\"agent\""),
        ("remote write", "source=\"remote_write\""),
    ] {
        let query = format!("rate(a_simple_app_slow_env{{{selector},env=\"prod\"}}[10s])");
        let rates = prometheus.query(&query).await;
        assert_eq!(rates.len(), 1, "{job}: {query}: {rates:?}");
        let rate = rates[0];
        assert!(
            (rate - SLOW_PER_SECOND).abs() < SLOW_PER_SECOND * 0.2,
            "{job}: {query} = {rate}, want {SLOW_PER_SECOND} CPU seconds per second"
        );
        let total = prometheus
            .query(&format!("rate(a_simple_app_total{{{selector}}}[10s])"))
            .await;
        assert!(
            total.len() == 1 && (total[0] - 1.0).abs() < 0.2,
            "{job}: total rate {total:?}, want 1.0"
        );
    }
    let metrics = Metrics::scrape(&agg.url("/metrics")).await;
    assert!(
        metrics.value(
            "smolder_aggregator_rules_remote_write_requests_total",
            &[("outcome", "success")]
        ) >= 1.0
    );
    // The agent stops once every submitter is gone.
    drop(submitter);
    agent.stop().await.unwrap();
    agg.stop().await;
}
