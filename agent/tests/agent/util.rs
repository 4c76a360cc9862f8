//! Fixtures shared by the agent's tests: agents under test collide with no Smolder running on
//! this host on the default ports, and the tests that sample the whole host take turns.

use std::sync::{Mutex, MutexGuard};

use smolder_agent::config::Config;
use smolder_test_support::net::{LOOPBACK_ANY_PORT, silent_udp};

/// `config` for an agent under test: its HTTP port on port 0 and its batches shipped to a
/// socket that never answers ([`silent_udp`]).
pub(crate) fn isolated(mut config: Config) -> Config {
    config.http.listen = LOOPBACK_ANY_PORT;
    config.ship.aggregator = silent_udp().to_string();
    config
}

/// Serialises the tests that sample the whole host (`ebpf`, `offcpu`, `unwind`): each would see the
/// others' workloads and compete for the CPUs.
pub(crate) fn exclusive() -> MutexGuard<'static, ()> {
    static HOST: Mutex<()> = Mutex::new(());
    HOST.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
