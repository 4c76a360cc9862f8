//! Conversion of whole requests and the rejection of every kind of bad one.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::Message;

use super::proto::*;
use super::*;
use crate::{SpanId, Tree};

/// Builds a dictionary with interned strings, the zero entries in place.
struct Builder {
    d: ProfilesDictionary,
}

impl Builder {
    fn new() -> Self {
        Builder {
            d: ProfilesDictionary {
                mapping_table: vec![Mapping::default()],
                location_table: vec![Location::default()],
                function_table: vec![Function::default()],
                link_table: vec![Link::default()],
                string_table: vec![String::new()],
                attribute_table: vec![KeyValueAndUnit::default()],
                stack_table: vec![Stack::default()],
            },
        }
    }

    fn s(&mut self, text: &str) -> i32 {
        if let Some(i) = self.d.string_table.iter().position(|s| s == text) {
            return i as i32;
        }
        self.d.string_table.push(text.to_owned());
        self.d.string_table.len() as i32 - 1
    }

    fn function(&mut self, name: &str) -> i32 {
        let f = Function {
            name_strindex: self.s(name),
            system_name_strindex: 0,
            filename_strindex: self.s("main.py"),
            start_line: 1,
        };
        self.d.function_table.push(f);
        self.d.function_table.len() as i32 - 1
    }

    /// A location with one line per name, innermost first.
    fn location(&mut self, names: &[&str]) -> i32 {
        let lines = names
            .iter()
            .map(|name| Line {
                function_index: self.function(name),
                line: 10,
                column: 0,
            })
            .collect();
        self.d.location_table.push(Location {
            mapping_index: 0,
            address: 0,
            lines,
            attribute_indices: vec![],
        });
        self.d.location_table.len() as i32 - 1
    }

    /// A location without symbols, in a mapping of `file`.
    fn unsymbolized(&mut self, file: &str, address: u64) -> i32 {
        let filename = self.s(file);
        self.d.mapping_table.push(Mapping {
            memory_start: 0x1000,
            memory_limit: 0x9000,
            file_offset: 0x200,
            filename_strindex: filename,
            attribute_indices: vec![],
        });
        let mapping = self.d.mapping_table.len() as i32 - 1;
        self.d.location_table.push(Location {
            mapping_index: mapping,
            address,
            lines: vec![],
            attribute_indices: vec![],
        });
        self.d.location_table.len() as i32 - 1
    }

    /// A stack of locations, leaf first.
    fn stack(&mut self, locations: &[i32]) -> i32 {
        self.d.stack_table.push(Stack {
            location_indices: locations.to_vec(),
        });
        self.d.stack_table.len() as i32 - 1
    }

    fn attribute(&mut self, key: &str, value: Value) -> i32 {
        let key = self.s(key);
        self.d.attribute_table.push(KeyValueAndUnit {
            key_strindex: key,
            value: Some(AnyValue { value: Some(value) }),
            unit_strindex: 0,
        });
        self.d.attribute_table.len() as i32 - 1
    }

    fn link(&mut self, span: [u8; 8]) -> i32 {
        self.d.link_table.push(Link {
            trace_id: vec![7; 16],
            span_id: span.to_vec(),
        });
        self.d.link_table.len() as i32 - 1
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> ValueType {
        ValueType {
            type_strindex: self.s(kind),
            unit_strindex: self.s(unit),
        }
    }
}

fn string_attribute(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(value.to_owned())),
        }),
        key_strindex: 0,
    }
}

fn sample(stack: i32, values: &[i64]) -> Sample {
    Sample {
        stack_index: stack,
        values: values.to_vec(),
        ..Sample::default()
    }
}

const T0: u64 = 1_700_000_000_000_000_000;

/// An eBPF-style CPU profile (samples/count, period cpu/nanoseconds at 20 Hz) that uses every
/// table: two services split by a sample attribute, a thread label, inlined lines, an
/// unsymbolized frame in a mapping, and spans through the link table.
fn ebpf_request() -> ExportProfilesServiceRequest {
    let mut b = Builder::new();
    let main = b.location(&["main"]);
    let inlined = b.location(&["parse", "handle"]);
    let native = b.unsymbolized("/usr/lib/libc.so.6", 0x1234);
    let work = b.location(&["work"]);
    let stack_a = b.stack(&[inlined, main]);
    let stack_b = b.stack(&[native, work, main]);
    let thread = b.attribute("thread.name", Value::StringValue("worker-1".into()));
    let pid = b.attribute("process.pid", Value::IntValue(4242));
    let other_service = b.attribute("service.name", Value::StringValue("billing".into()));
    let span_a = b.link([0, 0, 0, 0, 0, 0, 0, 0xa]);
    let zero_span = b.link([0; 8]);
    let sample_type = b.value_type("samples", "count");
    let period_type = b.value_type("cpu", "nanoseconds");
    let profile = Profile {
        sample_type: Some(sample_type),
        samples: vec![
            Sample {
                link_index: span_a,
                attribute_indices: vec![thread, pid],
                ..sample(stack_a, &[3])
            },
            Sample {
                attribute_indices: vec![thread],
                timestamps_unix_nano: vec![T0, T0 + 1],
                ..sample(stack_b, &[])
            },
            Sample {
                link_index: zero_span,
                ..sample(stack_b, &[1, 1, 2])
            },
            Sample {
                attribute_indices: vec![other_service],
                ..sample(stack_a, &[5])
            },
            sample(stack_a, &[0]),
        ],
        time_unix_nano: T0,
        duration_nano: 10_000_000_000,
        period_type: Some(period_type),
        period: 50_000_000,
        profile_id: vec![1; 16],
        ..Profile::default()
    };
    ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![
                    string_attribute("service.name", "checkout"),
                    string_attribute("host.name", "web-1"),
                    string_attribute("thread.name", "overridden"),
                    KeyValue {
                        key: "deployment.canary".into(),
                        value: Some(AnyValue {
                            value: Some(Value::BoolValue(true)),
                        }),
                        key_strindex: 0,
                    },
                    KeyValue {
                        key: "process.command_args".into(),
                        value: Some(AnyValue {
                            value: Some(Value::ArrayValue(ArrayValue::default())),
                        }),
                        key_strindex: 0,
                    },
                ],
                dropped_attributes_count: 0,
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "ebpf-profiler".into(),
                    attributes: vec![string_attribute("__private__", "x")],
                    ..InstrumentationScope::default()
                }),
                profiles: vec![profile],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(b.d),
    }
}

fn folded(tree: &Tree) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    tree.for_each_stack(|stack, value| {
        let names: Vec<&str> = stack.iter().map(|&f| tree.frames().name(f)).collect();
        out.push((names.join(";"), value));
    });
    out
}

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn convert_bytes(body: &[u8]) -> Result<Vec<Converted>, OtlpError> {
    let limits = Limits::default();
    convert(&decode_protobuf(body, &limits)?, &limits, now())
}

#[test]
fn ebpf_profile_uses_every_table() {
    let converted = convert_bytes(&ebpf_request().encode_to_vec()).unwrap();
    let names: Vec<String> = converted
        .iter()
        .map(|c| c.profile.series.to_string())
        .collect();
    assert_eq!(
        names,
        [
            "billing.cpu{deployment.canary=true,host.name=web-1,thread.name=overridden}",
            "checkout.cpu{deployment.canary=true,host.name=web-1,thread.name=overridden}",
            "checkout.cpu{deployment.canary=true,host.name=web-1,thread.name=worker-1}",
        ]
    );
    let [billing, plain, worker] = &converted[..] else {
        panic!("three series")
    };
    // Samples stay counts at 20 Hz: the query path turns them into 5e7 ns each.
    assert_eq!(worker.profile.meta.units, "samples");
    assert_eq!(worker.profile.meta.sample_rate, 20);
    assert_eq!(worker.profile.meta.spy_name, "otlp");
    assert_eq!(
        folded(&worker.profile.tree),
        [
            ("main;handle;parse".to_owned(), 3),
            ("main;work;libc.so.6+0x434".to_owned(), 2),
        ]
    );
    assert_eq!(
        folded(&plain.profile.tree),
        [("main;work;libc.so.6+0x434".to_owned(), 4)]
    );
    assert_eq!(billing.profile.tree.total(), 5);
    // Only the sample with a nonzero span id has a span tree.
    let span = SpanId::from_bytes([0, 0, 0, 0, 0, 0, 0, 0xa]).unwrap();
    assert_eq!(worker.spans.len(), 1);
    assert_eq!(worker.spans.get(span).map(Tree::total), Some(3));
    assert!(plain.spans.is_empty() && billing.spans.is_empty());
    let from = UNIX_EPOCH + Duration::from_nanos(T0);
    assert_eq!(worker.profile.from, from);
    assert_eq!(worker.profile.until, from + Duration::from_secs(10));
}

#[test]
fn json_reads_the_same_request() {
    let request = ebpf_request();
    let json = serde_json::to_vec(&request).unwrap();
    let text = String::from_utf8(json.clone()).unwrap();
    assert!(text.contains(r#""spanId":"000000000000000a""#), "{text}");
    assert!(
        text.contains(r#""timeUnixNano":"1700000000000000000""#),
        "{text}"
    );
    let back = decode_json(&json, &Limits::default()).unwrap();
    assert_eq!(back, request);
    // Proto names, numbers for 64-bit integers and base64 ids read the same.
    let snake = text
        .replace("\"stackTable\"", "\"stack_table\"")
        .replace(
            "\"timeUnixNano\":\"1700000000000000000\"",
            "\"time_unix_nano\":1700000000000000000",
        )
        .replace("\"000000000000000a\"", "\"AAAAAAAAAAo=\"");
    assert_eq!(
        decode_json(snake.as_bytes(), &Limits::default()).unwrap(),
        request
    );
}

#[test]
fn cpu_time_and_off_cpu_types_convert() {
    let mut b = Builder::new();
    let main = b.location(&["main"]);
    let stack = b.stack(&[main]);
    let cpu = b.value_type("cpu", "nanoseconds");
    let period = b.value_type("cpu", "nanoseconds");
    let off = b.value_type("off_cpu", "microseconds");
    let alloc = b.value_type("alloc_space", "bytes");
    let custom = b.value_type("gpu time", "");
    let profiles = vec![
        Profile {
            sample_type: Some(cpu),
            period_type: Some(period),
            period: 10_000_000,
            samples: vec![sample(stack, &[40_000_000])],
            ..Profile::default()
        },
        Profile {
            sample_type: Some(off),
            samples: vec![sample(stack, &[7])],
            ..Profile::default()
        },
        Profile {
            sample_type: Some(alloc),
            samples: vec![sample(stack, &[512])],
            ..Profile::default()
        },
        Profile {
            sample_type: Some(custom),
            samples: vec![sample(stack, &[2])],
            ..Profile::default()
        },
    ];
    let request = ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![string_attribute("process.executable.name", "python3")],
                dropped_attributes_count: 0,
            }),
            scope_profiles: vec![ScopeProfiles {
                profiles,
                ..ScopeProfiles::default()
            }],
            ..ResourceProfiles::default()
        }],
        dictionary: Some(b.d),
    };
    let converted = convert_bytes(&request.encode_to_vec()).unwrap();
    let got: Vec<(String, String, u32, u64)> = converted
        .iter()
        .map(|c| {
            let p = &c.profile;
            (
                p.series.app().to_owned(),
                p.meta.units.clone(),
                p.meta.sample_rate,
                p.tree.total(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "unknown_service_python3.cpu".into(),
                "samples".into(),
                100,
                4
            ),
            (
                "unknown_service_python3.off_cpu".into(),
                "nanoseconds".into(),
                0,
                7000
            ),
            (
                "unknown_service_python3.alloc_space".into(),
                "bytes".into(),
                0,
                512
            ),
            (
                "unknown_service_python3.gpu_time".into(),
                "count".into(),
                0,
                2
            ),
        ]
    );
    // The time of a profile without one is now.
    assert_eq!(converted[0].profile.from, now());
}

/// Encodes one field of a message by hand: `(number, wire type, payload)`.
fn field(number: u32, wire_type: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::encode_varint(u64::from(number << 3 | u32::from(wire_type)), &mut out);
    if wire_type == 2 {
        prost::encoding::encode_varint(payload.len() as u64, &mut out);
    }
    out.extend_from_slice(payload);
    out
}

/// A request of one profile whose samples are given as raw bytes.
fn with_raw_sample(raw_sample: &[u8]) -> Vec<u8> {
    let mut request = ebpf_request();
    request.resource_profiles[0].scope_profiles[0].profiles[0]
        .samples
        .clear();
    let mut profile = request.resource_profiles[0].scope_profiles[0].profiles[0].encode_to_vec();
    profile.extend(field(2, 2, raw_sample));
    let scope = [field(2, 2, &profile)].concat();
    let resource = field(2, 2, &scope);
    [
        field(1, 2, &resource),
        field(2, 2, &request.dictionary.unwrap().encode_to_vec()),
    ]
    .concat()
}

/// What `check` expects of a rejected request: 413 or 400, and words of the message.
fn rejected(body: &[u8], too_large: bool, words: &str) {
    let err = convert_bytes(body).expect_err(words);
    assert_eq!(err.is_too_large(), too_large, "{err}");
    let message = err.to_string();
    assert!(message.contains(words), "{message:?} should say {words:?}");
}

#[test]
fn other_releases_are_rejected_not_misread() {
    // v1.9: values packed at field 2, link_index a varint at field 4.
    let v19 = [field(1, 0, &[1]), field(2, 2, &[5]), field(4, 0, &[1])].concat();
    rejected(
        &with_raw_sample(&v19),
        false,
        "field 4 of Sample is varint, but length-delimited",
    );
    // v1.9 without a link: its values read as attribute indices, and there are no values.
    let v19 = [field(1, 0, &[1]), field(2, 2, &[1])].concat();
    rejected(
        &with_raw_sample(&v19),
        false,
        "neither values nor timestamps",
    );
    // A field v1.10 does not have.
    let unknown = [field(1, 0, &[1]), field(4, 2, &[1]), field(6, 0, &[1])].concat();
    rejected(&with_raw_sample(&unknown), false, "Sample has no field 6");
    // v1.7: several sample types in the single field 1.
    let mut request = ebpf_request();
    let profile = &mut request.resource_profiles[0].scope_profiles[0].profiles[0];
    let mut bytes = profile.encode_to_vec();
    bytes.extend(field(1, 2, &profile.sample_type.unwrap().encode_to_vec()));
    let body = [
        field(1, 2, &field(2, 2, &field(2, 2, &bytes))),
        field(2, 2, &request.dictionary.clone().unwrap().encode_to_vec()),
    ]
    .concat();
    rejected(&body, false, "field 1 of Profile appears more than once");
}

#[test]
fn malformed_requests_say_what_is_wrong() {
    let good = ebpf_request();
    let edit = |f: &dyn Fn(&mut ExportProfilesServiceRequest)| {
        let mut r = good.clone();
        f(&mut r);
        r.encode_to_vec()
    };
    let in_profile = |f: &dyn Fn(&mut Profile)| {
        edit(&|r| f(&mut r.resource_profiles[0].scope_profiles[0].profiles[0]))
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (edit(&|r| r.dictionary = None), "has no dictionary"),
        (
            edit(&|r| r.dictionary.as_mut().unwrap().string_table[0] = "x".into()),
            "string_table[0] must be present",
        ),
        (
            edit(&|r| r.dictionary.as_mut().unwrap().stack_table[0].location_indices = vec![1]),
            "stack_table[0] must be present and the zero value",
        ),
        (
            in_profile(&|p| p.samples[0].stack_index = 99),
            "profiles[0].samples[0].stack_index is 99, outside stack_table of 3 entries",
        ),
        (
            in_profile(&|p| p.samples[0].stack_index = -1),
            "stack_index is -1",
        ),
        (
            edit(&|r| r.dictionary.as_mut().unwrap().stack_table[1].location_indices = vec![40]),
            "stack_table[1].location_indices[0] is 40, outside location_table",
        ),
        (
            edit(&|r| r.dictionary.as_mut().unwrap().location_table[1].lines[0].function_index = 9),
            "location_table[1].lines[0].function_index is 9",
        ),
        (
            edit(&|r| r.dictionary.as_mut().unwrap().function_table[1].name_strindex = 1000),
            "function_table[1].name_strindex is 1000, outside string_table",
        ),
        (
            in_profile(&|p| p.samples[0].attribute_indices = vec![50]),
            "samples[0].attribute_indices[0] is 50, outside attribute_table",
        ),
        (
            in_profile(&|p| p.samples[0].link_index = 8),
            "samples[0].link_index is 8, outside link_table",
        ),
        (
            edit(&|r| r.dictionary.as_mut().unwrap().link_table[1].span_id = vec![1; 4]),
            "link_table[1].span_id has 4 bytes, expected 8",
        ),
        (
            in_profile(&|p| p.profile_id = vec![1; 3]),
            "profile_id has 3 bytes, expected 16",
        ),
        (
            in_profile(&|p| p.samples[0].values = vec![-3]),
            "samples[0] has negative value -3",
        ),
        (
            in_profile(&|p| p.samples[0].values = vec![i64::MAX, i64::MAX, 2]),
            "add up past 2^64",
        ),
        (
            in_profile(&|p| p.samples[1].values = vec![1]),
            "samples[1] has 1 values but 2 timestamps",
        ),
        (
            in_profile(&|p| p.sample_type = None),
            "profiles[0] has no sample_type",
        ),
        (
            in_profile(&|p| p.period_type = None),
            "counts samples (samples/count) but has no period of type cpu",
        ),
        (
            in_profile(&|p| p.period = 2_000_000_000),
            "period of 2000000000 nanoseconds, not between 1 ns and 1 s",
        ),
        (
            edit(&|r| {
                let kv = &mut r.resource_profiles[0].resource.as_mut().unwrap().attributes[0];
                kv.key_strindex = 1;
            }),
            "resource.attributes[0] sets both key and key_strindex",
        ),
        (b"\x0a\x05\x01".to_vec(), "malformed protobuf at byte 2"),
        (vec![0x0a, 0x80], "truncated length"),
    ];
    for (body, words) in cases {
        rejected(&body, false, words);
    }
}

#[test]
fn sizes_are_capped_before_decoding() {
    let body = ebpf_request().encode_to_vec();
    let small = Limits {
        max_bytes: body.len() - 1,
        ..Limits::default()
    };
    let err = decode_protobuf(&body, &small).unwrap_err();
    assert!(matches!(err, OtlpError::TooLarge { .. }), "{err}");
    let few = Limits {
        max_samples: 4,
        ..Limits::default()
    };
    assert!(matches!(
        decode_protobuf(&body, &few),
        Err(OtlpError::TooManySamples { limit: 4 })
    ));
    let narrow = Limits {
        max_entries: 10,
        ..Limits::default()
    };
    assert!(matches!(
        decode_protobuf(&body, &narrow),
        Err(OtlpError::TooManyEntries { limit: 10 })
    ));
    // Empty samples cost 2 bytes each on the wire and far more decoded.
    let profile: Vec<u8> = std::iter::repeat_n([0x12u8, 0x00], 50_000)
        .flatten()
        .collect();
    let body = field(1, 2, &field(2, 2, &field(2, 2, &profile)));
    let limits = Limits {
        max_bytes: body.len(),
        ..Limits::default()
    };
    let err = decode_protobuf(&body, &limits).unwrap_err();
    assert!(matches!(err, OtlpError::TooExpensive { .. }), "{err}");
    assert!(err.is_too_large());
    let json = format!(
        r#"{{"resourceProfiles":[{{"scopeProfiles":[{{"profiles":[{{"samples":[{}]}}]}}]}}]}}"#,
        vec!["{}"; 50_000].join(",")
    );
    let limits = Limits {
        max_bytes: json.len(),
        ..Limits::default()
    };
    let err = decode_json(json.as_bytes(), &limits).unwrap_err();
    assert!(matches!(err, OtlpError::TooExpensive { .. }), "{err}");
    // Nesting deeper than any request needs.
    let mut value = Vec::new();
    for _ in 0..40 {
        value = field(5, 2, &field(1, 2, &value));
    }
    let attribute = field(2, 2, &value);
    let body = field(2, 2, &field(6, 2, &attribute));
    assert!(matches!(
        decode_protobuf(&body, &Limits::default()),
        Err(OtlpError::TooDeep { .. })
    ));
}

#[test]
fn stacks_keep_their_root_most_frames() {
    let mut b = Builder::new();
    let locations: Vec<i32> = (0..10).map(|i| b.location(&[&format!("f{i}")])).collect();
    let stack = b.stack(&locations);
    let sample_type = b.value_type("alloc_objects", "count");
    let request = ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            scope_profiles: vec![ScopeProfiles {
                profiles: vec![Profile {
                    sample_type: Some(sample_type),
                    samples: vec![sample(stack, &[1])],
                    ..Profile::default()
                }],
                ..ScopeProfiles::default()
            }],
            ..ResourceProfiles::default()
        }],
        dictionary: Some(b.d),
    };
    let limits = Limits {
        max_stack_depth: 3,
        ..Limits::default()
    };
    let converted = convert(&request, &limits, now()).unwrap();
    assert_eq!(
        converted[0].profile.series.app(),
        "unknown_service.alloc_objects"
    );
    assert_eq!(
        folded(&converted[0].profile.tree),
        [("f9;f8;f7".to_owned(), 1)]
    );
}
