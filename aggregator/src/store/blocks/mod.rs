//! The block store: [`BlockStore`], the [`Store`] that keeps recent writes in a head and
//! everything older in immutable blocks (the `smolder-block` format), in a local directory
//! through `object_store`.
//!
//! What it owns, under the data directory (locked against a second aggregator, `disk.rs`):
//!
//! - `head/` (`wal.rs`): every acknowledged write until it is in a block, one append-only log
//!   per 1000 s head range (deleted when the range is cut), and a small sled database of the
//!   agents' batch markers (dedupe), recording rules and app deletions. The writes are also held
//!   in memory (`head.rs`), which is what reads of recent data use.
//! - `blocks/` (`store.object-store`), the blocks (`files.rs`), each `<tenant>/<start>-<span>-
//!   <id>.block`.
//! - one writer thread (`writer.rs`) that applies writes (each group made durable with one
//!   fsync before any is acknowledged), seals closed head ranges for a cut and publishes the
//!   blocks built from them (`cut.rs`, on the blocking pool), applies app deletions, rules and
//!   retention, and publishes compactions;
//! - the maintenance tasks [`BlockStore::start_maintenance`] spawns: cuts every 10 s,
//!   compaction (`compact.rs`) and retention every `store.compaction-interval` and
//!   `store.retention-interval`, then the disk gauges.
//!
//! **Exactly once across a cut.** Every write carries a marker: an agent batch's (agent id,
//! sequence), or for an HTTP write the aggregator's own id and write number. A cut writes the
//! block (durable, fsynced with its directory) before it deletes the range's records from the
//! head; a restart drops every head record whose marker a block of its range holds, so a crash
//! between the two counts nothing twice. Markers go into the blocks with their data (kept
//! separable in a cut, listed per bucket after a merge), so a retry that arrives after a cut or
//! a compaction is still caught (by the head's marker index, and in issue 18 by the blocks).
//!
//! **Lineage.** A merged block lists the blocks it replaces (its sources section); a block that
//! a present block lists is hidden and deleted, so a crash between writing a merge and deleting
//! its inputs never shows their data twice.
//!
//! Reads take the head under the state lock and a snapshot of the block set, then read blocks
//! without a lock: a block deleted meanwhile stays readable through its open file.

mod cache;
mod compact;
mod cut;
pub(crate) mod files;
mod head;
mod migrate;
mod read;
#[cfg(test)]
mod tests;
mod wal;
mod writer;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use smolder_common::{Profile, Selector};
use smolder_daemon::{Heartbeat, Supervised, supervise};
use tokio::sync::{mpsc, oneshot};
use tracing::{Instrument, error, info, info_span, warn};

use super::disk::DataDir;
use super::plan;
use super::{
    Ack, AppInfo, BatchMarker, Merged, SeriesInfo, Store, StoreConfig, StoreError, StoreMetrics,
    TimeRange, Timelines, Written, unix,
};
use crate::tenant::Tenant;

use self::cache::ChunkCache;
use self::files::{BlockFile, BlockSet, Files, OpenError};
use self::head::Head;
use self::wal::Wal;
use self::writer::{Command, Prepared, WriteIds};

pub use self::files::{LocalConfig, ObjectStoreConfig};

/// What a retention pass removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RetentionReport {
    /// Blocks deleted.
    pub(crate) blocks: u64,
    /// Batch markers forgotten.
    pub(crate) markers: u64,
}

/// What a compaction pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CompactionReport {
    /// Merges written and published.
    pub(crate) merged: u64,
    /// Blocks they replaced.
    pub(crate) inputs: u64,
    /// Merges given up (a damaged input, a deletion or retention meanwhile).
    pub(crate) abandoned: u64,
}

/// The store's state that reads see: the head and the live blocks.
pub(crate) struct State {
    pub(crate) head: Head,
    pub(crate) blocks: Arc<BlockSet>,
    /// Bumped by every app deletion: a compaction planned before one is not published.
    pub(crate) generation: u64,
}

/// What the writer, compaction and reads share.
pub(crate) struct Shared {
    pub(crate) state: RwLock<State>,
    pub(crate) files: Files,
    pub(crate) wal: Wal,
    pub(crate) cache: ChunkCache,
    pub(crate) config: StoreConfig,
    pub(crate) metrics: StoreMetrics,
    /// Test-only: a pause inside a cut and a compaction, after the block is written and before
    /// the head or the inputs go, so that a test can kill the process there
    /// (`SMOLDER_STORE_TEST_PAUSE_MS`).
    pub(crate) pause: Option<Duration>,
}

impl Shared {
    fn state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // Held by reads for the head part of a query, by the writer to publish.
        self.state.read().expect("store state lock")
    }

    fn state_mut(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().expect("store state lock")
    }

    /// Logs and counts a block found damaged by a read or a merge, once per block.
    fn damaged(&self, block: &BlockFile, what: &str, err: &dyn std::fmt::Display) {
        if block.mark_bad() {
            error!(block = %block.name, error = %err, "{what}: block damaged; no longer read, the rest is served");
            self.metrics.bad_blocks.inc();
        }
    }

    fn test_pause(&self, what: &str) {
        if let Some(pause) = self.pause {
            warn!(what, "test pause");
            std::thread::sleep(pause);
            warn!(what, "test pause over");
        }
    }
}

/// The block store. Cheap to clone; every clone shares the same state and writer.
#[derive(Clone)]
pub(crate) struct BlockStore {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    commands: mpsc::Sender<Command>,
    /// Numbers writes as callers prepare them.
    ids: Arc<WriteIds>,
    writer: Mutex<Option<Supervised>>,
    maintenance: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// One compaction pass at a time.
    compacting: Arc<Mutex<()>>,
    /// One cut pass at a time.
    cutting: Arc<Mutex<()>>,
    dir: DataDir,
}

/// How many write requests may wait for the writer before callers wait to queue.
const QUEUE: usize = 1024;

/// How often closed head ranges are cut.
const CUT_INTERVAL: Duration = Duration::from_secs(10);

/// The writer's heartbeat period: it beats after every group of commands, and the cut task
/// sends it one every 10 s; a retention pass takes seconds. Stuck after three periods.
const WRITER_PERIOD: Duration = Duration::from_secs(30);

/// The least heartbeat period of a maintenance task: a cut, compaction or retention pass beats
/// before and after it runs, and a merge of large blocks may take minutes.
const MAINTENANCE_PERIOD: Duration = Duration::from_secs(300);

impl BlockStore {
    /// Opens (creating if needed) the store in `dir`, locking it against other aggregators:
    /// migrates a v0.1 sled store found there, loads the blocks (naming and setting aside any
    /// that cannot be read), deletes blocks a merge replaced, and replays the head.
    ///
    /// # Errors
    ///
    /// [`StoreError::Locked`] when another aggregator holds the directory; [`StoreError::Io`]
    /// or [`StoreError::Object`] when the directories cannot be used; [`StoreError::Engine`] or
    /// [`StoreError::Corrupt`] when the head cannot be read.
    pub(crate) fn open(
        dir: &Path,
        config: StoreConfig,
        metrics: StoreMetrics,
    ) -> Result<BlockStore, StoreError> {
        let dir = DataDir::lock(dir)?;
        let files = Files::open(&config.object_store, dir.path())?;
        let wal = Wal::open(&dir.path().join("head"))?;
        migrate::run(dir.path(), &files, &wal)?;
        let (blocks, tombstones) = load(&files, &wal, &metrics)?;
        let pause = std::env::var("SMOLDER_STORE_TEST_PAUSE_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .map(Duration::from_millis);
        let shared = Arc::new(Shared {
            state: RwLock::new(State {
                head: Head::default(),
                blocks: Arc::new(blocks),
                generation: 0,
            }),
            files,
            wal,
            cache: ChunkCache::new(config.cache_bytes, metrics.clone()),
            config,
            metrics,
            pause,
        });
        let opened = writer::Writer::open(Arc::clone(&shared), tombstones)?;
        let ids = opened.ids();
        let mut opened = Some(opened);
        let (commands, mut queue) = mpsc::channel(QUEUE);
        let heartbeat = shared
            .metrics
            .health
            .register("store_writer", WRITER_PERIOD);
        let reopen = (Arc::clone(&shared), Arc::clone(&ids));
        // A panic drops the writer with its unanswered commands (their callers get an error and
        // retry); the next run rebuilds the head from the logs, so that nothing acknowledged or
        // durable is missing from it, and serves the queue, which waited meanwhile.
        let handle = supervise(heartbeat, "smolder-store-writer", move |beat| {
            let writer = match opened.take() {
                Some(writer) => writer,
                None => writer::Writer::reopen(Arc::clone(&reopen.0), Arc::clone(&reopen.1))?,
            };
            writer.run(&mut queue, beat);
            Ok(())
        })
        .map_err(|source| StoreError::Io {
            path: dir.path().to_owned(),
            source,
        })?;
        Ok(BlockStore {
            inner: Arc::new(Inner {
                shared,
                commands,
                ids,
                writer: Mutex::new(Some(handle)),
                maintenance: Mutex::new(Vec::new()),
                compacting: Arc::new(Mutex::new(())),
                cutting: Arc::new(Mutex::new(())),
                dir,
            }),
        })
    }

    /// Starts the maintenance tasks on the current tokio runtime: cuts of closed head ranges
    /// every 10 s, compaction every `store.compaction-interval`, retention every
    /// `store.retention-interval` (each first at once, retention followed by the disk gauges).
    /// [`BlockStore::close`] stops them.
    pub(crate) fn start_maintenance(&self) {
        let config = &self.inner.shared.config;
        let health = &self.inner.shared.metrics.health;
        let cut = {
            let store = self.clone();
            let beat = health.register("store_cut", MAINTENANCE_PERIOD);
            tokio::spawn(
                every(CUT_INTERVAL, beat, move || {
                    let store = store.clone();
                    async move {
                        if let Err(err) = store.cut(SystemTime::now()).await {
                            warn!(error = %err, "cutting the head failed; retrying at the next interval");
                        }
                    }
                })
                .instrument(info_span!("store_cut")),
            )
        };
        let compaction = {
            let store = self.clone();
            let beat = health.register(
                "store_compaction",
                config.compaction_interval.max(MAINTENANCE_PERIOD),
            );
            tokio::spawn(
                every(config.compaction_interval, beat, move || {
                    let store = store.clone();
                    async move {
                        if let Err(err) = store.compact(SystemTime::now()).await {
                            warn!(error = %err, "compaction failed; retrying at the next interval");
                        }
                    }
                })
                .instrument(info_span!("store_compaction")),
            )
        };
        let retention = {
            let store = self.clone();
            let beat = health.register(
                "store_retention",
                config.retention_interval.max(MAINTENANCE_PERIOD),
            );
            tokio::spawn(
                every(config.retention_interval, beat, move || {
                    let store = store.clone();
                    async move {
                        if let Err(err) = store.enforce_retention(SystemTime::now()).await {
                            warn!(error = %err, "retention pass failed; retrying at the next interval");
                        }
                        store.inner.dir.report_space(&store.inner.shared.metrics);
                    }
                })
                .instrument(info_span!("store_retention")),
            )
        };
        self.inner
            .maintenance
            .lock()
            .expect("maintenance lock: taken only to add or take the handles")
            .extend([cut, compaction, retention]);
    }

    /// Cuts every head range closed as of `now` into blocks, built on the blocking pool while
    /// writes go on (`cut.rs`); returns how many blocks it published.
    ///
    /// # Errors
    ///
    /// As [`Store::write`], and [`StoreError::Object`] when a block cannot be written.
    pub(crate) async fn cut(&self, now: SystemTime) -> Result<u64, StoreError> {
        let shared = Arc::clone(&self.inner.shared);
        let commands = self.inner.commands.clone();
        let lock = Arc::clone(&self.inner.cutting);
        tokio::task::spawn_blocking(move || {
            let _one = lock.lock().expect("cut lock");
            cut::pass(&shared, &commands, now)
        })
        .await
        .map_err(|_| StoreError::Closed)?
    }

    /// Runs one compaction pass as of `now`: merges (and downsamples) what `plan::compactions`
    /// names, publishing each merge through the writer, then deletes the replaced blocks and
    /// unfinished writes.
    ///
    /// # Errors
    ///
    /// When the store is closed or the block directory cannot be listed; a merge that fails
    /// is logged and counted, and the pass goes on.
    pub(crate) async fn compact(&self, now: SystemTime) -> Result<CompactionReport, StoreError> {
        let shared = Arc::clone(&self.inner.shared);
        let commands = self.inner.commands.clone();
        let lock = Arc::clone(&self.inner.compacting);
        tokio::task::spawn_blocking(move || {
            let _one = lock.lock().expect("compaction lock");
            compact::pass(&shared, &commands, unix(now))
        })
        .await
        .map_err(|_| StoreError::Closed)?
    }

    /// Deletes the blocks past the configured retention (and, past `max-disk-bytes`, the
    /// oldest), and the batch markers older than the retention, as of `now`.
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

    /// Stops the maintenance tasks, finishes queued writes, flushes, and stops the writer. The
    /// head stays in its database, replayed at the next open. Later writes get
    /// [`StoreError::Closed`]; reads keep working.
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
        // A cut or a compaction in flight finishes or gives up before the store is gone.
        for lock in [&self.inner.cutting, &self.inner.compacting] {
            let lock = Arc::clone(lock);
            let _ = tokio::task::spawn_blocking(move || drop(lock.lock())).await;
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

/// Runs `f` every `period` (the first at once), for as long as the server runs, beating
/// `beat` while it waits for the next run and after each (a run that hangs stops the beats).
async fn every<F, Fut>(period: Duration, beat: Heartbeat, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        beat.beating(ticker.tick()).await;
        f().await;
        beat.beat();
    }
}

/// App deletions as loaded: (tenant, app) → hidden block ids.
pub(crate) type Tombstones = HashMap<(Tenant, String), BTreeSet<String>>;

/// The app deletions of the database, each with the blocks it hides among `present`.
///
/// # Errors
///
/// When the database cannot be read.
fn tombstones(wal: &Wal, present: &BTreeSet<String>) -> Result<Tombstones, StoreError> {
    let mut tombstones = Tombstones::new();
    for (tenant, app, blocks) in wal.tombstones()? {
        let blocks: BTreeSet<String> = blocks.intersection(present).cloned().collect();
        tombstones.insert((tenant, app), blocks);
    }
    Ok(tombstones)
}

/// Loads every block, sets aside those that cannot be read (named in the log and counted),
/// deletes those a present block replaces, and the app deletions that still apply.
fn load(
    files: &Files,
    wal: &Wal,
    metrics: &StoreMetrics,
) -> Result<(BlockSet, Tombstones), StoreError> {
    let started = Instant::now();
    let mut good = Vec::new();
    let mut bad = 0;
    for (name, len) in files.list()? {
        match files.open_block(&name, len) {
            Ok(block) => good.push(Arc::new(block)),
            Err(OpenError::Block(err)) => {
                error!(block = %name, error = %err, "block cannot be read (damaged, truncated, or of a newer format); it is not served and left in place");
                bad += 1;
            }
            Err(OpenError::Store(err)) => {
                error!(block = %name, error = %err, "block cannot be opened; it is not served");
                bad += 1;
            }
        }
    }
    metrics.bad_blocks.set(bad);
    // Nothing writes blocks before the store is open: any unfinished write is a crash's.
    let unfinished = files.delete_unfinished(Duration::ZERO);
    if unfinished > 0 {
        info!(files = unfinished, "deleted unfinished block writes");
    }
    let replaced: BTreeSet<String> = good
        .iter()
        .flat_map(|b| b.sources.iter().cloned())
        .collect();
    let mut set = BlockSet::default();
    for block in good {
        if replaced.contains(&block.name.id) {
            info!(block = %block.name, "deleting a block that a merge replaced");
            files.delete(&block.name)?;
        } else {
            set.insert(block);
        }
    }
    let present: BTreeSet<String> = set.all().map(|b| b.name.id.clone()).collect();
    let tombstones = tombstones(wal, &present)?;
    for ((_, app), blocks) in &tombstones {
        for id in blocks {
            set.hidden
                .entry(id.clone())
                .or_default()
                .insert(app.clone());
        }
    }
    info!(
        blocks = present.len(),
        bad,
        seconds = started.elapsed().as_secs_f64(),
        "blocks loaded"
    );
    Ok((set, tombstones))
}

impl Store for BlockStore {
    fn write(
        &self,
        tenant: &Tenant,
        profiles: Vec<Profile>,
        marker: Option<BatchMarker>,
    ) -> Ack<Written> {
        let tenant = tenant.clone();
        let ids = Arc::clone(&self.inner.ids);
        let commands = self.inner.commands.clone();
        Box::pin(async move {
            let queued = Instant::now();
            // Encoding and compressing the records is most of a write's work: done here, in
            // parallel across requests, the writer thread only appends and syncs.
            let (write, marker) = tokio::task::spawn_blocking(move || {
                let write = Prepared::new(&ids, tenant, profiles, marker.as_ref());
                (write, marker)
            })
            .await
            .map_err(|err| StoreError::Engine {
                source: Box::new(err),
            })?;
            let (reply, answer) = oneshot::channel();
            commands
                .send(Command::Write {
                    write,
                    marker,
                    reply,
                    queued,
                })
                .await
                .map_err(|_| StoreError::Closed)?;
            answer.await.map_err(|_| StoreError::Closed)?
        })
    }

    fn delete_app(&self, tenant: &Tenant, app: &str) -> Ack<u64> {
        let (tenant, app) = (tenant.clone(), app.to_owned());
        self.ask(move |reply| Command::DeleteApp { tenant, app, reply })
    }

    fn put_rule(&self, tenant: &Tenant, name: &str, rule: Vec<u8>) -> Ack<()> {
        let (tenant, name) = (tenant.clone(), name.to_owned());
        self.ask(move |reply| Command::PutRule {
            tenant,
            name,
            rule,
            reply,
        })
    }

    fn delete_rule(&self, tenant: &Tenant, name: &str) -> Ack<bool> {
        let (tenant, name) = (tenant.clone(), name.to_owned());
        self.ask(move |reply| Command::DeleteRule {
            tenant,
            name,
            reply,
        })
    }

    fn series(
        &self,
        tenant: &Tenant,
        selector: &Selector,
        range: TimeRange,
    ) -> Result<Vec<SeriesInfo>, StoreError> {
        Ok(read::series(&self.inner.shared, tenant, selector, range))
    }

    fn merge(
        &self,
        tenant: &Tenant,
        selector: &Selector,
        range: TimeRange,
        resolution: u64,
    ) -> Result<Merged, StoreError> {
        Ok(read::merge(
            &self.inner.shared,
            tenant,
            selector,
            range,
            resolution,
        ))
    }

    fn timelines(
        &self,
        tenant: &Tenant,
        selector: &Selector,
        range: TimeRange,
        step: u64,
        group_by: Option<&str>,
    ) -> Result<Timelines, StoreError> {
        Ok(read::timelines(
            &self.inner.shared,
            tenant,
            selector,
            range,
            step,
            group_by,
        ))
    }

    fn label_names(
        &self,
        tenant: &Tenant,
        app: Option<&str>,
        range: TimeRange,
    ) -> Result<Vec<String>, StoreError> {
        Ok(read::label_names(&self.inner.shared, tenant, app, range))
    }

    fn label_values(
        &self,
        tenant: &Tenant,
        name: &str,
        selector: Option<&Selector>,
        range: TimeRange,
    ) -> Result<Vec<String>, StoreError> {
        Ok(read::label_values(
            &self.inner.shared,
            tenant,
            name,
            selector,
            range,
        ))
    }

    fn apps(&self, tenant: &Tenant) -> Result<Vec<AppInfo>, StoreError> {
        Ok(read::apps(&self.inner.shared, tenant))
    }

    fn rules(&self, tenant: &Tenant) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.inner.shared.wal.rules(tenant)
    }

    fn rule_tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        self.inner.shared.wal.rule_tenants()
    }
}

/// `plan`'s view of a tenant's live blocks.
fn block_plans(blocks: &[Arc<BlockFile>]) -> Vec<plan::BlockPlan> {
    blocks
        .iter()
        .filter(|b| !b.is_bad())
        .map(|b| plan::BlockPlan {
            id: b.name.id.clone(),
            start: b.name.start,
            span: b.name.span,
            finest: b.finest(),
            bytes: b.len,
        })
        .collect()
}
