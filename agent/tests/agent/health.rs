//! Health that tells the truth: `/healthz` and `/readyz` name every loop of a real agent; a
//! symbolizer panic (the test-only fault hook, `SMOLDER_FAULTS`) restarts the thread, `/readyz`
//! says so meanwhile, and sampling resumes; a shipper without an aggregator is degraded, not
//! dead.

use std::path::Path;
use std::time::{Duration, Instant};

use smolder_agent::app;
use smolder_agent::config::Config;
use smolder_test_support::net::silent_udp;
use smolder_test_support::process::{Process, daemon};
use smolder_test_support::prometheus::Metrics;

use crate::ebpf::{BUSY, build, release, spawn};
use crate::util::{exclusive, isolated};

/// How long a state the test waits for may take on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(120);

/// One row of a health body: state, restarts, detail.
#[derive(Debug)]
struct Row {
    state: String,
    restarts: u64,
    detail: String,
}

/// The status and the rows of `/readyz` or `/healthz`, by loop name.
async fn probe(base: &str, path: &str) -> (u16, String, Vec<(String, Row)>) {
    let response = reqwest::get(format!("{base}{path}")).await.unwrap();
    let status = response.status().as_u16();
    let body = response.text().await.unwrap();
    let rows = body
        .lines()
        .skip_while(|line| !line.starts_with("loop "))
        .skip(1)
        .map(|line| {
            let mut columns = line.split_whitespace();
            let name = columns.next().unwrap().to_owned();
            let state = columns.next().unwrap().to_owned();
            let _beat = columns.next().unwrap();
            let restarts = columns.next().unwrap().parse().unwrap();
            let detail = columns.collect::<Vec<_>>().join(" ");
            (
                name,
                Row {
                    state,
                    restarts,
                    detail,
                },
            )
        })
        .collect();
    (status, body, rows)
}

fn row<'a>(rows: &'a [(String, Row)], name: &str, body: &str) -> &'a Row {
    rows.iter()
        .find(|(n, _)| n == name)
        .map(|(_, row)| row)
        .unwrap_or_else(|| panic!("no loop {name} in\n{body}"))
}

/// Polls `path` until `check` holds for its answer, failing after [`PATIENCE`] with the last
/// body.
async fn until(
    base: &str,
    path: &str,
    what: &str,
    check: impl Fn(u16, &[(String, Row)]) -> bool,
) -> (u16, String, Vec<(String, Row)>) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, body, rows) = probe(base, path).await;
        if check(status, &rows) {
            return (status, body, rows);
        }
        assert!(
            Instant::now() < deadline,
            "{what}: last {path} {status}:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn every_loop_is_named_and_ready_once_running() {
    let mut config = isolated(Config::default());
    config.ebpf.enabled = false;
    let agent = app::start(config).await.unwrap();
    let base = format!("http://{}", agent.addr());
    let (_, body, rows) = until(&base, "/readyz", "ready", |status, _| status == 200).await;
    for name in ["window", "spool", "ship"] {
        let row = row(&rows, name, &body);
        assert_eq!(row.state, "running", "{body}");
        assert_eq!(row.restarts, 0, "{body}");
    }
    let (status, body, _) = probe(&base, "/healthz").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("ok\n"), "{body}");
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
    let (status, body, rows) = until(&base, "/readyz", "the shipper degraded", |_, rows| {
        rows.iter()
            .any(|(name, row)| name == "ship" && row.state == "degraded")
    })
    .await;
    assert_eq!(status, 200, "degraded is ready:\n{body}");
    assert!(
        row(&rows, "ship", &body).detail.contains("aggregator"),
        "{body}"
    );
    let (status, body, _) = probe(&base, "/healthz").await;
    assert_eq!(status, 200, "degraded is live:\n{body}");
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
        let (status, body, rows) =
            until(&base, "/readyz", "the symbolizer restarting", |_, rows| {
                rows.iter()
                    .any(|(name, row)| name == "symbolize" && row.state == "restarting")
            })
            .await;
        assert_eq!(status, 503, "{body}");
        assert!(
            body.lines()
                .next()
                .unwrap()
                .contains("symbolize restarting"),
            "{body}"
        );
        let symbolize = row(&rows, "symbolize", &body);
        assert_eq!(symbolize.restarts, 1, "{body}");
        assert!(
            symbolize.detail.contains("injected fault symbolize-panic"),
            "{body}"
        );
        // Restarting is not dead: the process is live, the watchdog pinged.
        let (status, body, _) = probe(&base, "/healthz").await;
        assert_eq!(status, 200, "{body}");

        let (_, body, rows) = until(
            &base,
            "/readyz",
            "the symbolizer running again",
            |status, rows| {
                status == 200
                    && rows
                        .iter()
                        .any(|(name, row)| name == "symbolize" && row.state == "running")
            },
        )
        .await;
        assert_eq!(row(&rows, "symbolize", &body).restarts, 1, "{body}");
        assert_eq!(row(&rows, "ebpf", &body).state, "running", "{body}");

        // Sampling resumes: the workload's samples keep arriving through later windows.
        let exported = format!("{base}/exported-metrics");
        let after_restart = Metrics::scrape(&exported)
            .await
            .find("busy_seconds", &[])
            .unwrap_or(0.0);
        let deadline = Instant::now() + PATIENCE;
        loop {
            let now = Metrics::scrape(&exported)
                .await
                .find("busy_seconds", &[])
                .unwrap_or(0.0);
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
