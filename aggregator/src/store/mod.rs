//! The store: where profiles live, on sled, behind this narrow interface.
//!
//! Input: [`Profile`]s from ingest, through [`Store::write`], which returns only once they are
//! durable. Output: series lists, merged trees and timelines for the query path.
//!
//! What it owns:
//!
//! - the data directory, locked against a second aggregator (`LOCK`), and a sled database in
//!   `sled/` holding every record in one keyspace (layout in `keys.rs`);
//! - one writer thread that applies writes, rollups, deletions and retention in order, each
//!   request as one atomic sled batch, and makes a whole group of them durable with one fsync
//!   before acknowledging any (group commit);
//! - for every series, a tree and a total per 10 s bucket, plus pre-merged rollups at 100 s,
//!   1000 s and 10 000 s, built once their bucket has closed ([`Store::rollup`]), so that a
//!   query of any span reads a bounded number of trees.
//!
//! Reads run on the caller's thread against sled's consistent snapshot of each key; callers on
//! an async runtime should use `spawn_blocking` for large merges.

mod keys;
mod read;
mod rules;
mod series;
mod writer;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use smolder_common::{Profile, ProfileMeta, Series};
use tokio::sync::{mpsc, oneshot};

use crate::metrics::StoreMetrics;

pub(crate) use read::{Merged, Timeline};

/// Where profiles are kept and for how long.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct StoreConfig {
    /// Profiles older than this are deleted. Default `30d`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub retention: Duration,
    /// How often retention runs. Default `1m`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub retention_interval: Duration,
    /// When the store grows past this many bytes on disk, the oldest data is deleted as well,
    /// one 10 000 s bucket per retention pass. 0, the default, sets no limit.
    pub max_disk_bytes: u64,
    /// Memory for sled's page cache, in bytes. Default 256 MiB.
    pub cache_bytes: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            retention: Duration::from_secs(30 * 86_400),
            retention_interval: Duration::from_secs(60),
            max_disk_bytes: 0,
            cache_bytes: 256 << 20,
        }
    }
}

/// Why the store could not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum StoreError {
    /// Another process holds the data directory's lock.
    #[error(
        "data directory {path} is in use by another aggregator (lock file {path}/LOCK is held)"
    )]
    Locked {
        /// The data directory.
        path: PathBuf,
    },
    /// The data directory or its lock file could not be created or opened.
    #[error("cannot use data directory {path}")]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// sled failed (I/O error, or its own files are damaged).
    #[error("storage engine failed")]
    Sled(#[from] sled::Error),
    /// Writes were applied but could not be made durable; none of them is acknowledged.
    #[error("flushing to disk failed: {reason}")]
    Flush {
        /// What sled said.
        reason: String,
    },
    /// A record's checksum or layout does not match; the key says which.
    #[error("corrupt record at key {key}: {reason}")]
    Corrupt {
        /// The key, printable.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The store has been closed; nothing more is accepted.
    #[error("the store is closed")]
    Closed,
}

/// Identifies one agent batch, so that the store keeps each at most once (QUIC ingest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BatchMarker {
    /// The sending agent's id.
    pub(crate) agent_id: String,
    /// The batch's sequence number.
    pub(crate) sequence: u64,
    /// Unix seconds of the end of the batch's window; retention deletes the marker with the
    /// window's data.
    pub(crate) window_end: u64,
}

/// What [`Store::write_batch`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Written {
    /// The profiles are stored, with the batch's marker.
    Stored,
    /// The marker was already there: the batch had been stored, nothing was written.
    Duplicate,
}

/// A series as stored: its identity, what its values mean, and when it has data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SeriesInfo {
    id: keys::SeriesId,
    /// App name and labels.
    pub(crate) series: Series,
    /// Units, sample rate, spy name and aggregation of its latest write.
    pub(crate) meta: ProfileMeta,
    /// Unix seconds of the oldest bucket it has data in.
    pub(crate) first_seen: u64,
    /// Unix seconds of the newest bucket it has data in.
    pub(crate) last_seen: u64,
}

/// A range of time, `[from, until)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TimeRange {
    /// The start, included.
    pub(crate) from: SystemTime,
    /// The end, excluded.
    pub(crate) until: SystemTime,
}

impl TimeRange {
    /// Unix seconds of both ends, the start rounded down and the end rounded up to whole
    /// 10 s buckets, so that every bucket the range touches is read.
    pub(crate) fn buckets(&self) -> (u64, u64) {
        let from = unix(self.from) / keys::BUCKET * keys::BUCKET;
        let until = unix(self.until).div_ceil(keys::BUCKET) * keys::BUCKET;
        (from, until.max(from))
    }
}

/// What a retention pass removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RetentionReport {
    /// Buckets (trees with their totals) deleted.
    pub(crate) buckets: u64,
    /// Series deleted because none of their data remained.
    pub(crate) series: u64,
}

/// An application: the series that share an app name, and the metadata of the latest write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AppInfo {
    /// The app name, such as `checkout.cpu`.
    pub(crate) name: String,
    /// What its values mean.
    pub(crate) meta: ProfileMeta,
}

/// The profile store. Cheap to clone; every clone talks to the same database and writer.
#[derive(Clone)]
pub(crate) struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    data: sled::Tree,
    commands: mpsc::Sender<writer::Command>,
    writer: std::sync::Mutex<Option<JoinHandle<()>>>,
    /// Held, never read: the lock on the data directory lasts as long as this handle.
    _lock: File,
}

/// How many write requests may wait for the writer before callers wait to queue; enough for
/// every connection of a busy aggregator to have one in flight.
const QUEUE: usize = 1024;

impl Store {
    /// Opens (creating if needed) the store in `dir`, locking it against other aggregators.
    ///
    /// # Errors
    ///
    /// [`StoreError::Locked`] when another aggregator holds the directory; [`StoreError::Io`]
    /// when it cannot be created; [`StoreError::Sled`] when the database cannot be opened.
    pub(crate) fn open(
        dir: &Path,
        config: StoreConfig,
        metrics: StoreMetrics,
    ) -> Result<Store, StoreError> {
        let io = |source| StoreError::Io {
            path: dir.to_owned(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("LOCK"))
            .map_err(io)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Locked {
                    path: dir.to_owned(),
                });
            }
            Err(std::fs::TryLockError::Error(err)) => return Err(io(err)),
        }
        let db = sled::Config::new()
            .path(dir.join("sled"))
            .cache_capacity(config.cache_bytes)
            .open()?;
        let data = db.open_tree("data")?;
        let (commands, queue) = mpsc::channel(QUEUE);
        let state = writer::Writer::open(db, data.clone(), config, metrics)?;
        let handle = std::thread::Builder::new()
            .name("smolder-store-writer".to_owned())
            .spawn(move || state.run(queue))
            .map_err(io)?;
        Ok(Store {
            inner: Arc::new(Inner {
                data,
                commands,
                writer: std::sync::Mutex::new(Some(handle)),
                _lock: lock,
            }),
        })
    }

    /// Adds `profiles` to the store, all or nothing, and returns once they are durable: after
    /// an acknowledged write, a `kill -9` loses none of it.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the request is queued does not withdraw it: the write still
    /// happens, unacknowledged.
    ///
    /// # Errors
    ///
    /// [`StoreError::Closed`] after [`Store::close`]; [`StoreError::Sled`] when the write or
    /// its flush failed, in which case nothing of it was acknowledged.
    pub(crate) async fn write(&self, profiles: Vec<Profile>) -> Result<(), StoreError> {
        self.ask(|reply| writer::Command::Write {
            profiles,
            marker: None,
            reply,
            queued: std::time::Instant::now(),
        })
        .await
        .map(|_| ())
    }

    /// [`Store::write`] for an agent's batch: unless `marker` is already stored, writes the
    /// profiles and the marker in one atomic batch, so that a batch sent again (after a lost
    /// ack, a `kill -9`, a restart) is never counted twice. Returns once durable either way;
    /// a duplicate's answer waits for the fsync that covers its first copy.
    ///
    /// # Cancel safety
    ///
    /// As [`Store::write`].
    ///
    /// # Errors
    ///
    /// As [`Store::write`].
    pub(crate) async fn write_batch(
        &self,
        profiles: Vec<Profile>,
        marker: BatchMarker,
    ) -> Result<Written, StoreError> {
        self.ask(|reply| writer::Command::Write {
            profiles,
            marker: Some(marker),
            reply,
            queued: std::time::Instant::now(),
        })
        .await
    }

    /// Deletes every series of app `name` and all their data; returns how many series went.
    ///
    /// # Errors
    ///
    /// As [`Store::write`].
    pub(crate) async fn delete_app(&self, name: &str) -> Result<u64, StoreError> {
        let app = name.to_owned();
        self.ask(|reply| writer::Command::DeleteApp { app, reply })
            .await
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
        self.ask(|reply| writer::Command::Retention { now, reply })
            .await
    }

    /// Builds the rollups whose buckets closed (see `writer.rs`) as of `now`; returns how many
    /// trees it wrote. Reads are correct whether or not this has run; it makes them cheaper and
    /// keeps writes small.
    ///
    /// # Errors
    ///
    /// As [`Store::write`].
    pub(crate) async fn rollup(&self, now: SystemTime) -> Result<u64, StoreError> {
        self.ask(|reply| writer::Command::Rollup { now, reply })
            .await
    }

    /// Finishes queued writes, flushes, and stops the writer. Later writes get
    /// [`StoreError::Closed`]; reads keep working.
    ///
    /// # Errors
    ///
    /// When the final flush fails.
    pub(crate) async fn close(&self) -> Result<(), StoreError> {
        let result = match self.ask(|reply| writer::Command::Close { reply }).await {
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

    async fn ask<T>(
        &self,
        command: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> writer::Command,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.inner
            .commands
            .send(command(reply))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

/// Unix seconds of `time`; times before 1970 count as 0.
pub(crate) fn unix(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use smolder_common::{Aggregation, Profile, ProfileMeta, Selector, Series, Tree};

    use super::*;
    use crate::metrics::Metrics;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn profile(series: &str, from: u64, stacks: &[(&str, u64)]) -> Profile {
        let mut tree = Tree::new();
        for (stack, value) in stacks {
            tree.insert_names(stack.split(';'), *value);
        }
        Profile {
            series: Series::parse(series).unwrap(),
            meta: ProfileMeta::default(),
            from: at(from),
            until: at(from + 10),
            tree,
        }
    }

    fn open(dir: &Path) -> Store {
        Store::open(dir, StoreConfig::default(), Metrics::new().store.clone()).unwrap()
    }

    fn range(from: u64, until: u64) -> TimeRange {
        TimeRange {
            from: at(from),
            until: at(until),
        }
    }

    fn folded(tree: &Tree) -> String {
        smolder_common::to_folded(tree)
    }

    #[tokio::test]
    async fn writes_merge_per_series_and_read_back_over_any_range() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let base = 1_700_000_000;
        store
            .write(vec![profile("app.cpu{env=prod}", base, &[("main;a", 2)])])
            .await
            .unwrap();
        store
            .write(vec![profile(
                "app.cpu{env=prod}",
                base + 10,
                &[("main;a", 3)],
            )])
            .await
            .unwrap();
        store
            .write(vec![profile(
                "app.cpu{env=dev}",
                base + 20_000,
                &[("main;b", 4)],
            )])
            .await
            .unwrap();

        let all = store
            .select(
                &Selector::parse("app.cpu").unwrap(),
                range(base, base + 86_400),
            )
            .unwrap();
        assert_eq!(all.len(), 2);
        let merged = store
            .merge(&all, range(base - 5_000, base + 86_400))
            .unwrap();
        assert_eq!(folded(&merged.tree), "main;a 5\nmain;b 4\n");
        assert_eq!(merged.writes, 3);

        let prod = store
            .select(
                &Selector::parse(r#"app.cpu{env="prod"}"#).unwrap(),
                range(base, base + 20),
            )
            .unwrap();
        assert_eq!(prod.len(), 1);
        let first = store.merge(&prod, range(base, base + 10)).unwrap();
        assert_eq!(folded(&first.tree), "main;a 2\n");

        let timeline = store.timeline(&all, range(base, base + 30), 10).unwrap();
        assert_eq!(timeline.samples, [2, 3, 0]);
        assert_eq!(timeline.start, base);
    }

    #[tokio::test]
    async fn a_batch_is_stored_once_across_reopens_until_retention_forgets_it() {
        let dir = tempfile::tempdir().unwrap();
        let base = 1_700_000_000 / 10_000 * 10_000;
        let marker = |sequence| BatchMarker {
            agent_id: "agent-1".to_owned(),
            sequence,
            window_end: base + 10,
        };
        let batch = || vec![profile("app.cpu", base, &[("main;a", 2)])];
        let store = open(dir.path());
        assert_eq!(
            store.write_batch(batch(), marker(1)).await.unwrap(),
            Written::Stored
        );
        assert_eq!(
            store.write_batch(batch(), marker(1)).await.unwrap(),
            Written::Duplicate
        );
        store.close().await.unwrap();
        drop(store);

        let config = StoreConfig {
            retention: Duration::from_secs(86_400),
            ..StoreConfig::default()
        };
        let store = Store::open(dir.path(), config, Metrics::new().store.clone()).unwrap();
        assert_eq!(
            store.write_batch(batch(), marker(1)).await.unwrap(),
            Written::Duplicate
        );
        assert_eq!(
            store.write_batch(batch(), marker(2)).await.unwrap(),
            Written::Stored
        );
        let all = store
            .select(&Selector::parse("app.cpu").unwrap(), range(base, base + 10))
            .unwrap();
        let merged = store.merge(&all, range(base, base + 10)).unwrap();
        assert_eq!(folded(&merged.tree), "main;a 4\n");

        store
            .enforce_retention(at(base + 2 * 86_400))
            .await
            .unwrap();
        let markers = store
            .inner
            .data
            .scan_prefix([keys::BATCH])
            .chain(store.inner.data.scan_prefix([keys::BATCH_BY_TIME]))
            .count();
        assert_eq!(markers, 0, "retention deletes markers with their data");
    }

    #[tokio::test]
    async fn rollups_agree_with_fine_buckets() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let base = 1_700_000_000 / 10_000 * 10_000;
        let mut profiles = Vec::new();
        for i in 0..200u64 {
            profiles.push(profile(
                "app.cpu",
                base + i * 70,
                &[("main;f", i + 1), ("main;g", 1)],
            ));
        }
        store.write(profiles).await.unwrap();
        let series = store
            .select(
                &Selector::parse("app.cpu").unwrap(),
                range(base, base + 20_000),
            )
            .unwrap();
        // Any range must equal the sum of its 10 s buckets: before the rollups are built (reads
        // descend into dirty rollups) and after (reads use them).
        let check = |store: &Store| {
            for (from, until) in [
                (base, base + 14_000),
                (base + 130, base + 9_870),
                (base + 10, base + 20),
            ] {
                let merged = store.merge(&series, range(from, until)).unwrap();
                let expected: u64 = (0..200u64)
                    .filter(|i| {
                        let bucket = (base + i * 70 + 5) / 10 * 10;
                        bucket >= from / 10 * 10 && bucket < until.div_ceil(10) * 10
                    })
                    .map(|i| i + 2)
                    .sum();
                assert_eq!(merged.tree.total(), expected, "range {from}..{until}");
            }
        };
        check(&store);
        // 200 profiles 70 s apart span 14 000 s: 140 100 s, 14 1000 s and 2 10 000 s rollups.
        assert_eq!(store.rollup(at(base + 100_000)).await.unwrap(), 156);
        assert_eq!(store.inner.data.scan_prefix([keys::DIRTY]).count(), 0);
        check(&store);
        assert_eq!(
            store.rollup(at(base + 100_000)).await.unwrap(),
            0,
            "built once"
        );
    }

    #[tokio::test]
    async fn acknowledged_writes_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = open(dir.path());
            store
                .write(vec![profile("app.cpu", 1_700_000_000, &[("a", 1)])])
                .await
                .unwrap();
            store.close().await.unwrap();
        }
        let store = open(dir.path());
        let series = store
            .select(&Selector::parse("app.cpu").unwrap(), range(0, u64::MAX / 2))
            .unwrap();
        assert_eq!(
            store
                .merge(&series, range(0, 2_000_000_000))
                .unwrap()
                .tree
                .total(),
            1
        );
        store
            .write(vec![profile("app2.cpu", 1_700_000_000, &[("b", 1)])])
            .await
            .unwrap();
        let apps: Vec<_> = store.apps().unwrap().into_iter().map(|a| a.name).collect();
        assert_eq!(apps, ["app.cpu", "app2.cpu"]);
    }

    #[tokio::test]
    async fn a_second_store_on_the_same_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _first = open(dir.path());
        let err = Store::open(
            dir.path(),
            StoreConfig::default(),
            Metrics::new().store.clone(),
        )
        .err()
        .expect("second open fails");
        assert!(matches!(err, StoreError::Locked { .. }), "{err}");
        assert!(
            err.to_string().contains("in use by another aggregator"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn concurrent_writes_sum_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut tasks = Vec::new();
        for i in 0..40u64 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                store
                    .write(vec![profile(
                        "app.cpu",
                        1_700_000_000,
                        &[("main;x", i + 1)],
                    )])
                    .await
            }));
        }
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        let series = store
            .select(
                &Selector::parse("app.cpu").unwrap(),
                range(0, 2_000_000_000),
            )
            .unwrap();
        let merged = store.merge(&series, range(0, 2_000_000_000)).unwrap();
        assert_eq!(merged.tree.total(), (1..=40).sum::<u64>());
        assert_eq!(merged.writes, 40);
    }

    #[tokio::test]
    async fn labels_values_and_deletion() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let base = 1_700_000_000;
        store
            .write(vec![
                profile(
                    "app.cpu{env=prod,process.runtime.name=go}",
                    base,
                    &[("a", 1)],
                ),
                profile("app.cpu{env=dev}", base, &[("a", 1)]),
                profile("other.cpu{zone=z1}", base + 5_000, &[("a", 1)]),
            ])
            .await
            .unwrap();
        let wide = range(base, base + 10_000);
        assert_eq!(
            store.label_names(None, wide).unwrap(),
            ["env", "process.runtime.name", "zone"]
        );
        assert_eq!(
            store.label_names(Some("app.cpu"), wide).unwrap(),
            ["env", "process.runtime.name"]
        );
        assert_eq!(
            store.label_names(None, range(base, base + 100)).unwrap(),
            ["env", "process.runtime.name"]
        );
        assert_eq!(
            store.label_values("env", None, wide).unwrap(),
            ["dev", "prod"]
        );
        assert_eq!(
            store.label_values("__name__", None, wide).unwrap(),
            ["app.cpu", "other.cpu"]
        );
        let prod = Selector::parse(r#"app.cpu{env!="dev"}"#).unwrap();
        assert_eq!(
            store.label_values("env", Some(&prod), wide).unwrap(),
            ["prod"]
        );

        assert_eq!(store.delete_app("app.cpu").await.unwrap(), 2);
        assert_eq!(
            store.label_values("__name__", None, wide).unwrap(),
            ["other.cpu"]
        );
        assert!(
            store
                .select(&Selector::parse("app.cpu").unwrap(), wide)
                .unwrap()
                .is_empty()
        );
        assert_eq!(store.delete_app("app.cpu").await.unwrap(), 0);
    }

    #[tokio::test]
    async fn retention_deletes_old_buckets_and_empty_series() {
        let dir = tempfile::tempdir().unwrap();
        let config = StoreConfig {
            retention: Duration::from_secs(86_400),
            ..StoreConfig::default()
        };
        let store = Store::open(dir.path(), config, Metrics::new().store.clone()).unwrap();
        let now = 1_700_000_000 / 10_000 * 10_000;
        store
            .write(vec![
                profile("old.cpu", now - 3 * 86_400, &[("a", 1)]),
                profile("mixed.cpu", now - 2 * 86_400, &[("a", 1)]),
                profile("mixed.cpu", now - 3_600, &[("b", 1)]),
            ])
            .await
            .unwrap();
        let report = store.enforce_retention(at(now)).await.unwrap();
        assert_eq!(report.series, 1);
        assert_eq!(
            report.buckets, 2,
            "the two old 10 s buckets; no rollup was built yet"
        );
        let everything = range(0, now + 10);
        assert!(
            store
                .select(&Selector::parse("old.cpu").unwrap(), everything)
                .unwrap()
                .is_empty()
        );
        let mixed = store
            .select(&Selector::parse("mixed.cpu").unwrap(), everything)
            .unwrap();
        assert_eq!(
            folded(&store.merge(&mixed, everything).unwrap().tree),
            "b 1\n"
        );
        assert!(mixed[0].first_seen >= now - 86_400);
    }

    #[tokio::test]
    async fn past_the_size_limit_the_oldest_data_goes_first() {
        let dir = tempfile::tempdir().unwrap();
        // A limit any store exceeds: every pass deletes the oldest 10 000 s.
        let config = StoreConfig {
            max_disk_bytes: 1,
            ..StoreConfig::default()
        };
        let store = Store::open(dir.path(), config, Metrics::new().store.clone()).unwrap();
        let base = unix(SystemTime::now()) / 10_000 * 10_000 - 30_000;
        store
            .write(vec![
                profile("app.cpu", base + 10, &[("oldest", 1)]),
                profile("app.cpu", base + 10_010, &[("middle", 1)]),
                profile("app.cpu", base + 20_010, &[("newest", 1)]),
            ])
            .await
            .unwrap();
        let everything = range(base, base + 30_000);
        let series = store
            .select(&Selector::parse("app.cpu").unwrap(), everything)
            .unwrap();
        store.enforce_retention(at(base + 30_000)).await.unwrap();
        let merged = store.merge(&series, everything).unwrap();
        assert_eq!(folded(&merged.tree), "middle 1\nnewest 1\n");
        store.enforce_retention(at(base + 30_000)).await.unwrap();
        let merged = store.merge(&series, everything).unwrap();
        assert_eq!(folded(&merged.tree), "newest 1\n");
    }

    #[tokio::test]
    async fn corrupt_buckets_are_reported_with_their_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        store
            .write(vec![profile("app.cpu", 1_700_000_000, &[("a", 1)])])
            .await
            .unwrap();
        let key = keys::bucket(keys::TREE, 0, 1, 1_700_000_000);
        let mut value = store.inner.data.get(key).unwrap().unwrap().to_vec();
        value[6] ^= 0xff;
        store.inner.data.insert(key, value).unwrap();
        let series = store
            .select(
                &Selector::parse("app.cpu").unwrap(),
                range(0, 2_000_000_000),
            )
            .unwrap();
        let err = store
            .merge(&series, range(1_700_000_000, 1_700_000_010))
            .unwrap_err();
        assert!(
            err.to_string().starts_with(r"corrupt record at key T\x00"),
            "{err}"
        );
        // The series stays writable: the damaged bucket is replaced by the next write.
        store
            .write(vec![profile("app.cpu", 1_700_000_000, &[("b", 2)])])
            .await
            .unwrap();
        let merged = store
            .merge(&series, range(1_700_000_000, 1_700_000_010))
            .unwrap();
        assert_eq!(folded(&merged.tree), "b 2\n");
    }

    #[tokio::test]
    async fn metadata_of_the_latest_write_wins() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut p = profile("app.inuse_space", 1_700_000_000, &[("a", 10)]);
        p.meta = ProfileMeta {
            spy_name: "gospy".into(),
            sample_rate: 0,
            units: "bytes".into(),
            aggregation: Aggregation::Average,
        };
        store.write(vec![p]).await.unwrap();
        let apps = store.apps().unwrap();
        assert_eq!(apps[0].meta.units, "bytes");
        assert_eq!(apps[0].meta.aggregation, Aggregation::Average);
        store.close().await.unwrap();
        assert!(matches!(
            store.write(vec![profile("app.cpu", 1, &[("a", 1)])]).await,
            Err(StoreError::Closed)
        ));
    }
}
