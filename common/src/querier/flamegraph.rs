//! The stack forms of `querier.v1` answers, from trees: [`FlameGraph`] and [`FlameGraphDiff`]
//! (the flamebearer layout, built by [`Flamebearer`]), and Pyroscope's tree bytes.

use crate::flamebearer::Flamebearer;
use crate::tree::OTHER;
use crate::varint;
use crate::{CombinedTree, NodeId, Tree};

use super::messages::{FlameGraph, FlameGraphDiff, Level};

/// A value as protobuf's `int64`; sums past `i64::MAX` (reachable only by saturation) clamp.
fn int64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn levels(fb: &Flamebearer) -> Vec<Level> {
    fb.levels
        .iter()
        .map(|level| Level {
            values: level.iter().map(|&v| int64(v)).collect(),
        })
        .collect()
}

impl FlameGraph {
    /// `tree` laid out as Pyroscope lays it out, truncated to `max_nodes` (0: no limit).
    pub fn from_tree(tree: &Tree, max_nodes: usize) -> FlameGraph {
        let fb = Flamebearer::from_tree(tree, max_nodes);
        FlameGraph {
            levels: levels(&fb),
            total: int64(fb.num_ticks),
            max_self: int64(fb.max_self),
            names: fb.names,
        }
    }
}

impl FlameGraphDiff {
    /// The diff of `combined`, truncated to `max_nodes` (0: no limit).
    pub fn from_combined(combined: &CombinedTree, max_nodes: usize) -> FlameGraphDiff {
        let fb = Flamebearer::from_combined(combined, max_nodes);
        FlameGraphDiff {
            levels: levels(&fb),
            total: int64(fb.num_ticks),
            max_self: int64(fb.max_self),
            left_ticks: int64(combined.left_total()),
            right_ticks: int64(combined.right_total()),
            names: fb.names,
        }
    }
}

/// `tree` in Pyroscope's tree bytes (`PROFILE_FORMAT_TREE`, `pkg/model/tree.go`), truncated to
/// `max_nodes` (0: no limit) with the small children of each node folded into `other`.
///
/// The layout: nodes in depth-first order from a nameless root, each as a varint name length,
/// the name's bytes, a varint self value, and a varint number of children; the children
/// follow, last child first. An empty tree is no bytes.
pub fn tree_bytes(tree: &Tree, max_nodes: usize) -> Vec<u8> {
    if tree.is_empty() {
        return Vec::new();
    }
    let min = tree.min_value(max_nodes);
    let mut out = Vec::new();
    // A node, or the `other` remainder of a node's folded children.
    enum Item {
        Node(NodeId),
        Other(u64),
    }
    let mut pending = vec![Item::Node(NodeId::ROOT)];
    while let Some(item) = pending.pop() {
        let id = match item {
            Item::Other(value) => {
                write_node(&mut out, OTHER, value, 0);
                continue;
            }
            Item::Node(id) => id,
        };
        let node = tree.node(id);
        let name = if id == NodeId::ROOT { "" } else { node.name() };
        let mut kept = 0usize;
        let mut folded = 0u64;
        for child in node.children() {
            if child.total() >= min && child.name() != OTHER {
                pending.push(Item::Node(child.id()));
                kept += 1;
            } else {
                folded = folded.saturating_add(child.total());
            }
        }
        if folded != 0 {
            pending.push(Item::Other(folded));
            kept += 1;
        }
        write_node(&mut out, name, node.self_value(), kept);
    }
    out
}

fn write_node(out: &mut Vec<u8>, name: &str, self_value: u64, children: usize) {
    varint::put(out, name.len() as u64);
    out.extend_from_slice(name.as_bytes());
    varint::put(out, self_value);
    varint::put(out, children as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(stacks: &[(&str, u64)]) -> Tree {
        let mut tree = Tree::new();
        for (stack, value) in stacks {
            tree.insert_names(stack.split(';'), *value);
        }
        tree
    }

    /// Reads tree bytes back into folded stacks, as Pyroscope's `UnmarshalTree` walks them.
    fn read(mut bytes: &[u8]) -> Tree {
        fn varint(bytes: &mut &[u8]) -> u64 {
            let mut v = 0u64;
            for shift in (0..).step_by(7) {
                let b = bytes[0];
                *bytes = &bytes[1..];
                v |= u64::from(b & 0x7f) << shift;
                if b & 0x80 == 0 {
                    break;
                }
            }
            v
        }
        let mut out = Tree::new();
        // The path of each pending child's parent.
        let mut parents: Vec<Vec<String>> = vec![Vec::new()];
        let mut first = true;
        while let Some(parent) = parents.pop() {
            let len = varint(&mut bytes) as usize;
            let name = std::str::from_utf8(&bytes[..len]).unwrap().to_owned();
            bytes = &bytes[len..];
            let self_value = varint(&mut bytes);
            let children = varint(&mut bytes);
            let mut path = parent;
            if !first {
                path.push(name);
            }
            first = false;
            out.insert_names(&path, self_value);
            for _ in 0..children {
                parents.push(path.clone());
            }
        }
        assert!(bytes.is_empty());
        out
    }

    #[test]
    fn flame_graph_is_the_flamebearer_layout() {
        let t = tree(&[("foo;bar", 2), ("foo;baz", 3), ("foo", 1), ("qux", 4)]);
        let fg = FlameGraph::from_tree(&t, 8192);
        assert_eq!(fg.names, ["total", "qux", "foo", "baz", "bar"]);
        assert_eq!(fg.levels[2].values, [1, 2, 2, 4, 0, 3, 3, 3]);
        assert_eq!((fg.total, fg.max_self), (10, 4));
    }

    #[test]
    fn diff_carries_both_totals() {
        let left = tree(&[("a;b", 2), ("a;c", 2)]);
        let right = tree(&[("a;b", 6), ("a;c", 2)]);
        let fg = FlameGraphDiff::from_combined(&Tree::combine(&left, &right), 8192);
        assert_eq!(
            fg.levels[2].values,
            [0, 2, 2, 0, 6, 6, 3, 0, 2, 2, 0, 2, 2, 2]
        );
        assert_eq!((fg.total, fg.left_ticks, fg.right_ticks), (12, 4, 8));
    }

    #[test]
    fn tree_bytes_read_back() {
        let t = tree(&[
            ("foo;bar", 2),
            ("foo;baz", 3),
            ("foo", 1),
            ("qux", 4),
            ("qux;x;y", 7),
        ]);
        assert_eq!(read(&tree_bytes(&t, 0)), t);
        assert!(tree_bytes(&Tree::new(), 0).is_empty());
        let truncated = read(&tree_bytes(
            &tree(&[("a;big", 50), ("a;s1", 1), ("a;s2", 2)]),
            3,
        ));
        assert_eq!(truncated, tree(&[("a;big", 50), ("a;other", 3)]));
    }
}
