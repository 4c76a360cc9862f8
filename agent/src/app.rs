//! Wires the stages together in data-path order: sources submit profiles, the window loop
//! merges them, sinks take each closed window (the spool, which the shipper drains to the
//! aggregator); the HTTP port serves the agent's metrics and health. Every long-running loop
//! registers with the agent's [`Health`]: `ebpf` and `symbolize` (supervised threads),
//! `window`, `spool`, `ship` and one `scrape:<job>` per job.
//!
//! [`run`] is what the binary calls; [`start_in`] is the same agent on a caller's runtime,
//! bound and ready, with its state in a data directory; [`start`] keeps its spool in a
//! temporary database instead, which tests that do not care about state use.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use smolder_daemon::Health;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::info;

use crate::config::Config;
use crate::ebpf::{self, EbpfSource, SourceConfig, SourceMetrics};
use crate::http::{self, HttpState};
use crate::metrics::Metrics;
use crate::rules;
use crate::scrape::{self, Scraper};
use crate::ship;
use crate::spool::{self, Spool};
use crate::window::{self, Sink, Submitter};

/// Runs the agent with its state in `data_dir` until SIGTERM or SIGINT, then spools the open
/// windows and returns.
///
/// # Errors
///
/// When a stage cannot start (the listener cannot bind, the spool cannot open, the config is
/// unusable).
pub fn run(config: Config, data_dir: &Path) -> anyhow::Result<()> {
    smolder_daemon::run("smolder-agent", Some(2), start_in(config, data_dir))
}

/// A running agent.
pub struct Running {
    addr: SocketAddr,
    agent_id: String,
    submitter: Submitter,
    scraper: Scraper,
    stop: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
    /// The eBPF source, when `ebpf.enabled`.
    ebpf: Option<EbpfSource>,
    health: Health,
}

impl Running {
    /// The address the HTTP port is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The agent's persistent id, as it introduces itself to the aggregator.
    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    /// Its loops' heartbeats, as `/healthz` and `/readyz` report them.
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// A handle to submit profiles into the agent's windows, as its sources do.
    pub fn submitter(&self) -> Submitter {
        self.submitter.clone()
    }

    /// Stops the sources, spools the open windows, gives the shipper up to 5 s to deliver them,
    /// closes the connection to the aggregator and returns. Batches not yet acknowledged stay
    /// in the spool for the next start.
    ///
    /// # Errors
    ///
    /// When serving failed.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.health.stopping();
        self.scraper.stop().await;
        if let Some(ebpf) = self.ebpf {
            // Its last drain submits the partial window before the window loop closes.
            tokio::task::spawn_blocking(move || ebpf.stop())
                .await
                .context("stopping the eBPF sampler")?;
        }
        let _ = self.stop.send(());
        drop(self.submitter);
        self.task.await.context("the agent task panicked")?
    }
}

impl smolder_daemon::Daemon for Running {
    fn health(&self) -> Health {
        self.health.clone()
    }

    async fn stop(self) -> anyhow::Result<()> {
        Running::stop(self).await
    }
}

/// Binds the HTTP port and starts every stage in the background, with the spool in a
/// temporary database that is deleted when the agent stops: for tests and embedding, where
/// batches need not outlive the process.
///
/// # Errors
///
/// When the listener cannot bind or a stage cannot start.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    start_with(config, None).await
}

/// Binds the HTTP port and starts every stage in the background, with the agent's state (its
/// id and spool, in `<data_dir>/spool/`) in `data_dir`, created if missing.
///
/// # Errors
///
/// When the listener cannot bind, the spool cannot open (another agent uses `data_dir`) or a
/// stage cannot start.
pub async fn start_in(config: Config, data_dir: &Path) -> anyhow::Result<Running> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating the data directory {}", data_dir.display()))?;
    start_with(config, Some(data_dir)).await
}

/// Queued closed windows between the window loop and the spool, past which the window loop drops
/// the newest rather than wait: a burst of windows closing at once (a source catching up on
/// old data) fits, and a disk that stalls has 160 s of default windows before one is lost.
const SPOOL_QUEUE: usize = 16;

/// The heartbeat periods of the async loops: each beats on its work and at least this often
/// while idle, and is stuck after three periods without a beat (`smolder_daemon::health`). The
/// window loop's longest legitimate pause is a sink's send; the spool's an fsync; the
/// shipper's waits are bounded by the QUIC timeouts and count as alive.
const WINDOW_PERIOD: Duration = Duration::from_secs(10);
const SHIP_PERIOD: Duration = Duration::from_secs(10);

async fn start_with(config: Config, data_dir: Option<&Path>) -> anyhow::Result<Running> {
    let metrics = Arc::new(Metrics::new());
    let hostname = config.hostname()?;
    let listener = config.http.bind().await?;
    let addr = listener.addr();
    info!(%hostname, "series are labelled with this hostname");

    let rule_set = rules::compile(&config.metrics_export_rules).context("checking the rules")?;
    let (rules_sink, exported, rules_windows) = rules::channel(&rule_set);
    let rules_task = tokio::spawn(rules::run(
        rule_set,
        rules_windows,
        exported.clone(),
        metrics.rules.clone(),
    ));
    let spool_dir = data_dir.map(|dir| dir.join("spool"));
    let spool = Spool::open(spool_dir.as_deref(), &config.spool, metrics.spool.clone())
        .with_context(|| match &spool_dir {
            Some(dir) => format!("opening the spool in {}", dir.display()),
            None => "opening a temporary spool".to_owned(),
        })?;
    let agent_id = spool.agent_id().to_owned();
    let (ship_stop, ship_stopped) = watch::channel(false);
    let health = metrics.health.clone();
    let shipper = tokio::spawn(ship::run(
        config.ship.clone(),
        spool.clone(),
        hostname.clone(),
        metrics.ship.clone(),
        ship_stopped,
        health.register("ship", SHIP_PERIOD),
    ));
    let (spool_sink, spooled) = mpsc::channel(SPOOL_QUEUE);
    let spooler = tokio::spawn(spool::run(
        spool,
        spooled,
        health.register("spool", spool::EXPIRE_INTERVAL),
    ));

    let (submitter, profiles) = window::channel(&metrics.window);
    let windows = tokio::spawn(window::run(
        config.window.clone(),
        profiles,
        vec![
            Sink::new(rules_sink, window::RULES_BUSY),
            Sink::new(spool_sink, window::SPOOL_BUSY),
        ],
        metrics.window.clone(),
        health.register("window", WINDOW_PERIOD),
    ));
    let ebpf = if config.ebpf.enabled {
        let (ebpf_config, symbolize_config, hostname, submitter) = (
            config.ebpf.clone(),
            config.symbolize.clone(),
            hostname.clone(),
            submitter.clone(),
        );
        let window_length = config.window.length;
        let source_metrics = SourceMetrics {
            ebpf: metrics.ebpf.clone(),
            symbolize: metrics.symbolize.clone(),
            python: metrics.python.clone(),
            health: metrics.health.clone(),
        };
        let data_dir = data_dir.map(Path::to_path_buf);
        // Loading attaches to every CPU and reads /proc: blocking work.
        let source = tokio::task::spawn_blocking(move || {
            let config = SourceConfig {
                ebpf: &ebpf_config,
                symbolize: &symbolize_config,
                hostname,
                window_length,
            };
            ebpf::start(config, submitter, &source_metrics, data_dir.as_deref())
        })
        .await
        .context("starting the eBPF sampler")??;
        Some(source)
    } else {
        None
    };
    let scraper = scrape::start(
        &config.scrape_configs,
        &submitter,
        &metrics.scrape,
        &metrics.health,
    )
    .context("starting the pprof scraper")?;
    let state = HttpState {
        metrics,
        targets: scraper.status(),
        exported,
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = listener
            .serve(http::router(state), async {
                let _ = stopped.await;
            })
            .await;
        windows.await.context("the window loop panicked")?;
        rules_task.await.context("the rules task panicked")?;
        spooler.await.context("the spool task panicked")?;
        let _ = ship_stop.send(true);
        shipper.await.context("the shipper panicked")?;
        served
    });
    Ok(Running {
        addr,
        agent_id,
        submitter,
        scraper,
        stop,
        task,
        ebpf,
        health,
    })
}
