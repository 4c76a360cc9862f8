//! Separate debug files, found the way gdb finds them: by build id under each debug directory
//! (`<dir>/.build-id/xx/yyyy….debug`), then by `.gnu_debuglink` name next to the binary, in its
//! `.debug/` directory and under each debug directory; first inside the process's root
//! (`/proc/PID/root`, a container's file system), then on the host; last, among the files the
//! debuginfod client downloaded.
//!
//! Input: a binary (its path as the process sees it, its build id and debug link). Output: an
//! open debug file checked to belong to it (same build id, or the debug link's CRC). Callers:
//! the symbolizer (names for stripped code) and the unwinder (`.debug_frame` for code without
//! `.eh_frame`). Owns nothing.

use std::fs::File;
use std::path::{Path, PathBuf};

use smolder_unwind::Elf;

use crate::ebpf::unwind::{FileBytes, Stamp, crc32, open_regular};

/// The largest debug file candidate looked at (its CRC read, or parsed): past it, a file named
/// by a debug link is not read whole.
pub(crate) const MAX_DEBUG_FILE_BYTES: u64 = 512 << 20;

/// Where a debug file was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DebugSource {
    /// A debug directory, by build id or debug link (a `-dbgsym` package, `libc6-dbg`).
    Local,
    /// The debuginfod client's cache.
    Debuginfod,
}

impl DebugSource {
    /// A short lowercase name, used as a metric label value.
    pub fn name(self) -> &'static str {
        match self {
            DebugSource::Local => "local",
            DebugSource::Debuginfod => "debuginfod",
        }
    }
}

/// The directories debug files are looked up in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DebugDirs {
    /// gdb's `debug-file-directory` (`symbolize.debug-dirs`).
    pub dirs: Vec<PathBuf>,
    /// The debuginfod client's cache, holding `<build id>.debug` files.
    pub downloaded: Option<PathBuf>,
}

/// The file name of a downloaded debug file: the build id in lowercase hex.
pub(crate) fn downloaded_name(build_id: &[u8]) -> String {
    let mut name = hex(build_id);
    name.push_str(".debug");
    name
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl DebugDirs {
    /// The debug file of `elf`, the binary at `path` in process `pid`.
    pub(crate) fn find(&self, pid: u32, path: &str, elf: &Elf<'_>) -> Option<(File, DebugSource)> {
        let build_id = elf.build_id();
        let link = elf.debug_link();
        if build_id.is_none() && link.is_none() {
            return None;
        }
        let container = format!("/proc/{pid}/root");
        // A process in the host's mount namespace has the host's root: look once.
        let roots: Vec<&str> = match std::fs::read_link(&container) {
            Ok(root) if root == Path::new("/") => vec![""],
            _ => vec![container.as_str(), ""],
        };
        for root in &roots {
            if let Some(id) = build_id {
                for dir in &self.dirs {
                    let (head, tail) = id.split_at(1);
                    let candidate = format!(
                        "{root}{}/.build-id/{}/{}.debug",
                        dir.display(),
                        hex(head),
                        hex(tail)
                    );
                    if let Some(file) =
                        open_matching(Path::new(&candidate), |debug| debug.build_id() == Some(id))
                    {
                        return Some((file, DebugSource::Local));
                    }
                }
            }
            if let Some((name, crc)) = link {
                let Some(name) = link_name(name) else {
                    continue;
                };
                let parent = Path::new(path).parent().unwrap_or(Path::new("/"));
                let mut candidates = vec![
                    format!("{root}{}/{name}", parent.display()),
                    format!("{root}{}/.debug/{name}", parent.display()),
                ];
                for dir in &self.dirs {
                    candidates.push(format!(
                        "{root}{}{}/{name}",
                        dir.display(),
                        parent.display()
                    ));
                }
                for candidate in candidates {
                    if let Some(file) = open_crc(Path::new(&candidate), crc) {
                        return Some((file, DebugSource::Local));
                    }
                }
            }
        }
        let (Some(dir), Some(id)) = (&self.downloaded, build_id) else {
            return None;
        };
        let file = open_regular(&dir.join(downloaded_name(id)), false).ok()?;
        Some((file, DebugSource::Debuginfod))
    }
}

/// The debug link's file name, if it is one: a name of a file in a directory, not a path (a
/// name with `/` or a `..` would reach out of the directories searched).
fn link_name(name: &[u8]) -> Option<&str> {
    let name = std::str::from_utf8(name).ok()?;
    (!name.is_empty() && name != "." && name != ".." && !name.contains('/')).then_some(name)
}

/// Opens `path` if it is a regular ELF file that `accept` accepts. Symbolic links are followed:
/// the path is a debug directory's and a build id's (distributions link `.build-id/xx/….debug`
/// to the debug file), and the file's build id is checked after.
fn open_matching(path: &Path, accept: impl FnOnce(&Elf<'_>) -> bool) -> Option<File> {
    let file = open_regular(path, true).ok()?;
    let stamp = Stamp::of(&file).ok()?;
    if stamp.size > MAX_DEBUG_FILE_BYTES {
        return None;
    }
    let bytes = FileBytes::new(&file, &stamp).ok()?;
    let elf = Elf::parse(bytes.bytes()).ok()?;
    accept(&elf).then_some(file)
}

/// Opens `candidate` if it is a regular file of at most [`MAX_DEBUG_FILE_BYTES`] whose CRC-32
/// is `crc`: the debug link's check, which also refuses the binary itself where the link names
/// a file beside it. Never follows a symbolic link: the name comes from the binary.
fn open_crc(candidate: &Path, crc: u32) -> Option<File> {
    let file = open_regular(candidate, false).ok()?;
    (crc32(&file, MAX_DEBUG_FILE_BYTES)? == crc).then_some(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libc_finds_its_debug_file_by_build_id_when_libc6_dbg_is_installed() {
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        let bytes = std::fs::read(libc).unwrap();
        let elf = Elf::parse(&bytes).unwrap();
        let id = elf.build_id().unwrap();
        let (head, tail) = id.split_at(1);
        let expected = format!("/usr/lib/debug/.build-id/{}/{}.debug", hex(head), hex(tail));
        let dirs = DebugDirs {
            dirs: vec![PathBuf::from("/usr/lib/debug")],
            downloaded: None,
        };
        let found = dirs.find(std::process::id(), libc, &elf);
        assert_eq!(
            found.is_some(),
            Path::new(&expected).exists(),
            "{expected} (libc6-dbg)"
        );
        let none = DebugDirs::default();
        assert!(none.find(std::process::id(), libc, &elf).is_none());
    }

    #[test]
    fn debug_link_names_with_a_slash_are_refused() {
        assert_eq!(link_name(b"libc.so.6.debug"), Some("libc.so.6.debug"));
        for bad in [
            &b"../../etc/shadow"[..],
            b"/dev/tty",
            b"a/b",
            b"..",
            b".",
            b"",
            b"\xff",
        ] {
            assert_eq!(link_name(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_fifo_where_a_debug_file_is_looked_for_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("x.debug");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let found = (
                open_crc(&fifo, 0).is_some(),
                open_matching(&fifo, |_| true).is_some(),
            );
            tx.send(found).unwrap();
        });
        let found = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("no open of a FIFO blocks");
        assert_eq!(found, (false, false));
    }

    #[test]
    fn a_build_id_link_is_followed_to_its_debug_file() {
        let own = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let id = Elf::parse(&own).unwrap().build_id().unwrap().to_vec();
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real.debug");
        std::fs::write(&target, &own).unwrap();
        let link = dir.path().join("link.debug");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(open_matching(&link, |debug| debug.build_id() == Some(&id[..])).is_some());
        assert!(open_matching(&link, |_| false).is_none());
    }

    #[test]
    fn downloaded_files_are_named_by_build_id() {
        assert_eq!(downloaded_name(&[0xab, 0x01]), "ab01.debug");
    }
}
