//! This agent (its real binary) shipping to an aggregator of the previous release
//! (`v0.1.0`, its real binary), which announces only its batch size and knows nothing of split
//! windows or refused series: windows larger than its batches are split (the first, spooled
//! before its welcome, after the aggregator refused it as too large), series over its default
//! limits are dropped and counted before they are sent, and every other series is stored once.
//! The other direction is the aggregator's `upgrade` test.

use std::path::Path;
use std::time::Duration;

use smolder_test_support::previous::{self, PprofTarget};
use smolder_test_support::process::{Process, daemon};
use smolder_test_support::prometheus::Metrics;
use smolder_test_support::wait::eventually;

/// How many profiles the target serves.
const SCRAPES: usize = 4;
/// Series per profile, each a label value.
const SERIES: u64 = 200;

#[tokio::test]
async fn this_agent_ships_to_an_aggregator_of_the_previous_release() {
    let release = previous::release(Path::new(env!("CARGO_TARGET_TMPDIR")));
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("aggregator");
    let config = root.path().join("aggregator.yaml");
    // Batches of at most 8 KiB: a window of 200 series does not fit one.
    std::fs::write(
        &config,
        "http:\n  listen: 127.0.0.1:0\ningest:\n  quic:\n    listen: 127.0.0.1:0\n    max-batch-bytes: 8192\n",
    )
    .unwrap();
    let mut command = daemon(&release.aggregator, "warn");
    command
        .arg("--data-dir")
        .arg(&data)
        .arg("--config")
        .arg(&config);
    let aggregator = Process::spawn(command);
    let http = aggregator.listening("http");
    let quic = aggregator.listening("quic");

    // Two hundred series, and one whose label is past v0.1's default limit (1024 bytes), which
    // the old aggregator would refuse with its whole batch.
    let names: Vec<String> = (0..SERIES).map(|i| format!("s{i:03}")).collect();
    let long = "x".repeat(1_100);
    let mut series: Vec<(&str, u64)> = names
        .iter()
        .enumerate()
        .map(|(i, name)| (name.as_str(), i as u64 + 1))
        .collect();
    series.push((&long, 1_000));
    let target = PprofTarget::serve(previous::cpu_pprof("shard", &series), SCRAPES);

    let agent_config = root.path().join("agent.yaml");
    std::fs::write(
        &agent_config,
        previous::agent_yaml("current", &quic.to_string(), &data, target.addr()),
    )
    .unwrap();
    let mut command = daemon(Path::new(env!("CARGO_BIN_EXE_smolder-agent")), "info");
    command
        .arg("--data-dir")
        .arg(root.path().join("agent"))
        .arg("--config")
        .arg(&agent_config);
    let agent = Process::spawn(command);
    let agent_http = agent.listening("http");

    let base = format!("http://{http}");
    let each: u64 = (1..=SERIES).sum();
    let expected = each * SCRAPES as u64;
    eventually(Duration::from_secs(90), "every scrape stored", || async {
        target.served() == SCRAPES && previous::ticks(&base, "current.cpu").await >= expected
    })
    .await;
    let agent_url = format!("http://{agent_http}/metrics");
    eventually(Duration::from_secs(30), "the spool drains", || async {
        Metrics::scrape(&agent_url)
            .await
            .value("smolder_agent_spool_batches", &[])
            == 0.0
    })
    .await;
    // Stored once: nothing more comes after the resends a split could cause.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(previous::ticks(&base, "current.cpu").await, expected);

    let text = Metrics::scrape(&agent_url).await;
    let served = Metrics::scrape(&format!("{base}/metrics")).await;
    // The long-labelled series never left the agent: dropped and counted, once per window.
    let long_dropped = text.value(
        "smolder_agent_dropped_series_total",
        &[("stage", "spool"), ("reason", "label_too_long")],
    );
    assert!(
        (1.0..=SCRAPES as f64).contains(&long_dropped),
        "{long_dropped}: {text:?}"
    );
    assert_eq!(
        text.value("smolder_agent_dropped_batches_total", &[]),
        0.0,
        "{text:?}"
    );
    // Every batch the old aggregator stored was within its 8 KiB, so windows were split.
    let written = text.value("smolder_agent_spool_batches_written_total", &[]);
    assert!(
        written >= 2.0 * long_dropped,
        "several batches per window: {text:?}"
    );
    let acked = served.value("smolder_aggregator_ingest_quic_batches_acked_total", &[]);
    assert_eq!(
        text.value("smolder_agent_ship_batches_acked_total", &[]),
        acked
    );
    // The first window, spooled before the welcome told the limit, was refused as too large
    // (v0.1 says so without a code), and split then; the others were split as they were spooled.
    let rejected = served.value("smolder_aggregator_ingest_quic_batches_rejected_total", &[]);
    assert_eq!(rejected, 1.0, "{served:?}");
    assert_eq!(
        text.value(
            "smolder_agent_ship_batches_rejected_total",
            &[("retryable", "false")]
        ),
        rejected
    );
    drop(agent);
    drop(aggregator);
}

#[tokio::test]
async fn an_agent_upgraded_in_place_ships_what_the_previous_release_spooled() {
    let release = previous::release(Path::new(env!("CARGO_TARGET_TMPDIR")));
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("aggregator");
    let state = root.path().join("agent");
    let series = [("a", 2), ("b", 3)];
    let target = PprofTarget::serve(previous::cpu_pprof("shard", &series), 3);

    // v0.1 spools (in sled) while no aggregator answers, and stops.
    let silent = smolder_test_support::net::silent_udp().to_string();
    let old_config = root.path().join("old.yaml");
    std::fs::write(
        &old_config,
        previous::agent_yaml("inplace", &silent, &data, target.addr()),
    )
    .unwrap();
    let mut command = daemon(&release.agent, "info");
    command
        .arg("--data-dir")
        .arg(&state)
        .arg("--config")
        .arg(&old_config);
    let mut old = Process::spawn(command);
    let id_line = old.wait_for_line("its new agent id", |line| line.contains("new agent id"));
    let id: serde_json::Value = serde_json::from_str(&id_line).unwrap();
    let id = id["fields"]["agent_id"].as_str().unwrap().to_owned();
    let old_http = old.listening("http");
    let old_url = format!("http://{old_http}/metrics");
    eventually(Duration::from_secs(60), "three scrapes spooled", || async {
        target.served() == 3
            && Metrics::scrape(&old_url)
                .await
                .value("smolder_agent_spool_batches", &[])
                >= 1.0
    })
    .await;
    old.terminate();
    assert!(old.wait().success(), "{}", old.log());
    assert!(state.join("spool/db").exists(), "v0.1's spool is sled");

    // This release on the same data directory: the spool moves into files, same agent id, and
    // everything v0.1 scraped reaches the aggregator once.
    let aggregator_config = root.path().join("aggregator.yaml");
    std::fs::write(
        &aggregator_config,
        "http:\n  listen: 127.0.0.1:0\ningest:\n  quic:\n    listen: 127.0.0.1:0\n",
    )
    .unwrap();
    let mut command = daemon(
        &release.aggregator,
        "warn,smolder_aggregator::ingest::quic=info",
    );
    command
        .arg("--data-dir")
        .arg(&data)
        .arg("--config")
        .arg(&aggregator_config);
    let aggregator = Process::spawn(command);
    let http = aggregator.listening("http");
    let quic = aggregator.listening("quic");
    let new_config = root.path().join("new.yaml");
    std::fs::write(
        &new_config,
        previous::agent_yaml("inplace", &quic.to_string(), &data, target.addr()),
    )
    .unwrap();
    let mut command = daemon(Path::new(env!("CARGO_BIN_EXE_smolder-agent")), "info");
    command
        .arg("--data-dir")
        .arg(&state)
        .arg("--config")
        .arg(&new_config);
    let agent = Process::spawn(command);
    agent.wait_for_line("the migration", |line| {
        line.contains("moved the v0.1 spool (sled) into files")
    });
    let base = format!("http://{http}");
    let expected = 3 * (2 + 3);
    eventually(Duration::from_secs(60), "v0.1's batches stored", || async {
        previous::ticks(&base, "inplace.cpu").await == expected
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        previous::ticks(&base, "inplace.cpu").await,
        expected,
        "once"
    );
    assert!(!state.join("spool/db").exists(), "sled's files are gone");
    assert!(
        aggregator.log().contains(&format!("\"agent_id\":\"{id}\"")),
        "the same agent id: {}",
        aggregator.log()
    );
    drop(agent);
    drop(aggregator);
}
