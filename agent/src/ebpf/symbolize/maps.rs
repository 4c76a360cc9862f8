//! The binaries of captured processes, held open so that they can be symbolized after the
//! process exits or the binary is deleted or replaced.
//!
//! At first sight of a process, [`Files::open_for`] opens each binary it maps
//! ([`open_mapped`]: through `/proc/PID/map_files` or `/proc/PID/root`). The open descriptor is
//! what symbolization reads later, as `/proc/self/fd/N`. Binaries are keyed by device and inode,
//! so every process mapping libc shares one.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::ebpf::process::{FileKey, ProcessMap, open_mapped};

/// An open binary.
struct OpenFile {
    /// Keeps the descriptor (and so `path`) valid.
    _file: File,
    /// `/proc/self/fd/N`: how blazesym opens it.
    path: PathBuf,
    last_used: u64,
}

/// Binaries held open for symbolization, at most `capacity` of them; the least recently used
/// is closed first.
pub(crate) struct Files {
    open: HashMap<FileKey, OpenFile>,
    capacity: usize,
}

impl Files {
    pub(crate) fn new(capacity: usize) -> Files {
        Files {
            open: HashMap::new(),
            capacity: capacity.max(1),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }

    /// Opens every file of `map` (process `pid`) that is not open yet. Appends the files
    /// closed to stay within capacity to `evicted`, which the caller evicts from blazesym's
    /// cache.
    pub(crate) fn open_for(
        &mut self,
        pid: u32,
        map: &ProcessMap,
        now: u64,
        evicted: &mut Vec<(FileKey, PathBuf)>,
    ) {
        for mapping in &map.mappings {
            let crate::ebpf::process::Object::File { key, .. } = &mapping.object else {
                continue;
            };
            if let Some(open) = self.open.get_mut(key) {
                open.last_used = now;
                continue;
            }
            let Some((file, _)) = open_mapped(pid, mapping) else {
                continue;
            };
            if self.open.len() >= self.capacity
                && let Some(oldest) = self
                    .open
                    .iter()
                    .min_by_key(|(_, open)| open.last_used)
                    .map(|(key, _)| *key)
                && let Some(closed) = self.open.remove(&oldest)
            {
                evicted.push((oldest, closed.path));
            }
            let fd_path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
            self.open.insert(
                *key,
                OpenFile {
                    _file: file,
                    path: fd_path,
                    last_used: now,
                },
            );
        }
    }

    /// Whether `key` is open.
    pub(crate) fn is_open(&self, key: FileKey) -> bool {
        self.open.contains_key(&key)
    }

    /// The path to read `key` through, marking it used.
    pub(crate) fn path(&mut self, key: FileKey, now: u64) -> Option<&Path> {
        let open = self.open.get_mut(&key)?;
        open.last_used = now;
        Some(&open.path)
    }
}
