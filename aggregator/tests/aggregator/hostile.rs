//! The hostile-input suite of issue 20: over a hundred distinct malformed or hostile requests
//! against one aggregator with credentials configured: `/ingest` in every format, Connect push,
//! OTLP over HTTP and gRPC, the QUIC protocol, the query API, the rules API, authentication and
//! admission, and the config files. Each is refused with a 4xx (a non-zero `grpc-status`, a
//! reject, or a config error) saying why; after each the next good request is served; and at
//! the end nothing of them is stored.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::Message;
use reqwest::{Method, StatusCode};
use smolder_aggregator::config::Config;
use smolder_common::pprof::{self, EncodeOptions};
use smolder_common::wire::frame::{self, HEADER_LEN};
use smolder_common::wire::{BatchMessage, FrameKind};
use smolder_daemon::DaemonConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::quic::{ack, connect, exchange, framed, hello, kind, reject};
use crate::transport::profile;
use crate::util::{Aggregator, gzip, tree, wire};

const ADMIN: &str = "hostile-admin-token-0123456789";
const READER: &str = "hostile-reader-token-0123456789";

/// One hostile HTTP request and how it must be refused.
struct Case {
    what: &'static str,
    method: Method,
    path: String,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    /// The HTTP status; for gRPC, 200 and [`Case::grpc`].
    status: StatusCode,
    /// A non-zero `grpc-status` expected instead of an HTTP error.
    grpc: Option<&'static str>,
    /// What the answer must say.
    says: &'static str,
    /// Whether to send the admin token (false: the case is about credentials).
    authenticated: bool,
}

fn case(
    what: &'static str,
    method: Method,
    path: impl Into<String>,
    status: u16,
    says: &'static str,
) -> Case {
    Case {
        what,
        method,
        path: path.into(),
        headers: Vec::new(),
        body: Vec::new(),
        status: StatusCode::from_u16(status).unwrap(),
        grpc: None,
        says,
        authenticated: true,
    }
}

impl Case {
    fn body(mut self, body: impl Into<Vec<u8>>) -> Case {
        self.body = body.into();
        self
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Case {
        self.headers.push((name, value.into()));
        self
    }

    fn grpc(mut self, code: &'static str) -> Case {
        self.grpc = Some(code);
        self.status = StatusCode::OK;
        self.headers
            .push(("content-type", "application/grpc".to_owned()));
        self
    }

    fn anonymous(mut self) -> Case {
        self.authenticated = false;
        self
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `/ingest?name=<name>&...` with `from`/`until` of the last 10 s.
fn ingest(query: &str) -> String {
    let t = now();
    format!("/ingest?from={}&until={t}&{query}", t - 10)
}

fn pprof_bytes(gzipped: bool) -> Vec<u8> {
    pprof::encode(&tree(&[("main;work", 5)]), &EncodeOptions::cpu_samples(100)).to_bytes(gzipped)
}

fn multipart(fields: &[(&str, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "hostile0123456789boundary";
    let mut body = Vec::new();
    for (name, data) in fields {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// `message` in gRPC's length-prefixed framing, with compression flag `flag`.
pub(crate) fn grpc_frame(flag: u8, message: &[u8]) -> Vec<u8> {
    let mut framed = vec![flag];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    framed
}

/// Every hostile HTTP case; `limits` of the aggregator's config: (max body, max decompressed).
fn http_cases(max_body: usize, max_decompressed: usize) -> Vec<Case> {
    use Method as M;
    let bomb = gzip(&vec![0u8; max_decompressed * 2]);
    let pprof = pprof_bytes(false);
    let (form_type, no_profile) = multipart(&[("other", b"x")]);
    let (_, garbage_profile) = multipart(&[("profile", b"not a pprof")]);
    let (_, bad_config) = multipart(&[("profile", &pprof), ("sample_type_config", b"{not json")]);
    let (_, no_jfr) = multipart(&[("labels", b"x")]);
    let push_proto =
        |labels: &[(&str, &str)], raw: Vec<u8>| wire::push_request(labels, raw).encode_to_vec();
    let grpc = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";
    let connect = "/querier.v1.QuerierService";
    let long = "v".repeat(2000);
    let many_labels: String = (0..40)
        .map(|i| format!("l{i}=v"))
        .collect::<Vec<_>>()
        .join(",");
    let mut cases = vec![
        // /ingest: parameters.
        case("no name", M::POST, ingest(""), 400, "missing required query parameter name").body("a 1\n"),
        case("bad name", M::POST, ingest("name=a%20b"), 400, "invalid name").body("a 1\n"),
        case("bad from", M::POST, "/ingest?name=a.cpu&from=yesterday", 400, "invalid from").body("a 1\n"),
        case("bad until", M::POST, "/ingest?name=a.cpu&until=later", 400, "invalid until").body("a 1\n"),
        case("until before from", M::POST, "/ingest?name=a.cpu&from=2000&until=1000", 400, "is before from").body("a 1\n"),
        case("zero sample rate", M::POST, ingest("name=a.cpu&sampleRate=0"), 400, "invalid sampleRate").body("a 1\n"),
        case("negative sample rate", M::POST, ingest("name=a.cpu&sampleRate=-5"), 400, "invalid sampleRate").body("a 1\n"),
        case("bad aggregation", M::POST, ingest("name=a.cpu&aggregationType=max"), 400, "invalid aggregationType").body("a 1\n"),
        case("unknown format", M::POST, ingest("name=a.cpu&format=xml"), 400, "unknown format").body("a 1\n"),
        case("trie", M::POST, ingest("name=a.cpu&format=trie"), 400, "not supported").body("a 1\n"),
        case("tree", M::POST, ingest("name=a.cpu&format=tree"), 400, "not supported").body("a 1\n"),
        case("speedscope", M::POST, ingest("name=a.cpu&format=speedscope"), 400, "not supported").body("{}"),
        case("bad percent-encoding", M::POST, "/ingest?name=a.cpu%zz", 400, "invalid name").body("a 1\n"),
        case("label too long", M::POST, ingest(&format!("name=a.cpu{{k={long}}}")), 422, "").body("a 1\n"),
        case("too many labels", M::POST, ingest(&format!("name=a.cpu{{{many_labels}}}")), 422, "").body("a 1\n"),
        case("empty label name", M::POST, ingest("name=a.cpu%7B%3Dy%7D"), 400, "invalid name").body("a 1\n"),
        case("from the future", M::POST, format!("/ingest?name=a.cpu&from={}&until={}", now() + 3600, now() + 3610), 400, "").body("a 1\n"),
        case("before the retention", M::POST, "/ingest?name=a.cpu&from=1000&until=1010", 400, "").body("a 1\n"),
        // /ingest: encodings and sizes.
        case("brotli", M::POST, ingest("name=a.cpu"), 415, "unsupported Content-Encoding").body("a 1\n").header("content-encoding", "br"),
        case("gzip that is not", M::POST, ingest("name=a.cpu"), 400, "invalid gzip body").body("a 1\n").header("content-encoding", "gzip"),
        case("truncated gzip", M::POST, ingest("name=a.cpu"), 400, "invalid gzip body").body(gzip(b"main 1\n")[..12].to_vec()).header("content-encoding", "gzip"),
        case("gzip bomb", M::POST, ingest("name=a.cpu"), 413, "(ingest.max-decompressed-bytes)").body(bomb.clone()).header("content-encoding", "gzip"),
        case("body over the cap", M::POST, ingest("name=a.cpu"), 413, "(ingest.max-body-bytes)").body(vec![b'x'; max_body + 1]),
        case("declared far over the budget", M::POST, ingest("name=a.cpu"), 413, "").header("content-length", "1099511627776"),
        // /ingest: folded and lines.
        case("line without a count", M::POST, ingest("name=a.cpu"), 422, "invalid folded body").body("main;work\n"),
        case("negative count", M::POST, ingest("name=a.cpu"), 422, "invalid folded body").body("main;work -3\n"),
        case("count not a number", M::POST, ingest("name=a.cpu"), 422, "invalid folded body").body("main;work lots\n"),
        case("binary folded", M::POST, ingest("name=a.cpu"), 422, "invalid folded body").body(vec![0xff, 0xfe, b' ', b'1', b'\n']),
        case("lines of binary", M::POST, ingest("name=a.cpu&format=lines"), 422, "invalid lines body").body(vec![0xc3, 0x28, b'\n']),
        // /ingest: pprof.
        case("pprof garbage", M::POST, ingest("name=a&format=pprof"), 422, "invalid pprof body").body("definitely not protobuf"),
        case("pprof truncated", M::POST, ingest("name=a&format=pprof"), 422, "invalid pprof body").body(pprof[..pprof.len() / 2].to_vec()),
        case("pprof bomb", M::POST, ingest("name=a&format=pprof"), 413, "(ingest.max-decompressed-bytes)").body(bomb.clone()),
        case("form without boundary", M::POST, ingest("name=a&format=pprof"), 422, "invalid multipart form").body(no_profile.clone()).header("content-type", "multipart/form-data"),
        case("form without profile", M::POST, ingest("name=a&format=pprof"), 422, "no profile field").body(no_profile.clone()).header("content-type", form_type.clone()),
        case("form of garbage", M::POST, ingest("name=a&format=pprof"), 422, "invalid profile field").body(garbage_profile).header("content-type", form_type.clone()),
        case("form with a bad sample_type_config", M::POST, ingest("name=a&format=pprof"), 422, "sample_type_config").body(bad_config).header("content-type", form_type.clone()),
        // /ingest: JFR.
        case("jfr garbage", M::POST, ingest("name=a&format=jfr"), 422, "invalid jfr body").body("not a recording"),
        case("jfr truncated", M::POST, ingest("name=a&format=jfr"), 422, "invalid jfr body").body(b"FLR\0\x00\x02\x00\x00garbage".to_vec()),
        case("jfr bomb", M::POST, ingest("name=a&format=jfr"), 413, "(ingest.max-decompressed-bytes)").body(bomb.clone()),
        case("jfr form without jfr", M::POST, ingest("name=a&format=jfr"), 422, "no jfr field").body(no_jfr).header("content-type", form_type.clone()),
        // Connect push.
        case("push as text", M::POST, "/push.v1.PusherService/Push", 415, "unsupported Content-Type").body("x").header("content-type", "text/plain"),
        case("push proto garbage", M::POST, "/push.v1.PusherService/Push", 400, "invalid push request").body(vec![0xff; 16]).header("content-type", "application/proto"),
        case("push json garbage", M::POST, "/push.v1.PusherService/Push", 400, "invalid push request").body("{not json").header("content-type", "application/json"),
        case("push json of the wrong shape", M::POST, "/push.v1.PusherService/Push", 400, "invalid push request").body(r#"{"series": 5}"#).header("content-type", "application/json"),
        case("push raw profile not base64", M::POST, "/push.v1.PusherService/Push", 400, "is not base64").body(r#"{"series":[{"labels":[{"name":"service_name","value":"a"}],"samples":[{"rawProfile":"!!!"}]}]}"#).header("content-type", "application/json"),
        case("push without service_name", M::POST, "/push.v1.PusherService/Push", 400, "has no service_name label").body(push_proto(&[("env", "x")], pprof.clone())).header("content-type", "application/proto"),
        case("push raw profile garbage", M::POST, "/push.v1.PusherService/Push", 400, "rawProfile").body(push_proto(&[("service_name", "a")], b"garbage".to_vec())).header("content-type", "application/proto"),
        case("push raw profile bomb", M::POST, "/push.v1.PusherService/Push", 413, "(ingest.max-decompressed-bytes)").body(push_proto(&[("service_name", "a")], bomb.clone())).header("content-type", "application/proto"),
        case("push bad label", M::POST, "/push.v1.PusherService/Push", 400, "invalid label").body(push_proto(&[("service_name", "a"), ("", "x")], pprof.clone())).header("content-type", "application/proto"),
        case("push brotli", M::POST, "/push.v1.PusherService/Push", 415, "Content-Encoding").body("x").header("content-type", "application/proto").header("content-encoding", "br"),
        case("push bad gzip", M::POST, "/push.v1.PusherService/Push", 400, "invalid gzip").body("x").header("content-type", "application/proto").header("content-encoding", "gzip"),
        // OTLP over HTTP.
        case("otlp as text", M::POST, "/v1development/profiles", 415, "unsupported Content-Type").body("x").header("content-type", "text/plain"),
        case("otlp proto garbage", M::POST, "/v1development/profiles", 400, "invalid otlp profiles request").body(vec![0xff; 16]).header("content-type", "application/x-protobuf"),
        case("otlp json garbage", M::POST, "/v1development/profiles", 400, "invalid otlp profiles request").body("{nope").header("content-type", "application/json"),
        case("otlp json of the wrong type", M::POST, "/v1development/profiles", 400, "invalid otlp profiles request").body(r#"{"resourceProfiles": "x"}"#).header("content-type", "application/json"),
        case("otlp bomb", M::POST, "/v1development/profiles", 413, "(ingest.max-decompressed-bytes)").body(bomb.clone()).header("content-type", "application/x-protobuf").header("content-encoding", "gzip"),
        // OTLP over gRPC: refused with a gRPC status.
        case("grpc shorter than a header", M::POST, grpc, 200, "shorter than a message header").body(vec![0, 0]).grpc("3"),
        case("grpc compression flag 2", M::POST, grpc, 200, "compression flag 2").body(grpc_frame(2, b"x")).grpc("3"),
        case("grpc length that lies", M::POST, grpc, 200, "the header says").body({
            let mut f = grpc_frame(0, b"abc");
            f.truncate(6);
            f
        }).grpc("3"),
        case("grpc compressed without an encoding", M::POST, grpc, 200, "grpc-encoding identity").body(grpc_frame(1, &gzip(b"x"))).grpc("3"),
        case("grpc flagged compressed, not gzip", M::POST, grpc, 200, "not gzip").body(grpc_frame(1, b"plain")).grpc("3").header("grpc-encoding", "gzip"),
        case("grpc message garbage", M::POST, grpc, 200, "invalid otlp profiles request").body(grpc_frame(0, &[0xff; 8])).grpc("3"),
        case("grpc bomb", M::POST, grpc, 200, "(ingest.max-decompressed-bytes)").body(grpc_frame(1, &bomb)).grpc("8").header("grpc-encoding", "gzip"),
        // The query API.
        case("render without a query", M::GET, "/render", 400, "missing parameter `query`"),
        case("render with a bad selector", M::GET, "/render?query=a.cpu%7Benv%3D~%22(%22%7D", 400, "invalid `query`"),
        case("render with a bad from", M::GET, "/render?query=a.cpu&from=yesterday", 400, "invalid `from`"),
        case("render until before from", M::GET, "/render?query=a.cpu&from=now&until=now-1h", 400, "is before"),
        case("render as xml", M::GET, "/render?query=a.cpu&format=xml", 400, "invalid `format`"),
        case("render maxNodes lots", M::GET, "/render?query=a.cpu&maxNodes=lots", 400, "invalid `maxNodes`"),
        case("render groupBy not a label", M::GET, "/render?query=a.cpu&groupBy=a%20b", 400, "invalid `groupBy`"),
        case("render spanSelector not ids", M::GET, "/render?query=a.cpu&spanSelector=xyz", 400, "invalid `spanSelector`"),
        case("render bad percent-encoding", M::GET, "/render?query=%zz", 400, "invalid `query`"),
        case("render-diff without leftQuery", M::GET, "/render-diff?rightQuery=a.cpu", 400, "missing parameter `leftQuery`"),
        case("render-diff bad rightFrom", M::GET, "/render-diff?leftQuery=a.cpu&rightQuery=a.cpu&rightFrom=never", 400, "invalid `rightFrom`"),
        case("labels bad from", M::GET, "/labels?from=never", 400, "invalid `from`"),
        case("label-values without label", M::GET, "/label-values", 400, "missing parameter `label`"),
        case("label-values bad selector", M::GET, "/label-values?label=env&query=a.cpu%7B", 400, "invalid `query`"),
        case("delete app without a body", M::DELETE, "/api/apps", 400, "invalid body"),
        case("delete app that does not exist", M::DELETE, "/api/apps", 404, "no app named").body(r#"{"name": "nothing.cpu"}"#),
        case("connect as text", M::POST, format!("{connect}/LabelNames"), 400, "unsupported Content-Type").body("x").header("content-type", "text/plain"),
        case("connect proto garbage", M::POST, format!("{connect}/LabelNames"), 400, "").body(vec![0xff; 8]).header("content-type", "application/proto"),
        case("connect json garbage", M::POST, format!("{connect}/SelectMergeStacktraces"), 400, "").body("{nope").header("content-type", "application/json"),
        case("connect bad profile type", M::POST, format!("{connect}/SelectMergeStacktraces"), 400, "invalid profile type").body(r#"{"profileTypeID": "nonsense", "labelSelector": "{}", "start": 0, "end": 0}"#).header("content-type", "application/json"),
        case("connect end before start", M::POST, format!("{connect}/LabelNames"), 400, "is before").body(r#"{"start": 2000000, "end": 1000}"#).header("content-type", "application/json"),
        case("connect negative step", M::POST, format!("{connect}/SelectSeries"), 400, "invalid step").body(r#"{"profileTypeID": "process_cpu:cpu:nanoseconds:cpu:nanoseconds", "labelSelector": "{}", "start": 0, "end": 0, "step": -1}"#).header("content-type", "application/json"),
        case("connect over the size cap", M::POST, format!("{connect}/LabelNames"), 429, "").body(vec![b' '; 2 << 20]).header("content-type", "application/json"),
        // The rules API.
        case("rule not json", M::POST, "/api/recording-rules", 400, "invalid rule body").body("{nope").header("content-type", "application/json"),
        case("rule with an unknown field", M::POST, "/api/recording-rules", 400, "unknown field").body(r#"{"name": "a_total", "expr": "a.cpu", "colour": "red"}"#),
        case("rule without a name", M::POST, "/api/recording-rules", 400, "").body(r#"{"expr": "a.cpu"}"#),
        case("rule with a bad name", M::POST, "/api/recording-rules", 400, "").body(r#"{"name": "a b", "expr": "a.cpu"}"#),
        case("rule with a bad selector", M::POST, "/api/recording-rules", 400, "").body(r#"{"name": "a_total", "expr": "a.cpu{"}"#),
        case("rule with a bad node regex", M::POST, "/api/recording-rules", 400, "").body(r#"{"name": "a_total", "expr": "a.cpu", "node": "("}"#),
        case("rule grouping by a bad label", M::POST, "/api/recording-rules", 400, "").body(r#"{"name": "a_total", "expr": "a.cpu", "group_by": ["a b"]}"#),
        case("rule over the size cap", M::POST, "/api/recording-rules", 413, "").body(vec![b' '; 100 << 10]),
        case("changing a rule that does not exist", M::PUT, "/api/recording-rules/nothing_total", 404, "").body(r#"{"expr": "a.cpu"}"#),
        case("deleting a rule that does not exist", M::DELETE, "/api/recording-rules/nothing_total", 404, ""),
        case("changing a provisioned rule", M::PUT, "/api/recording-rules/provisioned_total", 409, "").body(r#"{"expr": "a.cpu"}"#),
        case("deleting a provisioned rule", M::DELETE, "/api/recording-rules/provisioned_total", 409, ""),
        // Credentials and sign-in.
        case("no credentials", M::POST, ingest("name=a.cpu"), 401, "needs a credential").body("a 1\n").anonymous(),
        case("a wrong token", M::POST, ingest("name=a.cpu"), 401, "unknown credentials").body("a 1\n").anonymous().header("authorization", "Bearer nope"),
        case("basic that is not base64", M::POST, ingest("name=a.cpu"), 401, "not base64").body("a 1\n").anonymous().header("authorization", "Basic !!!"),
        case("an unknown scheme", M::POST, ingest("name=a.cpu"), 401, "unsupported Authorization scheme").body("a 1\n").anonymous().header("authorization", "Digest x"),
        case("a forged session", M::POST, ingest("name=a.cpu"), 401, "sign in again").body("a 1\n").anonymous().header("cookie", "smolder_session_PORT=0123"),
        case("a reader ingesting", M::POST, ingest("name=a.cpu"), 403, "needs scope ingest").body("a 1\n").anonymous().header("authorization", format!("Bearer {READER}")),
        case("a reader deleting", M::DELETE, "/api/apps", 403, "needs scope admin").body(r#"{"name": "probe.cpu"}"#).anonymous().header("authorization", format!("Bearer {READER}")),
        case("sign-in as text", M::POST, "/login", 415, "JSON body").body("token=x").anonymous(),
        case("sign-in not json", M::POST, "/login", 400, "invalid sign-in body").body("{nope").anonymous().header("content-type", "application/json"),
        case("sign-in with both", M::POST, "/login", 400, "give either token").body(r#"{"token": "a", "user": "b", "password": "c"}"#).anonymous().header("content-type", "application/json"),
        case("sign-in over the cap", M::POST, "/login", 413, "at most").body(vec![b' '; 8192]).anonymous().header("content-type", "application/json"),
        case("sign-in with a wrong token", M::POST, "/login", 401, "unknown credentials").body(r#"{"token": "nope"}"#).anonymous().header("content-type", "application/json"),
        // The HTTP surface.
        case("no such route", M::POST, "/ingestt", 404, "no route for /ingestt").body("a 1\n"),
        case("a method the route does not take", M::PUT, "/ingest", 405, "is not allowed").body("a 1\n"),
    ];
    for case in &mut cases {
        if case.headers.iter().all(|(name, _)| *name != "content-type")
            && case.path.starts_with("/api/recording-rules")
        {
            case.headers
                .push(("content-type", "application/json".to_owned()));
        }
    }
    cases
}

/// A config that must be refused, and what its error must say.
const BAD_CONFIGS: &[(&str, &str, &str)] = &[
    ("unknown key", "colour: red\n", "unknown field `colour`"),
    (
        "unknown auth key",
        "auth:\n  open: true\n",
        "unknown field `open`",
    ),
    (
        "credential without scopes",
        "auth:\n  credentials:\n    - {name: a, token: t}\n",
        "missing field `scopes`",
    ),
    (
        "credential with an empty scope list",
        "auth:\n  credentials:\n    - {name: a, token: t, scopes: []}\n",
        "scopes is empty",
    ),
    (
        "credential with an unknown scope",
        "auth:\n  credentials:\n    - {name: a, token: t, scopes: [write]}\n",
        "unknown variant `write`",
    ),
    (
        "credential with token and password",
        "auth:\n  credentials:\n    - {name: a, token: t, user: u, password: p, scopes: [read]}\n",
        "give either token, or user and password",
    ),
    (
        "credential without a secret",
        "auth:\n  credentials:\n    - {name: a, scopes: [read]}\n",
        "give either token",
    ),
    (
        "credential without a name",
        "auth:\n  credentials:\n    - {name: '', token: t, scopes: [read]}\n",
        "needs a name",
    ),
    (
        "two credentials with one token",
        "auth:\n  credentials:\n    - {name: a, token: t, scopes: [read]}\n    - {name: b, token: t, scopes: [admin]}\n",
        "have the same token",
    ),
    (
        "credential tenant without multitenancy",
        "auth:\n  credentials:\n    - {name: a, token: t, scopes: [read], tenant: team-a}\n",
        "multitenancy-enabled is false",
    ),
    (
        "credential with a bad tenant",
        "tenant:\n  multitenancy-enabled: true\nauth:\n  credentials:\n    - {name: a, token: t, scopes: [read], tenant: a/b}\n",
        "is not a tenant id",
    ),
    (
        "session ttl not a duration",
        "auth:\n  session-ttl: 5 parsecs\n",
        "missing unit",
    ),
    (
        "budget under one request",
        "admission:\n  max-in-flight-bytes: 1024\n",
        "admission.max-in-flight-bytes",
    ),
    (
        "budget under one batch",
        "ingest:\n  max-body-bytes: 1\n  max-decompressed-bytes: 1\nadmission:\n  max-in-flight-bytes: 1000\n",
        "ingest.quic.max-batch-bytes",
    ),
    (
        "head budget of nothing",
        "store:\n  head-max-bytes: 0\n",
        "store.head-max-bytes is 0; it must be at least",
    ),
    (
        "query timeout not a duration",
        "query:\n  timeout: soon\n",
        "query: invalid character 's'",
    ),
    (
        "tenant tokens without multitenancy",
        "ingest:\n  quic:\n    tenant-tokens:\n      team-a: [t]\n",
        "multitenancy-enabled is false",
    ),
    (
        "a key given twice",
        "query:\n  max-series: 1\n  max-series: 2\n",
        "duplicate",
    ),
    (
        "a rule that does not parse",
        "metrics-export-rules:\n  a_total:\n    expr: 'a.cpu{'\n",
        "a_total",
    ),
    (
        "http cert without key",
        "http:\n  cert: /nonexistent.pem\n",
        "http.cert and http.key must be set together",
    ),
];

/// Configs that parse but name files that are not what they should be (`check-config`).
fn bad_files(dir: &std::path::Path) -> Vec<(&'static str, String, &'static str)> {
    let garbage = dir.join("garbage.yaml");
    std::fs::write(
        &garbage,
        "credentials: [{name: a, token: t, scopes: [root]}]\n",
    )
    .unwrap();
    vec![
        (
            "missing credential file",
            "auth:\n  credential-files: [/nonexistent/credentials.yaml]\n".to_owned(),
            "cannot read credential file /nonexistent/credentials.yaml",
        ),
        (
            "credential file that does not parse",
            format!("auth:\n  credential-files: [{}]\n", garbage.display()),
            "does not parse",
        ),
        (
            "missing http certificate",
            "http:\n  cert: /nonexistent/cert.pem\n  key: /nonexistent/key.pem\n".to_owned(),
            "/nonexistent/cert.pem",
        ),
    ]
}

/// The QUIC protocol's hostile streams and hellos: (what, bytes, what the reject says).
fn quic_cases(token: &str) -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let now = SystemTime::now();
    let batch = |sequence: u64| {
        BatchMessage::from_profiles(
            "raw-client",
            sequence,
            now - Duration::from_secs(10),
            now,
            &[profile("raw.cpu", "main;x", 1, now)],
        )
    };
    let valid = frame::encode(FrameKind::Batch, &batch(1));
    let mut trailing = valid.clone();
    trailing.extend_from_slice(b"extra");
    let mut bad_tree = batch(2);
    bad_tree.series[0].tree = b"T\x01\xff\xff\xff".to_vec();
    let mut other = batch(3);
    other.agent_id = "somebody-else".to_owned();
    let (_, body) = valid.split_at(HEADER_LEN);
    let declared = u32::from_le_bytes(valid[12..16].try_into().unwrap());
    vec![
        (
            "garbage stream",
            b"GET / HTTP/1.1\r\n\r\n".to_vec(),
            "not a smolder frame",
        ),
        ("truncated header", valid[..10].to_vec(), "frame truncated"),
        (
            "truncated body",
            valid[..valid.len() - 3].to_vec(),
            "frame truncated",
        ),
        (
            "trailing bytes",
            trailing,
            "after the frame's declared body",
        ),
        (
            "oversized",
            framed(FrameKind::Batch, 100 << 20, 100 << 20, b"tiny"),
            "is over the limit",
        ),
        (
            "bomb over the cap",
            framed(FrameKind::Batch, 1 << 20, u32::MAX, &[]),
            "is over the limit",
        ),
        (
            "impossible ratio",
            framed(FrameKind::Batch, 1_000, 60 << 20, &[0; 1_000]),
            "is impossible",
        ),
        (
            "lying uncompressed length",
            framed(FrameKind::Batch, body.len() as u32, declared + 1, body),
            "does not decompress",
        ),
        (
            "a hello where a batch goes",
            hello(token),
            "expected a batch frame",
        ),
        (
            "an invalid tree",
            frame::encode(FrameKind::Batch, &bad_tree),
            "invalid tree",
        ),
        (
            "another agent's id",
            frame::encode(FrameKind::Batch, &other),
            "differs from the connection's agent id",
        ),
    ]
}

/// `curl 'http://host/render?query=a{x="y"}'`: a request line the HTTP parser refuses.
async fn raw_request(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn over_a_hundred_hostile_inputs_are_refused_store_nothing_and_the_next_good_one_is_served() {
    let (max_body, max_decompressed) = (1 << 20, 4 << 20);
    let mut config: Config = smolder_daemon::parse(&format!(
        "auth:\n  credentials:\n    - {{name: admin, token: {ADMIN}, scopes: [admin]}}\n    - {{name: reader, token: {READER}, scopes: [read]}}\nmetrics-export-rules:\n  provisioned_total:\n    expr: probe.cpu\n"
    ))
    .unwrap();
    config.ingest.max_body_bytes = max_body;
    config.ingest.max_decompressed_bytes = max_decompressed;
    let agg = Aggregator::with_config(config).await;
    let port = agg.addr().port().to_string();
    let mut probes = 0u64;
    let probe = |n: u64| {
        let t = now();
        agg.http
            .post(agg.url(&format!("/ingest?name=probe.cpu&from={}&until={t}", t - 10)))
            .bearer_auth(ADMIN)
            .body(format!("main;probe_{n} 1\n"))
            .send()
    };

    let mut counted = Vec::new();
    let mut wrong = Vec::new();
    let cases = http_cases(max_body, max_decompressed);
    for case in cases {
        let method = case.method.clone();
        let mut request = agg
            .http
            .request(method, agg.url(&case.path))
            .body(case.body.clone());
        if case.authenticated {
            request = request.bearer_auth(ADMIN);
        }
        for (name, value) in &case.headers {
            request = request.header(*name, value.replace("PORT", &port));
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|err| panic!("{}: {err}", case.what));
        let status = response.status();
        let grpc_status = response
            .headers()
            .get("grpc-status")
            .map(|v| v.to_str().unwrap().to_owned());
        let grpc_message = response
            .headers()
            .get("grpc-message")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let text = response.text().await.unwrap_or_default();
        let (said, as_expected) = match case.grpc {
            Some(code) => {
                let message = grpc_message.replace("%20", " ");
                let ok = grpc_status.as_deref() == Some(code) && message.contains(case.says);
                (format!("grpc-status {grpc_status:?}: {message}"), ok)
            }
            None => (
                text.clone(),
                status.is_client_error() && !text.trim().is_empty() && text.contains(case.says),
            ),
        };
        if status != case.status || !as_expected {
            wrong.push(format!(
                "{}: expected {} saying {:?}, got {status}: {said}",
                case.what, case.status, case.says
            ));
        }
        probes += 1;
        assert_eq!(
            probe(probes).await.unwrap().status(),
            StatusCode::OK,
            "after {}",
            case.what
        );
        counted.push(("http", case.what));
    }

    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // A request line no client library would send.
    let answer = raw_request(
        agg.addr(),
        b"GET /render?query=a.cpu{env=\"prod\"} HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("must be percent-encoded"), "{answer}");
    probes += 1;
    assert_eq!(probe(probes).await.unwrap().status(), StatusCode::OK);
    counted.push(("http", "unencoded quote in the request line"));

    // The QUIC protocol: every hostile stream on one connection, then hostile hellos.
    let ca = agg.dir().join("tls/ca.pem");
    let conn = connect(agg.quic_addr(), &ca, None).await.unwrap();
    let welcome = exchange(&conn, &hello(ADMIN)).await;
    assert_eq!(
        kind(&welcome),
        FrameKind::Welcome,
        "the admin token may ship"
    );
    for (what, bytes, says) in quic_cases(ADMIN) {
        let refused = reject(&exchange(&conn, &bytes).await);
        assert!(refused.reason.contains(says), "{what}: {}", refused.reason);
        assert!(!refused.retryable, "{what}: a retry cannot fix it");
        probes += 1;
        assert_eq!(
            probe(probes).await.unwrap().status(),
            StatusCode::OK,
            "after {what}"
        );
        counted.push(("quic", what));
    }
    let now_ = SystemTime::now();
    let good = BatchMessage::from_profiles(
        "raw-client",
        100,
        now_ - Duration::from_secs(10),
        now_,
        &[profile("quicprobe.cpu", "main;ok", 5, now_)],
    );
    assert_eq!(
        ack(&exchange(&conn, &frame::encode(FrameKind::Batch, &good)).await).sequence,
        100
    );
    for (what, token, version, says) in [
        ("a hello without a token", "", None, "no credentials"),
        ("a hello with a wrong token", "nope", None, "invalid token"),
        (
            "a hello with a reader's token",
            READER,
            None,
            "lacks scope ingest",
        ),
        (
            "a hello of another version",
            ADMIN,
            Some(2u8),
            "unsupported protocol version 2",
        ),
        ("a hello of garbage", "", Some(0u8), "not a smolder frame"),
    ] {
        let conn = connect(agg.quic_addr(), &ca, None).await.unwrap();
        let mut bytes = hello(token);
        match version {
            Some(0) => bytes = b"\x00\x01 definitely not a hello frame".to_vec(),
            Some(v) => bytes[4] = v,
            None => {}
        }
        let refused = reject(&exchange(&conn, &bytes).await);
        assert!(refused.reason.contains(says), "{what}: {}", refused.reason);
        assert!(!refused.retryable, "{what}");
        probes += 1;
        assert_eq!(
            probe(probes).await.unwrap().status(),
            StatusCode::OK,
            "after {what}"
        );
        counted.push(("quic", what));
    }

    // The config files.
    for (what, yaml, says) in BAD_CONFIGS {
        let err = match smolder_daemon::parse::<Config>(yaml) {
            Ok(config) => config.check_files().expect_err(what),
            Err(err) => err,
        };
        let text = format!("{err:#}");
        if !text.contains(says) {
            wrong.push(format!("{what}: expected {says:?} in {text:?}"));
        }
        counted.push(("config", what));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let dir = tempfile::tempdir().unwrap();
    for (what, yaml, says) in bad_files(dir.path()) {
        let config: Config =
            smolder_daemon::parse(&yaml).unwrap_or_else(|err| panic!("{what}: {err:#}"));
        let text = format!("{:#}", config.check_files().expect_err(what));
        assert!(text.contains(says), "{what}: {text}");
        counted.push(("config", what));
    }

    // Nothing of it stored: only the probes, each once.
    let apps: Vec<serde_json::Value> = agg.get_json_as("/api/apps", ADMIN).await;
    let names: Vec<&str> = apps.iter().filter_map(|a| a["name"].as_str()).collect();
    assert_eq!(names, ["probe.cpu", "quicprobe.cpu"]);
    let render: serde_json::Value = agg
        .http
        .get(agg.url("/render"))
        .query(&[
            ("query", "probe.cpu"),
            ("from", "now-1h"),
            ("until", "now+1m"),
        ])
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(render["flamebearer"]["numTicks"], probes);
    let rules: serde_json::Value = agg.get_json_as("/api/recording-rules", ADMIN).await;
    assert_eq!(
        rules["rules"].as_array().unwrap().len(),
        1,
        "the provisioned one only"
    );

    let mut distinct: Vec<_> = counted.iter().map(|(_, what)| *what).collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), counted.len(), "every case is distinct");
    let by = |kind: &str| counted.iter().filter(|(k, _)| *k == kind).count();
    println!(
        "{} hostile inputs: {} HTTP, {} QUIC, {} config",
        counted.len(),
        by("http"),
        by("quic"),
        by("config")
    );
    assert!(counted.len() >= 100, "{} cases", counted.len());
    agg.stop().await;
}
