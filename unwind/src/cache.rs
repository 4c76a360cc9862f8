//! The on-disk cache format: one file per executable identity, so that a restarted agent loads
//! tables instead of rebuilding them.
//!
//! Input: an [`UnwindTable`] to [`encode`] or [`write()`], bytes or a directory to [`decode`] or
//! [`read`] from. Output: the file bytes, or the table again. Owns the files `<id>.v<VERSION>`
//! in the directory it is given. Reading never panics and never trusts a size before checking
//! it against [`Limits`] and the file's length; the checksum and the table's own validation
//! reject a damaged file.
//!
//! Layout (little-endian):
//!
//! ```text
//! 0    8   magic "SMOLUNWT"
//! 8    4   format version (4; 1 had no source digest, 3 and older had 64 KiB pages)
//! 12   1   identity kind (1 build id, 2 SHA-256 content hash)
//! 13   1   identity length (build id: 1..=64; content hash: 32)
//! 14   2   zero
//! 16   64  identity bytes, zero padded
//! 80   16  source digest of a build id identity, zero for a content hash
//! 96   88  statistics: 11 u64 (cfi kind, FDEs, skipped, signal FDEs, CFI rows, rows, rbp lost,
//!          unsupported by reason x 4)
//! 184  8   entry count n
//! 192  8n  entries (header, page directory, rows)
//! end  4   CRC-32 (IEEE) of every byte before it
//! ```

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::elf::{CfiKind, ExeId, MAX_BUILD_ID, SOURCE_DIGEST};
use crate::error::UnwindError;
use crate::table::{Limits, Stats, UnwindTable};

/// The first 8 bytes of every cache file.
pub const MAGIC: [u8; 8] = *b"SMOLUNWT";
/// The format version this build reads and writes, raised when the layout or what the builder
/// puts in a table changes (3: Go binaries' tables end stacks at `runtime.mcall` and
/// `runtime.morestack` too; 4: 4 KiB pages instead of 64 KiB), so that a table an older agent
/// cached is built again.
pub const VERSION: u32 = 4;

const ID_OFFSET: usize = 16;
const DIGEST_OFFSET: usize = ID_OFFSET + MAX_BUILD_ID;
const STATS_OFFSET: usize = DIGEST_OFFSET + SOURCE_DIGEST;
const STATS_FIELDS: usize = 11;
const COUNT_OFFSET: usize = STATS_OFFSET + STATS_FIELDS * 8;
const ENTRIES_OFFSET: usize = COUNT_OFFSET + 8;
const CRC_BYTES: usize = 4;

/// The file name of a table in the cache directory: `<id>.v<VERSION>`. Files of other versions
/// are never read (a reader may delete them).
pub fn file_name(id: &ExeId) -> String {
    format!("{id}.v{VERSION}")
}

/// The table as cache file bytes.
pub fn encode(table: &UnwindTable) -> Vec<u8> {
    let entries = table.entries();
    let mut out = Vec::with_capacity(ENTRIES_OFFSET + entries.len() * 8 + CRC_BYTES);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    let (kind, bytes, digest): (u8, &[u8], [u8; SOURCE_DIGEST]) = match table.id() {
        ExeId::BuildId(id, digest) => (1, id, *digest),
        ExeId::ContentHash(hash) => (2, hash, [0; SOURCE_DIGEST]),
    };
    out.push(kind);
    out.push(bytes.len() as u8);
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(bytes);
    out.resize(DIGEST_OFFSET, 0);
    out.extend_from_slice(&digest);
    let stats = table.stats();
    let fields: [u64; STATS_FIELDS] = [
        stats.cfi.map_or(0, CfiKind::code),
        stats.fdes,
        stats.fdes_skipped,
        stats.signal_fdes,
        stats.cfi_rows,
        stats.rows,
        stats.fp_lost,
        stats.unsupported[0],
        stats.unsupported[1],
        stats.unsupported[2],
        stats.unsupported[3],
    ];
    for field in fields {
        out.extend_from_slice(&field.to_le_bytes());
    }
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for entry in entries {
        out.extend_from_slice(&entry.to_le_bytes());
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Reads a table back from cache file bytes.
///
/// # Errors
///
/// [`UnwindError::Version`] for another format version; [`UnwindError::TooLarge`] when the
/// entry count exceeds what `limits` allow; [`UnwindError::Malformed`] for anything else:
/// wrong magic, truncation, trailing bytes, a checksum mismatch, an invalid table.
pub fn decode(bytes: &[u8], limits: &Limits) -> Result<UnwindTable, UnwindError> {
    let malformed = |reason: String| UnwindError::Malformed { reason };
    if bytes.len() < ENTRIES_OFFSET + CRC_BYTES {
        return Err(malformed(format!(
            "{} bytes, shorter than the header",
            bytes.len()
        )));
    }
    if bytes[..8] != MAGIC {
        return Err(malformed("not an unwind cache file (bad magic)".into()));
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(UnwindError::Version {
            found: version,
            expected: VERSION,
        });
    }
    let u64_at =
        |offset: usize| u64::from_le_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"));
    let count = u64_at(COUNT_OFFSET);
    let max = 1 + u64::from(limits.max_pages) + u64::from(limits.max_rows);
    if count > max {
        return Err(UnwindError::TooLarge {
            what: "entries",
            value: count,
            limit: max,
        });
    }
    let expected = ENTRIES_OFFSET as u64 + count * 8 + CRC_BYTES as u64;
    if bytes.len() as u64 != expected {
        return Err(malformed(format!(
            "{} bytes, {count} entries need {expected}",
            bytes.len()
        )));
    }
    let (body, crc) = bytes.split_at(bytes.len() - CRC_BYTES);
    let crc = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    if crc32fast::hash(body) != crc {
        return Err(malformed("checksum mismatch".into()));
    }
    let id_len = usize::from(bytes[13]);
    if id_len == 0 || id_len > MAX_BUILD_ID || bytes[14..16] != [0, 0] {
        return Err(malformed(format!("identity length {id_len}")));
    }
    let id_bytes = &bytes[ID_OFFSET..ID_OFFSET + id_len];
    if bytes[ID_OFFSET + id_len..DIGEST_OFFSET]
        .iter()
        .any(|&b| b != 0)
    {
        return Err(malformed("identity padding is not zero".into()));
    }
    let digest: [u8; SOURCE_DIGEST] = bytes[DIGEST_OFFSET..STATS_OFFSET]
        .try_into()
        .expect("SOURCE_DIGEST bytes");
    let id = match bytes[12] {
        1 => ExeId::BuildId(id_bytes.to_vec(), digest),
        2 if digest == [0; SOURCE_DIGEST] => ExeId::ContentHash(
            id_bytes
                .try_into()
                .map_err(|_| malformed(format!("content hash of {id_len} bytes")))?,
        ),
        2 => return Err(malformed("a content hash with a source digest".into())),
        kind => return Err(malformed(format!("identity kind {kind}"))),
    };
    let field = |i: usize| u64_at(STATS_OFFSET + 8 * i);
    let cfi = match field(0) {
        0 => None,
        code => {
            Some(CfiKind::from_code(code).ok_or_else(|| malformed(format!("cfi kind {code}")))?)
        }
    };
    let stats = Stats {
        cfi,
        fdes: field(1),
        fdes_skipped: field(2),
        signal_fdes: field(3),
        cfi_rows: field(4),
        rows: field(5),
        fp_lost: field(6),
        unsupported: [field(7), field(8), field(9), field(10)],
    };
    let entries = body[ENTRIES_OFFSET..]
        .chunks_exact(8)
        .map(|chunk| u64::from_le_bytes(chunk.try_into().expect("8 bytes")))
        .collect();
    UnwindTable::from_entries(id, entries, stats)
}

/// Writes a table into `dir` (atomically: a temporary file renamed into place) and returns its
/// path.
///
/// # Errors
///
/// [`UnwindError::Io`] when the file cannot be written or renamed.
pub fn write(dir: &Path, table: &UnwindTable) -> Result<PathBuf, UnwindError> {
    let path = dir.join(file_name(table.id()));
    let tmp = dir.join(format!(".{}.tmp", file_name(table.id())));
    let mut file = fs::File::create(&tmp).map_err(io("create", &tmp))?;
    file.write_all(&encode(table)).map_err(io("write", &tmp))?;
    drop(file);
    fs::rename(&tmp, &path).map_err(io("rename", &path))?;
    Ok(path)
}

/// Reads the table of `id` from `dir`; `Ok(None)` when the cache has none.
///
/// # Errors
///
/// [`UnwindError::Io`] when the file exists but cannot be read; the errors of [`decode`]; and
/// [`UnwindError::Malformed`] when the file holds another identity's table.
pub fn read(dir: &Path, id: &ExeId, limits: &Limits) -> Result<Option<UnwindTable>, UnwindError> {
    let path = dir.join(file_name(id));
    let len = match fs::metadata(&path) {
        Ok(meta) => meta.len(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(io("stat", &path)(err)),
    };
    let max = (ENTRIES_OFFSET + CRC_BYTES) as u64
        + 8 * (1 + u64::from(limits.max_pages) + u64::from(limits.max_rows));
    if len > max {
        return Err(UnwindError::TooLarge {
            what: "cache file bytes",
            value: len,
            limit: max,
        });
    }
    let bytes = fs::read(&path).map_err(io("read", &path))?;
    let table = decode(&bytes, limits)?;
    if table.id() != id {
        return Err(UnwindError::Malformed {
            reason: format!("{} holds the table of {}", path.display(), table.id()),
        });
    }
    Ok(Some(table))
}

/// Wraps an OS error with the operation and the file.
fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> UnwindError + use<> {
    let path = path.to_path_buf();
    move |source| UnwindError::Io { op, path, source }
}
