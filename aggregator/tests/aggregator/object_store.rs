//! Object-storage mode (`store.object-store.type: s3`) against real Garage nodes started by the
//! tests: blocks in the bucket, read back by an aggregator that has never seen them; the start
//! refused, with the reason, when the bucket cannot be used; acknowledged writes in the bucket,
//! so that an aggregator killed with its data directory deleted loses none of them, and one cut
//! off from the bucket acknowledges nothing while agents' spools cover the gap; two
//! aggregators on one bucket answering alike, a batch stored through one and sent again to the
//! other (or to both at once) counted once by flame graphs, totals and rules; an aggregator
//! killed and restarted on its data directory counting what it and the other stored; a real agent
//! configured with two aggregators failing over when the one it ships to is killed (every
//! window counted once) or cut off from its bucket (moving on at once, not after a backoff);
//! an app deleted through one aggregator deleted through every one, in heads and blocks,
//! through a kill -9 with the data directory lost, while data stamped after it shows; a
//! deletion the bucket does not answer refused within upload-timeout, holding up no write.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::StatusCode;
use smolder_aggregator::app;
use smolder_aggregator::config::{Compactor, Config, ObjectStoreConfig, S3Config};
use smolder_common::rules::RuleSpec;
use smolder_common::wire::{Ack, BatchMessage, FrameKind, Hello, frame};
use smolder_test_support::garage::{self, Garage};
use smolder_test_support::moto::Moto;
use smolder_test_support::prometheus::Metrics;
use smolder_test_support::wait::eventually;

use crate::process::{spawn_config, spawn_store, wait_ready};
use crate::quic::{ack, connect, exchange, kind};
use crate::transport::profile;
use crate::util::Aggregator;

/// A Garage node with bucket `smolder`, started off the runtime's workers.
pub(crate) async fn garage() -> Garage {
    tokio::task::spawn_blocking(|| Garage::start("smolder"))
        .await
        .expect("garage starts")
}

/// The `store.object-store` of `garage`'s bucket.
pub(crate) fn s3(garage: &Garage) -> S3Config {
    S3Config {
        bucket: garage.bucket.clone(),
        endpoint: garage.endpoint.clone(),
        region: garage::REGION.into(),
        access_key_id: garage.key_id.clone(),
        secret_access_key: garage.secret.clone(),
        ..S3Config::default()
    }
}

pub(crate) fn config(s3: S3Config) -> Config {
    let mut config = Config::default();
    config.store.object_store = ObjectStoreConfig::S3(Box::new(s3));
    config
}

/// The start of the head range (1,000 s) that began at least half an hour ago: cut at the next
/// pass, and a minute of writes from there stays in that one range (a bucket half an hour ago
/// would straddle two ranges, and make two blocks, one time in sixteen).
fn half_an_hour_ago() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    (now - 1800) / 1000 * 1000
}

/// Pushes folded `body` for `name` over `[at, at + 10)`, and asserts it was stored.
async fn ingest(agg: &Aggregator, name: &str, at: u64, body: &str) {
    let response = push(agg, name, at, body).await;
    assert_eq!(response.status(), StatusCode::OK, "ingest {name}");
}

/// Pushes folded `body` for `name` over `[at, at + 10)`; the answer, whatever it is.
async fn push(agg: &Aggregator, name: &str, at: u64, body: &str) -> reqwest::Response {
    agg.http
        .post(agg.url("/ingest"))
        .query(&[
            ("name", name),
            ("from", &at.to_string()),
            ("until", &(at + 10).to_string()),
        ])
        .body(body.to_owned())
        .send()
        .await
        .expect("ingest request")
}

#[tokio::test(flavor = "multi_thread")]
async fn blocks_go_to_the_bucket_and_an_aggregator_that_never_saw_them_reads_them() {
    let garage = garage().await;
    let writer = Aggregator::with_config(config(s3(&garage))).await;
    let at = half_an_hour_ago();
    let mut expected = Vec::new();
    for i in 0..6u64 {
        let body = format!("main;serve;handler{} {}\n", i % 3, i + 1);
        ingest(&writer, "bucketed.cpu", at + i * 10, &body).await;
    }
    for handler in 0..3u64 {
        // Each handler got the writes i ≡ handler (mod 3): (handler + 1) + (handler + 4).
        expected.push(format!("main;serve;handler{handler} {}", 2 * handler + 5));
    }
    let expected = expected.join("\n");
    assert_eq!(writer.collapsed("bucketed.cpu").await, expected);
    eventually(
        Duration::from_secs(30),
        "the head range cut into a block",
        || async {
            metrics(&writer)
                .await
                .value("smolder_aggregator_store_blocks_cut_total", &[])
                >= 1.0
        },
    )
    .await;
    writer.stop().await;

    // A new aggregator with a new data directory finds the block in the bucket.
    let reader = Aggregator::with_config(config(s3(&garage))).await;
    assert_eq!(reader.collapsed("bucketed.cpu").await, expected);
    assert_eq!(
        metrics(&reader)
            .await
            .value("smolder_aggregator_store_blocks", &[]),
        1.0
    );
    reader.stop().await;
}

/// What `app::start` says when it refuses `config`.
async fn refused(config: Config) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = config;
    config.http.listen = smolder_test_support::net::LOOPBACK_ANY_PORT;
    config.ingest.quic.listen = smolder_test_support::net::LOOPBACK_ANY_PORT;
    match app::start(config, dir.path()).await {
        Ok(running) => {
            running.stop().await.expect("stops");
            panic!("the aggregator started");
        }
        Err(err) => format!("{err:#}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bucket_that_cannot_be_used_stops_the_start_with_the_reason() {
    let garage = garage().await;

    let wrong_secret = S3Config {
        secret_access_key: "0".repeat(64),
        ..s3(&garage)
    };
    let said = refused(config(wrong_secret)).await;
    assert!(said.contains("credentials were refused"), "{said}");

    let missing = S3Config {
        bucket: "no-such-bucket".into(),
        ..s3(&garage)
    };
    let said = refused(config(missing)).await;
    assert!(said.contains("\"no-such-bucket\" not found"), "{said}");

    // A port nothing listens on: bound, then released.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let unreachable = S3Config {
        endpoint: format!("http://{closed}"),
        ..s3(&garage)
    };
    let said = refused(config(unreachable)).await;
    assert!(said.contains("did not answer"), "{said}");

    let unnamed = S3Config {
        bucket: String::new(),
        ..s3(&garage)
    };
    let said = refused(config(unnamed)).await;
    assert!(said.contains("store.object-store.bucket: empty"), "{said}");

    let half = S3Config {
        secret_access_key: String::new(),
        ..s3(&garage)
    };
    let said = refused(config(half)).await;
    assert!(said.contains("set both or neither"), "{said}");

    let patient = S3Config {
        upload_timeout: Duration::from_secs(120),
        ..s3(&garage)
    };
    let said = refused(config(patient)).await;
    assert!(
        said.contains("store.object-store.upload-timeout: must be from 1s to 60s"),
        "{said}"
    );

    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("ca.pem");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    let bad_ca = S3Config {
        ca_file: not_pem,
        ..s3(&garage)
    };
    let said = refused(config(bad_ca)).await;
    assert!(said.contains("store.object-store.ca-file"), "{said}");
}

#[tokio::test(flavor = "multi_thread")]
async fn credentials_come_from_a_shared_credentials_file() {
    let garage = garage().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("credentials");
    std::fs::write(
        &file,
        format!(
            "[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n[smolder]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            garage.key_id, garage.secret
        ),
    )
    .unwrap();
    let from_file = S3Config {
        access_key_id: String::new(),
        secret_access_key: String::new(),
        credentials_file: file.clone(),
        credentials_profile: "smolder".into(),
        ..s3(&garage)
    };
    let agg = Aggregator::with_config(config(from_file.clone())).await;
    ingest(&agg, "filed.cpu", half_an_hour_ago(), "main;work 3\n").await;
    assert_eq!(agg.collapsed("filed.cpu").await, "main;work 3");
    agg.stop().await;

    let wrong_profile = S3Config {
        credentials_profile: "default".into(),
        ..from_file.clone()
    };
    let said = refused(config(wrong_profile)).await;
    assert!(said.contains("credentials were refused"), "{said}");
    let missing_profile = S3Config {
        credentials_profile: "nobody".into(),
        ..from_file
    };
    let said = refused(config(missing_profile)).await;
    assert!(said.contains("no profile [nobody]"), "{said}");
}

/// The total of `app` over `[from, until)` at `addr`.
pub(crate) async fn total(
    http: &reqwest::Client,
    addr: SocketAddr,
    app: &str,
    from: u64,
    until: u64,
) -> u64 {
    let render: serde_json::Value = http
        .get(format!(
            "http://{addr}/render?query={app}&from={from}&until={until}&format=json"
        ))
        .send()
        .await
        .expect("GET /render")
        .json()
        .await
        .expect("render json");
    render["flamebearer"]["numTicks"].as_u64().unwrap_or(0)
}

/// Pushes `count` writes of `app` concurrently, write `i` over the 10 s from `from + 10 i` with
/// value `i + 1`; every one must be acknowledged. Returns their sum.
pub(crate) async fn push_all(
    http: &reqwest::Client,
    addr: SocketAddr,
    app: &str,
    from: u64,
    count: u64,
) -> u64 {
    let mut writes = Vec::new();
    for i in 0..count {
        let http = http.clone();
        let url = format!(
            "http://{addr}/ingest?name={app}&from={}&until={}",
            from + i * 10,
            from + i * 10 + 10
        );
        writes.push(tokio::spawn(async move {
            http.post(url)
                .body(format!("main;work;f{} {}\n", i % 4, i + 1))
                .send()
                .await
        }));
    }
    for (i, write) in writes.into_iter().enumerate() {
        let response = write.await.unwrap().expect("request completes");
        assert_eq!(response.status(), 200, "write {i} of {app}");
    }
    count * (count + 1) / 2
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_aggregator_killed_with_its_disk_deleted_loses_nothing_acknowledged() {
    let garage = garage().await;
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let store = garage.store_yaml("    poll-interval: 200ms\n    orphan-after: 2s\n");
    let http = reqwest::Client::new();
    let mut first = spawn_store(&data, &store, &[]);
    let addr = first.listening("http");
    wait_ready(&http, addr).await;

    // Writes in a closed head range (an hour ago: cut as soon as a block can be), then, once
    // those are acknowledged, in the open one (cut only after it closes).
    let closed = (now() - 3_600) / 1_000 * 1_000;
    let open = now() / 10 * 10 - 200;
    let closed_sum = push_all(&http, addr, "lost.cpu", closed, 24).await;
    let open_sum = push_all(&http, addr, "open.cpu", open, 16).await;
    first.kill();
    std::fs::remove_dir_all(&data).unwrap();

    let second = spawn_store(&data, &store, &[]);
    let addr = second.listening("http");
    wait_ready(&http, addr).await;
    // At once, from the first run's segments.
    assert_eq!(
        total(&http, addr, "lost.cpu", closed, closed + 1_000).await,
        closed_sum
    );
    assert_eq!(
        total(&http, addr, "open.cpu", open - 100, now() + 60).await,
        open_sum
    );
    // Then adopted, the closed range cut into a block, and the segments holding it deleted.
    eventually(
        Duration::from_secs(60),
        "the first run's segments adopted and cut",
        || async {
            let metrics = Metrics::scrape(&format!("http://{addr}/metrics")).await;
            metrics.value("smolder_aggregator_store_adopted_segments_total", &[]) >= 1.0
                && metrics.value("smolder_aggregator_store_blocks", &[]) >= 1.0
                && metrics.value("smolder_aggregator_store_segments_deleted_total", &[]) >= 1.0
        },
    )
    .await;
    let metrics = Metrics::scrape(&format!("http://{addr}/metrics")).await;
    assert_eq!(
        metrics.value("smolder_aggregator_store_remote_segments", &[]),
        0.0
    );
    assert_eq!(
        total(&http, addr, "lost.cpu", closed, closed + 1_000).await,
        closed_sum
    );
    assert_eq!(
        total(&http, addr, "open.cpu", open - 100, now() + 60).await,
        open_sum
    );
    drop(second);
}

/// The token both aggregators of a bucket accept from agents.
pub(crate) const TOKEN: &str = "shared-agent-token";

/// An aggregator on `garage`'s bucket that polls it often, takes a writer gone after 2 s,
/// accepts [`TOKEN`], counts `raw.cpu` in rule `raw_seconds_total`, and compacts when
/// `compactor`.
async fn on_bucket(garage: &Garage, compactor: Compactor, upload_interval: Duration) -> Aggregator {
    let mut config = config(S3Config {
        poll_interval: Duration::from_millis(200),
        orphan_after: Duration::from_secs(2),
        upload_interval,
        compactor,
        ..s3(garage)
    });
    config.ingest.quic.tokens = vec![TOKEN.to_owned()];
    config.metrics_export_rules.insert(
        "raw_seconds_total".to_owned(),
        RuleSpec {
            expr: "raw.cpu".to_owned(),
            ..RuleSpec::default()
        },
    );
    Aggregator::with_config(config).await
}

/// Sends agent batch (`raw-client`, `sequence`) of one `raw.cpu` profile of `value` over the
/// window ending at `end` to `agg`, as an agent whose ack was lost would send it again; the
/// ack.
async fn send_batch(agg: &Aggregator, sequence: u64, end: SystemTime, value: u64) -> Ack {
    send_batch_to(
        agg.quic_addr(),
        &agg.dir().join("tls/ca.pem"),
        sequence,
        end,
        value,
    )
    .await
}

/// [`send_batch`] to the aggregator listening on `addr` whose CA is `ca`.
pub(crate) async fn send_batch_to(
    addr: SocketAddr,
    ca: &std::path::Path,
    sequence: u64,
    end: SystemTime,
    value: u64,
) -> Ack {
    let conn = connect(addr, ca, None).await.expect("QUIC connects");
    let hello = frame::encode(
        FrameKind::Hello,
        &Hello {
            agent_id: "raw-client".to_owned(),
            hostname: "test".to_owned(),
            agent_version: "0".to_owned(),
            token: TOKEN.to_owned(),
        },
    );
    assert_eq!(kind(&exchange(&conn, &hello).await), FrameKind::Welcome);
    let batch = BatchMessage::from_profiles(
        "raw-client",
        sequence,
        end - Duration::from_secs(10),
        end,
        &[profile("raw.cpu", "main;raw;work", value, end)],
    );
    ack(&exchange(&conn, &frame::encode(FrameKind::Batch, &batch)).await)
}

/// `raw_seconds_total` on `agg`'s `/exported-metrics` (0 when not there yet).
async fn exported(agg: &Aggregator) -> f64 {
    agg.exported("raw_seconds_total").await.unwrap_or(0.0)
}

/// Waits until `app` totals `expected` over `[from, until)` through every aggregator of `aggs`.
async fn everywhere(aggs: &[&Aggregator], app: &str, from: u64, until: u64, expected: u64) {
    let http = reqwest::Client::new();
    for agg in aggs {
        let addr = agg.addr();
        eventually(
            Duration::from_secs(30),
            &format!("{app} = {expected} through {addr}"),
            || {
                let http = http.clone();
                async move { total(&http, addr, app, from, until).await == expected }
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn aggregators_on_one_bucket_answer_alike_and_count_a_resent_batch_once() {
    let garage = garage().await;
    let a = on_bucket(&garage, Compactor::TakesTurns, Duration::from_millis(500)).await;
    let b = on_bucket(&garage, Compactor::Never, Duration::from_millis(500)).await;
    let http = reqwest::Client::new();

    // Pushes to each, in the open head range and in a closed one (cut into blocks at once).
    let open = now() / 10 * 10 - 200;
    let closed = (now() - 3_600) / 1_000 * 1_000;
    let open_a = push_all(&http, a.addr(), "pushed_a.cpu", open, 8).await;
    let open_b = push_all(&http, b.addr(), "pushed_b.cpu", open, 6).await;
    let closed_a = push_all(&http, a.addr(), "closed.cpu", closed, 10).await;
    let closed_b = push_all(&http, b.addr(), "closed.cpu", closed + 500, 5).await;
    let until = now() + 60;
    everywhere(&[&a, &b], "pushed_a.cpu", open - 100, until, open_a).await;
    everywhere(&[&a, &b], "pushed_b.cpu", open - 100, until, open_b).await;
    everywhere(
        &[&a, &b],
        "closed.cpu",
        closed,
        closed + 1_000,
        closed_a + closed_b,
    )
    .await;

    // An agent's batch stored through A, its ack lost, sent again to B (after its ack timeout,
    // here a second: more than one upload interval): B answers that it has it, counts nothing,
    // and both count it once.
    let end = SystemTime::now() - Duration::from_secs(30);
    let first = send_batch(&a, 1, end, 7).await;
    assert!(!first.duplicate);
    let counted = exported(&a).await;
    assert!(counted > 0.0, "the rule counted the batch on A");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let again = send_batch(&b, 1, end, 7).await;
    assert!(
        again.duplicate,
        "B must find the batch A stored in the bucket"
    );
    assert_eq!(exported(&b).await, 0.0, "B counted a batch A had counted");
    assert_eq!(exported(&a).await, counted);
    let window = (unix(end) - 60, unix(end) + 60);
    everywhere(&[&a, &b], "raw.cpu", window.0, window.1, 7).await;

    // Once both closed-range blocks are cut (each aggregator cuts its own writes; A, the
    // compactor, may merge them), every total is the same through both.
    let cut = |m: Metrics| m.value("smolder_aggregator_store_blocks_cut_total", &[]) >= 1.0;
    eventually(
        Duration::from_secs(60),
        "both aggregators cut a block",
        || async { cut(metrics(&a).await) && cut(metrics(&b).await) },
    )
    .await;
    everywhere(
        &[&a, &b],
        "closed.cpu",
        closed,
        closed + 1_000,
        closed_a + closed_b,
    )
    .await;
    everywhere(&[&a, &b], "pushed_a.cpu", open - 100, until, open_a).await;
    everywhere(&[&a, &b], "raw.cpu", window.0, window.1, 7).await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_two_aggregators_accept_at_once_counts_once() {
    let garage = garage().await;
    // A long upload interval widens the race: both accept before either's segment is up.
    let a = on_bucket(&garage, Compactor::TakesTurns, Duration::from_secs(1)).await;
    let b = on_bucket(&garage, Compactor::Never, Duration::from_secs(1)).await;
    // Windows in a closed head range, so that both copies are cut into blocks at once.
    let base = SystemTime::now() - Duration::from_secs(3_600);
    let (mut expected, mut stored, mut raced) = (0, 0, 0);
    for sequence in 1..=5u64 {
        let end = base + Duration::from_secs(10 * sequence);
        let (first, second) = tokio::join!(
            send_batch(&a, sequence, end, sequence),
            send_batch(&b, sequence, end, sequence)
        );
        assert!(!(first.duplicate && second.duplicate), "one copy is stored");
        expected += sequence;
        let copies = u64::from(!first.duplicate) + u64::from(!second.duplicate);
        stored += copies * sequence;
        raced += copies - 1;
    }
    let window = (unix(base) - 60, unix(base) + 120);
    everywhere(&[&a, &b], "raw.cpu", window.0, window.1, expected).await;
    // Each copy stored was found beside the other and counted in the race metric...
    let found = |m: Metrics| {
        m.samples_of("smolder_aggregator_store_duplicate_batches_total")
            .map(|s| s.value)
            .sum::<f64>()
    };
    eventually(
        Duration::from_secs(30),
        "the raced copies counted",
        || async { found(metrics(&a).await) + found(metrics(&b).await) >= raced as f64 },
    )
    .await;
    // ...and the rules, which count a batch where it is stored once the write is acknowledged,
    // counted each stored copy: the race ARCHITECTURE.md documents (exactly the batches stored
    // twice, no more).
    let counted = exported(&a).await + exported(&b).await;
    let per_sample = exported_alone(expected).await / expected as f64;
    assert!(
        (counted - stored as f64 * per_sample).abs() < 1e-9,
        "rules counted {counted} over both aggregators; the stored copies hold {stored} samples"
    );
    // Cut into blocks (by each aggregator, its copies not found in the other's block first):
    // still once, through both, once no head holds any of it.
    let in_blocks = |m: Metrics| {
        m.value("smolder_aggregator_store_head_series", &[]) == 0.0
            && m.value("smolder_aggregator_store_remote_head_series", &[]) == 0.0
            && m.value("smolder_aggregator_store_blocks", &[]) >= 1.0
    };
    eventually(Duration::from_secs(60), "every copy in blocks", || async {
        in_blocks(metrics(&a).await) && in_blocks(metrics(&b).await)
    })
    .await;
    everywhere(&[&a, &b], "raw.cpu", window.0, window.1, expected).await;
    a.stop().await;
    b.stop().await;
}

/// What rule `raw_seconds_total` counts for `raw.cpu` batches of `total` samples on a fresh
/// aggregator: the truth the race test compares with.
async fn exported_alone(total: u64) -> f64 {
    let agg = Aggregator::with_config({
        let mut config = Config::default();
        config.ingest.quic.tokens = vec![TOKEN.to_owned()];
        config.metrics_export_rules.insert(
            "raw_seconds_total".to_owned(),
            RuleSpec {
                expr: "raw.cpu".to_owned(),
                ..RuleSpec::default()
            },
        );
        config
    })
    .await;
    send_batch(&agg, 1, SystemTime::now() - Duration::from_secs(30), total).await;
    let counted = exported(&agg).await;
    agg.stop().await;
    counted
}

fn unix(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_aggregator_cut_off_from_the_bucket_acknowledges_nothing_and_catches_up() {
    let mut garage = garage().await;
    let agg = Aggregator::with_config(config(S3Config {
        poll_interval: Duration::from_millis(200),
        orphan_after: Duration::from_secs(2),
        ..s3(&garage)
    }))
    .await;
    let state = tempfile::tempdir().unwrap();
    let agent = smolder_agent::app::start_in(
        crate::transport::agent_config(agg.quic_addr(), agg.dir()),
        state.path(),
    )
    .await
    .unwrap();
    let submitter = agent.submitter();
    let base = agg.url("");
    submitter
        .submit(profile("shipped.cpu", "main;before", 5, SystemTime::now()))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "the first batch stored",
        || async { crate::transport::ticks(&agg.http, &base, "shipped.cpu").await == 5 },
    )
    .await;
    let at = now() / 10 * 10 - 100;
    ingest(&agg, "pushed.cpu", at, "main;before 3\n").await;

    garage.kill();
    // Refused at once, as retryable: nothing it could not upload is acknowledged.
    let started = std::time::Instant::now();
    let refused = push(&agg, "pushed.cpu", at + 10, "main;during 1000\n").await;
    assert!(refused.status().is_server_error(), "{}", refused.status());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // As unavailable, with when to come back: a client (Pyroscope's SDKs, a load balancer)
    // retries rather than dropping the profiles or taking the aggregator for broken.
    assert_eq!(refused.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    let retry_after: u64 = refused
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .expect("a 503 says when to retry")
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After in seconds");
    assert!(
        (1..=60).contains(&retry_after),
        "Retry-After: {retry_after}"
    );
    let body = refused.text().await.unwrap();
    assert!(body.contains("unavailable"), "{body}");
    assert!(body.contains("retry later"), "{body}");
    // Pyroscope's SDKs push through Connect: `unavailable`, the code they retry on.
    let push = crate::sdk::push_body(
        &[("service_name", "pushed"), ("__name__", "process_cpu")],
        crate::sdk::pyroscope_rs_cpu(&[("main;during", 4)], 100),
    );
    let refused = agg
        .http
        .post(agg.url("/push.v1.PusherService/Push"))
        .header("Content-Type", "application/proto")
        .body(push)
        .send()
        .await
        .expect("push request");
    assert_eq!(refused.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.headers().contains_key(reqwest::header::RETRY_AFTER));
    let body: serde_json::Value = refused.json().await.expect("a Connect error");
    assert_eq!(body["code"], "unavailable", "{body}");
    assert!(
        metrics(&agg).await.value(
            "smolder_aggregator_store_segment_upload_failures_total",
            &[]
        ) >= 1.0
    );
    let ready = smolder_test_support::health::probe(&base, "/readyz").await;
    assert!(ready.is("store_writer", "degraded"), "{}", ready.body);
    assert_eq!(ready.status, 200, "degraded is ready:\n{}", ready.body);
    // The agent's batches of the outage wait in its spool; queries go on.
    submitter
        .submit(profile("shipped.cpu", "main;during", 7, SystemTime::now()))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "the agent's batch refused and spooled",
        || async {
            crate::transport::agent_metrics(&agent)
                .await
                .value("smolder_agent_spool_batches", &[])
                >= 1.0
        },
    )
    .await;
    assert_eq!(agg.collapsed("pushed.cpu").await, "main;before 3");

    tokio::task::block_in_place(|| garage.restart());
    submitter
        .submit(profile("shipped.cpu", "main;after", 11, SystemTime::now()))
        .await
        .unwrap();
    drop(submitter);
    eventually(
        Duration::from_secs(60),
        "the spool drained into the bucket",
        || async { crate::transport::ticks(&agg.http, &base, "shipped.cpu").await == 5 + 7 + 11 },
    )
    .await;
    assert_eq!(
        agg.collapsed("shipped.cpu").await,
        "main;after 11\nmain;before 5\nmain;during 7"
    );
    assert_eq!(agg.collapsed("pushed.cpu").await, "main;before 3");
    ingest(&agg, "pushed.cpu", at + 10, "main;after 2\n").await;
    assert_eq!(
        agg.collapsed("pushed.cpu").await,
        "main;after 2\nmain;before 3"
    );
    let ready = smolder_test_support::health::probe(&base, "/readyz").await;
    assert!(ready.is("store_writer", "running"), "{}", ready.body);
    agent.stop().await.unwrap();
    agg.stop().await;
}

async fn metrics(agg: &Aggregator) -> Metrics {
    Metrics::scrape(&agg.url("/metrics")).await
}

/// Counts of a store metric over aggregators, at `addrs`.
async fn sum_of(addrs: &[SocketAddr], name: &str) -> f64 {
    let mut sum = 0.0;
    for addr in addrs {
        let metrics = Metrics::scrape(&format!("http://{addr}/metrics")).await;
        sum += metrics.samples_of(name).map(|s| s.value).sum::<f64>();
    }
    sum
}

#[tokio::test(flavor = "multi_thread")]
async fn two_aggregators_compacting_one_range_keep_totals_exact() {
    let garage = garage().await;
    let root = tempfile::tempdir().unwrap();
    // Both configured to compact whatever the others do (as two whose views of the election
    // disagree would), every second, and delete what merges replace 20 s after it is hidden.
    let store = garage.store_yaml(
        "    poll-interval: 200ms\n    orphan-after: 2s\n    compaction-grace: 20s\n    compactor: always\n  compaction-interval: 1s\n",
    );
    let quic = format!("    tokens: [{TOKEN}]\n");
    let http = reqwest::Client::new();
    let dirs = [root.path().join("a"), root.path().join("b")];
    let aggs: Vec<_> = dirs
        .iter()
        .map(|dir| spawn_config(dir, &quic, &store, &[]))
        .collect();
    let addrs: Vec<SocketAddr> = aggs.iter().map(|p| p.listening("http")).collect();
    let quic_addrs: Vec<SocketAddr> = aggs.iter().map(|p| p.listening("quic")).collect();
    for addr in &addrs {
        wait_ready(&http, *addr).await;
    }
    // A closed 10 000 s range: every cut of it is merged at once, by both.
    let range = (now() - 5 * 3_600) / 10_000 * 10_000;
    let (mut pushed, mut raced) = (0, 0);
    let check = |pushed: u64, raced: u64| {
        let (http, addrs) = (http.clone(), addrs.clone());
        async move {
            for addr in &addrs {
                assert_eq!(
                    total(&http, *addr, "both.cpu", range, range + 10_000).await,
                    pushed,
                    "pushed totals through {addr}"
                );
                assert_eq!(
                    total(&http, *addr, "raw.cpu", range, range + 10_000).await,
                    raced,
                    "raced batches through {addr}"
                );
            }
        }
    };
    // Waves a cut apart, each into new head ranges of the range: A's and B's cuts land at
    // different times, so the two compactors merge different sets of blocks.
    for wave in 0..4u64 {
        let head = range + 2 * wave * 1_000;
        let (a, b) = tokio::join!(
            push_all(&http, addrs[0], "both.cpu", head, 8),
            push_all(&http, addrs[1], "both.cpu", head + 1_000, 6),
        );
        pushed += a + b;
        // Batches both accept (an agent that gave up on one before its ack came).
        for k in 0..3u64 {
            let sequence = wave * 10 + k + 1;
            let end = UNIX_EPOCH + Duration::from_secs(head + 500 + 10 * k);
            let ca = [dirs[0].join("tls/ca.pem"), dirs[1].join("tls/ca.pem")];
            let (first, second) = tokio::join!(
                send_batch_to(quic_addrs[0], &ca[0], sequence, end, sequence),
                send_batch_to(quic_addrs[1], &ca[1], sequence, end, sequence),
            );
            assert!(!(first.duplicate && second.duplicate), "one copy is stored");
            raced += sequence;
        }
        // Exact at every moment while both cut and merge.
        let until = std::time::Instant::now() + Duration::from_secs(12);
        while std::time::Instant::now() < until {
            check(pushed, raced).await;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    // Both merged (or tried and found the other's merge shown), and what merges replaced is
    // deleted once hidden for the grace; still exact throughout.
    let until = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        check(pushed, raced).await;
        let merged = sum_of(&addrs, "smolder_aggregator_store_compactions_total").await;
        let retired = sum_of(&addrs, "smolder_aggregator_store_blocks_retired_total").await;
        let hidden = sum_of(&addrs, "smolder_aggregator_store_blocks_hidden").await;
        let heads = sum_of(&addrs, "smolder_aggregator_store_head_series").await
            + sum_of(&addrs, "smolder_aggregator_store_remote_head_series").await;
        if merged >= 2.0 && retired >= 1.0 && hidden == 0.0 && heads == 0.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "merged {merged}, retired {retired}, hidden {hidden}, head series {heads}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for (i, addr) in addrs.iter().enumerate() {
        let metrics = Metrics::scrape(&format!("http://{addr}/metrics")).await;
        let tried = metrics.value("smolder_aggregator_store_compactions_total", &[])
            + metrics
                .samples_of("smolder_aggregator_store_merges_abandoned_total")
                .map(|s| s.value)
                .sum::<f64>();
        assert!(tried >= 1.0, "aggregator {i} never merged");
        assert_eq!(
            metrics.value("smolder_aggregator_store_compacting", &[]),
            1.0
        );
    }
    check(pushed, raced).await;
    drop(aggs);
}

#[tokio::test(flavor = "multi_thread")]
async fn of_two_compactors_one_compacts_at_a_time() {
    let garage = garage().await;
    let a = on_bucket(&garage, Compactor::TakesTurns, Duration::from_millis(500)).await;
    let b = on_bucket(&garage, Compactor::TakesTurns, Duration::from_millis(500)).await;
    // Garage overwrites conditional writes: the election, the smaller writer id compacting.
    let compacting = |m: Metrics| m.value("smolder_aggregator_store_compacting", &[]);
    eventually(Duration::from_secs(20), "one compactor elected", || async {
        compacting(metrics(&a).await) + compacting(metrics(&b).await) == 1.0
    })
    .await;
    let (leader, other) = if compacting(metrics(&a).await) == 1.0 {
        (a, b)
    } else {
        (b, a)
    };
    // The leader stops: the other takes over once its heartbeat is orphan-after old.
    leader.stop().await;
    eventually(
        Duration::from_secs(20),
        "the other compactor elected",
        || async { compacting(metrics(&other).await) == 1.0 },
    )
    .await;
    other.stop().await;
}

/// On a store that honours conditional writes (moto's S3 server) compactors take turns
/// through the lease: each says so at start, one at a time holds the lease and compacts (never
/// two at once), and when the holder is killed the other takes the lease over once it is a
/// time to live old. Pushes through both meanwhile total exactly what was acknowledged.
#[tokio::test(flavor = "multi_thread")]
async fn on_a_store_with_conditional_writes_compactors_take_turns_through_the_lease() {
    let moto = tokio::task::spawn_blocking(|| Moto::start("smolder"))
        .await
        .expect("moto starts");
    let root = tempfile::tempdir().unwrap();
    let store = moto.store_yaml(
        "    poll-interval: 200ms\n    orphan-after: 5s\n    compaction-grace: 20s\n  compaction-interval: 1s\n",
    );
    let http = reqwest::Client::new();
    let mut aggs: Vec<_> = ["a", "b"]
        .iter()
        .map(|name| spawn_store(&root.path().join(name), &store, &[]))
        .collect();
    let addrs: Vec<SocketAddr> = aggs.iter().map(|p| p.listening("http")).collect();
    for (agg, addr) in aggs.iter().zip(&addrs) {
        wait_ready(&http, *addr).await;
        agg.wait_for_line("the lease mode", |line| {
            line.contains("compactors take turns through a lease")
        });
    }
    // Each aggregator's compacting gauge and count of merges; never two holders at once.
    let roles = |alive: Vec<SocketAddr>| async move {
        let mut roles = Vec::new();
        for addr in alive {
            let metrics = Metrics::scrape(&format!("http://{addr}/metrics")).await;
            roles.push((
                metrics.value("smolder_aggregator_store_compacting", &[]),
                metrics.value("smolder_aggregator_store_compactions_total", &[]),
            ));
        }
        let holders: f64 = roles.iter().map(|(compacting, _)| compacting).sum();
        assert!(holders <= 1.0, "two lease holders at once: {roles:?}");
        roles
    };
    eventually(Duration::from_secs(20), "one lease holder", || async {
        roles(addrs.clone()).await.iter().map(|r| r.0).sum::<f64>() == 1.0
    })
    .await;

    // A closed range, written through both: the holder merges the two aggregators' cuts.
    let range = (now() - 5 * 3_600) / 10_000 * 10_000;
    let pushed = push_all(&http, addrs[0], "lease.cpu", range, 6).await
        + push_all(&http, addrs[1], "lease.cpu", range + 1_000, 6).await;
    eventually(Duration::from_secs(60), "a merge by the holder", || async {
        roles(addrs.clone()).await.iter().map(|r| r.1).sum::<f64>() >= 1.0
    })
    .await;

    // The holder killed: the other takes the lease over, and merges what comes next.
    let deadline = Instant::now() + Duration::from_secs(20);
    let holder = loop {
        if let Some(holder) = roles(addrs.clone()).await.iter().position(|r| r.0 == 1.0) {
            break holder;
        }
        assert!(Instant::now() < deadline, "no lease holder for 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let other = addrs[1 - holder];
    aggs[holder].kill();
    eventually(Duration::from_secs(30), "the lease taken over", || async {
        roles(vec![other]).await[0].0 == 1.0
    })
    .await;
    let merged = roles(vec![other]).await[0].1;
    let pushed = pushed + push_all(&http, other, "lease.cpu", range + 2_000, 6).await;
    eventually(
        Duration::from_secs(60),
        "a merge by the new holder",
        || async { roles(vec![other]).await[0].1 > merged },
    )
    .await;
    eventually(
        Duration::from_secs(20),
        "every push counted once",
        || async { total(&http, other, "lease.cpu", range, range + 10_000).await == pushed },
    )
    .await;
    drop(aggs);
}

/// Two aggregator processes on `garage`'s bucket, accepting [`TOKEN`] and sharing one TLS
/// identity (the bucket's development CA), so that one agent trusts both.
async fn two_on_one_bucket(
    garage: &Garage,
    root: &std::path::Path,
    http: &reqwest::Client,
) -> [crate::util::AggregatorProcess; 2] {
    let extra = format!(
        "    tokens: [{TOKEN}]\nstore:\n{}",
        garage.store_yaml("    poll-interval: 200ms\n    orphan-after: 2s\n")
    );
    let mut first = crate::util::AggregatorProcess::new(root.join("a"));
    first.extra = extra.clone();
    first.start(false);
    first.wait_ready(http).await;
    let mut second = crate::util::AggregatorProcess::new(root.join("b"));
    second.extra = extra;
    second.start(false);
    second.wait_ready(http).await;
    [first, second]
}

/// `smolder_agent_ship_aggregator_info`'s address: where the agent ships now.
pub(crate) async fn current_aggregator(agent: &smolder_agent::app::Running) -> Option<SocketAddr> {
    aggregator_in(&crate::transport::agent_metrics(agent).await)
}

/// The aggregator an agent whose `/metrics` are `metrics` ships to now.
pub(crate) fn aggregator_in(metrics: &Metrics) -> Option<SocketAddr> {
    metrics
        .samples_of("smolder_agent_ship_aggregator_info")
        .find(|sample| sample.value == 1.0)
        .and_then(|sample| sample.labels.get("address")?.parse().ok())
}

/// An agent configured with both aggregators of [`two_on_one_bucket`].
fn agent_of_both(aggs: &[crate::util::AggregatorProcess; 2]) -> smolder_agent::config::Config {
    let mut config = crate::transport::agent_config(aggs[0].quic, &aggs[0].data);
    config.ship.aggregator = smolder_agent::config::ShipConfig::default().aggregator;
    config.ship.aggregators = aggs.iter().map(|agg| agg.quic.to_string()).collect();
    config.ship.token = TOKEN.to_owned();
    config
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_fails_over_when_its_aggregator_is_killed_and_every_window_counts_once() {
    let garage = garage().await;
    let root = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let mut aggs = two_on_one_bucket(&garage, root.path(), &http).await;
    let agent = smolder_agent::app::start_in(agent_of_both(&aggs), &root.path().join("agent"))
        .await
        .unwrap();

    // A steady stream of profiles, a window every 250 ms, for 20 s.
    let producer = crate::transport::steady_profiles(
        &agent,
        "failover.cpu",
        Duration::from_millis(20),
        tokio::time::sleep(Duration::from_secs(20)),
    );
    eventually(Duration::from_secs(20), "batches acknowledged", || async {
        crate::transport::agent_metrics(&agent)
            .await
            .value("smolder_agent_ship_batches_acked_total", &[])
            >= 4.0
    })
    .await;
    let on = current_aggregator(&agent)
        .await
        .expect("an aggregator is current");
    let (dead, alive) = if aggs[0].quic == on { (0, 1) } else { (1, 0) };
    assert_eq!(aggs[dead].quic, on, "the agent ships to one of the two");
    let acked_before = crate::transport::agent_metrics(&agent)
        .await
        .value("smolder_agent_ship_batches_acked_total", &[]);
    aggs[dead].kill();
    let killed = std::time::Instant::now();
    let other = aggs[alive].quic;
    eventually(
        Duration::from_secs(30),
        "the agent on the other aggregator",
        || async {
            let metrics = crate::transport::agent_metrics(&agent).await;
            current_aggregator(&agent).await == Some(other)
                && metrics.value("smolder_agent_ship_connected", &[]) == 1.0
                && metrics.value("smolder_agent_ship_batches_acked_total", &[]) > acked_before + 1.0
        },
    )
    .await;
    let failover = killed.elapsed();
    eprintln!("failed over in {failover:?}");
    assert!(failover < Duration::from_secs(30), "{failover:?}");
    let metrics = crate::transport::agent_metrics(&agent).await;
    assert!(
        metrics.value("smolder_agent_ship_failovers_total", &[("reason", "lost")]) >= 1.0,
        "{metrics:?}"
    );
    let ready =
        smolder_test_support::health::probe(&format!("http://{}", agent.addr()), "/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.body);

    let produced = producer.await.unwrap();
    let base = aggs[alive].base();
    eventually(Duration::from_secs(60), "every window stored", || async {
        crate::transport::agent_metrics(&agent)
            .await
            .value("smolder_agent_spool_batches", &[])
            == 0.0
            && crate::transport::ticks(&http, &base, "failover.cpu").await >= produced
    })
    .await;
    // Once: the batches the killed aggregator stored but could not acknowledge were sent again
    // to the other, and count once, through it and through a third aggregator started on the
    // bucket now, which reads what both stored.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        crate::transport::ticks(&http, &base, "failover.cpu").await,
        produced
    );
    let mut third = crate::util::AggregatorProcess::new(root.path().join("c"));
    third.extra = aggs[alive].extra.clone();
    third.start(false);
    third.wait_ready(&http).await;
    let base = third.base();
    eventually(
        Duration::from_secs(30),
        "the same total through a third aggregator",
        || async { crate::transport::ticks(&http, &base, "failover.cpu").await == produced },
    )
    .await;
    let metrics = crate::transport::agent_metrics(&agent).await;
    assert_eq!(
        metrics.value("smolder_agent_dropped_batches_total", &[]),
        0.0,
        "{metrics:?}"
    );
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_aggregator_restarted_on_its_data_directory_counts_what_every_writer_stored() {
    let garage = garage().await;
    let root = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let [mut a, b] = two_on_one_bucket(&garage, root.path(), &http).await;
    let send = |agg: &crate::util::AggregatorProcess, sequence: u64, value: u64| {
        let (addr, ca) = (agg.quic, agg.data.join("tls/ca.pem"));
        let end = SystemTime::now() - Duration::from_secs(30);
        async move { send_batch_to(addr, &ca, sequence, end, value).await }
    };
    let window = (now() - 120, now() + 60);
    let total_at = |agg: &crate::util::AggregatorProcess| {
        let (http, addr) = (http.clone(), agg.http);
        async move { total(&http, addr, "raw.cpu", window.0, window.1).await }
    };

    // A stores batches 1-4 (in segments only: the head range is open), and is killed.
    let mut truth = 0;
    for sequence in 1..=4 {
        assert!(!send(&a, sequence, sequence).await.duplicate);
        truth += sequence;
    }
    a.kill();
    // B finds batch 4, whose ack A lost, in A's segments (sent after an agent's ack timeout,
    // here a second: more than one upload interval); it stores 5-8.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(send(&b, 4, 4).await.duplicate, "A stored batch 4");
    for sequence in 5..=8 {
        assert!(!send(&b, sequence, sequence).await.duplicate);
        truth += sequence;
    }
    eventually(Duration::from_secs(30), "B counts every batch", || async {
        total_at(&b).await == truth
    })
    .await;

    // A, restarted on its data directory, is a new writer: the batch markers its earlier run
    // left there must not hide that run's segments (nor B's copies) from it. It reads the
    // bucket at open; a poll interval (200 ms) more is allowed for.
    a.start(false);
    a.wait_ready(&http).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while total_at(&a).await != truth && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        total_at(&a).await,
        truth,
        "the restarted aggregator counts every batch"
    );
    assert_eq!(total_at(&b).await, truth);
    assert!(
        send(&a, 2, 2).await.duplicate,
        "A's earlier run stored batch 2"
    );
    // Adopted (by whichever of the two has the smallest writer id), and still counted once.
    let adopted = |m: Metrics| m.value("smolder_aggregator_store_adopted_segments_total", &[]);
    eventually(
        Duration::from_secs(30),
        "the earlier run's segments adopted",
        || async {
            let (on_a, on_b) = (
                Metrics::scrape(&format!("{}/metrics", a.base())).await,
                Metrics::scrape(&format!("{}/metrics", b.base())).await,
            );
            adopted(on_a) + adopted(on_b) >= 1.0
        },
    )
    .await;
    assert_eq!(total_at(&a).await, truth);
    assert_eq!(total_at(&b).await, truth);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_moves_on_at_once_from_an_aggregator_cut_off_from_its_bucket() {
    // Each aggregator on its own Garage node, so that one can be cut off from its bucket while
    // the other works; one TLS identity and token for both.
    let (first_garage, second_garage) = tokio::join!(garage(), garage());
    let mut garages = [first_garage, second_garage];
    let on = |garage: &Garage| {
        let mut config = config(S3Config {
            poll_interval: Duration::from_millis(200),
            orphan_after: Duration::from_secs(2),
            ..s3(garage)
        });
        config.ingest.quic.tokens = vec![TOKEN.to_owned()];
        config
    };
    let first = Aggregator::with_config(on(&garages[0])).await;
    let mut second = on(&garages[1]);
    second.ingest.quic.cert = Some(first.dir().join("tls/server.pem"));
    second.ingest.quic.key = Some(first.dir().join("tls/server.key"));
    let second = Aggregator::with_config(second).await;
    let aggs = [&first, &second];

    let mut config = crate::transport::agent_config(first.quic_addr(), first.dir());
    config.ship.aggregator = smolder_agent::config::ShipConfig::default().aggregator;
    config.ship.aggregators = aggs.iter().map(|a| a.quic_addr().to_string()).collect();
    config.ship.token = TOKEN.to_owned();
    // A backoff far longer than the move may take: the move does not wait for it.
    config.ship.backoff_min = Duration::from_secs(30);
    config.ship.backoff_max = Duration::from_secs(30);
    // One batch in flight: the refused one. The buckets are apart here, so a batch stored by
    // one aggregator and sent again to the other would count twice (on one bucket it counts
    // once, as the kill test shows).
    config.ship.max_batches_in_flight = 1;
    let state = tempfile::tempdir().unwrap();
    let agent = smolder_agent::app::start_in(config, state.path())
        .await
        .unwrap();
    let submitter = agent.submitter();
    let mut produced = 0;
    let mut submit = |i: u64| {
        produced += i % 5 + 1;
        profile("cutoff.cpu", "main;work", i % 5 + 1, SystemTime::now())
    };
    let mut i = 0;
    while crate::transport::agent_metrics(&agent)
        .await
        .value("smolder_agent_ship_batches_acked_total", &[])
        < 2.0
    {
        submitter.submit(submit(i)).await.unwrap();
        i += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(i < 80, "no batch acknowledged in 20 s");
    }
    let current = current_aggregator(&agent)
        .await
        .expect("a current aggregator");
    let (cut, other) = if current == first.quic_addr() {
        (0, 1)
    } else {
        (1, 0)
    };
    garages[cut].kill();
    let killed = std::time::Instant::now();
    let acked = crate::transport::agent_metrics(&agent)
        .await
        .value("smolder_agent_ship_batches_acked_total", &[]);
    loop {
        submitter.submit(submit(i)).await.unwrap();
        i += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
        let metrics = crate::transport::agent_metrics(&agent).await;
        if current_aggregator(&agent).await == Some(aggs[other].quic_addr())
            && metrics.value("smolder_agent_ship_batches_acked_total", &[]) > acked
        {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "not on the other aggregator 20 s after the bucket went: {metrics:?}"
        );
    }
    let moved = killed.elapsed();
    eprintln!("moved on in {moved:?}");
    let metrics = crate::transport::agent_metrics(&agent).await;
    assert!(
        metrics.value(
            "smolder_agent_ship_failovers_total",
            &[("reason", "unavailable")]
        ) >= 1.0,
        "{metrics:?}"
    );
    assert!(
        metrics.value(
            "smolder_agent_ship_batches_rejected_total",
            &[("retryable", "true")]
        ) >= 1.0
    );
    // A few more windows on the other, then the bucket back: nothing was lost, nothing counted
    // twice, over the two buckets.
    for _ in 0..4 {
        submitter.submit(submit(i)).await.unwrap();
        i += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    drop(submitter);
    tokio::task::block_in_place(|| garages[cut].restart());
    let http = reqwest::Client::new();
    let (a, b) = (first.url(""), second.url(""));
    eventually(
        Duration::from_secs(60),
        "every window stored once",
        || async {
            crate::transport::agent_metrics(&agent)
                .await
                .value("smolder_agent_spool_batches", &[])
                == 0.0
                && crate::transport::ticks(&http, &a, "cutoff.cpu").await
                    + crate::transport::ticks(&http, &b, "cutoff.cpu").await
                    == produced
        },
    )
    .await;
    agent.stop().await.unwrap();
    first.stop().await;
    second.stop().await;
}

/// Bytes of the files under `dir`, recursively.
fn bytes_under(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => bytes_under(&entry.path()),
            Ok(meta) => meta.len(),
            Err(_) => 0,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_block_cache_smaller_than_the_data_answers_exactly_and_keeps_its_bound() {
    const RANGES: u64 = 8;
    let garage = garage().await;
    // The writer compacts once, at start (nothing to merge yet), so that each range stays one
    // block of about the same size.
    let mut writer_config = config(s3(&garage));
    writer_config.store.compaction_interval = Duration::from_secs(3_600);
    let writer = Aggregator::with_config(writer_config).await;
    let first = (now() - 86_400) / 1_000 * 1_000;
    let range_start = |range: u64| first + range * 3 * 1_000;
    let mut sums = Vec::new();
    for range in 0..RANGES {
        let mut sum = 0;
        for i in 0..12u64 {
            let value = range * 100 + i + 1;
            let body = format!(
                "main;serve;route{};handler{} {value}\nmain;gc;sweep{} {value}\n",
                i % 5,
                (i + range) % 7,
                range
            );
            ingest(&writer, "cached.cpu", range_start(range) + i * 10, &body).await;
            sum += 2 * value;
        }
        sums.push(sum);
    }
    eventually(
        Duration::from_secs(60),
        "every range cut into a block",
        || async {
            metrics(&writer)
                .await
                .value("smolder_aggregator_store_blocks_cut_total", &[])
                >= RANGES as f64
        },
    )
    .await;
    let data = metrics(&writer)
        .await
        .value("smolder_aggregator_store_block_bytes", &[]) as u64;
    writer.stop().await;

    // A reader that never saw the blocks, with room for five of the eight (each under a quarter
    // of the cache, so downloaded whole).
    let bound = data * 5 / 8;
    let mut s3 = s3(&garage);
    s3.block_cache_bytes = bound;
    s3.compactor = Compactor::Never;
    let reader = Aggregator::with_config(config(s3)).await;
    let cache = reader.dir().join("cache").join("blocks");
    let check_bound = |when: &str| {
        let on_disk = bytes_under(&cache);
        assert!(
            on_disk <= bound,
            "{when}: {on_disk} bytes in the block cache, bound {bound}"
        );
    };
    let http = reqwest::Client::new();
    let end = range_start(RANGES);
    for pass in 0..2 {
        for (range, sum) in sums.iter().enumerate() {
            let from = range_start(range as u64);
            let got = total(&http, reader.addr(), "cached.cpu", from, from + 1_000).await;
            assert_eq!(got, *sum, "pass {pass}, range {range}");
            check_bound(&format!("pass {pass}, range {range}"));
        }
        let all = total(&http, reader.addr(), "cached.cpu", first, end).await;
        assert_eq!(all, sums.iter().sum::<u64>(), "pass {pass}, the whole day");
        check_bound(&format!("pass {pass}, the whole day"));
    }
    let seen = metrics(&reader).await;
    let value = |name: &str| seen.value(name, &[]);
    assert!(
        value("smolder_aggregator_store_block_cache_bytes") <= bound as f64,
        "the gauge is within the bound"
    );
    assert_eq!(
        value("smolder_aggregator_store_block_cache_limit_bytes"),
        bound as f64
    );
    assert!(
        value("smolder_aggregator_store_block_cache_evictions_total") >= 1.0,
        "blocks were evicted"
    );
    assert!(
        value("smolder_aggregator_store_block_cache_downloads_total") > RANGES as f64,
        "evicted blocks were downloaded again"
    );
    assert!(value("smolder_aggregator_store_block_cache_hits_total") >= 1.0);
    assert!(
        seen.value(
            "smolder_aggregator_store_object_requests_total",
            &[("op", "get"), ("outcome", "ok")]
        ) >= RANGES as f64,
        "downloads are counted as GETs"
    );
    assert!(
        seen.value(
            "smolder_aggregator_store_object_requests_total",
            &[("op", "get_range"), ("outcome", "ok")]
        ) >= RANGES as f64,
        "opening a block without its copy reads its end"
    );
    reader.stop().await;
}

/// `DELETE /api/apps` of `app` at `base`: its status.
async fn delete_app(http: &reqwest::Client, base: &str, app: &str) -> StatusCode {
    http.delete(format!("{base}/api/apps"))
        .body(format!(r#"{{"name":"{app}"}}"#))
        .send()
        .await
        .expect("DELETE /api/apps")
        .status()
}

/// The app names `GET /api/apps` lists at `base`.
async fn app_names(http: &reqwest::Client, base: &str) -> Vec<String> {
    let apps: serde_json::Value = http
        .get(format!("{base}/api/apps"))
        .send()
        .await
        .expect("GET /api/apps")
        .json()
        .await
        .expect("apps json");
    apps.as_array()
        .expect("a list")
        .iter()
        .filter_map(|app| app["name"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_app_deleted_through_one_aggregator_is_deleted_through_every_one_and_stays_deleted() {
    let garage = garage().await;
    let root = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let [mut a, b] = two_on_one_bucket(&garage, root.path(), &http).await;
    let total_at = |addr: SocketAddr, app: &'static str, from: u64, until: u64| {
        let http = http.clone();
        async move { total(&http, addr, app, from, until).await }
    };

    // Before the deletion: `gone.cpu` in a block A cut, in both heads (the open range), and
    // in B's head in a closed range that B cuts only after the deletion; `kept.cpu` beside it.
    let closed = (now() - 7_200) / 1_000 * 1_000;
    let later_closed = closed + 3_000;
    let open = now() / 10 * 10 - 200;
    let gone_closed = push_all(&http, a.http, "gone.cpu", closed, 12).await;
    let kept_closed = push_all(&http, a.http, "kept.cpu", closed, 5).await;
    eventually(Duration::from_secs(60), "A cut its block", || async {
        Metrics::scrape(&format!("{}/metrics", a.base()))
            .await
            .value("smolder_aggregator_store_blocks_cut_total", &[])
            >= 1.0
    })
    .await;
    let gone_open = push_all(&http, a.http, "gone.cpu", open, 6).await
        + push_all(&http, b.http, "gone.cpu", open + 60, 4).await;
    let until = now() + 60;
    let everything = (closed, until);
    for agg in [&a, &b] {
        let want = gone_closed + gone_open;
        eventually(
            Duration::from_secs(30),
            "every gone.cpu write seen",
            || async { total_at(agg.http, "gone.cpu", everything.0, everything.1).await == want },
        )
        .await;
    }
    // B cuts every 10 s: what it stores now is in its head when the deletion comes (but for
    // the rare cut that falls in between), and in a block cut after it.
    let cut_by_b = |m: Metrics| m.value("smolder_aggregator_store_blocks_cut_total", &[]);
    let b_cuts = cut_by_b(Metrics::scrape(&format!("{}/metrics", b.base())).await);
    assert!(push_all(&http, b.http, "gone.cpu", later_closed, 7).await > 0);
    let kept_later = push_all(&http, b.http, "kept.cpu", later_closed, 3).await;

    // Deleted through A: answered once durable, then gone through B within a few polls.
    let asked = std::time::Instant::now();
    assert_eq!(
        delete_app(&http, &a.base(), "gone.cpu").await,
        StatusCode::OK
    );
    let deleted_at = now();
    assert_eq!(
        total_at(a.http, "gone.cpu", everything.0, everything.1).await,
        0
    );
    eventually(
        Duration::from_secs(10),
        "gone.cpu gone through B",
        || async { total_at(b.http, "gone.cpu", everything.0, everything.1).await == 0 },
    )
    .await;
    eprintln!(
        "deletion seen through the other aggregator after {:?}",
        asked.elapsed()
    );
    for agg in [&a, &b] {
        assert!(
            !app_names(&http, &agg.base())
                .await
                .contains(&"gone.cpu".to_owned())
        );
        // B's last writes reach A with its next poll.
        let kept = kept_closed + kept_later;
        eventually(Duration::from_secs(10), "kept.cpu whole", || async {
            total_at(agg.http, "kept.cpu", everything.0, everything.1).await == kept
        })
        .await;
        assert_eq!(
            Metrics::scrape(&format!("{}/metrics", agg.base()))
                .await
                .value("smolder_aggregator_store_app_deletions", &[]),
            1.0
        );
    }
    // Nothing left to delete: no such app.
    assert_eq!(
        delete_app(&http, &b.base(), "gone.cpu").await,
        StatusCode::NOT_FOUND
    );
    // B cuts the range it held `gone.cpu` in when the deletion came: its block shows none of it.
    eventually(Duration::from_secs(60), "B cut its block", || async {
        cut_by_b(Metrics::scrape(&format!("{}/metrics", b.base())).await) > b_cuts
    })
    .await;

    // Late data stamped before the horizon (a spool's backlog) is deleted too; data stamped
    // after the deletion shows, everywhere.
    let late = push_all(&http, b.http, "gone.cpu", open + 120, 3).await;
    assert!(late > 0);
    let after = loop {
        let at = now() / 10 * 10;
        if at >= deleted_at.div_ceil(10) * 10 + 10 {
            break at;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let fresh = push_all(&http, a.http, "gone.cpu", after, 2).await
        + push_all(&http, b.http, "gone.cpu", after + 20, 2).await;
    let until = now() + 60;
    for agg in [&a, &b] {
        eventually(Duration::from_secs(30), "only the new data", || async {
            total_at(agg.http, "gone.cpu", closed, until).await == fresh
        })
        .await;
    }

    // A killed -9, its data directory deleted, restarted: its segments (read back, then
    // adopted) and the blocks still show only what came after the deletion.
    a.kill();
    std::fs::remove_dir_all(&a.data).unwrap();
    a.start(false);
    a.wait_ready(&http).await;
    let adopted = |m: Metrics| m.value("smolder_aggregator_store_adopted_segments_total", &[]);
    eventually(
        Duration::from_secs(60),
        "the killed run's segments adopted",
        || async {
            adopted(Metrics::scrape(&format!("{}/metrics", a.base())).await)
                + adopted(Metrics::scrape(&format!("{}/metrics", b.base())).await)
                >= 1.0
        },
    )
    .await;
    for agg in [&a, &b] {
        eventually(
            Duration::from_secs(30),
            "still only the new data",
            || async { total_at(agg.http, "gone.cpu", closed, until).await == fresh },
        )
        .await;
        assert_eq!(
            total_at(agg.http, "kept.cpu", everything.0, everything.1).await,
            kept_closed + kept_later
        );
    }
    assert_eq!(
        Metrics::scrape(&format!("{}/metrics", a.base()))
            .await
            .value("smolder_aggregator_store_app_deletions", &[]),
        1.0,
        "the restarted aggregator read the deletion from the bucket"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_app_deletion_the_bucket_does_not_answer_holds_up_no_write() {
    let garage = garage().await;
    // A bucket that does not answer makes a request wait up to request-timeout (and retries up
    // to three times that); the deletion and the writes wait at most upload-timeout.
    let request_timeout = Duration::from_secs(20);
    let agg = Aggregator::with_config(config(S3Config {
        request_timeout,
        upload_timeout: Duration::from_secs(2),
        ..s3(&garage)
    }))
    .await;
    let at = now() / 10 * 10 - 100;
    ingest(&agg, "gone.cpu", at, "main;old 3\n").await;
    ingest(&agg, "kept.cpu", at, "main;kept 5\n").await;

    garage.pause();
    let deleting = {
        let (http, base) = (agg.http.clone(), agg.url(""));
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let response = http
                .delete(format!("{base}/api/apps"))
                .body(r#"{"name":"gone.cpu"}"#)
                .send()
                .await
                .expect("DELETE /api/apps");
            (response, started.elapsed())
        })
    };
    // The deletion reaches the store first (were it later, the write would only show less).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    let write = push(&agg, "during.cpu", at + 10, "main;during 1\n").await;
    let waited = started.elapsed();
    assert_eq!(write.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        waited < request_timeout,
        "a write waited {waited:?} behind the deletion"
    );
    let (deleted, waited) = deleting.await.expect("the deletion's task");
    assert_eq!(deleted.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(deleted.headers().contains_key(reqwest::header::RETRY_AFTER));
    assert!(
        waited < request_timeout,
        "the deletion waited {waited:?} for the bucket"
    );

    // Once the bucket answers, asking again deletes the app (or finds it deleted already: the
    // refused request's object may have been written all the same, and read at a poll).
    garage.resume();
    eventually(Duration::from_secs(60), "the deletion taken", || async {
        let status = delete_app(&agg.http, &agg.url(""), "gone.cpu").await;
        status == StatusCode::OK || status == StatusCode::NOT_FOUND
    })
    .await;
    assert_eq!(agg.collapsed("gone.cpu").await, "");
    assert!(
        !app_names(&agg.http, &agg.url(""))
            .await
            .contains(&"gone.cpu".to_owned())
    );
    assert_eq!(agg.collapsed("kept.cpu").await, "main;kept 5");
    agg.stop().await;
}

/// A segment whose upload timed out while the bucket stalled may be committed by the store
/// once it answers again (Garage reads the request its client gave up on): the aggregator that
/// refused its writes then reads it back and shows it as the other aggregator of the bucket
/// does, or, had it not landed, neither shows it. Either way the two answer alike, and the
/// refused write sent again is stored.
#[tokio::test(flavor = "multi_thread")]
async fn a_segment_that_lands_after_its_upload_failed_is_shown_alike_everywhere() {
    let garage = garage().await;
    let on = |upload_timeout| {
        config(S3Config {
            poll_interval: Duration::from_millis(200),
            orphan_after: Duration::from_secs(30),
            upload_timeout,
            request_timeout: Duration::from_secs(20),
            ..s3(&garage)
        })
    };
    let a = Aggregator::with_config(on(Duration::from_secs(1))).await;
    let b = Aggregator::with_config(on(Duration::from_secs(5))).await;
    let at = now() / 10 * 10 - 100;
    ingest(&a, "late.cpu", at, "main;before 3\n").await;
    everywhere(&[&a, &b], "late.cpu", at, at + 100, 3).await;

    garage.pause();
    let refused = push(&a, "late.cpu", at + 10, "main;stalled 7\n").await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        metrics(&a)
            .await
            .value("smolder_aggregator_store_segments_doubtful", &[]),
        1.0
    );
    garage.resume();

    // Whatever the store made of the stalled PUT, the aggregator settles it: read back once a
    // listing shows it, or found absent by a full listing (every minute) 30 s after the failure.
    eventually(
        Duration::from_secs(150),
        "the stalled segment settled",
        || async {
            metrics(&a)
                .await
                .value("smolder_aggregator_store_segments_doubtful", &[])
                == 0.0
        },
    )
    .await;
    let landed = metrics(&a)
        .await
        .value("smolder_aggregator_store_segments_landed_late_total", &[]);
    let settled = if landed == 1.0 { 10 } else { 3 };
    // And both aggregators answer alike.
    everywhere(&[&a, &b], "late.cpu", at, at + 100, settled).await;
    eprintln!(
        "the stalled segment {}",
        if settled == 10 {
            "landed once the bucket answered, and was read back"
        } else {
            "never reached the bucket"
        }
    );
    // The client sends it again, as told: stored, and shown alike.
    ingest(&a, "late.cpu", at + 20, "main;again 5\n").await;
    everywhere(&[&a, &b], "late.cpu", at, at + 100, settled + 5).await;
    a.stop().await;
    b.stop().await;
}
