//! Wires the stages together in data-path order: store, then ingest and query over HTTP.
//!
//! [`run`] is what the binary calls; [`start`] is the same server on a caller's runtime, bound
//! and ready, which tests use to talk to a real aggregator over real HTTP.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use sd_notify::NotifyState;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::config::Config;
use crate::http;
use crate::ingest::quic;
use crate::metrics::{Metrics, StoreMetrics};
use crate::rules::{self, Rules};
use crate::store::Store;

/// What every request handler can reach.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) store: Store,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) config: Arc<Config>,
    pub(crate) rules: Arc<Rules>,
}

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

/// Opens the store, binds the listener and serves in the background.
///
/// # Errors
///
/// When the data directory cannot be opened or locked (another aggregator uses it), or the
/// listener cannot bind.
pub async fn start(config: Config, data_dir: &Path) -> anyhow::Result<Running> {
    let metrics = Arc::new(Metrics::new());
    let store = Store::open(data_dir, config.store.clone(), metrics.store.clone())
        .with_context(|| format!("opening the store in {}", data_dir.display()))?;
    rules::check_config(&config.metrics_export_rules, &config.rules)
        .context("checking the rules config")?;
    let rules = Arc::new(
        Rules::load(
            &config.metrics_export_rules,
            store.clone(),
            metrics.rules.clone(),
        )
        .context("loading the rules")?,
    );
    let listener = TcpListener::bind(config.http.listen)
        .await
        .with_context(|| format!("binding {}", config.http.listen))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    info!(%addr, data_dir = %data_dir.display(), "listening");

    let retention = tokio::spawn(retention_loop(
        store.clone(),
        config.store.retention_interval,
        data_dir.to_owned(),
        metrics.store.clone(),
    ));
    let rollup = tokio::spawn(rollup_loop(store.clone()));
    let remote_write = (!config.rules.remote_write_url.is_empty()).then(|| {
        tokio::spawn(rules::remote_write::run(
            rules.clone(),
            config.rules.clone(),
            metrics.rules.clone(),
        ))
    });
    let state = AppState {
        store: store.clone(),
        metrics,
        config: Arc::new(config),
        rules,
    };
    let quic = quic::start(state.clone(), data_dir)?;
    let quic_addr = quic.addr();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, http::router(state))
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .context("serving HTTP");
        quic.close().await;
        retention.abort();
        rollup.abort();
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

/// Applies retention on an interval, for as long as the server runs, and after each pass
/// reports the data directory's free space (the first tick is immediate).
async fn retention_loop(
    store: Store,
    interval: Duration,
    data_dir: PathBuf,
    metrics: StoreMetrics,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(err) = store.enforce_retention(SystemTime::now()).await {
            warn!(error = %err, "retention pass failed; retrying at the next interval");
        }
        match filesystem_space(&data_dir) {
            Ok((free, size)) => {
                metrics.filesystem_free_bytes.set(saturate(free));
                metrics.filesystem_size_bytes.set(saturate(size));
            }
            Err(err) => warn!(error = %err, "reading the data directory's free space failed"),
        }
    }
}

fn saturate(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// Bytes available to an unprivileged writer and total size of the filesystem holding `path`
/// (statvfs(3)).
fn filesystem_space(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt as _;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("the data directory path holds a NUL byte"))?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a NUL-terminated string and `stat` is writable memory of the right
    // type, which statvfs fills on success.
    let result = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it initialised `stat`.
    let stat = unsafe { stat.assume_init() };
    // fsblkcnt_t and unsigned long are both u64 on the 64-bit targets Smolder ships for.
    Ok((
        stat.f_bavail.saturating_mul(stat.f_frsize),
        stat.f_blocks.saturating_mul(stat.f_frsize),
    ))
}

/// How often closed rollups are built: often enough that a query rarely reads around more than
/// one open rollup per level.
const ROLLUP_INTERVAL: Duration = Duration::from_secs(10);

/// Builds closed rollups on an interval, for as long as the server runs.
async fn rollup_loop(store: Store) {
    let mut ticker = tokio::time::interval(ROLLUP_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(err) = store.rollup(SystemTime::now()).await {
            warn!(error = %err, "building rollups failed; retrying at the next interval");
        }
    }
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
