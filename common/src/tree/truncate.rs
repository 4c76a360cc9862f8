//! Truncation to a node budget, the way Pyroscope does it.
//!
//! Pyroscope finds `minVal`, the total of roughly the `max_nodes`-th largest node, then keeps
//! every node whose total reaches it and folds the other children of each kept node into one
//! child named [`OTHER`](super::OTHER). Ties at `minVal` are all kept, so a result can exceed the
//! budget slightly; the root total is always conserved.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{NodeId, OTHER, Tree};

/// The `k` largest totals seen so far: Pyroscope's capped array, as a min-heap.
pub(crate) struct TopTotals {
    capacity: usize,
    heap: BinaryHeap<Reverse<u64>>,
}

impl TopTotals {
    /// Keeps the `capacity` largest totals; a capacity of 0 keeps none and means "no limit".
    pub(crate) fn new(capacity: usize) -> Self {
        TopTotals {
            capacity,
            heap: BinaryHeap::new(),
        }
    }

    /// Offers a total. Returns false when it is too small to be kept, in which case nothing
    /// below the node it came from can be kept either (a child's total never exceeds its
    /// parent's), so the caller skips that subtree.
    pub(crate) fn push(&mut self, total: u64) -> bool {
        if self.capacity == 0 {
            return false;
        }
        if self.heap.len() < self.capacity {
            self.heap.push(Reverse(total));
            return true;
        }
        match self.heap.peek() {
            Some(&Reverse(min)) if total > min => {
                self.heap.pop();
                self.heap.push(Reverse(total));
                true
            }
            _ => false,
        }
    }

    /// The smallest total a node needs to be kept.
    pub(crate) fn min_value(&self) -> u64 {
        self.heap.peek().map_or(0, |&Reverse(min)| min)
    }
}

impl Tree {
    /// The smallest total a node needs to survive truncation to `max_nodes`; 0 when `max_nodes`
    /// is 0 (no limit).
    pub(crate) fn min_value(&self, max_nodes: usize) -> u64 {
        let mut top = TopTotals::new(max_nodes);
        let mut pending = vec![NodeId::ROOT.0];
        while let Some(node) = pending.pop() {
            if top.push(self.nodes[node as usize].total) {
                pending.extend(self.node(NodeId(node)).children().map(|c| c.id));
            }
        }
        top.min_value()
    }

    /// A copy of the tree holding about `max_nodes` nodes: the largest ones by total, with the
    /// rest of each kept node's children folded into one child named `other`. A `max_nodes` of
    /// 0 means no limit. The root total is unchanged.
    ///
    /// This is what Pyroscope's flame graphs do at query time; Smolder also uses it to bound what
    /// is stored and shipped.
    pub fn truncate(&self, max_nodes: usize) -> Tree {
        let min = self.min_value(max_nodes);
        if min == 0 {
            return self.clone();
        }
        let order = self.ordered();
        let mut out = Tree::new();
        out.nodes[0].self_value = self.nodes[0].self_value;
        out.nodes[0].total = self.nodes[0].total;
        let mut pending = vec![(NodeId::ROOT.0, NodeId::ROOT.0)];
        while let Some((source, target)) = pending.pop() {
            let mut folded = 0u64;
            for &child in order.children(source) {
                let node = &self.nodes[child as usize];
                let name = self.frames.name(super::FrameId(node.frame));
                if node.total >= min && name != OTHER {
                    let frame = out.frames.intern(name).0;
                    let copy = out.push_child(target, frame);
                    out.nodes[copy as usize].self_value = node.self_value;
                    out.nodes[copy as usize].total = node.total;
                    pending.push((child, copy));
                } else {
                    folded = folded.saturating_add(node.total);
                }
            }
            if folded > 0 {
                let frame = out.frames.intern(OTHER).0;
                let other = out.push_child(target, frame);
                out.nodes[other as usize].self_value = folded;
                out.nodes[other as usize].total = folded;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_totals_keeps_the_largest() {
        let mut top = TopTotals::new(3);
        for total in [5, 1, 9, 7, 3, 8] {
            top.push(total);
        }
        assert_eq!(top.min_value(), 7);
        assert!(!top.push(7));
        assert!(top.push(100));
        assert_eq!(top.min_value(), 8);
    }

    #[test]
    fn truncate_folds_small_children_into_other() {
        let mut tree = Tree::new();
        tree.insert_names(["a", "big"], 50);
        tree.insert_names(["a", "s1"], 1);
        tree.insert_names(["a", "s2"], 2);
        tree.insert_names(["b"], 10);
        // root 63, a 53, big 50, b 10: minVal is 10 with four nodes.
        let cut = tree.truncate(4);
        assert_eq!(cut.total(), tree.total());
        let mut lines = Vec::new();
        cut.for_each_stack(|stack, value| {
            let names: Vec<&str> = stack.iter().map(|&f| cut.frames().name(f)).collect();
            lines.push(format!("{} {value}", names.join(";")));
        });
        assert_eq!(lines, ["a;big 50", "a;other 3", "b 10"]);
    }

    #[test]
    fn no_limit_keeps_everything() {
        let mut tree = Tree::new();
        tree.insert_names(["a"], 1);
        tree.insert_names(["b"], 1);
        assert_eq!(tree.truncate(0), tree);
        assert_eq!(tree.truncate(100), tree);
    }
}
