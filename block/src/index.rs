//! The index of a block: its meta (tenant, range, levels, counts), the series with their
//! metadata and where their chunks lie, the label postings, and the batch markers. A reader
//! fetches it in one ranged read ([`Footer::index_range`]) and then knows which chunks a query
//! needs.
//!
//! Layouts (every integer a varint unless said otherwise; strings are a byte length and UTF-8):
//!
//! ```text
//! meta:     tenant, start, level count, levels…, names, series, trees, level-0 nodes, markers,
//!           compactions
//! series:   string count, strings…, series count, per series:
//!             app (string index), label count, (name, value) string indexes…,
//!             spy name, sample rate, units (string index), aggregation (u8: 0 sum, 1 average),
//!             first bucket − start, last bucket − start,
//!             chunk header codec (u8), stored length, raw length, CRC-32 (u32 LE),
//!             chunk length (header and trees; chunks follow each other in series order)
//! postings: name count, per name (sorted): name (string index of the series section),
//!             value count, per value (sorted): value (string index), series count,
//!             series position deltas (the first is the position)
//! markers:  agent count, per agent (sorted): agent id, sequence count, sequence deltas
//! ```
//!
//! Series are sorted by app name, then labels. `__name__` postings list series by app name.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use smolder_common::series::NAME_LABEL;
use smolder_common::{Aggregation, Labels, MatchOp, ProfileMeta, Selector, Series};

use crate::codec::{Codec, Reader, put_str, put_varint};
use crate::error::{BlockError, Section};
use crate::footer::{Fetched, Footer, Kind, Limits};

/// Identifies one agent batch, so that its data is counted once however often it is sent, cut
/// and compacted.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Marker {
    /// The sending agent's id.
    pub agent_id: String,
    /// The batch's sequence number.
    pub sequence: u64,
}

/// Most levels a block may have: 10 s to 10^16 s is already beyond any retention.
const MAX_LEVELS: usize = 16;

/// What a block holds, from its meta section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockMeta {
    /// The tenant every series of the block belongs to.
    pub tenant: String,
    /// Unix seconds of the block's start, a multiple of its span.
    pub start: u64,
    /// Bucket sizes in seconds, finest first; each divides the next, and the last is the
    /// block's span.
    pub levels: Vec<u64>,
    /// Frame names in the name table.
    pub names: u64,
    /// Series in the index.
    pub series: u64,
    /// Stored trees, rollups included.
    pub trees: u64,
    /// Nodes of the finest-level trees: the stored nodes, as `bytes / nodes` counts them.
    pub nodes: u64,
    /// Batch markers.
    pub markers: u64,
    /// 0 for a block cut from the head; one more than its newest input for a merged block.
    pub compactions: u32,
}

impl BlockMeta {
    /// The block's span in seconds: its coarsest level.
    pub fn span(&self) -> u64 {
        *self.levels.last().expect("decode checks there is a level")
    }

    /// Unix seconds of the block's end (excluded).
    pub fn end(&self) -> u64 {
        self.start + self.span()
    }

    /// The finest bucket in seconds: the block's resolution.
    pub fn finest(&self) -> u64 {
        self.levels[0]
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_str(&mut out, &self.tenant);
        put_varint(&mut out, self.start);
        put_varint(&mut out, self.levels.len() as u64);
        for &level in &self.levels {
            put_varint(&mut out, level);
        }
        for count in [
            self.names,
            self.series,
            self.trees,
            self.nodes,
            self.markers,
        ] {
            put_varint(&mut out, count);
        }
        put_varint(&mut out, u64::from(self.compactions));
        out
    }

    fn decode(bytes: &[u8]) -> Result<BlockMeta, BlockError> {
        let mut r = Reader::new(bytes, Section::Meta);
        let tenant = r.str("tenant")?.to_owned();
        let start = r.varint("start")?;
        let count = r.count("level", 1)?;
        if count == 0 || count > MAX_LEVELS {
            return Err(r.invalid("level count", "must be 1 to 16"));
        }
        let mut levels = Vec::with_capacity(count);
        for _ in 0..count {
            let level = r.varint("level")?;
            let divides = levels
                .last()
                .is_none_or(|&previous: &u64| level > previous && level % previous == 0);
            if level == 0 || !divides {
                return Err(r.invalid("level", "each level must be a multiple of the one before"));
            }
            levels.push(level);
        }
        let span = *levels.last().expect("at least one level");
        if start % span != 0 || start.checked_add(span).is_none() {
            return Err(r.invalid("start", "not a multiple of the span"));
        }
        let names = r.varint("name count")?;
        if names > u64::from(u32::MAX) {
            return Err(r.invalid("name count", "more than 2^32 names"));
        }
        let meta = BlockMeta {
            tenant,
            start,
            levels,
            names,
            series: r.varint("series count")?,
            trees: r.varint("tree count")?,
            nodes: r.varint("node count")?,
            markers: r.varint("marker count")?,
            compactions: r.varint_u32("compactions")?,
        };
        r.finish()?;
        Ok(meta)
    }
}

/// Where a series' chunk lies and how its header is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ChunkLocation {
    /// Absolute offset of the chunk in the block.
    pub(crate) offset: u64,
    pub(crate) header_codec: Codec,
    pub(crate) header_stored: u64,
    pub(crate) header_raw: u64,
    pub(crate) header_crc: u32,
    /// Header and trees.
    pub(crate) len: u64,
}

impl ChunkLocation {
    /// Reads a location as [`ChunkLocation::encode`] writes it, for a chunk at `offset` that
    /// must end inside `within` (`what` names that range in the error).
    pub(crate) fn read(
        r: &mut Reader<'_>,
        offset: u64,
        within: &Range<u64>,
        what: &'static str,
    ) -> Result<ChunkLocation, BlockError> {
        let header_codec = Codec::from_byte(r.byte("chunk codec")?)
            .ok_or_else(|| r.invalid("chunk codec", "unknown codec"))?;
        let header_stored = r.varint("chunk header length")?;
        let header_raw = r.varint("chunk header raw length")?;
        let header_crc = r.u32_le("chunk header crc")?;
        let len = r.varint("chunk length")?;
        let end = offset.checked_add(len).filter(|&end| end <= within.end);
        if end.is_none() || header_stored > len {
            return Err(BlockError::OutOfBounds {
                section: r.section(),
                start: offset,
                end: offset.saturating_add(len),
                within: what,
            });
        }
        Ok(ChunkLocation {
            offset,
            header_codec,
            header_stored,
            header_raw,
            header_crc,
            len,
        })
    }

    /// Appends the location's codec, lengths and CRC (its offset follows from the chunks
    /// before it).
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.header_codec as u8);
        put_varint(out, self.header_stored);
        put_varint(out, self.header_raw);
        out.extend_from_slice(&self.header_crc.to_le_bytes());
        put_varint(out, self.len);
    }

    /// Where the chunk ends.
    pub(crate) fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// Checks that chunks laid back to back from `range.start` ended at `end`, filling `range`.
pub(crate) fn check_filled(
    section: Section,
    range: &Range<u64>,
    end: u64,
    what: &'static str,
) -> Result<(), BlockError> {
    if end != range.end {
        return Err(BlockError::OutOfBounds {
            section,
            start: range.start,
            end,
            within: what,
        });
    }
    Ok(())
}

/// One series of a block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeriesEntry {
    /// App name and labels.
    pub series: Series,
    /// What its values mean (of its newest data in the block).
    pub meta: ProfileMeta,
    /// Unix seconds of its first finest-level bucket with data.
    pub first_bucket: u64,
    /// Unix seconds of its last finest-level bucket with data.
    pub last_bucket: u64,
    pub(crate) chunk: ChunkLocation,
}

/// Postings of one label name: each value with the series positions that have it.
type Values = Vec<(u32, Vec<u32>)>;

/// Postings with their strings, for comparing stored and derived ones.
pub(crate) type NamedPostings = Vec<(String, Vec<(String, Vec<u32>)>)>;

/// A block's decoded index. See the [module documentation](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Index {
    meta: BlockMeta,
    series: Vec<SeriesEntry>,
    /// The series section's string table, which postings refer to.
    strings: Vec<String>,
    /// Label name (string index) → values, sorted by name and value.
    postings: Vec<(u32, Values)>,
    markers: Vec<Marker>,
}

impl Index {
    /// Decodes the meta, series, postings and markers sections from `fetched`, which must cover
    /// [`Footer::index_range`].
    ///
    /// # Errors
    ///
    /// A [`BlockError`] naming the section at fault.
    pub fn decode(
        footer: &Footer,
        fetched: &Fetched<'_>,
        limits: &Limits,
    ) -> Result<Index, BlockError> {
        let meta = BlockMeta::decode(&footer.read(Kind::Meta, fetched, limits)?)?;
        let trees = footer.entry(Kind::Trees)?.range();
        let (strings, series) =
            decode_series(&footer.read(Kind::Series, fetched, limits)?, &meta, trees)?;
        let postings = decode_postings(
            &footer.read(Kind::Postings, fetched, limits)?,
            &strings,
            series.len(),
        )?;
        let markers = decode_markers(&footer.read(Kind::Markers, fetched, limits)?)?;
        if series.len() as u64 != meta.series || markers.len() as u64 != meta.markers {
            return Err(BlockError::Malformed {
                section: Section::Meta,
                offset: 0,
                problem: crate::error::Problem::Invalid {
                    field: "counts",
                    reason: "series or marker count differs from its section",
                },
            });
        }
        Ok(Index {
            meta,
            series,
            strings,
            postings,
            markers,
        })
    }

    /// The block's meta.
    pub fn meta(&self) -> &BlockMeta {
        &self.meta
    }

    /// Every series, sorted by app name and labels.
    pub fn series(&self) -> &[SeriesEntry] {
        &self.series
    }

    /// Every batch marker whose data the block holds, sorted.
    pub fn markers(&self) -> &[Marker] {
        &self.markers
    }

    /// Whether the block holds batch `marker`.
    pub fn contains_marker(&self, marker: &Marker) -> bool {
        self.markers.binary_search(marker).is_ok()
    }

    /// Series positions with label `name` (`__name__` for the app name) set to `value`.
    pub fn postings(&self, name: &str, value: &str) -> &[u32] {
        let string = |i: &u32| self.strings[*i as usize].as_str();
        let Ok(n) = self.postings.binary_search_by(|(n, _)| string(n).cmp(name)) else {
            return &[];
        };
        let values = &self.postings[n].1;
        match values.binary_search_by(|(v, _)| string(v).cmp(value)) {
            Ok(v) => &values[v].1,
            Err(_) => &[],
        }
    }

    /// Positions of the series that `selector` matches and that have data in `[from, until)`
    /// (Unix seconds). Equality matchers narrow the candidates through the postings.
    pub fn select(&self, selector: &Selector, from: u64, until: u64) -> Vec<usize> {
        let mut candidates: Vec<u32> = self.postings(NAME_LABEL, selector.app()).to_vec();
        for matcher in selector.matchers() {
            if matcher.op() == MatchOp::Equal && !matcher.value().is_empty() {
                let list = self.postings(matcher.name(), matcher.value());
                candidates.retain(|id| list.binary_search(id).is_ok());
            }
        }
        let finest = self.meta.finest();
        candidates
            .into_iter()
            .map(|id| id as usize)
            .filter(|&id| {
                let entry = &self.series[id];
                entry.first_bucket < until
                    && entry.last_bucket.saturating_add(finest) > from
                    && selector.matches(&entry.series)
            })
            .collect()
    }

    /// The range to fetch for [`SeriesChunk::decode`](crate::SeriesChunk::decode): the header
    /// (shape and tree table) of series `series`.
    ///
    /// # Panics
    ///
    /// If `series` is not a position in [`Index::series`].
    pub fn chunk_header_range(&self, series: usize) -> Range<u64> {
        let chunk = &self.series[series].chunk;
        chunk.offset..chunk.offset + chunk.header_stored
    }

    /// The range of series `series`' whole chunk: its header and every tree.
    ///
    /// # Panics
    ///
    /// If `series` is not a position in [`Index::series`].
    pub fn chunk_range(&self, series: usize) -> Range<u64> {
        let chunk = &self.series[series].chunk;
        chunk.offset..chunk.offset + chunk.len
    }

    /// Postings derived from the series, as the writer writes them: for checking the stored
    /// ones.
    pub(crate) fn derived_postings(&self) -> NamedPostings {
        derive_postings(self.series.iter().map(|e| &e.series))
            .into_iter()
            .map(|(name, values)| {
                (
                    name.to_owned(),
                    values
                        .into_iter()
                        .map(|(v, ids)| (v.to_owned(), ids))
                        .collect(),
                )
            })
            .collect()
    }

    /// The stored postings, with their strings.
    pub(crate) fn stored_postings(&self) -> NamedPostings {
        let string = |i: u32| self.strings[i as usize].clone();
        self.postings
            .iter()
            .map(|(name, values)| {
                (
                    string(*name),
                    values
                        .iter()
                        .map(|(v, ids)| (string(*v), ids.clone()))
                        .collect(),
                )
            })
            .collect()
    }
}

/// label name → value → series positions, `__name__` for app names.
fn derive_postings<'s>(
    series: impl Iterator<Item = &'s Series>,
) -> BTreeMap<&'s str, BTreeMap<&'s str, Vec<u32>>> {
    let mut postings: BTreeMap<&str, BTreeMap<&str, Vec<u32>>> = BTreeMap::new();
    for (id, s) in series.enumerate() {
        let pairs = std::iter::once((NAME_LABEL, s.app())).chain(s.labels().iter());
        for (name, value) in pairs {
            postings
                .entry(name)
                .or_default()
                .entry(value)
                .or_default()
                .push(id as u32);
        }
    }
    postings
}

/// A string table being written: each string once, numbered by first use.
#[derive(Default)]
struct Strings<'s> {
    ids: HashMap<&'s str, u64>,
    list: Vec<&'s str>,
}

impl<'s> Strings<'s> {
    fn id(&mut self, s: &'s str) -> u64 {
        let next = self.list.len() as u64;
        *self.ids.entry(s).or_insert_with(|| {
            self.list.push(s);
            next
        })
    }
}

/// The series section's and postings section's raw bytes, for series in order.
pub(crate) fn encode_series(entries: &[SeriesEntry], block_start: u64) -> (Vec<u8>, Vec<u8>) {
    let mut strings = Strings::default();
    let mut body = Vec::new();
    put_varint(&mut body, entries.len() as u64);
    for entry in entries {
        put_varint(&mut body, strings.id(entry.series.app()));
        put_varint(&mut body, entry.series.labels().len() as u64);
        for (name, value) in entry.series.labels().iter() {
            put_varint(&mut body, strings.id(name));
            put_varint(&mut body, strings.id(value));
        }
        put_varint(&mut body, strings.id(&entry.meta.spy_name));
        put_varint(&mut body, u64::from(entry.meta.sample_rate));
        put_varint(&mut body, strings.id(&entry.meta.units));
        body.push(match entry.meta.aggregation {
            Aggregation::Sum => 0,
            Aggregation::Average => 1,
        });
        put_varint(&mut body, entry.first_bucket - block_start);
        put_varint(&mut body, entry.last_bucket - block_start);
        entry.chunk.encode(&mut body);
    }
    let mut postings = Vec::new();
    let derived = derive_postings(entries.iter().map(|e| &e.series));
    put_varint(&mut postings, derived.len() as u64);
    for (name, values) in &derived {
        put_varint(&mut postings, strings.id(name));
        put_varint(&mut postings, values.len() as u64);
        for (value, ids) in values {
            put_varint(&mut postings, strings.id(value));
            put_varint(&mut postings, ids.len() as u64);
            let mut previous = 0;
            for &id in ids {
                put_varint(&mut postings, u64::from(id - previous));
                previous = id;
            }
        }
    }
    let mut series = Vec::new();
    put_varint(&mut series, strings.list.len() as u64);
    for s in &strings.list {
        put_str(&mut series, s);
    }
    series.extend_from_slice(&body);
    (series, postings)
}

fn decode_series(
    bytes: &[u8],
    meta: &BlockMeta,
    trees: Range<u64>,
) -> Result<(Vec<String>, Vec<SeriesEntry>), BlockError> {
    let mut r = Reader::new(bytes, Section::Series);
    let count = r.count("string", 1)?;
    let mut strings = Vec::with_capacity(count);
    for _ in 0..count {
        strings.push(r.str("string")?.to_owned());
    }
    let string = |r: &mut Reader<'_>, field| -> Result<usize, BlockError> {
        let id = r.varint(field)?;
        if id >= strings.len() as u64 {
            return Err(r.invalid(field, "not in the string table"));
        }
        Ok(id as usize)
    };
    let count = r.count("series", 16)?;
    let mut series: Vec<SeriesEntry> = Vec::with_capacity(count);
    let mut offset = trees.start;
    for _ in 0..count {
        let app = string(&mut r, "app name")?;
        let labels = r.count("label", 2)?;
        let mut pairs = Vec::with_capacity(labels);
        for _ in 0..labels {
            let name = string(&mut r, "label name")?;
            let value = string(&mut r, "label value")?;
            pairs.push((strings[name].as_str(), strings[value].as_str()));
        }
        let labels = Labels::from_pairs(pairs)
            .ok()
            .filter(|l| l.len() == labels)
            .ok_or_else(|| r.invalid("labels", "invalid, duplicate or empty"))?;
        let key = Series::new(strings[app].as_str(), labels)
            .map_err(|_| r.invalid("app name", "not a valid app name"))?;
        if series.last().is_some_and(|previous| previous.series >= key) {
            return Err(r.invalid("series", "not sorted, or listed twice"));
        }
        let spy = string(&mut r, "spy name")?;
        let sample_rate = r.varint_u32("sample rate")?;
        let units = string(&mut r, "units")?;
        let aggregation = match r.byte("aggregation")? {
            0 => Aggregation::Sum,
            1 => Aggregation::Average,
            _ => return Err(r.invalid("aggregation", "neither sum nor average")),
        };
        let first = r.varint("first bucket")?;
        let last = r.varint("last bucket")?;
        if first > last || last >= meta.span() {
            return Err(r.invalid("bucket span", "outside the block or reversed"));
        }
        let chunk = ChunkLocation::read(&mut r, offset, &trees, "the trees section")?;
        offset = chunk.end();
        series.push(SeriesEntry {
            series: key,
            meta: ProfileMeta {
                spy_name: strings[spy].clone(),
                sample_rate,
                units: strings[units].clone(),
                aggregation,
            },
            first_bucket: meta.start + first,
            last_bucket: meta.start + last,
            chunk,
        });
    }
    r.finish()?;
    check_filled(
        Section::Series,
        &trees,
        offset,
        "the trees section, which its chunks must fill exactly",
    )?;
    Ok((strings, series))
}

fn decode_postings(
    bytes: &[u8],
    strings: &[String],
    series: usize,
) -> Result<Vec<(u32, Values)>, BlockError> {
    let mut r = Reader::new(bytes, Section::Postings);
    let string = |r: &mut Reader<'_>, field| -> Result<u32, BlockError> {
        let id = r.varint(field)?;
        if id >= strings.len() as u64 {
            return Err(r.invalid(field, "not in the series section's string table"));
        }
        Ok(id as u32)
    };
    let names = r.count("label name", 2)?;
    let mut postings: Vec<(u32, Values)> = Vec::with_capacity(names);
    for _ in 0..names {
        let name = string(&mut r, "label name")?;
        if postings
            .last()
            .is_some_and(|(previous, _)| strings[*previous as usize] >= strings[name as usize])
        {
            return Err(r.invalid("label name", "not sorted"));
        }
        let count = r.count("label value", 2)?;
        let mut values: Values = Vec::with_capacity(count);
        for _ in 0..count {
            let value = string(&mut r, "label value")?;
            if values
                .last()
                .is_some_and(|(previous, _)| strings[*previous as usize] >= strings[value as usize])
            {
                return Err(r.invalid("label value", "not sorted"));
            }
            let ids = r.count("posting", 1)?;
            let mut list = Vec::with_capacity(ids);
            let mut id = 0u64;
            for index in 0..ids {
                let delta = r.varint("posting")?;
                if index > 0 && delta == 0 {
                    return Err(r.invalid("posting", "series positions must increase"));
                }
                id = id.saturating_add(delta);
                if id >= series as u64 {
                    return Err(r.invalid("posting", "not a series position"));
                }
                list.push(id as u32);
            }
            values.push((value, list));
        }
        postings.push((name, values));
    }
    r.finish()?;
    Ok(postings)
}

/// The markers section's raw bytes, for sorted, distinct markers.
pub(crate) fn encode_markers(markers: &[Marker]) -> Vec<u8> {
    let mut out = Vec::new();
    let agents = markers.chunk_by(|a, b| a.agent_id == b.agent_id);
    put_varint(&mut out, agents.clone().count() as u64);
    for agent in agents {
        put_str(&mut out, &agent[0].agent_id);
        put_varint(&mut out, agent.len() as u64);
        let mut previous = 0;
        for marker in agent {
            put_varint(&mut out, marker.sequence - previous);
            previous = marker.sequence;
        }
    }
    out
}

fn decode_markers(bytes: &[u8]) -> Result<Vec<Marker>, BlockError> {
    let mut r = Reader::new(bytes, Section::Markers);
    let agents = r.count("agent", 2)?;
    let mut markers: Vec<Marker> = Vec::new();
    for _ in 0..agents {
        let agent = r.str("agent id")?;
        if markers.last().is_some_and(|m| m.agent_id.as_str() >= agent) {
            return Err(r.invalid("agent id", "not sorted, or listed twice"));
        }
        let count = r.count("sequence", 1)?;
        if count == 0 {
            return Err(r.invalid("sequence count", "an agent without markers"));
        }
        markers.reserve(count);
        let mut sequence = 0u64;
        for index in 0..count {
            let delta = r.varint("sequence")?;
            if index > 0 && delta == 0 {
                return Err(r.invalid("sequence", "sequences must increase"));
            }
            sequence = sequence
                .checked_add(delta)
                .ok_or_else(|| r.invalid("sequence", "overflows"))?;
            markers.push(Marker {
                agent_id: agent.to_owned(),
                sequence,
            });
        }
    }
    r.finish()?;
    Ok(markers)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Behind the CRCs: whatever bytes a section holds, decoding it errors or succeeds,
        /// never panics.
        #[test]
        fn arbitrary_index_sections_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let meta = BlockMeta::decode(&bytes);
            let strings: Vec<String> = ["app.cpu", "env", "prod"].map(String::from).to_vec();
            let _ = decode_postings(&bytes, &strings, 3);
            let _ = decode_markers(&bytes);
            let fallback = BlockMeta {
                tenant: String::new(),
                start: 0,
                levels: vec![10, 100],
                names: 1,
                series: 1,
                trees: 0,
                nodes: 0,
                markers: 0,
                compactions: 0,
            };
            let _ = decode_series(&bytes, meta.as_ref().unwrap_or(&fallback), 8..1_000);
        }
    }

    #[test]
    fn markers_round_trip_grouped_by_agent() {
        let markers: Vec<Marker> = [("a", 1), ("a", 5), ("b", 0), ("b", u64::MAX)]
            .into_iter()
            .map(|(agent, sequence)| Marker {
                agent_id: agent.to_owned(),
                sequence,
            })
            .collect();
        assert_eq!(decode_markers(&encode_markers(&markers)).unwrap(), markers);
        assert_eq!(decode_markers(&encode_markers(&[])).unwrap(), []);
    }

    #[test]
    fn meta_rejects_levels_that_do_not_divide() {
        let mut meta = BlockMeta {
            tenant: "anonymous".into(),
            start: 1_000,
            levels: vec![10, 100, 1_000],
            names: 0,
            series: 0,
            trees: 0,
            nodes: 0,
            markers: 0,
            compactions: 0,
        };
        assert_eq!(BlockMeta::decode(&meta.encode()).unwrap(), meta);
        meta.levels = vec![10, 25];
        assert!(BlockMeta::decode(&meta.encode()).is_err());
        meta.levels = vec![10, 100];
        meta.start = 150;
        assert!(BlockMeta::decode(&meta.encode()).is_err());
    }
}
