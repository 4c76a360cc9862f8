//! End to end over real HTTP: ingest throughput (folded and pprof), bytes on disk per stored
//! node after a simulated day once the block store has cut and compacted it, flame-graph latency
//! for 1 h and 24 h of one app at 10 s resolution (warm and after a restart), and space on disk
//! while size-based retention deletes the oldest blocks round after round.
//!
//! ```sh
//! cargo bench -p smolder-aggregator --bench ingest_http_to_query
//! SMOLDER_BENCH_BUCKETS=1000 cargo bench -p smolder-aggregator --bench ingest_http_to_query
//! # every bucket drawn afresh rather than cycling 48 bodies (slower: bodies are made per request)
//! SMOLDER_BENCH_FRESH=1 cargo bench -p smolder-aggregator --bench ingest_http_to_query
//! ```
//!
//! A scenario, not a micro-benchmark: it prints one table and its results go to BENCHMARKS.md.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use smolder_aggregator::app::{self, Running};
use smolder_aggregator::config::Config;
use smolder_common::pprof::{self, EncodeOptions};
use smolder_common::{Corpus, CorpusConfig, Tree, to_folded};

/// Distinct bucket bodies; the day cycles through them (generating 8640 would dominate).
const BODIES: usize = 48;
/// Samples per 10 s bucket: about 2 000 distinct stacks each, as the issue's query case asks.
const SAMPLES: usize = 6_000;
/// Concurrent HTTP clients.
const CLIENTS: usize = 4;

struct Body {
    folded: Arc<Vec<u8>>,
    samples: u64,
    nodes: u64,
}

/// One request's body with its samples and nodes.
type Drawn = (Arc<Vec<u8>>, u64, u64);

/// Where each request's body comes from: 48 bodies cycled, or a fresh draw per bucket.
#[derive(Clone)]
enum Bodies {
    Cycled(Arc<Vec<Drawn>>),
    Fresh(Arc<Corpus>),
}

impl Bodies {
    fn get(&self, bucket: u64) -> Drawn {
        match self {
            Bodies::Cycled(bodies) => bodies[bucket as usize % bodies.len()].clone(),
            Bodies::Fresh(corpus) => {
                let tree = corpus.tree(SAMPLES, 1_000 + bucket);
                let folded = to_folded(&tree).into_bytes();
                (Arc::new(folded), tree.total(), tree.len() as u64)
            }
        }
    }
}

fn main() {
    let buckets: u64 = std::env::var("SMOLDER_BENCH_BUCKETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8_640);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let fresh = std::env::var("SMOLDER_BENCH_FRESH").is_ok_and(|v| v == "1");
    runtime.block_on(run(buckets, fresh));
}

async fn run(buckets: u64, fresh: bool) {
    let corpus = Corpus::generate(&CorpusConfig {
        seed: 7,
        unique_stacks: 12_000,
        min_depth: 6,
        max_depth: 24,
        functions: 4_000,
        ..CorpusConfig::default()
    });
    let trees: Vec<Tree> = (0..BODIES)
        .map(|i| corpus.tree(SAMPLES, i as u64))
        .collect();
    let bodies: Vec<Body> = trees
        .iter()
        .map(|tree| Body {
            folded: Arc::new(to_folded(tree).into_bytes()),
            samples: tree.total(),
            nodes: tree.len() as u64,
        })
        .collect();
    let mut distinct = 0;
    trees[0].for_each_stack(|_, _| distinct += 1);
    let body_bytes: usize = bodies.iter().map(|b| b.folded.len()).sum::<usize>() / BODIES;
    println!(
        "# ingest_http_to_query: {buckets} buckets of 10 s, {SAMPLES} samples each, {}",
        if fresh {
            "every bucket drawn afresh"
        } else {
            "48 bodies cycled"
        }
    );
    println!(
        "bucket tree: {distinct} distinct stacks, {} nodes, {body_bytes} B of folded text",
        trees[0].len()
    );

    let cycled = Bodies::Cycled(Arc::new(
        bodies
            .iter()
            .map(|b| (b.folded.clone(), b.samples, b.nodes))
            .collect(),
    ));
    let day_bodies = if fresh {
        Bodies::Fresh(Arc::new(corpus))
    } else {
        cycled.clone()
    };
    let http = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    // The day ends a few minutes ago, so that its last head range is due to be cut and its
    // last 10 000 s range to be compacted by the time the day is in.
    let now = (unix_now() - 300) / 10_000 * 10_000;
    let day_start = now - buckets * 10;

    // 1. A day of folded ingest, CLIENTS at a time.
    let server = start(Config::default(), dir.path()).await;
    let written_before = disk_writes();
    let started = Instant::now();
    let (samples, nodes) =
        ingest_folded(&http, server.addr(), &day_bodies, day_start, buckets).await;
    let seconds = started.elapsed().as_secs_f64();
    let written = disk_writes() - written_before;
    let ingested = body_bytes as u64 * buckets;
    println!(
        "folded ingest: {buckets} requests in {seconds:.1} s = {:.0} req/s, {:.2} M samples/s",
        buckets as f64 / seconds,
        samples as f64 / seconds / 1e6
    );
    println!(
        "write amplification: {:.1} MiB written to disk for {:.1} MiB of folded bodies ({:.2}x), {:.0} B per stored node",
        written as f64 / 1048576.0,
        ingested as f64 / 1048576.0,
        written as f64 / ingested as f64,
        written as f64 / nodes as f64
    );

    // 2. The block store cuts the day's head ranges and compacts them; a live aggregator does
    // this as the day goes by, here the day arrived in seconds.
    let settled = Instant::now();
    support::settle(server.addr()).await;
    println!(
        "cut and compacted in {:.1} s after the last write",
        settled.elapsed().as_secs_f64()
    );
    let hour = (now - 3_600, now);
    let day = (day_start, now);
    for (name, range) in [("1 h", hour), ("24 h", day)] {
        let (p50, p99, ticks) = render_latency(&http, server.addr(), range, 20).await;
        println!("render {name} warm: p50 {p50:.1} ms, p99 {p99:.1} ms ({ticks} ticks)");
    }
    server.stop().await.unwrap();
    let blocks = du(&dir.path().join("blocks"));
    let head = du(&dir.path().join("head"));
    let disk = du(dir.path());
    println!(
        "disk after the day, compacted: blocks {:.1} MiB = {:.3} B per stored node ({nodes} nodes in 10 s buckets); head {:.1} MiB; whole data directory {:.1} MiB = {:.2} B per stored node",
        blocks as f64 / 1048576.0,
        blocks as f64 / nodes as f64,
        head as f64 / 1048576.0,
        disk as f64 / 1048576.0,
        disk as f64 / nodes as f64
    );
    let server = start(Config::default(), dir.path()).await;
    for (name, range) in [("1 h", hour), ("24 h", day)] {
        let (p50, p99, _) = render_latency(&http, server.addr(), range, 5).await;
        println!("render {name} after restart: p50 {p50:.1} ms, p99 {p99:.1} ms");
    }
    server.stop().await.unwrap();

    // 3. pprof ingest: the same trees as gzipped pprof, on a fresh store.
    let pprof_dir = tempfile::tempdir().unwrap();
    let server = start(Config::default(), pprof_dir.path()).await;
    let profiles: Vec<Arc<Vec<u8>>> = trees
        .iter()
        .map(|tree| Arc::new(pprof::encode(tree, &EncodeOptions::cpu_samples(100)).to_bytes(true)))
        .collect();
    let requests = buckets.min(2_000);
    let started = Instant::now();
    let samples = ingest_pprof(
        &http,
        server.addr(),
        &profiles,
        &bodies,
        day_start,
        requests,
    )
    .await;
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "pprof ingest: {requests} requests in {seconds:.1} s = {:.0} req/s, {:.2} M samples/s",
        requests as f64 / seconds,
        samples as f64 / seconds / 1e6
    );
    server.stop().await.unwrap();

    // 4. Retention cycling: a disk limit a quarter of what four rounds of data need (a quarter
    // day compacts to about 10 MiB), so size-based retention keeps deleting the oldest blocks
    // while new data arrives.
    let cycle_dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    let limit: u64 = std::env::var("SMOLDER_BENCH_LIMIT_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    config.store.max_disk_bytes = limit << 20;
    config.store.retention_interval = Duration::from_secs(1);
    let server = start(config, cycle_dir.path()).await;
    let per_round = buckets / 4;
    for round in 0..4 {
        let start_at = day_start + round * per_round * 10;
        ingest_folded(&http, server.addr(), &cycled, start_at, per_round).await;
        support::settle(server.addr()).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        println!(
            "size retention (limit {limit} MiB), round {}: {per_round} more buckets, disk {:.1} MiB (blocks {:.1}, head {:.1})",
            round + 1,
            du(cycle_dir.path()) as f64 / 1048576.0,
            du(&cycle_dir.path().join("blocks")) as f64 / 1048576.0,
            du(&cycle_dir.path().join("head")) as f64 / 1048576.0,
        );
    }
    server.stop().await.unwrap();
}

async fn start(config: Config, dir: &Path) -> Running {
    let mut config = config;
    config.store.compaction_interval = Duration::from_secs(1);
    config.http.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.ingest.quic.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    app::start(config, dir).await.expect("aggregator starts")
}

async fn ingest_folded(
    http: &reqwest::Client,
    addr: SocketAddr,
    bodies: &Bodies,
    start: u64,
    buckets: u64,
) -> (u64, u64) {
    let mut clients = Vec::new();
    for client in 0..CLIENTS as u64 {
        let http = http.clone();
        let bodies = bodies.clone();
        clients.push(tokio::spawn(async move {
            let (mut samples, mut nodes) = (0, 0);
            let mut bucket = client;
            while bucket < buckets {
                let (body, s, n) = &bodies.get(bucket);
                let from = start + bucket * 10;
                let url = format!(
                    "http://{addr}/ingest?name=bench.cpu{{env=prod}}&from={from}&until={}&spyName=ebpfspy",
                    from + 10
                );
                let response = http.post(url).body(body.as_ref().clone()).send().await.unwrap();
                assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
                samples += s;
                nodes += n;
                bucket += CLIENTS as u64;
            }
            (samples, nodes)
        }));
    }
    let mut totals = (0, 0);
    for client in clients {
        let (s, n) = client.await.unwrap();
        totals.0 += s;
        totals.1 += n;
    }
    totals
}

async fn ingest_pprof(
    http: &reqwest::Client,
    addr: SocketAddr,
    profiles: &[Arc<Vec<u8>>],
    bodies: &[Body],
    start: u64,
    requests: u64,
) -> u64 {
    let mut clients = Vec::new();
    for client in 0..CLIENTS as u64 {
        let http = http.clone();
        let profiles: Vec<(Arc<Vec<u8>>, u64)> = profiles
            .iter()
            .zip(bodies)
            .map(|(p, b)| (p.clone(), b.samples))
            .collect();
        clients.push(tokio::spawn(async move {
            let mut samples = 0;
            let mut i = client;
            while i < requests {
                let (body, s) = &profiles[i as usize % profiles.len()];
                let from = start + i * 10;
                let url = format!(
                    "http://{addr}/ingest?name=bench&format=pprof&from={from}&until={}",
                    from + 10
                );
                let response = http
                    .post(url)
                    .body(body.as_ref().clone())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
                samples += s;
                i += CLIENTS as u64;
            }
            samples
        }));
    }
    let mut total = 0;
    for client in clients {
        total += client.await.unwrap();
    }
    total
}

/// p50 and p99 in milliseconds of `reps` renders of `range`, and the ticks rendered.
async fn render_latency(
    http: &reqwest::Client,
    addr: SocketAddr,
    (from, until): (u64, u64),
    reps: usize,
) -> (f64, f64, u64) {
    let url = format!("http://{addr}/render?query=bench.cpu&from={from}&until={until}&format=json");
    let mut times = Vec::with_capacity(reps);
    let mut ticks = 0;
    for _ in 0..reps {
        let started = Instant::now();
        let body: serde_json::Value = http.get(&url).send().await.unwrap().json().await.unwrap();
        times.push(started.elapsed().as_secs_f64() * 1e3);
        ticks = body["flamebearer"]["numTicks"].as_u64().unwrap_or(0);
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), ticks)
}

fn du(path: &Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![path.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                // Blocks actually allocated, not the apparent length of sparse files.
                total += std::os::unix::fs::MetadataExt::blocks(&meta) * 512;
            }
        }
    }
    total
}

/// Bytes this process caused to be written to storage (`write_bytes` of `/proc/self/io`).
fn disk_writes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|line| line.strip_prefix("write_bytes: "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}
