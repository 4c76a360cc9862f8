//! A process on this host, sampled by the agent's eBPF source, shows up in the aggregator's
//! `/render` with its function names, and so do its off-CPU and memory-growth series, in
//! `ProfileTypes` and through a metrics-export rule: the stages of both tiers end to end,
//! nothing mocked.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use smolder_agent::app as agent_app;
use smolder_agent::relabel::RelabelConfig;
use smolder_common::querier::{ProfileTypesRequest, ProfileTypesResponse};
use smolder_test_support::prometheus::Metrics;

use smolder_test_support::wait::eventually;

use crate::grafana::call;
use crate::transport::agent_config;
use crate::util::Aggregator;

/// Spins in `e2e_busy_function` for the seconds given, once a line arrives on stdin.
const WORKLOAD: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
volatile unsigned long sink;
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) void e2e_busy_function(double end) {
    while (now() < end)
        for (unsigned long i = 0; i < 100000UL; i++) sink += i;
}
int main(int argc, char **argv) {
    getchar();
    e2e_busy_function(now() + atof(argv[1]));
    return 0;
}
"#;

#[tokio::test]
async fn a_sampled_process_appears_in_render_with_its_functions() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("smolder-e2e.c");
    std::fs::write(&source, WORKLOAD).unwrap();
    let exe = dir.path().join("smolder-e2e");
    let built = Command::new("gcc")
        .args(["-O0", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&source)
        .status()
        .unwrap();
    assert!(built.success());

    let aggregator = Aggregator::start().await;
    let state = tempfile::tempdir().unwrap();
    let mut config = agent_config(aggregator.quic_addr(), aggregator.dir());
    config.ebpf.enabled = true;
    config.window.length = Duration::from_secs(1);
    config.ebpf.relabel_configs = serde_norway::from_str::<Vec<RelabelConfig>>(
        "- {source_labels: [__meta_process_exe], regex: '.*/smolder-e2e', action: keep}",
    )
    .unwrap();
    let agent = agent_app::start_in(config, state.path()).await.unwrap();

    let mut workload = Command::new(&exe)
        .arg("3")
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    workload.stdin.take().unwrap().write_all(b"\n").unwrap();

    eventually(
        Duration::from_secs(60),
        "the sampled stack is stored",
        || async {
            aggregator
                .collapsed(r#"smolder-e2e.cpu{hostname="test-host"}"#)
                .await
                .contains("main;e2e_busy_function")
        },
    )
    .await;
    let metadata = aggregator.metadata("smolder-e2e.cpu").await;
    assert_eq!(metadata["spyName"], "ebpfspy");
    assert_eq!(metadata["sampleRate"], 99);
    agent.stop().await.unwrap();
    workload.wait().unwrap();
}

/// Naps in `e2e_nap` (5 ms, 400 times) and touches 64 MiB in `e2e_touch`, once a line arrives
/// on stdin; prints the nanoseconds it napped.
const WAITER: &str = r#"
#define _GNU_SOURCE
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>
static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
__attribute__((noinline)) void e2e_touch(char *p, long bytes) {
    for (long i = 0; i < bytes; i += 4096) p[i] = 1;
}
__attribute__((noinline)) void e2e_nap(void) {
    struct timespec t = {0, 5000000};
    nanosleep(&t, 0);
}
int main(void) {
    long bytes = 64L << 20;
    char *p = mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(p, bytes, MADV_NOHUGEPAGE);
    getchar();
    e2e_touch(p, bytes);
    long long napped = 0;
    for (int i = 0; i < 400; i++) {
        long long t0 = now_ns();
        e2e_nap();
        napped += now_ns() - t0;
    }
    printf("%lld\n", napped);
    return 0;
}
"#;

const OFF_CPU: &str = "off_cpu:off_cpu:nanoseconds:off_cpu:nanoseconds";
const MEMORY_GROWTH: &str = "memory_growth:memory_growth:bytes:memory_growth:bytes";

/// The off-CPU and memory-growth series of a process ship over QUIC, are stored in their
/// units, listed by `ProfileTypes`, and a metrics-export rule exports the off-CPU nanoseconds
/// as seconds, the bytes as bytes.
#[tokio::test]
async fn off_cpu_and_memory_growth_ship_render_and_export() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("smolder-e2e-wait.c");
    std::fs::write(&source, WAITER).unwrap();
    let exe = dir.path().join("smolder-e2e-wait");
    let built = Command::new("gcc")
        .args(["-O2", "-fomit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&source)
        .status()
        .unwrap();
    assert!(built.success());

    let aggregator = Aggregator::with_config(
        serde_norway::from_str(
            "metrics-export-rules:\n  e2e_wait_seconds_total:\n    expr: smolder-e2e-wait.off_cpu\n  e2e_growth_bytes_total:\n    expr: smolder-e2e-wait.memory_growth\n",
        )
        .unwrap(),
    )
    .await;
    // Started before the agent: followed from the agent's start, its tables preloaded.
    let mut workload = Command::new(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut config = agent_config(aggregator.quic_addr(), aggregator.dir());
    config.ebpf.enabled = true;
    config.window.length = Duration::from_secs(1);
    config.ebpf.relabel_configs = serde_norway::from_str::<Vec<RelabelConfig>>(
        "- {source_labels: [__meta_process_exe], regex: '.*/smolder-e2e-wait', action: keep}",
    )
    .unwrap();
    config.ebpf.off_cpu.enabled = true;
    config.ebpf.off_cpu.probability = 1.0;
    config.ebpf.off_cpu.max_unwinds_per_second = 0;
    config.ebpf.memory.enabled = true;
    config.ebpf.memory.period = 16;
    let agent = agent_app::start_in(config, state.path()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    workload.stdin.take().unwrap().write_all(b"\n").unwrap();
    let output = tokio::task::spawn_blocking(move || workload.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let napped: u64 = String::from_utf8(output.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Past the last window: the agent ships what it has as it stops.
    tokio::time::sleep(Duration::from_secs(2)).await;
    agent.stop().await.unwrap();

    let off_cpu = r#"smolder-e2e-wait.off_cpu{hostname="test-host"}"#;
    let memory = r#"smolder-e2e-wait.memory_growth{hostname="test-host"}"#;
    eventually(
        Duration::from_secs(30),
        "both series are stored",
        || async {
            aggregator.collapsed(off_cpu).await.contains("e2e_nap")
                && aggregator.collapsed(memory).await.contains("e2e_touch")
        },
    )
    .await;
    let (waited, off_cpu_meta) = render_total(&aggregator, off_cpu).await;
    assert_eq!(off_cpu_meta["units"], "nanoseconds");
    let (grown, memory_meta) = render_total(&aggregator, memory).await;
    assert_eq!(memory_meta["units"], "bytes");
    // Every nap at probability 1.0; 64 MiB of first touches, one fault in 16 counted 16 times.
    assert!(
        waited as f64 >= 0.9 * napped as f64,
        "{waited} ns rendered, {napped} ns napped"
    );
    assert!(
        grown as f64 >= 0.8 * (64 << 20) as f64,
        "{grown} bytes rendered of 64 MiB"
    );

    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let types: ProfileTypesResponse = call(
        &aggregator,
        "ProfileTypes",
        &ProfileTypesRequest {
            start: now_ms - 3_600_000,
            end: now_ms + 60_000,
        },
    )
    .await;
    let ids: Vec<&str> = types.profile_types.iter().map(|t| t.id.as_str()).collect();
    for id in [OFF_CPU, MEMORY_GROWTH] {
        assert!(ids.contains(&id), "{id} not in {ids:?}");
    }

    // The rules saw every profile /render sums: seconds for nanoseconds, bytes as bytes.
    let exported = exported_metrics(&aggregator).await;
    let seconds = exported.value("e2e_wait_seconds_total", &[]);
    assert!(
        (seconds - waited as f64 / 1e9).abs() <= 1e-6 * seconds,
        "exported {seconds} s, /render {waited} ns"
    );
    assert_eq!(exported.value("e2e_growth_bytes_total", &[]), grown as f64);
}

/// The total of `query` in /render (its flamebearer's `numTicks`) and its metadata.
async fn render_total(aggregator: &Aggregator, query: &str) -> (u64, serde_json::Value) {
    let json: serde_json::Value = aggregator
        .http
        .get(aggregator.url("/render"))
        .query(&[("query", query), ("from", "now-1h"), ("until", "now+1m")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let total = json["flamebearer"]["numTicks"].as_u64().expect("numTicks");
    (total, json["metadata"].clone())
}

async fn exported_metrics(aggregator: &Aggregator) -> Metrics {
    let text = aggregator
        .http
        .get(aggregator.url("/exported-metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    Metrics::parse(&text).expect("Prometheus text")
}
