//! A daemon's life under a service manager: start on a tokio runtime, tell systemd it is ready
//! (`Type=notify`) and ping its watchdog while its loops are live ([`Health::live`]), wait for
//! SIGTERM or SIGINT, tell systemd it is stopping, stop gracefully. Without `NOTIFY_SOCKET`
//! (not under systemd) nothing is sent.

use std::future::Future;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use sd_notify::NotifyState;
use tracing::{error, info, warn};

use crate::config::{DaemonConfig, load};
use crate::flags::Flags;
use crate::health::Health;
use crate::logs;

/// A started daemon that can be stopped gracefully.
pub trait Daemon {
    /// Its loops' heartbeats, which gate the watchdog pings.
    fn health(&self) -> Health;

    /// Stops accepting work, finishes or saves what is in flight, and returns.
    ///
    /// # Errors
    ///
    /// When serving failed or the final flush did.
    fn stop(self) -> impl Future<Output = anyhow::Result<()>>;
}

/// Runs a daemon on a new multi-threaded runtime whose threads are named `name` (with
/// `worker_threads` workers, or one per CPU): awaits `start`, says READY=1, pings the watchdog
/// when `WatchdogSec=` asks and its loops are live, and on SIGTERM or SIGINT says STOPPING=1 and
/// stops it.
///
/// # Errors
///
/// When the runtime cannot start, `start` fails, or the daemon's stop does.
pub fn run<D: Daemon>(
    name: &str,
    worker_threads: Option<usize>,
    start: impl Future<Output = anyhow::Result<D>>,
) -> anyhow::Result<()> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = worker_threads {
        builder.worker_threads(threads);
    }
    let runtime = builder
        .enable_all()
        .thread_name(name)
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let daemon = start.await?;
        notify_ready(daemon.health());
        shutdown_signal().await;
        info!("shutting down");
        notify_stopping();
        daemon.health().stopping();
        daemon.stop().await
    })
}

/// A daemon's whole `main`: parses its flags `F`, sets up logs from the shared ones (`daemon`
/// finds them in `F`), loads the config `C`, and hands both to `run`, whose result becomes the
/// exit code (an error logged once).
pub fn main<F: Parser, C: DaemonConfig>(
    daemon: fn(&F) -> &Flags,
    run: impl FnOnce(F, C) -> anyhow::Result<ExitCode>,
) -> ExitCode {
    let flags = F::parse();
    logs::init(daemon(&flags));
    exit(load::<C>(daemon(&flags).config.as_deref()).and_then(|config| run(flags, config)))
}

/// The process's exit code for what `run` returned: the error, if any, logged once.
pub fn exit(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Tells systemd that the daemon is ready: its listeners are bound and its stages started.
/// When the unit sets `WatchdogSec=`, pings the watchdog from a task on this runtime every half
/// of `WATCHDOG_USEC` while every loop of `health` is live, so that a wedged runtime, or a loop
/// stuck or dead, misses its pings and systemd restarts the daemon.
fn notify_ready(health: Health) {
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
        let mut withheld = false;
        loop {
            ticker.tick().await;
            if !health.live() {
                if !withheld {
                    let failing: Vec<String> = health
                        .report()
                        .into_iter()
                        .filter(|l| !l.live(false))
                        .map(|l| format!("{} {}", l.name, l.state))
                        .collect();
                    error!(
                        loops = failing.join(", "),
                        "a loop is stuck or dead; not pinging the systemd watchdog, which restarts the daemon"
                    );
                }
                withheld = true;
                continue;
            }
            withheld = false;
            if let Err(err) = sd_notify::notify(&[NotifyState::Watchdog]) {
                warn!(error = %err, "pinging the systemd watchdog failed");
            }
        }
    });
}

/// Tells systemd the daemon is stopping.
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
