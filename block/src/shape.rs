//! A series' shape: the union of the nodes of all its trees in one block, each node a frame id
//! under a parent. Trees are stored as self values of shape nodes (`tree.rs`), so the call
//! structure is paid once per series and block instead of once per tree.
//!
//! Layout (in a chunk header; every integer a varint):
//!
//! ```text
//! node count (not counting the root), root child count
//! per node in preorder, children in frame-name order: frame id, child count
//! ```
//!
//! Node ids are positions in that preorder, the root being 0, so a parent's id is always smaller
//! than its children's.

use std::collections::HashMap;

use crate::codec::{Reader, put_varint};
use crate::error::BlockError;

/// The root has no frame.
pub(crate) const NO_FRAME: u32 = u32::MAX;

/// A decoded shape. See the [module documentation](self).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    /// `frames[i]` is node `i`'s frame id in the block's name table; the root's is [`NO_FRAME`].
    pub(crate) frames: Vec<u32>,
    /// `parents[i]` is node `i`'s parent; the root's is 0.
    pub(crate) parents: Vec<u32>,
}

impl Shape {
    /// The number of nodes, the root included.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Whether the shape has only its root.
    pub fn is_empty(&self) -> bool {
        self.frames.len() <= 1
    }

    /// The largest frame id the shape uses, if it has any node besides the root.
    pub(crate) fn max_frame(&self) -> Option<u32> {
        self.frames.iter().skip(1).copied().max()
    }

    /// Appends the encoding.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let mut children = vec![0u64; self.frames.len()];
        for &parent in self.parents.iter().skip(1) {
            children[parent as usize] += 1;
        }
        put_varint(out, (self.frames.len() - 1) as u64);
        put_varint(out, children[0]);
        for (&frame, &count) in self.frames.iter().zip(&children).skip(1) {
            put_varint(out, u64::from(frame));
            put_varint(out, count);
        }
    }

    /// Decodes a shape, checking that every frame id is below `names`.
    pub(crate) fn decode(r: &mut Reader<'_>, names: u32) -> Result<Shape, BlockError> {
        let count = r.count("shape node", 2)?;
        let mut shape = Shape {
            frames: Vec::with_capacity(count + 1),
            parents: Vec::with_capacity(count + 1),
        };
        shape.frames.push(NO_FRAME);
        shape.parents.push(0);
        let root_children = r.varint("root child count")?;
        // (node, children still to read); a child count larger than the remaining node count is
        // caught when the nodes run out before the counts do.
        let mut open: Vec<(u32, u64)> = vec![(0, root_children)];
        for node in 1..=count as u32 {
            while open.last().is_some_and(|&(_, left)| left == 0) {
                open.pop();
            }
            let Some((parent, left)) = open.last_mut() else {
                return Err(r.invalid("shape", "more nodes than the child counts hold"));
            };
            *left -= 1;
            let parent = *parent;
            let frame = r.varint_u32("shape frame")?;
            if frame >= names {
                return Err(r.invalid("shape frame", "not in the name table"));
            }
            let children = r.varint("shape child count")?;
            shape.frames.push(frame);
            shape.parents.push(parent);
            open.push((node, children));
        }
        if open.iter().any(|&(_, left)| left > 0) {
            return Err(r.invalid("shape", "child counts claim more nodes than there are"));
        }
        Ok(shape)
    }
}

/// A shape being built: nodes keyed by (parent, frame), in insertion order, with frame ids of
/// whatever name space the builder uses.
#[derive(Clone, Debug)]
pub(crate) struct Trie {
    pub(crate) frames: Vec<u32>,
    pub(crate) parents: Vec<u32>,
    index: HashMap<(u32, u32), u32, foldhash::fast::RandomState>,
}

impl Default for Trie {
    fn default() -> Self {
        Trie {
            frames: vec![NO_FRAME],
            parents: vec![0],
            index: HashMap::default(),
        }
    }
}

impl Trie {
    /// The child of `parent` for `frame`, created if missing.
    pub(crate) fn child(&mut self, parent: u32, frame: u32) -> u32 {
        let next = self.frames.len() as u32;
        let child = *self.index.entry((parent, frame)).or_insert(next);
        if child == next {
            self.frames.push(frame);
            self.parents.push(parent);
        }
        child
    }

    pub(crate) fn len(&self) -> usize {
        self.frames.len()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::error::Section;

    proptest! {
        /// Behind the chunk's CRC: arbitrary bytes decode to a valid shape or an error.
        #[test]
        fn arbitrary_shapes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
            let mut r = Reader::new(&bytes, Section::Chunk { series: 0 });
            if let Ok(shape) = Shape::decode(&mut r, 8) {
                prop_assert!(shape.parents.iter().enumerate().skip(1).all(|(i, &p)| (p as usize) < i));
            }
        }
    }

    #[test]
    fn shapes_round_trip_and_reject_bad_counts() {
        // root → a(0) → b(1); root → c(2)
        let shape = Shape {
            frames: vec![NO_FRAME, 0, 1, 2],
            parents: vec![0, 0, 1, 0],
        };
        let mut bytes = Vec::new();
        shape.encode(&mut bytes);
        let mut r = Reader::new(&bytes, Section::Chunk { series: 0 });
        assert_eq!(Shape::decode(&mut r, 3).unwrap(), shape);
        r.finish().unwrap();
        let mut r = Reader::new(&bytes, Section::Chunk { series: 0 });
        assert!(
            Shape::decode(&mut r, 2).is_err(),
            "frame 2 outside a table of 2"
        );

        // Three nodes claimed, but the root has one child that has none.
        let bad = [3, 1, 0, 0, 0, 0, 0, 0];
        let mut r = Reader::new(&bad, Section::Chunk { series: 0 });
        assert!(Shape::decode(&mut r, 1).is_err());
    }
}
