//! The data directory: created and locked at open, and its filesystem's space reported.
//!
//! Owns the directory's `LOCK` file, held for as long as the store is open, so that two
//! aggregators never write one directory; and the `smolder_aggregator_store_filesystem_*`
//! gauges, read with statvfs(3) after every retention pass.

use std::fs::File;
use std::path::{Path, PathBuf};

use tracing::warn;

use super::{StoreError, StoreMetrics};

/// The locked data directory.
pub(crate) struct DataDir {
    path: PathBuf,
    /// Held, never read: the lock on the directory lasts as long as this handle.
    _lock: File,
}

impl DataDir {
    /// Creates `path` if needed and locks it against other aggregators.
    ///
    /// # Errors
    ///
    /// [`StoreError::Locked`] when another process holds the lock; [`StoreError::Io`] when the
    /// directory or its lock file cannot be created.
    pub(crate) fn lock(path: &Path) -> Result<DataDir, StoreError> {
        let io = |source| StoreError::Io {
            path: path.to_owned(),
            source,
        };
        std::fs::create_dir_all(path).map_err(io)?;
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.join("LOCK"))
            .map_err(io)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Locked {
                    path: path.to_owned(),
                });
            }
            Err(std::fs::TryLockError::Error(err)) => return Err(io(err)),
        }
        Ok(DataDir {
            path: path.to_owned(),
            _lock: lock,
        })
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Sets the filesystem gauges of `metrics` from the directory's filesystem: bytes available
    /// to an unprivileged writer, and its size. A failure is logged and leaves them as they
    /// were.
    pub(crate) fn report_space(&self, metrics: &StoreMetrics) {
        match fs2::statvfs(&self.path) {
            Ok(stats) => {
                metrics
                    .filesystem_free_bytes
                    .set(saturate(stats.available_space()));
                metrics
                    .filesystem_size_bytes
                    .set(saturate(stats.total_space()));
            }
            Err(err) => warn!(error = %err, "reading the data directory's free space failed"),
        }
    }
}

fn saturate(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}
