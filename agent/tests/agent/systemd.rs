//! The agent binary under a service manager: with `NOTIFY_SOCKET` and `WATCHDOG_USEC` set, as
//! systemd sets them for `Type=notify` and `WatchdogSec=`, it says READY=1 once serving, pings
//! the watchdog, and says STOPPING=1 on SIGTERM.

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Receives datagrams until one has the line `want`, or fails after `within`.
fn expect_line(socket: &UnixDatagram, want: &str, within: Duration) {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        socket
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        let Ok(len) = socket.recv(&mut buf) else {
            break;
        };
        let message = String::from_utf8_lossy(&buf[..len]).into_owned();
        if message.lines().any(|line| line == want) {
            return;
        }
        seen.push(message);
    }
    panic!("no {want} within {within:?}; received {seen:?}");
}

#[test]
fn notifies_ready_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "http:\n  listen: 127.0.0.1:0\nebpf:\n  enabled: false\nship:\n  aggregator: {}\n",
            crate::util::silent_aggregator()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_smolder-agent"))
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--log-level")
        .arg("warn")
        .env("NOTIFY_SOCKET", &socket_path)
        // 200 ms: pings every 100 ms.
        .env("WATCHDOG_USEC", "200000")
        .env_remove("WATCHDOG_PID")
        .stdout(Stdio::null())
        .spawn()
        .expect("the agent binary starts");

    expect_line(&socket, "READY=1", Duration::from_secs(30));
    expect_line(&socket, "WATCHDOG=1", Duration::from_secs(5));
    expect_line(&socket, "WATCHDOG=1", Duration::from_secs(5));
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    expect_line(&socket, "STOPPING=1", Duration::from_secs(10));
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}
