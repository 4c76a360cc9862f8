//! Health that tells the truth on the aggregator: `/readyz` names the store's loops and remote
//! write; a remote-write receiver that refuses leaves that loop degraded, never unready or
//! unhealthy; a store-writer panic (the test-only fault hook, `SMOLDER_FAULTS`) restarts the
//! writer, `/readyz` says so meanwhile, and once it has rebuilt its head from the logs every
//! acknowledged write is still there and new writes are served.

use std::net::TcpListener;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use smolder_test_support::health::{probe, until};
use smolder_test_support::process::{Process, daemon};
use smolder_test_support::prometheus::Metrics;

/// An aggregator on `dir` with `extra` YAML appended to its config and `faults` asked for,
/// both listeners on port 0.
fn spawn(dir: &Path, extra: &str, faults: &str) -> Process {
    let config = dir.join("aggregator.yaml");
    std::fs::write(
        &config,
        format!("http:\n  listen: 127.0.0.1:0\ningest:\n  quic:\n    listen: 127.0.0.1:0\n{extra}"),
    )
    .unwrap();
    let mut command = daemon(Path::new(env!("CARGO_BIN_EXE_smolder-aggregator")), "info");
    command
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--config")
        .arg(&config)
        .env("SMOLDER_FAULTS", faults);
    Process::spawn(command)
}

/// Pushes `count` samples of `main;work` to `app.cpu` in the 10 s window starting at `from`.
async fn push(base: &str, from: u64, count: u64) -> reqwest::StatusCode {
    reqwest::Client::new()
        .post(format!(
            "{base}/ingest?name=app.cpu&from={from}&until={}",
            from + 10
        ))
        .body(format!("main;work {count}\n"))
        .send()
        .await
        .unwrap()
        .status()
}

/// The total of `app.cpu` over the last hour.
async fn total(base: &str, now: u64) -> u64 {
    let render: serde_json::Value = reqwest::get(format!(
        "{base}/render?query=app.cpu&from={}&until={}&format=json",
        now - 3_600,
        now + 60
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    render["flamebearer"]["numTicks"].as_u64().unwrap_or(0)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn every_loop_is_named_and_a_refused_remote_write_is_degraded_not_unready() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on: the receiver refuses every push at once.
    let refused = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let extra = format!(
        "metrics-export-rules:\n  app_work:\n    expr: app.cpu\n    node: work\n\
         rules:\n  remote-write-url: http://{refused}/api/v1/write\n  remote-write-interval: 1s\n"
    );
    let aggregator = spawn(dir.path(), &extra, "");
    let base = format!("http://{}", aggregator.listening("http"));
    let ready = until(&base, "/readyz", "ready", |a| a.status == 200).await;
    for name in [
        "store_writer",
        "store_cut",
        "store_compaction",
        "store_retention",
    ] {
        assert_eq!(ready.row(name).state, "running", "{}", ready.body);
        assert_eq!(ready.row(name).restarts, 0, "{}", ready.body);
    }
    // A counter to push: the rule counts this write.
    assert_eq!(push(&base, now() / 10 * 10 - 60, 5).await, 200);
    let ready = until(&base, "/readyz", "remote write degraded", |a| {
        a.is("remote_write", "degraded")
    })
    .await;
    assert_eq!(ready.status, 200, "degraded is ready:\n{}", ready.body);
    assert!(
        ready
            .row("remote_write")
            .detail
            .contains(&refused.to_string()),
        "{}",
        ready.body
    );
    let live = probe(&base, "/healthz").await;
    assert_eq!(live.status, 200, "degraded is live:\n{}", live.body);
    let metrics = Metrics::scrape(&format!("{base}/metrics")).await;
    assert_eq!(
        metrics.value(
            "smolder_aggregator_health_loop_state",
            &[("loop", "remote_write"), ("state", "degraded")]
        ),
        1.0
    );
}

#[tokio::test]
async fn a_store_writer_panic_restarts_the_writer_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    // The second write panics the writer: the first is acknowledged before it.
    let aggregator = spawn(dir.path(), "", "store-writer-panic@2");
    let base = format!("http://{}", aggregator.listening("http"));
    until(&base, "/readyz", "ready", |a| a.status == 200).await;
    let from = now() / 10 * 10 - 120;
    assert_eq!(push(&base, from, 7).await, 200);

    // Its caller gets an error (the write is in the log, maybe durable: at least once, like a
    // kill between the log's sync and the answer).
    let failed = push(&base, from + 10, 100).await;
    assert!(failed.is_server_error(), "{failed}");
    let restarting = until(&base, "/readyz", "the writer restarting", |a| {
        a.is("store_writer", "restarting")
    })
    .await;
    assert_eq!(restarting.status, 503, "{}", restarting.body);
    assert!(
        restarting
            .row("store_writer")
            .detail
            .contains("injected fault store-writer-panic"),
        "{}",
        restarting.body
    );
    // Restarting is not dead: the process is live (the watchdog pinged).
    let live = probe(&base, "/healthz").await;
    assert_eq!(live.status, 200, "{}", live.body);

    let ready = until(&base, "/readyz", "the writer running again", |a| {
        a.status == 200 && a.is("store_writer", "running")
    })
    .await;
    assert_eq!(ready.row("store_writer").restarts, 1, "{}", ready.body);
    assert_eq!(push(&base, from + 20, 11).await, 200);
    let total = total(&base, now()).await;
    // The acknowledged writes exactly once; the failed one at most once.
    assert!(
        total == 7 + 11 || total == 7 + 100 + 11,
        "total {total}\n{}",
        aggregator.log()
    );
    let metrics = Metrics::scrape(&format!("{base}/metrics")).await;
    assert_eq!(
        metrics.value(
            "smolder_aggregator_health_restarts_total",
            &[("loop", "store_writer")]
        ),
        1.0
    );
    let log = aggregator.log();
    assert!(
        log.contains("a loop failed; restarting it") && log.contains("store-writer-panic"),
        "{log}"
    );
}
