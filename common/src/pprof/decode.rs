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
//!
//! Samples labelled with a span (`span_id`, see [`crate::span`]) are also added to that span's
//! tree of their series ([`ProfileSeries::spans`]); the span labels (`span_id`, `span_name`,
//! `trace_id`) never become series labels.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Read;

use prost::Message;

use super::proto::{Location, Profile, Sample};
use super::{Limits, PprofError, SampleTypeConfig, SampleTypes};
use crate::profile::Aggregation;
use crate::span::{self, SpanId, SpanTrees};
use crate::tree::{FrameId, NodeId, Tree};
use crate::varint;

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
    /// The samples' string labels, sorted by key; never the span labels.
    pub labels: Vec<(String, String)>,
    /// The stacks and their values.
    pub tree: Tree,
    /// The samples of `tree` that carried a `span_id` label, per span.
    pub spans: SpanTrees,
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
        let Some((key, n)) = varint::get(&bytes[pos..]) else {
            break;
        };
        pos += n;
        match key & 7 {
            0 => match varint::get(&bytes[pos..]) {
                Some((_, n)) => pos += n,
                None => break,
            },
            1 => pos = pos.saturating_add(8),
            2 => {
                let Some((len, n)) = varint::get(&bytes[pos..]) else {
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
    let (mut trees, mut spans) = trees;
    let mut out = Vec::new();
    for (k, selected) in selected.iter().enumerate() {
        for &set in &order {
            if let Some(tree) = trees[set * n + k].take() {
                let spans = std::mem::take(&mut spans[set * n + k]);
                out.push(selected.series(&sets[set], tree, spans, sample_rate));
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
        spans: SpanTrees,
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
            spans,
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
    /// String index → whether it is a span label's key ([`span::is_span_label`]).
    span_keys: HashMap<i64, bool, RandomState>,
    /// String index of a `span_id` value → the span it names.
    span_ids: HashMap<i64, Option<SpanId>, RandomState>,
}

impl LabelSets {
    fn new() -> Self {
        LabelSets {
            sets: vec![Vec::new()],
            ids: HashMap::default(),
            raw: HashMap::default(),
            buf: Vec::new(),
            span_keys: HashMap::default(),
            span_ids: HashMap::default(),
        }
    }

    /// The set of `sample`'s string labels, and the span its `span_id` label names. Span
    /// labels are left out of the set; a `span_id` that is not 16 hex digits names no span.
    fn of(
        &mut self,
        sample: &Sample,
        strings: Strings<'_>,
    ) -> Result<(usize, Option<SpanId>), PprofError> {
        self.buf.clear();
        let mut span = None;
        for label in &sample.label {
            // Numeric labels have no `str`; index 0 is "" and means the same.
            if label.str == 0 {
                continue;
            }
            let key = strings.bytes(label.key, "label.key")?;
            let value = strings.bytes(label.str, "label.str")?;
            if label.key == 0 {
                continue;
            }
            let is_span = *self
                .span_keys
                .entry(label.key)
                .or_insert_with(|| std::str::from_utf8(key).is_ok_and(span::is_span_label));
            if !is_span {
                self.buf.push((label.key, label.str));
            } else if key == span::SPAN_ID_LABEL.as_bytes() {
                // The last `span_id` wins, as the last value of any repeated key does.
                span = *self.span_ids.entry(label.str).or_insert_with(|| {
                    std::str::from_utf8(value).ok().and_then(SpanId::from_label)
                });
            }
        }
        if self.buf.is_empty() {
            return Ok((0, span));
        }
        if let Some(&set) = self.raw.get(self.buf.as_slice()) {
            return Ok((set, span));
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
        Ok((set, span))
    }
}

/// One distinct (label set, span, stack) of a profile.
#[derive(Clone, Copy)]
struct StackEntry<'p> {
    /// Its label set.
    set: usize,
    /// The span its samples ran in, if they carried one.
    span: Option<SpanId>,
    /// Its location ids, leaf first.
    locations: &'p [u64],
    /// The first sample that had it, for error messages.
    sample: usize,
}

/// Per (label set, sample type): the tree and the span trees of a profile.
type Built = (Vec<Option<Tree>>, Vec<SpanTrees>);

/// The distinct (label set, span, stack) triples of a profile with their summed values.
struct Stacks<'p> {
    labels: LabelSets,
    /// Each distinct stack.
    entries: Vec<StackEntry<'p>>,
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
        let mut index: HashMap<(usize, Option<SpanId>, &'p [u64]), usize, RandomState> =
            HashMap::default();
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
            let (set, span) = if sample.label.is_empty() {
                (0, None)
            } else {
                stacks.labels.of(sample, *strings)?
            };
            if !any {
                continue;
            }
            let next = stacks.entries.len();
            let entry = *index
                .entry((set, span, sample.location_id.as_slice()))
                .or_insert(next);
            if entry == next {
                stacks.entries.push(StackEntry {
                    set,
                    span,
                    locations: &sample.location_id,
                    sample: i,
                });
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
    /// `k`th selected sample type, and beside each its span trees.
    ///
    /// Each label set's distinct stacks are inserted once, as a shape
    /// ([`Tree::insert_path`]); each sample type's tree then takes its values from that shape
    /// in one pass over the nodes ([`Tree::with_self_values`]). A heap profile's four trees
    /// cost one walk per stack instead of four. A stack of a span is also inserted into that
    /// span's tree, once per sample type with a value, while the span trees hold fewer than
    /// [`Limits::max_span_nodes`] nodes.
    fn build(
        &self,
        profile: &'p Profile,
        strings: &Strings<'p>,
        locations: &IdIndex,
        limits: &Limits,
    ) -> Result<Built, PprofError> {
        let n = self.n;
        let mut shapes: Vec<Option<Builder>> = (0..self.labels.sets.len()).map(|_| None).collect();
        let mut spans: Vec<SpanTrees> = (0..self.labels.sets.len() * n)
            .map(|_| SpanTrees::new())
            .collect();
        let mut resolver = Resolver::new(profile, *strings);
        let mut frames: Vec<u32> = Vec::new();
        let mut stack: Vec<FrameId> = Vec::new();
        let mut leaves: Vec<NodeId> = Vec::with_capacity(self.entries.len());
        // Nodes of every span tree so far, against `Limits::max_span_nodes`.
        let mut span_nodes = 0usize;
        for (e, entry) in self.entries.iter().enumerate() {
            let StackEntry {
                set,
                span,
                locations: location_ids,
                sample,
            } = *entry;
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
            if let Some(span) = span.filter(|_| span_nodes < limits.max_span_nodes) {
                for k in 0..n {
                    let value = self.values[e * n + k];
                    if value > 0 {
                        let names = frames.iter().map(|&f| &*resolver.names[f as usize]);
                        let tree = spans[set * n + k].tree_mut(span);
                        let before = tree.len();
                        tree.insert_names(names, value);
                        span_nodes += tree.len() - before;
                    }
                }
            }
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
            for (e, entry) in self.entries.iter().enumerate() {
                if entry.set == set {
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
        Ok((trees, spans))
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
            return Ok(address_frame(
                location.address,
                Some((&file, mapping.memory_start, mapping.file_offset)),
            ));
        }
        Ok(address_frame(location.address, None))
    }
}

/// The name of a frame known only by its address, as pprof and OTLP locations without
/// function names are named: `<file basename>+0x<file offset>` when its mapping (file, start
/// address, file offset) names a file, else `0x<address>`.
pub(crate) fn address_frame(address: u64, mapping: Option<(&str, u64, u64)>) -> String {
    if let Some((file, memory_start, file_offset)) = mapping {
        let base = file.rsplit(['/', '\\']).next().unwrap_or_default();
        if !base.is_empty() {
            let offset = address.wrapping_sub(memory_start).wrapping_add(file_offset);
            return format!("{base}+0x{offset:x}");
        }
    }
    format!("0x{address:x}")
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
#[path = "decode_tests.rs"]
mod tests;
