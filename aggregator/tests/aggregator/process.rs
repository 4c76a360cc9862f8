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

pub(crate) async fn wait_ready(http: &reqwest::Client, addr: SocketAddr) {
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

/// An aggregator on `data_dir` with `store` YAML under `store:` and `env` set, both listeners
/// on port 0, logging the store's info lines (the test pauses among them).
pub(crate) fn spawn_store(data_dir: &Path, store: &str, env: &[(&str, &str)]) -> Process {
    spawn_config(data_dir, "", store, env)
}

/// [`spawn_store`] with `quic` YAML lines under `ingest.quic:` beside its listener.
pub(crate) fn spawn_config(
    data_dir: &Path,
    quic: &str,
    store: &str,
    env: &[(&str, &str)],
) -> Process {
    let config = data_dir.with_extension("yaml");
    std::fs::write(
        &config,
        format!(
            "http:\n  listen: 127.0.0.1:0\ningest:\n  quic:\n    listen: 127.0.0.1:0\n{quic}store:\n{store}"
        ),
    )
    .unwrap();
    let mut command = daemon(
        Path::new(env!("CARGO_BIN_EXE_smolder-aggregator")),
        "warn,smolder_aggregator::store=info",
    );
    command
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--config")
        .arg(&config);
    for (name, value) in env {
        command.env(name, value);
    }
    Process::spawn(command)
}

/// Every stack of `app` over `[from, until)` with its value, from `/render`'s folded output.
async fn stacks(
    http: &reqwest::Client,
    addr: SocketAddr,
    app: &str,
    from: u64,
    until: u64,
) -> std::collections::BTreeMap<String, u64> {
    let text = http
        .get(format!("http://{addr}/render?query={app}&from={from}&until={until}&format=collapsed&max-nodes=0"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter_map(|line| {
            let (stack, value) = line.rsplit_once(' ')?;
            Some((stack.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// `kill -9` at random moments while writes arrive for ranges already cut and compacted, and
/// while the store cuts and merges (a test pause inside each widens the window): until at
/// least `SMOLDER_CRASH_KILLS` (default 20) kills landed in each of ingest, a cut and a
/// merge. Afterwards every acknowledged write is read exactly once, nothing unacknowledged
/// twice, `check` finds no damage, and the block directory holds no unfinished or replaced
/// file once the next compaction ran.
#[tokio::test]
async fn kill_9_during_ingest_cut_and_compaction_loses_and_doubles_nothing() {
    let wanted: usize = std::env::var("SMOLDER_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // Six hours ago, on a 10 000 s boundary: ranges long closed, so every write is late data
    // that the next cut and compaction take.
    let base = (now - 6 * 3_600) / 10_000 * 10_000;
    let store = "  compaction-interval: 1s\n";
    let pause = [("SMOLDER_STORE_TEST_PAUSE_MS", "400")];
    let mut acked: Vec<u64> = Vec::new();
    let mut sent: u64 = 0;
    let (mut in_ingest, mut in_cut, mut in_merge) = (0, 0, 0);
    let mut rounds = 0;
    let mut seed = now;
    let mut random = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    while (in_ingest < wanted || in_cut < wanted || in_merge < wanted) && rounds < 400 {
        rounds += 1;
        let mut child = spawn_store(&data, store, &pause);
        let addr = child.listening("http");
        wait_ready(&http, addr).await;
        let writer = {
            let http = http.clone();
            let first = sent;
            let offsets: Vec<u64> = (0..200).map(|_| random(2_000) * 10).collect();
            tokio::spawn(async move {
                let mut done = Vec::new();
                for (i, offset) in offsets.into_iter().enumerate() {
                    let id = first + i as u64;
                    let from = base + offset;
                    let url = format!(
                        "http://{addr}/ingest?name=crash.cpu&from={from}&until={}",
                        from + 10
                    );
                    match http.post(url).body(format!("main;w{id} 1\n")).send().await {
                        Ok(r) if r.status().is_success() => done.push(id),
                        _ => break,
                    }
                }
                done
            })
        };
        sent += 200;
        tokio::time::sleep(Duration::from_millis(random(2_500))).await;
        let writing = !writer.is_finished();
        child.kill();
        // Reaped already; this waits for the reader of its stderr to see the last lines.
        child.wait();
        acked.extend(writer.await.unwrap());
        let text = child.log();
        let last_pause = text.lines().rev().find(|l| l.contains("test pause"));
        // A kill can land in a write and a cut or merge at once (cuts no longer hold writes
        // up); it counts for each.
        if writing {
            in_ingest += 1;
        }
        match last_pause {
            Some(line) if !line.contains("pause over") && line.contains("cut written") => {
                in_cut += 1
            }
            Some(line) if !line.contains("pause over") => in_merge += 1,
            _ => {}
        }
    }
    assert!(
        in_ingest >= wanted && in_cut >= wanted && in_merge >= wanted,
        "after {rounds} rounds: {in_ingest} kills during ingest, {in_cut} in a cut, {in_merge} in a merge"
    );

    // A clean start: the head replays, is cut, and compaction runs.
    let mut child = spawn_store(&data, store, &[]);
    let addr = child.listening("http");
    wait_ready(&http, addr).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let read = stacks(&http, addr, "crash.cpu", base, base + 20_000).await;
    for id in &acked {
        assert_eq!(
            read.get(&format!("main;w{id}")),
            Some(&1),
            "acknowledged write {id}"
        );
    }
    assert!(
        read.values().all(|&v| v == 1),
        "a write counted twice: {read:?}"
    );
    child.kill();

    let check = std::process::Command::new(env!("CARGO_BIN_EXE_smolder-aggregator"))
        .arg("--data-dir")
        .arg(&data)
        .arg("check")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{report}");
    assert!(report.contains(" 0 damaged, 0 replaced"), "{report}");
    let mut leftovers = Vec::new();
    for tenant in std::fs::read_dir(data.join("blocks")).unwrap().flatten() {
        for file in std::fs::read_dir(tenant.path()).unwrap().flatten() {
            let name = file.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".block") || name.contains('#') {
                leftovers.push(name);
            }
        }
    }
    assert!(leftovers.is_empty(), "{leftovers:?}");
    eprintln!(
        "{rounds} rounds: {in_ingest} kills during ingest, {in_cut} in a cut, {in_merge} in a merge; {} writes acknowledged of {sent}",
        acked.len()
    );
}
