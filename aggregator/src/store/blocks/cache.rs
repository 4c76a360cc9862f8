//! Decoded chunk headers (a series' shape and tree table in one block), kept for the next
//! query: a warm 24 h read then plans and reads trees only. Bounded by `store.cache-bytes`;
//! the least recently used go first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use smolder_block::{Fetched, Limits, SeriesChunk};

use super::files::BlockFile;
use crate::store::StoreMetrics;

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
