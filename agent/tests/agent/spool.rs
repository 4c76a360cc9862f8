//! The spool on disk: what the agent produces while no aggregator answers stays, across
//! restarts, within its bounds.

use std::path::Path;
use std::time::{Duration, SystemTime};

use smolder_agent::app::{self, Running};
use smolder_agent::config::Config;
use smolder_common::{Profile, ProfileMeta, Tree};
use smolder_test_support::prometheus::Metrics;
use smolder_test_support::wait::eventually;

/// An agent whose aggregator never answers: a UDP socket nothing reads and TLS files that do
/// not exist.
fn unreachable_config(dir: &Path) -> Config {
    let mut config = crate::util::isolated(Config::default());
    // These tests count the batches of the profiles they submit; the eBPF source would add
    // the host's own.
    config.ebpf.enabled = false;
    config.window.length = Duration::from_millis(250);
    config.window.settle = Duration::ZERO;
    config.ship.ca = dir.join("missing-ca.pem");
    config.ship.token_file = dir.join("missing-token");
    config.ship.backoff_min = Duration::from_millis(50);
    config.ship.backoff_max = Duration::from_millis(200);
    config
}

fn profile(value: u64, at: SystemTime) -> Profile {
    let mut tree = Tree::new();
    tree.insert_names(["main", "work"], value);
    Profile {
        series: "kept.cpu".parse().unwrap(),
        meta: ProfileMeta::default(),
        from: at - Duration::from_millis(1),
        until: at,
        tree,
    }
}

/// The agent's `/metrics`.
async fn metrics(agent: &Running) -> Metrics {
    Metrics::scrape(&format!("http://{}/metrics", agent.addr())).await
}

/// Waits until metric `name` with `labels` (which must exist) is `value`.
async fn wait_for(agent: &Running, name: &str, labels: &[(&str, &str)], value: f64) {
    eventually(
        Duration::from_secs(20),
        &format!("{name}{labels:?} reaching {value}"),
        || async { metrics(agent).await.value(name, labels) == value },
    )
    .await;
}

/// Three windows in the recent past, one batch each.
async fn produce_three(agent: &Running) {
    let base = SystemTime::now() - Duration::from_secs(30);
    for i in 0..3u64 {
        agent
            .submitter()
            .submit(profile(i + 1, base + Duration::from_secs(i)))
            .await
            .unwrap();
        wait_for(
            agent,
            "smolder_agent_spool_batches_written_total",
            &[],
            i as f64 + 1.0,
        )
        .await;
    }
}

#[tokio::test]
async fn batches_and_the_agent_id_survive_a_restart() {
    let state = tempfile::tempdir().unwrap();
    let config = unreachable_config(state.path());
    let agent = app::start_in(config.clone(), state.path()).await.unwrap();
    let id = agent.agent_id().to_owned();
    assert_eq!(id.len(), 32, "{id}");
    produce_three(&agent).await;
    wait_for(&agent, "smolder_agent_spool_batches", &[], 3.0).await;
    assert!(
        metrics(&agent)
            .await
            .value("smolder_agent_spool_bytes", &[])
            > 0.0
    );
    wait_for(&agent, "smolder_agent_ship_connected", &[], 0.0).await;
    assert!(
        metrics(&agent)
            .await
            .value("smolder_agent_ship_reconnects_total", &[])
            >= 1.0
    );
    agent.stop().await.unwrap();

    let agent = app::start_in(config, state.path()).await.unwrap();
    assert_eq!(agent.agent_id(), id, "the agent id is kept with the spool");
    wait_for(&agent, "smolder_agent_spool_batches", &[], 3.0).await;
    produce_three(&agent).await;
    wait_for(&agent, "smolder_agent_spool_batches", &[], 6.0).await;
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn a_second_agent_on_the_same_data_dir_fails_clearly() {
    let state = tempfile::tempdir().unwrap();
    let config = unreachable_config(state.path());
    let first = app::start_in(config.clone(), state.path()).await.unwrap();
    let Err(err) = app::start_in(config, state.path()).await else {
        panic!("a second agent started on the same spool");
    };
    assert!(
        format!("{err:#}").contains("opening the spool in"),
        "{err:#}"
    );
    first.stop().await.unwrap();
}

#[tokio::test]
async fn batches_past_the_age_bound_are_dropped_and_counted() {
    let state = tempfile::tempdir().unwrap();
    let mut config = unreachable_config(state.path());
    config.spool.max_age = Duration::from_secs(1);
    let agent = app::start_in(config, state.path()).await.unwrap();
    produce_three(&agent).await;
    // The age bound is applied every 10 s.
    wait_for(
        &agent,
        "smolder_agent_dropped_batches_total",
        &[("stage", "spool"), ("reason", "expired")],
        3.0,
    )
    .await;
    assert_eq!(
        metrics(&agent)
            .await
            .value("smolder_agent_spool_batches", &[]),
        0.0
    );
    agent.stop().await.unwrap();
}
