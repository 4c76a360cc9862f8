//! Flamebearer: the flame-graph JSON that Pyroscope's `/render` and `/render-diff` return and that
//! its UI, Grafana's flame graph panel and third-party tools read.
//!
//! The layout is reproduced exactly, so existing readers work unchanged:
//!
//! - `names` is a global table of frame names, `"total"` (the root) first, in the order a
//!   depth-first walk that visits the last child first meets them.
//! - `levels[d]` holds the bars of depth `d`, left to right. A single-profile bar is four
//!   integers `[x, total, self, name]`; a diff bar is seven, `[xL, totalL, selfL, xR, totalR,
//!   selfR, name]`.
//! - Within a bar the node's self comes first and its children follow in byte-wise name order,
//!   so a child starts at its parent's `x + self` plus the totals of the siblings before it.
//! - `x` is delta-encoded per level: the gap from the end (`x + total`) of the previous bar of
//!   the same level (in a diff, each side against its own previous bar).
//! - Truncation to `max_nodes` keeps nodes whose total reaches the `max_nodes`-th largest total
//!   (in a diff, the larger of the two sides) and folds each kept node's other children into a
//!   last child named `other`; see [`Tree::truncate`].
//!
//! One deliberate difference: Pyroscope's diff registers the root under the empty name, so a
//! frame with an empty name renders as `total` there; here an empty-named frame keeps its own
//! entry, as in Pyroscope's single format.
//!
//! ```
//! use smolder_common::{Tree, flamebearer::Flamebearer};
//!
//! let mut tree = Tree::new();
//! tree.insert_names(["foo", "bar"], 2);
//! tree.insert_names(["foo", "baz"], 3);
//! tree.insert_names(["foo"], 1);
//! tree.insert_names(["qux"], 4);
//! let fb = Flamebearer::from_tree(&tree, 8192);
//! assert_eq!(
//!     serde_json::to_string(&fb).unwrap(),
//!     r#"{"names":["total","qux","foo","baz","bar"],"levels":[[0,10,0,0],[0,6,1,2,0,4,4,1],[1,2,2,4,0,3,3,3]],"numTicks":10,"maxSelf":4}"#
//! );
//! ```

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::tree::{CombinedTree, NodeId, OTHER, TopTotals, Tree};

/// The root's name in `names`.
const TOTAL: &str = "total";
/// Integers per bar in the single format.
const SINGLE_WIDTH: usize = 4;
/// Integers per bar in the diff ("double") format.
const DOUBLE_WIDTH: usize = 7;

/// The flame graph itself: names, levels, and the two numbers the renderer scales by.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Flamebearer {
    /// Frame names; `names[0]` is `"total"`.
    pub names: Vec<String>,
    /// Bars per depth; see the [module documentation](self) for the encoding.
    pub levels: Vec<Vec<u64>>,
    /// The root total (single) or the sum of both roots (diff).
    pub num_ticks: u64,
    /// The largest self value of any bar shown (either side, in a diff).
    pub max_self: u64,
}

/// `"single"` for one profile, `"double"` for a diff.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// One profile, four integers per bar.
    #[default]
    Single,
    /// A diff, seven integers per bar.
    Double,
}

/// What the UI needs to label and scale a flame graph.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    /// Single or diff.
    pub format: Format,
    /// The profiler that produced the data (`gospy`, `ebpfspy`...); the UI picks colours by it.
    pub spy_name: String,
    /// Samples per second for sampled (CPU) profiles; the UI divides by it to show seconds.
    pub sample_rate: u32,
    /// `samples`, `objects`, `bytes`, `goroutines`, `lock_nanoseconds`, `lock_samples`...
    pub units: String,
    /// A name for the profile; `/render` uses `"<app> <RFC 3339 start>"`.
    pub name: String,
    /// The queried application (`/render` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_name: Option<String>,
    /// Range start in unix seconds (`/render` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<i64>,
    /// Range end in unix seconds (`/render` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<i64>,
    /// The query as given (`/render` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// The node budget applied (`/render` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_nodes: Option<u64>,
}

/// Values over time, one per `duration_delta` seconds from `start_time`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Timeline {
    /// Unix seconds of the first point.
    pub start_time: i64,
    /// The sum of values in each step.
    pub samples: Vec<u64>,
    /// Seconds per point.
    pub duration_delta: i64,
    /// Resolution level → unix seconds where data of that coarser resolution begins.
    #[serde(default)]
    pub watermarks: BTreeMap<u32, i64>,
}

/// A note pinned to a point of the timeline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Annotation {
    /// The text.
    pub content: String,
    /// Unix seconds.
    pub timestamp: i64,
}

/// The whole `/render` (or `/render-diff`) response, field for field as Pyroscope writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FlamebearerProfile {
    /// Always 1.
    pub version: u32,
    /// The flame graph.
    pub flamebearer: Flamebearer,
    /// Labels and scale.
    pub metadata: Metadata,
    /// The total over time; `null` in a diff.
    pub timeline: Option<Timeline>,
    /// Per value of the `groupBy` label, its timeline; `"*"` holds series without the label.
    pub groups: Option<BTreeMap<String, Timeline>>,
    /// Not produced by Smolder; always `null`, kept so readers find the key.
    pub heatmap: Option<serde_json::Value>,
    /// The left root total, in a diff.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left_ticks: u64,
    /// The right root total, in a diff.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub right_ticks: u64,
    /// Annotations in range (`/render` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Vec<Annotation>>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

impl FlamebearerProfile {
    /// A single-profile response for `tree`, truncated to `max_nodes` (0: no limit).
    /// `metadata.format` is set to single.
    pub fn single(tree: &Tree, max_nodes: usize, mut metadata: Metadata) -> Self {
        metadata.format = Format::Single;
        FlamebearerProfile {
            version: 1,
            flamebearer: Flamebearer::from_tree(tree, max_nodes),
            metadata,
            timeline: None,
            groups: Some(BTreeMap::new()),
            heatmap: None,
            left_ticks: 0,
            right_ticks: 0,
            annotations: None,
        }
    }

    /// A diff response for `combined`, truncated to `max_nodes` (0: no limit), with no timeline
    /// as in Pyroscope. `metadata.format` is set to double.
    pub fn diff(combined: &CombinedTree, max_nodes: usize, mut metadata: Metadata) -> Self {
        metadata.format = Format::Double;
        FlamebearerProfile {
            version: 1,
            flamebearer: Flamebearer::from_combined(combined, max_nodes),
            metadata,
            timeline: None,
            groups: None,
            heatmap: None,
            left_ticks: combined.left_total(),
            right_ticks: combined.right_total(),
            annotations: None,
        }
    }
}

impl Flamebearer {
    /// Lays out `tree` truncated to `max_nodes` (0: no limit).
    pub fn from_tree(tree: &Tree, max_nodes: usize) -> Flamebearer {
        let min = tree.min_value(max_nodes);
        let order = tree.ordered();
        let mut layout = Layout::new(SINGLE_WIDTH);
        let mut pending = vec![(Bar::Node(NodeId::ROOT), 0u64, 0usize)];
        while let Some((bar, x, depth)) = pending.pop() {
            let (name, self_value, total) = match bar {
                Bar::Node(id) => {
                    let node = tree.node(id);
                    (node.name(), node.self_value(), node.total())
                }
                Bar::Other(value) => (OTHER, value, value),
            };
            let index = layout.name_index(name, depth == 0);
            layout.push(depth, &[x, total, self_value, index]);
            layout.max_self = layout.max_self.max(self_value);
            let Bar::Node(id) = bar else { continue };
            let mut child_x = x.saturating_add(self_value);
            let mut folded = 0u64;
            for &child in order.children(id.0) {
                let child = tree.node(NodeId(child));
                if child.total() >= min && child.name() != OTHER {
                    pending.push((Bar::Node(child.id()), child_x, depth + 1));
                    child_x = child_x.saturating_add(child.total());
                } else {
                    folded = folded.saturating_add(child.total());
                }
            }
            if folded != 0 {
                pending.push((Bar::Other(folded), child_x, depth + 1));
            }
        }
        layout.finish(&[0], tree.total())
    }

    /// Lays out a diff of `combined` truncated to `max_nodes` (0: no limit).
    pub fn from_combined(combined: &CombinedTree, max_nodes: usize) -> Flamebearer {
        let min = {
            let mut top = TopTotals::new(max_nodes);
            let mut pending = vec![NodeId::ROOT];
            while let Some(id) = pending.pop() {
                let node = combined.node(id);
                if top.push(node.left.total.max(node.right.total)) {
                    pending.extend(combined.children(id));
                }
            }
            top.min_value()
        };
        let name_of = |id: NodeId| combined.frame(id).map_or("", |f| combined.frames().name(f));
        let mut layout = Layout::new(DOUBLE_WIDTH);
        let mut pending = vec![(DiffBar::Node(NodeId::ROOT), (0u64, 0u64), 0usize)];
        while let Some((bar, (xl, xr), depth)) = pending.pop() {
            let (name, left, right) = match bar {
                DiffBar::Node(id) => {
                    let node = combined.node(id);
                    let left = (node.left.self_value, node.left.total);
                    (name_of(id), left, (node.right.self_value, node.right.total))
                }
                DiffBar::Other(l, r) => (OTHER, (l, l), (r, r)),
            };
            let index = layout.name_index(name, depth == 0);
            layout.push(depth, &[xl, left.1, left.0, xr, right.1, right.0, index]);
            layout.max_self = layout.max_self.max(left.0).max(right.0);
            let DiffBar::Node(id) = bar else { continue };
            let (mut cl, mut cr) = (xl.saturating_add(left.0), xr.saturating_add(right.0));
            let (mut fl, mut fr) = (0u64, 0u64);
            for child in combined.children(id) {
                let node = combined.node(child);
                let (lt, rt) = (node.left.total, node.right.total);
                if lt >= min || rt >= min {
                    pending.push((DiffBar::Node(child), (cl, cr), depth + 1));
                    cl = cl.saturating_add(lt);
                    cr = cr.saturating_add(rt);
                } else {
                    fl = fl.saturating_add(lt);
                    fr = fr.saturating_add(rt);
                }
            }
            if fl != 0 || fr != 0 {
                pending.push((DiffBar::Other(fl, fr), (cl, cr), depth + 1));
            }
        }
        let ticks = combined.left_total().saturating_add(combined.right_total());
        layout.finish(&[0, 3], ticks)
    }
}

/// A bar waiting to be laid out: a tree node, or the `other` remainder of a parent.
enum Bar {
    Node(NodeId),
    Other(u64),
}

/// A diff bar waiting to be laid out, with `other` holding both sides' remainders.
enum DiffBar {
    Node(NodeId),
    Other(u64, u64),
}

/// The levels and names being built, bar by bar, in Pyroscope's visiting order.
struct Layout<'a> {
    width: usize,
    names: Vec<String>,
    index: HashMap<&'a str, u64>,
    levels: Vec<Vec<u64>>,
    max_self: u64,
}

impl<'a> Layout<'a> {
    fn new(width: usize) -> Self {
        Layout {
            width,
            names: Vec::new(),
            index: HashMap::new(),
            levels: Vec::new(),
            max_self: 0,
        }
    }

    fn name_index(&mut self, name: &'a str, root: bool) -> u64 {
        let name = if root { TOTAL } else { name };
        *self.index.entry(name).or_insert_with(|| {
            self.names.push(name.to_owned());
            self.names.len() as u64 - 1
        })
    }

    fn push(&mut self, depth: usize, bar: &[u64]) {
        if depth == self.levels.len() {
            self.levels.push(Vec::new());
        }
        self.levels[depth].extend_from_slice(bar);
    }

    /// Puts each level in left-to-right order (bars were visited right to left) and
    /// delta-encodes the offsets at `x_positions` within each bar.
    fn finish(mut self, x_positions: &[usize], num_ticks: u64) -> Flamebearer {
        for level in &mut self.levels {
            let bars = level.len() / self.width;
            for i in 0..bars / 2 {
                let (head, tail) = level.split_at_mut((bars - 1 - i) * self.width);
                head[i * self.width..(i + 1) * self.width].swap_with_slice(&mut tail[..self.width]);
            }
            for &position in x_positions {
                let mut previous_end = 0u64;
                for bar in level.chunks_exact_mut(self.width) {
                    let (x, total) = (bar[position], bar[position + 1]);
                    bar[position] = x.saturating_sub(previous_end);
                    previous_end = x.saturating_add(total);
                }
            }
        }
        Flamebearer {
            names: self.names,
            levels: self.levels,
            num_ticks,
            max_self: self.max_self,
        }
    }
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

    /// The worked example of Pyroscope's single format (reference §2.4).
    #[test]
    fn single_matches_pyroscope() {
        let t = tree(&[("foo;bar", 2), ("foo;baz", 3), ("foo", 1), ("qux", 4)]);
        let fb = Flamebearer::from_tree(&t, 8192);
        assert_eq!(fb.names, ["total", "qux", "foo", "baz", "bar"]);
        assert_eq!(
            fb.levels,
            [
                vec![0, 10, 0, 0],
                vec![0, 6, 1, 2, 0, 4, 4, 1],
                vec![1, 2, 2, 4, 0, 3, 3, 3]
            ]
        );
        assert_eq!((fb.num_ticks, fb.max_self), (10, 4));
    }

    /// The worked example of Pyroscope's diff format (reference §6).
    #[test]
    fn diff_matches_pyroscope() {
        let left = tree(&[("a;b", 2), ("a;c", 2)]);
        let right = tree(&[("a;b", 6), ("a;c", 2)]);
        let profile =
            FlamebearerProfile::diff(&Tree::combine(&left, &right), 8192, Metadata::default());
        let fb = &profile.flamebearer;
        assert_eq!(fb.names, ["total", "a", "c", "b"]);
        assert_eq!(fb.levels[2], [0, 2, 2, 0, 6, 6, 3, 0, 2, 2, 0, 2, 2, 2]);
        assert_eq!(
            (fb.num_ticks, profile.left_ticks, profile.right_ticks),
            (12, 4, 8)
        );
        assert_eq!(fb.max_self, 6);
        let json = serde_json::to_string(&profile).unwrap();
        assert!(json.contains(r#""format":"double""#), "{json}");
        assert!(
            json.contains(
                r#""timeline":null,"groups":null,"heatmap":null,"leftTicks":4,"rightTicks":8"#
            ),
            "{json}"
        );
    }

    #[test]
    fn truncation_appends_other_after_kept_children() {
        let t = tree(&[("a;big", 50), ("a;s1", 1), ("a;s2", 2), ("b", 10)]);
        let fb = Flamebearer::from_tree(&t, 4);
        // Level 2 under a: big@0 (50) then other@50 (3).
        let level2 = &fb.levels[2];
        assert_eq!(level2.len(), 8);
        assert_eq!(fb.names[level2[3] as usize], "big");
        assert_eq!(fb.names[level2[7] as usize], "other");
        assert_eq!(&level2[4..7], &[0, 3, 3]);
        assert_eq!(fb.num_ticks, 63);
    }

    #[test]
    fn single_profile_serializes_like_pyroscope() {
        let t = tree(&[("a", 1)]);
        let metadata = Metadata {
            spy_name: "gospy".into(),
            sample_rate: 100,
            units: "samples".into(),
            name: "app.cpu".into(),
            ..Metadata::default()
        };
        let json = serde_json::to_string(&FlamebearerProfile::single(&t, 0, metadata)).unwrap();
        assert_eq!(
            json,
            r#"{"version":1,"flamebearer":{"names":["total","a"],"levels":[[0,1,0,0],[0,1,1,1]],"numTicks":1,"maxSelf":1},"metadata":{"format":"single","spyName":"gospy","sampleRate":100,"units":"samples","name":"app.cpu"},"timeline":null,"groups":{},"heatmap":null}"#
        );
    }
}
