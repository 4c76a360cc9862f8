//! Process memory maps captured while a process lives, and the binaries they map, held open.
//!
//! At first sight of a process, [`ProcessMap::parse`] reads the executable mappings of
//! `/proc/PID/maps` and [`Files::open`] opens each mapped binary through
//! `/proc/PID/map_files/<range>` (which works for deleted binaries) or `/proc/PID/root/<path>`
//! (which reaches into containers). The open descriptor is what symbolization reads later, as
//! `/proc/self/fd/N`, so a process that has exited, or whose binary was replaced, is still
//! symbolized. Binaries are keyed by device and inode, so every process mapping libc shares one.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A binary, by the device and inode `/proc/PID/maps` reports for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct FileKey {
    pub(crate) dev: u64,
    pub(crate) inode: u64,
}

/// What an executable mapping maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Object {
    /// A file, opened in [`Files`] under its key (unless opening it failed).
    File {
        key: FileKey,
        /// The file name, for `name+0xoffset` frames.
        name: Arc<str>,
    },
    /// The vDSO.
    Vdso,
    /// Anonymous memory: JIT-compiled code, found in a perf map if the runtime writes one.
    Anonymous,
}

/// One executable mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mapping {
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// File offset of `start`.
    pub(crate) offset: u64,
    pub(crate) object: Object,
}

/// A process's executable mappings, sorted by address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ProcessMap {
    pub(crate) mappings: Vec<Mapping>,
}

impl ProcessMap {
    /// Parses `/proc/PID/maps` text, keeping executable mappings.
    pub(crate) fn parse(text: &str) -> ProcessMap {
        let mut mappings: Vec<Mapping> = text.lines().filter_map(parse_line).collect();
        mappings.sort_by_key(|m| m.start);
        ProcessMap { mappings }
    }

    /// The mapping that holds `addr`.
    pub(crate) fn find(&self, addr: u64) -> Option<&Mapping> {
        let i = self.mappings.partition_point(|m| m.start <= addr);
        let mapping = self.mappings.get(i.checked_sub(1)?)?;
        (addr < mapping.end).then_some(mapping)
    }

    /// The path of each mapped file as the process sees it, for opening.
    pub(crate) fn paths(text: &str) -> HashMap<FileKey, (u64, u64, String)> {
        let mut paths = HashMap::new();
        for line in text.lines() {
            if let Some((mapping, path)) = parse_line(line).zip(line_path(line))
                && let Object::File { key, .. } = mapping.object
            {
                paths
                    .entry(key)
                    .or_insert((mapping.start, mapping.end, path.to_owned()));
            }
        }
        paths
    }
}

fn line_path(line: &str) -> Option<&str> {
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start().split_once(' ')?.1;
    }
    let path = rest.trim_start();
    path.starts_with('/').then_some(path)
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    if perms.as_bytes().get(2) != Some(&b'x') {
        return None;
    }
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let inode: u64 = fields.next()?.parse().ok()?;
    let path = line_path(line);
    let object = match path {
        Some(path) if inode != 0 => {
            let path = path.strip_suffix(" (deleted)").unwrap_or(path);
            Object::File {
                key: FileKey {
                    dev: (u64::from_str_radix(major, 16).ok()? << 32)
                        | u64::from_str_radix(minor, 16).ok()?,
                    inode,
                },
                name: Arc::from(path.rsplit('/').next().unwrap_or(path)),
            }
        }
        _ if line.trim_end().ends_with("[vdso]") => Object::Vdso,
        _ => Object::Anonymous,
    };
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset,
        object,
    })
}

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

    /// Opens every file `pid` maps that is not open yet. Returns the paths of files closed to
    /// stay within capacity, which the caller evicts from blazesym's cache.
    pub(crate) fn open_for(
        &mut self,
        pid: u32,
        maps_text: &str,
        now: u64,
        evicted: &mut Vec<PathBuf>,
    ) {
        for (key, (start, end, path)) in ProcessMap::paths(maps_text) {
            if let Some(open) = self.open.get_mut(&key) {
                open.last_used = now;
                continue;
            }
            let Some(file) = open_mapped(pid, start, end, &path) else {
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
                evicted.push(closed.path);
            }
            let fd_path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
            self.open.insert(
                key,
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

/// Opens a mapped file the ways that work for exited, deleted and containerised binaries.
fn open_mapped(pid: u32, start: u64, end: u64, path: &str) -> Option<File> {
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    File::open(format!("/proc/{pid}/map_files/{start:x}-{end:x}"))
        .or_else(|_| File::open(format!("/proc/{pid}/root{path}")))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234                       /usr/bin/work
55d0c0a01000-55d0c0a02000 r-xp 00001000 fd:01 1234                       /usr/bin/work
7f0000000000-7f0000100000 r-xp 00028000 fd:01 99                         /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000200000-7f0000300000 rwxp 00000000 00:00 0 
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
7f0000400000-7f0000401000 r-xp 00000000 fd:01 77                         /tmp/my lib.so (deleted)
";

    #[test]
    fn executable_mappings_are_kept_and_found() {
        let map = ProcessMap::parse(MAPS);
        assert_eq!(map.mappings.len(), 5);
        let work = map.find(0x55d0c0a01234).unwrap();
        assert_eq!(work.offset, 0x1000);
        assert!(matches!(&work.object, Object::File { name, .. } if &**name == "work"));
        assert_eq!(map.find(0x55d0c0a00010), None);
        assert_eq!(map.find(0x7f0000200010).unwrap().object, Object::Anonymous);
        assert_eq!(map.find(0x7ffd00000010).unwrap().object, Object::Vdso);
        let deleted = map.find(0x7f0000400010).unwrap();
        assert!(matches!(&deleted.object, Object::File { name, .. } if &**name == "my lib.so"));
        let paths = ProcessMap::paths(MAPS);
        assert_eq!(paths.len(), 3);
        assert!(
            paths
                .values()
                .any(|(_, _, p)| p == "/tmp/my lib.so (deleted)")
        );
    }
}
