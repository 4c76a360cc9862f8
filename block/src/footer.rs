//! The fixed-size tail and the section directory: the first things a reader fetches, and all it
//! needs to find every other part of a block with ranged reads.

use std::ops::Range;

use crate::codec::{self, Codec, Reader, put_varint};
use crate::error::{BlockError, Problem, Section};

/// The 8 bytes that open and close every block.
pub const MAGIC: [u8; 8] = *b"SMOLDBLK";
/// The format version this build writes, and the newest it reads.
pub const VERSION: u16 = 1;
/// The length of the fixed tail at the end of every block.
pub const TAIL_LEN: u64 = 32;
/// The shortest possible block: the head magic and the tail (the directory may not be empty,
/// but this is checked when it is read).
pub const MIN_BLOCK_LEN: u64 = MAGIC.len() as u64 + TAIL_LEN;

/// Caps on what a reader allocates for a block, whatever the block claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The most bytes one section or chunk header may decompress to. Default 1 GiB.
    pub max_section_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_section_bytes: 1 << 30,
        }
    }
}

/// Bytes of a block that the caller fetched: `bytes` are the block's bytes from offset `start`.
///
/// A reader step asks for a range, and takes any `Fetched` that covers it: the exact range, a
/// larger suffix read in one request, or the whole block read from a local file.
#[derive(Clone, Copy, Debug)]
pub struct Fetched<'a> {
    start: u64,
    bytes: &'a [u8],
}

impl<'a> Fetched<'a> {
    /// `bytes` are the block's bytes starting at offset `start`.
    pub fn new(start: u64, bytes: &'a [u8]) -> Self {
        Fetched { start, bytes }
    }

    /// The whole block.
    pub fn whole(block: &'a [u8]) -> Self {
        Fetched::new(0, block)
    }

    /// The bytes of `range`, or [`BlockError::NotFetched`] naming `section`.
    pub(crate) fn get(&self, range: Range<u64>, section: Section) -> Result<&'a [u8], BlockError> {
        let missing = || BlockError::NotFetched {
            section,
            start: range.start,
            end: range.end,
        };
        let from = range.start.checked_sub(self.start).ok_or_else(missing)?;
        let to = range.end.checked_sub(self.start).ok_or_else(missing)?;
        let from = usize::try_from(from).map_err(|_| missing())?;
        let to = usize::try_from(to).map_err(|_| missing())?;
        self.bytes.get(from..to).ok_or_else(missing)
    }
}

/// An app deletion a block was built with: every tree of the series of `app` whose bucket
/// starts before `horizon` (Unix seconds) was left out of it. A reader that knows a deletion
/// of `app` with a later horizon than the block lists (or none) must not trust the block's
/// series of `app`: they were written before that deletion.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deletion {
    /// The app's name.
    pub app: String,
    /// Unix seconds: the app's buckets starting before it are gone.
    pub horizon: u64,
}

impl Deletion {
    /// Whether this deletion removes the bucket starting at `bucket` of a series of `app`.
    pub fn removes(&self, app: &str, bucket: u64) -> bool {
        self.app == app && bucket < self.horizon
    }
}

/// `deletions` as a block lists them: one per app (the latest horizon), in app order.
pub(crate) fn canonical_deletions(mut deletions: Vec<Deletion>) -> Vec<Deletion> {
    deletions.sort_by(|a, b| a.app.cmp(&b.app).then(b.horizon.cmp(&a.horizon)));
    deletions.dedup_by(|later, first| later.app == first.app);
    deletions
}

/// The horizon of the deletion of `app` in `deletions` (canonical), if any.
pub(crate) fn horizon_of(deletions: &[Deletion], app: &str) -> Option<u64> {
    deletions
        .binary_search_by(|d| d.app.as_str().cmp(app))
        .ok()
        .map(|at| deletions[at].horizon)
}

/// The kinds of section, as the directory numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Meta = 1,
    Names = 2,
    Series = 3,
    Postings = 4,
    Markers = 5,
    Trees = 6,
    Sources = 7,
    Deletions = 8,
    Spans = 16,
    SpanIndex = 17,
}

impl Kind {
    /// The kinds every block has.
    const REQUIRED: [Kind; 6] = [
        Kind::Meta,
        Kind::Names,
        Kind::Series,
        Kind::Postings,
        Kind::Markers,
        Kind::Trees,
    ];

    /// The kinds a block may have, which readers of version 1 that predate them skip.
    const OPTIONAL: [Kind; 4] = [Kind::Sources, Kind::Deletions, Kind::Spans, Kind::SpanIndex];

    fn from_byte(byte: u8) -> Option<Kind> {
        Kind::REQUIRED
            .into_iter()
            .chain(Kind::OPTIONAL)
            .find(|kind| *kind as u8 == byte)
    }

    /// Whether a reader that does not know the kind must refuse the block.
    pub(crate) fn required(self) -> bool {
        !Kind::OPTIONAL.contains(&self)
    }

    pub(crate) fn section(self) -> Section {
        match self {
            Kind::Meta => Section::Meta,
            Kind::Names => Section::Names,
            Kind::Series => Section::Series,
            Kind::Postings => Section::Postings,
            Kind::Markers => Section::Markers,
            Kind::Trees => Section::Trees,
            Kind::Sources => Section::Sources,
            Kind::Deletions => Section::Deletions,
            Kind::Spans => Section::Spans,
            Kind::SpanIndex => Section::SpanIndex,
        }
    }
}

/// Directory flag: a reader that does not know this section's kind must refuse the block.
const REQUIRED: u8 = 1;

/// One section as the directory records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) kind: u8,
    pub(crate) required: bool,
    pub(crate) codec: Codec,
    pub(crate) offset: u64,
    pub(crate) stored_len: u64,
    pub(crate) raw_len: u64,
    pub(crate) crc: u32,
}

impl Entry {
    pub(crate) fn range(&self) -> Range<u64> {
        self.offset..self.offset + self.stored_len
    }

    pub(crate) fn section(&self) -> Section {
        Kind::from_byte(self.kind).map_or(Section::Optional { kind: self.kind }, Kind::section)
    }
}

/// The decoded tail: where the directory is and which version wrote the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tail {
    block_len: u64,
    directory: Range64,
    directory_crc: u32,
    version: u16,
}

/// A `Range<u64>` that is `Copy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range64 {
    start: u64,
    end: u64,
}

impl Tail {
    /// The range to fetch first: the last [`TAIL_LEN`] bytes of a block of `block_len` bytes
    /// (all of it if it is shorter). Fetching a larger suffix at once saves a round trip: the
    /// directory and the small sections sit just before the tail.
    pub fn range(block_len: u64) -> Range<u64> {
        block_len.saturating_sub(TAIL_LEN)..block_len
    }

    /// Decodes the tail of a block of `block_len` bytes from `fetched`, which must cover
    /// [`Tail::range`].
    ///
    /// # Errors
    ///
    /// [`BlockError::TooShort`], [`BlockError::BadMagic`] (not a block, or truncated),
    /// [`BlockError::UnsupportedVersion`], or a malformed tail.
    pub fn decode(block_len: u64, fetched: &Fetched<'_>) -> Result<Tail, BlockError> {
        if block_len < MIN_BLOCK_LEN {
            return Err(BlockError::TooShort {
                len: block_len,
                min: MIN_BLOCK_LEN,
            });
        }
        let bytes = fetched.get(Tail::range(block_len), Section::Tail)?;
        if bytes[24..32] != MAGIC {
            return Err(BlockError::BadMagic {
                section: Section::Tail,
            });
        }
        let version = u16::from_le_bytes([bytes[16], bytes[17]]);
        if version == 0 || version > VERSION {
            return Err(BlockError::UnsupportedVersion {
                found: version,
                supported: VERSION,
            });
        }
        if bytes[18..24] != [0; 6] {
            return Err(BlockError::Malformed {
                section: Section::Tail,
                offset: 18,
                problem: Problem::Invalid {
                    field: "reserved bytes",
                    reason: "not zero",
                },
            });
        }
        let start = u64::from_le_bytes(bytes[0..8].try_into().expect("8 bytes"));
        let len = u64::from(u32::from_le_bytes(
            bytes[8..12].try_into().expect("4 bytes"),
        ));
        let directory_crc = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
        let end = start.saturating_add(len);
        if start < MAGIC.len() as u64 || end != block_len - TAIL_LEN {
            return Err(BlockError::OutOfBounds {
                section: Section::Tail,
                start,
                end,
                within: "the bytes between the head and the tail",
            });
        }
        Ok(Tail {
            block_len,
            directory: Range64 { start, end },
            directory_crc,
            version,
        })
    }

    /// The range to fetch second: the section directory.
    pub fn directory_range(&self) -> Range<u64> {
        self.directory.start..self.directory.end
    }

    /// The format version that wrote the block.
    pub fn version(&self) -> u16 {
        self.version
    }
}

/// The section directory of a block: where each section is, how it is stored, its CRC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footer {
    block_len: u64,
    version: u16,
    entries: Vec<Entry>,
}

impl Footer {
    /// Decodes the directory that `tail` points to, from `fetched`, which must cover
    /// [`Tail::directory_range`].
    ///
    /// # Errors
    ///
    /// [`BlockError::Checksum`] or a malformed directory; [`BlockError::UnknownRequiredSection`]
    /// for a newer format's required section; [`BlockError::MissingSection`];
    /// [`BlockError::OutOfBounds`] when sections overlap or leave the data area.
    pub fn decode(tail: &Tail, fetched: &Fetched<'_>) -> Result<Footer, BlockError> {
        let bytes = fetched.get(tail.directory_range(), Section::Directory)?;
        let computed = codec::crc(bytes);
        if computed != tail.directory_crc {
            return Err(BlockError::Checksum {
                section: Section::Directory,
                stored: tail.directory_crc,
                computed,
            });
        }
        let mut r = Reader::new(bytes, Section::Directory);
        let count = r.count("section", 8)?;
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let kind = r.byte("section kind")?;
            let flags = r.byte("section flags")?;
            if flags & !REQUIRED != 0 {
                return Err(r.invalid("section flags", "unknown flag bits set"));
            }
            let codec = Codec::from_byte(r.byte("section codec")?)
                .ok_or_else(|| r.invalid("section codec", "unknown codec"))?;
            let offset = r.varint("section offset")?;
            let stored_len = r.varint("section length")?;
            let raw_len = r.varint("section raw length")?;
            let crc = r.u32_le("section crc")?;
            let required = flags & REQUIRED != 0;
            if Kind::from_byte(kind).is_none() && required {
                return Err(BlockError::UnknownRequiredSection { kind });
            }
            if entries.iter().any(|e: &Entry| e.kind == kind) {
                return Err(r.invalid("section kind", "listed twice"));
            }
            let end = offset.saturating_add(stored_len);
            if offset < MAGIC.len() as u64 || end > tail.directory.start {
                return Err(BlockError::OutOfBounds {
                    section: Section::Directory,
                    start: offset,
                    end,
                    within: "the bytes between the head and the directory",
                });
            }
            entries.push(Entry {
                kind,
                required,
                codec,
                offset,
                stored_len,
                raw_len,
                crc,
            });
        }
        r.finish()?;
        let mut sorted: Vec<&Entry> = entries.iter().collect();
        sorted.sort_by_key(|e| e.offset);
        if let Some(pair) = sorted.windows(2).find(|w| w[0].range().end > w[1].offset) {
            return Err(BlockError::OutOfBounds {
                section: Section::Directory,
                start: pair[1].offset,
                end: pair[1].range().end,
                within: "its own bytes: sections overlap",
            });
        }
        let footer = Footer {
            block_len: tail.block_len,
            version: tail.version,
            entries,
        };
        for kind in Kind::REQUIRED {
            footer.entry(kind)?;
        }
        Ok(footer)
    }

    /// The block's length.
    pub fn block_len(&self) -> u64 {
        self.block_len
    }

    /// The format version that wrote the block.
    pub fn version(&self) -> u16 {
        self.version
    }

    /// Every section with its byte range, in directory order: what `check` reports and what
    /// a test damages.
    pub fn sections(&self) -> Vec<(Section, Range<u64>)> {
        self.entries
            .iter()
            .map(|e| (e.section(), e.range()))
            .collect()
    }

    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub(crate) fn entry(&self, kind: Kind) -> Result<&Entry, BlockError> {
        self.entries
            .iter()
            .find(|e| e.kind == kind as u8)
            .ok_or(BlockError::MissingSection {
                section: kind.section(),
            })
    }

    fn range(&self, kind: Kind) -> Range<u64> {
        self.entry(kind)
            .expect("decode checked that every kind is present")
            .range()
    }

    /// The range to fetch for [`Index::decode`](crate::Index::decode): the meta, series,
    /// postings and markers sections, which the writer places side by side.
    pub fn index_range(&self) -> Range<u64> {
        [Kind::Meta, Kind::Series, Kind::Postings, Kind::Markers]
            .into_iter()
            .map(|kind| self.range(kind))
            .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end))
            .expect("four kinds")
    }

    /// The range to fetch for [`Names::decode`](crate::Names::decode).
    pub fn names_range(&self) -> Range<u64> {
        self.range(Kind::Names)
    }

    /// The range of the trees section, where every series' chunk lies.
    pub fn trees_range(&self) -> Range<u64> {
        self.range(Kind::Trees)
    }

    /// The range to fetch for [`Footer::sources`], when the block has a sources section (only
    /// a merged block that replaces others has one).
    pub fn sources_range(&self) -> Option<Range<u64>> {
        self.entry(Kind::Sources).ok().map(Entry::range)
    }

    /// The range to fetch for [`Footer::deletions`], when the block has a deletions section
    /// (only a block built while an app deletion applied to its range has one).
    pub fn deletions_range(&self) -> Option<Range<u64>> {
        self.entry(Kind::Deletions).ok().map(Entry::range)
    }

    /// The range to fetch for [`SpanIndex::decode`](crate::SpanIndex::decode), when the block
    /// has span profiles; read it with the index.
    pub fn span_index_range(&self) -> Option<Range<u64>> {
        self.entry(Kind::SpanIndex).ok().map(Entry::range)
    }

    /// The ids of the blocks this block replaces (its sources section; empty without one),
    /// from `fetched`, which must cover [`Footer::sources_range`]. A store that finds this
    /// block hides those blocks, so that the data of a compaction's inputs is counted once
    /// while their files still exist.
    ///
    /// # Errors
    ///
    /// A [`BlockError`] naming the sources section.
    pub fn sources(
        &self,
        fetched: &Fetched<'_>,
        limits: &Limits,
    ) -> Result<Vec<String>, BlockError> {
        if self.sources_range().is_none() {
            return Ok(Vec::new());
        }
        let raw = self.read(Kind::Sources, fetched, limits)?;
        let mut r = Reader::new(&raw, Section::Sources);
        let count = r.count("source", 1)?;
        let mut sources = Vec::with_capacity(count);
        for _ in 0..count {
            sources.push(r.str("source id")?.to_owned());
        }
        r.finish()?;
        Ok(sources)
    }

    /// The app deletions the block was built with (its deletions section; empty without one),
    /// from `fetched`, which must cover [`Footer::deletions_range`]: each app's trees of
    /// buckets before its horizon were left out of the block. One per app, in app order.
    ///
    /// # Errors
    ///
    /// A [`BlockError`] naming the deletions section, also when an app is listed twice or out
    /// of order.
    pub fn deletions(
        &self,
        fetched: &Fetched<'_>,
        limits: &Limits,
    ) -> Result<Vec<Deletion>, BlockError> {
        if self.deletions_range().is_none() {
            return Ok(Vec::new());
        }
        let raw = self.read(Kind::Deletions, fetched, limits)?;
        let mut r = Reader::new(&raw, Section::Deletions);
        // An app name and a horizon: at least two bytes.
        let count = r.count("deletion", 2)?;
        let mut deletions: Vec<Deletion> = Vec::with_capacity(count);
        for _ in 0..count {
            let app = r.str("deleted app")?.to_owned();
            let horizon = r.varint("deletion horizon")?;
            if deletions.last().is_some_and(|last| last.app >= app) {
                return Err(r.invalid("deleted app", "listed twice or out of order"));
            }
            deletions.push(Deletion { app, horizon });
        }
        r.finish()?;
        Ok(deletions)
    }

    /// Checks and decompresses section `kind` from `fetched`.
    pub(crate) fn read(
        &self,
        kind: Kind,
        fetched: &Fetched<'_>,
        limits: &Limits,
    ) -> Result<Vec<u8>, BlockError> {
        let entry = self.entry(kind)?;
        let stored = fetched.get(entry.range(), kind.section())?;
        codec::open(
            kind.section(),
            stored,
            entry.codec,
            entry.raw_len,
            entry.crc,
            limits.max_section_bytes,
        )
    }
}

/// Appends the directory and tail for `entries` to `out`, the directory starting at offset
/// `start` of the block.
pub(crate) fn write(out: &mut Vec<u8>, start: u64, entries: &[Entry]) {
    let mut directory = Vec::new();
    put_varint(&mut directory, entries.len() as u64);
    for entry in entries {
        directory.push(entry.kind);
        directory.push(if entry.required { REQUIRED } else { 0 });
        directory.push(entry.codec as u8);
        put_varint(&mut directory, entry.offset);
        put_varint(&mut directory, entry.stored_len);
        put_varint(&mut directory, entry.raw_len);
        directory.extend_from_slice(&entry.crc.to_le_bytes());
    }
    out.extend_from_slice(&directory);
    out.extend_from_slice(&start.to_le_bytes());
    let len = u32::try_from(directory.len()).expect("a directory of a few sections");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&codec::crc(&directory).to_le_bytes());
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&[0; 6]);
    out.extend_from_slice(&MAGIC);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetched_serves_only_what_it_holds() {
        let bytes = [1, 2, 3, 4];
        let fetched = Fetched::new(10, &bytes);
        assert_eq!(fetched.get(11..13, Section::Meta).unwrap(), [2, 3]);
        assert!(matches!(
            fetched.get(9..12, Section::Meta),
            Err(BlockError::NotFetched { start: 9, .. })
        ));
        assert!(fetched.get(12..15, Section::Meta).is_err());
    }

    #[test]
    fn a_short_or_foreign_tail_is_named() {
        assert!(matches!(
            Tail::decode(10, &Fetched::whole(&[0; 10])),
            Err(BlockError::TooShort { len: 10, .. })
        ));
        let err = Tail::decode(64, &Fetched::whole(&[0; 64])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "tail does not carry the block magic: not a Smolder block, or truncated"
        );
    }
}
