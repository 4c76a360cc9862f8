//! Properties of the OTLP reader: generated requests convert to exactly the stacks, labels and
//! spans they were built from, in protobuf and in JSON; no input makes it panic.

use std::collections::BTreeMap;
use std::time::UNIX_EPOCH;

use proptest::prelude::*;
use prost::Message;
use smolder_common::otlp::proto::*;
use smolder_common::otlp::{self, Limits};
use smolder_common::{SpanId, Tree};

/// Function names, shared by locations so that stacks share prefixes.
const NAMES: &[&str] = &[
    "main",
    "handle",
    "parse",
    "json.dumps",
    "ünï",
    "a b",
    "x;y",
    "gc",
];
/// Values of the one sample attribute that becomes a label.
const THREADS: &[&str] = &["", "worker-1", "worker-2"];

/// A generated sample: a stack of name indices (leaf first), a thread, a value, a span.
#[derive(Clone, Debug)]
struct Generated {
    stack: Vec<usize>,
    thread: usize,
    value: u32,
    span: Option<u8>,
}

fn samples() -> impl Strategy<Value = Vec<Generated>> {
    let sample = (
        prop::collection::vec(0..NAMES.len(), 0..8),
        0..THREADS.len(),
        0u32..1_000_000,
        prop::option::of(1u8..4),
    )
        .prop_map(|(stack, thread, value, span)| Generated {
            stack,
            thread,
            value,
            span,
        });
    prop::collection::vec(sample, 0..30)
}

fn strindex(strings: &mut Vec<String>, s: &str) -> i32 {
    if let Some(i) = strings.iter().position(|x| x == s) {
        return i as i32;
    }
    strings.push(s.to_owned());
    strings.len() as i32 - 1
}

/// An `alloc_space` profile of `samples` (values are used as they are), one location and one
/// stack per distinct use, so that every table is filled.
fn request(samples: &[Generated]) -> ExportProfilesServiceRequest {
    let mut d = ProfilesDictionary {
        mapping_table: vec![Mapping::default()],
        location_table: vec![Location::default()],
        function_table: vec![Function::default()],
        link_table: vec![Link::default()],
        string_table: vec![String::new()],
        attribute_table: vec![KeyValueAndUnit::default()],
        stack_table: vec![Stack::default()],
    };
    for name in NAMES {
        let name_strindex = strindex(&mut d.string_table, name);
        d.function_table.push(Function {
            name_strindex,
            ..Function::default()
        });
        d.location_table.push(Location {
            lines: vec![Line {
                function_index: d.function_table.len() as i32 - 1,
                line: 0,
                column: 0,
            }],
            ..Location::default()
        });
    }
    let key_strindex = strindex(&mut d.string_table, "thread.name");
    for thread in THREADS {
        d.attribute_table.push(KeyValueAndUnit {
            key_strindex,
            value: Some(AnyValue {
                value: Some(Value::StringValue((*thread).to_owned())),
            }),
            unit_strindex: 0,
        });
    }
    for span in 1u8..4 {
        d.link_table.push(Link {
            trace_id: vec![span; 16],
            span_id: vec![0, 0, 0, 0, 0, 0, 0, span],
        });
    }
    let mut out = Vec::new();
    for s in samples {
        d.stack_table.push(Stack {
            location_indices: s.stack.iter().map(|&n| n as i32 + 1).collect(),
        });
        out.push(Sample {
            stack_index: d.stack_table.len() as i32 - 1,
            attribute_indices: vec![s.thread as i32 + 1],
            link_index: s.span.map_or(0, i32::from),
            values: vec![i64::from(s.value)],
            timestamps_unix_nano: vec![],
        });
    }
    let sample_type = ValueType {
        type_strindex: strindex(&mut d.string_table, "alloc_space"),
        unit_strindex: strindex(&mut d.string_table, "bytes"),
    };
    ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(Value::StringValue("api".into())),
                    }),
                    key_strindex: 0,
                }],
                dropped_attributes_count: 0,
            }),
            scope_profiles: vec![ScopeProfiles {
                profiles: vec![Profile {
                    sample_type: Some(sample_type),
                    samples: out,
                    time_unix_nano: 1,
                    ..Profile::default()
                }],
                ..ScopeProfiles::default()
            }],
            ..ResourceProfiles::default()
        }],
        dictionary: Some(d),
    }
}

fn folded(tree: &Tree) -> Vec<(Vec<String>, u64)> {
    let mut out = Vec::new();
    tree.for_each_stack(|stack, value| {
        out.push((
            stack
                .iter()
                .map(|&f| tree.frames().name(f).to_owned())
                .collect(),
            value,
        ));
    });
    out.sort();
    out
}

/// What the conversion must give: per thread label, the tree of its samples and its spans'.
type Expected = BTreeMap<String, (Tree, BTreeMap<u8, Tree>)>;

fn expected(samples: &[Generated]) -> Expected {
    let mut out: Expected = BTreeMap::new();
    for s in samples.iter().filter(|s| s.value > 0) {
        let names: Vec<&str> = s.stack.iter().rev().map(|&n| NAMES[n]).collect();
        let (tree, spans) = out.entry(THREADS[s.thread].to_owned()).or_default();
        tree.insert_names(&names, u64::from(s.value));
        if let Some(span) = s.span {
            spans
                .entry(span)
                .or_default()
                .insert_names(&names, u64::from(s.value));
        }
    }
    out
}

fn check(converted: &[otlp::Converted], expected: &Expected) -> Result<(), TestCaseError> {
    prop_assert_eq!(converted.len(), expected.len());
    for c in converted {
        prop_assert_eq!(c.profile.series.app(), "api.alloc_space");
        prop_assert_eq!(&c.profile.meta.units, "bytes");
        prop_assert_eq!(
            c.profile.from,
            UNIX_EPOCH + std::time::Duration::from_nanos(1)
        );
        let thread = c.profile.series.labels().get("thread.name").unwrap_or("");
        let (tree, spans) = &expected[thread];
        prop_assert_eq!(folded(&c.profile.tree), folded(tree));
        prop_assert_eq!(c.spans.len(), spans.len());
        for (&span, tree) in spans {
            let id = SpanId::from_bytes([0, 0, 0, 0, 0, 0, 0, span]).expect("nonzero");
            let got = c.spans.get(id).map(folded);
            prop_assert_eq!(got, Some(folded(tree)));
        }
    }
    Ok(())
}

fn small() -> Limits {
    Limits {
        max_bytes: 1 << 20,
        max_samples: 10_000,
        max_entries: 10_000,
        max_stack_depth: 64,
        max_span_nodes: 10_000,
    }
}

proptest! {
    #[test]
    fn generated_requests_convert_exactly(samples in samples()) {
        let request = request(&samples);
        let expected = expected(&samples);
        let limits = Limits::default();
        let body = request.encode_to_vec();
        let decoded = otlp::decode_protobuf(&body, &limits).expect("own encoding decodes");
        prop_assert_eq!(&decoded, &request);
        check(&otlp::convert(&decoded, &limits, UNIX_EPOCH).expect("valid"), &expected)?;

        let json = serde_json::to_vec(&request).expect("serializes");
        let from_json = otlp::decode_json(&json, &limits).expect("own json decodes");
        prop_assert_eq!(&from_json, &request);
        check(&otlp::convert(&from_json, &limits, UNIX_EPOCH).expect("valid"), &expected)?;
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(request) = otlp::decode_protobuf(&bytes, &small()) {
            let _ = otlp::convert(&request, &small(), UNIX_EPOCH);
        }
        if let Ok(request) = otlp::decode_json(&bytes, &small()) {
            let _ = otlp::convert(&request, &small(), UNIX_EPOCH);
        }
    }

    #[test]
    fn mutated_requests_never_panic(
        samples in samples(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        json in any::<bool>(),
    ) {
        let request = request(&samples);
        let mut bytes = if json {
            serde_json::to_vec(&request).expect("serializes")
        } else {
            request.encode_to_vec()
        };
        for (at, byte) in edits {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        let decoded = if json {
            otlp::decode_json(&bytes, &small())
        } else {
            otlp::decode_protobuf(&bytes, &small())
        };
        if let Ok(request) = decoded
            && let Ok(converted) = otlp::convert(&request, &small(), UNIX_EPOCH)
        {
            for c in converted {
                for (_, span) in c.spans.iter() {
                    prop_assert!(span.total() <= c.profile.tree.total());
                }
            }
        }
    }
}
