//! The frame-name table: every frame name of a block, stored once, numbered by first use.

use std::collections::HashMap;

use crate::codec::{Reader, put_str, put_varint};
use crate::error::{BlockError, Section};
use crate::footer::{Fetched, Footer, Kind, Limits};

/// A block's frame names, indexed by the frame ids that its shapes hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Names {
    /// Every name, back to back.
    text: String,
    /// `ends[i]` is where name `i` ends in `text`.
    ends: Vec<u32>,
}

impl Names {
    /// Decodes the names section from `fetched`, which must cover
    /// [`Footer::names_range`].
    ///
    /// # Errors
    ///
    /// A [`BlockError`] naming the names section.
    pub fn decode(
        footer: &Footer,
        fetched: &Fetched<'_>,
        limits: &Limits,
    ) -> Result<Names, BlockError> {
        let raw = footer.read(Kind::Names, fetched, limits)?;
        let mut r = Reader::new(&raw, Section::Names);
        let count = r.count("name", 1)?;
        let mut names = Names {
            text: String::with_capacity(r.remaining()),
            ends: Vec::with_capacity(count),
        };
        for _ in 0..count {
            let name = r.str("name")?;
            names.text.push_str(name);
            // The section is capped far below 4 GiB by `Limits`.
            let end = u32::try_from(names.text.len())
                .map_err(|_| r.invalid("name", "the table passes 4 GiB"))?;
            names.ends.push(end);
        }
        r.finish()?;
        Ok(names)
    }

    /// The name of frame `id`, or `None` when the table has no such id.
    pub fn get(&self, id: u32) -> Option<&str> {
        let end = *self.ends.get(id as usize)? as usize;
        let start = match id {
            0 => 0,
            _ => self.ends[id as usize - 1] as usize,
        };
        Some(&self.text[start..end])
    }

    /// How many names.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Every name, in id order.
    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.ends.len() as u32).map(|id| self.get(id).expect("id below len"))
    }

    /// Appends a name, returning its id.
    pub(crate) fn push(&mut self, name: &str) -> u32 {
        self.text.push_str(name);
        self.ends.push(
            u32::try_from(self.text.len()).expect("a block's names stay below 4 GiB of text"),
        );
        (self.ends.len() - 1) as u32
    }

    /// The section's raw bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.text.len() + 2 * self.ends.len() + 8);
        put_varint(&mut out, self.ends.len() as u64);
        for name in self.iter() {
            put_str(&mut out, name);
        }
        out
    }
}

/// A name table being built: each name once, numbered by first use. Names come from untrusted
/// input, so the index hashes with a per-process random seed; ids do not depend on it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Interner {
    names: Names,
    ids: HashMap<Box<str>, u32, foldhash::fast::RandomState>,
}

impl Interner {
    /// The id of `name`, added if new.
    pub(crate) fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.push(name);
        self.ids.insert(name.into(), id);
        id
    }

    /// The name of an id this interner issued.
    pub(crate) fn name(&self, id: u32) -> &str {
        self.names.get(id).expect("an id this interner issued")
    }

    pub(crate) fn names(&self) -> &Names {
        &self.names
    }
}
