//! Reads another process's memory through `/proc/PID/mem`.
//!
//! The file is opened once, when a Python process is attached; reads are `pread`s at the
//! address. An open `mem` file stays bound to the address space it was opened for, so a pid
//! reused by a new process cannot be read by mistake: reads fail once the process has exited.
//! Needs `CAP_SYS_PTRACE` (or the same user and a permissive `ptrace_scope`).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::PythonError;

/// An open view of one process's memory.
#[derive(Debug)]
pub struct Memory {
    pid: u32,
    file: File,
}

impl Memory {
    /// Opens `proc/PID/mem` (`proc` is normally `/proc`).
    ///
    /// # Errors
    ///
    /// [`PythonError::OpenMemory`] when the file cannot be opened (the process is gone, or the
    /// agent lacks `CAP_SYS_PTRACE`).
    pub fn open(proc: &Path, pid: u32) -> Result<Memory, PythonError> {
        let path = proc.join(pid.to_string()).join("mem");
        let file = File::open(&path).map_err(|source| PythonError::OpenMemory { pid, source })?;
        Ok(Memory { pid, file })
    }

    /// The process this reads.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Fills `buf` from `addr`.
    ///
    /// # Errors
    ///
    /// [`PythonError::Read`] when any byte of the range is unmapped or the process is gone.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), PythonError> {
        // Addresses above i64::MAX are kernel space; pread takes a signed offset.
        if addr == 0 || addr > i64::MAX as u64 {
            return Err(self.error(addr, buf.len(), io::ErrorKind::InvalidInput.into()));
        }
        self.file
            .read_exact_at(buf, addr)
            .map_err(|source| self.error(addr, buf.len(), source))
    }

    /// The little-endian `u64` at `addr`.
    ///
    /// # Errors
    ///
    /// As [`Memory::read`].
    pub fn u64(&self, addr: u64) -> Result<u64, PythonError> {
        let mut word = [0u8; 8];
        self.read(addr, &mut word)?;
        Ok(u64::from_le_bytes(word))
    }

    fn error(&self, addr: u64, len: usize, source: io::Error) -> PythonError {
        PythonError::Read {
            pid: self.pid,
            addr,
            len,
            source,
        }
    }
}

/// The little-endian `u64` at `offset` of `bytes`, or 0 when `bytes` is too short (callers size
/// their reads from the layout, so this does not happen).
pub(crate) fn u64_at(bytes: &[u8], offset: u64) -> u64 {
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    bytes
        .get(start..start.saturating_add(8))
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// The little-endian `u32` at `offset` of `bytes`, or 0 when `bytes` is too short.
pub(crate) fn u32_at(bytes: &[u8], offset: u64) -> u32 {
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    bytes
        .get(start..start.saturating_add(4))
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// The byte at `offset` of `bytes`, or 0 when `bytes` is too short.
pub(crate) fn u8_at(bytes: &[u8], offset: u64) -> u8 {
    usize::try_from(offset)
        .ok()
        .and_then(|i| bytes.get(i).copied())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_and_refuses_null_and_kernel_addresses() {
        let memory = Memory::open(Path::new("/proc"), std::process::id()).unwrap();
        let value: u64 = 0x0123_4567_89ab_cdef;
        let addr = &value as *const u64 as u64;
        assert_eq!(memory.u64(addr).unwrap(), value);
        assert!(matches!(memory.u64(0), Err(PythonError::Read { .. })));
        assert!(matches!(
            memory.u64(0xffff_ffff_8100_0000),
            Err(PythonError::Read { .. })
        ));
    }

    #[test]
    fn field_helpers_never_panic_on_short_input() {
        let bytes = [1u8, 0, 0, 0, 0, 0, 0, 0, 2];
        assert_eq!(u64_at(&bytes, 0), 1);
        assert_eq!(u64_at(&bytes, 4), 0);
        assert_eq!(u32_at(&bytes, 8), 0);
        assert_eq!(u8_at(&bytes, 8), 2);
        assert_eq!(u8_at(&bytes, u64::MAX), 0);
        assert_eq!(u64_at(&bytes, u64::MAX), 0);
    }
}
