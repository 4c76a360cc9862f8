//! Files the unwinder and the symbolizer read: opened so that no path can block them, and read
//! so that no file can crash the agent.
//!
//! Input: a path (a process's mapped binary, a debug file candidate) or an open file. Output: a
//! [`File`] that is a regular file ([`open_regular`]: a FIFO or a device named where a binary or
//! a debug file is expected is refused without being opened for reading), its bytes
//! ([`FileBytes`]: mapped only when no user but root can change it, else read into memory, so
//! that a file truncated while it is read cannot fault the agent with `SIGBUS`), its CRC-32
//! ([`crc32`], streamed), and a [`Stamp`] that tells the same file from another that reuses its
//! inode. Callers: the unwinder's worker, the symbolizer's binaries and debug files. Owns the
//! mapping or the buffer.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{FileExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::Path;

/// The largest file read, so that a hostile or broken file cannot take the address space.
/// Debian's largest shared object (`librustc_driver`, §1.4 of the unwinding reference) is
/// 147 MiB.
pub(crate) const MAX_FILE_BYTES: u64 = 2 << 30;

/// The largest file read into memory rather than mapped (one a user other than root can write):
/// the agent's memory holds it while its table is built.
pub(crate) const MAX_READ_BYTES: u64 = 256 << 20;

/// Opens `path` for reading if it is a regular file. It is first opened with `O_PATH` (which
/// opens no device and waits for no FIFO writer) and checked with `fstat`, then reopened for
/// reading through `/proc/self/fd`, which reaches the same inode, with `O_NONBLOCK` and
/// `O_NOCTTY`. With `follow` false a symbolic link at the last component is refused
/// (`O_NOFOLLOW`), for paths built from names a binary carries.
///
/// # Errors
///
/// The OS error of opening or `fstat`; [`std::io::ErrorKind::InvalidInput`] for a file that is
/// not regular.
pub(crate) fn open_regular(path: &Path, follow: bool) -> std::io::Result<File> {
    let flags = if follow {
        libc::O_PATH
    } else {
        libc::O_PATH | libc::O_NOFOLLOW
    };
    let handle = OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)?;
    regular(&handle)?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))?;
    regular(&file)?;
    Ok(file)
}

fn regular(file: &File) -> std::io::Result<()> {
    if file.metadata()?.file_type().is_file() {
        Ok(())
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ))
    }
}

/// What tells a file from a later one with the same device and inode, and who can change it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Stamp {
    pub(crate) dev: u64,
    pub(crate) inode: u64,
    pub(crate) size: u64,
    pub(crate) mtime_ns: i128,
    /// Owned by root and writable by no one else: only root can truncate it.
    pub(crate) root_only: bool,
}

impl Stamp {
    /// The stamp of an open file.
    pub(crate) fn of(file: &File) -> std::io::Result<Stamp> {
        let meta = file.metadata()?;
        Ok(Stamp {
            dev: meta.dev(),
            inode: meta.ino(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            root_only: meta.uid() == 0 && meta.mode() & 0o022 == 0,
        })
    }
}

/// Why a file's bytes could not be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MapFileError {
    /// The file is empty or larger than [`MAX_FILE_BYTES`] ([`MAX_READ_BYTES`] for one read
    /// into memory).
    #[error("{size} bytes, not between 1 and {limit}")]
    Size { size: u64, limit: u64 },
    /// mmap failed.
    #[error("mapping the file failed")]
    Mmap(#[source] std::io::Error),
    /// Reading failed.
    #[error("reading the file failed")]
    Read(#[source] std::io::Error),
}

/// The bytes of a file: mapped when only root can change it, else read into memory.
pub(crate) enum FileBytes {
    Mapped(MappedFile),
    Read(Vec<u8>),
}

impl FileBytes {
    /// The bytes of `file`, whose stamp is `stamp`. A file that shrinks while it is read
    /// gives the bytes read (an ELF parse then fails cleanly on them).
    pub(crate) fn new(file: &File, stamp: &Stamp) -> Result<FileBytes, MapFileError> {
        if stamp.root_only {
            return MappedFile::new(file, stamp.size).map(FileBytes::Mapped);
        }
        let size = stamp.size;
        if size == 0 || size > MAX_READ_BYTES {
            return Err(MapFileError::Size {
                size,
                limit: MAX_READ_BYTES,
            });
        }
        let len = usize::try_from(size).map_err(|_| MapFileError::Size {
            size,
            limit: MAX_READ_BYTES,
        })?;
        let mut bytes = vec![0; len];
        let mut read = 0;
        while read < len {
            match file.read_at(&mut bytes[read..], read as u64) {
                Ok(0) => break,
                Ok(n) => read += n,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(err) => return Err(MapFileError::Read(err)),
            }
        }
        bytes.truncate(read);
        Ok(FileBytes::Read(bytes))
    }

    /// The file's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(mapped) => mapped.bytes(),
            FileBytes::Read(bytes) => bytes,
        }
    }
}

/// The CRC-32 (IEEE) of `file`, read in 1 MiB steps; `None` past `max` bytes or when reading
/// fails.
pub(crate) fn crc32(file: &File, max: u64) -> Option<u32> {
    if file.metadata().ok()?.len() > max {
        return None;
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0; 1 << 20];
    let mut offset = 0u64;
    loop {
        match file.read_at(&mut buf, offset) {
            Ok(0) => return Some(hasher.finalize()),
            Ok(n) => {
                offset += n as u64;
                if offset > max {
                    return None;
                }
                hasher.update(&buf[..n]);
            }
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// A file mapped read-only and private.
pub(crate) struct MappedFile {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value alone; reading it from another
// thread is as safe as from this one.
unsafe impl Send for MappedFile {}

impl MappedFile {
    /// Maps `file`, whose size is `size` (from its [`Stamp`]). Only for files only root can
    /// change ([`Stamp::root_only`]): see [`FileBytes`].
    fn new(file: &File, size: u64) -> Result<MappedFile, MapFileError> {
        if size == 0 || size > MAX_FILE_BYTES {
            return Err(MapFileError::Size {
                size,
                limit: MAX_FILE_BYTES,
            });
        }
        let len = usize::try_from(size).map_err(|_| MapFileError::Size {
            size,
            limit: MAX_FILE_BYTES,
        })?;
        // SAFETY: a fresh private read-only mapping (null hint) of a regular file we hold open.
        // A file truncated while mapped would fault (SIGBUS) on access past its new end and kill
        // the agent: only files that root alone can write are mapped (`FileBytes::new`), and
        // root replaces binaries by renaming, not truncating in place.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(MapFileError::Mmap(std::io::Error::last_os_error()));
        }
        Ok(MappedFile { ptr, len })
    }

    /// The file's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is a live read-only mapping of `len` bytes for as long as `self` lives,
        // and nothing writes through it.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are what mmap returned; the borrow checker ended every borrow of
        // `bytes()` before drop.
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;
    use std::os::unix::fs::PermissionsExt as _;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_file_maps_and_its_stamp_changes_with_its_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"\x7fELF and more").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let file = open_regular(&path, false).unwrap();
        let stamp = Stamp::of(&file).unwrap();
        assert!(stamp.root_only, "the tests run as root");
        let bytes = FileBytes::new(&file, &stamp).unwrap();
        assert!(matches!(bytes, FileBytes::Mapped(_)));
        assert_eq!(bytes.bytes(), b"\x7fELF and more");
        std::fs::write(&path, b"other").unwrap();
        assert_ne!(Stamp::of(&File::open(&path).unwrap()).unwrap(), stamp);
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        let file = File::open(&empty).unwrap();
        assert!(matches!(
            FileBytes::new(&file, &Stamp::of(&file).unwrap()),
            Err(MapFileError::Size { size: 0, .. })
        ));
    }

    #[test]
    fn a_file_a_user_can_write_is_read_not_mapped_so_truncating_it_cannot_fault() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lib.so");
        let content: Vec<u8> = (0..3 * 4096).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        // nobody's file: its owner can truncate it while the agent reads it.
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        let file = open_regular(&path, true).unwrap();
        let stamp = Stamp::of(&file).unwrap();
        assert!(!stamp.root_only);
        let bytes = FileBytes::new(&file, &stamp).unwrap();
        assert!(matches!(bytes, FileBytes::Read(_)));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        // Mapped, reading past the new end would raise SIGBUS and end this test's process.
        assert_eq!(bytes.bytes(), content.as_slice());
        // A root file that others can write is read too.
        std::os::unix::fs::chown(&path, Some(0), Some(0)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(!Stamp::of(&File::open(&path).unwrap()).unwrap().root_only);
    }

    #[test]
    fn fifos_devices_and_links_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let link = dir.path().join("link");
        let target = dir.path().join("target");
        std::fs::write(&target, b"x").unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let paths = (fifo.clone(), link.clone());
        std::thread::spawn(move || {
            let results = [
                open_regular(&paths.0, true).map(drop),
                open_regular(Path::new("/dev/zero"), true).map(drop),
                open_regular(&paths.1, false).map(drop),
                open_regular(&paths.1, true).map(drop),
            ];
            tx.send(results.map(|r| r.is_ok())).unwrap();
        });
        // A blocking open of a FIFO without a writer would never return.
        let results = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("no open blocks");
        assert_eq!(results, [false, false, false, true]);
    }

    #[test]
    fn the_crc_is_streamed_and_capped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("debug");
        let content: Vec<u8> = (0..(3 << 20) + 17).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        let file = File::open(&path).unwrap();
        assert_eq!(crc32(&file, 4 << 20), Some(crc32fast::hash(&content)));
        assert_eq!(crc32(&file, 1 << 20), None, "past the cap");
    }
}
