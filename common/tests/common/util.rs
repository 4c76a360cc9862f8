//! Shared generators: random trees over a small alphabet, so that prefixes collide, and trees
//! from the synthetic corpus.

use std::collections::HashMap;

use proptest::prelude::*;
use smolder_common::{Corpus, CorpusConfig, Tree};

/// Frame names for random stacks: few, so that stacks share prefixes; with an empty name, a
/// space and a prefix pair (`a`, `ab`), which are the cases that parsers and orderings get wrong.
pub(crate) const ALPHABET: [&str; 8] = ["main", "a", "ab", "b", "", "gc", "json.Marshal", "x y"];

/// A value: mostly small, sometimes zero, sometimes large enough to saturate a sum.
pub(crate) fn value() -> impl Strategy<Value = u64> {
    prop_oneof![
        8 => 1u64..1_000,
        1 => Just(0u64),
        1 => (u64::MAX / 4)..=u64::MAX,
    ]
}

/// Stacks over [`ALPHABET`], root first, with values; `min_depth` 0 allows the root's self.
pub(crate) fn stacks(min_depth: usize) -> impl Strategy<Value = Vec<(Vec<&'static str>, u64)>> {
    let stack = prop::collection::vec(prop::sample::select(&ALPHABET[..]), min_depth..6);
    prop::collection::vec((stack, value()), 0..40)
}

/// A tree built from [`stacks`].
pub(crate) fn tree_from(stacks: &[(Vec<&'static str>, u64)]) -> Tree {
    let mut tree = Tree::new();
    for (stack, value) in stacks {
        tree.insert_names(stack, *value);
    }
    tree
}

/// Random trees over [`ALPHABET`], including a self value on the root.
pub(crate) fn alphabet_tree() -> impl Strategy<Value = Tree> {
    stacks(0).prop_map(|s| tree_from(&s))
}

/// Trees drawn from small synthetic corpora with random seeds and sample counts.
pub(crate) fn corpus_tree() -> impl Strategy<Value = Tree> {
    (any::<u64>(), 1usize..2_000, 0u64..4).prop_map(|(seed, samples, stream)| {
        let corpus = Corpus::generate(&CorpusConfig {
            seed,
            unique_stacks: 60,
            min_depth: 1,
            max_depth: 8,
            functions: 30,
            ..CorpusConfig::default()
        });
        corpus.tree(samples, stream)
    })
}

/// Either kind of tree.
pub(crate) fn any_tree() -> impl Strategy<Value = Tree> {
    prop_oneof![3 => alphabet_tree(), 1 => corpus_tree()]
}

/// Every node's total, keyed by its path of names from the root (the root is the empty path).
pub(crate) fn node_totals(tree: &Tree) -> HashMap<Vec<String>, u64> {
    let mut totals = HashMap::new();
    let mut pending = vec![(tree.root(), Vec::new())];
    while let Some((node, path)) = pending.pop() {
        for child in node.children() {
            let mut child_path = path.clone();
            child_path.push(child.name().to_string());
            pending.push((child, child_path));
        }
        totals.insert(path, node.total());
    }
    totals
}
