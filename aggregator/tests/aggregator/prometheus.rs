//! A real Prometheus (Debian's `prometheus` package, started here on loopback) scrapes
//! `/exported-metrics` of a real agent fed with a steady CPU profile and of the real aggregator
//! it ships to over QUIC, and its `rate()` returns the CPU seconds per second that were sent on
//! both tiers; with remote write enabled on the aggregator, the same series arrive in
//! Prometheus' remote-write receiver.

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use smolder_aggregator::config::Config;
use smolder_common::{Profile, ProfileMeta, Tree};

use crate::rules::DOCUMENTED_RULES;
use crate::transport::agent_config;
use crate::util::Aggregator;

/// A free loopback port: bound, read, released.
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A Prometheus server, killed when dropped.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts Prometheus scraping `/exported-metrics` of each `(job, address)` every second,
    /// with its remote-write receiver on.
    async fn start(targets: &[(&str, SocketAddr)]) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n",
        );
        for (job, addr) in targets {
            config.push_str(&format!(
                "  - job_name: {job}\n    metrics_path: /exported-metrics\n    \
                 static_configs:\n      - targets: ['{addr}']\n"
            ));
        }
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let addr = free_port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--web.enable-remote-write-receiver")
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "the prometheus binary runs (Debian package prometheus; scripts/test installs it)",
            );
        let prometheus = Prometheus {
            child,
            addr,
            _dir: dir,
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
    // Prometheus must exist before the tiers point at it; its targets are bound first.
    let agg_addr = free_port();
    let agent_addr = free_port();
    let prometheus = Prometheus::start(&[("aggregator", agg_addr), ("agent", agent_addr)]).await;

    let mut config: Config = serde_norway::from_str(&format!(
        "{DOCUMENTED_RULES}\nrules:\n  remote-write-url: http://{}/api/v1/write\n  \
         remote-write-interval: 1s\n  remote-write-labels:\n    source: remote_write\n",
        prometheus.addr
    ))
    .unwrap();
    config.http.listen = agg_addr;
    let agg = Aggregator::with_fixed_address(config).await;

    let rules: smolder_agent::config::Config = serde_norway::from_str(DOCUMENTED_RULES).unwrap();
    let mut agent_config = agent_config(agg.quic_addr(), agg.dir());
    agent_config.metrics_export_rules = rules.metrics_export_rules;
    agent_config.http.listen = agent_addr;
    let agent = smolder_agent::app::start(agent_config).await.unwrap();
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
    let metrics = agg
        .http
        .get(agg.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .contains("smolder_aggregator_rules_remote_write_requests_total{outcome=\"success\"}"),
        "{metrics}"
    );
    // The agent stops once every submitter is gone.
    drop(submitter);
    agent.stop().await.unwrap();
    agg.stop().await;
}
