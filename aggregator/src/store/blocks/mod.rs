//! The block store: [`BlockStore`], the [`Store`] that keeps recent writes in a head and
//! everything older in immutable blocks (the `smolder-block` format), in a local directory or an
//! S3 bucket through `object_store`.
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
//!
//! **Object-storage mode** (`store.object-store.type: s3`; ARCHITECTURE.md, "Object storage
//! and several aggregators"): `bucket.rs` is the bucket; the writer's durability step is a
//! segment upload (`segment.rs`, `uploads.rs`) instead of the head's log; `sync.rs` polls the
//! bucket for other aggregators' blocks and segments, whose records `remote.rs` holds beside
//! the own head; `dedupe.rs` says which copy reads leave out when two blocks hold one batch.
//! What the aggregators share besides the data is under `shared/`, its keys escaped one way
//! (`keys.rs`): the recording rules (`rules.rs`, polled by the `store_shared` loop), the app
//! deletions (`deletions.rs`, listed by the sync loop) and the development identity, which the
//! first aggregators to start settle on (`candidates.rs`).

mod bucket;
mod cache;
mod candidates;
mod compact;
mod cut;
mod dedupe;
mod deletions;
pub(crate) mod files;
mod head;
mod keys;
mod lineage;
mod migrate;
mod read;
mod remote;
mod role;
mod rules;
mod segment;
mod sync;
#[cfg(test)]
mod tests;
mod uploads;
mod wal;
mod writer;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use smolder_common::{Profile, Selector, SpanId};
use smolder_daemon::{Heartbeat, Supervised, supervise};
use tokio::sync::{mpsc, oneshot};
use tracing::{Instrument, error, info, info_span, warn};

use super::disk::DataDir;
use super::plan;
use super::{
    Ack, AppInfo, BatchMarker, Merged, ProfileSpans, SeriesInfo, Store, StoreConfig, StoreError,
    StoreMetrics, TimeRange, Timelines, Written, unix,
};
use crate::tenant::Tenant;

use self::cache::ChunkCache;
use self::files::{BlockFile, BlockSet, Files, OpenError};
use self::head::Head;
use self::remote::Remote;
use self::rules::BucketRules;
use self::segment::{Doubtful, Owned};
use self::uploads::BucketMode;
use self::wal::Wal;
use self::writer::{Command, Prepared, WriteIds};

pub use self::bucket::{Compactor, S3Config};
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

/// The store's state that reads see: the head, the live blocks and (object-storage mode) the
/// other writers' records.
pub(crate) struct State {
    pub(crate) head: Head,
    pub(crate) remote: Remote,
    pub(crate) blocks: Arc<BlockSet>,
    /// The app deletions known (`deletions.rs`).
    pub(crate) deletions: deletions::Deletions,
    /// Bumped by every app deletion learnt: a compaction planned before one is not published.
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
    /// Object-storage mode's state; `None` in local mode.
    pub(crate) bucket: Option<BucketMode>,
    /// Ids of blocks of the bucket that could not be read, so that the sync loop does not
    /// download them again at every poll.
    bad: Mutex<BTreeSet<String>>,
    /// The pairs of blocks compared for batches both hold (object-storage mode).
    duplicates: Mutex<dedupe::Duplicates>,
}

impl Shared {
    /// Whether this aggregator compacts now: always in local mode, else as the compaction role
    /// says (`role.rs`, as of the last poll).
    fn compacting(&self) -> bool {
        self.bucket
            .as_ref()
            .is_none_or(|mode| mode.compacting.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Whether block `id` was found unreadable.
    fn is_bad_block(&self, id: &str) -> bool {
        self.bad.lock().expect("bad blocks lock").contains(id)
    }

    /// Remembers block `id` as unreadable, counted once.
    fn remember_bad_block(&self, id: &str) {
        if self
            .bad
            .lock()
            .expect("bad blocks lock")
            .insert(id.to_owned())
        {
            self.metrics.bad_blocks.inc();
        }
    }

    /// Before `set` is published (object-storage mode): which known blocks reads show when
    /// merges overlap, and which batches they leave out because two shown blocks hold them
    /// (`dedupe.rs`). In local mode one writer publishes a merge in place of its inputs and
    /// never stores a batch twice.
    fn dedupe(&self, set: &mut BlockSet) {
        if self.bucket.is_some() {
            self.duplicates
                .lock()
                .expect("duplicates lock")
                .mark(set, &self.metrics);
        }
    }

    /// The (tenant, leaf) of every cut block that a block of `blocks` shown by `lineage.rs`
    /// holds: what a listing's cut blocks need not be opened for.
    fn covered_leaves<'b>(
        &self,
        blocks: impl Iterator<Item = &'b Arc<BlockFile>>,
    ) -> std::collections::HashSet<(Tenant, String)> {
        let mut by_tenant: std::collections::BTreeMap<Tenant, Vec<Arc<BlockFile>>> =
            std::collections::BTreeMap::new();
        for block in blocks {
            by_tenant
                .entry(block.name.tenant.clone())
                .or_default()
                .push(Arc::clone(block));
        }
        let mut duplicates = self.duplicates.lock().expect("duplicates lock");
        let mut covered = std::collections::HashSet::new();
        for (tenant, mut list) in by_tenant {
            list.sort_by(|a, b| a.name.cmp(&b.name));
            list.dedup_by(|a, b| a.name == b.name);
            let shown = duplicates.resolve(&list, &self.metrics);
            for (block, shown) in list.iter().zip(shown) {
                if shown {
                    covered.extend(block.leaves.iter().map(|l| (tenant.clone(), l.clone())));
                }
            }
        }
        covered
    }

    /// Sets the gauges of the published blocks and the disk they and the head take.
    fn update_block_gauges(&self, blocks: &BlockSet) {
        let metrics = &self.metrics;
        metrics.blocks.set(blocks.all().count() as i64);
        metrics
            .block_bytes
            .set(i64::try_from(blocks.bytes()).unwrap_or(i64::MAX));
        let disk = blocks.bytes() + self.wal.size_on_disk();
        metrics
            .disk_bytes
            .set(i64::try_from(disk).unwrap_or(i64::MAX));
    }

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
    /// The recording rules, in the bucket (object-storage mode); `None`: in `wal`.
    rules: Option<Arc<BucketRules>>,
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
        let files = Files::open(&config.object_store, dir.path(), &metrics)?;
        let bucket = match (files.bucket(), &config.object_store) {
            (Some(bucket), super::ObjectStoreConfig::S3(s3)) => {
                // A writer is one run: its segments and HTTP markers can never meet an earlier
                // run's, whose segments are adopted like any stopped aggregator's.
                let writer = format!("{:016x}", rand::random::<u64>());
                info!(writer, bucket = %bucket.name(), "object-storage mode: acknowledgements wait for the bucket");
                Some(BucketMode {
                    bucket: Arc::clone(bucket),
                    sync: Mutex::new(sync::Sync::new(
                        Arc::clone(bucket),
                        writer.clone(),
                        s3.orphan_after,
                        s3.compactor,
                    )),
                    writer,
                    upload_interval: s3.upload_interval,
                    upload_timeout: s3.upload_timeout,
                    poll_interval: s3.poll_interval,
                    compactor: s3.compactor.may(),
                    compacting: std::sync::atomic::AtomicBool::new(false),
                    grace: s3.compaction_grace,
                    owned: Mutex::new(Owned::default()),
                    doubtful: Mutex::new(Doubtful::default()),
                })
            }
            _ => None,
        };
        let wal = Wal::open(&dir.path().join("head"))?;
        migrate::run(dir.path(), &files, &wal)?;
        if bucket.is_some() {
            // The batch markers an earlier run left name batches its segments and blocks hold,
            // which this run reads from the bucket like any stopped writer's. Kept, they would
            // pass those records (and other writers' copies of them) for copies of this run's
            // own head, which holds none of them, and drop them uncounted.
            let cleared = wal.clear_batches()?;
            if cleared > 0 {
                info!(
                    batches = cleared,
                    "an earlier run's batch markers cleared; the bucket holds those batches"
                );
            }
        }
        let (mut blocks, known) = load(&files, &wal, &metrics, bucket.as_ref())?;
        let duplicates = Mutex::new(dedupe::Duplicates::default());
        if bucket.is_some() {
            // Which of the bucket's blocks show, as every aggregator resolves it.
            duplicates
                .lock()
                .expect("duplicates lock")
                .mark(&mut blocks, &metrics);
        }
        known.mark(&mut blocks);
        metrics.app_deletions.set(known.len() as i64);
        let pause = std::env::var("SMOLDER_STORE_TEST_PAUSE_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .map(Duration::from_millis);
        let shared = Arc::new(Shared {
            state: RwLock::new(State {
                head: Head::default(),
                remote: Remote::new(config.max_spans_per_bucket),
                blocks: Arc::new(blocks),
                deletions: known,
                generation: 0,
            }),
            files,
            wal,
            cache: ChunkCache::new(config.cache_bytes, metrics.clone()),
            config,
            metrics,
            pause,
            bucket,
            bad: Mutex::new(BTreeSet::new()),
            duplicates,
        });
        let opened = writer::Writer::open(Arc::clone(&shared))?;
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
        let mut rules = None;
        if let Some(mode) = &shared.bucket {
            // Other writers' segments (an earlier run's too) are read before the first write,
            // so that a batch one of them stored is known here from the start.
            sync_once(&shared, &commands)?;
            rules = Some(Arc::new(BucketRules::open(
                Arc::clone(&mode.bucket),
                &shared.wal,
                &shared.metrics,
            )?));
        }
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
                rules,
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
        // Object-storage mode: merging, downsampling and deleting blocks by retention run on
        // compactors only (every aggregator forgets old batch markers and reports its data
        // directory's space).
        let compactor = self
            .inner
            .shared
            .bucket
            .as_ref()
            .is_none_or(|mode| mode.compactor);
        if self.inner.shared.bucket.is_none() {
            self.inner.shared.metrics.compacting.set(1);
        }
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
        let compaction = compactor.then(|| {
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
        });
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
                        let compacting = compactor && store.inner.shared.compacting();
                        let pass = store.enforce_retention(SystemTime::now(), compacting);
                        if let Err(err) = pass.await {
                            warn!(error = %err, "retention pass failed; retrying at the next interval");
                        }
                        store.inner.dir.report_space(&store.inner.shared.metrics);
                    }
                })
                .instrument(info_span!("store_retention")),
            )
        };
        let sync = self.inner.shared.bucket.as_ref().map(|mode| {
            let store = self.clone();
            let beat = health.register("store_sync", mode.poll_interval.max(MAINTENANCE_PERIOD));
            tokio::spawn(
                every(mode.poll_interval, beat, move || {
                    let store = store.clone();
                    async move {
                        let shared = Arc::clone(&store.inner.shared);
                        let commands = store.inner.commands.clone();
                        let polled =
                            tokio::task::spawn_blocking(move || sync_once(&shared, &commands))
                                .await;
                        if let Ok(Err(err)) = polled {
                            store.inner.shared.metrics.sync_failures.inc();
                            warn!(error = %err, "polling the bucket failed; retrying at the next interval");
                        }
                    }
                })
                .instrument(info_span!("store_sync")),
            )
        });
        let shared = (self.inner.rules.as_ref())
            .zip(self.inner.shared.bucket.as_ref())
            .map(|(rules, mode)| {
                rules::start(rules, mode.poll_interval, &self.inner.shared.metrics)
            });
        self.inner
            .maintenance
            .lock()
            .expect("maintenance lock: taken only to add or take the handles")
            .extend(
                [Some(cut), compaction, Some(retention), sync, shared]
                    .into_iter()
                    .flatten(),
            );
    }

    /// Whether the store's truth is a bucket that other aggregators may share
    /// (object-storage mode).
    pub(crate) fn in_bucket(&self) -> bool {
        self.inner.shared.bucket.is_some()
    }

    /// The development identity every aggregator of the bucket adopts, offering `candidate`
    /// when there is none yet (`candidates.rs`); in local mode, with no other aggregator,
    /// `candidate` itself. Blocks for up to a few seconds when the bucket has none or a recent
    /// one: call it on the blocking pool, at start.
    ///
    /// # Errors
    ///
    /// When the bucket cannot be listed, written or read.
    pub(crate) fn adopt_identity(&self, candidate: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        match &self.inner.shared.bucket {
            Some(mode) => candidates::adopt_identity(mode, candidate),
            None => Ok(candidate),
        }
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

    /// Deletes `app` of `tenant` as of `now`: every sample of it in a bucket before the
    /// deletion's horizon (`now` rounded up to 10 s), whenever it arrives (`deletions.rs`);
    /// answers how many series lost data here, once the deletion is durable (none: nothing
    /// is stored). In object-storage mode the deletion's object is written on the blocking
    /// pool within `upload-timeout` ([`StoreError::Unavailable`] past it), and the writer
    /// learns it only then: no write waits behind a slow bucket.
    pub(crate) fn delete_app_at(&self, tenant: &Tenant, app: &str, now: SystemTime) -> Ack<u64> {
        let (tenant, app) = (tenant.clone(), app.to_owned());
        if self.inner.shared.bucket.is_none() {
            return self.ask(move |reply| Command::DeleteApp {
                tenant,
                app,
                now,
                reply,
            });
        }
        let shared = Arc::clone(&self.inner.shared);
        let commands = self.inner.commands.clone();
        Box::pin(async move {
            let stored = {
                let (tenant, app) = (tenant.clone(), app.clone());
                tokio::task::spawn_blocking(move || {
                    let mode = shared.bucket.as_ref().expect("object-storage mode");
                    deletions::store(&shared, mode, &tenant, &app, now)
                })
                .await
                .map_err(|_| StoreError::Closed)??
            };
            let Some((horizon, series)) = stored else {
                return Ok(0);
            };
            ask(&commands, move |reply| Command::LearnDeletion {
                tenant,
                app,
                horizon,
                series,
                reply,
            })
            .await?;
            Ok(series)
        })
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

    /// Deletes the batch markers older than the retention and, with `delete_blocks`, the blocks
    /// past it (and, past `max-disk-bytes`, the oldest), as of `now`; then forgets the app
    /// deletions that remove nothing any more, and with `delete_blocks` in object-storage mode
    /// deletes their objects (`deletions::prune`). The writer takes the blocks out of the
    /// published set and forgets; their files and the bucket's deletions are deleted here, on
    /// the blocking pool, so that no write waits behind the bucket.
    ///
    /// # Errors
    ///
    /// As [`Store::write`], and [`StoreError::Object`] when a block cannot be deleted (the
    /// app deletions are then kept until a later pass deletes it).
    pub(crate) async fn enforce_retention(
        &self,
        now: SystemTime,
        delete_blocks: bool,
    ) -> Result<RetentionReport, StoreError> {
        let started = Instant::now();
        let (mut report, removed) = self
            .ask(move |reply| Command::Retention {
                now,
                blocks: delete_blocks,
                reply,
            })
            .await?;
        let shared = Arc::clone(&self.inner.shared);
        report.blocks = tokio::task::spawn_blocking(move || delete_retained(&shared, &removed))
            .await
            .map_err(|_| StoreError::Closed)??;
        let shared = &self.inner.shared;
        let cutoff = plan::retention_cutoff(unix(now), shared.config.retention.as_secs());
        self.ask(move |reply| Command::ForgetDeletions { cutoff, reply })
            .await?;
        if delete_blocks && shared.bucket.is_some() {
            let shared = Arc::clone(shared);
            let pruned = tokio::task::spawn_blocking(move || {
                let mode = shared.bucket.as_ref().expect("object-storage mode");
                let blocks = Arc::clone(&shared.state().blocks);
                deletions::prune(&mode.bucket, &blocks, cutoff)
            })
            .await
            .map_err(|_| StoreError::Closed)?;
            if let Err(err) = pruned {
                warn!(error = %err, "listing the bucket's app deletions to forget old ones failed; trying again at the next pass");
            }
        }
        shared
            .metrics
            .retention_duration
            .observe(started.elapsed().as_secs_f64());
        Ok(report)
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
            // Gone once this returns, with its clone of the store: the data directory's lock
            // is free when the store's last owner drops it, not when the runtime gets round to
            // dropping an aborted task.
            let _ = task.await;
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
        ask(&self.inner.commands, command)
    }
}

/// Sends a command to the writer through `commands` and waits for its answer.
fn ask<T: Send + 'static>(
    commands: &mpsc::Sender<Command>,
    command: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Command + Send + 'static,
) -> Ack<T> {
    let commands = commands.clone();
    Box::pin(async move {
        let (reply, answer) = oneshot::channel();
        commands
            .send(command(reply))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    })
}

/// Deletes the files (in a bucket, the objects) of the blocks a retention pass took out of the
/// published set; returns how many.
///
/// # Errors
///
/// When one cannot be deleted: the rest are left too, and the blocks come back at the next
/// start (local mode) or poll (a bucket), for a later pass.
fn delete_retained(shared: &Shared, removed: &[Arc<BlockFile>]) -> Result<u64, StoreError> {
    for block in removed {
        shared.files.delete(&block.name)?;
        shared.cache.forget(&block.name.id);
        shared.metrics.blocks_deleted_retention.inc();
        info!(block = %block.name, "retention deleted a block");
    }
    Ok(removed.len() as u64)
}

/// One poll of the bucket (object-storage mode), applied through the writer; then the own and
/// adopted segments that blocks now hold are deleted. One poll at a time.
///
/// # Errors
///
/// When the bucket cannot be listed or the writer is gone.
fn sync_once(shared: &Arc<Shared>, commands: &mpsc::Sender<Command>) -> Result<(), StoreError> {
    let Some(mode) = &shared.bucket else {
        return Ok(());
    };
    let started = Instant::now();
    let mut sync = mode.sync.lock().expect("sync lock");
    let update = sync.poll(shared)?;
    mode.compacting
        .store(sync.compacting(), std::sync::atomic::Ordering::Relaxed);
    let adopted = update.adopt.clone();
    let listed = update.listed_blocks.clone();
    let (reply, answer) = oneshot::channel();
    commands
        .blocking_send(Command::Sync { update, reply })
        .map_err(|_| StoreError::Closed)?;
    let applied = answer.blocking_recv().map_err(|_| StoreError::Closed)??;
    for writer in &adopted {
        sync.forget_writer(writer);
    }
    sync.note_hidden(shared, &listed);
    drop(sync);
    if applied.adopted > 0 {
        info!(segments = applied.adopted, writers = ?adopted, "adopted segments; they are cut here");
    }
    uploads::settle(shared, unix(SystemTime::now()));
    shared
        .metrics
        .sync_duration
        .observe(started.elapsed().as_secs_f64());
    Ok(())
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

/// Loads every block, sets aside those that cannot be read (named in the log and counted),
/// deletes those a present block replaces, and the app deletions: the database's (local mode),
/// those the blocks list, and an older version's, migrated (into the bucket in object-storage
/// mode, whose own deletions the first poll reads).
fn load(
    files: &Files,
    wal: &Wal,
    metrics: &StoreMetrics,
    bucket: Option<&BucketMode>,
) -> Result<(BlockSet, deletions::Deletions), StoreError> {
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
    // In a bucket, a merge's inputs are deleted by a compactor once the merge has shown for
    // `compaction-grace` (another merge may win over it): all are loaded, `dedupe.rs` says
    // which show.
    let replaced: BTreeSet<String> = if files.bucket().is_some() {
        BTreeSet::new()
    } else {
        good.iter()
            .flat_map(|b| b.sources.iter().cloned())
            .collect()
    };
    let mut set = BlockSet::default();
    for block in good {
        if replaced.contains(&block.name.id) {
            info!(block = %block.name, "deleting a block that a merge replaced");
            files.delete(&block.name)?;
        } else {
            set.insert(block);
        }
    }
    let mut known = deletions::Deletions::default();
    let ends: HashMap<String, u64> = set
        .candidates()
        .map(|b| (b.name.id.clone(), b.name.end()))
        .collect();
    let migrated = wal.migrate_tombstones(
        |id| ends.get(id).copied(),
        |migrated| {
            let millis = sync::unix_millis(SystemTime::now());
            match bucket {
                Some(mode) => {
                    for (tenant, app, horizon) in migrated {
                        deletions::put(
                            &mode.bucket,
                            tenant,
                            app,
                            *horizon,
                            millis,
                            &mode.writer,
                            None,
                        )
                        .map_err(files::bucket_error)?;
                    }
                    Ok(())
                }
                None => {
                    let mut batch = sled::Batch::default();
                    for (tenant, app, horizon) in migrated {
                        Wal::put_deletion(&mut batch, tenant, app, *horizon, millis);
                    }
                    wal.apply(batch)
                }
            }
        },
    )?;
    if !migrated.is_empty() {
        info!(
            deletions = migrated.len(),
            "app deletions of an older version turned into horizons (the latest end of the blocks each hid)"
        );
    }
    let mut stored = wal.deletions()?;
    if let Some(mode) = bucket {
        // A data directory of local mode moved to a bucket: its deletions go there, where every
        // aggregator reads them.
        let millis = sync::unix_millis(SystemTime::now());
        let mut batch = sled::Batch::default();
        for (tenant, app, horizon) in &stored {
            deletions::put(
                &mode.bucket,
                tenant,
                app,
                *horizon,
                millis,
                &mode.writer,
                None,
            )
            .map_err(files::bucket_error)?;
            Wal::remove_deletion(&mut batch, tenant, app);
        }
        wal.apply(batch)?;
        wal.flush()?;
        stored.extend(migrated);
    }
    for (tenant, app, horizon) in stored {
        known.learn(&tenant, &app, horizon);
    }
    for block in set.candidates() {
        known.learn_block(block);
    }
    info!(
        blocks = ends.len(),
        bad,
        seconds = started.elapsed().as_secs_f64(),
        "blocks loaded"
    );
    Ok((set, known))
}

impl Store for BlockStore {
    fn write(
        &self,
        tenant: &Tenant,
        profiles: Vec<Profile>,
        spans: ProfileSpans,
        marker: Option<BatchMarker>,
    ) -> Ack<Written> {
        let tenant = tenant.clone();
        let ids = Arc::clone(&self.inner.ids);
        let commands = self.inner.commands.clone();
        // Without room for any span tree, none is logged either (nor is a record written in
        // the head log's version 2, which an older aggregator cannot read).
        let spans = if self.inner.shared.config.max_spans_per_bucket == 0 {
            let dropped = spans.iter().map(|(_, trees)| trees.len() as u64).sum();
            if dropped > 0 {
                let metrics = &self.inner.shared.metrics;
                metrics
                    .dropped_spans
                    .add("store", "span_limit", true, dropped);
            }
            Vec::new()
        } else {
            spans
        };
        Box::pin(async move {
            let queued = Instant::now();
            // Encoding and compressing the records is most of a write's work: done here, in
            // parallel across requests, the writer thread only appends and syncs.
            let (write, marker) = tokio::task::spawn_blocking(move || {
                let write = Prepared::new(&ids, tenant, profiles, spans, marker.as_ref());
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
        self.delete_app_at(tenant, app, SystemTime::now())
    }

    fn put_rule(&self, tenant: &Tenant, name: &str, rule: Vec<u8>) -> Ack<()> {
        let (tenant, name) = (tenant.clone(), name.to_owned());
        if let Some(rules) = &self.inner.rules {
            let rules = Arc::clone(rules);
            return rules::blocking(move || rules.put(&tenant, &name, rule));
        }
        self.ask(move |reply| Command::PutRule {
            tenant,
            name,
            rule,
            reply,
        })
    }

    fn delete_rule(&self, tenant: &Tenant, name: &str) -> Ack<bool> {
        let (tenant, name) = (tenant.clone(), name.to_owned());
        if let Some(rules) = &self.inner.rules {
            let rules = Arc::clone(rules);
            return rules::blocking(move || rules.delete(&tenant, &name));
        }
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
        read::merge(&self.inner.shared, tenant, selector, range, resolution)
    }

    fn merge_spans(
        &self,
        tenant: &Tenant,
        selector: &Selector,
        range: TimeRange,
        spans: &[SpanId],
    ) -> Result<Merged, StoreError> {
        read::merge_spans(&self.inner.shared, tenant, selector, range, spans)
    }

    fn timelines(
        &self,
        tenant: &Tenant,
        selector: &Selector,
        range: TimeRange,
        step: u64,
        group_by: Option<&str>,
    ) -> Result<Timelines, StoreError> {
        read::timelines(&self.inner.shared, tenant, selector, range, step, group_by)
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
        match &self.inner.rules {
            Some(rules) => Ok(rules.rules(tenant)),
            None => self.inner.shared.wal.rules(tenant),
        }
    }

    fn rule_tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        match &self.inner.rules {
            Some(rules) => Ok(rules.tenants()),
            None => self.inner.shared.wal.rule_tenants(),
        }
    }

    fn rule_changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner.rules.as_ref().map(|rules| rules.watch())
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
