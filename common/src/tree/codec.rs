//! The tree's binary encoding, used on the wire and at rest.

use super::{FrameId, NONE, Node, NodeId, Tree, add};
use crate::varint::{self, VarintError};

/// First byte of every encoded tree.
const MAGIC: u8 = b'T';
/// The encoding version this build writes and reads.
pub(crate) const VERSION: u8 = 1;
/// A node takes at least two bytes (tag and frame), which bounds how many nodes an input of a
/// given length can claim before anything is allocated for them.
const MIN_NODE_BYTES: usize = 2;

/// Why bytes could not be decoded as a tree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input does not start with the tree magic byte.
    #[error("not an encoded tree: first byte is {found:#04x}, expected {MAGIC:#04x}")]
    BadMagic {
        /// The first byte found.
        found: u8,
    },
    /// The input was written by an encoding version this build does not read.
    #[error("unsupported tree encoding version {version} (this build reads {VERSION})")]
    UnsupportedVersion {
        /// The version byte found.
        version: u8,
    },
    /// The input ends in the middle of a field.
    #[error("tree truncated at byte {offset} while reading {field}")]
    Truncated {
        /// Where the input ended.
        offset: usize,
        /// The field being read.
        field: &'static str,
    },
    /// A varint is longer than ten bytes or does not fit in 64 bits.
    #[error("malformed varint at byte {offset}")]
    BadVarint {
        /// Where the varint starts.
        offset: usize,
    },
    /// A count claims more items than the remaining bytes could hold.
    #[error("{field} count {count} is more than the {remaining} remaining bytes can hold")]
    CountTooLarge {
        /// What is being counted.
        field: &'static str,
        /// The count claimed.
        count: u64,
        /// The bytes left after the count.
        remaining: usize,
    },
    /// A frame name is not UTF-8.
    #[error("frame {frame} is not valid UTF-8")]
    InvalidUtf8 {
        /// The index of the frame in the encoded table.
        frame: usize,
    },
    /// A node names a parent above the root.
    #[error("node {node} climbs {up} levels from depth {depth}")]
    BadParent {
        /// The index of the node in the encoded order.
        node: usize,
        /// The levels it climbs.
        up: u64,
        /// The depth of the node before it.
        depth: usize,
    },
    /// A node names a frame outside the table.
    #[error("node {node} names frame {frame}, but the table has {frames}")]
    BadFrame {
        /// The index of the node in the encoded order.
        node: usize,
        /// The frame index it names.
        frame: u64,
        /// The table's size.
        frames: usize,
    },
    /// Bytes remain after the last node.
    #[error("{extra} trailing bytes after the last node")]
    TrailingBytes {
        /// How many.
        extra: usize,
    },
}

impl Tree {
    /// Encodes the tree; see [`Tree::decode`] for the layout.
    ///
    /// The encoding is canonical: trees that hold the same stacks encode to the same bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.nodes.len() * 5);
        self.encode_into(&mut out);
        out
    }

    /// Appends the encoding to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let order = self.ordered();
        // Frames are numbered by first use in the walk, so the most-used ones (near the root)
        // get the shortest varints and unused table entries are dropped.
        let mut number = vec![u32::MAX; self.frames.len()];
        let mut used: Vec<u32> = Vec::new();
        order.walk(|node, _| {
            let frame = self.nodes[node as usize].frame as usize;
            if node != NodeId::ROOT.0 && number[frame] == u32::MAX {
                number[frame] = used.len() as u32;
                used.push(frame as u32);
            }
            true
        });

        out.push(MAGIC);
        out.push(VERSION);
        varint::put(out, used.len() as u64);
        for &frame in &used {
            let name = self.frames.name(FrameId(frame));
            varint::put(out, name.len() as u64);
            out.extend_from_slice(name.as_bytes());
        }
        varint::put(out, self.len() as u64);
        varint::put(out, self.nodes[0].self_value);
        let mut previous_depth = 0;
        order.walk(|node, depth| {
            if node == NodeId::ROOT.0 {
                return true;
            }
            let n = &self.nodes[node as usize];
            let up = (previous_depth + 1 - depth) as u64;
            varint::put(out, (up << 1) | u64::from(n.self_value != 0));
            varint::put(out, u64::from(number[n.frame as usize]));
            if n.self_value != 0 {
                varint::put(out, n.self_value);
            }
            previous_depth = depth;
            true
        });
    }

    /// Decodes a tree written by [`Tree::encode`], from untrusted bytes.
    ///
    /// Layout, version 1 (all integers are LEB128 varints):
    ///
    /// ```text
    /// 'T' 0x01
    /// frame count, then per frame: byte length, UTF-8 name
    /// node count (not counting the root), root self
    /// per node, in preorder with children in name order:
    ///   tag = up << 1 | has_self, frame index, self (only if has_self)
    /// ```
    ///
    /// `up` is how many levels the node's parent sits above the previous node in the walk: 0
    /// for a first child, 1 for a sibling of the previous leaf, and so on. This is the parent
    /// delta of a preorder walk; it is almost always one byte. Totals are not stored: they are
    /// the sums of self values below each node.
    ///
    /// Decoding never panics and allocates at most in proportion to the input's length. A
    /// stack that appears twice is summed, as [`Tree::insert`] would.
    ///
    /// # Errors
    ///
    /// A [`DecodeError`] naming the field and position that is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Tree, DecodeError> {
        let mut r = Reader { bytes, offset: 0 };
        let magic = r.byte("magic")?;
        if magic != MAGIC {
            return Err(DecodeError::BadMagic { found: magic });
        }
        let version = r.byte("version")?;
        if version != VERSION {
            return Err(DecodeError::UnsupportedVersion { version });
        }

        let mut tree = Tree::new();
        let frame_count = r.count("frame", 1)?;
        let mut frames = Vec::with_capacity(frame_count);
        for frame in 0..frame_count {
            let len = r.count("frame name byte", 1)?;
            let name = r.take(len, "frame name")?;
            let name = std::str::from_utf8(name).map_err(|_| DecodeError::InvalidUtf8 { frame })?;
            frames.push(tree.frames.intern(name).0);
        }

        let node_count = r.count("node", MIN_NODE_BYTES)?;
        tree.nodes.reserve(node_count);
        tree.nodes[0].self_value = r.varint("root self")?;
        // `parent[i]` is the parent of node i; children always come after their parent, so one
        // backwards pass sums the totals.
        let mut parent: Vec<u32> = Vec::with_capacity(node_count + 1);
        parent.push(NONE);
        let mut path: Vec<u32> = vec![NodeId::ROOT.0];
        for index in 0..node_count {
            let tag = r.varint("node tag")?;
            let up = tag >> 1;
            let depth = path.len() - 1;
            if up > depth as u64 {
                return Err(DecodeError::BadParent {
                    node: index,
                    up,
                    depth,
                });
            }
            path.truncate(path.len() - up as usize);
            let frame = r.varint("node frame")?;
            let &frame = frames.get(frame as usize).ok_or(DecodeError::BadFrame {
                node: index,
                frame,
                frames: frames.len(),
            })?;
            let self_value = if tag & 1 == 1 {
                r.varint("node self")?
            } else {
                0
            };

            let at = *path.last().expect("path always holds the root");
            let before = tree.nodes.len();
            let child = tree.child_or_insert(at, frame);
            if tree.nodes.len() > before {
                parent.push(at);
            }
            add(&mut tree.nodes[child as usize].self_value, self_value);
            path.push(child);
        }
        if r.offset != bytes.len() {
            return Err(DecodeError::TrailingBytes {
                extra: bytes.len() - r.offset,
            });
        }

        for node in tree.nodes.iter_mut() {
            node.total = node.self_value;
        }
        for child in (1..tree.nodes.len()).rev() {
            let total = tree.nodes[child].total;
            let Node {
                total: parent_total,
                ..
            } = &mut tree.nodes[parent[child] as usize];
            add(parent_total, total);
        }
        Ok(tree)
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        let byte = *self.bytes.get(self.offset).ok_or(DecodeError::Truncated {
            offset: self.offset,
            field,
        })?;
        self.offset += 1;
        Ok(byte)
    }

    fn varint(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let start = self.offset;
        match varint::get_strict(&self.bytes[start..]) {
            Ok((value, len)) => {
                self.offset += len;
                Ok(value)
            }
            Err(VarintError::Truncated) => {
                self.offset = self.bytes.len();
                Err(DecodeError::Truncated {
                    offset: self.offset,
                    field,
                })
            }
            Err(VarintError::Overlong) => Err(DecodeError::BadVarint { offset: start }),
        }
    }

    /// Reads a count of items that each take at least `min_bytes`, rejecting counts the rest of
    /// the input cannot hold.
    fn count(&mut self, field: &'static str, min_bytes: usize) -> Result<usize, DecodeError> {
        let count = self.varint(field)?;
        let remaining = self.bytes.len() - self.offset;
        if count > (remaining / min_bytes) as u64 {
            return Err(DecodeError::CountTooLarge {
                field,
                count,
                remaining,
            });
        }
        Ok(count as usize)
    }

    fn take(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let end = self.offset + len;
        let slice = self
            .bytes
            .get(self.offset..end)
            .ok_or(DecodeError::Truncated {
                offset: self.bytes.len(),
                field,
            })?;
        self.offset = end;
        Ok(slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Tree {
        let mut tree = Tree::new();
        tree.insert_names(["main", "handler", "json.Marshal"], 37);
        tree.insert_names(["main", "gc"], 5);
        tree.insert_names(["main"], 2);
        tree.insert_names(["other thread"], 1);
        tree
    }

    #[test]
    fn round_trips() {
        let tree = sample();
        let decoded = Tree::decode(&tree.encode()).unwrap();
        assert_eq!(decoded, tree);
        assert_eq!(decoded.total(), 45);
        assert_eq!(decoded.len(), tree.len());
    }

    #[test]
    fn encoding_is_canonical() {
        let mut a = Tree::new();
        a.insert_names(["x", "y"], 1);
        a.insert_names(["b"], 2);
        let mut b = Tree::new();
        b.intern("unused");
        b.insert_names(["b"], 2);
        b.insert_names(["x", "y"], 1);
        assert_eq!(a.encode(), b.encode());
    }

    #[test]
    fn empty_tree_round_trips() {
        let tree = Tree::new();
        assert_eq!(tree.encode(), [b'T', 1, 0, 0, 0]);
        assert_eq!(Tree::decode(&tree.encode()).unwrap(), tree);
    }

    #[test]
    fn rejects_what_it_cannot_read() {
        let good = sample().encode();
        assert_eq!(
            Tree::decode(&[]),
            Err(DecodeError::Truncated {
                offset: 0,
                field: "magic"
            })
        );
        assert_eq!(
            Tree::decode(b"X\x01"),
            Err(DecodeError::BadMagic { found: b'X' })
        );
        assert_eq!(
            Tree::decode(b"T\x09"),
            Err(DecodeError::UnsupportedVersion { version: 9 })
        );
        assert!(matches!(
            Tree::decode(b"T\x01\xff\xff\xff\xff\x0f"),
            Err(DecodeError::CountTooLarge { field: "frame", .. })
        ));
        for cut in 0..good.len() {
            assert!(
                Tree::decode(&good[..cut]).is_err(),
                "prefix of {cut} bytes decoded"
            );
        }
        let mut long = good.clone();
        long.push(0);
        assert_eq!(
            Tree::decode(&long),
            Err(DecodeError::TrailingBytes { extra: 1 })
        );
    }

    #[test]
    fn rejects_bad_parents_and_frames() {
        // One frame "a", two nodes: the second climbs above the root.
        let bytes = [b'T', 1, 1, 1, b'a', 2, 0, 0, 0, 4, 0];
        assert!(matches!(
            Tree::decode(&bytes),
            Err(DecodeError::BadParent { node: 1, .. })
        ));
        let bytes = [b'T', 1, 1, 1, b'a', 1, 0, 0, 7];
        assert!(matches!(
            Tree::decode(&bytes),
            Err(DecodeError::BadFrame { frame: 7, .. })
        ));
    }

    #[test]
    fn duplicate_siblings_are_summed() {
        // Two root children both naming frame "a", self 1 and 2.
        let bytes = [b'T', 1, 1, 1, b'a', 2, 0, 1, 0, 1, 3, 0, 2];
        let tree = Tree::decode(&bytes).unwrap();
        assert_eq!(tree.len(), 1);
        assert_eq!(tree.total(), 3);
    }
}
