//! The aggregator as a process: acknowledged data survives `kill -9`, and a second aggregator
//! on the same data directory refuses to start.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use smolder_test_support::process::{Process, daemon};

/// An aggregator on `data_dir`, both listeners on port 0.
fn spawn(data_dir: &Path) -> Process {
    let config = data_dir.with_extension("yaml");
    std::fs::write(
        &config,
        "http:\n  listen: 127.0.0.1:0\ningest:\n  quic:\n    listen: 127.0.0.1:0\n",
    )
    .unwrap();
    let mut command = daemon(Path::new(env!("CARGO_BIN_EXE_smolder-aggregator")), "warn");
    command
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--config")
        .arg(&config);
    Process::spawn(command)
}

async fn wait_ready(http: &reqwest::Client, addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(response) = http.get(format!("http://{addr}/healthz")).send().await
            && response.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("aggregator on {addr} not ready after 30 s");
}

#[tokio::test]
async fn acknowledged_profiles_survive_kill_9() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let http = reqwest::Client::new();
    let mut child = spawn(&data);
    let addr = child.listening("http");
    wait_ready(&http, addr).await;

    // Concurrent writers, each acknowledged before the kill; recent enough that retention keeps
    // them.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let from = now.as_secs() / 10 * 10 - 600;
    let mut writes = Vec::new();
    for i in 0..32u64 {
        let http = http.clone();
        writes.push(tokio::spawn(async move {
            let url = format!(
                "http://{addr}/ingest?name=durable.cpu&from={}&until={}",
                from + i * 10,
                from + i * 10 + 10
            );
            http.post(url)
                .body(format!("main;work;f{} {}\n", i % 4, i + 1))
                .send()
                .await
        }));
    }
    let mut acknowledged = 0;
    for (i, write) in writes.into_iter().enumerate() {
        let response = write.await.unwrap().expect("request completes");
        assert_eq!(response.status(), 200, "write {i}");
        acknowledged += i as u64 + 1;
    }
    child.kill();

    let mut child = spawn(&data);
    let addr = child.listening("http");
    wait_ready(&http, addr).await;
    let render: serde_json::Value = http
        .get(format!(
            "http://{addr}/render?query=durable.cpu&from={from}&until={}&format=json",
            from + 1_000
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(render["flamebearer"]["numTicks"], acknowledged, "{render}");
    child.kill();
}

#[tokio::test]
async fn a_second_aggregator_on_the_same_directory_fails_clearly() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let http = reqwest::Client::new();
    let mut first = spawn(&data);
    let addr = first.listening("http");
    wait_ready(&http, addr).await;

    let mut second = spawn(&data);
    assert!(!second.wait().success());
    let stderr = second.log();
    assert!(
        stderr.contains("is in use by another aggregator"),
        "{stderr}"
    );
    first.kill();
}
