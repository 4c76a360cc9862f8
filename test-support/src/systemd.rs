//! A daemon binary under a service manager: with `NOTIFY_SOCKET` and `WATCHDOG_USEC` set, as
//! systemd sets them for `Type=notify` and `WatchdogSec=`, it must say READY=1 once serving,
//! ping the watchdog, and say STOPPING=1 on SIGTERM, then exit successfully.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::process::{Process, daemon};

/// Runs `bin` with `config` (YAML; its listeners must bind port 0) in a temporary data
/// directory under a fake `NOTIFY_SOCKET`, and checks the notifications a `Type=notify` unit
/// with `WatchdogSec=` gets.
///
/// # Panics
///
/// When a notification does not come in time or the daemon exits unsuccessfully.
pub fn notifies_ready_watchdog_and_stopping(bin: &Path, config: &str) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("binding the notify socket");
    let config_path = dir.path().join("config.yaml");
    std::fs::write(&config_path, config).expect("writing the config");
    let mut command = daemon(bin, "warn");
    command
        .arg("--config")
        .arg(&config_path)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("NOTIFY_SOCKET", &socket_path)
        // 200 ms: pings every 100 ms.
        .env("WATCHDOG_USEC", "200000")
        .env_remove("WATCHDOG_PID");
    let mut process = Process::spawn(command);

    expect_line(&socket, "READY=1", Duration::from_secs(30));
    expect_line(&socket, "WATCHDOG=1", Duration::from_secs(5));
    expect_line(&socket, "WATCHDOG=1", Duration::from_secs(5));
    process.terminate();
    expect_line(&socket, "STOPPING=1", Duration::from_secs(10));
    let status = process.wait();
    assert!(status.success(), "{status}\n{}", process.log());
}

/// Receives datagrams until one has the line `want`, or fails after `within`.
fn expect_line(socket: &UnixDatagram, want: &str, within: Duration) {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        socket
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .expect("a positive timeout");
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
