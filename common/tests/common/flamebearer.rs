//! Properties of the flame-graph layout: it reads back to the tree it was made from, and its
//! truncation is the tree's. [`read_back`] is the test's oracle, Pyroscope's `ProfileToTree`:
//! the layout's inverse, which nothing but these tests needs.

use proptest::prelude::*;
use smolder_common::flamebearer::Flamebearer;
use smolder_common::{FrameId, Tree};

use crate::util::{stacks, tree_from};

/// The values of one bar of a single flame graph: x delta, total, self, name index.
const SINGLE_WIDTH: usize = 4;

/// Why a flamebearer does not read back into a tree.
#[derive(Debug, PartialEq, Eq)]
enum ReadBackError {
    /// A level's length is not a multiple of the bar width.
    RaggedLevel { level: usize },
    /// A bar names an index outside `names`.
    BadName { index: u64 },
    /// A bar lies outside every bar of the level above.
    Orphan { level: usize },
    /// Offsets overflow when decoded.
    Overflow,
}

/// Reads a single-format flamebearer back into a tree.
fn read_back(fb: &Flamebearer) -> Result<Tree, ReadBackError> {
    let mut tree = Tree::new();
    // Per level: each bar's decoded x and total, and the stack it ends.
    let mut above: Vec<(u64, u64)> = Vec::new();
    let mut stacks: Vec<Vec<FrameId>> = Vec::new();
    for (level, values) in fb.levels.iter().enumerate() {
        if values.len() % SINGLE_WIDTH != 0 {
            return Err(ReadBackError::RaggedLevel { level });
        }
        let mut current = Vec::new();
        let mut current_stacks = Vec::new();
        let (mut end, mut parent) = (0u64, 0usize);
        for chunk in values.chunks_exact(SINGLE_WIDTH) {
            let [gap, total, self_value, index] = [chunk[0], chunk[1], chunk[2], chunk[3]];
            let x = end.checked_add(gap).ok_or(ReadBackError::Overflow)?;
            end = x.checked_add(total).ok_or(ReadBackError::Overflow)?;
            let name = fb
                .names
                .get(usize::try_from(index).unwrap_or(usize::MAX))
                .ok_or(ReadBackError::BadName { index })?;
            if level == 0 {
                tree.insert(&[], self_value);
                current.push((x, total));
                current_stacks.push(Vec::new());
                continue;
            }
            // Bars are sorted by x, so the parent index only moves right.
            while parent < above.len() && above[parent].0.saturating_add(above[parent].1) <= x {
                parent += 1;
            }
            if parent == above.len() || above[parent].0 > x {
                return Err(ReadBackError::Orphan { level });
            }
            let mut stack = stacks[parent].clone();
            stack.push(tree.intern(name));
            tree.insert(&stack, self_value);
            current.push((x, total));
            current_stacks.push(stack);
        }
        above = current;
        stacks = current_stacks;
    }
    Ok(tree)
}

#[test]
fn read_back_reverses_from_tree() {
    let t = tree_from(&[
        (vec!["foo", "bar"], 2),
        (vec!["foo", "baz"], 3),
        (vec!["foo"], 1),
        (vec!["qux"], 4),
        (vec!["qux", "x", "y"], 7),
    ]);
    assert_eq!(read_back(&Flamebearer::from_tree(&t, 0)).unwrap(), t);
}

#[test]
fn read_back_rejects_malformed_levels() {
    let one = tree_from(&[(vec!["a", "b"], 1)]);
    let mut fb = Flamebearer::from_tree(&one, 0);
    fb.levels[1].push(0);
    assert_eq!(read_back(&fb), Err(ReadBackError::RaggedLevel { level: 1 }));
    let mut fb = Flamebearer::from_tree(&one, 0);
    fb.levels[2][3] = 99;
    assert_eq!(read_back(&fb), Err(ReadBackError::BadName { index: 99 }));
    let mut fb = Flamebearer::from_tree(&one, 0);
    fb.levels[2][0] = 5;
    assert_eq!(read_back(&fb), Err(ReadBackError::Orphan { level: 2 }));
}

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
        prop_assert_eq!(read_back(&fb).expect("own layout reads back"), tree);
    }

    #[test]
    fn truncated_layout_is_the_truncated_tree(tree in modest_tree(), max_nodes in 1usize..20) {
        let fb = Flamebearer::from_tree(&tree, max_nodes);
        prop_assert_eq!(fb.num_ticks, tree.total());
        prop_assert_eq!(read_back(&fb).expect("own layout reads back"), tree.truncate(max_nodes));
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
