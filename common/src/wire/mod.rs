//! The agent → aggregator protocol: QUIC streams carrying framed, lz4-compressed protobuf.
//!
//! One connection per agent (ALPN [`ALPN`]). Its first bidirectional stream carries a
//! [`Hello`] (agent id, hostname, version, token), answered by a [`Welcome`] (the aggregator's
//! [`BatchLimits`] and clock) or a [`Reject`]. Every batch then opens its own bidirectional
//! stream: the agent writes one [`BatchMessage`] frame and finishes its side; the aggregator
//! answers one [`Ack`] once the batch is durable, naming the series it refused one by one
//! ([`SeriesRefusal`], [`RefusalReason`]), or a [`Reject`] saying why nothing was stored and
//! whether a retry can help. The agent splits a window into as many batches as the limits ask
//! ([`limits::split`]), each with its own sequence.
//!
//! Messages only gain fields, never change or lose one: a peer of v0.1 ignores what it does
//! not know (the welcome's limits and clock, the ack's refusals, the reject's code), and a field
//! it does not send reads as zero or empty, which means "not announced" (see
//! OPERATIONS.md, "Upgrades"). [`PROTOCOL_VERSION`] changes only for what old peers cannot
//! ignore.
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
//! let bytes = wire::frame::encode(FrameKind::Ack, &Ack { sequence: 3, ..Ack::default() });
//! let ack: Ack = wire::frame::decode(&bytes, FrameKind::Ack, FrameLimits::CONTROL).unwrap();
//! assert_eq!(ack.sequence, 3);
//! ```

pub mod batch;
pub mod frame;
pub mod limits;
mod messages;
pub mod rate;

pub use batch::BatchError;
pub use frame::{FrameError, FrameHeader, FrameKind, FrameLimits};
pub use limits::{BatchLimits, Refusal, RefusalReason, Split};
pub use messages::{
    Ack, BatchMessage, Hello, LabelMessage, RefusalTally, Reject, SeriesMessage, SeriesRefusal,
    Welcome,
};
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
    /// The agent moves to another of its aggregators (this one could not store its batches).
    pub const AGENT_FAILOVER: u32 = 5;
}

/// Codes of a [`Reject`] the agent acts on; an older peer sends or reads others as plain text.
pub mod reject {
    /// The aggregator cannot store now (its object store does not take writes): the batch is
    /// retryable, and an agent with other aggregators sends it to the next one at once.
    pub const UNAVAILABLE: &str = "unavailable";
    /// The agent's clock is ahead of the aggregator's: retryable once the time comes.
    pub const CLOCK_SKEW: &str = "clock_skew";
    /// Over the welcome's `max_batch_bytes`: the agent splits the batch.
    pub const TOO_LARGE: &str = "too_large";
}
