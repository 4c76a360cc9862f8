//! Properties of the stack tree: encoding round trips, merge algebra, truncation.

use proptest::prelude::*;
use smolder_common::Tree;
use smolder_common::tree::OTHER;

use crate::util::{any_tree, node_totals};

proptest! {
    #[test]
    fn encode_decode_round_trips(tree in any_tree()) {
        let bytes = tree.encode();
        let back = Tree::decode(&bytes).expect("own encoding decodes");
        prop_assert_eq!(&back, &tree);
        prop_assert_eq!(back.encode(), bytes, "encoding is canonical");
    }

    #[test]
    fn merge_is_commutative(a in any_tree(), b in any_tree()) {
        let mut ab = a.clone();
        ab.merge(&b);
        let mut ba = b.clone();
        ba.merge(&a);
        prop_assert_eq!(ab, ba);
    }

    #[test]
    fn merge_is_associative(a in any_tree(), b in any_tree(), c in any_tree()) {
        let mut left = a.clone();
        left.merge(&b);
        left.merge(&c);
        let mut bc = b.clone();
        bc.merge(&c);
        let mut right = a.clone();
        right.merge(&bc);
        prop_assert_eq!(left, right);
    }

    #[test]
    fn merging_the_empty_tree_changes_nothing(a in any_tree()) {
        let mut merged = a.clone();
        merged.merge(&Tree::new());
        prop_assert_eq!(&merged, &a);
        let mut empty = Tree::new();
        empty.merge(&a);
        prop_assert_eq!(&empty, &a);
    }

    #[test]
    fn truncation_conserves_the_total_and_keeps_the_largest(
        tree in any_tree(),
        max_nodes in 0usize..30,
    ) {
        let cut = tree.truncate(max_nodes);
        prop_assert_eq!(cut.total(), tree.total());
        let before = node_totals(&tree);
        let after = node_totals(&cut);
        let mut smallest_kept = u64::MAX;
        for (path, total) in &after {
            if path.is_empty() || path.last().is_some_and(|name| name == OTHER) {
                continue;
            }
            prop_assert_eq!(Some(total), before.get(path), "kept node {:?} keeps its total", path);
            smallest_kept = smallest_kept.min(*total);
        }
        for (path, total) in &before {
            if !after.contains_key(path) {
                prop_assert!(
                    *total <= smallest_kept,
                    "dropped {:?} ({}) is larger than a kept node ({})", path, total, smallest_kept
                );
            }
        }
    }

    #[test]
    fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = Tree::decode(&bytes);
    }

    #[test]
    fn decode_never_panics_on_damaged_encodings(
        tree in any_tree(),
        damage in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = tree.encode();
        for (index, byte) in damage {
            let i = index.index(bytes.len());
            bytes[i] = byte;
        }
        let _ = Tree::decode(&bytes);
        let _ = Tree::decode(&bytes[..cut.index(bytes.len() + 1)]);
    }
}
