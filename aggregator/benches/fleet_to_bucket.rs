//! Object-storage mode against a real single-node Garage the bench starts, with release
//! aggregator processes, each figure beside local mode's from the same run:
//!
//! - `acks`: a fleet (`smolder-fleet`: simulated agents over QUIC, Pyroscope pushes over HTTP)
//!   at a realistic rate for `SMOLDER_BENCH_MINUTES`, against an aggregator in local mode, then
//!   one on the bucket: ack latency p50/p99 of agent batches (stream opened to ack) and of
//!   pushes (request to answer), every series then checked against the query API; and, in
//!   object-storage mode, the bucket's requests by operation (the aggregator's
//!   `smolder_aggregator_store_object_requests_total`) per second and per ingested MiB (QUIC
//!   batches and push bodies as received).
//! - `day`: a day of one app at 10 s (`SMOLDER_BENCH_BUCKETS`, 8,640 folded bodies of 6,000
//!   samples, as `ingest_http_to_query`) written into each store and left to cut and compact;
//!   then `/render` over the 24 h: warm on the aggregator that wrote it, and cold on
//!   `SMOLDER_BENCH_COLD` fresh aggregators that never saw the blocks (a new data directory:
//!   nothing cached), each followed by warm renders; local mode's baseline is a restart on its
//!   data directory. Also the bucket's bytes after the day, the requests the day cost
//!   (segments, cuts, compaction), and what a cold render downloaded.
//!
//! ```sh
//! cargo bench -p smolder-aggregator --bench fleet_to_bucket            # both
//! SMOLDER_BENCH_MINUTES=1 SMOLDER_BENCH_BUCKETS=2000 cargo bench -p smolder-aggregator --bench fleet_to_bucket -- day
//! ```
//!
//! Other knobs: `SMOLDER_BENCH_AGENTS` (100) and `SMOLDER_BENCH_PUSHES` per second (20): a
//! hundred hosts and their SDK clients; `SMOLDER_BENCH_WARM` renders per warm figure (20). Needs
//! Garage 2.5.0 (`cargo install garage --version 2.5.0 --locked`). A scenario, not a
//! micro-benchmark: it prints Markdown tables for BENCHMARKS.md.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use smolder_common::{Corpus, CorpusConfig, to_folded};
use smolder_fleet::process::{self, Usage};
use smolder_fleet::{Fleet, FleetConfig, Quantiles, verify};
use smolder_test_support::env_or;
use smolder_test_support::garage::Garage;
use smolder_test_support::prometheus::Metrics;

/// Distinct bucket bodies of the day; it cycles through them.
const BODIES: usize = 48;
/// Samples per 10 s bucket of the day, as `ingest_http_to_query`.
const SAMPLES: usize = 6_000;
/// Concurrent writers of the day: in object-storage mode a write waits for its segment's
/// upload, so the day needs more of them than `ingest_http_to_query`'s four to go at speed.
const CLIENTS: u64 = 16;
const REQUESTS: &str = "smolder_aggregator_store_object_requests_total";

fn main() {
    let runs: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| ["acks", "day"].contains(&a.as_str()))
        .collect();
    let wants = |run: &str| runs.is_empty() || runs.iter().any(|r| r == run);
    let garage = Garage::start("smolder");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        println!(
            "# fleet_to_bucket: Garage {} on loopback; load average {:.2}",
            smolder_test_support::garage::VERSION,
            process::load_average()
        );
        if wants("acks") {
            acks(&garage).await;
        }
        if wants("day") {
            day(&garage).await;
        }
        println!("\nload average at the end {:.2}", process::load_average());
    });
}

/// Where a run keeps its blocks.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Local,
    Bucket,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Local => "local",
            Mode::Bucket => "object storage",
        }
    }
}

/// The `store:` lines of `mode`: the bucket under `prefix` with `extra` lines, or none.
fn store(mode: Mode, garage: &Garage, prefix: &str, extra: &str) -> String {
    match mode {
        Mode::Local => String::new(),
        Mode::Bucket => garage.store_yaml(&format!("    prefix: {prefix}\n{extra}")),
    }
}

async fn scrape(addr: SocketAddr) -> Metrics {
    Metrics::scrape(&format!("http://{addr}/metrics")).await
}

/// The object store's requests by operation, summed over outcomes, and the failed ones.
fn requests(metrics: &Metrics) -> (BTreeMap<String, f64>, f64) {
    let mut by_op = BTreeMap::new();
    let mut failed = 0.0;
    for sample in metrics.samples_of(REQUESTS) {
        let op = sample.labels.get("op").cloned().unwrap_or_default();
        *by_op.entry(op).or_insert(0.0) += sample.value;
        let outcome = sample.labels.get("outcome").map(String::as_str);
        if outcome != Some("ok") && outcome != Some("not_found") {
            failed += sample.value;
        }
    }
    (by_op, failed)
}

/// `after - before`, by operation.
fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(op, n)| (op.clone(), n - before.get(op).copied().unwrap_or(0.0)))
        .filter(|(_, n)| *n > 0.0)
        .collect()
}

/// Bytes the aggregator received from clients: QUIC batches and HTTP bodies, as sent.
fn ingested(metrics: &Metrics) -> f64 {
    metrics.value("smolder_aggregator_ingest_quic_bytes_received_total", &[])
        + metrics
            .samples_of("pyroscope_distributor_received_compressed_bytes_sum")
            .map(|s| s.value)
            .sum::<f64>()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One mode's `acks` figures.
struct AckRun {
    ack: Quantiles,
    push: Quantiles,
    windows: u64,
    acked: u64,
    pushes: u64,
    seconds: f64,
    ingested: f64,
    requests: BTreeMap<String, f64>,
    failed: f64,
    segments: f64,
    segment_bytes: f64,
    cpu: f64,
    verified: String,
}

async fn acks(garage: &Garage) {
    let agents = env_or("SMOLDER_BENCH_AGENTS", 100usize);
    let pushes = env_or("SMOLDER_BENCH_PUSHES", 20.0f64);
    let minutes = env_or("SMOLDER_BENCH_MINUTES", 2.0f64);
    println!(
        "\n## acks: {agents} agents (a window of 20 series every 10 s each) and {pushes} pushes/s for {minutes} min per mode\n"
    );
    let mut runs = Vec::new();
    for mode in [Mode::Local, Mode::Bucket] {
        let run = ack_run(mode, garage, agents, pushes, minutes).await;
        runs.push((mode, run));
    }
    println!(
        "| mode | batch ack p50 ms | p99 ms | push p50 ms | p99 ms | windows acked | pushes ok | aggregator CPU % | check |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (mode, run) in &runs {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {} of {} | {} | {:.0} | {} |",
            mode.name(),
            ms(run.ack.p50),
            ms(run.ack.p99),
            ms(run.push.p50),
            ms(run.push.p99),
            run.acked,
            run.windows,
            run.pushes,
            run.cpu,
            run.verified
        );
    }
    let (local, bucket) = (&runs[0].1, &runs[1].1);
    println!(
        "\nobject storage / local: batch ack p50 {:.1}×, p99 {:.1}×; push p50 {:.1}×, p99 {:.1}×",
        ms(bucket.ack.p50) / ms(local.ack.p50),
        ms(bucket.ack.p99) / ms(local.ack.p99),
        ms(bucket.push.p50) / ms(local.push.p50),
        ms(bucket.push.p99) / ms(local.push.p99)
    );
    let mib = bucket.ingested / 1_048_576.0;
    println!(
        "\nobject storage: {:.1} MiB ingested in {:.0} s ({:.1} KiB/s), {:.0} segments ({:.2}/s, {:.1} KiB each), {} failed requests\n",
        mib,
        bucket.seconds,
        bucket.ingested / 1024.0 / bucket.seconds,
        bucket.segments,
        bucket.segments / bucket.seconds,
        bucket.segment_bytes / bucket.segments.max(1.0) / 1024.0,
        bucket.failed
    );
    println!("| op | requests | per second | per ingested MiB |\n|---|---|---|---|");
    let total: f64 = bucket.requests.values().sum();
    for (op, n) in bucket.requests.iter().chain([(&"all".to_owned(), &total)]) {
        println!(
            "| {op} | {n:.0} | {:.2} | {:.1} |",
            n / bucket.seconds,
            n / mib
        );
    }
}

async fn ack_run(mode: Mode, garage: &Garage, agents: usize, pushes: f64, minutes: f64) -> AckRun {
    let root = tempfile::tempdir().expect("a temporary directory");
    let aggregator = support::spawn(
        root.path(),
        &format!("store:\n{}", store(mode, garage, "acks", "")),
    );
    let http = aggregator.listening("http");
    let quic = aggregator.listening("quic");
    let tls = root.path().join("data/tls");
    let token = std::fs::read_to_string(tls.join("agent-token")).expect("the agent token");
    let mut config = FleetConfig::new(quic, http, tls.join("ca.pem"), token.trim().to_owned());
    config.agents = agents;
    config.pushes_per_second = pushes;
    let before = scrape(http).await;
    let cpu_before = process::usage(aggregator.id()).unwrap_or_default();
    let fleet = Fleet::start(config).await;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(minutes * 60.0)).await;
    let record = fleet.stop(Duration::from_secs(30)).await;
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after: Usage = process::usage(aggregator.id()).unwrap_or_default();
    let after = scrape(http).await;
    let client = reqwest::Client::new();
    let check = verify(
        &client,
        &format!("http://{http}"),
        &record.tallies,
        record.started,
        record.stopped,
    )
    .await;
    let verified = match check {
        Ok(check) if check.passed() => "every series exact".to_owned(),
        Ok(check) => format!("**FAILED**: {check}"),
        Err(err) => format!("**not checked**: {err}"),
    };
    let (requests_before, failed_before) = requests(&before);
    let (requests_after, failed_after) = requests(&after);
    let counter = |name: &str| after.value(name, &[]) - before.value(name, &[]);
    drop(aggregator);
    AckRun {
        ack: record.ack,
        push: record.push,
        windows: record.totals.windows,
        acked: record.totals.acked,
        pushes: record.totals.pushes_ok,
        seconds,
        ingested: ingested(&after) - ingested(&before),
        requests: delta(&requests_before, &requests_after),
        failed: failed_after - failed_before,
        segments: counter("smolder_aggregator_store_segments_uploaded_total"),
        segment_bytes: counter("smolder_aggregator_store_segment_bytes_uploaded_total"),
        cpu: cpu_after.cpu.saturating_sub(cpu_before.cpu).as_secs_f64() / seconds * 100.0,
        verified,
    }
}

/// One mode's `day` figures.
struct DayRun {
    write_seconds: f64,
    settle_seconds: f64,
    blocks: f64,
    block_bytes: f64,
    requests: BTreeMap<String, f64>,
    segment_bytes: f64,
    warm: (f64, f64),
    /// Per cold start: the first render's time, and the object store's GETs and bytes
    /// received for it.
    cold: Vec<(f64, f64, f64)>,
    /// Warm renders after each cold one.
    warm_after_cold: Vec<f64>,
}

async fn day(garage: &Garage) {
    let buckets = env_or("SMOLDER_BENCH_BUCKETS", 8_640u64);
    let colds = env_or("SMOLDER_BENCH_COLD", 5usize);
    let warm = env_or("SMOLDER_BENCH_WARM", 20usize);
    let corpus = Corpus::generate(&CorpusConfig {
        seed: 7,
        unique_stacks: 12_000,
        min_depth: 6,
        max_depth: 24,
        functions: 4_000,
        ..CorpusConfig::default()
    });
    let bodies: Arc<Vec<(Vec<u8>, u64, u64)>> = Arc::new(
        (0..BODIES)
            .map(|i| {
                let tree = corpus.tree(SAMPLES, i as u64);
                (
                    to_folded(&tree).into_bytes(),
                    tree.total(),
                    tree.len() as u64,
                )
            })
            .collect(),
    );
    let samples: u64 = (0..buckets).map(|b| bodies[b as usize % BODIES].1).sum();
    let nodes: u64 = (0..buckets).map(|b| bodies[b as usize % BODIES].2).sum();
    println!(
        "\n## day: {buckets} buckets of 10 s of one app ({SAMPLES} samples, {} nodes, {} KiB of folded text each), {CLIENTS} writers; 24 h renders: {warm} warm, {colds} cold\n",
        bodies[0].2,
        bodies[0].0.len() / 1024
    );
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    // The day ends a few minutes ago, so that its last head range is due to be cut and its last
    // 10 000 s range to be compacted by the time the day is in.
    let end = (now - 300) / 10_000 * 10_000;
    let start = end - buckets * 10;
    let mut runs = Vec::new();
    for mode in [Mode::Local, Mode::Bucket] {
        let run = day_run(
            mode,
            garage,
            &bodies,
            (start, end),
            buckets,
            samples,
            colds,
            warm,
        )
        .await;
        runs.push((mode, run));
    }
    println!(
        "| mode | day written in s | cut and compacted in s | blocks | block bytes | B per stored node | 24 h warm p50 / p99 ms | 24 h cold p50 / max ms | warm after cold p50 ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (mode, run) in &runs {
        let mut cold: Vec<f64> = run.cold.iter().map(|c| c.0).collect();
        cold.sort_by(f64::total_cmp);
        let mut after: Vec<f64> = run.warm_after_cold.clone();
        after.sort_by(f64::total_cmp);
        println!(
            "| {} | {:.1} | {:.1} | {:.0} | {:.0} | {:.3} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} |",
            mode.name(),
            run.write_seconds,
            run.settle_seconds,
            run.blocks,
            run.block_bytes,
            run.block_bytes / nodes as f64,
            run.warm.0,
            run.warm.1,
            quantile(&cold, 0.5),
            cold.last().copied().unwrap_or(0.0),
            quantile(&after, 0.5)
        );
    }
    let (local, bucket) = (&runs[0].1, &runs[1].1);
    let median = |run: &DayRun| {
        let mut cold: Vec<f64> = run.cold.iter().map(|c| c.0).collect();
        cold.sort_by(f64::total_cmp);
        quantile(&cold, 0.5)
    };
    println!(
        "\nobject storage / local: 24 h warm p50 {:.2}×, cold (fresh aggregator vs local restart) p50 {:.2}×",
        bucket.warm.0 / local.warm.0,
        median(bucket) / median(local)
    );
    let day_fraction = buckets as f64 / 8_640.0;
    println!(
        "\nobject storage, the day's requests (writes, cuts, compaction, polls; per day of data: ×{:.2}), {:.1} MiB of segments uploaded:\n",
        1.0 / day_fraction,
        bucket.segment_bytes / 1_048_576.0
    );
    println!("| op | requests |\n|---|---|");
    for (op, n) in &bucket.requests {
        println!("| {op} | {n:.0} |");
    }
    println!(
        "\n| cold start | first 24 h render ms | GETs (whole, ranged) | MiB received |\n|---|---|---|---|"
    );
    for (i, (time, gets, bytes)) in bucket.cold.iter().enumerate() {
        println!(
            "| {} | {time:.1} | {gets:.0} | {:.1} |",
            i + 1,
            bytes / 1_048_576.0
        );
    }
}

#[allow(
    clippy::too_many_arguments,
    reason = "one call site, each argument named there"
)]
async fn day_run(
    mode: Mode,
    garage: &Garage,
    bodies: &Arc<Vec<(Vec<u8>, u64, u64)>>,
    (start, end): (u64, u64),
    buckets: u64,
    samples: u64,
    colds: usize,
    warm: usize,
) -> DayRun {
    let root = tempfile::tempdir().expect("a temporary directory");
    // The writer uploads a segment every 10 ms at most, so that the day goes in at speed
    // (acknowledgements wait for the uploads); the readers poll as usual.
    // Compaction every second rather than every minute: a live aggregator compacts the day as
    // it goes by, here the day arrives in a minute. (Each pass polls the bucket first, so the
    // `acks` run keeps the default, whose requests are those of a live aggregator.)
    let writer_store = format!(
        "  compaction-interval: 1s\n{}",
        store(mode, garage, "day", "    upload-interval: 10ms\n")
    );
    let writer = support::spawn(root.path(), &format!("store:\n{writer_store}"));
    let http = writer.listening("http");
    let client = reqwest::Client::new();
    let before = scrape(http).await;
    let started = Instant::now();
    write_day(&client, http, bodies, start, buckets).await;
    let write_seconds = started.elapsed().as_secs_f64();
    let settled = Instant::now();
    support::settle(http).await;
    let settle_seconds = settled.elapsed().as_secs_f64();
    let after = scrape(http).await;
    let warm_on_writer = renders(&client, http, (start, end), warm, samples).await;
    let (requests_before, _) = requests(&before);
    let (requests_after, _) = requests(&after);
    let mut run = DayRun {
        write_seconds,
        settle_seconds,
        blocks: after.value("smolder_aggregator_store_blocks", &[]),
        block_bytes: after.value("smolder_aggregator_store_block_bytes", &[]),
        requests: delta(&requests_before, &requests_after),
        segment_bytes: after.value("smolder_aggregator_store_segment_bytes_uploaded_total", &[]),
        warm: (
            quantile(&warm_on_writer, 0.5),
            quantile(&warm_on_writer, 0.99),
        ),
        cold: Vec::new(),
        warm_after_cold: Vec::new(),
    };
    drop(writer);
    for _ in 0..colds {
        // Local mode: the same data directory again (its blocks on disk, whatever the page
        // cache holds). Object storage: a data directory that never saw the blocks.
        let reader_root = tempfile::tempdir().expect("a temporary directory");
        let (reader, reader_http) = match mode {
            Mode::Local => {
                let reader = support::spawn(root.path(), "");
                let http = reader.listening("http");
                (reader, http)
            }
            Mode::Bucket => {
                let reader = support::spawn(
                    reader_root.path(),
                    &format!(
                        "store:\n{}",
                        store(mode, garage, "day", "    compactor: false\n")
                    ),
                );
                let http = reader.listening("http");
                (reader, http)
            }
        };
        wait_ready(&client, reader_http).await;
        let before = scrape(reader_http).await;
        let first = renders(&client, reader_http, (start, end), 1, samples).await;
        let after = scrape(reader_http).await;
        let get = |m: &Metrics, op: &str| {
            m.samples_of(REQUESTS)
                .filter(|s| s.labels.get("op").is_some_and(|o| o == op))
                .map(|s| s.value)
                .sum::<f64>()
        };
        let gets = get(&after, "get") + get(&after, "get_range")
            - get(&before, "get")
            - get(&before, "get_range");
        // Absent in local mode, and until the first byte received.
        let received_of = |m: &Metrics| {
            m.find(
                "smolder_aggregator_store_object_bytes_total",
                &[("direction", "received")],
            )
            .unwrap_or(0.0)
        };
        let received = received_of(&after) - received_of(&before);
        run.cold.push((first[0], gets, received));
        let again = renders(&client, reader_http, (start, end), warm, samples).await;
        run.warm_after_cold.extend(again);
        drop(reader);
    }
    run
}

/// Writes the day, `CLIENTS` at a time, each write acknowledged.
async fn write_day(
    client: &reqwest::Client,
    addr: SocketAddr,
    bodies: &Arc<Vec<(Vec<u8>, u64, u64)>>,
    start: u64,
    buckets: u64,
) {
    let mut writers = Vec::new();
    for first in 0..CLIENTS {
        let client = client.clone();
        let bodies = Arc::clone(bodies);
        writers.push(tokio::spawn(async move {
            let mut bucket = first;
            while bucket < buckets {
                let body = bodies[bucket as usize % bodies.len()].0.clone();
                let from = start + bucket * 10;
                let url = format!(
                    "http://{addr}/ingest?name=day.cpu{{env=prod}}&from={from}&until={}&spyName=ebpfspy",
                    from + 10
                );
                let response = client.post(url).body(body).send().await.expect("a write");
                assert_eq!(response.status(), 200, "{}", response.text().await.unwrap_or_default());
                bucket += CLIENTS;
            }
        }));
    }
    for writer in writers {
        writer.await.expect("a writer");
    }
}

/// Waits until `/readyz` answers 200.
async fn wait_ready(client: &reqwest::Client, addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ready = client
            .get(format!("http://{addr}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200);
        if ready {
            return;
        }
        assert!(Instant::now() < deadline, "the aggregator is not ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `reps` renders of `day.cpu` over `[from, until)`, in ms; each must total `samples`.
async fn renders(
    client: &reqwest::Client,
    addr: SocketAddr,
    (from, until): (u64, u64),
    reps: usize,
    samples: u64,
) -> Vec<f64> {
    let url = format!("http://{addr}/render?query=day.cpu&from={from}&until={until}&format=json");
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let started = Instant::now();
        let body: serde_json::Value = client
            .get(&url)
            .send()
            .await
            .expect("a render")
            .json()
            .await
            .expect("render JSON");
        times.push(started.elapsed().as_secs_f64() * 1e3);
        let ticks = body["flamebearer"]["numTicks"].as_u64().unwrap_or(0);
        assert_eq!(ticks, samples, "the day's render totals what was written");
    }
    times
}

/// The `q` quantile (nearest rank) of `values`, sorted here.
fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let index = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index]
}
