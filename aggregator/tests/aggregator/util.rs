//! Fixtures shared by the stage modules.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use reqwest::StatusCode;
use smolder_common::Tree;
use smolder_test_support::net::LOOPBACK_ANY_PORT;

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

/// `push.v1` messages, written here from `grafana/pyroscope:api/push/v1/push.proto` so that the
/// tests speak the wire format independently of the server's definitions.
pub(crate) mod wire {
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct PushRequest {
        #[prost(message, repeated, tag = "1")]
        pub(crate) series: Vec<RawProfileSeries>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct RawProfileSeries {
        #[prost(message, repeated, tag = "1")]
        pub(crate) labels: Vec<LabelPair>,
        #[prost(message, repeated, tag = "2")]
        pub(crate) samples: Vec<RawSample>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct LabelPair {
        #[prost(string, tag = "1")]
        pub(crate) name: String,
        #[prost(string, tag = "2")]
        pub(crate) value: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct RawSample {
        #[prost(bytes = "vec", tag = "1")]
        pub(crate) raw_profile: Vec<u8>,
        #[prost(string, tag = "2")]
        pub(crate) id: String,
    }
}
