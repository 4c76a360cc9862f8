//! A process on this host, sampled by the agent's eBPF source, shows up in the aggregator's
//! `/render` with its function names: the stages of both tiers end to end, nothing mocked.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use smolder_agent::app as agent_app;
use smolder_agent::relabel::RelabelConfig;

use smolder_test_support::wait::eventually;

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
