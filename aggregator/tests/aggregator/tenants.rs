//! Tenants over real HTTP and real QUIC: two tenants push the same app name through `/ingest`,
//! the Connect push, OTLP over HTTP and gRPC, and QUIC (each agent's tenant from its token), and
//! each sees only its own data through `/render`, `/render-diff`, `/pyroscope/render(-diff)`,
//! `/labels`, `/label-values`, `/api/apps`, every `querier.v1` call Grafana makes,
//! `/exported-metrics` and the rules API; `anonymous` sees neither. Without multitenancy the
//! header is ignored.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::Message;
use reqwest::StatusCode;
use serde_json::Value;
use smolder_aggregator::config::Config;
use smolder_common::otlp::proto as otlp;
use smolder_common::pprof::{self, EncodeOptions};
use smolder_common::querier::*;
use smolder_common::rules::RuleSpec;
use smolder_common::wire::frame;
use smolder_common::wire::{BatchMessage, FrameKind, Hello};
use smolder_test_support::net::LOOPBACK_ANY_PORT;

use crate::hostile::grpc_frame;
use crate::quic::{ack, connect, exchange, kind};
use crate::transport::profile;
use crate::util::{Aggregator, tree, wire};

const HEADER: &str = "X-Scope-OrgID";
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// `path` of `agg` as `tenant` (no header for `None`).
fn get(agg: &Aggregator, tenant: Option<&str>, path: &str) -> reqwest::RequestBuilder {
    let request = agg.http.get(agg.url(path));
    match tenant {
        Some(tenant) => request.header(HEADER, tenant),
        None => request,
    }
}

fn post(agg: &Aggregator, tenant: Option<&str>, path: &str) -> reqwest::RequestBuilder {
    let request = agg.http.post(agg.url(path));
    match tenant {
        Some(tenant) => request.header(HEADER, tenant),
        None => request,
    }
}

/// `/ingest` of `count` samples of `main;<frame>` at 100 Hz into `shop.cpu{team,via=ingest}`.
async fn ingest(agg: &Aggregator, tenant: Option<&str>, team: &str, frame: &str, count: u64) {
    let (from, until) = ((now_unix() - 60).to_string(), (now_unix() - 50).to_string());
    let name = format!("shop.cpu{{team={team},via=ingest}}");
    let response = post(agg, tenant, "/ingest")
        .query(&[
            ("name", name.as_str()),
            ("from", &from),
            ("until", &until),
            ("sampleRate", "100"),
        ])
        .body(format!("main;{frame} {count}\n"))
        .send()
        .await
        .expect("ingest");
    assert_eq!(response.status(), StatusCode::OK, "ingest as {tenant:?}");
}

/// The span both tenants' pushes ran in: one span id, two tenants' span profiles.
const SPAN: &str = "00f067aa0ba902b7";

/// The Connect push of one pprof CPU profile of `main;<frame>` for service `shop`, in span
/// [`SPAN`].
async fn push(agg: &Aggregator, tenant: &str, team: &str, frame: &str) {
    let profile = pprof::encode(
        &tree(&[(&format!("main;{frame}"), 4)]),
        &EncodeOptions::cpu_samples(100),
    )
    .to_bytes(false);
    let labels = [
        ("__name__", "process_cpu"),
        ("service_name", "shop"),
        ("team", team),
        ("via", "push"),
        ("span_id", SPAN),
    ];
    let request = wire::push_request(&labels, profile);
    let response = post(agg, Some(tenant), "/push.v1.PusherService/Push")
        .header("content-type", "application/proto")
        .header("connect-protocol-version", "1")
        .body(request.encode_to_vec())
        .send()
        .await
        .expect("push");
    let status = response.status();
    assert_eq!(status, StatusCode::OK, "{}", response.text().await.unwrap());
}

/// An OTLP request of 5 CPU samples of `main;<frame>` for service `shop`, as protobuf.
fn otlp_request(team: &str, frame: &str) -> Vec<u8> {
    let strings = [
        "",
        "main",
        frame,
        "samples",
        "count",
        "cpu",
        "nanoseconds",
        "m.go",
    ];
    let function = |name| otlp::Function {
        name_strindex: name,
        system_name_strindex: 0,
        filename_strindex: 7,
        start_line: 1,
    };
    let location = |function_index| otlp::Location {
        mapping_index: 0,
        address: 0,
        lines: vec![otlp::Line {
            function_index,
            line: 1,
            column: 0,
        }],
        attribute_indices: vec![],
    };
    let dictionary = otlp::ProfilesDictionary {
        mapping_table: vec![otlp::Mapping::default()],
        location_table: vec![otlp::Location::default(), location(1), location(2)],
        function_table: vec![otlp::Function::default(), function(1), function(2)],
        link_table: vec![otlp::Link::default()],
        string_table: strings.iter().map(|s| (*s).to_owned()).collect(),
        attribute_table: vec![otlp::KeyValueAndUnit::default()],
        stack_table: vec![
            otlp::Stack::default(),
            otlp::Stack {
                location_indices: vec![2, 1],
            },
        ],
    };
    let attribute = |key: &str, value: &str| otlp::KeyValue {
        key: key.to_owned(),
        value: Some(otlp::AnyValue {
            value: Some(otlp::Value::StringValue(value.to_owned())),
        }),
        key_strindex: 0,
    };
    let profile = otlp::Profile {
        sample_type: Some(otlp::ValueType {
            type_strindex: 3,
            unit_strindex: 4,
        }),
        samples: vec![otlp::Sample {
            stack_index: 1,
            values: vec![5],
            ..otlp::Sample::default()
        }],
        time_unix_nano: (now_unix() - 60) * 1_000_000_000,
        duration_nano: 10_000_000_000,
        period_type: Some(otlp::ValueType {
            type_strindex: 5,
            unit_strindex: 6,
        }),
        period: 10_000_000,
        ..otlp::Profile::default()
    };
    otlp::ExportProfilesServiceRequest {
        resource_profiles: vec![otlp::ResourceProfiles {
            resource: Some(otlp::Resource {
                attributes: vec![
                    attribute("service.name", "shop"),
                    attribute("team", team),
                    attribute("via", "otlp"),
                ],
                dropped_attributes_count: 0,
            }),
            scope_profiles: vec![otlp::ScopeProfiles {
                scope: None,
                profiles: vec![profile],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(dictionary),
    }
    .encode_to_vec()
}

async fn otlp_push(agg: &Aggregator, tenant: Option<&str>, team: &str, frame: &str) -> StatusCode {
    post(agg, tenant, "/v1development/profiles")
        .header("content-type", "application/x-protobuf")
        .body(otlp_request(team, frame))
        .send()
        .await
        .expect("otlp")
        .status()
}

/// The same OTLP request over gRPC (`ProfilesService/Export` on the HTTP port) as `tenant`:
/// the HTTP status, and `grpc-status` when the answer is an error (trailers-only).
async fn otlp_grpc(
    agg: &Aggregator,
    tenant: &str,
    team: &str,
    frame: &str,
) -> (StatusCode, Option<String>) {
    let response = post(
        agg,
        Some(tenant),
        "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
    )
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(grpc_frame(0, &otlp_request(team, frame)))
    .send()
    .await
    .expect("otlp over grpc");
    let grpc_status = response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned());
    (response.status(), grpc_status)
}

/// One agent batch over real QUIC with `token`, from agent `agent-1`, sequence 1: both
/// tenants' agents send the same id and sequence, which must not be taken for a retry.
async fn ship(agg: &Aggregator, token: &str, team: &str, frame: &str) {
    let ca = agg.dir().join("tls/ca.pem");
    let conn = connect(agg.quic_addr(), &ca, None)
        .await
        .expect("QUIC connects");
    let hello = frame::encode(
        FrameKind::Hello,
        &Hello {
            agent_id: "agent-1".to_owned(),
            hostname: "host".to_owned(),
            agent_version: "0".to_owned(),
            token: token.to_owned(),
        },
    );
    assert_eq!(kind(&exchange(&conn, &hello).await), FrameKind::Welcome);
    let end = SystemTime::now() - Duration::from_secs(50);
    let batch = BatchMessage::from_profiles(
        "agent-1",
        1,
        end - Duration::from_secs(10),
        end,
        &[profile(
            &format!("shop.cpu{{team={team},via=quic}}"),
            &format!("main;{frame}"),
            3,
            end,
        )],
    );
    let answer = ack(&exchange(&conn, &frame::encode(FrameKind::Batch, &batch)).await);
    assert!(!answer.duplicate, "{team}'s batch taken for a retry");
    conn.close(0u32.into(), b"done");
}

/// `/render` of `query` as `tenant`, its frame names sorted.
async fn frames(agg: &Aggregator, tenant: Option<&str>, query: &str) -> Vec<String> {
    let from = (now_unix() - 3600).to_string();
    let until = (now_unix() + 60).to_string();
    let response = get(agg, tenant, "/render")
        .query(&[("query", query), ("from", &from), ("until", &until)])
        .send()
        .await
        .expect("render");
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.expect("json");
    let mut names: Vec<String> = body["flamebearer"]["names"]
        .as_array()
        .expect("names")
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .filter(|n| n != "total" && n != "main")
        .collect();
    names.sort();
    names
}

/// A `querier.v1` call in binary protobuf as `tenant`.
async fn call<Req: Message, Resp: Message + Default>(
    agg: &Aggregator,
    tenant: &str,
    method: &str,
    request: &Req,
) -> Resp {
    let response = post(
        agg,
        Some(tenant),
        &format!("/querier.v1.QuerierService/{method}"),
    )
    .header("content-type", "application/proto")
    .header("connect-protocol-version", "1")
    .body(request.encode_to_vec())
    .send()
    .await
    .expect("connect");
    assert_eq!(response.status(), StatusCode::OK, "{method} as {tenant}");
    Resp::decode(response.bytes().await.expect("body")).expect("decodes")
}

/// Asserts that `text` names `team`'s frames (`<team>_quic`, …) and none of the other team's.
fn own_frames_only(text: &str, team: &str, what: &str) {
    let other = if team == "a" { "b" } else { "a" };
    assert!(
        text.contains(&format!("{team}_quic")),
        "{what} as team-{team}: {text}"
    );
    for via in ["ingest", "push", "otlp", "grpc", "quic"] {
        let foreign = format!("{other}_{via}");
        assert!(
            !text.contains(&foreign),
            "{what} as team-{team} shows {foreign}: {text}"
        );
    }
}

async fn text(request: reqwest::RequestBuilder) -> (StatusCode, String) {
    let response = request.send().await.expect("request");
    (response.status(), response.text().await.expect("text"))
}

/// The config of both tests: a provisioned rule over the `/ingest` data, and agent tokens.
fn config(multitenancy: bool) -> Config {
    let mut config = Config::default();
    config.tenant.multitenancy_enabled = multitenancy;
    config.metrics_export_rules.insert(
        "shop_ingest_seconds_total".to_owned(),
        RuleSpec {
            expr: "shop.cpu{via=\"ingest\"}".to_owned(),
            ..RuleSpec::default()
        },
    );
    config.ingest.quic.tokens = vec!["anonymous-token".to_owned()];
    if multitenancy {
        config.ingest.quic.tenant_tokens = [
            ("team-a".to_owned(), vec!["token-a".to_owned()]),
            ("team-b".to_owned(), vec!["token-b".to_owned()]),
        ]
        .into();
    }
    config
}

#[tokio::test]
async fn two_tenants_see_only_their_own_data_through_every_api() {
    let agg = Aggregator::with_config(config(true)).await;

    // Refusals: no header is 401 naming it, a bad id 400 with the rule; nothing is stored.
    let from_now = |path: &str| get(&agg, None, path);
    let (status, message) = text(from_now("/render?query=shop.cpu")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{message}");
    assert!(message.contains(HEADER), "{message}");
    let (status, message) = text(get(&agg, Some("a/b"), "/api/tenant")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{message}");
    assert!(message.contains("holds '/'"), "{message}");
    for path in ["/exported-metrics", "/api/recording-rules", "/api/apps"] {
        let status = from_now(path).send().await.unwrap().status();
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
    }
    assert_eq!(
        otlp_push(&agg, None, "x", "x_otlp").await,
        StatusCode::UNAUTHORIZED
    );
    let connect = post(&agg, None, "/querier.v1.QuerierService/ProfileTypes")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(connect.status(), StatusCode::UNAUTHORIZED);
    let error: Value = connect.json().await.unwrap();
    assert_eq!(error["code"], "unauthenticated");
    let deleted = agg
        .http
        .delete(agg.url("/api/apps"))
        .body(r#"{"name":"shop.cpu"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::UNAUTHORIZED);

    // Each tenant's own API rule, before the data arrives.
    for (tenant, team) in [("team-a", "a"), ("team-b", "b")] {
        let rule = serde_json::json!({
            "name": format!("{team}_only_total"),
            "expr": "shop.cpu",
        });
        let response = post(&agg, Some(tenant), "/api/recording-rules")
            .json(&rule)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
    }

    // The same app name, four transports, two tenants; team-b also an alloc profile.
    for (tenant, team, count) in [("team-a", "a", 10), ("team-b", "b", 30)] {
        ingest(&agg, Some(tenant), team, &format!("{team}_ingest"), count).await;
        push(&agg, tenant, team, &format!("{team}_push")).await;
        assert_eq!(
            otlp_push(&agg, Some(tenant), team, &format!("{team}_otlp")).await,
            StatusCode::OK
        );
        assert_eq!(
            otlp_grpc(&agg, tenant, team, &format!("{team}_grpc")).await,
            (StatusCode::OK, None),
            "OTLP over gRPC as {tenant}"
        );
        ship(
            &agg,
            &format!("token-{team}"),
            team,
            &format!("{team}_quic"),
        )
        .await;
    }
    let from = (now_unix() - 60).to_string();
    let until = (now_unix() - 50).to_string();
    let alloc = post(&agg, Some("team-b"), "/ingest")
        .query(&[
            ("name", "shop.alloc_objects{team=b}"),
            ("from", from.as_str()),
            ("until", until.as_str()),
            ("units", "objects"),
        ])
        .body("main;b_alloc 7\n")
        .send()
        .await
        .unwrap();
    assert_eq!(alloc.status(), StatusCode::OK);

    // /render.
    for team in ["a", "b"] {
        let tenant = format!("team-{team}");
        let want: Vec<String> = ["grpc", "ingest", "otlp", "push", "quic"]
            .iter()
            .map(|via| format!("{team}_{via}"))
            .collect();
        assert_eq!(
            frames(&agg, Some(&tenant), "shop.cpu").await,
            want,
            "{tenant}"
        );
    }
    assert!(frames(&agg, Some("anonymous"), "shop.cpu").await.is_empty());

    // querier.v1.
    let (start, end) = (
        (now_unix() as i64 - 3600) * 1000,
        (now_unix() as i64 + 60) * 1000,
    );
    for team in ["a", "b"] {
        let tenant = format!("team-{team}");
        let merged: SelectMergeStacktracesResponse = call(
            &agg,
            &tenant,
            "SelectMergeStacktraces",
            &SelectMergeStacktracesRequest {
                profile_type_id: CPU.to_owned(),
                label_selector: "{service_name=\"shop\"}".to_owned(),
                start,
                end,
                ..Default::default()
            },
        )
        .await;
        let names = merged.flamegraph.expect("a flame graph").names;
        assert!(names.contains(&format!("{team}_quic")), "{names:?}");
        let other = if team == "a" { "b_" } else { "a_" };
        assert!(!names.iter().any(|n| n.starts_with(other)), "{names:?}");

        // The same span id in both tenants: each sees its own span's samples only.
        let span: SelectMergeSpanProfileResponse = call(
            &agg,
            &tenant,
            "SelectMergeSpanProfile",
            &SelectMergeSpanProfileRequest {
                profile_type_id: CPU.to_owned(),
                label_selector: "{service_name=\"shop\"}".to_owned(),
                span_selector: vec![SPAN.to_owned()],
                start,
                end,
                ..Default::default()
            },
        )
        .await;
        let names = span.flamegraph.expect("a flame graph").names;
        assert_eq!(
            names,
            ["total", "main", &format!("{team}_push")],
            "{tenant}"
        );

        let values: LabelValuesResponse = call(
            &agg,
            &tenant,
            "LabelValues",
            &LabelValuesRequest {
                name: "team".to_owned(),
                matchers: vec![],
                start,
                end,
            },
        )
        .await;
        assert_eq!(values.names, [team], "{tenant}");

        let series: SeriesResponse = call(
            &agg,
            &tenant,
            "Series",
            &SeriesRequest {
                matchers: vec!["{service_name=\"shop\"}".to_owned()],
                label_names: vec![],
                start,
                end,
            },
        )
        .await;
        assert!(!series.labels_set.is_empty(), "{tenant}");
        for set in &series.labels_set {
            let team_label = set.labels.iter().find(|l| l.name == "team");
            assert_eq!(team_label.map(|l| l.value.as_str()), Some(team), "{set:?}");
        }

        let types: ProfileTypesResponse = call(
            &agg,
            &tenant,
            "ProfileTypes",
            &ProfileTypesRequest { start, end },
        )
        .await;
        let mut ids: Vec<String> = types.profile_types.into_iter().map(|t| t.id).collect();
        ids.sort();
        let mut want = vec![CPU.to_owned()];
        if team == "b" {
            want.insert(0, "memory:alloc_objects:count:space:bytes".to_owned());
        }
        assert_eq!(ids, want, "{tenant}");
    }
    // The rest of Grafana's calls and of the HTTP read API: each tenant's answers hold its own
    // frames and labels and none of the other's.
    for team in ["a", "b"] {
        let tenant = format!("team-{team}");
        let other = if team == "a" { "b" } else { "a" };
        let shop = "{service_name=\"shop\"}".to_owned();
        let series: SelectSeriesResponse = call(
            &agg,
            &tenant,
            "SelectSeries",
            &SelectSeriesRequest {
                profile_type_id: CPU.to_owned(),
                label_selector: shop.clone(),
                start,
                end,
                group_by: vec!["team".to_owned()],
                step: 10.0,
                ..Default::default()
            },
        )
        .await;
        let teams: Vec<&str> = series
            .series
            .iter()
            .flat_map(|s| s.labels.iter())
            .filter(|l| l.name == "team")
            .map(|l| l.value.as_str())
            .collect();
        assert_eq!(teams, [team], "SelectSeries as {tenant}");

        let merged: pprof::Profile = call(
            &agg,
            &tenant,
            "SelectMergeProfile",
            &SelectMergeProfileRequest {
                profile_type_id: CPU.to_owned(),
                label_selector: shop.clone(),
                start,
                end,
                ..Default::default()
            },
        )
        .await;
        let strings: Vec<String> = merged
            .string_table
            .iter()
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        own_frames_only(&strings.join(" "), team, "SelectMergeProfile");

        let side = |selector: &str| SelectMergeStacktracesRequest {
            profile_type_id: CPU.to_owned(),
            label_selector: selector.to_owned(),
            start,
            end,
            ..Default::default()
        };
        let diff: DiffResponse = call(
            &agg,
            &tenant,
            "Diff",
            &DiffRequest {
                left: Some(side(&format!("{{service_name=\"shop\", team=\"{team}\"}}"))),
                right: Some(side(&format!(
                    "{{service_name=\"shop\", team=\"{other}\"}}"
                ))),
            },
        )
        .await;
        let diff = diff.flamegraph.expect("a diff");
        own_frames_only(&diff.names.join(" "), team, "Diff");
        assert_eq!(diff.right_ticks, 0, "the other tenant's team as {tenant}");

        let stats: GetProfileStatsResponse =
            call(&agg, &tenant, "GetProfileStats", &GetProfileStatsRequest {}).await;
        assert!(stats.data_ingested, "{tenant}");

        let (from, until) = (
            (now_unix() - 3600).to_string(),
            (now_unix() + 60).to_string(),
        );
        let range = [("from", from.as_str()), ("until", until.as_str())];
        let v1 = format!("{CPU}{shop}");
        let (status, body) = text(
            get(&agg, Some(&tenant), "/pyroscope/render")
                .query(&[("query", v1.as_str())])
                .query(&range),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        own_frames_only(&body, team, "/pyroscope/render");
        for (path, query) in [
            ("/render-diff", "shop.cpu"),
            ("/pyroscope/render-diff", &v1),
        ] {
            let (status, body) = text(get(&agg, Some(&tenant), path).query(&[
                ("leftQuery", query),
                ("leftFrom", &from),
                ("leftUntil", &until),
                ("rightQuery", query),
                ("rightFrom", &from),
                ("rightUntil", &until),
            ]))
            .await;
            assert_eq!(status, StatusCode::OK, "{path}: {body}");
            own_frames_only(&body, team, path);
        }
        let (status, body) = text(
            get(&agg, Some(&tenant), "/label-values")
                .query(&[("label", "team")])
                .query(&range),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            serde_json::from_str::<Value>(&body).expect("json"),
            serde_json::json!([team]),
            "/label-values as {tenant}"
        );
        let (status, body) = text(get(&agg, Some(&tenant), "/labels").query(&range)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body.contains("\"team\""), "/labels as {tenant}: {body}");
        let (status, body) = text(get(&agg, Some(&tenant), "/api/apps")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let apps = serde_json::from_str::<Value>(&body).expect("json");
        let alloc = apps.to_string().contains("shop.alloc_objects");
        assert_eq!(alloc, team == "b", "/api/apps as {tenant}: {body}");
    }
    let nothing: LabelValuesResponse = call(
        &agg,
        "anonymous",
        "LabelValues",
        &LabelValuesRequest {
            name: "service_name".to_owned(),
            matchers: vec![],
            start,
            end,
        },
    )
    .await;
    assert!(nothing.names.is_empty(), "{:?}", nothing.names);

    // Rules and /exported-metrics: the provisioned rule counts each tenant's data apart, each
    // API rule is its tenant's alone, every series is labelled with its tenant.
    for (team, seconds) in [("a", "0.1"), ("b", "0.3")] {
        let tenant = format!("team-{team}");
        let (status, text) = text(get(&agg, Some(&tenant), "/exported-metrics")).await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            text.contains(&format!(
                "\nshop_ingest_seconds_total{{tenant=\"{tenant}\"}} {seconds}\n"
            )),
            "{text}"
        );
        let other = if team == "a" { "b" } else { "a" };
        assert!(
            text.contains(&format!("\n{team}_only_total{{tenant=\"{tenant}\"}} ")),
            "{text}"
        );
        assert!(!text.contains(&format!("{other}_only_total")), "{text}");
        assert!(!text.contains(&format!("team-{other}")), "{text}");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.contains(&format!("{{tenant=\"{tenant}\"}}")), "{line}");
        }
        let rules: Value = get(&agg, Some(&tenant), "/api/recording-rules")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let names: Vec<&str> = rules["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        let own = format!("{team}_only_total");
        assert_eq!(
            names,
            [own.as_str(), "shop_ingest_seconds_total"],
            "{tenant}"
        );
        // Another tenant's rule is not there to change.
        let foreign = agg
            .http
            .delete(agg.url(&format!("/api/recording-rules/{other}_only_total")))
            .header(HEADER, &tenant)
            .send()
            .await
            .unwrap();
        assert_eq!(foreign.status(), StatusCode::NOT_FOUND);
    }
    let (_, anonymous) = text(get(&agg, Some("anonymous"), "/exported-metrics")).await;
    assert!(
        anonymous.contains("\nshop_ingest_seconds_total{tenant=\"anonymous\"} 0\n"),
        "{anonymous}"
    );

    // App deletion stays within the tenant.
    let deleted = agg
        .http
        .delete(agg.url("/api/apps"))
        .header(HEADER, "team-a")
        .body(r#"{"name":"shop.cpu"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::OK);
    assert!(frames(&agg, Some("team-a"), "shop.cpu").await.is_empty());
    assert_eq!(frames(&agg, Some("team-b"), "shop.cpu").await.len(), 5);

    let (_, who) = text(get(&agg, Some("team-b"), "/api/tenant")).await;
    assert_eq!(who, r#"{"tenant":"team-b"}"#);
    agg.stop().await;
}

#[tokio::test]
async fn without_multitenancy_the_header_is_ignored() {
    let agg = Aggregator::with_config(config(false)).await;
    ingest(&agg, Some("team-a"), "a", "a_ingest", 10).await;
    ingest(&agg, None, "b", "b_ingest", 30).await;
    assert_eq!(
        otlp_push(&agg, Some("a/b"), "a", "a_otlp").await,
        StatusCode::OK
    );
    ship(&agg, "anonymous-token", "a", "a_quic").await;
    let want = ["a_ingest", "a_otlp", "a_quic", "b_ingest"];
    for tenant in [None, Some("team-b"), Some("a/b")] {
        assert_eq!(frames(&agg, tenant, "shop.cpu").await, want, "{tenant:?}");
    }
    let (status, who) = text(get(&agg, Some("team-b"), "/api/tenant")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(who, r#"{"tenant":"anonymous"}"#);
    // No tenant label without multitenancy: the series are as before tenants.
    let (_, text) = text(get(&agg, Some("team-a"), "/exported-metrics")).await;
    assert!(text.contains("\nshop_ingest_seconds_total 0.4\n"), "{text}");
    agg.stop().await;

    // Tokens naming a tenant without multitenancy are refused, not silently merged.
    let mut refused = config(false);
    refused.ingest.quic.tenant_tokens = [("team-a".to_owned(), vec!["t".to_owned()])].into();
    refused.http.listen = LOOPBACK_ANY_PORT;
    refused.ingest.quic.listen = LOOPBACK_ANY_PORT;
    let dir = tempfile::tempdir().unwrap();
    let err = smolder_aggregator::app::start(refused, dir.path())
        .await
        .err()
        .expect("refused");
    assert!(
        format!("{err:#}").contains("tenant.multitenancy-enabled is false"),
        "{err:#}"
    );
}
