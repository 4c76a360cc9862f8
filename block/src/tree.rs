//! Trees as self values of shape nodes, and the accumulator that sums them and turns the sum into
//! a [`Tree`].
//!
//! Layout of one stored tree (every integer a varint):
//!
//! ```text
//! scale (the GCD of the self values; 0 for a tree with none)
//! value count
//! per node with a self value, in node order:
//!   node id delta (the first is the node id; the rest are at least 1), self / scale
//! ```
//!
//! A node without a self value is present when a descendant has one, so nodes, totals and the
//! tree's shape all follow from the self values and the series' [`Shape`]. Dividing by the GCD
//! keeps values short when they are multiples of a sampling period (CPU nanoseconds).

use smolder_common::{FrameId, Tree};

use crate::codec::{Reader, put_varint};
use crate::error::{BlockError, Section};
use crate::names::Names;
use crate::shape::Shape;

/// One stored tree: `(node, self value)` for every shape node with a self value, by node id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SparseTree {
    pub(crate) values: Vec<(u32, u64)>,
}

impl SparseTree {
    /// The sum of the self values: the tree's total. Saturates, as trees do.
    pub fn total(&self) -> u64 {
        total(&self.values)
    }

    /// `(node, self value)` pairs, by node id.
    pub fn values(&self) -> &[(u32, u64)] {
        &self.values
    }

    /// Appends the encoding.
    #[cfg(test)]
    fn encode(&self, out: &mut Vec<u8>) {
        encode(&self.values, out);
    }

    /// Decodes a tree over a shape of `shape_len` nodes.
    pub(crate) fn decode(r: &mut Reader<'_>, shape_len: usize) -> Result<SparseTree, BlockError> {
        let scale = r.varint("scale")?;
        let count = r.count("value", 2)?;
        if (scale == 0) != (count == 0) {
            return Err(r.invalid("scale", "zero exactly when the tree is empty"));
        }
        let mut values = Vec::with_capacity(count);
        let mut node = 0u64;
        for index in 0..count {
            let delta = r.varint("node delta")?;
            if index > 0 && delta == 0 {
                return Err(r.invalid("node delta", "nodes must increase"));
            }
            node = node.saturating_add(delta);
            if node >= shape_len as u64 {
                return Err(r.invalid("node delta", "node outside the shape"));
            }
            let value = r
                .varint("self value")?
                .checked_mul(scale)
                .filter(|&v| v > 0)
                .ok_or_else(|| r.invalid("self value", "zero, or overflows when scaled"))?;
            values.push((node as u32, value));
        }
        Ok(SparseTree { values })
    }
}

/// Appends the encoding of a tree with these self values, sorted by node, none zero.
pub(crate) fn encode(values: &[(u32, u64)], out: &mut Vec<u8>) {
    let scale = values.iter().fold(0, |g, &(_, v)| gcd(g, v));
    put_varint(out, scale);
    put_varint(out, values.len() as u64);
    let mut previous = 0;
    for &(node, value) in values {
        put_varint(out, u64::from(node - previous));
        put_varint(out, value / scale);
        previous = node;
    }
}

/// The sum of self values: a tree's total. Saturates, as trees do.
pub(crate) fn total(values: &[(u32, u64)]) -> u64 {
    values
        .iter()
        .fold(0u64, |sum, &(_, value)| sum.saturating_add(value))
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// How many nodes (the root not counted) a tree with these self values has in a shape with
/// these parents: every node with a value and all its ancestors. `seen` is scratch space of at
/// least the shape's length, all false, and is left all false.
pub(crate) fn node_count(values: &[(u32, u64)], parents: &[u32], seen: &mut [bool]) -> u64 {
    let mut marked = Vec::new();
    for &(node, _) in values {
        let mut at = node;
        while at != 0 && !seen[at as usize] {
            seen[at as usize] = true;
            marked.push(at);
            at = parents[at as usize];
        }
    }
    for &node in &marked {
        seen[node as usize] = false;
    }
    marked.len() as u64
}

/// Sums stored trees of one series chunk, then adds the sum to a [`Tree`].
///
/// Summing is an addition per stored value, with no tree walk; the shape is walked once, when
/// the sum is added to a tree. A query over many buckets of one block therefore costs about the
/// values it reads plus one pass over the shape.
#[derive(Clone, Debug)]
pub struct Accumulator {
    values: Vec<u64>,
}

impl Accumulator {
    /// An empty sum over `shape`.
    pub fn new(shape: &Shape) -> Self {
        Accumulator {
            values: vec![0; shape.len()],
        }
    }

    /// Adds a tree read from the chunk whose shape this accumulator was made for.
    ///
    /// # Panics
    ///
    /// If the tree names a node outside that shape (a tree from another chunk).
    pub fn add(&mut self, tree: &SparseTree) {
        for &(node, value) in &tree.values {
            let slot = &mut self.values[node as usize];
            *slot = slot.saturating_add(value);
        }
    }

    /// Adds the sum to `tree`, naming frames from `names`, the block's name table.
    ///
    /// # Errors
    ///
    /// [`BlockError::Malformed`] naming the names section when the shape uses a frame id the
    /// table does not have (a names section from another block).
    ///
    /// # Panics
    ///
    /// If `shape` is not the one this accumulator was made for.
    pub fn merge_into(
        &self,
        shape: &Shape,
        names: &Names,
        tree: &mut Tree,
    ) -> Result<(), BlockError> {
        assert_eq!(
            shape.len(),
            self.values.len(),
            "accumulator of another shape"
        );
        if self.values[0] > 0 {
            tree.insert(&[], self.values[0]);
        }
        let mut ids: Vec<Option<FrameId>> =
            vec![None; shape.max_frame().map_or(0, |f| f as usize + 1)];
        // The path from the root to the node being visited, as shape nodes and frame ids.
        let mut nodes: Vec<u32> = Vec::new();
        let mut path: Vec<FrameId> = Vec::new();
        for node in 1..shape.len() {
            let parent = shape.parents[node];
            while nodes.last().is_some_and(|&n| n != parent) {
                nodes.pop();
                path.pop();
            }
            let frame = shape.frames[node];
            let id = match ids[frame as usize] {
                Some(id) => id,
                None => {
                    let name = names.get(frame).ok_or(BlockError::Malformed {
                        section: Section::Names,
                        offset: 0,
                        problem: crate::error::Problem::Invalid {
                            field: "name table",
                            reason: "a shape names a frame id the table does not have",
                        },
                    })?;
                    let id = tree.intern(name);
                    ids[frame as usize] = Some(id);
                    id
                }
            };
            nodes.push(node as u32);
            path.push(id);
            let value = self.values[node];
            if value > 0 {
                tree.insert(&path, value);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::shape::NO_FRAME;

    proptest! {
        /// Behind the tree's CRC: arbitrary bytes decode to in-shape, increasing, non-zero
        /// values or an error, and what decodes encodes back to the same bytes' meaning.
        #[test]
        fn arbitrary_trees_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let mut r = Reader::new(&bytes, Section::Tree { series: 0, entry: 0 });
            if let Ok(tree) = SparseTree::decode(&mut r, 16) {
                prop_assert!(tree.values.windows(2).all(|w| w[0].0 < w[1].0));
                prop_assert!(tree.values.iter().all(|&(n, v)| n < 16 && v > 0));
                let mut again = Vec::new();
                tree.encode(&mut again);
                let mut r = Reader::new(&again, Section::Tree { series: 0, entry: 0 });
                prop_assert_eq!(SparseTree::decode(&mut r, 16).unwrap(), tree);
            }
        }
    }

    #[test]
    fn values_round_trip_scaled_by_their_gcd() {
        // CPU nanoseconds at 99 Hz: multiples of the 10,101,010 ns period.
        let period = 10_101_010;
        let tree = SparseTree {
            values: vec![(0, 3 * period), (2, 7 * period), (7, 2 * period)],
        };
        let mut bytes = Vec::new();
        tree.encode(&mut bytes);
        // The period once (4 bytes), the count, then one byte per delta and per value.
        assert_eq!(bytes.len(), 4 + 1 + 6);
        let mut r = Reader::new(
            &bytes,
            Section::Tree {
                series: 0,
                entry: 0,
            },
        );
        assert_eq!(SparseTree::decode(&mut r, 8).unwrap(), tree);
        r.finish().unwrap();
        let mut r = Reader::new(
            &bytes,
            Section::Tree {
                series: 0,
                entry: 0,
            },
        );
        assert!(
            SparseTree::decode(&mut r, 7).is_err(),
            "node 7 of a 7-node shape"
        );
    }

    #[test]
    fn node_counts_include_ancestors_once() {
        // root → 1 → 2, 1 → 3; root → 4
        let parents = [0, 0, 1, 1, 0];
        let mut seen = vec![false; 5];
        assert_eq!(node_count(&[(2, 1), (3, 1)], &parents, &mut seen), 3);
        assert_eq!(node_count(&[(0, 1), (4, 1)], &parents, &mut seen), 1);
        assert!(seen.iter().all(|s| !s));
    }

    #[test]
    fn accumulated_values_become_a_tree() {
        let shape = Shape {
            frames: vec![NO_FRAME, 0, 1, 2],
            parents: vec![0, 0, 1, 0],
        };
        let mut names = Names::default();
        for name in ["main", "work", "gc"] {
            names.push(name);
        }
        let mut sum = Accumulator::new(&shape);
        sum.add(&SparseTree {
            values: vec![(2, 3), (3, 1)],
        });
        sum.add(&SparseTree {
            values: vec![(1, 2), (2, 1)],
        });
        let mut tree = Tree::new();
        sum.merge_into(&shape, &names, &mut tree).unwrap();
        let mut expected = Tree::new();
        expected.insert_names(["main", "work"], 4);
        expected.insert_names(["main"], 2);
        expected.insert_names(["gc"], 1);
        assert_eq!(tree, expected);
    }
}
