//! Properties of the flame-graph layout: it reads back to the tree it was made from, and its
//! truncation is the tree's.

use proptest::prelude::*;
use smolder_common::Tree;
use smolder_common::flamebearer::Flamebearer;

use crate::util::{stacks, tree_from};

/// Trees whose values stay far from saturation, so that offsets are exact.
fn modest_tree() -> impl Strategy<Value = Tree> {
    stacks(0).prop_map(|stacks| {
        let modest: Vec<_> = stacks
            .into_iter()
            .map(|(stack, value)| (stack, value % 1_000))
            .collect();
        tree_from(&modest)
    })
}

proptest! {
    #[test]
    fn layout_reads_back_to_the_tree(tree in modest_tree()) {
        let fb = Flamebearer::from_tree(&tree, 0);
        prop_assert_eq!(fb.num_ticks, tree.total());
        prop_assert_eq!(fb.to_tree().expect("own layout reads back"), tree);
    }

    #[test]
    fn truncated_layout_is_the_truncated_tree(tree in modest_tree(), max_nodes in 1usize..20) {
        let fb = Flamebearer::from_tree(&tree, max_nodes);
        prop_assert_eq!(fb.num_ticks, tree.total());
        prop_assert_eq!(fb.to_tree().expect("own layout reads back"), tree.truncate(max_nodes));
    }

    #[test]
    fn diff_roots_hold_both_totals(left in modest_tree(), right in modest_tree(), max_nodes in 0usize..20) {
        let fb = Flamebearer::from_combined(&Tree::combine(&left, &right), max_nodes);
        prop_assert_eq!(fb.num_ticks, left.total() + right.total());
        prop_assert_eq!(&fb.names[0], "total");
        let root = &fb.levels[0];
        prop_assert_eq!(root.len(), 7);
        prop_assert_eq!((root[1], root[4]), (left.total(), right.total()));
        for level in &fb.levels {
            prop_assert_eq!(level.len() % 7, 0);
        }
    }
}
