//! Deltas of cumulative profiles: what a target allocated (or waited on locks) since its
//! previous scrape.
//!
//! Input: each scrape's trees of cumulative sample types (`alloc_*`, `contentions`, `delay`),
//! keyed by sample type and pprof labels. Output: a [`Delta`] per tree. Owned by one scrape
//! loop, so the state is per target. Pure: no I/O, no clock.
//!
//! The first tree of a key only primes the state. A later tree yields itself minus the
//! previous one, stack by stack ([`Tree::subtract`], which clamps at zero). A tree whose total
//! is lower than the previous one means the counters restarted (the process restarted): it
//! primes again and yields nothing, rather than a delta that would mix two processes. Keys
//! absent from a scrape are forgotten, so the state holds at most one scrape's trees.

use std::collections::{HashMap, HashSet};

use smolder_common::Tree;

/// Which series of a target's profile a tree belongs to: the pprof sample type and the sample
/// labels.
pub type DeltaKey = (String, Vec<(String, String)>);

/// What one cumulative tree gives.
#[derive(Debug, PartialEq)]
pub enum Delta {
    /// The first tree of its key: nothing to subtract from yet.
    Primed,
    /// The total went down: the counters restarted; primed again.
    Reset,
    /// The share since the previous scrape.
    Ready(Tree),
}

/// The previous tree of every cumulative series of one target.
#[derive(Debug, Default)]
pub struct Deltas {
    previous: HashMap<DeltaKey, Tree>,
    seen: HashSet<DeltaKey>,
}

impl Deltas {
    /// Empty state: the next tree of every key primes.
    pub fn new() -> Self {
        Deltas::default()
    }

    /// The delta of `tree` against the previous tree of `key`, which `tree` replaces.
    pub fn handle(&mut self, key: DeltaKey, tree: Tree) -> Delta {
        self.seen.insert(key.clone());
        let delta = match self.previous.get(&key) {
            None => Delta::Primed,
            Some(previous) if tree.total() < previous.total() => Delta::Reset,
            Some(previous) => Delta::Ready(tree.subtract(previous)),
        };
        self.previous.insert(key, tree);
        delta
    }

    /// Ends a scrape: forgets the keys it did not [`handle`](Self::handle).
    pub fn end_scrape(&mut self) {
        let seen = std::mem::take(&mut self.seen);
        self.previous.retain(|key, _| seen.contains(key));
    }

    /// The number of series held.
    pub fn len(&self) -> usize {
        self.previous.len()
    }

    /// Whether no series is held.
    pub fn is_empty(&self) -> bool {
        self.previous.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(stacks: &[(&[&str], u64)]) -> Tree {
        let mut tree = Tree::new();
        for (stack, value) in stacks {
            tree.insert_names(stack.iter().copied(), *value);
        }
        tree
    }

    fn key(sample_type: &str) -> DeltaKey {
        (sample_type.to_owned(), Vec::new())
    }

    #[test]
    fn first_primes_then_deltas_then_reset_primes_again() {
        let mut deltas = Deltas::new();
        let first = tree(&[(&["main", "alloc"], 100), (&["main", "other"], 10)]);
        assert_eq!(deltas.handle(key("alloc_space"), first), Delta::Primed);
        deltas.end_scrape();
        let second = tree(&[(&["main", "alloc"], 160), (&["main", "other"], 10)]);
        let Delta::Ready(delta) = deltas.handle(key("alloc_space"), second) else {
            panic!("expected a delta");
        };
        assert_eq!(delta.total(), 60);
        deltas.end_scrape();
        let restarted = tree(&[(&["main", "alloc"], 5)]);
        assert_eq!(deltas.handle(key("alloc_space"), restarted), Delta::Reset);
        deltas.end_scrape();
        let after = tree(&[(&["main", "alloc"], 25)]);
        let Delta::Ready(delta) = deltas.handle(key("alloc_space"), after) else {
            panic!("expected a delta");
        };
        assert_eq!(delta.total(), 20);
    }

    #[test]
    fn keys_missing_from_a_scrape_are_forgotten() {
        let mut deltas = Deltas::new();
        deltas.handle(key("a"), tree(&[(&["x"], 1)]));
        deltas.handle(key("b"), tree(&[(&["x"], 1)]));
        deltas.end_scrape();
        deltas.handle(key("a"), tree(&[(&["x"], 2)]));
        deltas.end_scrape();
        assert_eq!(deltas.len(), 1);
        assert_eq!(deltas.handle(key("b"), tree(&[(&["x"], 3)])), Delta::Primed);
    }
}
