//! Framing: every message travels as a fixed 16-byte header and an lz4 block body.
//!
//! ```text
//! offset  size  field
//! 0       4     magic "SMLD"
//! 4       1     protocol version (PROTOCOL_VERSION)
//! 5       1     kind (FrameKind)
//! 6       2     flags, reserved, must be 0
//! 8       4     compressed body length, little-endian
//! 12      4     uncompressed body length, little-endian
//! 16      ...   lz4 block (no lz4 frame header) of a prost message
//! ```
//!
//! A reader takes the header first and checks both lengths against its [`FrameLimits`] before
//! it allocates or reads anything more: the compressed length bounds what it reads, the
//! uncompressed one what it allocates, and a ratio no lz4 block can reach (a decompression
//! bomb) is refused from the header alone. The body then must decompress to exactly the declared
//! length.

use prost::Message;

use super::PROTOCOL_VERSION;

/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"SMLD";
/// The header's length in bytes.
pub const HEADER_LEN: usize = 16;
/// The most bytes one compressed lz4 byte can expand to: a match's length grows by 255 per
/// extra length byte. Declared sizes past this ratio cannot be honest.
const LZ4_MAX_RATIO: u64 = 255;
/// Slack for the short sequences whose ratio the per-byte bound does not cover.
const LZ4_RATIO_SLACK: u64 = 64;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameKind {
    /// Agent → aggregator, first stream of a connection: a [`Hello`](super::Hello).
    Hello = 1,
    /// Aggregator → agent: the hello is accepted, a [`Welcome`](super::Welcome).
    Welcome = 2,
    /// Agent → aggregator, one per stream: a [`BatchMessage`](super::BatchMessage).
    Batch = 3,
    /// Aggregator → agent: a batch is durable, an [`Ack`](super::Ack).
    Ack = 4,
    /// Aggregator → agent: a hello or batch is refused, a [`Reject`](super::Reject).
    Reject = 5,
}

impl FrameKind {
    fn from_byte(byte: u8) -> Option<FrameKind> {
        Some(match byte {
            1 => FrameKind::Hello,
            2 => FrameKind::Welcome,
            3 => FrameKind::Batch,
            4 => FrameKind::Ack,
            5 => FrameKind::Reject,
            _ => return None,
        })
    }

    /// The kind's name, for messages and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            FrameKind::Hello => "hello",
            FrameKind::Welcome => "welcome",
            FrameKind::Batch => "batch",
            FrameKind::Ack => "ack",
            FrameKind::Reject => "reject",
        }
    }
}

/// Caps a reader puts on a frame before it reads the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLimits {
    /// The largest body accepted as sent (compressed), in bytes.
    pub max_compressed: u32,
    /// The largest body accepted once decompressed, in bytes.
    pub max_uncompressed: u32,
}

impl FrameLimits {
    /// Limits for the small control messages (hello, welcome, ack, reject): 64 KiB.
    pub const CONTROL: FrameLimits = FrameLimits {
        max_compressed: 64 << 10,
        max_uncompressed: 64 << 10,
    };
}

/// Why a frame was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The stream does not start with [`MAGIC`]: not Smolder's protocol.
    #[error("not a smolder frame: magic is {found:02x?}, expected \"SMLD\"")]
    BadMagic {
        /// The first four bytes found.
        found: [u8; 4],
    },
    /// The peer speaks another protocol version.
    #[error("unsupported protocol version {version}; this side speaks version {PROTOCOL_VERSION}")]
    UnsupportedVersion {
        /// The version byte found.
        version: u8,
    },
    /// The kind byte names no message of this version.
    #[error("unknown frame kind {kind}")]
    UnknownKind {
        /// The kind byte found.
        kind: u8,
    },
    /// A valid frame of the wrong kind for its place in the conversation.
    #[error("expected a {expected} frame, got {found}")]
    UnexpectedKind {
        /// What the reader waited for.
        expected: &'static str,
        /// What came.
        found: &'static str,
    },
    /// The reserved flags are not zero.
    #[error("reserved header flags are {flags:#06x}, must be 0")]
    ReservedFlags {
        /// The flags found.
        flags: u16,
    },
    /// A declared length is over the reader's limit.
    #[error("{which} body length {size} is over the limit of {limit} bytes")]
    TooLarge {
        /// `compressed` or `uncompressed`.
        which: &'static str,
        /// The declared length.
        size: u32,
        /// The limit.
        limit: u32,
    },
    /// The declared lengths claim an expansion no lz4 block can produce: a decompression bomb,
    /// or a lie.
    #[error(
        "declared uncompressed length {uncompressed} is impossible for {compressed} compressed bytes"
    )]
    ImpossibleRatio {
        /// The declared compressed length.
        compressed: u32,
        /// The declared uncompressed length.
        uncompressed: u32,
    },
    /// The input ends before the frame does.
    #[error("frame truncated: {expected} bytes of {part} declared, {actual} present")]
    Truncated {
        /// `header` or `body`.
        part: &'static str,
        /// Bytes declared or needed.
        expected: usize,
        /// Bytes present.
        actual: usize,
    },
    /// Bytes follow the declared body.
    #[error("{extra} bytes after the frame's declared body")]
    TrailingBytes {
        /// How many.
        extra: usize,
    },
    /// The body is not a valid lz4 block or does not decompress to the declared length.
    #[error("body does not decompress: {reason}")]
    Decompress {
        /// What went wrong.
        reason: String,
    },
    /// The decompressed body is not the message its kind says.
    #[error("invalid {kind} message")]
    Decode {
        /// The frame's kind.
        kind: &'static str,
        /// What prost said, with the field at fault.
        #[source]
        source: prost::DecodeError,
    },
}

/// A frame's parsed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// What the body is.
    pub kind: FrameKind,
    /// The body's length as sent.
    pub compressed_len: u32,
    /// The body's length once decompressed.
    pub uncompressed_len: u32,
}

impl FrameHeader {
    /// Parses and checks a header against `limits`. Nothing is allocated.
    ///
    /// # Errors
    ///
    /// A [`FrameError`] for a wrong magic, another protocol version, an unknown kind, set
    /// flags, a length over `limits` or an impossible compression ratio.
    pub fn parse(bytes: &[u8; HEADER_LEN], limits: FrameLimits) -> Result<FrameHeader, FrameError> {
        let field = |at: usize| [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]];
        let magic = field(0);
        if magic != MAGIC {
            return Err(FrameError::BadMagic { found: magic });
        }
        if bytes[4] != PROTOCOL_VERSION {
            return Err(FrameError::UnsupportedVersion { version: bytes[4] });
        }
        let kind =
            FrameKind::from_byte(bytes[5]).ok_or(FrameError::UnknownKind { kind: bytes[5] })?;
        let flags = u16::from_le_bytes([bytes[6], bytes[7]]);
        if flags != 0 {
            return Err(FrameError::ReservedFlags { flags });
        }
        let compressed_len = u32::from_le_bytes(field(8));
        let uncompressed_len = u32::from_le_bytes(field(12));
        if compressed_len > limits.max_compressed {
            return Err(FrameError::TooLarge {
                which: "compressed",
                size: compressed_len,
                limit: limits.max_compressed,
            });
        }
        if uncompressed_len > limits.max_uncompressed {
            return Err(FrameError::TooLarge {
                which: "uncompressed",
                size: uncompressed_len,
                limit: limits.max_uncompressed,
            });
        }
        let most = u64::from(compressed_len) * LZ4_MAX_RATIO + LZ4_RATIO_SLACK;
        if u64::from(uncompressed_len) > most {
            return Err(FrameError::ImpossibleRatio {
                compressed: compressed_len,
                uncompressed: uncompressed_len,
            });
        }
        Ok(FrameHeader {
            kind,
            compressed_len,
            uncompressed_len,
        })
    }

    /// Checks that the frame is of the kind the reader waits for.
    ///
    /// # Errors
    ///
    /// [`FrameError::UnexpectedKind`] otherwise.
    pub fn check_kind(self, kind: FrameKind) -> Result<FrameHeader, FrameError> {
        if self.kind == kind {
            Ok(self)
        } else {
            Err(FrameError::UnexpectedKind {
                expected: kind.as_str(),
                found: self.kind.as_str(),
            })
        }
    }

    /// Decompresses `body`, which must be exactly the declared compressed length, into a buffer
    /// of exactly the declared uncompressed length.
    ///
    /// # Errors
    ///
    /// [`FrameError::Truncated`] or [`FrameError::TrailingBytes`] when `body` is not the declared
    /// length; [`FrameError::Decompress`] when it is not an lz4 block of the declared size.
    pub fn decompress(&self, body: &[u8]) -> Result<Vec<u8>, FrameError> {
        let declared = self.compressed_len as usize;
        if body.len() < declared {
            return Err(FrameError::Truncated {
                part: "body",
                expected: declared,
                actual: body.len(),
            });
        }
        if body.len() > declared {
            return Err(FrameError::TrailingBytes {
                extra: body.len() - declared,
            });
        }
        let mut out = vec![0; self.uncompressed_len as usize];
        let written = lz4_flex::block::decompress_into(body, &mut out).map_err(|err| {
            FrameError::Decompress {
                reason: err.to_string(),
            }
        })?;
        if written != out.len() {
            return Err(FrameError::Decompress {
                reason: format!(
                    "decompressed to {written} bytes, {} declared",
                    self.uncompressed_len
                ),
            });
        }
        Ok(out)
    }

    /// Decompresses `body` and decodes it as the message `M`.
    ///
    /// # Errors
    ///
    /// As [`decompress`](Self::decompress), and [`FrameError::Decode`] when the bytes are not
    /// an `M`.
    pub fn decode<M: Message + Default>(&self, body: &[u8]) -> Result<M, FrameError> {
        let bytes = self.decompress(body)?;
        M::decode(bytes.as_slice()).map_err(|source| FrameError::Decode {
            kind: self.kind.as_str(),
            source,
        })
    }
}

/// Encodes `message` as a frame of `kind`: header, then the lz4 block of its protobuf.
///
/// # Panics
///
/// When the message is over 4 GiB, which no caller builds: batches are bounded by the window's
/// trees and the spool's cap long before.
pub fn encode<M: Message>(kind: FrameKind, message: &M) -> Vec<u8> {
    let plain = message.encode_to_vec();
    let body = lz4_flex::block::compress(&plain);
    let mut frame = Vec::with_capacity(HEADER_LEN + body.len());
    frame.extend_from_slice(&MAGIC);
    frame.push(PROTOCOL_VERSION);
    frame.push(kind as u8);
    frame.extend_from_slice(&0u16.to_le_bytes());
    let len = |n: usize| u32::try_from(n).expect("a frame body under 4 GiB");
    frame.extend_from_slice(&len(body.len()).to_le_bytes());
    frame.extend_from_slice(&len(plain.len()).to_le_bytes());
    frame.extend_from_slice(&body);
    frame
}

/// Decodes a whole frame held in memory: its header under `limits`, its kind, and its body.
///
/// # Errors
///
/// A [`FrameError`] for anything [`FrameHeader::parse`], [`FrameHeader::check_kind`] or
/// [`FrameHeader::decode`] refuses, or [`FrameError::Truncated`] for fewer than 16 bytes.
pub fn decode<M: Message + Default>(
    bytes: &[u8],
    kind: FrameKind,
    limits: FrameLimits,
) -> Result<M, FrameError> {
    let (header, body) = split_header(bytes)?;
    FrameHeader::parse(header, limits)?
        .check_kind(kind)?
        .decode(body)
}

/// Splits the header off a frame held in memory.
///
/// # Errors
///
/// [`FrameError::Truncated`] when `bytes` is shorter than a header.
pub fn split_header(bytes: &[u8]) -> Result<(&[u8; HEADER_LEN], &[u8]), FrameError> {
    match bytes.split_first_chunk::<HEADER_LEN>() {
        Some((header, body)) => Ok((header, body)),
        None => Err(FrameError::Truncated {
            part: "header",
            expected: HEADER_LEN,
            actual: bytes.len(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Ack, Reject};

    const BIG: FrameLimits = FrameLimits {
        max_compressed: 1 << 20,
        max_uncompressed: 1 << 24,
    };

    #[test]
    fn round_trips_a_message() {
        let ack = Ack {
            sequence: 42,
            duplicate: true,
            ..Ack::default()
        };
        let frame = encode(FrameKind::Ack, &ack);
        assert_eq!(&frame[..4], b"SMLD");
        assert_eq!(frame[4], PROTOCOL_VERSION);
        let back: Ack = decode(&frame, FrameKind::Ack, FrameLimits::CONTROL).unwrap();
        assert_eq!(back, ack);
    }

    #[test]
    fn wrong_kind_is_named() {
        let frame = encode(FrameKind::Ack, &Ack::default());
        let err = decode::<Reject>(&frame, FrameKind::Reject, FrameLimits::CONTROL).unwrap_err();
        assert_eq!(err.to_string(), "expected a reject frame, got ack");
    }

    #[test]
    fn another_version_is_refused_from_the_header() {
        let mut frame = encode(FrameKind::Ack, &Ack::default());
        frame[4] = 9;
        let err = decode::<Ack>(&frame, FrameKind::Ack, BIG).unwrap_err();
        assert!(matches!(err, FrameError::UnsupportedVersion { version: 9 }));
    }

    #[test]
    fn a_bomb_is_refused_before_decompressing() {
        // 16 bytes of body claiming 16 MiB: no lz4 block expands that far.
        let mut frame = encode(FrameKind::Ack, &Ack::default());
        frame.truncate(HEADER_LEN);
        frame[8..12].copy_from_slice(&16u32.to_le_bytes());
        frame[12..16].copy_from_slice(&(16u32 << 20).to_le_bytes());
        frame.extend_from_slice(&[0; 16]);
        let err = decode::<Ack>(&frame, FrameKind::Ack, BIG).unwrap_err();
        assert!(matches!(err, FrameError::ImpossibleRatio { .. }), "{err}");
    }

    #[test]
    fn a_real_lz4_bomb_within_the_ratio_still_meets_the_cap() {
        let zeros = vec![0u8; 8 << 20];
        let body = lz4_flex::block::compress(&zeros);
        let mut frame = Vec::from(MAGIC);
        frame.extend_from_slice(&[PROTOCOL_VERSION, FrameKind::Batch as u8, 0, 0]);
        frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
        frame.extend_from_slice(&(zeros.len() as u32).to_le_bytes());
        frame.extend_from_slice(&body);
        let err = decode::<Ack>(&frame, FrameKind::Batch, FrameLimits::CONTROL).unwrap_err();
        assert!(
            matches!(
                err,
                FrameError::TooLarge {
                    which: "compressed" | "uncompressed",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_lying_uncompressed_length_is_caught() {
        let mut frame = encode(
            FrameKind::Ack,
            &Ack {
                sequence: 7,
                ..Ack::default()
            },
        );
        let declared = u32::from_le_bytes(frame[12..16].try_into().unwrap());
        frame[12..16].copy_from_slice(&(declared + 5).to_le_bytes());
        let err = decode::<Ack>(&frame, FrameKind::Ack, BIG).unwrap_err();
        assert!(matches!(err, FrameError::Decompress { .. }), "{err}");
    }

    #[test]
    fn truncation_and_trailing_bytes_are_errors() {
        let frame = encode(
            FrameKind::Ack,
            &Ack {
                sequence: 7,
                ..Ack::default()
            },
        );
        let err = decode::<Ack>(&frame[..frame.len() - 1], FrameKind::Ack, BIG).unwrap_err();
        assert!(
            matches!(err, FrameError::Truncated { part: "body", .. }),
            "{err}"
        );
        let err = decode::<Ack>(&frame[..10], FrameKind::Ack, BIG).unwrap_err();
        assert!(
            matches!(err, FrameError::Truncated { part: "header", .. }),
            "{err}"
        );
        let mut long = frame.clone();
        long.push(0);
        let err = decode::<Ack>(&long, FrameKind::Ack, BIG).unwrap_err();
        assert!(
            matches!(err, FrameError::TrailingBytes { extra: 1 }),
            "{err}"
        );
    }

    #[test]
    fn garbage_is_not_a_frame() {
        let err = decode::<Ack>(b"GET / HTTP/1.1\r\n\r\n", FrameKind::Ack, BIG).unwrap_err();
        assert!(matches!(err, FrameError::BadMagic { .. }), "{err}");
    }
}
