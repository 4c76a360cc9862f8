//! Writing pprof: a [`Tree`] with one sample type → [`Profile`] → bytes.
//!
//! The output follows the spec's consistency rules: the string table starts with `""`, ids are
//! 1-based and unique, every referenced id exists. Each distinct frame that appears in a stack
//! gets one [`Function`] and one [`Location`] with the same id and a single [`Line`]; each
//! stack with a self value becomes one [`Sample`] whose value is that self value. There is no
//! [`Mapping`](super::proto::Mapping): locations have mapping id 0, "unknown", which pprof
//! accepts and which keeps it from trying to symbolize.

use std::collections::HashMap;
use std::io::Write;

use prost::Message;

use super::proto::{Function, Line, Location, Profile, Sample, ValueType};
use crate::tree::Tree;

/// What the encoded profile says its values are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodeOptions {
    /// The sample type, for example `samples` or `alloc_space`.
    pub sample_type: String,
    /// The unit of the values, for example `count` or `bytes`.
    pub unit: String,
    /// The sampling period, if the values are sampled.
    pub period: Option<Period>,
    /// When collection started, in nanoseconds since the Unix epoch; 0 if unknown.
    pub time_nanos: i64,
    /// How long collection lasted, in nanoseconds; 0 if unknown.
    pub duration_nanos: i64,
}

/// A sampling period: `value` events of `kind`, in `unit`, between samples.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Period {
    /// The kind of event, for example `cpu`.
    pub kind: String,
    /// The unit, for example `nanoseconds`.
    pub unit: String,
    /// The number of units between samples.
    pub value: i64,
}

impl EncodeOptions {
    /// Values of `sample_type` in `unit`, unsampled and untimed.
    pub fn new(sample_type: impl Into<String>, unit: impl Into<String>) -> Self {
        EncodeOptions {
            sample_type: sample_type.into(),
            unit: unit.into(),
            period: None,
            time_nanos: 0,
            duration_nanos: 0,
        }
    }

    /// CPU sample counts taken at `rate_hz` (clamped to at least 1): sample type
    /// `samples`/`count`, period `cpu`/`nanoseconds` of 10^9 / `rate_hz`, as Go writes them.
    pub fn cpu_samples(rate_hz: u32) -> Self {
        EncodeOptions {
            period: Some(Period {
                kind: "cpu".to_string(),
                unit: "nanoseconds".to_string(),
                value: 1_000_000_000 / i64::from(rate_hz.max(1)),
            }),
            ..EncodeOptions::new("samples", "count")
        }
    }
}

/// The string table being built, `""` first.
struct StringTable<'a> {
    index: HashMap<&'a str, i64>,
    table: Vec<Vec<u8>>,
}

impl<'a> StringTable<'a> {
    fn new() -> Self {
        let mut strings = StringTable {
            index: HashMap::new(),
            table: Vec::new(),
        };
        strings.add("");
        strings
    }

    fn add(&mut self, s: &'a str) -> i64 {
        *self.index.entry(s).or_insert_with(|| {
            self.table.push(s.as_bytes().to_vec());
            self.table.len() as i64 - 1
        })
    }
}

/// Writes `tree` as a profile with one sample type, described by `options`.
///
/// Values above `i64::MAX` (only reachable through saturation) are written as `i64::MAX`. A
/// value on the root itself becomes a sample with no locations.
pub fn encode(tree: &Tree, options: &EncodeOptions) -> Profile {
    let mut strings = StringTable::new();
    let sample_type = ValueType {
        r#type: strings.add(&options.sample_type),
        unit: strings.add(&options.unit),
    };
    let (period_type, period) = match &options.period {
        Some(period) => (
            Some(ValueType {
                r#type: strings.add(&period.kind),
                unit: strings.add(&period.unit),
            }),
            period.value,
        ),
        None => (None, 0),
    };
    // Frame id → location id (which is also the function id); 0 until first used.
    let mut location_of = vec![0u64; tree.frames().len()];
    let mut functions = Vec::new();
    let mut locations = Vec::new();
    let mut samples = Vec::new();
    tree.for_each_stack(|stack, value| {
        let mut location_id = Vec::with_capacity(stack.len());
        for &frame in stack.iter().rev() {
            let slot = &mut location_of[frame.index()];
            if *slot == 0 {
                let id = functions.len() as u64 + 1;
                let name = strings.add(tree.frames().name(frame));
                functions.push(Function {
                    id,
                    name,
                    system_name: name,
                    ..Function::default()
                });
                locations.push(Location {
                    id,
                    line: vec![Line {
                        function_id: id,
                        ..Line::default()
                    }],
                    ..Location::default()
                });
                *slot = id;
            }
            location_id.push(*slot);
        }
        samples.push(Sample {
            location_id,
            value: vec![i64::try_from(value).unwrap_or(i64::MAX)],
            label: Vec::new(),
        });
    });
    Profile {
        sample_type: vec![sample_type],
        sample: samples,
        mapping: Vec::new(),
        location: locations,
        function: functions,
        string_table: strings.table,
        time_nanos: options.time_nanos,
        duration_nanos: options.duration_nanos,
        period_type,
        period,
        ..Profile::default()
    }
}

impl Profile {
    /// The profile as protobuf bytes, gzipped if `gzip` (as pprof files on disk and Pyroscope
    /// bodies usually are).
    pub fn to_bytes(&self, gzip: bool) -> Vec<u8> {
        let raw = self.encode_to_vec();
        if !gzip {
            return raw;
        }
        // Fastest level, as Go's runtime/pprof writes: profiles are re-read soon, not archived.
        let mut encoder = flate2::write::GzEncoder::new(
            Vec::with_capacity(raw.len() / 3),
            flate2::Compression::fast(),
        );
        encoder
            .write_all(&raw)
            .expect("writing to a Vec cannot fail");
        encoder.finish().expect("writing to a Vec cannot fail")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::{Limits, SampleTypeConfig, SampleTypes, decode, parse};

    fn tree() -> Tree {
        let mut tree = Tree::new();
        tree.insert_names(["main", "handler", "json.Marshal"], 37);
        tree.insert_names(["main", "handler"], 3);
        tree.insert_names(["main", "gc"], 5);
        tree.insert_names(["other", "handler"], 1);
        tree
    }

    #[test]
    fn output_follows_the_spec_rules() {
        let profile = encode(&tree(), &EncodeOptions::cpu_samples(100));
        assert_eq!(profile.string_table[0], b"");
        let text = |i: i64| String::from_utf8(profile.string_table[i as usize].clone()).unwrap();
        assert_eq!(
            (
                text(profile.sample_type[0].r#type),
                text(profile.sample_type[0].unit)
            ),
            ("samples".to_string(), "count".to_string())
        );
        let period_type = profile.period_type.unwrap();
        assert_eq!(
            (
                text(period_type.r#type),
                text(period_type.unit),
                profile.period
            ),
            ("cpu".to_string(), "nanoseconds".to_string(), 10_000_000)
        );
        // One function and one location per distinct frame, ids 1..=n.
        assert_eq!(profile.function.len(), 5);
        for (i, (f, l)) in profile.function.iter().zip(&profile.location).enumerate() {
            assert_eq!((f.id, l.id), (i as u64 + 1, i as u64 + 1));
            assert_eq!(l.line.len(), 1);
            assert_eq!(l.line[0].function_id, f.id);
            assert_eq!(l.mapping_id, 0);
            assert_ne!(text(f.name), "");
        }
        let names: Vec<String> = profile.function.iter().map(|f| text(f.name)).collect();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "each name once");
        // One sample per stack with a self value, leaf first.
        assert_eq!(profile.sample.len(), 4);
        let leaf_first: Vec<String> = profile
            .sample
            .iter()
            .map(|s| {
                let names: Vec<String> = s
                    .location_id
                    .iter()
                    .map(|&id| text(profile.function[id as usize - 1].name))
                    .collect();
                format!("{} {}", names.join(";"), s.value[0])
            })
            .collect();
        assert_eq!(
            leaf_first,
            [
                "gc;main 5",
                "handler;main 3",
                "json.Marshal;handler;main 37",
                "handler;other 1"
            ]
        );
    }

    #[test]
    fn encoded_trees_decode_to_themselves() {
        let tree = tree();
        for gzip in [false, true] {
            let bytes = encode(&tree, &EncodeOptions::cpu_samples(100)).to_bytes(gzip);
            assert_eq!(bytes.starts_with(&[0x1f, 0x8b]), gzip);
            let series = parse(&bytes, &SampleTypes::default(), &Limits::default()).unwrap();
            assert_eq!(series.len(), 1);
            assert_eq!(series[0].tree, tree);
            assert_eq!(series[0].sample_rate, Some(100));
        }
    }

    #[test]
    fn options_are_carried_and_values_clamped() {
        let mut tree = Tree::new();
        tree.insert_names(["a"], u64::MAX);
        tree.insert_names(Vec::<&str>::new(), 2);
        let options = EncodeOptions {
            time_nanos: 1_700_000_000_000_000_000,
            duration_nanos: 10_000_000_000,
            ..EncodeOptions::new("alloc_space", "bytes")
        };
        let profile = decode(&encode(&tree, &options).to_bytes(true), &Limits::default()).unwrap();
        assert_eq!(profile.time_nanos, options.time_nanos);
        assert_eq!(profile.duration_nanos, options.duration_nanos);
        assert_eq!(profile.period_type, None);
        let values: Vec<(usize, i64)> = profile
            .sample
            .iter()
            .map(|s| (s.location_id.len(), s.value[0]))
            .collect();
        assert_eq!(values, [(0, 2), (1, i64::MAX)]);
        let mut types = SampleTypes::empty();
        types.insert("alloc_space", SampleTypeConfig::default());
        let series = crate::pprof::to_series(&profile, &types, &Limits::default()).unwrap();
        assert_eq!(series[0].units, "bytes");
        assert_eq!(
            series[0].tree.root().self_value(),
            2,
            "a root value survives"
        );
    }

    #[test]
    fn an_empty_tree_is_an_empty_profile() {
        let profile = encode(&Tree::new(), &EncodeOptions::new("samples", "count"));
        assert!(profile.sample.is_empty() && profile.location.is_empty());
        let series = parse(
            &profile.to_bytes(false),
            &SampleTypes::default(),
            &Limits::default(),
        );
        assert!(series.unwrap().is_empty());
    }
}
