//! A directory of cached files bounded in bytes, the least recently used deleted first: the
//! unwinder's table cache (`unwind/source.rs`, `<data dir>/unwind/`) and the debuginfod
//! client's debug files (`symbolize/debuginfod.rs`, `<data dir>/debuginfod/`) keep one each.
//!
//! A file's last use is its modification time, so that the order survives a restart. Its owner
//! writes the files and says so ([`CacheDir::added`]); this keeps the count and deletes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The files of one cache directory, with their sizes and last uses.
pub(crate) struct CacheDir {
    dir: PathBuf,
    max_bytes: u64,
    /// File name → (size, last use).
    files: HashMap<String, (u64, SystemTime)>,
    used: u64,
}

impl CacheDir {
    /// An empty cache over `dir`, bounded by `max_bytes`, which nothing has been listed in.
    pub(crate) fn empty(dir: &Path, max_bytes: u64) -> CacheDir {
        CacheDir {
            dir: dir.to_path_buf(),
            max_bytes,
            files: HashMap::new(),
            used: 0,
        }
    }

    /// Lists `dir`, bounded by `max_bytes`, and deletes past the bound. A file whose name starts
    /// with `.` (a temporary file a crash left behind) or that `keep` refuses (another format)
    /// is deleted; an entry that cannot be read is passed over.
    ///
    /// # Errors
    ///
    /// When `dir` cannot be listed.
    pub(crate) fn open(
        dir: &Path,
        max_bytes: u64,
        keep: impl Fn(&str) -> bool,
    ) -> std::io::Result<CacheDir> {
        let mut cache = CacheDir::empty(dir, max_bytes);
        for entry in std::fs::read_dir(dir)?.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if name.starts_with('.') || !keep(&name) {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            let used_at = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            cache.used += meta.len();
            cache.files.insert(name, (meta.len(), used_at));
        }
        cache.trim();
        Ok(cache)
    }

    /// The directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes the cache holds.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.used
    }

    /// Whether `name` is cached.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.files.contains_key(name)
    }

    /// Whether `name` is cached; marks it used, on disk too.
    pub(crate) fn touch(&mut self, name: &str) -> bool {
        let Some(entry) = self.files.get_mut(name) else {
            return false;
        };
        entry.1 = SystemTime::now();
        if let Ok(file) = std::fs::File::options()
            .write(true)
            .open(self.dir.join(name))
        {
            let _ = file.set_modified(entry.1);
        }
        true
    }

    /// Counts `name`, just written with `bytes` (in place of what it held), as used now, and
    /// deletes past the bound.
    pub(crate) fn added(&mut self, name: &str, bytes: u64) {
        self.forget(name);
        self.files
            .insert(name.to_owned(), (bytes, SystemTime::now()));
        self.used += bytes;
        self.trim();
    }

    /// Stops counting `name` (its owner deleted it, or found it unusable).
    pub(crate) fn forget(&mut self, name: &str) {
        if let Some((size, _)) = self.files.remove(name) {
            self.used -= size;
        }
    }

    /// Deletes the least recently used files until the cache is within its bound.
    fn trim(&mut self) {
        while self.used > self.max_bytes {
            let Some(oldest) = self
                .files
                .iter()
                .min_by_key(|(_, (_, used_at))| *used_at)
                .map(|(name, _)| name.clone())
            else {
                return;
            };
            let _ = std::fs::remove_file(self.dir.join(&oldest));
            self.forget(&oldest);
        }
    }
}
