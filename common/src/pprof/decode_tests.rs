//! Tests of pprof decoding: every sample-type mapping, label split, frame rule and error path.

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
                    l.line.len() == 1 && self.functions.get(name) == Some(&l.line[0].function_id)
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

/// pyroscope-otel's labels (pyroscope-io 1.4 sends them as pprof sample labels): the span id
/// goes to the span index, and none of `span_id`, `span_name`, `trace_id` splits the series.
#[test]
fn span_labels_make_span_trees_not_series() {
    let mut b = Build::new(&[("samples", "count"), ("inuse_space", "bytes")]);
    let alpha = [
        ("span_id", "c0e0b0dbd40cdf14"),
        ("span_name", "alpha"),
        ("trace_id", "c0712b7cef35caf6bb3ee002b87fc2e4"),
    ];
    let beta = [
        ("span_id", "5A561ACCAAB40CF2"),
        ("span_name", "beta"),
        ("trace_id", "4b3c97f027eb841ca431cd06e04420e0"),
    ];
    b.stack("main;alpha_work", &[30, 1], &alpha);
    b.stack("main;alpha_work", &[10, 0], &alpha);
    b.stack("main;beta_work", &[20, 2], &beta);
    b.stack(
        "main;beta_work",
        &[5, 0],
        &[("span_id", "0000000000000000")],
    );
    b.stack(
        "main;idle",
        &[7, 0],
        &[("span_id", "not hex"), ("env", "prod")],
    );
    b.stack("main;idle", &[1, 0], &[]);
    let series = b.series();
    let summary: Vec<_> = series
        .iter()
        .map(|s| (s.sample_type.as_str(), s.labels.clone(), s.tree.total()))
        .collect();
    let env = vec![("env".to_string(), "prod".to_string())];
    assert_eq!(
        summary,
        [
            ("samples", vec![], 66),
            ("samples", env.clone(), 7),
            ("inuse_space", vec![], 3),
            ("inuse_space", env, 0),
        ]
        .into_iter()
        .filter(|(_, _, total)| *total > 0)
        .collect::<Vec<_>>()
    );
    let cpu = &series[0];
    let a = SpanId::from_label("c0e0b0dbd40cdf14").unwrap();
    let b_span = SpanId::from_label("5a561accaab40cf2").unwrap();
    assert_eq!(cpu.spans.len(), 2, "no span for zeros or bad hex");
    assert_eq!(folded(cpu.spans.get(a).unwrap()), ["main;alpha_work 40"]);
    assert_eq!(
        folded(cpu.spans.get(b_span).unwrap()),
        ["main;beta_work 20"]
    );
    let wall = &series[2];
    assert_eq!(folded(wall.spans.get(a).unwrap()), ["main;alpha_work 1"]);
    assert!(series[1].spans.is_empty());

    // Past the span nodes' bound, later samples keep no span; the series' trees are whole.
    let limits = Limits {
        max_span_nodes: 2,
        ..Limits::default()
    };
    let bounded = parse(&b.bytes(), &SampleTypes::default(), &limits).unwrap();
    assert_eq!(bounded[0].tree, series[0].tree);
    assert_eq!(bounded[0].spans.len(), 1, "the first span only");
    assert!(bounded[0].spans.get(a).is_some());
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
    assert_eq!(varint::get(&[0x96, 0x01]), Some((150, 2)));
    assert_eq!(varint::get(&[0x80]), None);
    assert_eq!(varint::get(&[0xff; 11]), None);
}
