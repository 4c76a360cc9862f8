//! End to end over real QUIC on loopback: an agent's spool full of realistic windows drains
//! through the real shipper into the aggregator's store. Measures stack-tree nodes per second
//! from the first connection attempt to the last ack (every ack after the store's fsync), and
//! bytes on the wire per node; then the same trees as gzipped pprof to `POST /ingest`, four
//! clients at a time, in the same run, as the baseline.
//!
//! ```sh
//! cargo bench -p smolder-aggregator --bench ingest_quic_to_store
//! SMOLDER_BENCH_WINDOWS=50 cargo bench -p smolder-aggregator --bench ingest_quic_to_store
//! ```
//!
//! A scenario, not a micro-benchmark: it prints one table and its results go to BENCHMARKS.md.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use smolder_agent::app as agent_app;
use smolder_agent::config::{Config as AgentConfig, SpoolConfig};
use smolder_agent::metrics::Metrics as AgentMetrics;
use smolder_agent::spool::Spool;
use smolder_agent::window::Window;
use smolder_aggregator::app::{self, Running};
use smolder_aggregator::config::Config;
use smolder_common::pprof::{self, EncodeOptions};
use smolder_common::{Corpus, CorpusConfig, Profile, ProfileMeta, Tree};
use smolder_test_support::prometheus::Metrics;

/// Distinct trees; windows cycle through them.
const BODIES: usize = 48;
/// Samples per series per 10 s window: about 1,600 distinct stacks, 11,000 nodes, as in
/// `ingest_http_to_query`.
const SAMPLES: usize = 6_000;
/// Series per window (one app per series): an agent profiling a few services.
const SERIES: usize = 4;
/// Concurrent HTTP clients of the pprof baseline.
const CLIENTS: usize = 4;

fn main() {
    let windows: usize = std::env::var("SMOLDER_BENCH_WINDOWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(windows));
}

async fn run(windows: usize) {
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
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 10
        * 10;
    let first = now - windows as u64 * 10;
    let at = |secs: u64| UNIX_EPOCH + Duration::from_secs(secs);
    let mut nodes = 0u64;
    let mut samples = 0u64;
    let windows: Vec<Arc<Window>> = (0..windows)
        .map(|w| {
            let start = first + w as u64 * 10;
            let profiles = (0..SERIES)
                .map(|s| {
                    let tree = trees[(w * SERIES + s) % BODIES].clone();
                    nodes += tree.len() as u64;
                    samples += tree.total();
                    Profile {
                        series: format!("bench{s}.cpu{{hostname=bench-host}}")
                            .parse()
                            .unwrap(),
                        meta: ProfileMeta {
                            spy_name: "ebpfspy".to_owned(),
                            sample_rate: 100,
                            ..ProfileMeta::default()
                        },
                        from: at(start),
                        until: at(start + 10),
                        tree,
                    }
                })
                .collect();
            Arc::new(Window {
                start: at(start),
                end: at(start + 10),
                profiles,
            })
        })
        .collect();
    let count = windows.len();
    println!(
        "# ingest_quic_to_store: {count} windows of {SERIES} series, {} nodes and {} samples per series on average",
        nodes / (count * SERIES) as u64,
        samples / (count * SERIES) as u64
    );

    // 1. Fill an agent's spool, as an outage would (not timed).
    let agent_dir = tempfile::tempdir().unwrap();
    let spool_config = SpoolConfig {
        max_bytes: 4 << 30,
        ..SpoolConfig::default()
    };
    {
        let metrics = AgentMetrics::new();
        let spool = Spool::open(
            Some(&agent_dir.path().join("spool")),
            &spool_config,
            metrics.spool.clone(),
        )
        .unwrap();
        let started = Instant::now();
        for window in &windows {
            spool.push(Arc::clone(window)).await.unwrap();
        }
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "spool (encode, compress, write, fsync per batch): {count} batches in {seconds:.2} s = {:.2} M nodes/s",
            nodes as f64 / seconds / 1e6
        );
    }

    // 2. Drain it through QUIC into the store: timed from the agent's start to the last ack.
    let store_dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    // Capacity, not policy: the per-connection rate limit would pace the drain.
    config.ingest.quic.max_batches_per_second = 0;
    let server = start(config, store_dir.path()).await;
    let http = reqwest::Client::new();
    let mut agent = AgentConfig::default();
    agent.http.listen = "127.0.0.1:0".parse().unwrap();
    agent.spool = spool_config;
    agent.ship.aggregator = server.quic_addr().to_string();
    agent.ship.ca = store_dir.path().join("tls/ca.pem");
    agent.ship.token_file = store_dir.path().join("tls/agent-token");
    let started = Instant::now();
    let agent = agent_app::start_in(agent, agent_dir.path()).await.unwrap();
    let metrics_url = format!("http://{}/metrics", agent.addr());
    let text = loop {
        let text = http
            .get(&metrics_url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if metric(&text, "smolder_agent_spool_batches") == 0.0 {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let seconds = started.elapsed().as_secs_f64();
    let wire = metric(&text, "smolder_agent_ship_bytes_sent_total");
    let sent = metric(&text, "smolder_agent_ship_batches_sent_total");
    let quic_rate = nodes as f64 / seconds;
    println!(
        "QUIC drain, {} in flight: {count} batches ({sent} sent) in {seconds:.2} s = {:.2} M nodes/s, {:.2} M samples/s",
        AgentConfig::default().ship.max_batches_in_flight,
        quic_rate / 1e6,
        samples as f64 / seconds / 1e6
    );
    agent.stop().await.unwrap();
    let stored = ticks(&http, server.addr(), first, now).await;
    assert_eq!(stored, samples, "every sample stored once");
    server.stop().await.unwrap();

    // 3. Baseline, same run: the same trees as gzipped CPU pprof to /ingest.
    let pprof_dir = tempfile::tempdir().unwrap();
    let server = start(Config::default(), pprof_dir.path()).await;
    let bodies: Vec<Arc<Vec<u8>>> = trees
        .iter()
        .map(|tree| Arc::new(pprof::encode(tree, &EncodeOptions::cpu_samples(100)).to_bytes(true)))
        .collect();
    let requests = count * SERIES;
    let pprof_bytes: usize = (0..requests).map(|i| bodies[i % BODIES].len()).sum();
    let started = Instant::now();
    ingest_pprof(&http, server.addr(), &bodies, first, requests).await;
    let seconds = started.elapsed().as_secs_f64();
    let pprof_rate = nodes as f64 / seconds;
    println!(
        "pprof /ingest, {CLIENTS} clients: {requests} requests in {seconds:.2} s = {:.2} M nodes/s",
        pprof_rate / 1e6
    );
    server.stop().await.unwrap();

    println!(
        "bytes per node on the wire: QUIC batch frames {:.3} B, gzipped pprof bodies {:.3} B ({:.2}x smaller)",
        wire / nodes as f64,
        pprof_bytes as f64 / nodes as f64,
        pprof_bytes as f64 / wire
    );
    println!(
        "same-run ratio: QUIC drain {:.2}x the nodes/s of pprof /ingest",
        quic_rate / pprof_rate
    );
}

async fn start(mut config: Config, dir: &Path) -> Running {
    config.http.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.ingest.quic.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    app::start(config, dir).await.expect("aggregator starts")
}

/// Metric `name` in Prometheus text; a missing one fails the bench.
fn metric(text: &str, name: &str) -> f64 {
    Metrics::parse(text)
        .expect("Prometheus text")
        .value(name, &[])
}

async fn ticks(http: &reqwest::Client, addr: SocketAddr, from: u64, until: u64) -> u64 {
    let mut total = 0;
    for s in 0..SERIES {
        let json: serde_json::Value = http
            .get(format!(
                "http://{addr}/render?query=bench{s}.cpu&from={from}&until={until}&format=json"
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        total += json["flamebearer"]["numTicks"].as_u64().unwrap();
    }
    total
}

async fn ingest_pprof(
    http: &reqwest::Client,
    addr: SocketAddr,
    bodies: &[Arc<Vec<u8>>],
    first: u64,
    requests: usize,
) {
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let http = http.clone();
        let bodies = bodies.to_vec();
        clients.push(tokio::spawn(async move {
            let mut i = client;
            while i < requests {
                let (window, series) = (i / SERIES, i % SERIES);
                let from = first + window as u64 * 10;
                let url = format!(
                    "http://{addr}/ingest?name=bench{series}{{hostname=bench-host}}&format=pprof&from={from}&until={}",
                    from + 10
                );
                let body = bodies[i % BODIES].as_ref().clone();
                let response = http.post(url).body(body).send().await.unwrap();
                assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
                i += CLIENTS;
            }
        }));
    }
    for client in clients {
        client.await.unwrap();
    }
}
