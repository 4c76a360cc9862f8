//! The agent's cost of pull mode: CPU and RSS of a real `smolder-agent` process scraping 100
//! targets (`cpu` and `mem` each, so 200 scrape loops) every 10 s, against the same binary with
//! no targets, measured in the same run.
//!
//! The targets are this process: one HTTP server on 100 loopback ports serving profiles
//! captured from real Go programs (`benches/testdata/`). `/debug/pprof/profile` answers after
//! `seconds`, as Go does; `/debug/pprof/heap` answers the captured heap with its allocation
//! counts multiplied by the number of times the port was scraped, so every scrape yields a
//! real delta.
//!
//! ```sh
//! cargo bench -p smolder-agent --bench scrape_to_window            # 20 s warm-up, 120 s measured
//! SCRAPE_BENCH_SECS=60 cargo bench -p smolder-agent --bench scrape_to_window
//! ```

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Query, State};
use axum::routing::get;
use smolder_common::pprof::{self, Limits};
use smolder_test_support::net::{LOOPBACK_ANY_PORT, silent_udp};
use smolder_test_support::process::{Process, daemon};
use smolder_test_support::prometheus::Metrics;

const CPU: &[u8] = include_bytes!("testdata/go_compile_cpu.pb.gz");
const HEAP: &[u8] = include_bytes!("testdata/go_heap_2.pb.gz");
const TARGETS: usize = 100;
const WARM_UP: Duration = Duration::from_secs(20);

/// The heap profile with its `alloc_*` values multiplied by 1..=versions.
fn growing_heaps(versions: usize) -> Vec<Vec<u8>> {
    let profile = pprof::decode(HEAP, &Limits::default()).unwrap();
    let types: Vec<String> = profile
        .sample_type
        .iter()
        .map(|t| String::from_utf8_lossy(&profile.string_table[t.r#type as usize]).into_owned())
        .collect();
    (1..=versions)
        .map(|k| {
            let mut scaled = profile.clone();
            for sample in &mut scaled.sample {
                for (value, kind) in sample.value.iter_mut().zip(&types) {
                    if kind.starts_with("alloc_") {
                        *value *= k as i64;
                    }
                }
            }
            scaled.to_bytes(true)
        })
        .collect()
}

#[derive(Clone)]
struct Port {
    heaps: Arc<Vec<Vec<u8>>>,
    scrapes: Arc<AtomicUsize>,
}

async fn heap(State(port): State<Port>) -> Vec<u8> {
    let n = port.scrapes.fetch_add(1, Ordering::Relaxed);
    port.heaps[n.min(port.heaps.len() - 1)].clone()
}

async fn cpu(Query(query): Query<std::collections::HashMap<String, String>>) -> &'static [u8] {
    let seconds = query
        .get("seconds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    CPU
}

/// User+system CPU seconds of `pid` so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // USER_HZ is 100 on every Linux this runs on.
    ticks / 100.0
}

/// `VmRSS` and `VmHWM` of `pid`, in MiB.
fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .unwrap()
            / 1024.0
    };
    (field("VmRSS:"), field("VmHWM:"))
}

struct Measured {
    cpu_percent: f64,
    /// RSS halfway through the measured span, to show whether it still grows.
    rss_half: f64,
    rss: f64,
    hwm: f64,
    metrics: Metrics,
}

async fn measure(config: &str, measured: Duration) -> Measured {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.yml");
    std::fs::write(
        &path,
        format!(
            "http:\n  listen: {LOOPBACK_ANY_PORT}\nship:\n  aggregator: {}\n{config}",
            silent_udp()
        ),
    )
    .unwrap();
    let mut command = daemon(Path::new(env!("CARGO_BIN_EXE_smolder-agent")), "warn");
    command
        .arg("--config")
        .arg(&path)
        .arg("--data-dir")
        .arg(dir.path().join("data"));
    let agent = Process::spawn(command);
    let listen = agent.listening("http");
    let pid = agent.id();
    tokio::time::sleep(WARM_UP).await;
    let (start_cpu, start) = (cpu_seconds(pid), Instant::now());
    tokio::time::sleep(measured / 2).await;
    let (rss_half, _) = rss_mib(pid);
    tokio::time::sleep(measured - measured / 2).await;
    let used = cpu_seconds(pid) - start_cpu;
    let elapsed = start.elapsed().as_secs_f64();
    let (rss, hwm) = rss_mib(pid);
    let metrics = Metrics::scrape(&format!("http://{listen}/metrics")).await;
    Measured {
        cpu_percent: 100.0 * used / elapsed,
        rss_half,
        rss,
        hwm,
        metrics,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes `--bench`; a plain run of this file needs no arguments.
    let seconds: u64 = std::env::var("SCRAPE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let measured = Duration::from_secs(seconds);
    let heaps = Arc::new(growing_heaps(64));
    let mut addresses = Vec::new();
    for _ in 0..TARGETS {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addresses.push(listener.local_addr().unwrap());
        let port = Port {
            heaps: Arc::clone(&heaps),
            scrapes: Arc::new(AtomicUsize::new(0)),
        };
        let router = Router::new()
            .route("/debug/pprof/heap", get(heap))
            .route("/debug/pprof/profile", get(cpu))
            .with_state(port);
        tokio::spawn(async move { axum::serve(listener, router).await });
    }
    let mut targets = String::new();
    for addr in &addresses {
        let _ = write!(targets, "'{addr}', ");
    }
    let scraping = format!(
        "scrape-configs:\n  - job-name: bench\n    enabled-profiles: [cpu, mem]\n    \
         static-configs:\n      - application: bench\n        targets: [{targets}]\n"
    );
    eprintln!(
        "{TARGETS} targets x [cpu, mem] every 10s; warm-up {}s, measured {seconds}s per run",
        WARM_UP.as_secs()
    );
    let idle = measure("", measured).await;
    let busy = measure(&scraping, measured).await;
    let scrapes = busy
        .metrics
        .value("smolder_agent_scrape_scrapes_total", &[]);
    // Its series appear with a first failure.
    let failures = busy
        .metrics
        .find("smolder_agent_scrape_failures_total", &[])
        .unwrap_or(0.0);
    let submitted = busy
        .metrics
        .value("smolder_agent_scrape_profiles_submitted_total", &[]);
    let samples = busy
        .metrics
        .value("smolder_agent_scrape_samples_total", &[]);
    println!(
        "| agent | CPU (% of one core) | RSS MiB at half time | RSS MiB at end | peak RSS MiB |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| no targets (baseline) | {:.2} | {:.1} | {:.1} | {:.1} |",
        idle.cpu_percent, idle.rss_half, idle.rss, idle.hwm
    );
    println!(
        "| 100 targets x [cpu, mem] @ 10s | {:.2} | {:.1} | {:.1} | {:.1} |",
        busy.cpu_percent, busy.rss_half, busy.rss, busy.hwm
    );
    println!(
        "same-run ratio: CPU {:.1}x, RSS {:.1}x; scrapes {scrapes}, failures {failures}, \
         profiles submitted {submitted}, samples {samples}",
        busy.cpu_percent / idle.cpu_percent.max(0.01),
        busy.rss / idle.rss
    );
}
