//! Fixtures shared by the agent's tests: agents under test collide with no Smolder running on
//! this host on the default ports.

use std::net::{SocketAddr, UdpSocket};
use std::sync::{Mutex, MutexGuard, OnceLock};

use smolder_agent::config::Config;

/// A UDP socket on a port the system chose, open for the whole test binary and never read:
/// where agents under test ship, so that none dials the default `127.0.0.1:4041`, where a real
/// aggregator may listen. Its handshakes go unanswered.
pub(crate) fn silent_aggregator() -> SocketAddr {
    static SOCKET: OnceLock<UdpSocket> = OnceLock::new();
    SOCKET
        .get_or_init(|| UdpSocket::bind("127.0.0.1:0").expect("binding a UDP socket"))
        .local_addr()
        .expect("a bound socket has an address")
}

/// `config` for an agent under test: its HTTP port on port 0 and its batches shipped to
/// [`silent_aggregator`].
pub(crate) fn isolated(mut config: Config) -> Config {
    config.http.listen = "127.0.0.1:0".parse().expect("a valid address");
    config.ship.aggregator = silent_aggregator().to_string();
    config
}

/// Serialises the tests that sample the whole host (`ebpf`, `unwind`): each would see the
/// others' workloads and compete for the CPUs.
pub(crate) fn exclusive() -> MutexGuard<'static, ()> {
    static HOST: Mutex<()> = Mutex::new(());
    HOST.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
