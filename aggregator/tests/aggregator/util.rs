//! Fixtures shared by the stage modules.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::StatusCode;
use smolder_common::Tree;
use smolder_test_support::net::LOOPBACK_ANY_PORT;
use smolder_test_support::process::{Process, daemon};
use smolder_test_support::wait::eventually;

use smolder_aggregator::app::{self, Running};
use smolder_aggregator::config::Config;
use tempfile::TempDir;

/// A running aggregator on loopback, on ports the system chose, with its own temporary data
/// directory.
pub(crate) struct Aggregator {
    running: Option<Running>,
    dir: TempDir,
    /// A client for it.
    pub(crate) http: reqwest::Client,
}

impl Aggregator {
    /// Starts an aggregator with the default configuration.
    pub(crate) async fn start() -> Aggregator {
        Aggregator::with_config(Config::default()).await
    }

    /// Starts an aggregator with `config`, both listeners on port 0 on loopback.
    pub(crate) async fn with_config(mut config: Config) -> Aggregator {
        let dir = tempfile::tempdir().expect("temp dir");
        config.http.listen = LOOPBACK_ANY_PORT;
        config.ingest.quic.listen = LOOPBACK_ANY_PORT;
        let running = app::start(config, dir.path())
            .await
            .expect("aggregator starts");
        Aggregator {
            running: Some(running),
            dir,
            http: reqwest::Client::new(),
        }
    }

    /// Every HTTP route it serves, with who may call it.
    pub(crate) fn routes(&self) -> Vec<smolder_aggregator::app::Route> {
        self.running.as_ref().expect("running").routes().to_vec()
    }

    /// The UDP address of QUIC ingest.
    pub(crate) fn quic_addr(&self) -> SocketAddr {
        self.running.as_ref().expect("running").quic_addr()
    }

    /// The data directory.
    pub(crate) fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The HTTP address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.running.as_ref().expect("running").addr()
    }

    /// `path` on the HTTP listener: `http://127.0.0.1:<port><path>`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr())
    }

    /// Stops the aggregator gracefully, keeping the data directory for inspection.
    pub(crate) async fn stop(mut self) -> PathBuf {
        self.running
            .take()
            .expect("running")
            .stop()
            .await
            .expect("clean stop");
        self.dir.keep()
    }
}

impl Aggregator {
    /// Everything stored under `query` from an hour ago to a minute ahead, as folded text with
    /// its lines sorted.
    pub(crate) async fn collapsed(&self, query: &str) -> String {
        let text = self
            .render(query, &[("format", "collapsed")])
            .await
            .text()
            .await
            .expect("render text");
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort_unstable();
        lines.join("\n")
    }

    /// The flamebearer metadata of `query` from an hour ago to a minute ahead.
    pub(crate) async fn metadata(&self, query: &str) -> serde_json::Value {
        let json: serde_json::Value = self
            .render(query, &[])
            .await
            .json()
            .await
            .expect("render json");
        json["metadata"].clone()
    }

    /// `GET path` with `token` as a bearer credential, its JSON answer.
    pub(crate) async fn get_json_as<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        token: &str,
    ) -> T {
        self.http
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .unwrap_or_else(|err| panic!("GET {path}: {err}"))
            .json()
            .await
            .unwrap_or_else(|err| panic!("GET {path}: {err}"))
    }

    /// Metric `name` (its samples summed) on `/exported-metrics`; `None` when it is not there.
    pub(crate) async fn exported(&self, name: &str) -> Option<f64> {
        let text = self
            .http
            .get(self.url("/exported-metrics"))
            .send()
            .await
            .expect("GET /exported-metrics")
            .text()
            .await
            .expect("text");
        smolder_test_support::prometheus::Metrics::parse(&text)
            .expect("Prometheus text")
            .find(name, &[])
    }

    async fn render(&self, query: &str, extra: &[(&str, &str)]) -> reqwest::Response {
        let response = self
            .http
            .get(self.url("/render"))
            .query(&[("query", query), ("from", "now-1h"), ("until", "now+1m")])
            .query(extra)
            .send()
            .await
            .expect("GET /render");
        assert_eq!(response.status(), StatusCode::OK, "render {query}");
        response
    }
}

/// An aggregator process. Its first start binds port 0 and reads its addresses from its log;
/// a restart (after a kill) binds those same addresses, so that it comes back where agents
/// look: the one place a test listener does not ask for port 0.
pub(crate) struct AggregatorProcess {
    /// Its data directory; its config is written next to it (`<data>.yaml`).
    pub(crate) data: PathBuf,
    /// The HTTP address: port 0 until the first start.
    pub(crate) http: SocketAddr,
    /// The QUIC address: port 0 until the first start.
    pub(crate) quic: SocketAddr,
    /// YAML appended to the config (sections other than `http` and `ingest.quic.listen`).
    pub(crate) extra: String,
    /// A command line the binary runs under, such as `ip netns exec <name>`.
    pub(crate) wrapper: Vec<String>,
    /// How long a start may take to bind its listeners: a restart replays the head first.
    pub(crate) patience: Duration,
    process: Option<Process>,
}

impl AggregatorProcess {
    /// On loopback, ports chosen at the first start.
    pub(crate) fn new(data: PathBuf) -> AggregatorProcess {
        AggregatorProcess {
            data,
            http: LOOPBACK_ANY_PORT,
            quic: LOOPBACK_ANY_PORT,
            extra: String::new(),
            wrapper: Vec::new(),
            patience: smolder_test_support::process::PATIENCE,
            process: None,
        }
    }

    /// Starts the process; with `debug`, it logs QUIC ingest at debug level (see [`log`]).
    ///
    /// [`log`]: AggregatorProcess::log
    pub(crate) fn start(&mut self, debug: bool) {
        let config = self.data.with_extension("yaml");
        std::fs::write(
            &config,
            format!(
                "http:\n  listen: {}\ningest:\n  quic:\n    listen: {}\n{}",
                self.http, self.quic, self.extra
            ),
        )
        .unwrap();
        let level = if debug {
            "warn,smolder_aggregator::ingest::quic=debug"
        } else {
            "warn"
        };
        let binary = Path::new(env!("CARGO_BIN_EXE_smolder-aggregator"));
        let mut command = match self.wrapper.split_first() {
            None => daemon(binary, level),
            Some((program, args)) => {
                let direct = daemon(binary, level);
                let mut wrapped = std::process::Command::new(program);
                wrapped
                    .args(args)
                    .arg(direct.get_program())
                    .args(direct.get_args())
                    .stdout(std::process::Stdio::null());
                wrapped
            }
        };
        command
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--config")
            .arg(&config);
        let process = Process::spawn(command);
        self.http = process.listening_within("http", self.patience);
        self.quic = process.listening_within("quic", self.patience);
        self.process = Some(process);
    }

    /// `kill -9`, and waits until its log is read to the end; that log.
    pub(crate) fn kill(&mut self) -> String {
        let mut process = self.process.take().expect("running");
        process.kill();
        process.wait();
        process.log()
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.process.as_ref().expect("running").id()
    }

    /// The JSON log of the running process.
    pub(crate) fn log(&self) -> String {
        self.process.as_ref().expect("running").log()
    }

    /// `http://<its HTTP address>`.
    pub(crate) fn base(&self) -> String {
        format!("http://{}", self.http)
    }

    /// Waits until `/healthz` answers 200.
    pub(crate) async fn wait_ready(&self, http: &reqwest::Client) {
        let url = format!("{}/healthz", self.base());
        eventually(Duration::from_secs(30), "aggregator ready", || async {
            matches!(http.get(&url).send().await, Ok(r) if r.status().is_success())
        })
        .await;
    }
}

/// `data` gzipped, as clients send `Content-Encoding: gzip` bodies.
pub(crate) fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(data).expect("in memory");
    encoder.finish().expect("in memory")
}

/// A tree of `stack value` pairs, stacks written root first with `;`.
pub(crate) fn tree(stacks: &[(&str, u64)]) -> Tree {
    let mut tree = Tree::new();
    for (stack, value) in stacks {
        tree.insert_names(stack.split(';'), *value);
    }
    tree
}

/// Runs `aggregator/tests/clients/<script>` (a client written by others, through its Python
/// library) with `args`; the JSON it prints.
pub(crate) async fn python(script: &str, args: Vec<String>) -> serde_json::Value {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(script);
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(&script)
            .args(&args)
            .output()
            .expect("python3 runs (scripts/test installs the clients)")
    })
    .await
    .expect("joined");
    assert!(
        output.status.success(),
        "the client failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the client prints json")
}

/// `push.v1` messages, written from `grafana/pyroscope:api/push/v1/push.proto` (in the fleet's
/// Pyroscope clients) so that the tests speak the wire format independently of the server's
/// definitions.
pub(crate) use smolder_fleet::push::wire;
