//! LEB128 varints, as protobuf writes them and Smolder's own encodings (the tree codec, the
//! block format, Pyroscope's tree bytes) reuse them: seven bits a byte, low bits first, the high
//! bit set on every byte but the last.
//!
//! [`get_strict`] is what Smolder's own formats read (the tree codec, `smolder-block`): a tenth
//! byte holding more than the 64th bit is refused. [`get`] is what the pprof and OTLP scans read
//! before prost decodes, and passes such a byte over as they always have.

/// Appends `value` as an unsigned LEB128 varint (1 to 10 bytes).
pub fn put(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The varint at the start of `bytes` and its length in bytes, or `None` when `bytes` ends
/// first or the varint runs past 10 bytes.
pub fn get(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// Why [`get_strict`] refused a varint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VarintError {
    /// The bytes end inside it.
    Truncated,
    /// It runs past ten bytes, or its tenth byte holds more than the 64th bit.
    Overlong,
}

/// The varint at the start of `bytes` and its length in bytes, refusing one that does not fit
/// in 64 bits.
///
/// # Errors
///
/// [`VarintError::Truncated`] when `bytes` ends inside it, [`VarintError::Overlong`] when it
/// does not fit in 64 bits.
pub fn get_strict(bytes: &[u8]) -> Result<(u64, usize), VarintError> {
    let mut value = 0u64;
    for (i, shift) in (0..64).step_by(7).enumerate() {
        let byte = *bytes.get(i).ok_or(VarintError::Truncated)?;
        let bits = u64::from(byte & 0x7f);
        if shift == 63 && bits > 1 {
            return Err(VarintError::Overlong);
        }
        value |= bits << shift;
        if byte & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    Err(VarintError::Overlong)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_encodings() {
        for (value, bytes) in [
            (0u64, vec![0x00]),
            (1, vec![0x01]),
            (127, vec![0x7f]),
            (128, vec![0x80, 0x01]),
            (300, vec![0xac, 0x02]),
            (
                u64::MAX,
                vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            ),
        ] {
            let mut out = Vec::new();
            put(&mut out, value);
            assert_eq!(out, bytes, "{value}");
            assert_eq!(get(&bytes), Some((value, bytes.len())));
        }
    }

    #[test]
    fn truncated_and_overlong_input_is_none() {
        assert_eq!(get(&[]), None);
        assert_eq!(get(&[0x80]), None);
        assert_eq!(get(&[0x80; 11]), None);
    }

    #[test]
    fn strict_reading_refuses_what_does_not_fit_in_64_bits() {
        let max = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(get_strict(&max), Ok((u64::MAX, 10)));
        let mut over = max;
        over[9] = 0x02;
        assert_eq!(get_strict(&over), Err(VarintError::Overlong));
        assert_eq!(
            get(&over).map(|(_, n)| n),
            Some(10),
            "the lenient reading passes it over"
        );
        assert_eq!(get_strict(&[0x80; 11]), Err(VarintError::Overlong));
        assert_eq!(get_strict(&[0x80, 0x80]), Err(VarintError::Truncated));
        assert_eq!(get_strict(&[]), Err(VarintError::Truncated));
    }

    proptest! {
        #[test]
        fn round_trips_with_what_follows(value: u64, tail: Vec<u8>) {
            let mut bytes = Vec::new();
            put(&mut bytes, value);
            let len = bytes.len();
            bytes.extend(tail);
            prop_assert_eq!(get(&bytes), Some((value, len)));
            prop_assert_eq!(get_strict(&bytes), Ok((value, len)));
        }
    }
}
