//! The agent → aggregator protocol: QUIC streams carrying framed, lz4-compressed protobuf.
//!
//! One connection per agent (ALPN [`ALPN`]). Its first bidirectional stream carries a
//! [`Hello`] (agent id, hostname, version, token), answered by a [`Welcome`] or a [`Reject`].
//! Every batch then opens its own bidirectional stream: the agent writes one
//! [`BatchMessage`] frame and finishes its side; the aggregator answers one [`Ack`] once the
//! batch is durable, or a [`Reject`] saying why and whether a retry can help.
//!
//! Every message is a frame ([`frame`]): a 16-byte header with a magic, the
//! [`PROTOCOL_VERSION`], the kind and both body lengths, then an lz4 block. Readers check the
//! lengths against their caps before they allocate or decompress anything. Trees travel in
//! Smolder's own encoding ([`Tree::encode`](crate::Tree::encode)).
//!
//! A batch is identified by (agent id, sequence): the aggregator stores each at most once, so an
//! agent can resend anything it has no ack for.
//!
//! ```
//! use smolder_common::wire::{self, Ack, FrameKind, FrameLimits};
//!
//! let bytes = wire::frame::encode(FrameKind::Ack, &Ack { sequence: 3, duplicate: false });
//! let ack: Ack = wire::frame::decode(&bytes, FrameKind::Ack, FrameLimits::CONTROL).unwrap();
//! assert_eq!(ack.sequence, 3);
//! ```

pub mod batch;
pub mod frame;
mod messages;
pub mod rate;

pub use batch::BatchError;
pub use frame::{FrameError, FrameHeader, FrameKind, FrameLimits};
pub use messages::{Ack, BatchMessage, Hello, LabelMessage, Reject, SeriesMessage, Welcome};
pub use rate::RateLimiter;

/// The protocol version this build speaks, in every frame header. A peer that sees another
/// version refuses the frame with [`FrameError::UnsupportedVersion`].
pub const PROTOCOL_VERSION: u8 = 1;

/// The TLS application protocol both sides offer; a peer offering only another one fails the
/// handshake.
pub const ALPN: &[u8] = b"smolder";

/// QUIC application error codes the aggregator closes a connection or stops a stream with.
pub mod code {
    /// The connection's hello was refused (credentials, protocol version).
    pub const REFUSED: u32 = 1;
    /// A stream broke the protocol (bad frame, wrong kind, over a cap).
    pub const PROTOCOL: u32 = 2;
    /// The aggregator is shutting down.
    pub const SHUTDOWN: u32 = 3;
    /// The agent is shutting down.
    pub const AGENT_SHUTDOWN: u32 = 4;
}
