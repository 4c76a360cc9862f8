//! The stack tree: the one profile type that the agent window, the wire batch, the store and the
//! query path all share.
//!
//! A [`Tree`] is a prefix tree of stacks, root first. Each node is one frame on one call path and
//! holds two values: *self*, what was sampled with this frame as the leaf, and *total*, self plus
//! the totals of its children. Frame names are interned into the tree's [`Frames`] table, so a
//! node is a few integers.
//!
//! Trees [`merge`](Tree::merge) by summing, [`truncate`](Tree::truncate) to a node budget by
//! folding small nodes into `other` exactly as Pyroscope does, [`combine`](Tree::combine) into a
//! [`CombinedTree`] for a diff, and [`encode`](Tree::encode) to a compact versioned binary form
//! (see [`Tree::decode`] for the layout).
//!
//! Values are unsigned and additions saturate: a tree never wraps around, whatever it is fed.
//!
//! ```
//! use smolder_common::Tree;
//!
//! let mut tree = Tree::new();
//! tree.insert_names(["main", "handler", "json.Marshal"], 37);
//! tree.insert_names(["main", "gc"], 5);
//! assert_eq!(tree.total(), 42);
//!
//! let mut stacks = Vec::new();
//! tree.for_each_stack(|stack, value| {
//!     let names: Vec<&str> = stack.iter().map(|&f| tree.frames().name(f)).collect();
//!     stacks.push((names.join(";"), value));
//! });
//! assert_eq!(stacks, [("main;gc".to_string(), 5), ("main;handler;json.Marshal".to_string(), 37)]);
//! ```

mod codec;
mod combine;
mod frames;
mod truncate;

use std::collections::HashMap;
use std::fmt;

pub use codec::DecodeError;
pub use combine::{CombinedNode, CombinedTree, Side};
pub use frames::{FrameId, Frames};
pub(crate) use truncate::TopTotals;

/// The name Pyroscope gives the node that holds everything truncation folded away.
pub const OTHER: &str = "other";

/// The index of a node in its tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub(crate) u32);

impl NodeId {
    /// The root of every tree: it has no frame, and its total is the tree's total.
    pub const ROOT: NodeId = NodeId(0);

    /// The id as an index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// "No node": the root is never anyone's child or sibling, so 0 is free to mean none.
const NONE: u32 = 0;

/// Parents with more children than this find a child through [`Tree::wide`] instead of walking
/// the sibling list. Eight keeps the walk within one or two cache lines of nodes for the common
/// case (most frames have one to three callees) while bounding the cost at roots and dispatchers
/// that have thousands.
const WIDE: u32 = 8;

#[derive(Clone, Debug)]
struct Node {
    frame: u32,
    first_child: u32,
    next_sibling: u32,
    child_count: u32,
    self_value: u64,
    total: u64,
}

impl Node {
    fn new(frame: u32, next_sibling: u32) -> Self {
        Node {
            frame,
            first_child: NONE,
            next_sibling,
            child_count: 0,
            self_value: 0,
            total: 0,
        }
    }
}

/// A stack tree with interned frames. See the [module documentation](self).
#[derive(Clone)]
pub struct Tree {
    frames: Frames,
    /// `nodes[0]` is the root. A child always has a larger index than its parent.
    nodes: Vec<Node>,
    /// (parent, frame) → child, for the children of parents with more than [`WIDE`] children.
    wide: HashMap<(u32, u32), u32, foldhash::fast::RandomState>,
}

impl Default for Tree {
    fn default() -> Self {
        Self::new()
    }
}

impl Tree {
    /// An empty tree: a root with no children and a total of zero.
    pub fn new() -> Self {
        Tree {
            frames: Frames::default(),
            nodes: vec![Node::new(NONE, NONE)],
            wide: HashMap::default(),
        }
    }

    /// The frame table.
    pub fn frames(&self) -> &Frames {
        &self.frames
    }

    /// Interns `name` in this tree's frame table, for use with [`Tree::insert`].
    pub fn intern(&mut self, name: &str) -> FrameId {
        self.frames.intern(name)
    }

    /// Adds `value` to the stack `stack`, given root first as ids from this tree's table.
    ///
    /// Every node on the path gains `value` in its total and the leaf gains it in its self. A
    /// value of zero changes nothing and creates no nodes; an empty stack adds to the root's self.
    ///
    /// # Panics
    ///
    /// If a frame id was not issued by this tree's table.
    pub fn insert(&mut self, stack: &[FrameId], value: u64) {
        if value == 0 {
            return;
        }
        let mut node = NodeId::ROOT.0;
        add(&mut self.nodes[0].total, value);
        for frame in stack {
            assert!(
                frame.index() < self.frames.len(),
                "frame id from another tree"
            );
            node = self.child_or_insert(node, frame.0);
            add(&mut self.nodes[node as usize].total, value);
        }
        add(&mut self.nodes[node as usize].self_value, value);
    }

    /// Adds `value` to the stack named by `stack`, root first, interning the names.
    pub fn insert_names<S: AsRef<str>>(&mut self, stack: impl IntoIterator<Item = S>, value: u64) {
        if value == 0 {
            return;
        }
        let mut node = NodeId::ROOT.0;
        add(&mut self.nodes[0].total, value);
        for name in stack {
            let frame = self.frames.intern(name.as_ref()).0;
            node = self.child_or_insert(node, frame);
            add(&mut self.nodes[node as usize].total, value);
        }
        add(&mut self.nodes[node as usize].self_value, value);
    }

    /// Creates the nodes of `stack` (root first) without adding any value, and returns its
    /// leaf: the shape half of building several trees over the same stacks, finished by
    /// [`Tree::with_self_values`]. A tree built this way may hold nodes with a zero total.
    ///
    /// # Panics
    ///
    /// If a frame id was not issued by this tree's table.
    pub fn insert_path(&mut self, stack: &[FrameId]) -> NodeId {
        let mut node = NodeId::ROOT.0;
        for frame in stack {
            assert!(
                frame.index() < self.frames.len(),
                "frame id from another tree"
            );
            node = self.child_or_insert(node, frame.0);
        }
        NodeId(node)
    }

    /// A tree with this tree's frames and shape whose self values are `self_values`, indexed
    /// by [`NodeId::index`] (missing entries count as zero); totals are recomputed and nodes
    /// left with a zero total are dropped.
    ///
    /// With [`Tree::insert_path`], this builds one tree per value column of a profile (pprof
    /// sample types) in one pass over the nodes per column instead of one insert per stack.
    pub fn with_self_values(&self, self_values: &[u64]) -> Tree {
        let preorder = self.preorder();
        let mut totals = vec![0u64; self.nodes.len()];
        for &node in preorder.iter().rev() {
            let mut total = self_values.get(node as usize).copied().unwrap_or(0);
            let mut child = self.nodes[node as usize].first_child;
            while child != NONE {
                add(&mut total, totals[child as usize]);
                child = self.nodes[child as usize].next_sibling;
            }
            totals[node as usize] = total;
        }
        let mut out = Tree {
            frames: self.frames.clone(),
            nodes: Vec::with_capacity(self.nodes.len()),
            wide: HashMap::default(),
        };
        out.nodes.push(Node::new(NONE, NONE));
        out.nodes[0].self_value = self_values.first().copied().unwrap_or(0);
        out.nodes[0].total = totals[0];
        let mut pending = vec![(NodeId::ROOT.0, NodeId::ROOT.0)];
        while let Some((source, target)) = pending.pop() {
            let mut child = self.nodes[source as usize].first_child;
            while child != NONE {
                if totals[child as usize] > 0 {
                    let copy = out.push_child(target, self.nodes[child as usize].frame);
                    out.nodes[copy as usize].self_value =
                        self_values.get(child as usize).copied().unwrap_or(0);
                    out.nodes[copy as usize].total = totals[child as usize];
                    pending.push((child, copy));
                }
                child = self.nodes[child as usize].next_sibling;
            }
        }
        out
    }

    /// Node ids in preorder (children in list order), root first.
    fn preorder(&self) -> Vec<u32> {
        let mut preorder = Vec::with_capacity(self.nodes.len());
        let mut pending = vec![NodeId::ROOT.0];
        while let Some(node) = pending.pop() {
            preorder.push(node);
            let mut child = self.nodes[node as usize].first_child;
            while child != NONE {
                pending.push(child);
                child = self.nodes[child as usize].next_sibling;
            }
        }
        preorder
    }

    /// Adds every stack of `other` to this tree.
    pub fn merge(&mut self, other: &Tree) {
        let mut remap = vec![u32::MAX; other.frames.len()];
        let mut pending = vec![(NodeId::ROOT.0, NodeId::ROOT.0)];
        while let Some((theirs, ours)) = pending.pop() {
            let source = &other.nodes[theirs as usize];
            let target = &mut self.nodes[ours as usize];
            add(&mut target.self_value, source.self_value);
            add(&mut target.total, source.total);
            let mut child = source.first_child;
            while child != NONE {
                let child_node = &other.nodes[child as usize];
                let frame = &mut remap[child_node.frame as usize];
                if *frame == u32::MAX {
                    *frame = self
                        .frames
                        .intern(other.frames.name(FrameId(child_node.frame)))
                        .0;
                }
                let our_child = self.child_or_insert(ours, *frame);
                pending.push((child, our_child));
                child = child_node.next_sibling;
            }
        }
    }

    /// Multiplies every value by `numerator / denominator`, rounding down, and recomputes the
    /// totals so that each is again the sum of the self values below it. This is how a range of
    /// `average` writes is shown (Pyroscope divides by the number of writes).
    ///
    /// # Panics
    ///
    /// If `denominator` is zero.
    pub fn scale(&mut self, numerator: u64, denominator: u64) {
        assert!(denominator != 0, "scale by a ratio with a zero denominator");
        let scale = |v: u64| {
            let scaled = u128::from(v) * u128::from(numerator) / u128::from(denominator);
            u64::try_from(scaled).unwrap_or(u64::MAX)
        };
        let preorder = self.preorder();
        // Children come after their parent in preorder, so walking it backwards sums each
        // subtree before the node above it needs it.
        for &node in preorder.iter().rev() {
            let mut total = scale(self.nodes[node as usize].self_value);
            self.nodes[node as usize].self_value = total;
            let mut child = self.nodes[node as usize].first_child;
            while child != NONE {
                add(&mut total, self.nodes[child as usize].total);
                child = self.nodes[child as usize].next_sibling;
            }
            self.nodes[node as usize].total = total;
        }
    }

    /// The stacks of this tree minus those of `earlier`, each clamped at zero: the share of a
    /// cumulative profile (allocations, mutex, block) that arrived since `earlier` was taken.
    /// A stack whose value went down (the process restarted) keeps nothing of it.
    pub fn subtract(&self, earlier: &Tree) -> Tree {
        let mut out = Tree::new();
        let mut path: Vec<FrameId> = Vec::new();
        // (node here, matching node in `earlier`, depth)
        let mut pending: Vec<(u32, Option<u32>, usize)> = vec![(NodeId::ROOT.0, Some(0), 0)];
        while let Some((node, theirs, depth)) = pending.pop() {
            path.truncate(depth.saturating_sub(1));
            let here = &self.nodes[node as usize];
            if node != NodeId::ROOT.0 {
                path.push(out.frames.intern(self.frames.name(FrameId(here.frame))));
            }
            let before = theirs.map_or(0, |t| earlier.nodes[t as usize].self_value);
            out.insert(&path, here.self_value.saturating_sub(before));
            let mut child = here.first_child;
            while child != NONE {
                let name = self.frames.name(FrameId(self.nodes[child as usize].frame));
                let matching =
                    theirs.and_then(|t| earlier.find_child(t, earlier.frames.get(name)?.0));
                pending.push((child, matching, depth + 1));
                child = self.nodes[child as usize].next_sibling;
            }
        }
        out
    }

    /// The root's total: everything in the tree.
    pub fn total(&self) -> u64 {
        self.nodes[0].total
    }

    /// The number of nodes, not counting the root.
    pub fn len(&self) -> usize {
        self.nodes.len() - 1
    }

    /// How many stacks have a self value: what [`Tree::for_each_stack`] would visit, counted in
    /// one pass over the nodes without ordering them.
    pub fn stack_count(&self) -> usize {
        self.nodes.iter().filter(|node| node.self_value > 0).count()
    }

    /// Whether the tree has no nodes besides the root.
    pub fn is_empty(&self) -> bool {
        self.nodes.len() == 1
    }

    /// The root node.
    pub fn root(&self) -> NodeRef<'_> {
        self.node(NodeId::ROOT)
    }

    /// The node `id`.
    ///
    /// # Panics
    ///
    /// If `id` is not a node of this tree.
    pub fn node(&self, id: NodeId) -> NodeRef<'_> {
        assert!(id.index() < self.nodes.len(), "node id from another tree");
        NodeRef {
            tree: self,
            id: id.0,
        }
    }

    /// Calls `f` with every stack that has a self value, root first, and that value.
    ///
    /// Children are visited in byte-wise name order, as Pyroscope orders them, so the output is
    /// deterministic. The root's own self value, if any, is reported with an empty stack.
    pub fn for_each_stack(&self, mut f: impl FnMut(&[FrameId], u64)) {
        let order = self.ordered();
        let mut stack: Vec<FrameId> = Vec::new();
        order.walk(|node, depth| {
            stack.truncate(depth.saturating_sub(1));
            if node != NodeId::ROOT.0 {
                stack.push(FrameId(self.nodes[node as usize].frame));
            }
            let value = self.nodes[node as usize].self_value;
            if value > 0 {
                f(&stack, value);
            }
            true
        });
    }

    /// Finds the child of `parent` for `frame`, creating it if it does not exist.
    #[inline]
    fn child_or_insert(&mut self, parent: u32, frame: u32) -> u32 {
        match self.find_child(parent, frame) {
            Some(child) => child,
            None => self.push_child(parent, frame),
        }
    }

    /// The child of `parent` for `frame`, if there is one.
    #[inline]
    fn find_child(&self, parent: u32, frame: u32) -> Option<u32> {
        let p = &self.nodes[parent as usize];
        if p.child_count > WIDE {
            return self.wide.get(&(parent, frame)).copied();
        }
        let mut child = p.first_child;
        while child != NONE {
            let c = &self.nodes[child as usize];
            if c.frame == frame {
                return Some(child);
            }
            child = c.next_sibling;
        }
        None
    }

    /// Appends a new child of `parent` without checking whether one exists for `frame`.
    fn push_child(&mut self, parent: u32, frame: u32) -> u32 {
        let id = u32::try_from(self.nodes.len()).expect("fewer than 2^32 nodes in one tree");
        let p = &mut self.nodes[parent as usize];
        let next = p.first_child;
        p.first_child = id;
        p.child_count += 1;
        let count = p.child_count;
        self.nodes.push(Node::new(frame, next));
        if count == WIDE + 1 {
            let mut child = id;
            while child != NONE {
                let c = &self.nodes[child as usize];
                self.wide.insert((parent, c.frame), child);
                child = c.next_sibling;
            }
        } else if count > WIDE {
            self.wide.insert((parent, frame), id);
        }
        id
    }

    /// Every node's children, sorted by frame name.
    pub(crate) fn ordered(&self) -> Ordered {
        let rank = self.frames.ranks();
        let mut start = Vec::with_capacity(self.nodes.len() + 1);
        let mut children = Vec::with_capacity(self.nodes.len() - 1);
        for node in &self.nodes {
            let from = children.len();
            start.push(from as u32);
            let mut child = node.first_child;
            while child != NONE {
                children.push(child);
                child = self.nodes[child as usize].next_sibling;
            }
            children[from..].sort_unstable_by_key(|&c| rank[self.nodes[c as usize].frame as usize]);
        }
        start.push(children.len() as u32);
        Ordered { start, children }
    }
}

/// How many stacks `Debug` shows before it elides the rest: enough for a test failure, bounded
/// for a log line.
const DEBUG_STACKS: usize = 32;

impl fmt::Debug for Tree {
    /// The total, the node count and the first stacks as folded lines.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut lines = Vec::new();
        let mut more = 0usize;
        self.for_each_stack(|stack, value| {
            if lines.len() == DEBUG_STACKS {
                more += 1;
                return;
            }
            let names: Vec<&str> = stack.iter().map(|&id| self.frames.name(id)).collect();
            lines.push(format!("{} {value}", names.join(";")));
        });
        if more > 0 {
            lines.push(format!("… {more} more stacks"));
        }
        f.debug_struct("Tree")
            .field("total", &self.total())
            .field("nodes", &self.len())
            .field("stacks", &lines)
            .finish()
    }
}

impl PartialEq for Tree {
    /// Two trees are equal when they hold the same stacks with the same values, whatever their
    /// frame ids and insertion order.
    fn eq(&self, other: &Self) -> bool {
        self.total() == other.total() && self.encode() == other.encode()
    }
}

impl Eq for Tree {}

/// A node of a [`Tree`], borrowed.
#[derive(Clone, Copy)]
pub struct NodeRef<'t> {
    tree: &'t Tree,
    id: u32,
}

impl<'t> NodeRef<'t> {
    fn node(&self) -> &'t Node {
        &self.tree.nodes[self.id as usize]
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        NodeId(self.id)
    }

    /// The frame, or `None` for the root.
    pub fn frame(&self) -> Option<FrameId> {
        (self.id != 0).then(|| FrameId(self.node().frame))
    }

    /// The frame's name; the root's name is empty.
    pub fn name(&self) -> &'t str {
        match self.frame() {
            Some(frame) => self.tree.frames.name(frame),
            None => "",
        }
    }

    /// What was sampled with this frame as the leaf.
    pub fn self_value(&self) -> u64 {
        self.node().self_value
    }

    /// Self plus the totals of all children.
    pub fn total(&self) -> u64 {
        self.node().total
    }

    /// The children, in no particular order.
    pub fn children(&self) -> impl Iterator<Item = NodeRef<'t>> + 't {
        let tree = self.tree;
        let mut child = self.node().first_child;
        std::iter::from_fn(move || {
            (child != NONE).then(|| {
                let id = child;
                child = tree.nodes[id as usize].next_sibling;
                NodeRef { tree, id }
            })
        })
    }
}

/// Children lists sorted by frame name, in compressed-row form: the children of node `n` are
/// `children[start[n]..start[n + 1]]`.
pub(crate) struct Ordered {
    start: Vec<u32>,
    children: Vec<u32>,
}

impl Ordered {
    pub(crate) fn children(&self, node: u32) -> &[u32] {
        &self.children[self.start[node as usize] as usize..self.start[node as usize + 1] as usize]
    }

    /// Visits nodes in preorder, children in name order, with their depth (the root's is 0).
    /// When `visit` returns false the node's children are skipped.
    pub(crate) fn walk(&self, mut visit: impl FnMut(u32, usize) -> bool) {
        let mut pending: Vec<(u32, usize)> = vec![(NodeId::ROOT.0, 0)];
        while let Some((node, depth)) = pending.pop() {
            if visit(node, depth) {
                pending.extend(self.children(node).iter().rev().map(|&c| (c, depth + 1)));
            }
        }
    }
}

/// Saturating addition: trees never wrap, whatever they are fed.
#[inline]
fn add(slot: &mut u64, value: u64) {
    *slot = slot.saturating_add(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folded(tree: &Tree) -> Vec<String> {
        let mut lines = Vec::new();
        tree.for_each_stack(|stack, value| {
            let names: Vec<&str> = stack.iter().map(|&id| tree.frames().name(id)).collect();
            lines.push(format!("{} {value}", names.join(";")));
        });
        lines
    }

    #[test]
    fn insert_sets_self_and_total_along_the_path() {
        let mut tree = Tree::new();
        tree.insert_names(["a", "b", "c"], 3);
        tree.insert_names(["a", "b"], 2);
        tree.insert_names(["a", "d"], 1);
        assert_eq!(tree.total(), 6);
        let a = tree.root().children().next().unwrap();
        assert_eq!((a.name(), a.self_value(), a.total()), ("a", 0, 6));
        let b = a.children().find(|n| n.name() == "b").unwrap();
        assert_eq!((b.self_value(), b.total()), (2, 5));
        assert_eq!(folded(&tree), ["a;b 2", "a;b;c 3", "a;d 1"]);
        assert_eq!(tree.stack_count(), 3);
    }

    #[test]
    fn scale_divides_and_keeps_totals_consistent() {
        let mut tree = Tree::new();
        tree.insert_names(["a", "b"], 10);
        tree.insert_names(["a", "c"], 5);
        tree.insert_names(["a"], 1);
        tree.scale(1, 2);
        assert_eq!(folded(&tree), ["a;b 5", "a;c 2"]);
        assert_eq!(tree.total(), 7);
    }

    #[test]
    fn subtract_keeps_what_grew() {
        let mut now = Tree::new();
        now.insert_names(["a", "b"], 10);
        now.insert_names(["a", "c"], 3);
        now.insert_names(["d"], 4);
        let mut earlier = Tree::new();
        earlier.insert_names(["a", "b"], 6);
        earlier.insert_names(["a", "c"], 5);
        let delta = now.subtract(&earlier);
        assert_eq!(folded(&delta), ["a;b 4", "d 4"]);
        assert_eq!(delta.total(), 8);
    }

    #[test]
    fn shapes_take_self_values_per_column() {
        let mut shape = Tree::new();
        let stacks = [["a", "b"], ["a", "c"], ["d", "e"]];
        let leaves: Vec<NodeId> = stacks
            .iter()
            .map(|stack| {
                let ids: Vec<FrameId> = stack.iter().map(|n| shape.intern(n)).collect();
                shape.insert_path(&ids)
            })
            .collect();
        let mut column = vec![0; shape.len() + 1];
        column[leaves[0].index()] = 3;
        column[leaves[1].index()] = 4;
        let tree = shape.with_self_values(&column);
        let mut expected = Tree::new();
        expected.insert_names(["a", "b"], 3);
        expected.insert_names(["a", "c"], 4);
        assert_eq!(tree, expected);
        assert_eq!(tree.len(), 3, "d;e has no value and is dropped");
    }

    #[test]
    fn zero_values_create_nothing() {
        let mut tree = Tree::new();
        tree.insert_names(["a"], 0);
        assert!(tree.is_empty());
    }

    #[test]
    fn wide_parents_find_children_through_the_index() {
        let mut tree = Tree::new();
        for round in 0..3 {
            for i in 0..100 {
                tree.insert_names(["root", &format!("f{i}")], round + 1);
            }
        }
        assert_eq!(tree.len(), 101);
        assert_eq!(tree.total(), 600);
        let root = tree.root().children().next().unwrap();
        assert!(root.children().all(|c| c.total() == 6));
    }

    #[test]
    fn merge_sums_across_frame_tables() {
        let mut left = Tree::new();
        left.insert_names(["a", "b"], 1);
        let mut right = Tree::new();
        right.insert_names(["x"], 4);
        right.insert_names(["a", "b"], 2);
        left.merge(&right);
        assert_eq!(folded(&left), ["a;b 3", "x 4"]);
        assert_eq!(left.total(), 7);
    }

    #[test]
    fn values_saturate_instead_of_wrapping() {
        let mut tree = Tree::new();
        tree.insert_names(["a"], u64::MAX);
        tree.insert_names(["a"], 5);
        assert_eq!(tree.total(), u64::MAX);
    }

    #[test]
    fn children_are_ordered_by_name_bytes() {
        let mut tree = Tree::new();
        for name in ["b", "a", "B", "ä", "aa"] {
            tree.insert_names([name], 1);
        }
        assert_eq!(folded(&tree), ["B 1", "a 1", "aa 1", "b 1", "ä 1"]);
    }
}
