//! Two trees aligned node for node, for a diff.

use super::{FrameId, Frames, NONE, NodeId, Ordered, Tree};

/// Self and total of one side of a [`CombinedTree`] node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Side {
    /// What was sampled with this frame as the leaf.
    pub self_value: u64,
    /// Self plus the totals of all children.
    pub total: u64,
}

/// One node of a [`CombinedTree`].
#[derive(Clone, Debug)]
pub struct CombinedNode {
    frame: u32,
    first_child: u32,
    next_sibling: u32,
    /// The left (base) tree's values; zero where the node exists only on the right.
    pub left: Side,
    /// The right (comparison) tree's values; zero where the node exists only on the left.
    pub right: Side,
}

/// Two trees with the same shape: every node of either exists in both, with zero values on the
/// side that lacked it. This is Pyroscope's `CombineTree`, the input of a diff flame graph.
///
/// Children are kept in byte-wise name order.
#[derive(Clone, Debug)]
pub struct CombinedTree {
    frames: Frames,
    /// `nodes[0]` is the root.
    nodes: Vec<CombinedNode>,
}

impl Tree {
    /// Aligns `left` and `right` for a diff; see [`CombinedTree`].
    pub fn combine(left: &Tree, right: &Tree) -> CombinedTree {
        let orders = (left.ordered(), right.ordered());
        let mut out = CombinedTree {
            frames: Frames::default(),
            nodes: vec![CombinedNode {
                frame: NONE,
                first_child: NONE,
                next_sibling: NONE,
                left: side(left, Some(NodeId::ROOT.0)),
                right: side(right, Some(NodeId::ROOT.0)),
            }],
        };
        let mut pending = vec![(Some(NodeId::ROOT.0), Some(NodeId::ROOT.0), NodeId::ROOT.0)];
        while let Some((l, r, target)) = pending.pop() {
            out.combine_children(left, right, &orders, (l, r), target, &mut pending);
        }
        out
    }
}

type Pending = Vec<(Option<u32>, Option<u32>, u32)>;

impl CombinedTree {
    /// Adds the union of the children of `l` and `r` under `target`, in name order.
    fn combine_children(
        &mut self,
        left: &Tree,
        right: &Tree,
        orders: &(Ordered, Ordered),
        (l, r): (Option<u32>, Option<u32>),
        target: u32,
        pending: &mut Pending,
    ) {
        let lc = l.map_or(&[][..], |l| orders.0.children(l));
        let rc = r.map_or(&[][..], |r| orders.1.children(r));
        let (mut i, mut j) = (0, 0);
        let mut previous = NONE;
        while i < lc.len() || j < rc.len() {
            let (ln, rn) = match (lc.get(i), rc.get(j)) {
                (Some(&a), Some(&b)) => match name(left, a).cmp(name(right, b)) {
                    std::cmp::Ordering::Equal => (Some(a), Some(b)),
                    std::cmp::Ordering::Less => (Some(a), None),
                    std::cmp::Ordering::Greater => (None, Some(b)),
                },
                (Some(&a), None) => (Some(a), None),
                (None, Some(&b)) => (None, Some(b)),
                (None, None) => unreachable!("loop condition"),
            };
            i += usize::from(ln.is_some());
            j += usize::from(rn.is_some());
            let frame_name = match (ln, rn) {
                (Some(a), _) => name(left, a),
                (None, Some(b)) => name(right, b),
                (None, None) => unreachable!("one side is present"),
            };
            let id = self.nodes.len() as u32;
            self.nodes.push(CombinedNode {
                frame: self.frames.intern(frame_name).0,
                first_child: NONE,
                next_sibling: NONE,
                left: side(left, ln),
                right: side(right, rn),
            });
            if previous == NONE {
                self.nodes[target as usize].first_child = id;
            } else {
                self.nodes[previous as usize].next_sibling = id;
            }
            previous = id;
            pending.push((ln, rn, id));
        }
    }

    /// The frame table.
    pub fn frames(&self) -> &Frames {
        &self.frames
    }

    /// The left tree's total.
    pub fn left_total(&self) -> u64 {
        self.nodes[0].left.total
    }

    /// The right tree's total.
    pub fn right_total(&self) -> u64 {
        self.nodes[0].right.total
    }

    /// The number of nodes, not counting the root.
    pub fn len(&self) -> usize {
        self.nodes.len() - 1
    }

    /// Whether both trees were empty.
    pub fn is_empty(&self) -> bool {
        self.nodes.len() == 1
    }

    /// The node `id`; the root is [`NodeId::ROOT`].
    ///
    /// # Panics
    ///
    /// If `id` is not a node of this tree.
    pub fn node(&self, id: NodeId) -> &CombinedNode {
        &self.nodes[id.index()]
    }

    /// The children of `id`, in name order.
    pub fn children(&self, id: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        let mut child = self.nodes[id.index()].first_child;
        std::iter::from_fn(move || {
            (child != NONE).then(|| {
                let id = child;
                child = self.nodes[id as usize].next_sibling;
                NodeId(id)
            })
        })
    }

    /// The frame of `id`, or `None` for the root.
    pub fn frame(&self, id: NodeId) -> Option<FrameId> {
        (id != NodeId::ROOT).then(|| FrameId(self.nodes[id.index()].frame))
    }
}

fn name(tree: &Tree, node: u32) -> &str {
    tree.frames.name(FrameId(tree.nodes[node as usize].frame))
}

fn side(tree: &Tree, node: Option<u32>) -> Side {
    node.map_or(Side::default(), |n| {
        let n = &tree.nodes[n as usize];
        Side {
            self_value: n.self_value,
            total: n.total,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combine_aligns_both_sides() {
        let mut left = Tree::new();
        left.insert_names(["a", "b"], 2);
        left.insert_names(["a", "c"], 2);
        let mut right = Tree::new();
        right.insert_names(["a", "b"], 6);
        right.insert_names(["d"], 1);
        let combined = Tree::combine(&left, &right);
        assert_eq!((combined.left_total(), combined.right_total()), (4, 7));
        assert_eq!(combined.len(), 4);
        let top: Vec<_> = combined.children(NodeId::ROOT).collect();
        let names: Vec<&str> = top
            .iter()
            .map(|&id| combined.frames().name(combined.frame(id).unwrap()))
            .collect();
        assert_eq!(names, ["a", "d"]);
        let d = combined.node(top[1]);
        assert_eq!((d.left.total, d.right.total), (0, 1));
        let a_children: Vec<_> = combined.children(top[0]).collect();
        let c = combined.node(a_children[1]);
        assert_eq!((c.left.total, c.right.total), (2, 0));
    }
}
