//! A bounds-checked cursor over JFR bytes: big-endian fixed-width integers, JFR's compressed
//! integers and its tagged strings. Every read checks the remaining bytes first, so that no
//! input can make it panic or allocate more than it holds.

use super::JfrError;

/// A cursor over one slice of a recording. Offsets in errors are absolute (from the start of
/// the recording), so that a client can find the byte at fault.
#[derive(Clone)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// The absolute offset of `buf[0]`.
    base: usize,
    /// Whether integers are LEB128-style (the chunk header's feature bit 0).
    compressed: bool,
}

/// A JFR string as read: literal text, a reference into the `java.lang.String` pool, or null.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum JfrString {
    /// Tag 0.
    Null,
    /// Tags 1, 3, 4 and 5.
    Text(String),
    /// Tag 2: a key in the string constant pool.
    Pooled(u64),
}

impl<'a> Reader<'a> {
    /// A cursor at the start of `buf`, which starts `base` bytes into the recording.
    pub(crate) fn new(buf: &'a [u8], base: usize, compressed: bool) -> Self {
        Reader {
            buf,
            pos: 0,
            base,
            compressed,
        }
    }

    /// The absolute offset of the next byte.
    pub(crate) fn offset(&self) -> usize {
        self.base + self.pos
    }

    /// How many bytes are left.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Moves to `pos` (relative to this reader's start).
    pub(crate) fn seek(&mut self, pos: usize) -> Result<(), JfrError> {
        if pos > self.buf.len() {
            return Err(JfrError::Truncated {
                offset: self.base + pos,
                needed: pos - self.buf.len(),
            });
        }
        self.pos = pos;
        Ok(())
    }

    /// A reader over the next `len` bytes, which this one skips.
    pub(crate) fn sub(&mut self, len: usize) -> Result<Reader<'a>, JfrError> {
        let bytes = self.bytes(len)?;
        Ok(Reader::new(bytes, self.offset() - len, self.compressed))
    }

    /// The next `len` bytes.
    pub(crate) fn bytes(&mut self, len: usize) -> Result<&'a [u8], JfrError> {
        if len > self.remaining() {
            return Err(JfrError::Truncated {
                offset: self.offset(),
                needed: len,
            });
        }
        let out = &self.buf[self.pos..self.pos + len];
        self.pos += len;
        Ok(out)
    }

    /// One byte.
    pub(crate) fn u8(&mut self) -> Result<u8, JfrError> {
        Ok(self.bytes(1)?[0])
    }

    /// A big-endian unsigned integer of `width` bytes (at most 8).
    pub(crate) fn fixed(&mut self, width: usize) -> Result<u64, JfrError> {
        let bytes = self.bytes(width)?;
        Ok(bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    /// A JFR integer of `width` bytes when not compressed; when compressed, up to 8 groups of
    /// 7 bits, low first, each with a continuation bit, and a 9th byte of 8 bits. Java's
    /// signed values come back as their two's-complement bits.
    pub(crate) fn int(&mut self, width: usize) -> Result<u64, JfrError> {
        if !self.compressed {
            return self.fixed(width);
        }
        let mut value = 0u64;
        for shift in 0..8 {
            let byte = self.u8()?;
            value |= u64::from(byte & 0x7f) << (7 * shift);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Ok(value | (u64::from(self.u8()?) << 56))
    }

    /// A Java `long`.
    pub(crate) fn long(&mut self) -> Result<u64, JfrError> {
        self.int(8)
    }

    /// A Java `int` used as a count or index: must be non-negative and fit a `usize`.
    pub(crate) fn count(&mut self, what: &'static str) -> Result<usize, JfrError> {
        let offset = self.offset();
        let value = self.int(4)?;
        usize::try_from(value)
            .ok()
            .filter(|&v| v <= i32::MAX as usize)
            .ok_or(JfrError::Invalid {
                what,
                offset,
                value,
            })
    }

    /// A count of items that each take at least one byte: checked against the remaining bytes
    /// before anyone allocates for it.
    pub(crate) fn bounded_count(&mut self, what: &'static str) -> Result<usize, JfrError> {
        let offset = self.offset();
        let count = self.count(what)?;
        if count > self.remaining() {
            return Err(JfrError::Invalid {
                what,
                offset,
                value: count as u64,
            });
        }
        Ok(count)
    }

    /// A tagged JFR string. `keep == false` skips the text without allocating.
    pub(crate) fn string(&mut self, keep: bool) -> Result<JfrString, JfrError> {
        let offset = self.offset();
        match self.u8()? {
            0 => Ok(JfrString::Null),
            1 => Ok(JfrString::Text(String::new())),
            2 => Ok(JfrString::Pooled(self.long()?)),
            3 => {
                let len = self.bounded_count("string length")?;
                let bytes = self.bytes(len)?;
                Ok(JfrString::Text(if keep {
                    String::from_utf8_lossy(bytes).into_owned()
                } else {
                    String::new()
                }))
            }
            4 => {
                // Each char is a compressed integer of at least one byte.
                let len = self.bounded_count("string length")?;
                let mut text = String::new();
                for _ in 0..len {
                    let unit = self.int(2)?;
                    if keep {
                        // Lone surrogates and the like become U+FFFD, as lossy UTF-8 does.
                        let c = u32::try_from(unit)
                            .ok()
                            .and_then(char::from_u32)
                            .unwrap_or(char::REPLACEMENT_CHARACTER);
                        text.push(c);
                    }
                }
                Ok(JfrString::Text(text))
            }
            5 => {
                let len = self.bounded_count("string length")?;
                let bytes = self.bytes(len)?;
                Ok(JfrString::Text(if keep {
                    bytes.iter().map(|&b| char::from(b)).collect()
                } else {
                    String::new()
                }))
            }
            tag => Err(JfrError::Invalid {
                what: "string encoding",
                offset,
                value: u64::from(tag),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressed_integers() {
        let mut r = Reader::new(
            &[
                0x7f, 0x80, 0x01, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            ],
            0,
            true,
        );
        assert_eq!(r.long().ok(), Some(0x7f));
        assert_eq!(r.long().ok(), Some(0x80));
        assert_eq!(r.long().ok(), Some(u64::MAX));
        assert!(r.long().is_err());
    }

    #[test]
    fn strings() {
        let mut r = Reader::new(
            &[3, 2, b'h', b'i', 5, 1, 0xe9, 2, 7, 0, 4, 1, 0x41],
            0,
            true,
        );
        assert_eq!(r.string(true).ok(), Some(JfrString::Text("hi".into())));
        assert_eq!(r.string(true).ok(), Some(JfrString::Text("é".into())));
        assert_eq!(r.string(true).ok(), Some(JfrString::Pooled(7)));
        assert_eq!(r.string(true).ok(), Some(JfrString::Null));
        assert_eq!(r.string(true).ok(), Some(JfrString::Text("A".into())));
        let mut r = Reader::new(&[3, 200, 1], 0, true);
        assert!(matches!(r.string(true), Err(JfrError::Invalid { .. })));
    }
}
