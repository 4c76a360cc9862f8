//! Wires the stages together in data-path order: metrics, store, rules, ingest (HTTP and QUIC),
//! query, admin and the UI, then the router that serves them.
//!
//! [`run`] is what the binary calls; [`start`] is the same server on a caller's runtime, bound
//! and ready, which tests use to talk to a real aggregator over real HTTP. This is the one
//! module that knows every stage; each stage is handed only what it needs.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use sd_notify::NotifyState;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::config::Config;
use crate::http::{self, RequestMetrics};
use crate::ingest::{self, IngestMetrics, Ingester, quic};
use crate::metrics::Metrics;
use crate::query::{self, Querier, QueryMetrics};
use crate::rules::{self, Rules, RulesMetrics};
use crate::store::{SledStore, Store, StoreMetrics};
use crate::tenant::Tenant;
use crate::{admin, ui};

/// Runs the aggregator until SIGTERM or SIGINT, then flushes and returns.
///
/// # Errors
///
/// When the data directory cannot be opened or locked, or the listener cannot bind.
pub fn run(config: Config, data_dir: &Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("smolder-aggregator")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let server = start(config, data_dir).await?;
        notify_ready();
        shutdown_signal().await;
        info!("shutting down");
        notify_stopping();
        server.stop().await
    })
}

/// A running aggregator.
pub struct Running {
    addr: SocketAddr,
    quic_addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// The address the HTTP listener is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The UDP address QUIC ingest is bound to.
    pub fn quic_addr(&self) -> SocketAddr {
        self.quic_addr
    }

    /// Stops accepting requests, lets those in flight finish, flushes the store and returns.
    ///
    /// # Errors
    ///
    /// When serving failed or the final flush did.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.task.await.context("the server task panicked")?
    }
}

/// Opens the store, binds the listeners and serves in the background.
///
/// # Errors
///
/// When the data directory cannot be opened or locked (another aggregator uses it), the rules
/// are invalid, or a listener cannot bind.
pub async fn start(config: Config, data_dir: &Path) -> anyhow::Result<Running> {
    let metrics = Arc::new(Metrics::new());
    let registry = metrics.registry();

    let store = SledStore::open(data_dir, config.store.clone(), StoreMetrics::new(registry))
        .with_context(|| format!("opening the store in {}", data_dir.display()))?;
    let shared: Arc<dyn Store> = Arc::new(store.clone());

    rules::check_config(&config.metrics_export_rules, &config.rules)
        .context("checking the rules config")?;
    let rules_metrics = RulesMetrics::new(registry, metrics.dropped_increments.clone());
    let rules = Arc::new(
        Rules::load(
            &config.metrics_export_rules,
            Arc::clone(&shared),
            Tenant::anonymous(),
            rules_metrics.clone(),
        )
        .context("loading the rules")?,
    );

    let ingester = Arc::new(Ingester::new(
        Arc::clone(&shared),
        Arc::clone(&rules),
        config.ingest.clone(),
        config.store.retention,
        IngestMetrics::new(registry),
        metrics.errors.clone(),
    ));
    let querier = Arc::new(Querier::new(
        Arc::clone(&shared),
        config.query.clone(),
        QueryMetrics::new(registry),
        metrics.errors.clone(),
    ));
    let quic_metrics = quic::QuicMetrics::new(registry);
    let requests = RequestMetrics::new(registry);

    let listener = TcpListener::bind(config.http.listen)
        .await
        .with_context(|| format!("binding {}", config.http.listen))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    info!(%addr, data_dir = %data_dir.display(), "listening");

    let quic = quic::start(
        Arc::clone(&ingester),
        config.ingest.quic.clone(),
        data_dir,
        quic_metrics,
        metrics.errors.clone(),
    )?;
    let quic_addr = quic.addr();
    store.start_maintenance();
    let remote_write = (!config.rules.remote_write_url.is_empty()).then(|| {
        tokio::spawn(rules::remote_write::run(
            Arc::clone(&rules),
            config.rules.clone(),
            rules_metrics,
        ))
    });
    let router = http::router(
        [
            ingest::routes(ingester),
            query::routes(querier),
            rules::routes(rules),
            admin::routes(shared, metrics.errors.clone()),
            ui::routes(),
        ],
        Arc::clone(&metrics),
        requests,
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .context("serving HTTP");
        quic.close().await;
        if let Some(remote_write) = remote_write {
            remote_write.abort();
        }
        let closed = store.close().await.context("flushing the store");
        served.and(closed)
    });
    Ok(Running {
        addr,
        quic_addr,
        stop,
        task,
    })
}

/// Tells systemd (`Type=notify`) that the daemon is ready: its listeners are bound and its
/// stages started. When the unit sets `WatchdogSec=`, pings the watchdog from a task on this
/// runtime every half of `WATCHDOG_USEC`, so that a wedged runtime misses its pings and systemd
/// restarts it. Without `NOTIFY_SOCKET` (not under systemd) it sends nothing.
fn notify_ready() {
    if let Err(err) = sd_notify::notify(&[NotifyState::Ready]) {
        warn!(error = %err, "telling systemd the daemon is ready failed");
    }
    let Some(timeout) = sd_notify::watchdog_enabled() else {
        return;
    };
    let period = timeout / 2;
    info!(?period, "pinging the systemd watchdog");
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if let Err(err) = sd_notify::notify(&[NotifyState::Watchdog]) {
                warn!(error = %err, "pinging the systemd watchdog failed");
            }
        }
    });
}

/// Tells systemd the daemon is stopping (a no-op without `NOTIFY_SOCKET`).
fn notify_stopping() {
    if let Err(err) = sd_notify::notify(&[NotifyState::Stopping]) {
        warn!(error = %err, "telling systemd the daemon is stopping failed");
    }
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
