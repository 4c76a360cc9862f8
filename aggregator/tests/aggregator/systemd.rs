//! The aggregator binary under a service manager: the check both daemons pass
//! (`smolder_test_support::systemd`).

use std::path::Path;

use smolder_test_support::systemd::notifies_ready_watchdog_and_stopping;

#[test]
fn notifies_ready_watchdog_and_stopping_under_systemd() {
    notifies_ready_watchdog_and_stopping(
        Path::new(env!("CARGO_BIN_EXE_smolder-aggregator")),
        "http:\n  listen: 127.0.0.1:0\ningest:\n  quic:\n    listen: 127.0.0.1:0\n",
    );
}
