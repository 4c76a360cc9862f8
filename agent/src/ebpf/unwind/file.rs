//! ELF files mapped read-only into the agent, so that building a table reads only the pages it
//! needs (headers, notes, `.eh_frame`) rather than the whole binary.
//!
//! Input: an open file. Output: its bytes, borrowed for as long as the [`MappedFile`] lives, and
//! a [`Stamp`] that tells the same file from another that reuses its inode. Caller: the
//! unwinder's worker. Owns the mapping.

use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::MetadataExt as _;

/// The largest file mapped, so that a hostile or broken file cannot take the address space.
/// Debian's largest shared object (`librustc_driver`, §1.4 of the unwinding reference) is
/// 147 MiB.
pub(crate) const MAX_FILE_BYTES: u64 = 2 << 30;

/// What tells a file from a later one with the same device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Stamp {
    pub(crate) dev: u64,
    pub(crate) inode: u64,
    pub(crate) size: u64,
    pub(crate) mtime_ns: i128,
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
        })
    }
}

/// Why a file could not be mapped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MapFileError {
    /// The file is empty or larger than [`MAX_FILE_BYTES`].
    #[error("{size} bytes, not between 1 and {MAX_FILE_BYTES}")]
    Size { size: u64 },
    /// mmap failed.
    #[error("mapping the file failed")]
    Mmap(#[source] std::io::Error),
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
    /// Maps `file`, whose size is `size` (from its [`Stamp`]).
    pub(crate) fn new(file: &File, size: u64) -> Result<MappedFile, MapFileError> {
        if size == 0 || size > MAX_FILE_BYTES {
            return Err(MapFileError::Size { size });
        }
        let len = usize::try_from(size).map_err(|_| MapFileError::Size { size })?;
        // SAFETY: a fresh private read-only mapping (null hint) of a regular file we hold open.
        // A file truncated while mapped would fault (SIGBUS) on access past its new end: binaries
        // are replaced by renaming, not truncated in place, and blazesym maps the same files
        // the same way.
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
    use super::*;

    #[test]
    fn a_file_maps_and_its_stamp_changes_with_its_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"\x7fELF and more").unwrap();
        let file = File::open(&path).unwrap();
        let stamp = Stamp::of(&file).unwrap();
        let mapped = MappedFile::new(&file, stamp.size).unwrap();
        assert_eq!(mapped.bytes(), b"\x7fELF and more");
        std::fs::write(&path, b"other").unwrap();
        assert_ne!(Stamp::of(&File::open(&path).unwrap()).unwrap(), stamp);
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert!(matches!(
            MappedFile::new(&File::open(&empty).unwrap(), 0),
            Err(MapFileError::Size { size: 0 })
        ));
    }
}
