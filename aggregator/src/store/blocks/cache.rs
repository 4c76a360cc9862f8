//! The block store's two caches, each bounded, the least recently used going first:
//!
//! - [`ChunkCache`]: decoded chunk headers (a series' shape and tree table in one block) in
//!   memory, kept for the next query: a warm 24 h read then plans and reads trees only. Bounded
//!   by `store.cache-bytes`.
//! - [`BlockCache`] (object-storage mode): the bucket's blocks, whole, on local disk under
//!   `<data-dir>/cache/blocks/`, so that a block is downloaded once rather than per read.
//!   Bounded by `store.object-store.block-cache-bytes`: a block is evicted, least recently read
//!   first, only while no read holds it; a download or a block being written reserves its
//!   bytes first, so the files on disk never pass the bound; a copy of more than a quarter of
//!   the bound is not kept (its block is read with ranged GETs). An evicted block stays open (its
//!   index and names are in memory, `files.rs`), and its next read downloads it again.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use object_store::path::Path as ObjectPath;
use smolder_block::{Fetched, Limits, SeriesChunk};
use tracing::{info, warn};

use super::files::{BlockFile, BlockName};
use crate::store::StoreMetrics;
use crate::store::metrics::BlockCacheMetrics;

/// The cache. See the [module documentation](self).
pub(crate) struct ChunkCache {
    entries: Mutex<Entries>,
    limit: u64,
    metrics: StoreMetrics,
}

#[derive(Default)]
struct Entries {
    map: HashMap<(String, usize), Slot>,
    bytes: u64,
    tick: u64,
}

struct Slot {
    chunk: Arc<SeriesChunk>,
    bytes: u64,
    used: u64,
}

/// Why a chunk could not be read.
pub(crate) enum ChunkError {
    Io(std::io::Error),
    Block(smolder_block::BlockError),
}

impl ChunkCache {
    /// A cache of at most `limit` bytes (estimated from the decoded sizes).
    pub(crate) fn new(limit: u64, metrics: StoreMetrics) -> ChunkCache {
        ChunkCache {
            entries: Mutex::new(Entries::default()),
            limit,
            metrics,
        }
    }

    /// The header of series `series` of `block`, decoded once.
    pub(crate) fn chunk(
        &self,
        block: &BlockFile,
        series: usize,
    ) -> Result<Arc<SeriesChunk>, ChunkError> {
        let key = (block.name.id.clone(), series);
        {
            let mut entries = self.lock();
            entries.tick += 1;
            let tick = entries.tick;
            if let Some(slot) = entries.map.get_mut(&key) {
                slot.used = tick;
                self.metrics.cache_hits.inc();
                return Ok(Arc::clone(&slot.chunk));
            }
        }
        self.metrics.cache_misses.inc();
        let range = block.index.chunk_header_range(series);
        let bytes = block.read(range.clone()).map_err(ChunkError::Io)?;
        let chunk = SeriesChunk::decode(
            &block.index,
            series,
            &Fetched::new(range.start, &bytes),
            &Limits::default(),
        )
        .map_err(ChunkError::Block)?;
        let chunk = Arc::new(chunk);
        let size = chunk.shape().len() as u64 * 8 + chunk.entries().len() as u64 * 96;
        let mut entries = self.lock();
        entries.tick += 1;
        let used = entries.tick;
        if let Some(old) = entries.map.insert(
            key,
            Slot {
                chunk: Arc::clone(&chunk),
                bytes: size,
                used,
            },
        ) {
            entries.bytes -= old.bytes;
        }
        entries.bytes += size;
        if entries.bytes > self.limit {
            let mut order: Vec<((String, usize), u64)> = entries
                .map
                .iter()
                .map(|(k, s)| (k.clone(), s.used))
                .collect();
            order.sort_by_key(|(_, used)| *used);
            for (key, _) in order {
                if entries.bytes <= self.limit / 4 * 3 {
                    break;
                }
                if let Some(slot) = entries.map.remove(&key) {
                    entries.bytes -= slot.bytes;
                }
            }
        }
        self.metrics
            .cache_bytes
            .set(i64::try_from(entries.bytes).unwrap_or(i64::MAX));
        Ok(chunk)
    }

    /// Forgets the chunks of block `id` (deleted or replaced).
    pub(crate) fn forget(&self, id: &str) {
        let mut entries = self.lock();
        let mut freed = 0;
        entries.map.retain(|(block, _), slot| {
            let keep = block != id;
            if !keep {
                freed += slot.bytes;
            }
            keep
        });
        entries.bytes -= freed;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // Held for a lookup or an insert, never across a read of the disk.
        self.entries.lock().expect("chunk cache lock")
    }
}

/// The bucket's blocks on local disk. See the [module documentation](self).
pub(crate) struct BlockCache {
    root: PathBuf,
    limit: u64,
    disk: Mutex<Disk>,
    metrics: BlockCacheMetrics,
}

#[derive(Default)]
struct Disk {
    blocks: HashMap<BlockName, Cached>,
    /// Bytes of the cached blocks and of every reservation.
    bytes: u64,
    tick: u64,
}

struct Cached {
    /// Held by the cache, and cloned by each read for its duration: a block whose file has
    /// another holder is being read, and is not evicted.
    file: Arc<File>,
    bytes: u64,
    /// The tick of its last read.
    used: u64,
}

impl BlockCache {
    /// The cache in `root` (created if needed) of at most `limit` bytes, with the copies an
    /// earlier run left there, the least recently written taken for the least recently read,
    /// and evicted past the bound; unfinished copies (`#` in their name) are deleted.
    ///
    /// # Errors
    ///
    /// When `root` cannot be created or listed.
    pub(crate) fn open(
        root: PathBuf,
        limit: u64,
        metrics: BlockCacheMetrics,
    ) -> std::io::Result<BlockCache> {
        std::fs::create_dir_all(&root)?;
        let mut found = Vec::new();
        for tenant in std::fs::read_dir(&root)? {
            let tenant = tenant?;
            if !tenant.file_type()?.is_dir() {
                continue;
            }
            for file in std::fs::read_dir(tenant.path())?.flatten() {
                let path = file.path();
                let name = path
                    .strip_prefix(&root)
                    .ok()
                    .and_then(|relative| relative.to_str())
                    .and_then(|relative| BlockName::parse(&ObjectPath::from(relative)));
                let Some(name) = name.filter(|_| !path.to_string_lossy().contains('#')) else {
                    if let Err(err) = std::fs::remove_file(&path) {
                        warn!(file = %path.display(), error = %err, "deleting an unfinished or unknown file of the block cache failed");
                    }
                    continue;
                };
                let Ok(meta) = file.metadata() else { continue };
                let modified = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                found.push((modified, name, path, meta.len()));
            }
        }
        found.sort_by_key(|(modified, ..)| *modified);
        let cache = BlockCache {
            root,
            limit,
            disk: Mutex::new(Disk::default()),
            metrics,
        };
        cache
            .metrics
            .limit
            .set(i64::try_from(limit).unwrap_or(i64::MAX));
        let kept = {
            let mut disk = cache.lock();
            for (_, name, path, bytes) in found {
                match File::open(&path) {
                    Ok(file) => {
                        disk.tick += 1;
                        let used = disk.tick;
                        disk.bytes += bytes;
                        disk.blocks.insert(
                            name,
                            Cached {
                                file: Arc::new(file),
                                bytes,
                                used,
                            },
                        );
                    }
                    Err(err) => {
                        warn!(file = %path.display(), error = %err, "a cached block cannot be opened; deleting it");
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
            cache.make_room(&mut disk, 0);
            cache.report(&disk);
            disk.blocks.len()
        };
        if kept > 0 {
            info!(blocks = kept, cache = %cache.root.display(), "block cache: an earlier run's copies kept");
        }
        Ok(cache)
    }

    /// Where block `name`'s copy is.
    pub(crate) fn path(&self, name: &BlockName) -> PathBuf {
        self.root.join(name.path().as_ref())
    }

    /// The copy of block `name`, marked read, when it has `len` bytes (a copy of another length
    /// is dropped). The file is held from eviction while the caller holds it.
    pub(crate) fn get(&self, name: &BlockName, len: u64) -> Option<Arc<File>> {
        let mut disk = self.lock();
        disk.tick += 1;
        let tick = disk.tick;
        match disk.blocks.get_mut(name) {
            Some(cached) if cached.bytes == len => {
                cached.used = tick;
                Some(Arc::clone(&cached.file))
            }
            Some(_) => {
                self.remove(&mut disk, name);
                self.report(&disk);
                None
            }
            None => None,
        }
    }

    /// Starts a copy of block `name`, empty: [`Reservation::write`] makes room as it grows.
    pub(crate) fn reserve(&self, name: &BlockName) -> Reservation<'_> {
        let path = self.path(name);
        let mut temporary = path.as_os_str().to_owned();
        temporary.push("#cache");
        Reservation {
            cache: self,
            name: name.clone(),
            path,
            temporary: PathBuf::from(temporary),
            reserved: 0,
            written: 0,
            file: None,
            done: false,
        }
    }

    /// Its metrics.
    pub(crate) fn metrics(&self) -> &BlockCacheMetrics {
        &self.metrics
    }

    /// Drops the copy of block `name` (deleted or replaced in the bucket). A read holding it
    /// finishes from the unlinked file.
    pub(crate) fn forget(&self, name: &BlockName) {
        let mut disk = self.lock();
        if disk.blocks.contains_key(name) {
            self.remove(&mut disk, name);
            self.report(&disk);
        }
    }

    /// Evicts blocks no read holds, least recently read first, until `more` bytes fit; whether
    /// they do.
    fn make_room(&self, disk: &mut Disk, more: u64) -> bool {
        while disk.bytes.saturating_add(more) > self.limit {
            let victim = disk
                .blocks
                .iter()
                .filter(|(_, cached)| Arc::strong_count(&cached.file) == 1)
                .min_by_key(|(_, cached)| cached.used)
                .map(|(name, _)| name.clone());
            let Some(victim) = victim else {
                return false;
            };
            self.remove(disk, &victim);
            self.metrics.evictions.inc();
        }
        true
    }

    fn remove(&self, disk: &mut Disk, name: &BlockName) {
        if let Some(cached) = disk.blocks.remove(name) {
            disk.bytes -= cached.bytes;
            let path = self.path(name);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => {
                    warn!(file = %path.display(), error = %err, "deleting a cached block failed")
                }
            }
        }
    }

    fn report(&self, disk: &Disk) {
        self.metrics
            .bytes
            .set(i64::try_from(disk.bytes).unwrap_or(i64::MAX));
        self.metrics
            .blocks
            .set(i64::try_from(disk.blocks.len()).unwrap_or(i64::MAX));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Disk> {
        // Held for bookkeeping and unlinks, never across a download or a read.
        self.disk.lock().expect("block cache lock")
    }
}

/// A copy of a block being written into the cache, its bytes reserved before they are written;
/// dropped unfinished, it leaves nothing behind.
pub(crate) struct Reservation<'c> {
    cache: &'c BlockCache,
    name: BlockName,
    path: PathBuf,
    temporary: PathBuf,
    /// Bytes counted in the cache's for this copy.
    reserved: u64,
    /// Bytes written so far.
    written: u64,
    file: Option<std::io::BufWriter<File>>,
    /// Set once the cache had no room or the disk failed, or the copy is finished.
    done: bool,
}

impl Reservation<'_> {
    /// Makes room for `len` bytes in all, evicting blocks no read holds; whether it did (false:
    /// the copy is given up). A copy of more than a quarter of the bound is never kept, so that
    /// a few large blocks read in turn do not evict each other at every read.
    pub(crate) fn reserve(&mut self, len: u64) -> bool {
        if self.done {
            return false;
        }
        if len > self.cache.limit / 4 {
            self.abandon();
            return false;
        }
        let more = len.saturating_sub(self.reserved);
        if more == 0 {
            return true;
        }
        let room = {
            let mut disk = self.cache.lock();
            let room = self.cache.make_room(&mut disk, more);
            if room {
                disk.bytes += more;
                self.reserved += more;
            }
            self.cache.report(&disk);
            room
        };
        if !room {
            self.abandon();
        }
        room
    }

    /// Appends `bytes`, making room for them first; whether the copy goes on (false: given up,
    /// for want of room or a failed write).
    pub(crate) fn write(&mut self, bytes: &[u8]) -> bool {
        if !self.reserve(self.written + bytes.len() as u64) {
            return false;
        }
        self.written += bytes.len() as u64;
        let written = match &mut self.file {
            Some(file) => file.write_all(bytes),
            None => create(&self.temporary).and_then(|file| {
                self.file
                    .insert(std::io::BufWriter::new(file))
                    .write_all(bytes)
            }),
        };
        if let Err(err) = written {
            warn!(block = %self.name, error = %err, "writing a block into the cache failed; it is read from the bucket");
            self.abandon();
            return false;
        }
        true
    }

    /// Makes what was written the block's copy, most recently read; its file. `None` when the
    /// copy was given up.
    pub(crate) fn finish(mut self) -> Option<Arc<File>> {
        if self.done {
            return None;
        }
        let file = match self.file.take() {
            Some(file) => file.into_inner().map_err(|err| err.into_error()),
            None => create(&self.temporary),
        };
        let opened = file
            .and_then(|file| file.sync_all())
            .and_then(|()| std::fs::rename(&self.temporary, &self.path))
            .and_then(|()| File::open(&self.path));
        let file = match opened {
            Ok(file) => Arc::new(file),
            Err(err) => {
                warn!(block = %self.name, error = %err, "finishing a block's copy in the cache failed; it is read from the bucket");
                self.abandon();
                return None;
            }
        };
        let mut disk = self.cache.lock();
        disk.tick += 1;
        let used = disk.tick;
        // What was reserved beyond what was written goes back.
        disk.bytes -= self.reserved - self.written;
        if let Some(old) = disk.blocks.insert(
            self.name.clone(),
            Cached {
                file: Arc::clone(&file),
                bytes: self.written,
                used,
            },
        ) {
            // Written twice (a cut's copy and a reader's download): the rename replaced it.
            disk.bytes -= old.bytes;
        }
        self.done = true;
        self.cache.report(&disk);
        Some(file)
    }

    /// Gives the copy up: its file deleted, its bytes released.
    fn abandon(&mut self) {
        self.done = true;
        self.file = None;
        let _ = std::fs::remove_file(&self.temporary);
        let mut disk = self.cache.lock();
        disk.bytes -= self.reserved;
        self.reserved = 0;
        self.cache.report(&disk);
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.abandon();
        }
    }
}

/// Creates `path` and its directory.
fn create(path: &Path) -> std::io::Result<File> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    File::create(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::Tenant;

    fn name(id: &str) -> BlockName {
        BlockName {
            start: 1_000,
            span: 1_000,
            tenant: Tenant::new("anonymous").unwrap(),
            id: id.into(),
        }
    }

    fn cache(root: &Path, limit: u64) -> BlockCache {
        let metrics = crate::metrics::Metrics::new();
        let store = StoreMetrics::new(metrics.registry(), &metrics.health);
        BlockCache::open(root.to_owned(), limit, store.block_cache).unwrap()
    }

    fn put(cache: &BlockCache, id: &str, len: usize) -> bool {
        let mut copy = cache.reserve(&name(id));
        copy.write(&vec![7; len]) && copy.finish().is_some()
    }

    fn on_disk(root: &Path) -> u64 {
        std::fs::read_dir(root.join("anonymous"))
            .map(|files| files.flatten().map(|f| f.metadata().unwrap().len()).sum())
            .unwrap_or(0)
    }

    #[test]
    fn the_least_recently_read_block_no_read_holds_goes_first() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache(dir.path(), 400);
        for id in ["a", "b", "c", "d"] {
            assert!(put(&cache, id, 100));
        }
        // `a` read last, `b` held by a read: `c` goes for `e`.
        assert!(cache.get(&name("a"), 100).is_some());
        let held = cache.get(&name("b"), 100).unwrap();
        assert!(put(&cache, "e", 100));
        assert!(cache.get(&name("c"), 100).is_none(), "c evicted");
        for id in ["a", "b", "d", "e"] {
            assert!(cache.get(&name(id), 100).is_some(), "{id} kept");
        }
        assert_eq!(on_disk(dir.path()), 400);
        assert_eq!(cache.metrics.evictions.get(), 1);
        // Nothing fits beside blocks reads hold: the copy is given up, the bound kept, and
        // nothing is left behind.
        drop(held);
        let _held: Vec<_> = ["a", "b", "d", "e"]
            .iter()
            .map(|id| cache.get(&name(id), 100).unwrap())
            .collect();
        assert!(!put(&cache, "f", 50));
        assert_eq!(on_disk(dir.path()), 400);
        assert_eq!(cache.metrics.bytes.get(), 400);
        assert!(
            !put(&cache, "large", 101),
            "more than a quarter of the bound"
        );
        assert_eq!(cache.metrics.bytes.get(), 400);
    }

    #[test]
    fn a_copy_of_another_length_is_dropped_and_a_restart_keeps_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        {
            let cache = cache(dir.path(), 2_000);
            for id in ["a", "b", "c"] {
                assert!(put(&cache, id, 400));
            }
            assert!(cache.get(&name("b"), 399).is_none(), "a different length");
            assert_eq!(cache.metrics.bytes.get(), 800);
            let mut unfinished = cache.reserve(&name("d"));
            assert!(unfinished.write(&[1; 10]));
            std::mem::forget(unfinished);
        }
        // Restarted with a smaller bound: the unfinished copy is deleted, the older block
        // evicted.
        let cache = cache(dir.path(), 100 + 400);
        assert_eq!(cache.metrics.blocks.get(), 1);
        assert!(cache.get(&name("c"), 400).is_some());
        assert_eq!(on_disk(dir.path()), 400);
    }
}
