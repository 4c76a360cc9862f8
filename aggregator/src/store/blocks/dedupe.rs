//! Which blocks and copies reads leave out (object-storage mode): blocks that overlapping
//! merges replace (`lineage.rs`), and batches that two shown blocks both hold.
//!
//! Input: the block set whenever it changes; output: which known blocks are shown
//! ([`BlockSet::blocks`]) or held hidden ([`BlockSet::held`]), and per shown block the
//! positions (in its index's markers) of the batches whose separable trees reads skip
//! ([`BlockSet::skipped`]). Called by the writer thread (`Shared::dedupe`) before it publishes
//! a set, and by the sync loop and compaction to see what a listing would show; nothing here
//! runs in local mode, whose single writer never stores a batch twice.
//!
//! Two blocks hold one batch when two aggregators accepted it (within one upload interval) and
//! each cut its copy, or when two adopted one orphan's segments. Both blocks' marker lists are
//! sorted, so a pair costs one pass over the shorter list with a binary search in the longer;
//! a pair's answer is kept while both blocks are known. Every aggregator decides alike: two
//! merged blocks holding a batch conflict, and `lineage.rs` shows one of them (the other's
//! inputs show instead: counted `found="merge"` and logged); of a merged and a cut block, the
//! cut block's copy is left out (a merged tree sums many batches and cannot drop one); of two
//! cut blocks, the copy of the one of the larger name.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use tracing::warn;

use super::StoreMetrics;
use super::files::{BlockFile, BlockName, BlockSet};
use super::lineage::{self, Candidate};
use crate::tenant::Tenant;

/// What `lineage.rs` resolves of `block`.
fn candidate(block: &BlockFile) -> Candidate<'_> {
    Candidate {
        name: &block.name,
        leaves: &block.leaves,
        sources: block.sources.len(),
    }
}

/// The batches two blocks both hold, as (position in the first's markers, in the second's).
type Common = Arc<Vec<(u32, u32)>>;

/// The pairs of blocks compared so far, by (smaller name's id, larger name's id).
#[derive(Default)]
pub(crate) struct Duplicates {
    pairs: HashMap<(String, String), Common>,
    /// Pairs looked at since the last [`Duplicates::mark`] began; the others are forgotten.
    seen: HashSet<(String, String)>,
}

impl Duplicates {
    /// The batches `a` and `b` (`a`'s name the smaller) both hold, compared once per pair.
    fn common(&mut self, a: &BlockFile, b: &BlockFile, metrics: &StoreMetrics) -> Common {
        let key = (a.name.id.clone(), b.name.id.clone());
        let common = match self.pairs.get(&key) {
            Some(common) => Arc::clone(common),
            None => {
                let common = Arc::new(common_markers(a, b));
                report(a, b, &common, metrics);
                self.pairs.insert(key.clone(), Arc::clone(&common));
                common
            }
        };
        self.seen.insert(key);
        common
    }

    /// Which of `blocks` (one tenant's, sorted by name) reads show (`lineage::resolve`).
    pub(crate) fn resolve(
        &mut self,
        blocks: &[Arc<BlockFile>],
        metrics: &StoreMetrics,
    ) -> Vec<bool> {
        let candidates: Vec<Candidate<'_>> = blocks.iter().map(|b| candidate(b)).collect();
        lineage::resolve(&candidates, |i, j| {
            let (a, b) = if blocks[i].name < blocks[j].name {
                (&blocks[i], &blocks[j])
            } else {
                (&blocks[j], &blocks[i])
            };
            !self.common(a, b, metrics).is_empty()
        })
    }

    /// What publishing a merge would do among `blocks` (one tenant's known blocks, sorted by
    /// name): whether `lineage.rs` would show it, and the blocks it would displace
    /// (`lineage::displaced`). The merge is `name` with `leaves` and `sources` sources, made
    /// of `inputs`, whose markers stand for its own (it is not written yet).
    pub(crate) fn try_merge(
        &mut self,
        blocks: &[Arc<BlockFile>],
        merge: (&BlockName, &BTreeSet<String>, usize),
        inputs: &[Arc<BlockFile>],
        metrics: &StoreMetrics,
    ) -> (bool, Vec<BlockName>) {
        let (name, leaves, sources) = merge;
        let blocks: Vec<&Arc<BlockFile>> = blocks.iter().filter(|b| b.name != *name).collect();
        let mut candidates: Vec<Candidate<'_>> = blocks.iter().map(|b| candidate(b)).collect();
        let n = candidates.len();
        let mut common = |i: usize, j: usize| -> bool {
            let pair = |a: &Arc<BlockFile>, b: &Arc<BlockFile>, this: &mut Self| {
                let (a, b) = if a.name < b.name { (a, b) } else { (b, a) };
                !this.common(a, b, metrics).is_empty()
            };
            match (i == n, j == n) {
                (false, false) => pair(blocks[i], blocks[j], self),
                (true, false) => inputs.iter().any(|input| pair(input, blocks[j], self)),
                (false, true) => inputs.iter().any(|input| pair(input, blocks[i], self)),
                (true, true) => false,
            }
        };
        let without = lineage::resolve(&candidates, &mut common);
        candidates.push(Candidate {
            name,
            leaves,
            sources,
        });
        let with = lineage::resolve(&candidates, &mut common);
        let shown = with[n];
        let before: Vec<(Candidate<'_>, bool)> =
            candidates[..n].iter().copied().zip(without).collect();
        let after: Vec<(Candidate<'_>, bool)> = candidates.iter().copied().zip(with).collect();
        let displaced = lineage::displaced(&before, &after, leaves)
            .into_iter()
            .cloned()
            .collect();
        (shown, displaced)
    }

    /// Resolves which known blocks of `set` are shown, then sets the shown blocks' skipped
    /// markers from every pair of overlapping ones of a tenant, comparing the pairs not
    /// compared before (and counting what they hold twice).
    pub(crate) fn mark(&mut self, set: &mut BlockSet, metrics: &StoreMetrics) {
        self.seen.clear();
        let tenants: BTreeSet<Tenant> = set.blocks.keys().chain(set.held.keys()).cloned().collect();
        for tenant in tenants {
            let mut all: Vec<Arc<BlockFile>> = set
                .blocks
                .remove(&tenant)
                .into_iter()
                .chain(set.held.remove(&tenant))
                .flatten()
                .filter(|b| !b.is_bad())
                .collect();
            all.sort_by(|a, b| a.name.cmp(&b.name));
            all.dedup_by(|a, b| a.name == b.name);
            let shown = self.resolve(&all, metrics);
            let (mut blocks, mut held) = (Vec::new(), Vec::new());
            for (block, shown) in all.into_iter().zip(shown) {
                if shown { &mut blocks } else { &mut held }.push(block);
            }
            if !blocks.is_empty() {
                set.blocks.insert(tenant.clone(), blocks);
            }
            if !held.is_empty() {
                set.held.insert(tenant, held);
            }
        }
        let mut skip: HashMap<String, HashSet<u32>> = HashMap::new();
        let lists: Vec<Vec<Arc<BlockFile>>> = set.blocks.values().cloned().collect();
        for list in &lists {
            for (i, a) in list.iter().enumerate() {
                for b in &list[i + 1..] {
                    if a.name.start >= b.name.end() || b.name.start >= a.name.end() {
                        continue;
                    }
                    let common = self.common(a, b, metrics);
                    if common.is_empty() {
                        continue;
                    }
                    let (a_merged, b_merged) = (!a.sources.is_empty(), !b.sources.is_empty());
                    let (loser, positions): (&BlockFile, Vec<u32>) = match (a_merged, b_merged) {
                        // Resolution never shows two merges holding one batch.
                        (true, true) => continue,
                        (true, false) => (b, common.iter().map(|p| p.1).collect()),
                        (false, true) => (a, common.iter().map(|p| p.0).collect()),
                        // The list is sorted by name: `b` is the larger.
                        (false, false) => (b, common.iter().map(|p| p.1).collect()),
                    };
                    skip.entry(loser.name.id.clone())
                        .or_default()
                        .extend(positions);
                }
            }
        }
        let seen = std::mem::take(&mut self.seen);
        self.pairs.retain(|key, _| seen.contains(key));
        set.skip = skip
            .into_iter()
            .map(|(id, positions)| (id, Arc::new(positions)))
            .collect();
    }
}

/// The batches `a` and `b` both hold, as (position in `a`'s markers, position in `b`'s).
fn common_markers(a: &BlockFile, b: &BlockFile) -> Vec<(u32, u32)> {
    let (short, long, swapped) = if a.index.markers().len() <= b.index.markers().len() {
        (a, b, false)
    } else {
        (b, a, true)
    };
    let mut common = Vec::new();
    for (i, marker) in short.index.markers().iter().enumerate() {
        if let Ok(j) = long.index.markers().binary_search(marker) {
            let (i, j) = (i as u32, j as u32);
            common.push(if swapped { (j, i) } else { (i, j) });
        }
    }
    common
}

/// Logs and counts what a newly compared pair holds twice.
fn report(a: &BlockFile, b: &BlockFile, common: &[(u32, u32)], metrics: &StoreMetrics) {
    if common.is_empty() {
        return;
    }
    if !a.sources.is_empty() && !b.sources.is_empty() {
        warn!(first = %a.name, second = %b.name, batches = common.len(), "two merged blocks hold the same batches (two compactors with different views); reads show one of them and the other's inputs");
        metrics
            .duplicate_batches
            .with_label_values(&["merge"])
            .inc_by(common.len() as u64);
    } else {
        warn!(first = %a.name, second = %b.name, batches = common.len(), "two blocks hold the same batches (stored by two aggregators); reads count them once");
        metrics
            .duplicate_batches
            .with_label_values(&["block"])
            .inc_by(common.len() as u64);
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use smolder_block::{
        BlockBuilder, Contribution, Fetched, Limits, Marker, MergeInput, MergeOptions, Merger,
    };
    use smolder_common::{ProfileMeta, Series, Tree};

    use super::*;
    use crate::store::blocks::files::{BlockName, Files, LocalConfig, ObjectStoreConfig};
    use crate::store::blocks::read::finest_without;
    use crate::tenant::Tenant;

    fn marker(sequence: u64) -> Marker {
        Marker {
            agent_id: "agent".into(),
            sequence,
        }
    }

    /// Cut block `id` over [1000, 2000) holding batch `sequence` with value `sequence` in bucket
    /// 1000 + 10 × sequence, for each of `batches`.
    fn cut(files: &Files, id: &str, batches: &[u64]) -> Arc<BlockFile> {
        let mut builder = BlockBuilder::new("anonymous", 1_000, 1_000, 10).unwrap();
        let series = Series::parse("app.cpu").unwrap();
        for &sequence in batches {
            let mut tree = Tree::new();
            tree.insert_names(["main", "work"], sequence);
            builder
                .add(
                    &series,
                    &ProfileMeta::default(),
                    1_000 + 10 * sequence,
                    &tree,
                    Contribution::batch(marker(sequence), 1),
                )
                .unwrap();
        }
        let (bytes, _) = builder.finish().unwrap();
        write(files, id, bytes)
    }

    fn write(files: &Files, id: &str, bytes: Vec<u8>) -> Arc<BlockFile> {
        let name = BlockName {
            start: 1_000,
            span: 1_000,
            tenant: Tenant::new("anonymous").unwrap(),
            id: id.into(),
        };
        let len = bytes.len() as u64;
        files.put(&name, bytes).unwrap();
        Arc::new(files.open_block(&name, len).unwrap())
    }

    /// `inputs` merged into block `id`, which lists them as its sources.
    fn merged(files: &Files, id: &str, inputs: &[&Arc<BlockFile>]) -> Arc<BlockFile> {
        let limits = Limits::default();
        let bytes: Vec<Vec<u8>> = inputs.iter().map(|b| b.read(0..b.len).unwrap()).collect();
        let decoded = bytes
            .iter()
            .map(|b| MergeInput::decode(b.len() as u64, &Fetched::whole(b), &limits).unwrap())
            .collect();
        let options = MergeOptions {
            start: 1_000,
            span: 1_000,
            finest: None,
        };
        let mut merger = Merger::new(decoded, options, limits).unwrap();
        merger.set_sources(inputs.iter().map(|b| b.name.id.clone()).collect());
        let mut out = Vec::new();
        for series in 0..merger.series_count() {
            let chunks: Vec<Fetched<'_>> = merger
                .chunk_ranges(series)
                .into_iter()
                .map(|(input, _)| Fetched::whole(&bytes[input]))
                .collect();
            merger.merge_series(series, &chunks).unwrap();
            out.extend(merger.take_output());
        }
        out.extend(merger.finish().unwrap().0);
        write(files, id, out)
    }

    fn metrics() -> StoreMetrics {
        let metrics = crate::metrics::Metrics::new();
        StoreMetrics::new(metrics.registry(), &metrics.health)
    }

    fn files(dir: &Path) -> Files {
        let config = ObjectStoreConfig::Local(LocalConfig {
            path: dir.join("blocks"),
        });
        Files::open(&config, dir, &metrics()).unwrap()
    }

    /// The sum of what a read of `block` takes over its range, leaving out what `set` says.
    fn read_total(set: &BlockSet, block: &BlockFile) -> u64 {
        let limits = Limits::default();
        let bytes = block.read(0..block.len).unwrap();
        let chunk =
            smolder_block::SeriesChunk::decode(&block.index, 0, &Fetched::whole(&bytes), &limits)
                .unwrap();
        let planned = match set.skipped(&block.name.id) {
            Some(skip) => finest_without(&chunk, 1_000, 2_000, skip),
            None => chunk.plan(1_000, 2_000),
        };
        planned.iter().map(|&e| chunk.entries()[e].total).sum()
    }

    #[test]
    fn a_batch_two_cut_blocks_hold_is_read_from_the_smaller_name_only() {
        let dir = tempfile::tempdir().unwrap();
        let files = files(dir.path());
        let metrics = metrics();
        let (a, b) = (cut(&files, "aaaa", &[1, 2]), cut(&files, "bbbb", &[2, 3]));
        let mut set = BlockSet::default();
        set.insert(Arc::clone(&a));
        set.insert(Arc::clone(&b));
        let mut duplicates = Duplicates::default();
        duplicates.mark(&mut set, &metrics);
        assert!(set.skipped("aaaa").is_none());
        assert_eq!(set.skipped("bbbb").map(|s| s.len()), Some(1));
        assert_eq!(read_total(&set, &a) + read_total(&set, &b), 1 + 2 + 3);
        let counted = || {
            metrics
                .duplicate_batches
                .with_label_values(&["block"])
                .get()
        };
        assert_eq!(counted(), 1);
        // Compared once while both are there.
        duplicates.mark(&mut set, &metrics);
        assert_eq!(counted(), 1);
        // Once the other copy is gone, nothing is left out.
        set.remove(&["aaaa".to_owned()].into());
        duplicates.mark(&mut set, &metrics);
        assert!(set.skipped("bbbb").is_none());
        assert_eq!(read_total(&set, &b), 2 + 3);
    }

    /// The shown blocks' total over [1000, 2000), leaving out what `set` says.
    fn shown_total(set: &BlockSet) -> u64 {
        set.all().map(|b| read_total(set, b)).sum()
    }

    #[test]
    fn a_merged_block_keeps_its_copy_and_of_two_merges_holding_a_batch_one_shows() {
        let dir = tempfile::tempdir().unwrap();
        let files = files(dir.path());
        let metrics = metrics();
        let (a, b) = (cut(&files, "aaaa", &[1, 2]), cut(&files, "bbbb", &[2, 3]));
        let m = merged(&files, "maaa", &[&a]);
        let mut set = BlockSet::default();
        set.insert(Arc::clone(&m));
        set.insert(Arc::clone(&b));
        let mut duplicates = Duplicates::default();
        duplicates.mark(&mut set, &metrics);
        assert!(set.skipped("maaa").is_none());
        assert_eq!(read_total(&set, &m) + read_total(&set, &b), 1 + 2 + 3);

        // Two compactors merged one cut block each: one merge shows, and the other's input
        // (its copy of batch 2 left out) instead of the other merge.
        let n = merged(&files, "mbbb", &[&b]);
        let mut set = BlockSet::default();
        for block in [&a, &b, &m, &n] {
            set.insert(Arc::clone(block));
        }
        duplicates.mark(&mut set, &metrics);
        let shown: Vec<&str> = set.all().map(|b| b.name.id.as_str()).collect();
        assert_eq!(shown, ["bbbb", "maaa"]);
        let held: Vec<&str> = set
            .held
            .values()
            .flatten()
            .map(|b| b.name.id.as_str())
            .collect();
        assert_eq!(held, ["aaaa", "mbbb"]);
        assert_eq!(shown_total(&set), 1 + 2 + 3);
        assert_eq!(
            metrics
                .duplicate_batches
                .with_label_values(&["merge"])
                .get(),
            1
        );
        // Once the winner is gone, the other merge shows.
        set.remove(&["maaa".to_owned()].into());
        duplicates.mark(&mut set, &metrics);
        let shown: Vec<&str> = set.all().map(|b| b.name.id.as_str()).collect();
        assert_eq!(shown, ["aaaa", "mbbb"]);
        assert_eq!(shown_total(&set), 1 + 2 + 3);
    }
}
