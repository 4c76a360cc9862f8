//! Where a table comes from: the disk cache (a restart does not rebuild), else built from the
//! binary's call-frame information, with its separate debug file's `.debug_frame` where the
//! binary has no `.eh_frame` for most of its code.
//!
//! Input: a parsed binary. Output: its [`UnwindTable`] and how it was had. Caller: the
//! unwinder's worker. Owns the cache directory (`<data dir>/unwind/`), bounded by
//! `ebpf.unwind.max-cache-bytes`: the least recently used files go first.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use smolder_unwind::{CfiKind, Elf, ExeId, Limits, Rule, UnwindError, UnwindTable, cache};
use tracing::{debug, warn};

use super::file::{FileBytes, Stamp};
use crate::ebpf::cache_dir::CacheDir;
use crate::ebpf::symbolize::DebugDirs;

/// Below this share of `.text` covered by FDEs, the binary's debug file is looked for: code
/// built with `-fno-asynchronous-unwind-tables` has `.debug_frame` only, beside the C runtime's
/// few `.eh_frame` FDEs.
const MIN_COVERAGE: f64 = 0.5;

/// How a table was had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Read from the disk cache.
    Cache,
    /// Built from the binary.
    Built,
    /// Built from the binary and its separate debug file.
    BuiltWithDebugFile,
}

impl Origin {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Origin::Cache => "cache",
            Origin::Built => "built",
            Origin::BuiltWithDebugFile => "built_with_debug_file",
        }
    }
}

/// A table and how it was had.
pub(crate) struct Had {
    pub(crate) table: UnwindTable,
    pub(crate) origin: Origin,
    /// Time spent building (not reading the cache).
    pub(crate) build_time: Option<Duration>,
}

/// The share of `.text` that FDEs cover (1 where the binary has no `.text` section).
fn coverage(table: &UnwindTable, text: Option<(u64, u64)>) -> f64 {
    let Some((start, end)) = text.filter(|(start, end)| end > start) else {
        return 1.0;
    };
    let rows: Vec<(u64, Rule)> = table.rows().collect();
    let mut covered = 0u64;
    for (i, (address, rule)) in rows.iter().enumerate() {
        if *rule == Rule::NoFde {
            continue;
        }
        let next = rows.get(i + 1).map_or(*address, |(next, _)| *next);
        let (from, to) = ((*address).max(start), next.min(end));
        covered += to.saturating_sub(from);
    }
    covered as f64 / (end - start) as f64
}

/// Has the table of `elf` (the binary at `path` in process `pid`, identity `id`).
///
/// # Errors
///
/// The builder's errors: [`UnwindError::NoCfi`] for a binary with no call-frame information
/// (and no debug file with some), [`UnwindError::TooLarge`] past `limits`, and the others for
/// malformed files.
pub(crate) fn table(
    elf: &Elf<'_>,
    id: &ExeId,
    pid: u32,
    path: &str,
    cache: Option<&mut DiskCache>,
    debug: &DebugDirs,
    limits: &Limits,
) -> Result<Had, UnwindError> {
    let mut cache = cache;
    if let Some(cache) = cache.as_deref_mut()
        && let Some(table) = cache.read(id, limits)
    {
        return Ok(Had {
            table,
            origin: Origin::Cache,
            build_time: None,
        });
    }
    let started = Instant::now();
    let own = smolder_unwind::build(elf, None, limits);
    let poor = match &own {
        Ok(table) => {
            table.stats().cfi != Some(CfiKind::GoFramePointers)
                && coverage(table, elf.text()) < MIN_COVERAGE
        }
        Err(UnwindError::NoCfi) => true,
        Err(_) => false,
    };
    let mut origin = Origin::Built;
    let mut cacheable = true;
    let built = if poor {
        match debug
            .find(pid, path, elf)
            .and_then(|(file, _)| with_debug(elf, &file, limits))
        {
            Some(Ok(table)) => {
                origin = Origin::BuiltWithDebugFile;
                Ok(table)
            }
            // No debug file now; one may come (a package, debuginfod): build again next time.
            None => {
                cacheable = false;
                own
            }
            Some(Err(err)) => {
                debug!(path, error = %err, "building an unwind table with the debug file failed");
                own
            }
        }
    } else {
        own
    };
    let table = built?;
    let build_time = started.elapsed();
    if cacheable && let Some(cache) = cache {
        cache.write(&table);
    }
    Ok(Had {
        table,
        origin,
        build_time: Some(build_time),
    })
}

fn with_debug(
    elf: &Elf<'_>,
    file: &File,
    limits: &Limits,
) -> Option<Result<UnwindTable, UnwindError>> {
    let stamp = Stamp::of(file).ok()?;
    let mapped = FileBytes::new(file, &stamp).ok()?;
    let debug = Elf::parse(mapped.bytes()).ok()?;
    Some(smolder_unwind::build(elf, Some(&debug), limits))
}

/// The table cache on disk: `<id>.v<version>` files, the least recently used deleted past the
/// bound; files of another format version are deleted when it opens.
pub(crate) struct DiskCache(CacheDir);

impl DiskCache {
    /// Opens (creating it) the cache in `dir`, bounded by `max_bytes`.
    ///
    /// # Errors
    ///
    /// When the directory cannot be created or listed.
    pub(crate) fn open(dir: &Path, max_bytes: u64) -> std::io::Result<DiskCache> {
        std::fs::create_dir_all(dir)?;
        // Version 1 named tables by build id alone: such a file may be poisoned.
        let suffix = format!(".v{}", cache::VERSION);
        CacheDir::open(dir, max_bytes, |name| name.ends_with(&suffix)).map(DiskCache)
    }

    /// Bytes the cache holds.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.0.used_bytes()
    }

    /// Whether the cache holds the table of `id` (it may still turn out unreadable).
    pub(crate) fn has(&self, id: &ExeId) -> bool {
        self.0.contains(&cache::file_name(id))
    }

    fn read(&mut self, id: &ExeId, limits: &Limits) -> Option<UnwindTable> {
        let name = cache::file_name(id);
        if !self.0.contains(&name) {
            return None;
        }
        let dir = self.0.dir().to_path_buf();
        match cache::read(&dir, id, limits) {
            Ok(Some(table)) => {
                self.0.touch(&name);
                Some(table)
            }
            Ok(None) => {
                self.0.forget(&name);
                None
            }
            Err(err) => {
                warn!(file = %dir.join(&name).display(), error = %err, "an unwind cache file is unreadable; building the table again");
                let _ = std::fs::remove_file(dir.join(&name));
                self.0.forget(&name);
                None
            }
        }
    }

    fn write(&mut self, table: &UnwindTable) {
        match cache::write(self.0.dir(), table) {
            Ok(path) => {
                let size = std::fs::metadata(&path).map_or(0, |m| m.len());
                self.0.added(&cache::file_name(table.id()), size);
            }
            Err(err) => {
                warn!(dir = %self.0.dir().display(), error = %err, "writing an unwind table to the cache failed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_serves_a_restart_and_stays_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let own = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let elf = Elf::parse(&own).unwrap();
        let limits = Limits::default();
        let debug = DebugDirs::default();
        let mut cache = DiskCache::open(dir.path(), 1 << 30).unwrap();
        let first = table(&elf, &elf.id(), 0, "/x", Some(&mut cache), &debug, &limits).unwrap();
        assert_eq!(first.origin, Origin::Built);
        assert!(cache.used_bytes() > 0);
        // A restart: a new cache over the same directory.
        let mut again = DiskCache::open(dir.path(), 1 << 30).unwrap();
        let second = table(&elf, &elf.id(), 0, "/x", Some(&mut again), &debug, &limits).unwrap();
        assert_eq!(second.origin, Origin::Cache);
        assert_eq!(second.table, first.table);
        // A table of the old format, named by build id alone, is deleted: it may be poisoned.
        let old = dir.path().join("0123456789abcdef.v1");
        std::fs::write(&old, b"SMOLUNWT").unwrap();
        let reopened = DiskCache::open(dir.path(), 1 << 30).unwrap();
        assert!(!old.exists());
        assert_eq!(reopened.used_bytes(), again.used_bytes());
        // A bound below one table empties it.
        let small = DiskCache::open(dir.path(), 1).unwrap();
        assert_eq!(small.used_bytes(), 0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn coverage_counts_the_text_under_fdes() {
        let libc = std::fs::read("/usr/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        let elf = Elf::parse(&libc).unwrap();
        let table = smolder_unwind::build(&elf, None, &Limits::default()).unwrap();
        let share = coverage(&table, elf.text());
        assert!(share > 0.9 && share <= 1.0, "{share}");
    }
}
