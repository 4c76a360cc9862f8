//! Which of the bucket's blocks reads show when merges overlap (object-storage mode).
//!
//! Input: every block an aggregator knows of a tenant, each with its *leaves* (the cut blocks
//! it holds the data of: itself for a cut, the cut blocks among its sources for a merge), and
//! a test for two merges holding one batch; output: which of them reads show. Pure: called by
//! `dedupe.rs` whenever the published set changes, and by the sync loop and compaction to see
//! what a listing would show. Nothing here runs in local mode, where one writer publishes a
//! merge in place of its inputs and deletes them at once.
//!
//! Two compactors that see a range differently (a late block listed by one only, an election
//! or lease that two aggregators read differently for a moment) write two merges whose leaves
//! overlap, or that hold one batch an agent sent to two aggregators. Every aggregator resolves
//! that alike, from names and sources only: blocks in order of most leaves, then most sources
//! (a merge of one block, which downsamples it, before that block), then name; a block
//! is shown unless it conflicts with one shown before it (a leaf in common, or, for two
//! merges, a batch in common), else it is hidden and its inputs that are still in the bucket
//! show instead, as far as no shown block holds their leaves. So every leaf's data is shown
//! once, by the one shown block that holds it, as long as the blocks a hidden merge replaced
//! are still there: a compactor deletes a block only once it has been hidden for
//! `compaction-grace`, and a merge that would hide a block older than half the grace aborts
//! its upload (`compact.rs`), so a block whose inputs may be gone is never hidden again.

use std::collections::{BTreeSet, HashSet};

use super::files::BlockName;

/// Whether block `id` is a merge's (merged blocks' ids are `m` and a hash of their inputs; cut
/// blocks' are hexadecimal, migrated blocks' start `v01-`).
pub(crate) fn is_merge(id: &str) -> bool {
    id.starts_with('m')
}

/// The leaves of block `id` with `sources`: itself when it has none (a cut), else the cut
/// blocks among its sources (which list their inputs' sources too).
pub(crate) fn leaves(id: &str, sources: &[String]) -> BTreeSet<String> {
    if sources.is_empty() {
        BTreeSet::from([id.to_owned()])
    } else {
        sources.iter().filter(|s| !is_merge(s)).cloned().collect()
    }
}

/// What resolution knows of one block.
#[derive(Clone, Copy)]
pub(crate) struct Candidate<'a> {
    pub(crate) name: &'a BlockName,
    pub(crate) leaves: &'a BTreeSet<String>,
    /// How many blocks its sources name: a block that replaces another names more.
    pub(crate) sources: usize,
}

impl Candidate<'_> {
    fn merged(&self) -> bool {
        is_merge(&self.name.id)
    }
}

/// Which of `candidates` (one tenant's) reads show, by position: see the
/// [module documentation](self). `common(i, j)` says whether merged blocks `i` and `j`, whose
/// ranges overlap, hold a batch in common.
pub(crate) fn resolve(
    candidates: &[Candidate<'_>],
    mut common: impl FnMut(usize, usize) -> bool,
) -> Vec<bool> {
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&candidates[a], &candidates[b]);
        b.leaves
            .len()
            .cmp(&a.leaves.len())
            .then_with(|| b.sources.cmp(&a.sources))
            .then_with(|| a.name.cmp(b.name))
    });
    let mut shown = vec![false; candidates.len()];
    let mut covered: HashSet<&str> = HashSet::new();
    let mut shown_merges: Vec<usize> = Vec::new();
    for i in order {
        let block = &candidates[i];
        if block
            .leaves
            .iter()
            .any(|leaf| covered.contains(leaf.as_str()))
        {
            continue;
        }
        if block.merged()
            && shown_merges.iter().any(|&j| {
                let other = candidates[j].name;
                other.start < block.name.end() && block.name.start < other.end() && common(i, j)
            })
        {
            continue;
        }
        shown[i] = true;
        covered.extend(block.leaves.iter().map(String::as_str));
        if block.merged() {
            shown_merges.push(i);
        }
    }
    shown
}

/// The blocks a merge about to be published would displace: shown by the resolution
/// `without` it, hidden by the one `with` it, and holding a leaf the merge (whose leaves are
/// `output`) does not. Once such a block is old its inputs may be deleted already, so the merge
/// must not be published (`compact.rs`).
pub(crate) fn displaced<'a>(
    without: &[(Candidate<'a>, bool)],
    with: &[(Candidate<'a>, bool)],
    output: &BTreeSet<String>,
) -> Vec<&'a BlockName> {
    let shown_before: HashSet<&BlockName> = without
        .iter()
        .filter(|(_, shown)| *shown)
        .map(|(c, _)| c.name)
        .collect();
    with.iter()
        .filter(|(c, shown)| !shown && shown_before.contains(c.name))
        .filter(|(c, _)| !c.leaves.is_subset(output))
        .map(|(c, _)| c.name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::Tenant;

    fn name(id: &str, start: u64, span: u64) -> BlockName {
        BlockName {
            start,
            span,
            tenant: Tenant::new("anonymous").unwrap(),
            id: id.into(),
        }
    }

    /// A block's name, leaves and number of sources.
    type Block = (BlockName, BTreeSet<String>, usize);

    /// Blocks (id, span, sources) over a range starting at 10 000.
    fn blocks(specs: &[(&str, u64, &[&str])]) -> Vec<Block> {
        specs
            .iter()
            .map(|(id, span, sources)| {
                let sources: Vec<String> = sources.iter().map(|s| (*s).to_owned()).collect();
                (name(id, 10_000, *span), leaves(id, &sources), sources.len())
            })
            .collect()
    }

    fn candidates(blocks: &[Block]) -> Vec<Candidate<'_>> {
        blocks
            .iter()
            .map(|(name, leaves, sources)| Candidate {
                name,
                leaves,
                sources: *sources,
            })
            .collect()
    }

    fn shown(blocks: &[Block], common: &[(&str, &str)]) -> BTreeSet<String> {
        let result = resolve(&candidates(blocks), |i, j| {
            let (a, b) = (&blocks[i].0.id, &blocks[j].0.id);
            common
                .iter()
                .any(|(x, y)| (a == x && b == y) || (a == y && b == x))
        });
        blocks
            .iter()
            .zip(result)
            .filter(|(_, shown)| *shown)
            .map(|((name, _, _), _)| name.id.clone())
            .collect()
    }

    fn ids(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Every leaf is held by exactly one shown block (the exactness the resolution promises).
    fn each_leaf_once(blocks: &[Block], shown: &BTreeSet<String>) {
        let mut held = BTreeSet::new();
        for (name, leaves, _) in blocks.iter().filter(|(n, _, _)| shown.contains(&n.id)) {
            for leaf in leaves {
                assert!(held.insert(leaf.clone()), "{leaf} twice (in {name})");
            }
        }
        let all: BTreeSet<String> = blocks
            .iter()
            .filter(|(n, _, _)| !is_merge(&n.id))
            .map(|(n, _, _)| n.id.clone())
            .collect();
        assert!(all.is_subset(&held), "a present leaf is shown nowhere");
    }

    #[test]
    fn a_merge_hides_its_inputs_and_a_merge_of_more_wins() {
        // One compactor merged x and y; another, which saw the late z too, merged all three.
        let set = blocks(&[
            ("aaaa", 1_000, &[]),
            ("bbbb", 1_000, &[]),
            ("cccc", 1_000, &[]),
            ("m01", 10_000, &["aaaa", "bbbb"]),
            ("m02", 10_000, &["aaaa", "bbbb", "cccc"]),
        ]);
        let result = shown(&set, &[]);
        assert_eq!(result, ids(&["m02"]));
        each_leaf_once(&set, &result);
        // Without the larger merge, the smaller one and the late block.
        let result = shown(&set[..4], &[]);
        assert_eq!(result, ids(&["cccc", "m01"]));
        each_leaf_once(&set[..4], &result);
    }

    #[test]
    fn two_merges_of_overlapping_inputs_show_one_and_the_rest_of_the_other() {
        let set = blocks(&[
            ("aaaa", 1_000, &[]),
            ("bbbb", 1_000, &[]),
            ("cccc", 1_000, &[]),
            ("m02", 10_000, &["bbbb", "cccc"]),
            ("m01", 10_000, &["aaaa", "bbbb"]),
        ]);
        // As many leaves: the smaller name wins; the other's input not in it shows.
        let result = shown(&set, &[]);
        assert_eq!(result, ids(&["cccc", "m01"]));
        each_leaf_once(&set, &result);
        // A merge of merges covers them, and every block below it.
        let mut upper = set.clone();
        upper.extend(blocks(&[(
            "m03",
            100_000,
            &["m01", "aaaa", "bbbb", "cccc"],
        )]));
        assert_eq!(shown(&upper, &[]), ids(&["m03"]));
    }

    #[test]
    fn a_merge_of_one_block_shows_in_its_place() {
        // A range's one block merged alone (to the range's span, or downsampled), then that
        // merge downsampled again: each replaces the one before, whose leaves are the same.
        let set = blocks(&[
            ("ffff", 1_000, &[]),
            ("m01", 10_000, &["ffff"]),
            ("m02", 10_000, &["m01", "ffff"]),
        ]);
        assert_eq!(shown(&set, &[]), ids(&["m02"]));
        assert_eq!(shown(&set[..2], &[]), ids(&["m01"]));
    }

    #[test]
    fn two_merges_holding_one_batch_show_one() {
        // Two aggregators accepted one batch and cut it into their own blocks; two compactors
        // merged one each.
        let set = blocks(&[
            ("aaaa", 1_000, &[]),
            ("bbbb", 1_000, &[]),
            ("m01", 10_000, &["aaaa"]),
            ("m02", 10_000, &["bbbb"]),
        ]);
        let result = shown(&set, &[("m01", "m02")]);
        // The loser's input shows (reads leave its copy of the batch out: dedupe.rs).
        assert_eq!(result, ids(&["bbbb", "m01"]));
        assert_eq!(shown(&set, &[]), ids(&["m01", "m02"]));
    }

    #[test]
    fn a_merge_that_would_hide_another_merges_leaves_is_told() {
        let set = blocks(&[
            ("aaaa", 1_000, &[]),
            ("bbbb", 1_000, &[]),
            ("cccc", 1_000, &[]),
            ("m01", 10_000, &["aaaa", "bbbb"]),
            ("m00", 10_000, &["bbbb", "cccc"]),
        ]);
        let with = candidates(&set);
        let with_shown = resolve(&with, |_, _| false);
        let without = candidates(&set[..4]);
        let without_shown = resolve(&without, |_, _| false);
        let output = set[4].1.clone();
        let before: Vec<_> = without.into_iter().zip(without_shown).collect();
        let after: Vec<_> = with.into_iter().zip(with_shown).collect();
        let displaced = displaced(&before, &after, &output);
        // m00 wins by name and hides m01, whose leaf aaaa then shows by itself: m01 is told.
        assert_eq!(
            displaced.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(),
            ["m01"]
        );
    }
}
