//! Fixtures shared by the stage modules.

use std::net::SocketAddr;
use std::path::PathBuf;

use smolder_aggregator::app::{self, Running};
use smolder_aggregator::config::Config;
use tempfile::TempDir;

/// A running aggregator on `127.0.0.1:<free port>` with its own temporary data directory.
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

    /// Starts an aggregator with `config`, listening on a free loopback port.
    pub(crate) async fn with_config(mut config: Config) -> Aggregator {
        let dir = tempfile::tempdir().expect("temp dir");
        config.http.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        let running = app::start(config, dir.path())
            .await
            .expect("aggregator starts");
        Aggregator {
            running: Some(running),
            dir,
            http: reqwest::Client::new(),
        }
    }

    /// The base URL, `http://127.0.0.1:<port>`.
    pub(crate) fn url(&self, path: &str) -> String {
        let addr = self.running.as_ref().expect("running").addr();
        format!("http://{addr}{path}")
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
