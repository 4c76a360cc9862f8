//! The sled backend: [`SledStore`], the [`Store`] that keeps everything in one sled database.
//!
//! What it owns:
//!
//! - the data directory, locked against a second aggregator (`LOCK`, `disk.rs`), and a sled
//!   database in `sled/` holding every record in one keyspace (layout in `keys.rs`);
//! - one writer thread (`writer.rs`) that applies writes, deletions, rule changes, rollups and
//!   retention in order, each request as one atomic sled batch, and makes a whole group of them
//!   durable with one fsync before acknowledging any (group commit);
//! - for every series, a tree and a total per 10 s bucket, plus pre-merged rollups at 100 s,
//!   1000 s and 10 000 s, rebuilt once their bucket has closed, so that a query of any span
//!   reads a bounded number of trees (`read.rs`);
//! - the maintenance tasks [`SledStore::start_maintenance`] spawns: rollups every 10 s,
//!   retention every `store.retention-interval`, then the filesystem gauges.
//!
//! Reads run on the caller's thread against sled's consistent snapshot of each key. It holds
//! only the anonymous tenant: its keys have no tenant, so that a data directory written before
//! tenants existed reads unchanged.

mod keys;
mod read;
mod series;
#[cfg(test)]
mod tests;
mod writer;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use smolder_common::{Profile, Selector};
use tokio::sync::{mpsc, oneshot};
use tracing::{Instrument, info_span, warn};

use super::disk::DataDir;
use super::{
    Ack, AppInfo, BatchMarker, Merged, SeriesInfo, Store, StoreConfig, StoreError, StoreMetrics,
    TimeRange, Timelines, Written,
};
use crate::tenant::Tenant;

use self::writer::Command;

/// What a retention pass removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RetentionReport {
    /// Buckets (trees with their totals) deleted.
    pub(crate) buckets: u64,
    /// Series deleted because none of their data remained.
    pub(crate) series: u64,
}

/// The sled store. Cheap to clone; every clone talks to the same database and writer.
#[derive(Clone)]
pub(crate) struct SledStore {
    inner: Arc<Inner>,
}

struct Inner {
    data: sled::Tree,
    commands: mpsc::Sender<Command>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// The maintenance tasks, aborted at close.
    maintenance: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    config: StoreConfig,
    metrics: StoreMetrics,
    dir: DataDir,
}

/// How many write requests may wait for the writer before callers wait to queue; enough for
/// every connection of a busy aggregator to have one in flight.
const QUEUE: usize = 1024;

/// How often closed rollups are built: often enough that a query rarely reads around more than
/// one open rollup per level.
const ROLLUP_INTERVAL: Duration = Duration::from_secs(10);

impl From<sled::Error> for StoreError {
    fn from(err: sled::Error) -> StoreError {
        StoreError::Engine {
            source: Box::new(err),
        }
    }
}

impl SledStore {
    /// Opens (creating if needed) the store in `dir`, locking it against other aggregators.
    ///
    /// # Errors
    ///
    /// [`StoreError::Locked`] when another aggregator holds the directory; [`StoreError::Io`]
    /// when it cannot be created; [`StoreError::Engine`] when the database cannot be opened.
    pub(crate) fn open(
        dir: &Path,
        config: StoreConfig,
        metrics: StoreMetrics,
    ) -> Result<SledStore, StoreError> {
        let dir = DataDir::lock(dir)?;
        let db = sled::Config::new()
            .path(dir.path().join("sled"))
            .cache_capacity(config.cache_bytes)
            .open()?;
        let data = db.open_tree("data")?;
        let (commands, queue) = mpsc::channel(QUEUE);
        let state = writer::Writer::open(db, data.clone(), config.clone(), metrics.clone())?;
        let handle = std::thread::Builder::new()
            .name("smolder-store-writer".to_owned())
            .spawn(move || state.run(queue))
            .map_err(|source| StoreError::Io {
                path: dir.path().to_owned(),
                source,
            })?;
        Ok(SledStore {
            inner: Arc::new(Inner {
                data,
                commands,
                writer: Mutex::new(Some(handle)),
                maintenance: Mutex::new(Vec::new()),
                config,
                metrics,
                dir,
            }),
        })
    }

    /// Starts the maintenance tasks on the current tokio runtime: rollups of closed buckets
    /// every 10 s; retention every `store.retention-interval` (the first pass at once), each
    /// pass followed by the filesystem gauges. [`SledStore::close`] stops them.
    pub(crate) fn start_maintenance(&self) {
        let rollup = tokio::spawn(rollup_loop(self.clone()).instrument(info_span!("store_rollup")));
        let retention =
            tokio::spawn(retention_loop(self.clone()).instrument(info_span!("store_retention")));
        self.inner
            .maintenance
            .lock()
            .expect("maintenance lock: taken only to add or take the handles")
            .extend([rollup, retention]);
    }

    /// Deletes data older than the configured retention (and, past `max_disk_bytes`, the
    /// oldest data), as of `now`.
    ///
    /// # Errors
    ///
    /// As [`Store::write`].
    pub(crate) async fn enforce_retention(
        &self,
        now: SystemTime,
    ) -> Result<RetentionReport, StoreError> {
        self.ask(move |reply| Command::Retention { now, reply })
            .await
    }

    /// Builds the rollups whose buckets closed as of `now`; returns how many trees it wrote.
    /// Reads are correct whether or not this has run; it makes them cheaper and keeps writes
    /// small.
    ///
    /// # Errors
    ///
    /// As [`Store::write`].
    pub(crate) async fn rollup(&self, now: SystemTime) -> Result<u64, StoreError> {
        self.ask(move |reply| Command::Rollup { now, reply }).await
    }

    /// Stops the maintenance tasks, finishes queued writes, flushes, and stops the writer.
    /// Later writes get [`StoreError::Closed`]; reads keep working.
    ///
    /// # Errors
    ///
    /// When the final flush fails.
    pub(crate) async fn close(&self) -> Result<(), StoreError> {
        let tasks = std::mem::take(
            &mut *self
                .inner
                .maintenance
                .lock()
                .expect("maintenance lock: taken only to add or take the handles"),
        );
        for task in tasks {
            task.abort();
        }
        let result = match self.ask(|reply| Command::Close { reply }).await {
            Err(StoreError::Closed) => Ok(()),
            other => other,
        };
        let handle = self.inner.writer.lock().expect("writer handle lock").take();
        if let Some(handle) = handle {
            // The writer has answered Close, so it is returning; joining cannot block long.
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
        result
    }

    /// Sends a command to the writer and waits for its answer.
    fn ask<T: Send + 'static>(
        &self,
        command: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Command + Send + 'static,
    ) -> Ack<T> {
        let commands = self.inner.commands.clone();
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            commands
                .send(command(reply))
                .await
                .map_err(|_| StoreError::Closed)?;
            answer.await.map_err(|_| StoreError::Closed)?
        })
    }
}

/// Refuses every tenant but the anonymous one, whose data is the whole keyspace.
fn check(tenant: &Tenant) -> Result<(), StoreError> {
    if tenant.is_anonymous() {
        Ok(())
    } else {
        Err(StoreError::UnknownTenant {
            tenant: tenant.as_str().to_owned(),
        })
    }
}

/// An [`Ack`] that fails at once.
fn refused<T: Send + 'static>(err: StoreError) -> Ack<T> {
    Box::pin(std::future::ready(Err(err)))
}

impl Store for SledStore {
    fn write(
        &self,
        tenant: &Tenant,
        profiles: Vec<Profile>,
        marker: Option<BatchMarker>,
    ) -> Ack<Written> {
        if let Err(err) = check(tenant) {
            return refused(err);
        }
        self.ask(move |reply| Command::Write {
            profiles,
            marker,
            reply,
            queued: Instant::now(),
        })
    }

    fn delete_app(&self, tenant: &Tenant, app: &str) -> Ack<u64> {
        if let Err(err) = check(tenant) {
            return refused(err);
        }
        let app = app.to_owned();
        self.ask(move |reply| Command::DeleteApp { app, reply })
    }

    fn put_rule(&self, tenant: &Tenant, name: &str, rule: Vec<u8>) -> Ack<()> {
        if let Err(err) = check(tenant) {
            return refused(err);
        }
        let name = name.to_owned();
        self.ask(move |reply| Command::PutRule { name, rule, reply })
    }

    fn delete_rule(&self, tenant: &Tenant, name: &str) -> Ack<bool> {
        if let Err(err) = check(tenant) {
            return refused(err);
        }
        let name = name.to_owned();
        self.ask(move |reply| Command::DeleteRule { name, reply })
    }

    fn series(
        &self,
        tenant: &Tenant,
        selector: &Selector,
        range: TimeRange,
    ) -> Result<Vec<SeriesInfo>, StoreError> {
        check(tenant)?;
        read::series(&self.inner.data, selector, range)
    }

    fn merge(
        &self,
        tenant: &Tenant,
        selector: &Selector,
        range: TimeRange,
        resolution: u64,
    ) -> Result<Merged, StoreError> {
        check(tenant)?;
        read::merge(&self.inner.data, selector, range, resolution)
    }

    fn timelines(
        &self,
        tenant: &Tenant,
        selector: &Selector,
        range: TimeRange,
        step: u64,
        group_by: Option<&str>,
    ) -> Result<Timelines, StoreError> {
        check(tenant)?;
        read::timelines(&self.inner.data, selector, range, step, group_by)
    }

    fn label_names(
        &self,
        tenant: &Tenant,
        app: Option<&str>,
        range: TimeRange,
    ) -> Result<Vec<String>, StoreError> {
        check(tenant)?;
        read::label_names(&self.inner.data, app, range)
    }

    fn label_values(
        &self,
        tenant: &Tenant,
        name: &str,
        selector: Option<&Selector>,
        range: TimeRange,
    ) -> Result<Vec<String>, StoreError> {
        check(tenant)?;
        read::label_values(&self.inner.data, name, selector, range)
    }

    fn apps(&self, tenant: &Tenant) -> Result<Vec<AppInfo>, StoreError> {
        check(tenant)?;
        read::apps(&self.inner.data)
    }

    fn rules(&self, tenant: &Tenant) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        check(tenant)?;
        read::rules(&self.inner.data)
    }
}

/// Builds closed rollups on an interval, for as long as the server runs.
async fn rollup_loop(store: SledStore) {
    let mut ticker = tokio::time::interval(ROLLUP_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(err) = store.rollup(SystemTime::now()).await {
            warn!(error = %err, "building rollups failed; retrying at the next interval");
        }
    }
}

/// Applies retention on an interval, for as long as the server runs, and after each pass
/// reports the data directory's free space (the first tick is immediate).
async fn retention_loop(store: SledStore) {
    let mut ticker = tokio::time::interval(store.inner.config.retention_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(err) = store.enforce_retention(SystemTime::now()).await {
            warn!(error = %err, "retention pass failed; retrying at the next interval");
        }
        store.inner.dir.report_space(&store.inner.metrics);
    }
}
