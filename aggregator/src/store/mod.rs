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
//!   1000 s and 10 000 s, written with the bucket they contain, so that a query of any span
//!   reads a bounded number of trees.
//!
//! Reads run on the caller's thread against sled's consistent snapshot of each key; callers on
//! an async runtime should use `spawn_blocking` for large merges.

mod keys;
mod read;
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
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Profiles older than this are deleted. Default `30d`.
    #[serde(with = "crate::config::duration")]
    pub retention: Duration,
    /// How often retention runs. Default `1m`.
    #[serde(with = "crate::config::duration")]
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
    db: sled::Db,
    data: sled::Tree,
    commands: mpsc::Sender<writer::Command>,
    writer: std::sync::Mutex<Option<JoinHandle<()>>>,
    config: StoreConfig,
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
        let state = writer::Writer::open(db.clone(), data.clone(), config.clone(), metrics)?;
        let handle = std::thread::Builder::new()
            .name("smolder-store-writer".to_owned())
            .spawn(move || state.run(queue))
            .map_err(io)?;
        Ok(Store {
            inner: Arc::new(Inner {
                db,
                data,
                commands,
                writer: std::sync::Mutex::new(Some(handle)),
                config,
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

    /// The configuration the store was opened with.
    pub(crate) fn config(&self) -> &StoreConfig {
        &self.inner.config
    }

    /// Bytes on disk, as sled reports them.
    ///
    /// # Errors
    ///
    /// When sled cannot stat its files.
    pub(crate) fn disk_bytes(&self) -> Result<u64, StoreError> {
        Ok(self.inner.db.size_on_disk()?)
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
