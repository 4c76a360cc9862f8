//! Addresses for tests: port 0 on loopback, and a peer that never answers.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::OnceLock;

/// `127.0.0.1:0`: loopback, a port the system chooses when the listener binds.
pub const LOOPBACK_ANY_PORT: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0));

/// A UDP socket on a port the system chose, open for the whole test binary and never read:
/// where agents under test ship when no aggregator should get their batches, so that none dials
/// the default `127.0.0.1:4041`, where a real aggregator may listen. Its handshakes go
/// unanswered.
pub fn silent_udp() -> SocketAddr {
    static SOCKET: OnceLock<UdpSocket> = OnceLock::new();
    SOCKET
        .get_or_init(|| UdpSocket::bind(LOOPBACK_ANY_PORT).expect("binding a UDP socket"))
        .local_addr()
        .expect("a bound socket has an address")
}
