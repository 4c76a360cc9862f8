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
use smolder_daemon::Health;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::info;

use crate::config::Config;
use crate::http::{self, RequestMetrics};
use crate::ingest::{self, IngestMetrics, Ingester, quic};
use crate::metrics::Metrics;
use crate::query::{self, Querier, QueryMetrics};
use crate::rules::{self, Rules, RulesMetrics};
pub use crate::store::CheckReport;
use crate::store::{BlockStore, Store, StoreMetrics};
use crate::tenant;
use crate::{admin, ui};

/// Runs the aggregator until SIGTERM or SIGINT, then flushes and returns.
///
/// # Errors
///
/// When the data directory cannot be opened or locked, or the listener cannot bind.
pub fn run(config: Config, data_dir: &Path) -> anyhow::Result<()> {
    smolder_daemon::run("smolder-aggregator", None, start(config, data_dir))
}

/// A running aggregator.
pub struct Running {
    addr: SocketAddr,
    quic_addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
    health: Health,
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

    /// Its loops' heartbeats, as `/healthz` and `/readyz` report them.
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// Stops accepting requests, lets those in flight finish, flushes the store and returns.
    ///
    /// # Errors
    ///
    /// When serving failed or the final flush did.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.health.stopping();
        let _ = self.stop.send(());
        self.task.await.context("the server task panicked")?
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

/// Opens the store, binds the listeners and serves in the background.
///
/// # Errors
///
/// When the data directory cannot be opened or locked (another aggregator uses it), the rules
/// are invalid, or a listener cannot bind.
pub async fn start(config: Config, data_dir: &Path) -> anyhow::Result<Running> {
    let metrics = Arc::new(Metrics::new());
    let registry = metrics.registry();
    let health = metrics.health.clone();

    let store = BlockStore::open(
        data_dir,
        config.store.clone(),
        StoreMetrics::new(registry, &metrics.health),
    )
    .with_context(|| format!("opening the store in {}", data_dir.display()))?;
    let shared: Arc<dyn Store> = Arc::new(store.clone());

    rules::check_config(&config.metrics_export_rules, &config.rules)
        .context("checking the rules config")?;
    config.check_tenants()?;
    let rules_metrics = RulesMetrics::new(registry, metrics.dropped_increments.clone());
    let rules = Arc::new(
        Rules::load(
            &config.metrics_export_rules,
            Arc::clone(&shared),
            config.tenant.multitenancy_enabled,
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

    let listener = config.http.bind().await?;
    let addr = listener.addr();
    info!(data_dir = %data_dir.display(), "serving");

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
        // A push may take its whole timeout after waiting out its interval.
        let beat = health.register(
            "remote_write",
            config.rules.remote_write_interval + config.rules.remote_write_timeout,
        );
        tokio::spawn(rules::remote_write::run(
            Arc::clone(&rules),
            config.rules.clone(),
            rules_metrics,
            beat,
        ))
    });
    let router = http::router(
        [
            ingest::routes(ingester),
            query::routes(querier),
            rules::routes(rules),
            admin::routes(shared, metrics.errors.clone()),
            tenant::routes(),
            ui::routes(),
        ],
        Arc::clone(&metrics),
        requests,
    )
    .layer(tenant::layer(config.tenant));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = listener
            .serve(router, async {
                let _ = stopped.await;
            })
            .await;
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
        health,
    })
}

/// Verifies every block of the store in `data_dir` (`smolder-aggregator check`); safe beside a
/// running aggregator.
///
/// # Errors
///
/// When the block directory cannot be listed.
pub fn check(config: &Config, data_dir: &Path) -> anyhow::Result<CheckReport> {
    crate::store::check(data_dir, &config.store)
        .with_context(|| format!("checking the blocks of {}", data_dir.display()))
}
