//! Properties of the `querier.v1` codecs: messages round-trip through binary protobuf and
//! through JSON; JSON written with proto field names and numbers for 64-bit integers reads the
//! same; flame graphs agree with the flamebearer of the same tree.

use proptest::prelude::*;
use prost::Message;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use smolder_common::flamebearer::Flamebearer;
use smolder_common::querier::*;

use crate::util::any_tree;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-z_{}=\"~.:]{1,20}", any::<String>()]
}

fn texts() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(text(), 0..4)
}

fn merge_request() -> impl Strategy<Value = SelectMergeStacktracesRequest> {
    (
        (text(), text(), any::<i64>(), any::<i64>()),
        (prop::option::of(any::<i64>()), -1i32..6, texts(), texts()),
        prop::option::of(prop::collection::vec(text(), 0..3)),
    )
        .prop_map(
            |((id, selector, start, end), (max_nodes, format, spans, traces), call_site)| {
                SelectMergeStacktracesRequest {
                    profile_type_id: id,
                    label_selector: selector,
                    start,
                    end,
                    max_nodes,
                    format,
                    stack_trace_selector: call_site.map(|names| StackTraceSelector {
                        call_site: names.into_iter().map(|name| Location { name }).collect(),
                        go_pgo: None,
                    }),
                    profile_id_selector: vec![],
                    trace_id_selector: traces,
                    span_selector: spans,
                }
            },
        )
}

fn series_request() -> impl Strategy<Value = SelectSeriesRequest> {
    (
        (text(), text(), any::<i64>(), any::<i64>(), texts()),
        (
            -1e12f64..1e12,
            prop::option::of(0i32..3),
            prop::option::of(any::<i64>()),
            0i32..5,
        ),
    )
        .prop_map(
            |((id, selector, start, end, group_by), (step, aggregation, limit, exemplars))| {
                SelectSeriesRequest {
                    profile_type_id: id,
                    label_selector: selector,
                    start,
                    end,
                    group_by,
                    step,
                    aggregation,
                    stack_trace_selector: None,
                    limit,
                    exemplar_type: exemplars,
                }
            },
        )
}

fn series_response() -> impl Strategy<Value = SelectSeriesResponse> {
    let point = (-1e15f64..1e15, any::<i64>()).prop_map(|(value, timestamp)| Point {
        value,
        timestamp,
        annotations: vec![],
        exemplars: vec![],
    });
    let series = (
        prop::collection::vec((text(), text()), 0..3),
        prop::collection::vec(point, 0..5),
    )
        .prop_map(|(labels, points)| Series {
            labels: labels
                .into_iter()
                .map(|(name, value)| LabelPair { name, value })
                .collect(),
            points,
        });
    prop::collection::vec(series, 0..3).prop_map(|series| SelectSeriesResponse { series })
}

/// Both codecs give the message back.
fn round_trips<M>(message: &M) -> Result<(), TestCaseError>
where
    M: Message + Default + PartialEq + std::fmt::Debug + Serialize + DeserializeOwned,
{
    let binary = message.encode_to_vec();
    prop_assert_eq!(&M::decode(&binary[..]).expect("own encoding"), message);
    let json = serde_json::to_string(message).expect("serializes");
    let back: M = serde_json::from_str(&json).expect("own json");
    prop_assert_eq!(&back, message);
    // Proto names and plain numbers read the same.
    let mut value: Value = serde_json::from_str(&json).expect("json");
    to_proto_spelling(&mut value);
    let back: M = serde_json::from_value(value).expect("proto spelling");
    prop_assert_eq!(&back, message);
    Ok(())
}

/// Renames every key to its `.proto` spelling and writes 64-bit integers as numbers.
fn to_proto_spelling(value: &mut Value) {
    /// The 64-bit integer fields of the messages tested here.
    const INT64: &[&str] = &[
        "start",
        "end",
        "max_nodes",
        "limit",
        "timestamp",
        "total",
        "max_self",
        "leftTicks",
        "rightTicks",
        "values",
    ];
    fn number(value: &mut Value) {
        match value {
            Value::String(s) => {
                if let Ok(n) = s.parse::<i64>() {
                    *value = Value::from(n);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(number),
            _ => {}
        }
    }
    match value {
        Value::Object(map) => {
            let old = std::mem::take(map);
            for (key, mut v) in old {
                to_proto_spelling(&mut v);
                let key = match key.as_str() {
                    "profileTypeID" => "profile_typeID".to_owned(),
                    "leftTicks" | "rightTicks" | "ID" | "modifiedAt" => key,
                    _ => key
                        .chars()
                        .flat_map(|c| {
                            if c.is_ascii_uppercase() {
                                vec!['_', c.to_ascii_lowercase()]
                            } else {
                                vec![c]
                            }
                        })
                        .collect(),
                };
                if INT64.contains(&key.as_str()) {
                    number(&mut v);
                }
                map.insert(key, v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(to_proto_spelling),
        _ => {}
    }
}

proptest! {
    #[test]
    fn merge_requests_round_trip(request in merge_request()) {
        round_trips(&request)?;
        round_trips(&DiffRequest { left: Some(request.clone()), right: None })?;
    }

    #[test]
    fn series_messages_round_trip(request in series_request(), response in series_response()) {
        round_trips(&request)?;
        round_trips(&response)?;
    }

    #[test]
    fn label_messages_round_trip(
        name in text(), matchers in texts(), start in any::<i64>(), end in any::<i64>(),
    ) {
        round_trips(&LabelValuesRequest { name, matchers: matchers.clone(), start, end })?;
        round_trips(&LabelNamesRequest { matchers: matchers.clone(), start, end })?;
        round_trips(&SeriesRequest { matchers, label_names: vec![], start, end })?;
        round_trips(&ProfileTypesRequest { start, end })?;
    }

    #[test]
    fn flame_graphs_round_trip_and_match_flamebearer(tree in any_tree(), max_nodes in 0usize..64) {
        let fg = FlameGraph::from_tree(&tree, max_nodes);
        let fb = Flamebearer::from_tree(&tree, max_nodes);
        prop_assert_eq!(&fg.names, &fb.names);
        prop_assert_eq!(fg.total as u64, fb.num_ticks.min(i64::MAX as u64));
        round_trips(&SelectMergeStacktracesResponse {
            flamegraph: Some(fg),
            ..SelectMergeStacktracesResponse::default()
        })?;
    }

    #[test]
    fn arbitrary_json_never_panics(json in any::<String>()) {
        let _ = serde_json::from_str::<SelectMergeStacktracesRequest>(&json);
        let _ = serde_json::from_str::<SelectSeriesRequest>(&json);
        let _ = serde_json::from_str::<DiffRequest>(&json);
    }
}

#[test]
fn grafana_json_reads_as_sent() {
    // As the Profiles Drilldown app writes a SelectSeries call.
    let request: SelectSeriesRequest = serde_json::from_str(
        r#"{"profileTypeID":"process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "labelSelector":"{service_name=\"ride-sharing-app\"}",
            "start":1700000000000,"end":"1700003600000","groupBy":["region"],"step":15,
            "aggregation":"TIME_SERIES_AGGREGATION_TYPE_AVERAGE","limit":"10"}"#,
    )
    .expect("valid");
    assert_eq!(request.start, 1_700_000_000_000);
    assert_eq!(request.end, 1_700_003_600_000);
    assert_eq!(request.aggregation, Some(1));
    assert_eq!(request.limit, Some(10));
    assert_eq!(request.step, 15.0);
    let out = serde_json::to_string(&SelectSeriesResponse {
        series: vec![Series {
            labels: vec![LabelPair {
                name: "region".into(),
                value: "eu".into(),
            }],
            points: vec![Point {
                value: 4e8,
                timestamp: 1_700_000_000_000,
                annotations: vec![],
                exemplars: vec![],
            }],
        }],
    })
    .expect("serializes");
    assert_eq!(
        out,
        r#"{"series":[{"labels":[{"name":"region","value":"eu"}],"points":[{"value":400000000.0,"timestamp":"1700000000000","annotations":[],"exemplars":[]}]}]}"#
    );
    let types = serde_json::to_string(&ProfileTypesResponse {
        profile_types: vec![ProfileType {
            id: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
            name: "process_cpu".into(),
            sample_type: "cpu".into(),
            sample_unit: "nanoseconds".into(),
            period_type: "cpu".into(),
            period_unit: "nanoseconds".into(),
        }],
    })
    .expect("serializes");
    assert!(
        types.contains(r#""ID":"process_cpu:cpu:nanoseconds:cpu:nanoseconds""#),
        "{types}"
    );
    assert!(types.contains(r#""sampleType":"cpu""#), "{types}");
}

/// `SelectMergeProfile` in JSON: a line's zero column is left out, as Pyroscope's
/// `google.v1.Line` has no column and strict protojson clients reject fields they lack.
#[test]
fn pprof_json_leaves_out_a_zero_column() {
    use smolder_common::pprof::Profile;
    let line = |profile: &Profile| {
        serde_json::to_value(profile).expect("serializes")["location"][0]["line"].clone()
    };
    let plain: Profile = serde_json::from_str(
        r#"{"location": [{"id": "1", "line": [{"functionId": "1", "line": "12"}]}]}"#,
    )
    .expect("reads");
    assert_eq!(
        line(&plain),
        serde_json::json!([{"functionId": "1", "line": "12"}])
    );
    let with_column: Profile = serde_json::from_str(
        r#"{"location": [{"id": "1", "line": [{"functionId": "1", "line": "12", "column": "7"}]}]}"#,
    )
    .expect("reads");
    assert_eq!(
        line(&with_column),
        serde_json::json!([{"functionId": "1", "line": "12", "column": "7"}])
    );
}
