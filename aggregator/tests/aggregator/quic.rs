//! QUIC ingest against hostile and mistaken clients: a hand-made QUIC client for what a real
//! agent never sends, real agents for credentials and for the names the development
//! certificate carries.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quinn::crypto::rustls::QuicClientConfig;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use smolder_agent::app as agent_app;
use smolder_aggregator::config::Config;
use smolder_common::wire::frame::{self, HEADER_LEN};
use smolder_common::wire::{
    ALPN, Ack, BatchLimits, BatchMessage, FrameHeader, FrameKind, FrameLimits, Hello, Reject,
    Welcome,
};

use smolder_test_support::prometheus::Metrics;
use smolder_test_support::wait::eventually;

use crate::transport::{agent_config, agent_metrics, profile, ticks};
use crate::util::Aggregator;

/// A QUIC connection that trusts the CA at `ca`, optionally with a client certificate.
pub(crate) async fn connect(
    addr: SocketAddr,
    ca: &Path,
    client: Option<(&Path, &Path)>,
) -> Result<quinn::Connection, quinn::ConnectionError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots);
    let mut tls = match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(cert)
                    .unwrap()
                    .map(Result::unwrap)
                    .collect(),
                PrivateKeyDer::from_pem_file(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let config = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).unwrap()));
    // On loopback for an aggregator on this host; any address for one in a network namespace,
    // which a socket bound to loopback cannot reach.
    let local = if addr.ip().is_loopback() {
        "127.0.0.1:0"
    } else {
        "0.0.0.0:0"
    };
    let endpoint = quinn::Endpoint::client(local.parse().unwrap()).unwrap();
    endpoint
        .connect_with(config, addr, "localhost")
        .unwrap()
        .await
}

/// Writes `bytes` on a new stream, finishes it, and reads the whole answer.
pub(crate) async fn exchange(conn: &quinn::Connection, bytes: &[u8]) -> Vec<u8> {
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    // The aggregator may stop the stream early; its answer still comes.
    if send.write_all(bytes).await.is_ok() {
        let _ = send.finish();
    }
    recv.read_to_end(1 << 20).await.unwrap_or_default()
}

pub(crate) fn hello(token: &str) -> Vec<u8> {
    frame::encode(
        FrameKind::Hello,
        &Hello {
            agent_id: "raw-client".to_owned(),
            hostname: "test".to_owned(),
            agent_version: "0".to_owned(),
            token: token.to_owned(),
        },
    )
}

pub(crate) fn kind(answer: &[u8]) -> FrameKind {
    let (header, _) = frame::split_header(answer).expect("an answer frame");
    FrameHeader::parse(header, FrameLimits::CONTROL)
        .unwrap()
        .kind
}

pub(crate) fn reject(answer: &[u8]) -> Reject {
    frame::decode(answer, FrameKind::Reject, FrameLimits::CONTROL)
        .unwrap_or_else(|err| panic!("expected a reject: {err}"))
}

pub(crate) fn ack(answer: &[u8]) -> Ack {
    frame::decode(answer, FrameKind::Ack, FrameLimits::CONTROL)
        .unwrap_or_else(|err| panic!("expected an ack, got {:?}: {err}", reject(answer)))
}

fn batch(sequence: u64, stack: &str, value: u64) -> BatchMessage {
    let now = SystemTime::now();
    let end = now + Duration::from_millis(1);
    BatchMessage::from_profiles(
        "raw-client",
        sequence,
        now - Duration::from_secs(10),
        end,
        &[profile("raw.cpu", stack, value, end)],
    )
}

/// A frame with an arbitrary header.
pub(crate) fn framed(kind: FrameKind, compressed: u32, uncompressed: u32, body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::from(frame::MAGIC);
    bytes.extend_from_slice(&[smolder_common::wire::PROTOCOL_VERSION, kind as u8, 0, 0]);
    bytes.extend_from_slice(&compressed.to_le_bytes());
    bytes.extend_from_slice(&uncompressed.to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

#[tokio::test]
async fn hostile_streams_are_refused_with_a_reason_and_store_nothing() {
    let aggregator = Aggregator::start().await;
    let ca = aggregator.dir().join("tls/ca.pem");
    let token = std::fs::read_to_string(aggregator.dir().join("tls/agent-token")).unwrap();
    let conn = connect(aggregator.quic_addr(), &ca, None).await.unwrap();
    assert_eq!(
        kind(&exchange(&conn, &hello(token.trim())).await),
        FrameKind::Welcome
    );

    let valid = frame::encode(FrameKind::Batch, &batch(1, "main;ok", 5));
    let mut trailing = valid.clone();
    trailing.extend_from_slice(b"extra");
    let zeros = lz4_block(&vec![0u8; 8 << 20]);
    let mut bad_tree = batch(2, "main;x", 1);
    bad_tree.series[0].tree = b"T\x01\xff\xff\xff".to_vec();
    let mut other_agent = batch(3, "main;x", 1);
    other_agent.agent_id = "somebody-else".to_owned();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "garbage",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            "not a smolder frame",
        ),
        (
            "truncated header",
            valid[..10].to_vec(),
            "frame truncated: 16 bytes of header",
        ),
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
            "compressed body length 104857600 is over the limit of 67108864 bytes",
        ),
        (
            "bomb over the cap",
            framed(FrameKind::Batch, 1 << 20, u32::MAX, &[]),
            "uncompressed body length 4294967295 is over the limit",
        ),
        (
            "bomb with an impossible ratio",
            framed(FrameKind::Batch, 1_000, 60 << 20, &[0; 1_000]),
            "is impossible for 1000 compressed bytes",
        ),
        (
            "bomb of zeros within the cap",
            framed(FrameKind::Batch, zeros.len() as u32, 8 << 20, &zeros),
            "invalid batch message",
        ),
        (
            "lying uncompressed length",
            {
                let (_, body) = valid.split_at(HEADER_LEN);
                let declared = u32::from_le_bytes(valid[12..16].try_into().unwrap());
                framed(FrameKind::Batch, body.len() as u32, declared + 1, body)
            },
            "body does not decompress",
        ),
        (
            "wrong kind",
            hello(token.trim()),
            "expected a batch frame, got hello",
        ),
        (
            "invalid tree",
            frame::encode(FrameKind::Batch, &bad_tree),
            "series 0 (\"raw.cpu\"): invalid tree",
        ),
        (
            "another agent's id",
            frame::encode(FrameKind::Batch, &other_agent),
            "differs from the connection's agent id",
        ),
    ];
    for (case, bytes, expected) in cases {
        let answer = exchange(&conn, &bytes).await;
        let reject = reject(&answer);
        assert!(
            reject.reason.contains(expected),
            "{case}: {}",
            reject.reason
        );
        assert!(!reject.retryable, "{case}: a retry cannot fix it");
    }
    let base = aggregator.url("");
    assert_eq!(
        ticks(&aggregator.http, &base, "raw.cpu").await,
        0,
        "nothing stored"
    );
    let apps = aggregator
        .http
        .get(aggregator.url("/api/apps"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(apps.trim(), "[]", "the store is unchanged");

    // The same connection, and the aggregator, go on working.
    assert_eq!(ack(&exchange(&conn, &valid).await).sequence, 1);
    let again = ack(&exchange(&conn, &valid).await);
    assert!(
        again.duplicate,
        "a resent batch is acknowledged, not stored again"
    );
    assert_eq!(ticks(&aggregator.http, &base, "raw.cpu").await, 5);
    let metrics = Metrics::scrape(&aggregator.url("/metrics")).await;
    assert_eq!(
        metrics.value("smolder_aggregator_ingest_quic_batches_rejected_total", &[]),
        12.0,
        "{metrics:?}"
    );
    assert_eq!(
        metrics.value(
            "smolder_aggregator_ingest_quic_batches_duplicate_total",
            &[]
        ),
        1.0
    );

    // A connection whose hello is garbage is closed with the reason.
    let conn = connect(aggregator.quic_addr(), &ca, None).await.unwrap();
    let refused = reject(&exchange(&conn, b"\x00\x01 definitely not a hello frame").await);
    assert!(
        refused
            .reason
            .starts_with("invalid hello: not a smolder frame"),
        "{}",
        refused.reason
    );
    let closed = conn.closed().await;
    assert!(closed.to_string().contains("invalid hello"), "{closed}");
    aggregator.stop().await;
}

/// `bytes` as an lz4 block, as the protocol's bodies are: a frame's body is the block of its
/// message's encoding, and [`RawBytes`] encodes as itself.
fn lz4_block(bytes: &[u8]) -> Vec<u8> {
    frame::encode(FrameKind::Batch, &RawBytes(bytes.to_vec()))[HEADER_LEN..].to_vec()
}

/// A message whose encoding is exactly its bytes, to compress arbitrary bodies.
#[derive(Debug, Default)]
struct RawBytes(Vec<u8>);

impl prost::Message for RawBytes {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        buf.put_slice(&self.0);
    }
    fn merge_field(
        &mut self,
        _: u32,
        _: prost::encoding::WireType,
        _: &mut impl prost::bytes::Buf,
        _: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        unreachable!("only encoded")
    }
    fn encoded_len(&self) -> usize {
        self.0.len()
    }
    fn clear(&mut self) {
        self.0.clear();
    }
}

/// A CA and a client certificate it signed, as PEM files in `dir`.
fn client_pki(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("{name} CA"));
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec![format!("{name}.agent")]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{name} agent"));
    let cert = params.signed_by(&key, &issuer).unwrap();
    let paths = (
        dir.join(format!("{name}-ca.pem")),
        dir.join(format!("{name}-agent.pem")),
        dir.join(format!("{name}-agent.key")),
    );
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

#[tokio::test]
async fn bad_credentials_and_versions_are_refused_while_other_agents_ship() {
    let pki = tempfile::tempdir().unwrap();
    let (client_ca, agent_cert, agent_key) = client_pki(pki.path(), "fleet");
    let (rogue_ca, rogue_cert, rogue_key) = client_pki(pki.path(), "rogue");
    let mut config = Config::default();
    config.ingest.quic.tokens = vec!["good-token".to_owned()];
    config.ingest.quic.client_ca = Some(client_ca);
    let aggregator = Aggregator::with_config(config).await;
    let quic = aggregator.quic_addr();
    let ca = aggregator.dir().join("tls/ca.pem");
    assert!(
        !aggregator.dir().join("tls/agent-token").exists(),
        "no development token when tokens are configured"
    );

    let state = tempfile::tempdir().unwrap();
    let start = |name: &str, edit: &dyn Fn(&mut smolder_agent::config::Config)| {
        let mut config = agent_config(quic, aggregator.dir());
        config.ship.token_file = pki.path().join("no-token-file");
        edit(&mut config);
        let dir = state.path().join(name);
        async move { agent_app::start_in(config, &dir).await }
    };
    let token = start("token", &|c| c.ship.token = "good-token".to_owned())
        .await
        .unwrap();
    let cert = start("cert", &|c| {
        c.ship.client_cert = Some(agent_cert.clone());
        c.ship.client_key = Some(agent_key.clone());
    })
    .await
    .unwrap();
    let wrong_token = start("wrong-token", &|c| c.ship.token = "bad-token".to_owned())
        .await
        .unwrap();
    let rogue = start("rogue", &|c| {
        c.ship.client_cert = Some(rogue_cert.clone());
        c.ship.client_key = Some(rogue_key.clone());
    })
    .await
    .unwrap();
    let wrong_ca = start("wrong-ca", &|c| {
        c.ship.token = "good-token".to_owned();
        c.ship.ca = rogue_ca.clone();
    })
    .await
    .unwrap();
    let now = SystemTime::now();
    for (agent, app) in [
        (&token, "token.cpu"),
        (&cert, "cert.cpu"),
        (&wrong_token, "wrongtoken.cpu"),
        (&rogue, "rogue.cpu"),
        (&wrong_ca, "wrongca.cpu"),
    ] {
        agent
            .submitter()
            .submit(profile(app, "main", 3, now))
            .await
            .unwrap();
    }

    // Raw clients: no credentials at all, and another protocol version.
    let conn = connect(quic, &ca, None).await.unwrap();
    let refused = reject(&exchange(&conn, &hello("")).await);
    assert!(
        refused.reason.contains("no credentials"),
        "{}",
        refused.reason
    );
    assert!(!refused.retryable);
    let conn = connect(quic, &ca, None).await.unwrap();
    let mut future = hello("good-token");
    future[4] = 2;
    let refused = reject(&exchange(&conn, &future).await);
    assert!(
        refused.reason.contains("unsupported protocol version 2"),
        "{}",
        refused.reason
    );

    let base = aggregator.url("");
    eventually(
        Duration::from_secs(20),
        "good agents' batches stored",
        || async {
            ticks(&aggregator.http, &base, "token.cpu").await == 3
                && ticks(&aggregator.http, &base, "cert.cpu").await == 3
        },
    )
    .await;
    for agent in [&wrong_token, &rogue, &wrong_ca] {
        eventually(Duration::from_secs(10), "bad agents retry", || async {
            agent_metrics(agent)
                .await
                .value("smolder_agent_ship_reconnects_total", &[])
                >= 2.0
        })
        .await;
        let text = agent_metrics(agent).await;
        assert_eq!(
            text.value("smolder_agent_ship_connected", &[]),
            0.0,
            "{text:?}"
        );
        assert_eq!(
            text.value("smolder_agent_ship_batches_sent_total", &[]),
            0.0,
            "{text:?}"
        );
        assert_eq!(
            text.value("smolder_agent_spool_batches", &[]),
            1.0,
            "kept for later: {text:?}"
        );
    }
    for app in ["wrongtoken.cpu", "rogue.cpu", "wrongca.cpu"] {
        assert_eq!(ticks(&aggregator.http, &base, app).await, 0, "{app}");
    }
    let metrics = Metrics::scrape(&aggregator.url("/metrics")).await;
    let outcome = |o: &str| {
        metrics.value(
            "smolder_aggregator_ingest_quic_connections_total",
            &[("outcome", o)],
        )
    };
    assert!(
        outcome("refused") >= 3.0,
        "wrong token, none, version: {metrics:?}"
    );
    assert!(
        outcome("handshake_failed") >= 1.0,
        "rogue certificate: {metrics:?}"
    );
    assert!(outcome("accepted") >= 2.0, "{metrics:?}");
    for agent in [token, cert, wrong_token, rogue, wrong_ca] {
        agent.stop().await.unwrap();
    }
    aggregator.stop().await;
}

#[tokio::test]
async fn batches_over_the_rate_limit_are_refused_as_retryable() {
    let mut config = Config::default();
    config.ingest.quic.max_batches_per_second = 2;
    let aggregator = Aggregator::with_config(config).await;
    let ca = aggregator.dir().join("tls/ca.pem");
    let token = std::fs::read_to_string(aggregator.dir().join("tls/agent-token")).unwrap();
    let conn = connect(aggregator.quic_addr(), &ca, None).await.unwrap();
    assert_eq!(
        kind(&exchange(&conn, &hello(token.trim())).await),
        FrameKind::Welcome
    );
    let mut acked = 0;
    let mut limited = 0;
    for sequence in 1..=5 {
        let bytes = frame::encode(FrameKind::Batch, &batch(sequence, "main;paced", 1));
        let answer = exchange(&conn, &bytes).await;
        if kind(&answer) == FrameKind::Ack {
            acked += 1;
        } else {
            let reject = reject(&answer);
            assert!(reject.retryable, "{}", reject.reason);
            assert!(reject.reason.starts_with("rate limit"), "{}", reject.reason);
            assert_eq!(reject.sequence, 0, "refused before the batch was read");
            limited += 1;
        }
    }
    assert_eq!((acked, limited), (2, 3), "a burst of two, then refused");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let bytes = frame::encode(FrameKind::Batch, &batch(6, "main;paced", 1));
    assert_eq!(ack(&exchange(&conn, &bytes).await).sequence, 6, "refilled");
    aggregator.stop().await;
}

/// A batch of `profiles` from the raw client, over the last 10 s.
fn batch_of(sequence: u64, profiles: &[smolder_common::Profile]) -> BatchMessage {
    let now = SystemTime::now();
    BatchMessage::from_profiles(
        "raw-client",
        sequence,
        now - Duration::from_secs(10),
        now + Duration::from_millis(1),
        profiles,
    )
}

/// A raw client's connection, said hello to, and the welcome it got.
async fn welcomed(aggregator: &Aggregator) -> (quinn::Connection, Welcome) {
    let ca = aggregator.dir().join("tls/ca.pem");
    let token = std::fs::read_to_string(aggregator.dir().join("tls/agent-token")).unwrap();
    let conn = connect(aggregator.quic_addr(), &ca, None).await.unwrap();
    let answer = exchange(&conn, &hello(token.trim())).await;
    let welcome = frame::decode(&answer, FrameKind::Welcome, FrameLimits::CONTROL).unwrap();
    (conn, welcome)
}

#[tokio::test]
async fn the_welcome_announces_the_limits_and_the_clock() {
    let mut config = Config::default();
    config.ingest.max_series_per_request = 77;
    config.ingest.max_labels_per_series = 5;
    config.ingest.max_label_bytes = 100;
    config.ingest.quic.max_batch_bytes = 1 << 20;
    let aggregator = Aggregator::with_config(config).await;
    let before = SystemTime::now();
    let (_conn, welcome) = welcomed(&aggregator).await;
    let after = SystemTime::now();
    assert_eq!(
        BatchLimits::from_welcome(&welcome),
        BatchLimits {
            max_batch_bytes: 1 << 20,
            max_series: 77,
            max_labels: 5,
            max_label_bytes: 100,
        }
    );
    assert_eq!(welcome.max_clock_skew_seconds, 600);
    let clock = UNIX_EPOCH + Duration::from_nanos(welcome.clock_unix_nanos as u64);
    assert!(before <= clock && clock <= after, "{clock:?}");
    aggregator.stop().await;
}

#[tokio::test]
async fn bad_series_are_refused_one_by_one_and_the_ack_names_them() {
    let mut config = Config::default();
    config.ingest.max_label_bytes = 16;
    config.ingest.max_series_per_request = 5;
    let aggregator = Aggregator::with_config(config).await;
    let (conn, _) = welcomed(&aggregator).await;
    let at = SystemTime::now();
    let long = format!("refused.cpu{{k={}}}", "v".repeat(17));
    let mut message = batch_of(
        1,
        &[
            profile("kept.cpu{n=0}", "main;a", 1, at),
            profile(&long, "main;b", 2, at),
            profile("kept.cpu{n=2}", "main;c", 4, at),
            profile("broken.cpu", "main;d", 8, at),
            profile("kept.cpu{n=4}", "main;e", 16, at),
            profile("over.cpu", "main;f", 32, at),
        ],
    );
    message.series[3].tree = b"T\x01\xff\xff\xff".to_vec();
    let answer = exchange(&conn, &frame::encode(FrameKind::Batch, &message)).await;
    let first = ack(&answer);
    let refused: Vec<(u32, &str)> = first
        .refused
        .iter()
        .map(|r| (r.index, r.reason.as_str()))
        .collect();
    assert_eq!(
        refused,
        [
            (1, "label_too_long"),
            (3, "invalid"),
            (5, "too_many_series")
        ],
        "{first:?}"
    );
    assert!(
        first.refused[0]
            .message
            .contains("longer than ingest.max-label-bytes (16)"),
        "{:?}",
        first.refused[0]
    );
    assert!(
        first.refused[1].message.contains("invalid tree"),
        "{first:?}"
    );
    let base = aggregator.url("");
    assert_eq!(ticks(&aggregator.http, &base, "kept.cpu").await, 21);
    for app in ["refused.cpu", "broken.cpu", "over.cpu"] {
        assert_eq!(ticks(&aggregator.http, &base, app).await, 0, "{app}");
    }
    // Sent again, it is a duplicate: nothing more stored, the same series named.
    let again = ack(&exchange(&conn, &frame::encode(FrameKind::Batch, &message)).await);
    assert!(again.duplicate);
    assert_eq!(again.refused.len(), 3);
    assert_eq!(ticks(&aggregator.http, &base, "kept.cpu").await, 21);

    // Every series refused: a reject that names them, and nothing stored.
    let mut all_bad = batch_of(2, &[profile(&long, "main;x", 1, at)]);
    all_bad.series.push(all_bad.series[0].clone());
    let reject = reject(&exchange(&conn, &frame::encode(FrameKind::Batch, &all_bad)).await);
    assert!(!reject.retryable);
    assert_eq!(reject.code, "refused");
    assert_eq!(reject.refused.len(), 2, "{reject:?}");
    assert!(
        reject.reason.starts_with("all 2 series were refused"),
        "{}",
        reject.reason
    );

    let metrics = Metrics::scrape(&aggregator.url("/metrics")).await;
    let dropped = |reason: &str| {
        metrics.value(
            "smolder_aggregator_dropped_series_total",
            &[("stage", "ingest"), ("reason", reason)],
        )
    };
    assert_eq!(dropped("label_too_long"), 3.0, "{metrics:?}");
    assert_eq!(dropped("invalid"), 1.0);
    assert_eq!(dropped("too_many_series"), 1.0);
    aggregator.stop().await;
}

#[tokio::test]
async fn a_batch_from_the_future_waits_at_the_agent() {
    let aggregator = Aggregator::start().await;
    let (conn, _) = welcomed(&aggregator).await;
    let ahead = SystemTime::now() + Duration::from_secs(3_600);
    let message = BatchMessage::from_profiles(
        "raw-client",
        1,
        ahead - Duration::from_secs(10),
        ahead,
        &[profile("ahead.cpu", "main", 1, ahead)],
    );
    let reject = reject(&exchange(&conn, &frame::encode(FrameKind::Batch, &message)).await);
    assert!(reject.retryable, "{reject:?}");
    assert_eq!(reject.code, "clock_skew");
    assert!(
        reject
            .reason
            .contains("more than 600 s after the aggregator's clock"),
        "{}",
        reject.reason
    );
    let metrics = Metrics::scrape(&aggregator.url("/metrics")).await;
    assert_eq!(
        metrics.value(
            "smolder_aggregator_ingest_clock_skew_rejects_total",
            &[("transport", "quic")]
        ),
        1.0
    );
    assert_eq!(
        ticks(&aggregator.http, &aggregator.url(""), "ahead.cpu").await,
        0
    );
    aggregator.stop().await;
}

/// The development certificate names the host's addresses, found on its interfaces: an
/// aggregator in a network namespace listening on every address is verified by an agent that
/// dials the namespace's address, with no `ship.server-name`.
#[tokio::test(flavor = "multi_thread")]
async fn the_development_certificate_names_the_hosts_addresses() {
    let netns = smolder_test_support::netns::Netns::create();
    let root = tempfile::tempdir().unwrap();
    let mut aggregator = crate::util::AggregatorProcess::new(root.path().join("data"));
    aggregator.http = SocketAddr::from((netns.inside, 0));
    aggregator.quic = SocketAddr::from(([0, 0, 0, 0], 0));
    aggregator.wrapper = netns.exec();
    aggregator.start(false);
    aggregator.wait_ready(&reqwest::Client::new()).await;
    let dialed = SocketAddr::from((netns.inside, aggregator.quic.port()));
    let mut config = agent_config(dialed, &aggregator.data);
    config.ship.server_name = String::new();
    let agent = agent_app::start_in(config, &root.path().join("agent"))
        .await
        .unwrap();
    agent
        .submitter()
        .submit(profile("named.cpu", "main", 1, SystemTime::now()))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "a batch acknowledged through the namespace's address",
        || async {
            agent_metrics(&agent)
                .await
                .value("smolder_agent_ship_batches_acked_total", &[])
                >= 1.0
        },
    )
    .await;
    agent.stop().await.unwrap();
}
