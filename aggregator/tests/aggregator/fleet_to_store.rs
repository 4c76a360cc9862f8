//! A fleet on one box, short: simulated agents over QUIC and Pyroscope clients over HTTP
//! (`smolder-fleet`) against one aggregator process for a minute. Acks keep up, every series
//! holds exactly what was acknowledged, and the aggregator's metrics count what the fleet sent.
//! The long run at a thousand agents, and past the knee, is the bench `fleet_to_store`
//! (BENCHMARKS.md).

use std::time::Duration;

use smolder_fleet::{Fleet, FleetConfig, process, verify};
use smolder_test_support::prometheus::Metrics;

use smolder_test_support::env_or;

use crate::util::AggregatorProcess;

/// `SMOLDER_FLEET_AGENTS` agents (default 100) and a tenth of the bench's pushes for
/// `SMOLDER_FLEET_SECONDS` (default 60).
#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_keeps_up_and_every_series_holds_what_was_acknowledged() {
    let agents: usize = env_or("SMOLDER_FLEET_AGENTS", 100);
    let seconds: u64 = env_or("SMOLDER_FLEET_SECONDS", 60);
    let root = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let mut aggregator = AggregatorProcess::new(root.path().join("data"));
    aggregator.start(false);
    aggregator.wait_ready(&http).await;
    let token = std::fs::read_to_string(aggregator.data.join("tls/agent-token")).unwrap();
    let mut config = FleetConfig::new(
        aggregator.quic,
        aggregator.http,
        aggregator.data.join("tls/ca.pem"),
        token.trim().to_owned(),
    );
    config.agents = agents;
    config.pushes_per_second = agents as f64 / 5.0;
    let fleet = Fleet::start(config).await;
    eprintln!("a host's window: {:?}", fleet.shape());
    let window = Duration::from_secs(10);
    let mut backlogs = Vec::new();
    let mut rss = Vec::new();
    let mut elapsed = Duration::ZERO;
    while elapsed < Duration::from_secs(seconds) {
        tokio::time::sleep(window).await;
        elapsed += window;
        let snapshot = fleet.snapshot();
        let usage = process::usage(aggregator.pid()).expect("the aggregator runs");
        eprintln!(
            "{:>3} s: {} windows, {} acked, backlog {}, ack {}, push {}, aggregator RSS {} MiB, CPU {:.1} s, load {:.1}",
            snapshot.elapsed.as_secs(),
            snapshot.totals.windows,
            snapshot.totals.acked,
            snapshot.totals.backlog(),
            snapshot.ack,
            snapshot.push,
            usage.rss >> 20,
            usage.cpu.as_secs_f64(),
            process::load_average()
        );
        backlogs.push(snapshot.totals.backlog());
        rss.push(usage.rss);
    }
    // Keeping up: past the first window, no more than a window per agent waits for its ack.
    assert!(
        backlogs.iter().skip(1).all(|&b| b <= agents as u64),
        "the backlog grew: {backlogs:?}"
    );
    let record = fleet.stop(Duration::from_secs(60)).await;
    let totals = record.totals;
    eprintln!(
        "{totals:?}\nack {}\nage {}\npush {}",
        record.ack, record.age, record.push
    );
    assert!(totals.windows >= agents as u64 * (seconds / 10 - 1));
    assert_eq!(totals.acked, totals.windows, "{totals:?}");
    assert_eq!(
        (totals.rejected, totals.dropped_full, totals.duplicates),
        (0, 0, 0),
        "{totals:?}"
    );
    assert_eq!(totals.connects, agents as u64, "{totals:?}");
    assert!(totals.pushes > 0);
    assert_eq!(totals.pushes_ok, totals.pushes, "{totals:?}");

    let check = verify(
        &http,
        &aggregator.base(),
        &record.tallies,
        record.started,
        record.stopped,
    )
    .await
    .unwrap();
    assert!(check.passed(), "{check}");
    assert_eq!(check.exact, check.series, "{check}");
    assert_eq!(check.series, record.tallies.len());

    // The aggregator counted what the fleet was told.
    let served = Metrics::scrape(&format!("{}/metrics", aggregator.base())).await;
    assert_eq!(
        served.value("smolder_aggregator_ingest_quic_batches_acked_total", &[]),
        totals.acked as f64
    );
    assert_eq!(
        served.value(
            "smolder_aggregator_ingest_profiles_total",
            &[("transport", "http")]
        ),
        totals.pushes_ok as f64
    );
    let series_per_window = record
        .tallies
        .keys()
        .filter(|k| k.label == "hostname")
        .count()
        / agents;
    assert_eq!(
        served.value(
            "smolder_aggregator_ingest_profiles_total",
            &[("transport", "quic")]
        ),
        (totals.acked * series_per_window as u64) as f64
    );
    aggregator.kill();
}
