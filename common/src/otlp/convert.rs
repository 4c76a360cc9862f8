//! OTLP profiles → Smolder profiles: sample types to series, stacks through the dictionary,
//! attributes to labels, links to span trees.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::proto::{
    AnyValue, ExportProfilesServiceRequest, KeyValue, Profile as OtlpProfile, ProfilesDictionary,
    Sample, Value,
};
use super::{Limits, OtlpError};
use crate::pprof::{SampleTypes, address_frame};
use crate::series::{is_label_name, sanitize_app_name, sanitize_label_name};
use crate::span::{SpanId, SpanTrees};
use crate::tree::FrameId;
use crate::{Aggregation, Labels, Profile, ProfileMeta, Series, Tree};

/// The resource or sample attribute that names the application.
const SERVICE_NAME: &str = "service.name";
/// The attribute that names the executable, for the fallback application name.
const EXECUTABLE_NAME: &str = "process.executable.name";
/// Attributes that identify one process or thread: as labels they would give every process its
/// own series, so they are not kept.
const IDENTIFIERS: &[&str] = &["process.pid", "process.parent_pid", "thread.id"];
/// The application of profiles that say nothing of theirs, as OpenTelemetry names it.
const UNKNOWN_SERVICE: &str = "unknown_service";
/// The spy name of every converted profile.
const SPY_NAME: &str = "otlp";
/// The sample rate assumed for time-valued CPU and wall samples without a period: the
/// `/ingest` default.
const DEFAULT_RATE: u64 = 100;

/// One converted profile: a series' tree, and the trees of its samples that carried a span.
#[derive(Clone, Debug)]
pub struct Converted {
    /// The profile.
    pub profile: Profile,
    /// Its samples per span, a subset of `profile.tree`, scaled the same way.
    pub spans: SpanTrees,
}

/// Converts every profile of `request` (already decoded under `limits`), all or nothing.
///
/// - **Series.** One per profile, application and set of sample attributes: the app name is
///   the `service.name` attribute (of the sample, else the profile, scope or resource; else
///   `unknown_service:<process.executable.name>`, else `unknown_service`), every character
///   outside `[A-Za-z0-9_.-]` made `_`, then `.` and the suffix of the sample type. Labels are
///   the resource's, scope's, profile's and sample's attributes, the more specific winning;
///   names outside `[A-Za-z0-9_.]` have those characters made `_`; names starting `__`
///   (private in Pyroscope), `service_name`, process and thread ids (`process.pid`,
///   `process.parent_pid`, `thread.id`: a series per process or thread) and values that are
///   lists, maps or bytes are skipped. Span ids never become labels.
/// - **Sample types.** `samples`/`count` with a period of type `cpu` in a time unit → `.cpu`,
///   CPU samples at `10^9 / period` Hz (the OpenTelemetry eBPF profiler's form); `cpu` and
///   `wall` in a time unit → `.cpu` and `.wall` samples at the period's rate (100 Hz without
///   one); `off_cpu` in a time unit → `.off_cpu` in nanoseconds; `memory_growth`/`bytes` →
///   `.memory_growth`; a pprof type Pyroscope knows (`alloc_space`, `inuse_objects`,
///   `contentions`, ...) → its suffix and units ([`SampleTypes::default`]); any other type →
///   its own name as the suffix, its unit as the units.
/// - **Stacks.** A sample's stack lists locations leaf first and a location's lines innermost
///   first; frames are read root first. A line's frame is its function's name, else its system
///   name; a location without either is `<mapping file basename>+0x<file offset>`, or
///   `0x<address>`. Stacks deeper than [`Limits::max_stack_depth`] keep their root-most frames.
/// - **Values.** A sample's values add up; without values, each timestamp counts 1. Samples of
///   zero add nothing.
/// - **Spans.** A sample whose link has a nonzero span id also goes to that span's tree.
/// - **Time.** From `time_unix_nano` (now when 0) for `duration_nano`.
///
/// # Errors
///
/// Every index is checked where it is followed, and everything that does not fit is an
/// [`OtlpError`] naming the field (see the [module documentation](super)).
pub fn convert(
    request: &ExportProfilesServiceRequest,
    limits: &Limits,
    now: SystemTime,
) -> Result<Vec<Converted>, OtlpError> {
    let dictionary = request
        .dictionary
        .as_ref()
        .ok_or(OtlpError::MissingDictionary)?;
    check_zero_entries(dictionary)?;
    let mut resolver = Resolver::new(dictionary, limits.max_stack_depth);
    let sample_types = SampleTypes::default();
    let mut out = Vec::new();
    for (r, resource_profiles) in request.resource_profiles.iter().enumerate() {
        let resource = match &resource_profiles.resource {
            Some(resource) => key_values(dictionary, &resource.attributes, || {
                format!("resource_profiles[{r}].resource.attributes")
            })?,
            None => Vec::new(),
        };
        for (s, scope_profiles) in resource_profiles.scope_profiles.iter().enumerate() {
            let scope = match &scope_profiles.scope {
                Some(scope) => key_values(dictionary, &scope.attributes, || {
                    format!("resource_profiles[{r}].scope_profiles[{s}].scope.attributes")
                })?,
                None => Vec::new(),
            };
            for (p, profile) in scope_profiles.profiles.iter().enumerate() {
                let at = Position {
                    resource: r,
                    scope: s,
                    profile: p,
                };
                let context = Context {
                    resource: &resource,
                    scope: &scope,
                    sample_types: &sample_types,
                    now,
                };
                out.extend(convert_profile(profile, &context, &mut resolver, &at)?);
            }
        }
    }
    Ok(out)
}

/// Where a profile sits in the request, for error messages.
struct Position {
    resource: usize,
    scope: usize,
    profile: usize,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "resource_profiles[{}].scope_profiles[{}].profiles[{}]",
            self.resource, self.scope, self.profile
        )
    }
}

/// What a profile's conversion needs from around it.
struct Context<'a> {
    resource: &'a [(String, String)],
    scope: &'a [(String, String)],
    sample_types: &'a SampleTypes,
    now: SystemTime,
}

/// Entry 0 of every table must be the zero value, and the string table must have it.
fn check_zero_entries(d: &ProfilesDictionary) -> Result<(), OtlpError> {
    fn zero<T: Default + PartialEq>(table: &[T], name: &'static str) -> Result<(), OtlpError> {
        match table.first() {
            Some(first) if *first != T::default() => Err(OtlpError::ZeroEntry { table: name }),
            _ => Ok(()),
        }
    }
    if d.string_table.first().is_none_or(|s| !s.is_empty()) {
        return Err(OtlpError::ZeroEntry {
            table: "string_table",
        });
    }
    zero(&d.mapping_table, "mapping_table")?;
    zero(&d.location_table, "location_table")?;
    zero(&d.function_table, "function_table")?;
    zero(&d.link_table, "link_table")?;
    zero(&d.attribute_table, "attribute_table")?;
    zero(&d.stack_table, "stack_table")
}

/// `table[index]`, or an [`OtlpError::Index`] naming `field`.
fn entry<'t, T>(
    table: &'t [T],
    name: &'static str,
    index: i32,
    field: impl FnOnce() -> String,
) -> Result<&'t T, OtlpError> {
    usize::try_from(index)
        .ok()
        .and_then(|i| table.get(i))
        .ok_or_else(|| OtlpError::Index {
            field: field(),
            index: i64::from(index),
            table: name,
            len: table.len(),
        })
}

fn string(
    d: &ProfilesDictionary,
    index: i32,
    field: impl FnOnce() -> String,
) -> Result<&str, OtlpError> {
    entry(&d.string_table, "string_table", index, field).map(String::as_str)
}

/// A value as a label value: strings, booleans and numbers; `None` for lists, maps, bytes and
/// no value.
fn value_text(
    d: &ProfilesDictionary,
    value: Option<&AnyValue>,
    field: impl FnOnce() -> String,
) -> Result<Option<String>, OtlpError> {
    Ok(match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => Some(s.clone()),
        Some(Value::BoolValue(b)) => Some(b.to_string()),
        Some(Value::IntValue(i)) => Some(i.to_string()),
        Some(Value::DoubleValue(f)) => Some(f.to_string()),
        Some(Value::StringValueStrindex(i)) => Some(string(d, *i, field)?.to_owned()),
        Some(Value::ArrayValue(_) | Value::KvlistValue(_) | Value::BytesValue(_)) | None => None,
    })
}

/// The attributes of a resource or scope, as `(key, value)` in the order given.
fn key_values(
    d: &ProfilesDictionary,
    attributes: &[KeyValue],
    field: impl Fn() -> String,
) -> Result<Vec<(String, String)>, OtlpError> {
    let mut out = Vec::with_capacity(attributes.len());
    for (i, kv) in attributes.iter().enumerate() {
        let key = match (kv.key.is_empty(), kv.key_strindex) {
            (false, 0) => kv.key.as_str(),
            (true, index) => string(d, index, || format!("{}[{i}].key_strindex", field()))?,
            (false, _) => {
                return Err(OtlpError::AmbiguousKey {
                    field: format!("{}[{i}]", field()),
                });
            }
        };
        if let Some(value) = value_text(d, kv.value.as_ref(), || format!("{}[{i}].value", field()))?
        {
            out.push((key.to_owned(), value));
        }
    }
    Ok(out)
}

/// The attributes behind `indices`, as `(key, value)`.
fn indexed_attributes(
    d: &ProfilesDictionary,
    indices: &[i32],
    field: impl Fn() -> String,
) -> Result<Vec<(String, String)>, OtlpError> {
    let mut out = Vec::with_capacity(indices.len());
    for (i, &index) in indices.iter().enumerate() {
        let attribute = entry(&d.attribute_table, "attribute_table", index, || {
            format!("{}[{i}]", field())
        })?;
        let key = string(d, attribute.key_strindex, || {
            format!("attribute_table[{index}].key_strindex")
        })?;
        if let Some(value) = value_text(d, attribute.value.as_ref(), || {
            format!("attribute_table[{index}].value")
        })? {
            out.push((key.to_owned(), value));
        }
    }
    Ok(out)
}

/// How a profile's samples become a series: its suffix, units, aggregation and sample rate,
/// and the factor its values are multiplied by.
#[derive(Debug, PartialEq, Eq)]
struct Kind {
    suffix: String,
    units: String,
    aggregation: Aggregation,
    sample_rate: u32,
    /// `(numerator, denominator)`.
    scale: (u64, u64),
}

/// Units per second of a time unit.
fn per_second(unit: &str) -> Option<u64> {
    match unit {
        "nanoseconds" | "ns" => Some(1_000_000_000),
        "microseconds" | "us" => Some(1_000_000),
        "milliseconds" | "ms" => Some(1_000),
        "seconds" | "s" => Some(1),
        _ => None,
    }
}

/// A suffix or unit made of app-name characters other than the dot (`[A-Za-z0-9_-]`), so that
/// it stays one part of `<service>.<suffix>`.
fn suffix_text(text: &str) -> String {
    sanitize_app_name(text).replace('.', "_")
}

fn kind(
    d: &ProfilesDictionary,
    profile: &OtlpProfile,
    sample_types: &SampleTypes,
    at: &Position,
) -> Result<Kind, OtlpError> {
    let sample_type = profile
        .sample_type
        .ok_or_else(|| OtlpError::MissingSampleType {
            profile: at.to_string(),
        })?;
    let kind = string(d, sample_type.type_strindex, || {
        format!("{at}.sample_type.type_strindex")
    })?;
    let unit = string(d, sample_type.unit_strindex, || {
        format!("{at}.sample_type.unit_strindex")
    })?;
    let (period_kind, period_unit) = match profile.period_type {
        Some(period_type) => (
            string(d, period_type.type_strindex, || {
                format!("{at}.period_type.type_strindex")
            })?,
            string(d, period_type.unit_strindex, || {
                format!("{at}.period_type.unit_strindex")
            })?,
        ),
        None => ("", ""),
    };
    // The rate of a period in a time unit, if there is one.
    let rate = match per_second(period_unit) {
        Some(units) if profile.period != 0 => {
            let period = u64::try_from(profile.period)
                .ok()
                .filter(|&p| p <= units)
                .ok_or_else(|| OtlpError::BadPeriod {
                    profile: at.to_string(),
                    period: profile.period,
                    unit: period_unit.to_owned(),
                })?;
            // Rounded: 19 Hz has a period of 52631578 ns, 10^9 / which is 19.0000001.
            Some((units + period / 2) / period)
        }
        _ => None,
    };
    let cpu_rate = rate.filter(|_| period_kind == "cpu");
    // Sample counts at `rate`; values in a time unit (`per_second` of them a second) are
    // turned into counts at that rate.
    let sampled = |suffix: &str, rate: Option<u64>, per_second: Option<u64>| {
        let rate = rate.unwrap_or(DEFAULT_RATE);
        Kind {
            suffix: suffix.to_owned(),
            units: "samples".to_owned(),
            aggregation: Aggregation::Sum,
            // At most 10^9: the period is at least a nanosecond.
            sample_rate: u32::try_from(rate).unwrap_or(u32::MAX),
            scale: per_second.map_or((1, 1), |units| (rate, units)),
        }
    };
    let plain = |suffix: &str, units: &str, aggregation: Aggregation| Kind {
        suffix: suffix.to_owned(),
        units: units.to_owned(),
        aggregation,
        sample_rate: 0,
        scale: (1, 1),
    };
    Ok(match (kind, per_second(unit)) {
        ("", _) => {
            return Err(OtlpError::UnnamedSampleType {
                profile: at.to_string(),
            });
        }
        ("samples", _) => match cpu_rate {
            Some(rate) => sampled("cpu", Some(rate), None),
            None => {
                return Err(OtlpError::NoCpuPeriod {
                    profile: at.to_string(),
                });
            }
        },
        ("cpu", Some(units)) => sampled("cpu", cpu_rate, Some(units)),
        ("wall", Some(units)) => sampled("wall", rate, Some(units)),
        ("off_cpu", Some(units)) => Kind {
            scale: (1_000_000_000, units),
            ..plain("off_cpu", "nanoseconds", Aggregation::Sum)
        },
        ("memory_growth", _) if unit == "bytes" => {
            plain("memory_growth", "bytes", Aggregation::Sum)
        }
        (name, _) => match sample_types.get(name) {
            Some(config) => {
                let suffix = if config.display_name.is_empty() {
                    name
                } else {
                    &config.display_name
                };
                let units = if config.units.is_empty() {
                    unit
                } else {
                    &config.units
                };
                plain(&suffix_text(suffix), units, config.aggregation)
            }
            None => {
                let units = if unit.is_empty() { "count" } else { unit };
                plain(&suffix_text(name), units, Aggregation::Sum)
            }
        },
    })
}

/// The value of sample `i`: its values added up, or its number of timestamps.
fn sample_value(sample: &Sample, at: &Position, i: usize) -> Result<u64, OtlpError> {
    let here = || format!("{at}.samples[{i}]");
    let (values, timestamps) = (sample.values.len(), sample.timestamps_unix_nano.len());
    if values != 0 && timestamps != 0 && values != timestamps {
        return Err(OtlpError::ValueCount {
            sample: here(),
            values,
            timestamps,
        });
    }
    if values == 0 {
        if timestamps == 0 {
            return Err(OtlpError::NoValues { sample: here() });
        }
        return Ok(timestamps as u64);
    }
    let mut sum = 0u64;
    for &value in &sample.values {
        let value = u64::try_from(value).map_err(|_| OtlpError::NegativeValue {
            sample: here(),
            value,
        })?;
        sum = sum
            .checked_add(value)
            .ok_or_else(|| OtlpError::ValueOverflow { sample: here() })?;
    }
    Ok(sum)
}

/// The span of a sample's link, if it has one with a nonzero span id.
fn span(
    d: &ProfilesDictionary,
    sample: &Sample,
    at: &Position,
    i: usize,
) -> Result<Option<SpanId>, OtlpError> {
    if sample.link_index == 0 {
        return Ok(None);
    }
    let link = entry(&d.link_table, "link_table", sample.link_index, || {
        format!("{at}.samples[{i}].link_index")
    })?;
    let index = sample.link_index;
    if !(link.trace_id.is_empty() || link.trace_id.len() == 16) {
        return Err(OtlpError::BadId {
            field: format!("link_table[{index}].trace_id"),
            len: link.trace_id.len(),
            expected: "16",
        });
    }
    let bytes = <[u8; 8]>::try_from(link.span_id.as_slice()).map_err(|_| OtlpError::BadId {
        field: format!("link_table[{index}].span_id"),
        len: link.span_id.len(),
        expected: "8",
    })?;
    Ok(SpanId::from_bytes(bytes))
}

/// A label name with characters outside `[A-Za-z0-9_.]` made `_`; `None` for names that are
/// not labels (see [`convert`]).
fn label_name(key: &str) -> Option<Cow<'_, str>> {
    if key.is_empty()
        || key.starts_with("__")
        || key == "service_name"
        || key == SERVICE_NAME
        || IDENTIFIERS.contains(&key)
    {
        return None;
    }
    if is_label_name(key) {
        return Some(Cow::Borrowed(key));
    }
    Some(Cow::Owned(sanitize_label_name(key)))
}

/// The samples of one series being gathered: its tree, built from the resolver's frames.
#[derive(Default)]
struct Group {
    tree: Tree,
    /// Resolver frame → this tree's frame. A map, not a vector as long as the resolver's
    /// names: a request can hold thousands of series over a large name table.
    remap: HashMap<u32, FrameId, foldhash::fast::RandomState>,
    spans: SpanTrees,
}

fn convert_profile(
    profile: &OtlpProfile,
    context: &Context<'_>,
    resolver: &mut Resolver<'_>,
    at: &Position,
) -> Result<Vec<Converted>, OtlpError> {
    let d = resolver.dictionary;
    if !(profile.profile_id.is_empty() || profile.profile_id.len() == 16) {
        return Err(OtlpError::BadId {
            field: format!("{at}.profile_id"),
            len: profile.profile_id.len(),
            expected: "16",
        });
    }
    let kind = kind(d, profile, context.sample_types, at)?;
    let own = indexed_attributes(d, &profile.attribute_indices, || {
        format!("{at}.attribute_indices")
    })?;
    // Least specific first, so that later inserts win.
    let mut base: BTreeMap<String, String> = BTreeMap::new();
    let mut service = None;
    for (key, value) in context.resource.iter().chain(context.scope).chain(&own) {
        if key == SERVICE_NAME && !value.is_empty() {
            service = Some(value.as_str());
        }
        if let Some(name) = label_name(key) {
            base.insert(name.into_owned(), value.clone());
        }
    }
    let fallback = match base.get(EXECUTABLE_NAME) {
        Some(executable) => format!("{UNKNOWN_SERVICE}:{executable}"),
        None => UNKNOWN_SERVICE.to_owned(),
    };
    let profile_service = service.map_or(fallback, str::to_owned);

    let mut groups: BTreeMap<(String, Vec<(String, String)>), Group> = BTreeMap::new();
    let mut stack = Vec::new();
    for (i, sample) in profile.samples.iter().enumerate() {
        let value = sample_value(sample, at, i)?;
        let attributes = indexed_attributes(d, &sample.attribute_indices, || {
            format!("{at}.samples[{i}].attribute_indices")
        })?;
        let span = span(d, sample, at, i)?;
        let (start, len) = resolver.stack(sample.stack_index, || {
            format!("{at}.samples[{i}].stack_index")
        })?;
        let frames = &resolver.stack_frames[start..start + len];
        if value == 0 {
            continue;
        }
        let mut service = None;
        let mut labels = BTreeMap::new();
        for (key, value) in attributes {
            if key == SERVICE_NAME && !value.is_empty() {
                service = Some(value);
            } else if let Some(name) = label_name(&key) {
                labels.insert(name.into_owned(), value);
            }
        }
        let key = (
            service.unwrap_or_else(|| profile_service.clone()),
            labels.into_iter().collect(),
        );
        let group = groups.entry(key).or_default();
        stack.clear();
        for &frame in frames {
            let id = *group
                .remap
                .entry(frame)
                .or_insert_with(|| group.tree.intern(&resolver.names[frame as usize]));
            stack.push(id);
        }
        group.tree.insert(&stack, value);
        if let Some(span) = span {
            group.spans.tree_mut(span).insert_names(
                frames.iter().map(|&f| resolver.names[f as usize].as_str()),
                value,
            );
        }
    }

    let from = match profile.time_unix_nano {
        0 => context.now,
        nanos => UNIX_EPOCH + Duration::from_nanos(nanos),
    };
    let until = from
        .checked_add(Duration::from_nanos(profile.duration_nano))
        .unwrap_or(from);
    let mut out = Vec::with_capacity(groups.len());
    for ((service, sample_labels), mut group) in groups {
        let mut labels = base.clone();
        labels.extend(sample_labels);
        let app = format!("{}.{}", sanitize_app_name(&service), kind.suffix);
        let labels = Labels::from_pairs(labels).map_err(|source| OtlpError::Series {
            name: app.clone(),
            source,
        })?;
        let series = Series::new(app.clone(), labels)
            .map_err(|source| OtlpError::Series { name: app, source })?;
        let (numerator, denominator) = kind.scale;
        if numerator != denominator {
            group.tree.scale(numerator, denominator);
            group.spans.scale(numerator, denominator);
        }
        out.push(Converted {
            profile: Profile {
                series,
                meta: ProfileMeta {
                    spy_name: SPY_NAME.to_owned(),
                    sample_rate: kind.sample_rate,
                    units: kind.units.clone(),
                    aggregation: kind.aggregation,
                },
                from,
                until,
                tree: group.tree,
            },
            spans: group.spans,
        });
    }
    Ok(out)
}

/// Resolves stacks to frames through the dictionary, each location and stack once.
struct Resolver<'d> {
    dictionary: &'d ProfilesDictionary,
    max_depth: usize,
    /// Every distinct frame name met so far; frames are indices into it.
    names: Vec<String>,
    /// String index → frame, for function names.
    name_of_string: Vec<Option<u32>>,
    /// Location index → its frames in `location_frames`, root-most first.
    locations: Vec<Option<(usize, usize)>>,
    location_frames: Vec<u32>,
    /// Stack index → its frames in `stack_frames`, root first.
    stacks: Vec<Option<(usize, usize)>>,
    stack_frames: Vec<u32>,
}

impl<'d> Resolver<'d> {
    fn new(dictionary: &'d ProfilesDictionary, max_depth: usize) -> Self {
        Resolver {
            dictionary,
            max_depth,
            names: Vec::new(),
            name_of_string: vec![None; dictionary.string_table.len()],
            locations: vec![None; dictionary.location_table.len()],
            location_frames: Vec::new(),
            stacks: vec![None; dictionary.stack_table.len()],
            stack_frames: Vec::new(),
        }
    }

    /// The frames of stack `index`, root first, as a span of `stack_frames`.
    fn stack(
        &mut self,
        index: i32,
        field: impl FnOnce() -> String,
    ) -> Result<(usize, usize), OtlpError> {
        let d = self.dictionary;
        let stack = entry(&d.stack_table, "stack_table", index, field)?;
        let index = index as usize;
        match self.stacks[index] {
            Some(span) => Ok(span),
            None => {
                let start = self.stack_frames.len();
                for (j, &location) in stack.location_indices.iter().enumerate().rev() {
                    let (from, n) = self.location(location, || {
                        format!("stack_table[{index}].location_indices[{j}]")
                    })?;
                    for k in from..from + n {
                        if self.stack_frames.len() - start == self.max_depth {
                            break;
                        }
                        self.stack_frames.push(self.location_frames[k]);
                    }
                }
                let span = (start, self.stack_frames.len() - start);
                self.stacks[index] = Some(span);
                Ok(span)
            }
        }
    }

    /// The frames of location `index`, root-most first, as a span of `location_frames`.
    fn location(
        &mut self,
        index: i32,
        field: impl FnOnce() -> String,
    ) -> Result<(usize, usize), OtlpError> {
        let d = self.dictionary;
        let location = entry(&d.location_table, "location_table", index, field)?;
        let index = index as usize;
        if let Some(span) = self.locations[index] {
            return Ok(span);
        }
        for (j, &attribute) in location.attribute_indices.iter().enumerate() {
            entry(&d.attribute_table, "attribute_table", attribute, || {
                format!("location_table[{index}].attribute_indices[{j}]")
            })?;
        }
        let start = self.location_frames.len();
        // Lines are innermost first; the last is the caller, so it comes first from the root.
        for (j, line) in location.lines.iter().enumerate().rev() {
            if line.function_index == 0 {
                continue;
            }
            let function = entry(
                &d.function_table,
                "function_table",
                line.function_index,
                || format!("location_table[{index}].lines[{j}].function_index"),
            )?;
            let f = line.function_index;
            let name = string(d, function.name_strindex, || {
                format!("function_table[{f}].name_strindex")
            })?;
            let system = string(d, function.system_name_strindex, || {
                format!("function_table[{f}].system_name_strindex")
            })?;
            string(d, function.filename_strindex, || {
                format!("function_table[{f}].filename_strindex")
            })?;
            let chosen = if name.is_empty() {
                function.system_name_strindex
            } else {
                function.name_strindex
            };
            if name.is_empty() && system.is_empty() {
                continue;
            }
            let frame = self.function_frame(chosen);
            self.location_frames.push(frame);
        }
        if self.location_frames.len() == start {
            let name = self.address_name(index)?;
            self.location_frames.push(self.names.len() as u32);
            self.names.push(name);
        }
        let span = (start, self.location_frames.len() - start);
        self.locations[index] = Some(span);
        Ok(span)
    }

    /// The frame named by string `index`, already checked to be in range.
    fn function_frame(&mut self, index: i32) -> u32 {
        let slot = &mut self.name_of_string[index as usize];
        *slot.get_or_insert_with(|| {
            self.names
                .push(self.dictionary.string_table[index as usize].clone());
            self.names.len() as u32 - 1
        })
    }

    /// The name of location `index` without function names.
    fn address_name(&self, index: usize) -> Result<String, OtlpError> {
        let d = self.dictionary;
        let location = &d.location_table[index];
        if location.mapping_index != 0 {
            let mapping = entry(
                &d.mapping_table,
                "mapping_table",
                location.mapping_index,
                || format!("location_table[{index}].mapping_index"),
            )?;
            let m = location.mapping_index;
            for (j, &attribute) in mapping.attribute_indices.iter().enumerate() {
                entry(&d.attribute_table, "attribute_table", attribute, || {
                    format!("mapping_table[{m}].attribute_indices[{j}]")
                })?;
            }
            let file = string(d, mapping.filename_strindex, || {
                format!("mapping_table[{m}].filename_strindex")
            })?;
            return Ok(address_frame(
                location.address,
                Some((file, mapping.memory_start, mapping.file_offset)),
            ));
        }
        Ok(address_frame(location.address, None))
    }
}
