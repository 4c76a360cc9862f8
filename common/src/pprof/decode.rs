//! Reading pprof: an untrusted body → [`Profile`] → one [`ProfileSeries`] per sample type and
//! label set.
//!
//! The conversion is two passes over the samples. The first validates every sample, resolves
//! its label set, and sums the values of samples with the same labels and location ids (Go's
//! heap profiles repeat a stack once per allocation size, so this halves the tree work there).
//! The second resolves each distinct stack to frames, root first, inserts it once into its label
//! set's tree shape, and then derives each sample type's tree from that shape in one pass over
//! its nodes. Each location is resolved to frames once and each frame is interned once per label
//! set, so the per-sample cost is array lookups and one tree walk, whatever the number of sample
//! types.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Read;

use prost::Message;

use super::proto::{Location, Profile, Sample};
use super::{Limits, PprofError, SampleTypeConfig, SampleTypes};
use crate::profile::Aggregation;
use crate::tree::{FrameId, NodeId, Tree};

type RandomState = foldhash::fast::RandomState;

/// The first two bytes of every gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// One series read from a profile: a converted sample type under one set of string labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileSeries {
    /// The pprof sample type, for example `samples` or `alloc_space`.
    pub sample_type: String,
    /// What the series name ends with after the application name and a dot: the configured
    /// display name, else the sample type (`cpu` for `samples`).
    pub name_suffix: String,
    /// The configured units, else the pprof unit of the sample type.
    pub units: String,
    /// How the series is aggregated over time.
    pub aggregation: Aggregation,
    /// Whether the values count since process start (see [`SampleTypeConfig::cumulative`]).
    pub cumulative: bool,
    /// For sampled types, the sample rate in Hz: 10^9 divided by the period in nanoseconds
    /// (`period_type` unit `nanoseconds`, the default, `microseconds`, `milliseconds` or
    /// `seconds`). `None` for other types, and when the profile has no period or the rate
    /// would be below 1 Hz.
    pub sample_rate: Option<u32>,
    /// The samples' string labels, sorted by key.
    pub labels: Vec<(String, String)>,
    /// The stacks and their values.
    pub tree: Tree,
}

/// Reads `body`, gzipped or not, and converts it: [`decode`] then [`to_series`].
///
/// # Errors
///
/// Any [`PprofError`] but the `sample_type_config` ones.
pub fn parse(
    body: &[u8],
    sample_types: &SampleTypes,
    limits: &Limits,
) -> Result<Vec<ProfileSeries>, PprofError> {
    let profile = decode(body, limits)?;
    to_series(&profile, sample_types, limits)
}

/// Decodes `body`, gunzipping it first if it starts with the gzip magic.
///
/// # Errors
///
/// [`PprofError::TooLarge`], [`PprofError::Gzip`], [`PprofError::TooManySamples`],
/// [`PprofError::TooManyEntries`] and [`PprofError::Protobuf`].
pub fn decode(body: &[u8], limits: &Limits) -> Result<Profile, PprofError> {
    let bytes = decompress(body, limits)?;
    check_counts(&bytes, limits)?;
    Profile::decode(&*bytes).map_err(|source| PprofError::Protobuf { source })
}

/// Returns the protobuf in `body`: gunzipped if `body` starts with the gzip magic, else `body`
/// itself. Reading stops one byte past [`Limits::max_bytes`], so a gzip bomb costs at most that
/// much memory.
///
/// Concatenated gzip members are read as one stream, as Go's reader does.
///
/// # Errors
///
/// [`PprofError::TooLarge`] past the limit and [`PprofError::Gzip`] on a corrupt stream.
pub fn decompress<'b>(body: &'b [u8], limits: &Limits) -> Result<Cow<'b, [u8]>, PprofError> {
    let limit = limits.max_bytes;
    if !body.starts_with(&GZIP_MAGIC) {
        if body.len() > limit {
            return Err(PprofError::TooLarge { limit });
        }
        return Ok(Cow::Borrowed(body));
    }
    let mut reader = flate2::read::MultiGzDecoder::new(body);
    let cap = limit.saturating_add(1);
    // pprof protobufs usually gzip 3 to 5 times smaller; start there and double up to the cap.
    let mut out = vec![0; body.len().saturating_mul(4).max(4096).min(cap)];
    let mut filled = 0;
    loop {
        if filled == out.len() {
            if filled >= cap {
                return Err(PprofError::TooLarge { limit });
            }
            out.resize(filled.saturating_mul(2).min(cap), 0);
        }
        match reader.read(&mut out[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => return Err(PprofError::Gzip { source }),
        }
    }
    if filled > limit {
        return Err(PprofError::TooLarge { limit });
    }
    out.truncate(filled);
    Ok(Cow::Owned(out))
}

/// Counts the top-level samples and table entries before prost allocates a struct for each:
/// an empty sample is two bytes on the wire but about eighty in memory.
///
/// Malformed input is left for prost to report.
fn check_counts(bytes: &[u8], limits: &Limits) -> Result<(), PprofError> {
    let mut pos = 0;
    let (mut samples, mut entries) = (0usize, 0usize);
    while pos < bytes.len() {
        let Some((key, n)) = varint(&bytes[pos..]) else {
            break;
        };
        pos += n;
        match key & 7 {
            0 => match varint(&bytes[pos..]) {
                Some((_, n)) => pos += n,
                None => break,
            },
            1 => pos = pos.saturating_add(8),
            2 => {
                let Some((len, n)) = varint(&bytes[pos..]) else {
                    break;
                };
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                pos = pos.saturating_add(n).saturating_add(len);
                match key >> 3 {
                    2 => samples += 1,
                    3..=6 => entries += 1,
                    _ => {}
                }
            }
            5 => pos = pos.saturating_add(4),
            _ => break,
        }
    }
    if samples > limits.max_samples {
        return Err(PprofError::TooManySamples {
            count: samples,
            limit: limits.max_samples,
        });
    }
    if entries > limits.max_entries {
        return Err(PprofError::TooManyEntries {
            count: entries,
            limit: limits.max_entries,
        });
    }
    Ok(())
}

/// A protobuf varint and its length, or `None` if `bytes` ends first or it is too long.
fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// Converts `profile` into one series per converted sample type and distinct set of string
/// labels, ordered by sample type (in profile order), then by labels.
///
/// Sample types missing from `sample_types` are skipped, and a sample type with no nonzero
/// value gives no series. See the [module documentation](super) for how frames, labels and
/// values are read.
///
/// # Errors
///
/// [`PprofError::StringIndex`], [`PprofError::UnknownLocation`],
/// [`PprofError::UnknownFunction`], [`PprofError::UnknownMapping`],
/// [`PprofError::ValueCount`] and [`PprofError::NegativeValue`] for an inconsistent profile;
/// [`PprofError::TooManySamples`] and [`PprofError::TooManyEntries`] for one past `limits`.
pub fn to_series(
    profile: &Profile,
    sample_types: &SampleTypes,
    limits: &Limits,
) -> Result<Vec<ProfileSeries>, PprofError> {
    check_table_sizes(profile, limits)?;
    let strings = Strings(&profile.string_table);
    let mut selected = Vec::new();
    for (index, value_type) in profile.sample_type.iter().enumerate() {
        let name = strings.text(value_type.r#type, "sample_type.type")?;
        let unit = strings.text(value_type.unit, "sample_type.unit")?;
        if let Some(config) = sample_types.get(&name) {
            selected.push(Selected {
                index,
                name,
                unit,
                config,
            });
        }
    }
    if selected.is_empty() {
        return Ok(Vec::new());
    }
    let sample_rate = if selected.iter().any(|s| s.config.sampled) {
        sample_rate(profile, &strings)?
    } else {
        None
    };

    let locations = IdIndex::new(profile.location.iter().map(|l| l.id));
    let stacks = Stacks::collect(profile, &strings, &selected, &locations)?;
    let trees = stacks.build(profile, &strings, &locations, limits)?;

    let n = selected.len();
    let sets = &stacks.labels.sets;
    let mut order: Vec<usize> = (0..sets.len()).collect();
    order.sort_unstable_by(|&a, &b| sets[a].cmp(&sets[b]));
    let mut trees = trees;
    let mut out = Vec::new();
    for (k, selected) in selected.iter().enumerate() {
        for &set in &order {
            if let Some(tree) = trees[set * n + k].take() {
                out.push(selected.series(&sets[set], tree, sample_rate));
            }
        }
    }
    Ok(out)
}

/// A sample type chosen for conversion.
struct Selected<'p, 'c> {
    /// Its index in `Sample.value`.
    index: usize,
    name: Cow<'p, str>,
    unit: Cow<'p, str>,
    config: &'c SampleTypeConfig,
}

impl Selected<'_, '_> {
    fn series(
        &self,
        labels: &[(String, String)],
        tree: Tree,
        sample_rate: Option<u32>,
    ) -> ProfileSeries {
        let config = self.config;
        let or = |configured: &str, fallback: &str| {
            if configured.is_empty() {
                fallback.to_string()
            } else {
                configured.to_string()
            }
        };
        ProfileSeries {
            sample_type: self.name.to_string(),
            name_suffix: or(&config.display_name, &self.name),
            units: or(&config.units, &self.unit),
            aggregation: config.aggregation,
            cumulative: config.cumulative,
            sample_rate: if config.sampled { sample_rate } else { None },
            labels: labels.to_vec(),
            tree,
        }
    }
}
/// [`check_counts`] for a profile that did not come through [`decode`]; also keeps every
/// table index within `u32`.
fn check_table_sizes(profile: &Profile, limits: &Limits) -> Result<(), PprofError> {
    let samples = profile.sample.len();
    if samples > limits.max_samples {
        return Err(PprofError::TooManySamples {
            count: samples,
            limit: limits.max_samples,
        });
    }
    let entries = profile.string_table.len()
        + profile.location.len()
        + profile.function.len()
        + profile.mapping.len();
    let limit = limits.max_entries.min(u32::MAX as usize - 1);
    if entries > limit {
        return Err(PprofError::TooManyEntries {
            count: entries,
            limit,
        });
    }
    Ok(())
}

/// The string table, checked on every access.
#[derive(Clone, Copy)]
struct Strings<'p>(&'p [Vec<u8>]);

impl<'p> Strings<'p> {
    fn bytes(self, index: i64, field: &'static str) -> Result<&'p [u8], PprofError> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.0.get(i))
            .map(Vec::as_slice)
            .ok_or(PprofError::StringIndex {
                field,
                index,
                len: self.0.len(),
            })
    }

    fn text(self, index: i64, field: &'static str) -> Result<Cow<'p, str>, PprofError> {
        self.bytes(index, field).map(String::from_utf8_lossy)
    }
}

/// The sample rate of a sampled type; see [`ProfileSeries::sample_rate`].
fn sample_rate(profile: &Profile, strings: &Strings<'_>) -> Result<Option<u32>, PprofError> {
    let Some(period_type) = profile.period_type else {
        return Ok(None);
    };
    let Ok(period) = u64::try_from(profile.period) else {
        return Ok(None);
    };
    let unit_nanos: u64 = match &*strings.text(period_type.unit, "period_type.unit")? {
        "microseconds" => 1_000,
        "milliseconds" => 1_000_000,
        "seconds" => 1_000_000_000,
        _ => 1,
    };
    Ok(period
        .checked_mul(unit_nanos)
        .filter(|&nanos| nanos > 0)
        .map(|nanos| 1_000_000_000 / nanos)
        .filter(|&rate| rate > 0)
        .and_then(|rate| u32::try_from(rate).ok()))
}

/// Message id → index in its table. Ids are usually 1..=n, so a vector indexed by id serves
/// them; sparse ids (addresses used as ids) fall back to a hash map.
enum IdIndex {
    Dense(Vec<u32>),
    Sparse(HashMap<u64, u32, RandomState>),
}

impl IdIndex {
    const NONE: u32 = u32::MAX;

    /// Indexes `ids`; id 0 is reserved and never found, and of duplicate ids the first wins.
    fn new(ids: impl ExactSizeIterator<Item = u64> + Clone) -> Self {
        let len = ids.len() as u64;
        let max = ids.clone().max().unwrap_or(0);
        if max <= len.saturating_mul(2).saturating_add(1024) {
            let mut dense = vec![Self::NONE; max as usize + 1];
            for (index, id) in ids.enumerate() {
                let slot = &mut dense[id as usize];
                if id != 0 && *slot == Self::NONE {
                    *slot = index as u32;
                }
            }
            IdIndex::Dense(dense)
        } else {
            let mut sparse = HashMap::with_capacity_and_hasher(ids.len(), RandomState::default());
            for (index, id) in ids.enumerate() {
                if id != 0 {
                    sparse.entry(id).or_insert(index as u32);
                }
            }
            IdIndex::Sparse(sparse)
        }
    }

    #[inline]
    fn get(&self, id: u64) -> Option<usize> {
        match self {
            IdIndex::Dense(dense) => usize::try_from(id)
                .ok()
                .and_then(|id| dense.get(id))
                .filter(|&&index| index != Self::NONE)
                .map(|&index| index as usize),
            IdIndex::Sparse(sparse) => sparse.get(&id).map(|&index| index as usize),
        }
    }
}

/// The distinct label sets of a profile. Set 0 is the empty set.
struct LabelSets {
    /// Resolved sets, sorted by key.
    sets: Vec<Vec<(String, String)>>,
    ids: HashMap<Vec<(String, String)>, usize, RandomState>,
    /// (key, value) string indices as found in a sample → set. Samples usually repeat a few
    /// label sets, so most samples stop here without touching a string.
    raw: HashMap<Vec<(i64, i64)>, usize, RandomState>,
    buf: Vec<(i64, i64)>,
}

impl LabelSets {
    fn new() -> Self {
        LabelSets {
            sets: vec![Vec::new()],
            ids: HashMap::default(),
            raw: HashMap::default(),
            buf: Vec::new(),
        }
    }

    /// The set of `sample`'s string labels.
    fn of(&mut self, sample: &Sample, strings: Strings<'_>) -> Result<usize, PprofError> {
        self.buf.clear();
        for label in &sample.label {
            // Numeric labels have no `str`; index 0 is "" and means the same.
            if label.str == 0 {
                continue;
            }
            strings.bytes(label.key, "label.key")?;
            strings.bytes(label.str, "label.str")?;
            if label.key != 0 {
                self.buf.push((label.key, label.str));
            }
        }
        if self.buf.is_empty() {
            return Ok(0);
        }
        if let Some(&set) = self.raw.get(self.buf.as_slice()) {
            return Ok(set);
        }
        let mut pairs: Vec<(String, String)> = Vec::with_capacity(self.buf.len());
        for &(key, value) in &self.buf {
            let key = strings.text(key, "label.key")?;
            let value = strings.text(value, "label.value")?;
            if !key.is_empty() && !value.is_empty() {
                pairs.push((key.into_owned(), value.into_owned()));
            }
        }
        // A stable sort keeps repeated keys in sample order, so keeping the last keeps the
        // value that came last.
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut unique: Vec<(String, String)> = Vec::with_capacity(pairs.len());
        for pair in pairs {
            match unique.last_mut() {
                Some(last) if last.0 == pair.0 => *last = pair,
                _ => unique.push(pair),
            }
        }
        let set = if unique.is_empty() {
            0
        } else if let Some(&set) = self.ids.get(&unique) {
            set
        } else {
            self.sets.push(unique.clone());
            self.ids.insert(unique, self.sets.len() - 1);
            self.sets.len() - 1
        };
        self.raw.insert(self.buf.clone(), set);
        Ok(set)
    }
}

/// The distinct (label set, stack) pairs of a profile with their summed values.
struct Stacks<'p> {
    labels: LabelSets,
    /// Each distinct stack: its label set, its location ids (leaf first), and the first sample
    /// that had it, for error messages.
    entries: Vec<(usize, &'p [u64], usize)>,
    /// `values[e * n + k]` is the sum for entry `e` of the `k`th selected sample type.
    values: Vec<u64>,
    /// The number of selected sample types.
    n: usize,
}

impl<'p> Stacks<'p> {
    /// The first pass: validates every sample and sums duplicates.
    fn collect(
        profile: &'p Profile,
        strings: &Strings<'p>,
        selected: &[Selected<'_, '_>],
        locations: &IdIndex,
    ) -> Result<Self, PprofError> {
        let n = selected.len();
        let mut stacks = Stacks {
            labels: LabelSets::new(),
            entries: Vec::new(),
            values: Vec::new(),
            n,
        };
        let mut index: HashMap<(usize, &'p [u64]), usize, RandomState> = HashMap::default();
        for (i, sample) in profile.sample.iter().enumerate() {
            if sample.value.len() != profile.sample_type.len() {
                return Err(PprofError::ValueCount {
                    sample: i,
                    expected: profile.sample_type.len(),
                    found: sample.value.len(),
                });
            }
            let mut any = false;
            for s in selected {
                let value = sample.value[s.index];
                if value < 0 {
                    return Err(PprofError::NegativeValue {
                        sample: i,
                        sample_type: s.name.to_string(),
                        value,
                    });
                }
                any |= value != 0;
            }
            for &id in &sample.location_id {
                if locations.get(id).is_none() {
                    return Err(PprofError::UnknownLocation { sample: i, id });
                }
            }
            let set = if sample.label.is_empty() {
                0
            } else {
                stacks.labels.of(sample, *strings)?
            };
            if !any {
                continue;
            }
            let next = stacks.entries.len();
            let entry = *index
                .entry((set, sample.location_id.as_slice()))
                .or_insert(next);
            if entry == next {
                stacks.entries.push((set, &sample.location_id, i));
                stacks.values.resize(stacks.values.len() + n, 0);
            }
            let row = &mut stacks.values[entry * n..][..n];
            for (slot, s) in row.iter_mut().zip(selected) {
                // Checked non-negative above.
                *slot = slot.saturating_add(sample.value[s.index] as u64);
            }
        }
        Ok(stacks)
    }

    /// The second pass: builds the trees, `trees[set * n + k]` for label set `set` and the
    /// `k`th selected sample type.
    ///
    /// Each label set's distinct stacks are inserted once, as a shape
    /// ([`Tree::insert_path`]); each sample type's tree then takes its values from that shape
    /// in one pass over the nodes ([`Tree::with_self_values`]). A heap profile's four trees
    /// cost one walk per stack instead of four.
    fn build(
        &self,
        profile: &'p Profile,
        strings: &Strings<'p>,
        locations: &IdIndex,
        limits: &Limits,
    ) -> Result<Vec<Option<Tree>>, PprofError> {
        let n = self.n;
        let mut shapes: Vec<Option<Builder>> = (0..self.labels.sets.len()).map(|_| None).collect();
        let mut resolver = Resolver::new(profile, *strings);
        let mut frames: Vec<u32> = Vec::new();
        let mut stack: Vec<FrameId> = Vec::new();
        let mut leaves: Vec<NodeId> = Vec::with_capacity(self.entries.len());
        for &(set, location_ids, sample) in &self.entries {
            frames.clear();
            for &id in location_ids.iter().rev() {
                let location = locations
                    .get(id)
                    .expect("location ids checked in the first pass");
                let (start, len) = resolver.location(location, sample)?;
                let len = len.min(limits.max_stack_depth - frames.len());
                frames.extend_from_slice(&resolver.flat[start..start + len]);
                if frames.len() >= limits.max_stack_depth {
                    break;
                }
            }
            let shape = shapes[set].get_or_insert_with(Builder::default);
            leaves.push(shape.insert_path(&frames, &resolver.names, &mut stack));
        }

        let mut columns: Vec<Vec<u64>> = Vec::new();
        let mut trees: Vec<Option<Tree>> = Vec::with_capacity(shapes.len() * n);
        for (set, shape) in shapes.iter().enumerate() {
            let Some(shape) = shape else {
                trees.extend((0..n).map(|_| None));
                continue;
            };
            columns.clear();
            columns.resize_with(n, || vec![0; shape.tree.len() + 1]);
            for (e, &(entry_set, _, _)) in self.entries.iter().enumerate() {
                if entry_set == set {
                    for (k, column) in columns.iter_mut().enumerate() {
                        let slot = &mut column[leaves[e].index()];
                        *slot = slot.saturating_add(self.values[e * n + k]);
                    }
                }
            }
            for column in &columns {
                let tree = shape.tree.with_self_values(column);
                trees.push((!tree.is_empty() || tree.total() > 0).then_some(tree));
            }
        }
        Ok(trees)
    }
}

/// Resolves locations to frames, each location once.
struct Resolver<'p> {
    profile: &'p Profile,
    strings: Strings<'p>,
    functions: IdIndex,
    mappings: IdIndex,
    /// Location index → (start, len) in `flat`, or `start == usize::MAX` if not resolved yet.
    spans: Vec<(usize, usize)>,
    /// The frames of resolved locations, root-most first within each location.
    flat: Vec<u32>,
    /// Every distinct frame of the profile; the indices in `flat` point here.
    names: Vec<Cow<'p, str>>,
    /// String index → frame, for function names.
    frame_of_string: Vec<u32>,
}

impl<'p> Resolver<'p> {
    fn new(profile: &'p Profile, strings: Strings<'p>) -> Self {
        Resolver {
            profile,
            strings,
            functions: IdIndex::new(profile.function.iter().map(|f| f.id)),
            mappings: IdIndex::new(profile.mapping.iter().map(|m| m.id)),
            spans: vec![(usize::MAX, 0); profile.location.len()],
            flat: Vec::new(),
            names: Vec::new(),
            frame_of_string: vec![u32::MAX; profile.string_table.len()],
        }
    }

    /// The frames of location `index`, as a span of `flat`; `sample` is the first sample using
    /// it, for errors.
    #[inline]
    fn location(&mut self, index: usize, sample: usize) -> Result<(usize, usize), PprofError> {
        let span = self.spans[index];
        if span.0 != usize::MAX {
            return Ok(span);
        }
        self.resolve(index, sample)
    }

    /// [`location`](Self::location) the first time: reads the lines and names the frames.
    #[cold]
    fn resolve(&mut self, index: usize, sample: usize) -> Result<(usize, usize), PprofError> {
        let location = &self.profile.location[index];
        let start = self.flat.len();
        // Lines are innermost first; the last is the caller, so it comes first from the root.
        for line in location.line.iter().rev() {
            let function = self
                .functions
                .get(line.function_id)
                .map(|f| &self.profile.function[f])
                .ok_or(PprofError::UnknownFunction {
                    sample,
                    location: location.id,
                    id: line.function_id,
                })?;
            let mut name = function.name;
            if self.strings.bytes(name, "function.name")?.is_empty() {
                name = function.system_name;
                if self.strings.bytes(name, "function.system_name")?.is_empty() {
                    continue;
                }
            }
            let frame = self.function_frame(name);
            self.flat.push(frame);
        }
        if self.flat.len() == start {
            let name = self.address_name(location, sample)?;
            self.flat.push(self.names.len() as u32);
            self.names.push(Cow::Owned(name));
        }
        let span = (start, self.flat.len() - start);
        self.spans[index] = span;
        Ok(span)
    }

    /// The frame named by string `index`, already checked to be in range.
    fn function_frame(&mut self, index: i64) -> u32 {
        let slot = &mut self.frame_of_string[index as usize];
        if *slot == u32::MAX {
            *slot = self.names.len() as u32;
            self.names.push(String::from_utf8_lossy(
                &self.profile.string_table[index as usize],
            ));
        }
        *slot
    }

    /// The name of a location without function names: `<file basename>+0x<file offset>`, or
    /// `0x<address>` without a mapping file.
    fn address_name(&self, location: &Location, sample: usize) -> Result<String, PprofError> {
        if location.mapping_id != 0 {
            let mapping = self
                .mappings
                .get(location.mapping_id)
                .map(|m| &self.profile.mapping[m])
                .ok_or(PprofError::UnknownMapping {
                    sample,
                    location: location.id,
                    id: location.mapping_id,
                })?;
            let file = self.strings.text(mapping.filename, "mapping.filename")?;
            let base = file.rsplit(['/', '\\']).next().unwrap_or_default();
            if !base.is_empty() {
                let offset = location
                    .address
                    .wrapping_sub(mapping.memory_start)
                    .wrapping_add(mapping.file_offset);
                return Ok(format!("{base}+0x{offset:x}"));
            }
        }
        Ok(format!("0x{:x}", location.address))
    }
}

/// One tree being built, with the profile's frames mapped to the tree's ids as they are first
/// used.
#[derive(Default)]
struct Builder {
    tree: Tree,
    /// Profile frame → this tree's id, or [`Builder::UNSET`].
    remap: Vec<FrameId>,
}

impl Builder {
    const UNSET: FrameId = FrameId(u32::MAX);

    /// Creates the path of `frames` (profile frame indices, root first) and returns its leaf.
    fn insert_path(
        &mut self,
        frames: &[u32],
        names: &[Cow<'_, str>],
        stack: &mut Vec<FrameId>,
    ) -> NodeId {
        if self.remap.len() < names.len() {
            self.remap.resize(names.len(), Self::UNSET);
        }
        stack.clear();
        for &frame in frames {
            let slot = &mut self.remap[frame as usize];
            if *slot == Self::UNSET {
                *slot = self.tree.intern(&names[frame as usize]);
            }
            stack.push(*slot);
        }
        self.tree.insert_path(stack)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::pprof::proto::{Function, Label, Line, Mapping, ValueType};

    /// Builds profiles laid out the way Go's `runtime/pprof` writes them.
    struct Build {
        profile: Profile,
        strings: HashMap<String, i64>,
        functions: HashMap<String, u64>,
    }

    impl Build {
        fn new(types: &[(&str, &str)]) -> Self {
            let mut b = Build {
                profile: Profile::default(),
                strings: HashMap::new(),
                functions: HashMap::new(),
            };
            b.s("");
            for &(ty, unit) in types {
                let vt = ValueType {
                    r#type: b.s(ty),
                    unit: b.s(unit),
                };
                b.profile.sample_type.push(vt);
            }
            b
        }

        fn s(&mut self, text: &str) -> i64 {
            if let Some(&i) = self.strings.get(text) {
                return i;
            }
            self.profile.string_table.push(text.as_bytes().to_vec());
            let i = self.profile.string_table.len() as i64 - 1;
            self.strings.insert(text.to_string(), i);
            i
        }

        fn period(mut self, ty: &str, unit: &str, period: i64) -> Self {
            self.profile.period_type = Some(ValueType {
                r#type: self.s(ty),
                unit: self.s(unit),
            });
            self.profile.period = period;
            self
        }

        fn function(&mut self, name: &str) -> u64 {
            if let Some(&id) = self.functions.get(name) {
                return id;
            }
            let id = self.profile.function.len() as u64 + 1;
            let name_index = self.s(name);
            self.profile.function.push(Function {
                id,
                name: name_index,
                system_name: name_index,
                ..Function::default()
            });
            self.functions.insert(name.to_string(), id);
            id
        }

        /// A location whose lines are `names`, innermost first.
        fn location(&mut self, names: &[&str]) -> u64 {
            let line = names
                .iter()
                .map(|name| Line {
                    function_id: self.function(name),
                    ..Line::default()
                })
                .collect();
            let id = self.profile.location.len() as u64 + 1;
            self.profile.location.push(Location {
                id,
                address: 0x1000 + id,
                line,
                ..Location::default()
            });
            id
        }

        /// A sample on the stack `root;...;leaf` of single-line locations.
        fn stack(&mut self, folded: &str, values: &[i64], labels: &[(&str, &str)]) {
            let ids: Vec<u64> = folded
                .split(';')
                .rev()
                .map(|name| {
                    let existing = self.profile.location.iter().find(|l| {
                        l.line.len() == 1
                            && self.functions.get(name) == Some(&l.line[0].function_id)
                    });
                    match existing {
                        Some(l) => l.id,
                        None => self.location(&[name]),
                    }
                })
                .collect();
            self.sample(ids, values, labels);
        }

        fn sample(&mut self, location_id: Vec<u64>, values: &[i64], labels: &[(&str, &str)]) {
            let label = labels
                .iter()
                .map(|&(key, value)| Label {
                    key: self.s(key),
                    str: self.s(value),
                    ..Label::default()
                })
                .collect();
            self.profile.sample.push(Sample {
                location_id,
                value: values.to_vec(),
                label,
            });
        }

        fn bytes(&self) -> Vec<u8> {
            self.profile.encode_to_vec()
        }

        fn series(&self) -> Vec<ProfileSeries> {
            parse(&self.bytes(), &SampleTypes::default(), &Limits::default()).unwrap()
        }
    }

    fn folded(tree: &Tree) -> Vec<String> {
        let mut lines = Vec::new();
        tree.for_each_stack(|stack, value| {
            let names: Vec<&str> = stack.iter().map(|&f| tree.frames().name(f)).collect();
            lines.push(format!("{} {value}", names.join(";")));
        });
        lines
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    fn go_cpu() -> Build {
        let mut b = Build::new(&[("samples", "count"), ("cpu", "nanoseconds")]).period(
            "cpu",
            "nanoseconds",
            10_000_000,
        );
        b.stack("main;handler;json.Marshal", &[3, 30_000_000], &[]);
        b.stack("main;handler", &[1, 10_000_000], &[]);
        b.stack(
            "runtime.gcBgMarkWorker;runtime.scanobject",
            &[2, 20_000_000],
            &[],
        );
        b.stack("main;idle", &[0, 0], &[]);
        b
    }

    #[test]
    fn go_cpu_profile_becomes_one_cpu_series() {
        let series = go_cpu().series();
        assert_eq!(
            series.len(),
            1,
            "the cpu/nanoseconds type is not in the default table"
        );
        let cpu = &series[0];
        assert_eq!(cpu.sample_type, "samples");
        assert_eq!(cpu.name_suffix, "cpu");
        assert_eq!(cpu.units, "samples");
        assert_eq!(cpu.aggregation, Aggregation::Sum);
        assert!(!cpu.cumulative);
        assert_eq!(cpu.sample_rate, Some(100));
        assert!(cpu.labels.is_empty());
        assert_eq!(cpu.tree.total(), 6);
        assert_eq!(
            folded(&cpu.tree),
            [
                "main;handler 1",
                "main;handler;json.Marshal 3",
                "runtime.gcBgMarkWorker;runtime.scanobject 2"
            ]
        );
    }

    #[test]
    fn gzipped_and_plain_bodies_read_the_same() {
        let b = go_cpu();
        let plain = parse(&b.bytes(), &SampleTypes::default(), &Limits::default()).unwrap();
        let zipped = parse(
            &gzip(&b.bytes()),
            &SampleTypes::default(),
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(plain, zipped);
        // Two gzip members in a row read as one stream, as Go reads them.
        let bytes = b.bytes();
        let (head, tail) = bytes.split_at(bytes.len() / 2);
        let two = [gzip(head), gzip(tail)].concat();
        assert_eq!(decompress(&two, &Limits::default()).unwrap(), &bytes[..]);
    }

    #[test]
    fn sample_rate_follows_the_period_unit() {
        for (unit, period, rate) in [
            ("nanoseconds", 10_000_000, Some(100)),
            ("microseconds", 1_000, Some(1000)),
            ("milliseconds", 10, Some(100)),
            ("seconds", 1, Some(1)),
            ("seconds", 2, None),
            ("nanoseconds", 0, None),
            ("nanoseconds", -5, None),
            ("seconds", i64::MAX, None),
        ] {
            let mut b = Build::new(&[("samples", "count")]).period("cpu", unit, period);
            b.stack("main", &[1], &[]);
            assert_eq!(b.series()[0].sample_rate, rate, "{period} {unit}");
        }
        let mut b = Build::new(&[("samples", "count")]);
        b.stack("main", &[1], &[]);
        assert_eq!(b.series()[0].sample_rate, None, "no period type");
    }

    fn go_heap() -> Build {
        let mut b = Build::new(&[
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
        ])
        .period("space", "bytes", 512 * 1024);
        // Go repeats a stack once per allocation size, with a numeric `bytes` label.
        for (size, values) in [(16, [4, 64, 1, 16]), (32, [2, 64, 0, 0])] {
            b.stack("main;newBuffer;runtime.mallocgc", &values, &[]);
            let bytes = b.s("bytes");
            let sample = b.profile.sample.last_mut().unwrap();
            sample.label.push(Label {
                key: bytes,
                num: size,
                ..Label::default()
            });
        }
        b.stack("main;init", &[1, 1024, 1, 1024], &[]);
        b
    }

    #[test]
    fn go_heap_profile_becomes_four_series() {
        let series = go_heap().series();
        let summary: Vec<_> = series
            .iter()
            .map(|s| {
                (
                    s.name_suffix.as_str(),
                    s.units.as_str(),
                    s.aggregation,
                    s.cumulative,
                    s.sample_rate,
                    s.tree.total(),
                )
            })
            .collect();
        use Aggregation::{Average, Sum};
        assert_eq!(
            summary,
            [
                ("alloc_objects", "objects", Sum, true, None, 7),
                ("alloc_space", "bytes", Sum, true, None, 1152),
                ("inuse_objects", "objects", Average, false, None, 2),
                ("inuse_space", "bytes", Average, false, None, 1040),
            ]
        );
        assert!(
            series.iter().all(|s| s.labels.is_empty()),
            "numeric labels are ignored"
        );
        assert_eq!(
            folded(&series[1].tree),
            ["main;init 1024", "main;newBuffer;runtime.mallocgc 128"]
        );
        assert_eq!(
            folded(&series[3].tree),
            ["main;init 1024", "main;newBuffer;runtime.mallocgc 16"]
        );
    }

    #[test]
    fn string_labels_split_series() {
        let mut b = Build::new(&[("samples", "count")]).period("cpu", "nanoseconds", 10_000_000);
        b.stack("main;a", &[1], &[]);
        b.stack("main;a", &[2], &[("span", "checkout"), ("env", "prod")]);
        b.stack("main;b", &[4], &[("env", "prod"), ("span", "checkout")]);
        b.stack("main;b", &[8], &[("span", "x"), ("span", "search")]);
        b.stack("main;c", &[16], &[("", "ignored"), ("empty", "")]);
        let series = b.series();
        let labels: Vec<_> = series
            .iter()
            .map(|s| (s.labels.clone(), s.tree.total()))
            .collect();
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        assert_eq!(
            labels,
            [
                (vec![], 17),
                (vec![pair("env", "prod"), pair("span", "checkout")], 6),
                (vec![pair("span", "search")], 8),
            ]
        );
        assert_eq!(folded(&series[1].tree), ["main;a 2", "main;b 4"]);
        assert!(series.iter().all(|s| s.name_suffix == "cpu"));
    }

    #[test]
    fn inlined_lines_expand_caller_first() {
        let mut b = Build::new(&[("samples", "count")]);
        let main = b.location(&["main"]);
        // memcpy and bytes.Clone were inlined into printf: innermost first.
        let printf = b.location(&["memcpy", "bytes.Clone", "printf"]);
        b.sample(vec![printf, main], &[5], &[]);
        assert_eq!(
            folded(&b.series()[0].tree),
            ["main;printf;bytes.Clone;memcpy 5"]
        );
    }

    #[test]
    fn unsymbolized_locations_are_named_by_address() {
        let mut b = Build::new(&[("samples", "count")]);
        let libc = b.s("/usr/lib/x86_64-linux-gnu/libc.so.6");
        b.profile.mapping.push(Mapping {
            id: 1,
            memory_start: 0x7f00_0000_0000,
            memory_limit: 0x7f00_0010_0000,
            file_offset: 0x1000,
            filename: libc,
            ..Mapping::default()
        });
        b.profile.mapping.push(Mapping {
            id: 2,
            memory_start: 0x1000,
            memory_limit: 0x2000,
            ..Mapping::default()
        });
        let main = b.location(&["main"]);
        let mapped = b.profile.location.len() as u64 + 1;
        b.profile.location.push(Location {
            id: mapped,
            mapping_id: 1,
            address: 0x7f00_0000_1234,
            ..Location::default()
        });
        b.profile.location.push(Location {
            id: mapped + 1,
            mapping_id: 2,
            address: 0x1abc,
            ..Location::default()
        });
        b.profile.location.push(Location {
            id: mapped + 2,
            address: 0xdead,
            ..Location::default()
        });
        // A function with no name but a system name.
        let mangled = b.s("_ZN4core3fmt5write17h");
        b.profile.function.push(Function {
            id: 99,
            system_name: mangled,
            ..Function::default()
        });
        b.profile.location.push(Location {
            id: mapped + 3,
            line: vec![Line {
                function_id: 99,
                ..Line::default()
            }],
            ..Location::default()
        });
        b.sample(vec![mapped, main], &[1], &[]);
        b.sample(vec![mapped + 1, main], &[2], &[]);
        b.sample(vec![mapped + 2, main], &[4], &[]);
        b.sample(vec![mapped + 3, main], &[8], &[]);
        assert_eq!(
            folded(&b.series()[0].tree),
            [
                "main;0x1abc 2",
                "main;0xdead 4",
                "main;_ZN4core3fmt5write17h 8",
                "main;libc.so.6+0x2234 1"
            ]
        );
    }

    #[test]
    fn zero_values_add_nothing() {
        let mut b = Build::new(&[("samples", "count"), ("goroutine", "count")]);
        b.stack("main;a", &[0, 3], &[]);
        b.stack("main;b", &[0, 0], &[("k", "v")]);
        let series = b.series();
        assert_eq!(series.len(), 1, "an all-zero sample type gives no series");
        assert_eq!(series[0].name_suffix, "goroutines");
        assert_eq!(folded(&series[0].tree), ["main;a 3"]);
    }

    #[test]
    fn sample_type_config_replaces_the_defaults() {
        let mut b = Build::new(&[("contentions", "count"), ("delay", "nanoseconds")]).period(
            "contentions",
            "count",
            1,
        );
        b.stack("main;sync.(*Mutex).Lock", &[2, 500], &[]);
        let config = SampleTypes::from_json(
            br#"{"contentions":{"display-name":"block_count","units":"lock_samples"},
                 "delay":{"display-name":"block_duration","units":"lock_nanoseconds"}}"#,
        )
        .unwrap();
        let series = parse(&b.bytes(), &config, &Limits::default()).unwrap();
        let names: Vec<_> = series
            .iter()
            .map(|s| (s.name_suffix.as_str(), s.units.as_str(), s.cumulative))
            .collect();
        assert_eq!(
            names,
            [
                ("block_count", "lock_samples", false),
                ("block_duration", "lock_nanoseconds", false)
            ]
        );
        let defaults = b.series();
        assert_eq!(defaults[0].name_suffix, "mutex_count");
        assert!(defaults[0].cumulative);
        // Units fall back to the profile's own when the config has none.
        let mut types = SampleTypes::empty();
        types.insert("delay", SampleTypeConfig::default());
        let series = parse(&b.bytes(), &types, &Limits::default()).unwrap();
        assert_eq!(
            (series[0].name_suffix.as_str(), series[0].units.as_str()),
            ("delay", "nanoseconds")
        );
    }

    #[test]
    fn deep_stacks_keep_their_root_most_frames() {
        let mut b = Build::new(&[("samples", "count")]);
        let names: Vec<String> = (0..10).map(|i| format!("f{i}")).collect();
        b.stack(&names.join(";"), &[1], &[]);
        let limits = Limits {
            max_stack_depth: 4,
            ..Limits::default()
        };
        let series = parse(&b.bytes(), &SampleTypes::default(), &limits).unwrap();
        assert_eq!(folded(&series[0].tree), ["f0;f1;f2;f3 1"]);
    }

    #[test]
    fn sparse_ids_are_found() {
        let mut b = Build::new(&[("samples", "count")]);
        b.stack("main;work", &[7], &[]);
        // Addresses as ids, as some non-Go producers write them.
        for (i, location) in b.profile.location.iter_mut().enumerate() {
            location.id = 0x7fff_0000_0000 + i as u64 * 0x100;
        }
        let ids = b.profile.sample[0]
            .location_id
            .iter()
            .map(|&id| 0x7fff_0000_0000 + (id - 1) * 0x100)
            .collect();
        b.profile.sample[0].location_id = ids;
        assert_eq!(folded(&b.series()[0].tree), ["main;work 7"]);
    }

    #[test]
    fn invalid_utf8_names_are_replaced_not_rejected() {
        let mut b = Build::new(&[("samples", "count")]);
        b.stack("main;bad", &[1], &[]);
        let bad = b.strings["bad"] as usize;
        b.profile.string_table[bad] = vec![b'b', 0xff, b'd'];
        assert_eq!(folded(&b.series()[0].tree), ["main;b\u{fffd}d 1"]);
    }

    fn error_of(b: &Build) -> PprofError {
        parse(&b.bytes(), &SampleTypes::default(), &Limits::default()).unwrap_err()
    }

    #[test]
    fn string_index_out_of_range() {
        let mut b = go_cpu();
        b.profile.function[1].name = 1000;
        let err = error_of(&b);
        assert!(matches!(
            err,
            PprofError::StringIndex {
                field: "function.name",
                index: 1000,
                ..
            }
        ));
        assert_eq!(
            err.to_string(),
            format!(
                "string index 1000 in function.name is outside the string table of {} entries",
                b.profile.string_table.len()
            )
        );
        let mut b = go_cpu();
        b.profile.sample_type[0].unit = -1;
        assert!(matches!(
            error_of(&b),
            PprofError::StringIndex {
                field: "sample_type.unit",
                index: -1,
                ..
            }
        ));
        let mut b = go_cpu();
        b.profile.sample[2].label.push(Label {
            key: 1,
            str: 500,
            ..Label::default()
        });
        assert!(matches!(
            error_of(&b),
            PprofError::StringIndex {
                field: "label.str",
                ..
            }
        ));
    }

    #[test]
    fn unknown_ids_name_the_sample() {
        let mut b = go_cpu();
        b.profile.sample[1].location_id.push(77);
        let err = error_of(&b);
        assert!(matches!(
            err,
            PprofError::UnknownLocation { sample: 1, id: 77 }
        ));
        assert_eq!(err.to_string(), "sample 1 refers to unknown location id 77");

        let mut b = go_cpu();
        b.profile.location[0].line[0].function_id = 55;
        let err = error_of(&b);
        assert!(matches!(
            err,
            PprofError::UnknownFunction {
                sample: 0,
                location: 1,
                id: 55
            }
        ));
        assert_eq!(
            err.to_string(),
            "location 1 (used by sample 0) refers to unknown function id 55"
        );

        let mut b = go_cpu();
        let leaf = b.profile.sample[2].location_id[0] as usize - 1;
        b.profile.location[leaf].line.clear();
        b.profile.location[leaf].mapping_id = 9;
        assert!(matches!(
            error_of(&b),
            PprofError::UnknownMapping {
                sample: 2,
                id: 9,
                ..
            }
        ));
    }

    #[test]
    fn negative_values_are_rejected() {
        let mut b = go_cpu();
        b.profile.sample[2].value[0] = -4;
        let err = error_of(&b);
        assert!(matches!(
            &err,
            PprofError::NegativeValue { sample: 2, value: -4, sample_type } if sample_type == "samples"
        ));
        assert_eq!(
            err.to_string(),
            "sample 2 has negative value -4 for sample type samples"
        );
        // A negative value of a type that is not converted does not matter.
        let mut b = go_cpu();
        b.profile.sample[2].value[1] = -4;
        assert!(parse(&b.bytes(), &SampleTypes::default(), &Limits::default()).is_ok());
    }

    #[test]
    fn value_count_must_match_the_sample_types() {
        let mut b = go_cpu();
        b.profile.sample[3].value.pop();
        assert!(matches!(
            error_of(&b),
            PprofError::ValueCount {
                sample: 3,
                expected: 2,
                found: 1
            }
        ));
    }

    #[test]
    fn corrupt_bodies_are_errors() {
        let body = go_cpu().bytes();
        let err = parse(
            &body[..body.len() - 3],
            &SampleTypes::default(),
            &Limits::default(),
        )
        .unwrap_err();
        assert!(matches!(err, PprofError::Protobuf { .. }), "{err}");
        assert_eq!(err.to_string(), "invalid pprof protobuf");

        let zipped = gzip(&body);
        for bad in [
            &zipped[..zipped.len() / 2],
            &[0x1f, 0x8b][..],
            &[0x1f, 0x8b, 0, 0, 0],
        ] {
            let err = decode(bad, &Limits::default()).unwrap_err();
            assert!(matches!(err, PprofError::Gzip { .. }), "{err}");
        }
    }

    #[test]
    fn size_cap_applies_before_and_after_gunzip() {
        let body = go_cpu().bytes();
        let exact = Limits {
            max_bytes: body.len(),
            ..Limits::default()
        };
        assert!(decode(&body, &exact).is_ok());
        assert!(decode(&gzip(&body), &exact).is_ok());
        let short = Limits {
            max_bytes: body.len() - 1,
            ..Limits::default()
        };
        for input in [body.clone(), gzip(&body)] {
            let err = decode(&input, &short).unwrap_err();
            assert!(matches!(err, PprofError::TooLarge { limit } if limit == body.len() - 1));
        }
        // A gzip bomb stops at the cap instead of inflating fully.
        let bomb = gzip(&vec![0u8; 50 << 20]);
        let small = Limits {
            max_bytes: 1 << 20,
            ..Limits::default()
        };
        let err = decode(&bomb, &small).unwrap_err();
        assert_eq!(
            err.to_string(),
            "profile is larger than the limit of 1048576 bytes"
        );
    }

    #[test]
    fn sample_and_table_counts_are_capped() {
        let b = go_cpu();
        let few = Limits {
            max_samples: 3,
            ..Limits::default()
        };
        assert!(matches!(
            decode(&b.bytes(), &few).unwrap_err(),
            PprofError::TooManySamples { count: 4, limit: 3 }
        ));
        assert!(matches!(
            to_series(&b.profile, &SampleTypes::default(), &few).unwrap_err(),
            PprofError::TooManySamples { count: 4, limit: 3 }
        ));
        let entries =
            b.profile.string_table.len() + b.profile.location.len() + b.profile.function.len();
        let tight = Limits {
            max_entries: entries - 1,
            ..Limits::default()
        };
        assert!(matches!(
            decode(&b.bytes(), &tight).unwrap_err(),
            PprofError::TooManyEntries { count, .. } if count == entries
        ));
    }

    #[test]
    fn varints_stop_at_ten_bytes() {
        assert_eq!(varint(&[0x96, 0x01]), Some((150, 2)));
        assert_eq!(varint(&[0x80]), None);
        assert_eq!(varint(&[0xff; 11]), None);
    }
}
