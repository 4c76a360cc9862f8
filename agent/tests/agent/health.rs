//! Health that tells the truth: `/healthz` and `/readyz` name every loop of a real agent; a
//! symbolizer panic (the test-only fault hook, `SMOLDER_FAULTS`) restarts the thread, `/readyz`
//! says so meanwhile, and sampling resumes; a shipper without an aggregator is degraded, not
//! dead.

use std::path::Path;
use std::time::{Duration, Instant};

use smolder_agent::app;
use smolder_agent::config::Config;
use smolder_test_support::health::{PATIENCE, probe, until};
use smolder_test_support::net::silent_udp;
use smolder_test_support::process::{Process, daemon};
use smolder_test_support::prometheus::Metrics;

use crate::ebpf::{BUSY, build, release, spawn};
use crate::util::{exclusive, isolated};

#[tokio::test]
async fn every_loop_is_named_and_ready_once_running() {
    let mut config = isolated(Config::default());
    config.ebpf.enabled = false;
    let agent = app::start(config).await.unwrap();
    let base = format!("http://{}", agent.addr());
    let ready = until(&base, "/readyz", "ready", |a| a.status == 200).await;
    for name in ["window", "spool", "ship"] {
        let row = ready.row(name);
        assert_eq!(row.state, "running", "{}", ready.body);
        assert_eq!(row.restarts, 0, "{}", ready.body);
    }
    let live = probe(&base, "/healthz").await;
    assert_eq!(live.status, 200, "{}", live.body);
    assert!(live.body.starts_with("ok\n"), "{}", live.body);
    let metrics = Metrics::scrape(&format!("{base}/metrics")).await;
    assert_eq!(
        metrics.value(
            "smolder_agent_health_loop_state",
            &[("loop", "window"), ("state", "running")]
        ),
        1.0
    );
    assert_eq!(
        metrics.value("smolder_agent_health_restarts_total", &[("loop", "ship")]),
        0.0
    );
    metrics.value(
        "smolder_agent_health_beat_age_seconds",
        &[("loop", "spool")],
    );
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn a_shipper_without_an_aggregator_is_degraded_and_still_ready() {
    let mut config = isolated(Config::default());
    config.ebpf.enabled = false;
    config.window.length = Duration::from_secs(1);
    config.window.settle = Duration::from_millis(100);
    let agent = app::start(config).await.unwrap();
    let base = format!("http://{}", agent.addr());
    // A window to ship: the shipper tries the silent socket until its handshake times out.
    let mut tree = smolder_common::Tree::new();
    tree.insert_names(["main", "work"], 10);
    let now = std::time::SystemTime::now();
    agent
        .submitter()
        .submit(smolder_common::Profile {
            series: "app.cpu".parse().unwrap(),
            meta: smolder_common::ProfileMeta::default(),
            from: now - Duration::from_millis(500),
            until: now,
            tree,
        })
        .await
        .unwrap();
    let ready = until(&base, "/readyz", "the shipper degraded", |a| {
        a.is("ship", "degraded")
    })
    .await;
    assert_eq!(ready.status, 200, "degraded is ready:\n{}", ready.body);
    assert!(
        ready.row("ship").detail.contains("aggregator"),
        "{}",
        ready.body
    );
    let live = probe(&base, "/healthz").await;
    assert_eq!(live.status, 200, "degraded is live:\n{}", live.body);
    agent.stop().await.unwrap();
}

#[test]
fn a_symbolizer_panic_restarts_the_thread_and_readyz_says_so_meanwhile() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "smolder-health-busy", BUSY);
    let config = format!(
        "http:\n  listen: 127.0.0.1:0\n\
         ship:\n  aggregator: {aggregator}\n\
         window:\n  length: 1s\n  settle: 1s\n\
         ebpf:\n  relabel-configs:\n  - source_labels: [__meta_process_exe]\n    regex: '{exe}'\n    action: keep\n\
         metrics-export-rules:\n  busy_seconds:\n    expr: smolder-health-busy.cpu\n    node: busy_function\n",
        aggregator = silent_udp(),
        exe = exe.display(),
    );
    let config_path = dir.path().join("agent.yaml");
    std::fs::write(&config_path, config).unwrap();
    let mut workload = spawn(&exe, 600.0);
    release(&mut workload);
    let mut command = daemon(Path::new(env!("CARGO_BIN_EXE_smolder-agent")), "info");
    command
        .arg("--config")
        .arg(&config_path)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("SMOLDER_FAULTS", "symbolize-panic");
    let agent = Process::spawn(command);
    let base = format!("http://{}", agent.listening("http"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        // The first window's symbolization panics: the thread waits out its backoff.
        let ready = until(&base, "/readyz", "the symbolizer restarting", |a| {
            a.is("symbolize", "restarting")
        })
        .await;
        assert_eq!(ready.status, 503, "{}", ready.body);
        assert!(
            ready
                .body
                .lines()
                .next()
                .unwrap()
                .contains("symbolize restarting"),
            "{}",
            ready.body
        );
        let symbolize = ready.row("symbolize");
        assert_eq!(symbolize.restarts, 1, "{}", ready.body);
        assert!(
            symbolize.detail.contains("injected fault symbolize-panic"),
            "{}",
            ready.body
        );
        // Restarting is not dead: the process is live, the watchdog pinged.
        let live = probe(&base, "/healthz").await;
        assert_eq!(live.status, 200, "{}", live.body);

        let ready = until(&base, "/readyz", "the symbolizer running again", |a| {
            a.status == 200 && a.is("symbolize", "running")
        })
        .await;
        assert_eq!(ready.row("symbolize").restarts, 1, "{}", ready.body);
        assert_eq!(ready.row("ebpf").state, "running", "{}", ready.body);

        // Sampling resumes: the workload's samples keep arriving through later windows.
        // A counter without labels exists from the start, at zero: a missing one is a failure.
        let exported = format!("{base}/exported-metrics");
        let after_restart = Metrics::scrape(&exported).await.value("busy_seconds", &[]);
        let deadline = Instant::now() + PATIENCE;
        loop {
            let now = Metrics::scrape(&exported).await.value("busy_seconds", &[]);
            if now > after_restart {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no samples of the workload after the restart ({now} s)\n{}",
                agent.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let metrics = Metrics::scrape(&format!("{base}/metrics")).await;
        assert_eq!(
            metrics.value(
                "smolder_agent_health_restarts_total",
                &[("loop", "symbolize")]
            ),
            1.0
        );
        assert_eq!(
            metrics.value(
                "smolder_agent_errors_total",
                &[("stage", "ebpf"), ("error_type", "symbolize")]
            ),
            1.0
        );
        // The failed window's samples, if it had any, are counted (the series exists either way).
        metrics.value(
            "smolder_agent_dropped_samples_total",
            &[("stage", "ebpf"), ("reason", "symbolizer_failed")],
        );
    });
    let log = agent.log();
    assert!(
        log.contains("a loop failed; restarting it")
            && log.contains("injected fault symbolize-panic"),
        "{log}"
    );
    agent.terminate();
    let mut agent = agent;
    let status = agent.wait();
    let _ = workload.kill();
    let _ = workload.wait();
    assert!(status.success(), "{status}\n{}", agent.log());
}
