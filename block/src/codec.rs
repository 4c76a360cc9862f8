//! The primitives every section is written with: LEB128 varints, length-prefixed strings, CRC-32
//! and lz4, and a bounded reader that turns any malformed byte into a [`BlockError`] naming its
//! section.

use crate::error::{BlockError, Problem, Section};

pub(crate) use smolder_common::varint::put as put_varint;
use smolder_common::varint::{self, VarintError};

/// Appends `s` as its byte length (varint) and its bytes.
pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    put_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// CRC-32 (IEEE) of `bytes`.
pub(crate) fn crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// Checks `bytes` against the CRC-32 `stored` for them.
///
/// # Errors
///
/// [`BlockError::Checksum`] naming `section`.
pub(crate) fn check_crc(section: Section, bytes: &[u8], stored: u32) -> Result<(), BlockError> {
    let computed = crc(bytes);
    if computed != stored {
        return Err(BlockError::Checksum {
            section,
            stored,
            computed,
        });
    }
    Ok(())
}

/// How stored bytes are compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Codec {
    /// Stored as they are.
    None = 0,
    /// One lz4 block (no size prefix: the raw length is recorded beside it).
    Lz4 = 1,
}

impl Codec {
    pub(crate) fn from_byte(byte: u8) -> Option<Codec> {
        match byte {
            0 => Some(Codec::None),
            1 => Some(Codec::Lz4),
            _ => None,
        }
    }
}

/// Compresses `raw` with lz4 when that saves space; returns the codec and the stored bytes.
pub(crate) fn compress(raw: Vec<u8>) -> (Codec, Vec<u8>) {
    let packed = lz4_flex::block::compress(&raw);
    if packed.len() < raw.len() {
        (Codec::Lz4, packed)
    } else {
        (Codec::None, raw)
    }
}

/// lz4 never expands more than this many times (its format's limit is about 255:1), so a raw
/// length past `stored * MAX_RATIO` is a lie told before anything is allocated for it.
const MAX_RATIO: u64 = 256;

/// Checks `stored` against its CRC and decompresses it to `raw_len` bytes.
///
/// # Errors
///
/// [`BlockError::Checksum`], [`BlockError::TooLarge`] when `raw_len` passes `limit` (or what
/// lz4 could expand `stored` to), [`BlockError::Decompress`] when the bytes do not decompress to
/// exactly `raw_len`.
pub(crate) fn open(
    section: Section,
    stored: &[u8],
    codec: Codec,
    raw_len: u64,
    expected_crc: u32,
    limit: u64,
) -> Result<Vec<u8>, BlockError> {
    check_crc(section, stored, expected_crc)?;
    match codec {
        Codec::None => {
            if raw_len != stored.len() as u64 {
                return Err(BlockError::Decompress { section });
            }
            Ok(stored.to_vec())
        }
        Codec::Lz4 => {
            let cap = limit.min((stored.len() as u64).saturating_mul(MAX_RATIO));
            if raw_len > cap {
                return Err(BlockError::TooLarge {
                    section,
                    len: raw_len,
                    limit: cap,
                });
            }
            let mut out = vec![0; raw_len as usize];
            match lz4_flex::block::decompress_into(stored, &mut out) {
                Ok(written) if written as u64 == raw_len => Ok(out),
                _ => Err(BlockError::Decompress { section }),
            }
        }
    }
}

/// Reads fields from one section's bytes; every failure names the section and offset.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
    section: Section,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8], section: Section) -> Self {
        Reader {
            bytes,
            offset: 0,
            section,
        }
    }

    /// An error about the field at the current offset.
    pub(crate) fn error(&self, problem: Problem) -> BlockError {
        BlockError::Malformed {
            section: self.section,
            offset: self.offset as u64,
            problem,
        }
    }

    /// An [`Problem::Invalid`] error at the current offset.
    /// The section the bytes belong to.
    pub(crate) fn section(&self) -> Section {
        self.section
    }

    pub(crate) fn invalid(&self, field: &'static str, reason: &'static str) -> BlockError {
        self.error(Problem::Invalid { field, reason })
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.offset
    }

    pub(crate) fn byte(&mut self, field: &'static str) -> Result<u8, BlockError> {
        let byte = *self
            .bytes
            .get(self.offset)
            .ok_or_else(|| self.error(Problem::Truncated { field }))?;
        self.offset += 1;
        Ok(byte)
    }

    pub(crate) fn varint(&mut self, field: &'static str) -> Result<u64, BlockError> {
        match varint::get_strict(&self.bytes[self.offset..]) {
            Ok((value, len)) => {
                self.offset += len;
                Ok(value)
            }
            Err(VarintError::Truncated) => {
                self.offset = self.bytes.len();
                Err(self.error(Problem::Truncated { field }))
            }
            Err(VarintError::Overlong) => Err(self.error(Problem::BadVarint { field })),
        }
    }

    /// A varint that must fit in 32 bits.
    pub(crate) fn varint_u32(&mut self, field: &'static str) -> Result<u32, BlockError> {
        let value = self.varint(field)?;
        u32::try_from(value).map_err(|_| self.invalid(field, "does not fit in 32 bits"))
    }

    /// A count of items that each take at least `min_bytes` of what remains, so that nothing is
    /// allocated for items the input cannot hold.
    pub(crate) fn count(
        &mut self,
        field: &'static str,
        min_bytes: usize,
    ) -> Result<usize, BlockError> {
        let count = self.varint(field)?;
        if count > (self.remaining() / min_bytes.max(1)) as u64 {
            return Err(self.error(Problem::CountTooLarge { field, count }));
        }
        Ok(count as usize)
    }

    pub(crate) fn take(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], BlockError> {
        let slice = self
            .offset
            .checked_add(len)
            .and_then(|end| self.bytes.get(self.offset..end))
            .ok_or_else(|| self.error(Problem::Truncated { field }))?;
        self.offset += len;
        Ok(slice)
    }

    pub(crate) fn u32_le(&mut self, field: &'static str) -> Result<u32, BlockError> {
        let bytes = self.take(4, field)?;
        Ok(u32::from_le_bytes(bytes.try_into().expect("took 4 bytes")))
    }

    pub(crate) fn str(&mut self, field: &'static str) -> Result<&'a str, BlockError> {
        let len = self.count(field, 1)?;
        let start = self.offset;
        let bytes = self.take(len, field)?;
        std::str::from_utf8(bytes).map_err(|_| {
            self.offset = start;
            self.error(Problem::InvalidUtf8 { field })
        })
    }

    /// Checks that every byte was read.
    pub(crate) fn finish(self) -> Result<(), BlockError> {
        if self.offset != self.bytes.len() {
            return Err(self.error(Problem::TrailingBytes {
                extra: self.bytes.len() - self.offset,
            }));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_reject_overlong_input() {
        let mut out = Vec::new();
        for value in [0, 1, 127, 128, 300, u64::MAX] {
            put_varint(&mut out, value);
        }
        let mut reader = Reader::new(&out, Section::Meta);
        for value in [0, 1, 127, 128, 300, u64::MAX] {
            assert_eq!(reader.varint("v").unwrap(), value);
        }
        reader.finish().unwrap();
        let overlong = [0xff; 11];
        assert!(matches!(
            Reader::new(&overlong, Section::Meta).varint("v"),
            Err(BlockError::Malformed {
                problem: Problem::BadVarint { .. },
                ..
            })
        ));
    }

    #[test]
    fn counts_are_capped_by_what_remains() {
        let mut out = Vec::new();
        put_varint(&mut out, 1_000_000);
        out.extend_from_slice(&[0; 10]);
        let err = Reader::new(&out, Section::Names)
            .count("name", 1)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "names section: name count 1000000 is more than the remaining bytes can hold (at byte 3)"
        );
    }

    #[test]
    fn lz4_lies_about_length_are_refused_before_allocating() {
        let (codec, stored) = compress(vec![7; 10_000]);
        assert_eq!(codec, Codec::Lz4);
        let sum = crc(&stored);
        assert_eq!(
            open(Section::Names, &stored, codec, 10_000, sum, 1 << 20).unwrap(),
            vec![7; 10_000]
        );
        assert!(matches!(
            open(Section::Names, &stored, codec, u64::MAX, sum, u64::MAX),
            Err(BlockError::TooLarge { .. })
        ));
        assert!(matches!(
            open(Section::Names, &stored, codec, 9_999, sum, 1 << 20),
            Err(BlockError::Decompress { .. })
        ));
        assert!(matches!(
            open(Section::Names, &stored, codec, 10_000, sum ^ 1, 1 << 20),
            Err(BlockError::Checksum { .. })
        ));
    }
}
