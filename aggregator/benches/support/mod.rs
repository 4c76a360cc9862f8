//! What the aggregator's scenario benches share: a release aggregator process on port 0 and
//! the wait for its store to settle after writes. Included by each bench with `mod support;`.

// Each bench compiles its own copy and uses a part of it.
#![allow(dead_code, reason = "each bench uses a part of it")]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use smolder_test_support::process::{Process, daemon};
use smolder_test_support::prometheus::Metrics;

/// The release aggregator on `root/data`, both listeners on loopback port 0, with `extra`
/// appended to its config (YAML sections other than `http` and `ingest`; "" for the defaults).
pub(crate) fn spawn(root: &Path, extra: &str) -> Process {
    let config = root.join("aggregator.yaml");
    std::fs::write(
        &config,
        format!("http:\n  listen: 127.0.0.1:0\ningest:\n  quic:\n    listen: 127.0.0.1:0\n{extra}"),
    )
    .expect("writing the config");
    let mut command = daemon(Path::new(env!("CARGO_BIN_EXE_smolder-aggregator")), "warn");
    command
        .arg("--data-dir")
        .arg(root.join("data"))
        .arg("--config")
        .arg(&config);
    Process::spawn(command)
}

/// Waits until the aggregator at `addr` has cut its head and compaction has nothing left to
/// merge: the head-series gauge at zero and the block count unchanged over three seconds.
pub(crate) async fn settle(addr: SocketAddr) {
    let mut last = None;
    let mut stable = 0;
    loop {
        let metrics = Metrics::scrape(&format!("http://{addr}/metrics")).await;
        let now = (
            metrics.value("smolder_aggregator_store_head_series", &[]) as i64,
            metrics.value("smolder_aggregator_store_blocks", &[]) as i64,
        );
        if now.0 == 0 && Some(now) == last {
            stable += 1;
            if stable >= 3 {
                return;
            }
        } else {
            stable = 0;
        }
        last = Some(now);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
