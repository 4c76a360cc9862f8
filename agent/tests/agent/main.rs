//! The agent as a whole, over its real HTTP port.

/// The eBPF source: the real sampler, loaded as root, sampling workloads the tests build.
mod ebpf;
/// Health: every loop in `/healthz` and `/readyz`, a symbolizer panic restarted and reported,
/// a shipper without an aggregator degraded.
mod health;
/// The crate's layout: stages import only the stages below them (the edges ARCHITECTURE.md
/// lists).
mod layout;
/// Off-CPU and memory growth: blocked time, lock sites, long waits split per window, bytes
/// touched and huge pages, against workloads that measure themselves.
mod offcpu;
/// CPython: detection, offsets per release, the user-space reader, the kernel walk.
mod python;
/// Rules: the documented example on every window, `/exported-metrics`, invalid rules.
mod rules;
/// Pull mode: scraping real pprof targets, bad targets, TLS and auth, file and HTTP discovery.
mod scrape;

/// The binary under systemd: READY=1, watchdog pings, STOPPING=1 over `NOTIFY_SOCKET`.
mod systemd;

/// The spool on disk: restarts, the data directory lock, the age bound.
mod spool;

/// Whole stacks: programs built without frame pointers and Debian's python3.11, as root and
/// under the unit's capabilities, checked against perf, a uprobe point check and debuginfod.
mod unwind;

/// Upgrades: this agent's binary shipping to an aggregator of the previous release (its
/// binary, `scripts/previous-release`).
mod upgrade;

/// Fixtures: agents under test on port 0, shipping to a socket that never answers.
mod util;

use smolder_agent::app;
use smolder_agent::config::Config;
use smolder_test_support::prometheus::Metrics;

fn local_config() -> Config {
    util::isolated(Config::default())
}

#[tokio::test]
async fn serves_health_and_metrics() {
    let agent = app::start(local_config()).await.unwrap();
    let base = format!("http://{}", agent.addr());
    let health = reqwest::get(format!("{base}/healthz")).await.unwrap();
    assert_eq!(health.status(), 200);
    let metrics = Metrics::scrape(&format!("{base}/metrics")).await;
    // The window loop's counter is there (a missing metric fails the lookup).
    metrics.value("smolder_agent_window_windows_closed_total", &[]);
    agent.stop().await.unwrap();
}
