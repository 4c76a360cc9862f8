//! Wires the stages together in data-path order: sources submit profiles, the window loop
//! merges them, sinks take each closed window; the HTTP port serves the agent's metrics.
//!
//! [`run`] is what the binary calls; [`start`] is the same agent on a caller's runtime, bound
//! and ready, which tests use.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::info;

use crate::config::Config;
use crate::http::{self, HttpState};
use crate::metrics::Metrics;
use crate::rules;
use crate::window::{self, Submitter};

/// Runs the agent until SIGTERM or SIGINT, then hands on the open windows and returns.
///
/// # Errors
///
/// When a stage cannot start (the listener cannot bind, the config is unusable).
pub fn run(config: Config) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("smolder-agent")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let agent = start(config).await?;
        shutdown_signal().await;
        info!("shutting down");
        agent.stop().await
    })
}

/// A running agent.
pub struct Running {
    addr: SocketAddr,
    submitter: Submitter,
    stop: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// The address the HTTP port is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A handle to submit profiles into the agent's windows, as its sources do.
    pub fn submitter(&self) -> Submitter {
        self.submitter.clone()
    }

    /// Stops the sources, hands on the open windows and returns.
    ///
    /// # Errors
    ///
    /// When serving failed.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        drop(self.submitter);
        self.task.await.context("the agent task panicked")?
    }
}

/// Binds the HTTP port and starts every stage in the background.
///
/// # Errors
///
/// When the listener cannot bind or a stage cannot start.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let metrics = Arc::new(Metrics::new());
    let hostname = config.hostname()?;
    let listener = TcpListener::bind(config.http.listen)
        .await
        .with_context(|| format!("binding {}", config.http.listen))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    info!(%addr, %hostname, "listening");

    let rule_set = rules::compile(&config.metrics_export_rules).context("checking the rules")?;
    let (rules_sink, exported, rules_windows) = rules::channel(&rule_set);
    let rules_task = tokio::spawn(rules::run(
        rule_set,
        rules_windows,
        exported.clone(),
        metrics.rules.clone(),
    ));

    let (submitter, profiles) = window::channel();
    let windows = tokio::spawn(window::run(
        config.window.clone(),
        profiles,
        vec![rules_sink],
        metrics.window.clone(),
    ));
    let state = HttpState { metrics, exported };
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, http::router(state))
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .context("serving HTTP");
        windows.await.context("the window loop panicked")?;
        rules_task.await.context("the rules task panicked")?;
        served
    });
    Ok(Running {
        addr,
        submitter,
        stop,
        task,
    })
}

/// Resolves on SIGTERM (systemd's stop) or SIGINT (Ctrl-C).
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = interrupt => {}
        _ = term.recv() => {}
    }
}
