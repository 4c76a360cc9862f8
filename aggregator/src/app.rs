//! Wires the stages together in data-path order: metrics, store, rules, ingest (HTTP and QUIC),
//! query, admin and the UI, then the router that serves them.
//!
//! [`run`] is what the binary calls; [`start`] is the same server on a caller's runtime, bound
//! and ready, which tests use to talk to a real aggregator over real HTTP. This is the one
//! module that knows every stage; each stage is handed only what it needs.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use smolder_daemon::Health;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::info;

use crate::admission::Admission;
use crate::auth::{self, Auth};
pub use crate::auth::{Access, Route, Scope};
use crate::config::Config;
use crate::http::{self, RequestMetrics};
use crate::identity;
use crate::ingest::{self, IngestMetrics, Ingester, Limits, quic};
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
    routes: Vec<Route>,
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

    /// Every HTTP route it serves, with who may call it.
    pub fn routes(&self) -> &[Route] {
        &self.routes
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

    // Opening reads the head back, loads blocks and, in object-storage mode, checks the bucket
    // and reads it: blocking work, on the blocking pool.
    let store = {
        let (dir, store_config) = (data_dir.to_owned(), config.store.clone());
        let store_metrics = StoreMetrics::new(registry, &metrics.health);
        tokio::task::spawn_blocking(move || BlockStore::open(&dir, store_config, store_metrics))
            .await
            .context("opening the store")?
            .with_context(|| format!("opening the store in {}", data_dir.display()))?
    };
    let shared: Arc<dyn Store> = Arc::new(store.clone());

    rules::check_config(&config.metrics_export_rules, &config.rules)
        .context("checking the rules config")?;
    config.check_tenants()?;
    let listener = config
        .http
        .bind()
        .await?
        .with_metrics(http::listener_metrics(&metrics));
    let addr = listener.addr();
    info!(data_dir = %data_dir.display(), tls = listener.is_tls(), "serving");
    let legacy = config.ingest.quic.token_tenants()?;
    let setup = auth::Setup {
        legacy: &legacy,
        multitenancy: config.tenant.multitenancy_enabled,
        data_dir,
        agent_token: config.ingest.quic.client_ca.is_none(),
        http_port: addr.port(),
    };
    // The aggregators of one bucket share one development CA and tokens: settled on in the
    // bucket before auth reads the tokens and QUIC ingest signs its certificate.
    let (admin_token, agent_token) = setup.development_tokens(&config.auth);
    let needs = identity::Needs {
        ca: config.ingest.quic.cert.is_none(),
        agent_token,
        admin_token,
    };
    if needs.any() && store.in_bucket() {
        let (dir, store) = (data_dir.to_owned(), store.clone());
        tokio::task::spawn_blocking(move || {
            identity::share(&dir, needs, |candidate| store.adopt_identity(candidate))
        })
        .await
        .context("sharing the development identity")?
        .context("sharing the development identity through the bucket")?;
    }
    let auth = Arc::new(
        Auth::start(
            config.auth.clone(),
            &setup,
            registry,
            metrics.refused.clone(),
        )
        .context("loading the credentials (auth)")?,
    );
    let tenant_limits = config.tenant.limits()?;
    let admission = Arc::new(Admission::new(
        &config.admission,
        &tenant_limits,
        registry,
        metrics.refused.clone(),
    ));
    let rules_metrics = RulesMetrics::new(registry, metrics.dropped_increments.clone());
    // Taken before the rules are read, so that no change found after is missed.
    let rule_changes = shared.rule_changes();
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
        Limits::new(&config.ingest, &tenant_limits, config.store.retention),
        IngestMetrics::new(registry),
        metrics.errors.clone(),
        metrics.dropped_series.clone(),
    ));
    let querier = Arc::new(Querier::new(
        Arc::clone(&shared),
        config.query.clone(),
        QueryMetrics::new(registry),
        metrics.errors.clone(),
        metrics.refused.clone(),
    ));
    let quic_metrics = quic::QuicMetrics::new(registry);
    let requests = RequestMetrics::new(registry);

    let quic = quic::start(
        config.ingest.quic.clone(),
        data_dir,
        quic::Parts {
            ingester: Arc::clone(&ingester),
            auth: Arc::clone(&auth),
            admission: Arc::clone(&admission),
            metrics: quic_metrics,
            errors: metrics.errors.clone(),
            refused: metrics.refused.clone(),
        },
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
    let follow = rule_changes.map(|changes| {
        // Waits for changes, beating meanwhile; a reload takes milliseconds.
        let beat = health.register("rules_follow", Duration::from_secs(30));
        tokio::spawn(Arc::clone(&rules).follow(changes, beat))
    });
    let reload = (!config.auth.credential_files.is_empty()).then(|| {
        // A read of every file each interval; twice its period is still on time.
        let beat = health.register("auth_reload", 2 * auth::RELOAD_INTERVAL);
        tokio::spawn(Arc::clone(&auth).run_reload(beat))
    });
    let (router, routes) = http::router(
        [
            ingest::routes(ingester),
            query::routes(querier),
            rules::routes(rules),
            admin::routes(shared, metrics.errors.clone()),
            auth::routes(Arc::clone(&auth)),
            ui::routes(),
        ],
        Arc::clone(&metrics),
        requests,
        auth,
        admission,
    );
    let router = router.layer(tenant::layer(&config.tenant));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = listener
            .serve(router, async {
                let _ = stopped.await;
            })
            .await;
        quic.close().await;
        for task in [remote_write, reload, follow].into_iter().flatten() {
            task.abort();
            // Dropped before the store closes: the rules' tasks hold it too.
            let _ = task.await;
        }
        let closed = store.close().await.context("flushing the store");
        served.and(closed)
    });
    Ok(Running {
        addr,
        quic_addr,
        routes,
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
