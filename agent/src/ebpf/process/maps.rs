//! A process's executable mappings, read from `/proc/PID/maps`, and the files they map.
//!
//! Input: `/proc/PID/maps` text ([`ProcessMap::parse`]) and a mapping to open
//! ([`open_mapped`]). Output: the executable mappings, sorted, each naming its file by device and
//! inode ([`FileKey`]), the vDSO or anonymous memory; and an open file checked to be the one
//! mapped. Callers: the symbolizer (which keeps binaries open to name frames after a process
//! exits) and the unwinder (which builds tables from them). Owns nothing.
//!
//! A mapped file is opened through `/proc/PID/map_files/<range>` when the agent may (it needs
//! `CAP_SYS_ADMIN` or `CAP_CHECKPOINT_RESTORE`), which works for deleted and replaced binaries
//! and inside containers; else through `/proc/PID/root/<path>` (`CAP_SYS_PTRACE` is enough),
//! which reaches into containers but not a binary deleted or replaced since the process mapped
//! it: [`open_mapped`] then checks the inode and refuses the other file.

use std::fs::File;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::Arc;

use crate::ebpf::unwind::open_regular;

/// A mapped file, by the device and inode `/proc/PID/maps` reports for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    /// `major << 32 | minor` of the device.
    pub dev: u64,
    /// The inode.
    pub inode: u64,
}

/// What an executable mapping maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Object {
    /// A file.
    File {
        /// Its device and inode.
        key: FileKey,
        /// Its path as the process sees it (without a ` (deleted)` suffix).
        path: Arc<str>,
        /// Whether it was deleted or replaced since it was mapped.
        deleted: bool,
    },
    /// The vDSO.
    Vdso,
    /// Anonymous memory: JIT-compiled code, trampolines.
    Anonymous,
}

impl Object {
    /// The file name, for `name+0xoffset` frames.
    pub fn file_name(&self) -> Option<&str> {
        match self {
            Object::File { path, .. } => Some(path.rsplit('/').next().unwrap_or(path)),
            Object::Vdso | Object::Anonymous => None,
        }
    }
}

/// One executable mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// What is mapped.
    pub object: Object,
}

/// A process's executable mappings, sorted by address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessMap {
    /// The mappings.
    pub mappings: Vec<Mapping>,
}

impl ProcessMap {
    /// Parses `/proc/PID/maps` text, keeping executable mappings (`[vsyscall]`, which no
    /// process executes since 4.x kernels, aside).
    pub fn parse(text: &str) -> ProcessMap {
        let mut mappings: Vec<Mapping> = text.lines().filter_map(parse_line).collect();
        mappings.sort_by_key(|m| m.start);
        ProcessMap { mappings }
    }

    /// Reads `/proc/PID/maps`.
    ///
    /// # Errors
    ///
    /// When the process is gone or the agent may not read its maps.
    pub fn read(pid: u32) -> std::io::Result<ProcessMap> {
        std::fs::read_to_string(format!("/proc/{pid}/maps")).map(|text| ProcessMap::parse(&text))
    }

    /// The mapping that holds `addr`.
    pub fn find(&self, addr: u64) -> Option<&Mapping> {
        let i = self.mappings.partition_point(|m| m.start <= addr);
        let mapping = self.mappings.get(i.checked_sub(1)?)?;
        (addr < mapping.end).then_some(mapping)
    }
}

fn line_path(line: &str) -> Option<&str> {
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start().split_once(' ')?.1;
    }
    Some(rest.trim())
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
    let path = line_path(line).unwrap_or("");
    let object = if inode != 0 && path.starts_with('/') {
        let (path, deleted) = match path.strip_suffix(" (deleted)") {
            Some(path) => (path, true),
            None => (path, false),
        };
        Object::File {
            key: FileKey {
                dev: (u64::from_str_radix(major, 16).ok()? << 32)
                    | u64::from_str_radix(minor, 16).ok()?,
                inode,
            },
            path: Arc::from(path),
            deleted,
        }
    } else if path == "[vdso]" {
        Object::Vdso
    } else if path == "[vsyscall]" {
        return None;
    } else {
        Object::Anonymous
    };
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset,
        object,
    })
}

/// How a mapped file was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenedVia {
    /// `/proc/PID/map_files/<range>`: the mapped file itself, whatever became of its path.
    MapFiles,
    /// `/proc/PID/root/<path>`, checked to have the mapped inode.
    Root,
}

/// Opens the file of `mapping` of process `pid`, the ways that work for exited, deleted and
/// containerised binaries; `None` for a mapping of no file, or when neither way works (the
/// process is gone, the file was deleted or replaced and `map_files` is not allowed).
pub fn open_mapped(pid: u32, mapping: &Mapping) -> Option<(File, OpenedVia)> {
    let Object::File {
        key, path, deleted, ..
    } = &mapping.object
    else {
        return None;
    };
    let range = format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        mapping.start, mapping.end
    );
    // Never a plain open: a FIFO or a device there would block the caller, or act on open.
    if let Ok(file) = open_regular(Path::new(&range), true) {
        return Some((file, OpenedVia::MapFiles));
    }
    if *deleted {
        return None;
    }
    let file = open_regular(Path::new(&format!("/proc/{pid}/root{path}")), true).ok()?;
    let meta = file.metadata().ok()?;
    // The path may name another file now (a package upgrade replaces binaries). The inode must
    // be the mapped one; the device may differ on overlayfs, which reports the underlying
    // device in /proc/PID/maps and its own in stat.
    (meta.ino() == key.inode).then_some((file, OpenedVia::Root))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Any text parses without panicking into sorted mappings, and what `find` finds holds
        /// the address.
        #[test]
        fn any_text_parses_into_sorted_mappings(text in "(([0-9a-f]{1,12}-[0-9a-f]{1,12} [r-][w-][x-]p [0-9a-f]{1,8} [0-9a-f]{2}:[0-9a-f]{2} [0-9]{1,6} *(/[a-z ]{0,10}( \\(deleted\\))?|\\[vdso\\])?|.{0,40})\n){0,8}") {
            let map = ProcessMap::parse(&text);
            prop_assert!(map.mappings.windows(2).all(|w| w[0].start <= w[1].start));
            for mapping in &map.mappings {
                if let Some(found) = map.find(mapping.start) {
                    prop_assert!(found.start <= mapping.start && mapping.start < found.end);
                }
            }
        }
    }

    const MAPS: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234                       /usr/bin/work
55d0c0a01000-55d0c0a02000 r-xp 00001000 fd:01 1234                       /usr/bin/work
7f0000000000-7f0000100000 r-xp 00028000 fd:01 99                         /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000200000-7f0000300000 rwxp 00000000 00:00 0 
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
7f0000400000-7f0000401000 r-xp 00000000 fd:01 77                         /tmp/my lib.so (deleted)
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn executable_mappings_are_kept_and_found() {
        let map = ProcessMap::parse(MAPS);
        assert_eq!(map.mappings.len(), 5);
        let work = map.find(0x55d0c0a01234).unwrap();
        assert_eq!(work.offset, 0x1000);
        assert_eq!(work.object.file_name(), Some("work"));
        assert!(matches!(
            &work.object,
            Object::File { key: FileKey { dev, inode: 1234 }, deleted: false, .. } if *dev == (0xfd << 32) | 1
        ));
        assert_eq!(map.find(0x55d0c0a00010), None);
        assert_eq!(map.find(0x7f0000200010).unwrap().object, Object::Anonymous);
        assert_eq!(map.find(0x7ffd00000010).unwrap().object, Object::Vdso);
        let deleted = map.find(0x7f0000400010).unwrap();
        assert_eq!(deleted.object.file_name(), Some("my lib.so"));
        assert!(
            matches!(&deleted.object, Object::File { path, deleted: true, .. } if &**path == "/tmp/my lib.so")
        );
    }

    #[test]
    fn a_fifo_at_a_mapped_path_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("lib.so");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        let meta = std::fs::metadata(&fifo).unwrap();
        // Not a mapping of ours, so map_files refuses it and the path is opened: with the
        // FIFO's own inode, so only its type refuses it.
        let mapping = Mapping {
            start: 0x1000,
            end: 0x2000,
            offset: 0,
            object: Object::File {
                key: FileKey {
                    dev: meta.dev(),
                    inode: meta.ino(),
                },
                path: Arc::from(fifo.to_str().unwrap()),
                deleted: false,
            },
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            tx.send(open_mapped(std::process::id(), &mapping).is_some())
                .unwrap();
        });
        let opened = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("opening a FIFO does not block");
        assert!(!opened);
    }

    #[test]
    fn our_own_binary_opens_and_a_wrong_inode_is_refused() {
        let map = ProcessMap::read(std::process::id()).unwrap();
        let own = map
            .mappings
            .iter()
            .find(|m| matches!(m.object, Object::File { .. }))
            .unwrap();
        assert!(open_mapped(std::process::id(), own).is_some());
        let mut other = own.clone();
        if let Object::File { key, .. } = &mut other.object {
            key.inode ^= 1;
        }
        // The range is not a mapping, so map_files refuses it; the path has another inode.
        other.start += 1;
        assert!(open_mapped(std::process::id(), &other).is_none());
    }
}
