//! The frame table: every distinct frame name of a tree, interned once.

use indexmap::IndexSet;

/// The id of an interned frame name, valid only in the [`Frames`] table that issued it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameId(pub(crate) u32);

impl FrameId {
    /// The id as an index into its frame table.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Interned frame names: each distinct name is stored once and named by a [`FrameId`].
///
/// Names come from untrusted input (ingest bodies, agent batches), so the table hashes with a
/// per-process random seed.
#[derive(Clone, Debug, Default)]
pub struct Frames {
    names: IndexSet<Box<str>, foldhash::fast::RandomState>,
}

impl Frames {
    /// Returns the id of `name`, adding it to the table if it is new.
    pub fn intern(&mut self, name: &str) -> FrameId {
        if let Some(index) = self.names.get_index_of(name) {
            return FrameId(index as u32);
        }
        let (index, _) = self.names.insert_full(name.into());
        FrameId(u32::try_from(index).expect("fewer than 2^32 distinct frames in one tree"))
    }

    /// Returns the id of `name` if the table holds it.
    pub fn get(&self, name: &str) -> Option<FrameId> {
        self.names.get_index_of(name).map(|i| FrameId(i as u32))
    }

    /// The name behind `id`.
    ///
    /// # Panics
    ///
    /// If `id` was issued by another table and is out of this table's range.
    pub fn name(&self, id: FrameId) -> &str {
        self.names
            .get_index(id.index())
            .expect("frame id issued by this table")
    }

    /// The number of distinct names.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Every name with its id, in id order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (FrameId, &str)> {
        self.names
            .iter()
            .enumerate()
            .map(|(i, name)| (FrameId(i as u32), &**name))
    }

    /// The position of every frame when the table is sorted by name bytes: `rank[id] < rank[id2]`
    /// iff `name(id) < name(id2)`. Sorting children by rank gives Pyroscope's byte-wise order
    /// without comparing strings per node.
    pub(crate) fn ranks(&self) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.names.len() as u32).collect();
        order.sort_unstable_by(|&a, &b| self.names[a as usize].cmp(&self.names[b as usize]));
        let mut rank = vec![0; order.len()];
        for (position, &id) in order.iter().enumerate() {
            rank[id as usize] = position as u32;
        }
        rank
    }
}
