//! An agent of the previous release (`v0.1.0`, its real binary) shipping to this
//! aggregator (its real binary): every batch stored once, series over this aggregator's limits
//! refused one by one with the rest of their batch stored, where v0.1 would have refused the
//! whole batch. The other direction is the agent's `upgrade` test.

use std::path::Path;
use std::time::Duration;

use smolder_test_support::previous::{self, PprofTarget};
use smolder_test_support::process::{Process, daemon};
use smolder_test_support::prometheus::Metrics;
use smolder_test_support::wait::eventually;

/// How many profiles the target serves.
const SCRAPES: usize = 6;

#[tokio::test]
async fn an_agent_of_the_previous_release_ships_to_this_aggregator() {
    let release = previous::release(Path::new(env!("CARGO_TARGET_TMPDIR")));
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("aggregator");
    let config = root.path().join("aggregator.yaml");
    // A label limit the v0.1 agent does not know of: it sends the series, this aggregator
    // refuses them alone.
    std::fs::write(
        &config,
        "http:\n  listen: 127.0.0.1:0\ningest:\n  max-label-bytes: 64\n  quic:\n    listen: 127.0.0.1:0\n",
    )
    .unwrap();
    let mut command = daemon(
        Path::new(env!("CARGO_BIN_EXE_smolder-aggregator")),
        "warn,smolder_aggregator::ingest::quic=info",
    );
    command
        .arg("--data-dir")
        .arg(&data)
        .arg("--config")
        .arg(&config);
    let aggregator = Process::spawn(command);
    let http = aggregator.listening("http");
    let quic = aggregator.listening("quic");

    let long = "x".repeat(100);
    let target = PprofTarget::serve(
        previous::cpu_pprof("shard", &[("a", 3), ("b", 5), (&long, 7)]),
        SCRAPES,
    );
    let agent_config = root.path().join("agent.yaml");
    std::fs::write(
        &agent_config,
        previous::agent_yaml("legacy", &quic.to_string(), &data, target.addr()),
    )
    .unwrap();
    let mut command = daemon(&release.agent, "info");
    command
        .arg("--data-dir")
        .arg(root.path().join("agent"))
        .arg("--config")
        .arg(&agent_config);
    let agent = Process::spawn(command);
    let agent_http = agent.listening("http");

    let base = format!("http://{http}");
    eventually(Duration::from_secs(60), "every scrape stored", || async {
        target.served() == SCRAPES
            && previous::ticks(&base, r#"legacy.cpu{shard="a"}"#).await == 3 * SCRAPES as u64
            && previous::ticks(&base, r#"legacy.cpu{shard="b"}"#).await == 5 * SCRAPES as u64
    })
    .await;
    let agent_url = format!("http://{agent_http}/metrics");
    let agent_metrics = || Metrics::scrape(&agent_url);
    eventually(
        Duration::from_secs(30),
        "the old agent's spool drains",
        || async {
            agent_metrics()
                .await
                .value("smolder_agent_spool_batches", &[])
                == 0.0
        },
    )
    .await;
    // Stored once: nothing more comes after the resends a partial store could cause.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        previous::ticks(&base, "legacy.cpu").await,
        8 * SCRAPES as u64,
        "the series with the long label is refused, the others stored once"
    );

    // What the old agent sees: every batch acknowledged, nothing dropped.
    let old = agent_metrics().await;
    let served = Metrics::scrape(&format!("{base}/metrics")).await;
    let acked = served.value("smolder_aggregator_ingest_quic_batches_acked_total", &[]);
    let duplicates = served.value(
        "smolder_aggregator_ingest_quic_batches_duplicate_total",
        &[],
    );
    assert_eq!(
        old.value("smolder_agent_ship_batches_acked_total", &[]),
        acked,
        "{old:?}"
    );
    assert_eq!(duplicates, 0.0, "{served:?}");
    assert_eq!(old.value("smolder_agent_dropped_batches_total", &[]), 0.0);
    assert_eq!(
        served.find("smolder_aggregator_ingest_quic_batches_rejected_total", &[]),
        None,
        "v0.1 would have refused these batches whole: {served:?}"
    );
    // What this aggregator counts: the long-labelled series, once per window it was in.
    let refused = served.value(
        "smolder_aggregator_dropped_series_total",
        &[("stage", "ingest"), ("reason", "label_too_long")],
    );
    assert!(
        (1.0..=SCRAPES as f64).contains(&refused),
        "{refused}: {served:?}"
    );
    assert!(
        aggregator
            .log()
            .contains("\"agent_version\":\"0.1.0-previous\""),
        "the agent is v0.1's: {}",
        aggregator.log()
    );
    drop(agent);
    drop(aggregator);
}
