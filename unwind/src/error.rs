//! Errors of building, encoding and decoding unwind tables.

use std::path::PathBuf;

/// Why a table could not be built, stored or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UnwindError {
    /// The bytes are not a 64-bit little-endian x86-64 ELF file.
    #[error("not an x86-64 ELF file: {reason}")]
    Elf {
        /// What the ELF parser said.
        reason: String,
    },
    /// The file has neither `.eh_frame` nor `.debug_frame` (nor is it a Go binary): its frames
    /// can only be walked with frame pointers. A separate debug file may have `.debug_frame`.
    #[error("no call-frame information (.eh_frame, .debug_frame)")]
    NoCfi,
    /// `.debug_frame` is compressed in a way this crate does not read.
    #[error("compressed .debug_frame: {reason}")]
    Compressed {
        /// The format or the decompressor's error.
        reason: String,
    },
    /// The framing of the call-frame information (its sequence of CIEs and FDEs) does not
    /// parse; a single malformed FDE is skipped and counted instead.
    #[error("malformed call-frame information: {source}")]
    Cfi {
        /// gimli's error.
        source: gimli::Error,
    },
    /// The table would exceed a limit ([`Limits`](crate::Limits)).
    #[error("unwind table too large: {what} is {value}, the limit is {limit}")]
    TooLarge {
        /// Which quantity.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The limit.
        limit: u64,
    },
    /// A cached table (or table bytes from elsewhere) is malformed.
    #[error("malformed unwind table: {reason}")]
    Malformed {
        /// What is wrong, with the offset or index concerned.
        reason: String,
    },
    /// A cached table was written by another format version.
    #[error("unwind cache format version {found}, this build reads version {expected}")]
    Version {
        /// The version in the file.
        found: u32,
        /// The version this build reads and writes.
        expected: u32,
    },
    /// Reading or writing a file failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done (`open`, `read`, `write`, `rename`).
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}
