//! The agent binary under a service manager: the check both daemons pass
//! (`smolder_test_support::systemd`).

use std::path::Path;

use smolder_test_support::net::silent_udp;
use smolder_test_support::systemd::notifies_ready_watchdog_and_stopping;

#[test]
fn notifies_ready_watchdog_and_stopping_under_systemd() {
    notifies_ready_watchdog_and_stopping(
        Path::new(env!("CARGO_BIN_EXE_smolder-agent")),
        &format!(
            "http:\n  listen: 127.0.0.1:0\nebpf:\n  enabled: false\nship:\n  aggregator: {}\n",
            silent_udp()
        ),
    );
}
