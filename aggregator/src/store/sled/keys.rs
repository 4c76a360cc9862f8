//! Key layout and value framing of the sled backend's one keyspace.
//!
//! Every kind of record lives in the same sled tree under its own prefix byte, so that a write
//! touching several kinds is one atomic `apply_batch`:
//!
//! | prefix | key | value |
//! |---|---|---|
//! | `M` | name | store metadata (`next_series`, `schema`) |
//! | `S` | series id | [`SeriesRecord`](super::series::SeriesRecord) as JSON |
//! | `K` | normalized series key | series id |
//! | `L` | label name, label value, series id | empty |
//! | `T` | level, series id, bucket start | encoded tree |
//! | `N` | level, series id, bucket start | total and write count |
//! | `D` | level, series id, bucket start | empty: this rollup must be rebuilt from its children |
//! | `R` | recording rule name | the rule as JSON (`rules.rs`) |
//! | `B` | agent id, sequence | window end: this agent batch is stored (QUIC ingest's dedupe) |
//! | `b` | window end, agent id, sequence | empty: the same marker by time, for retention |
//!
//! Integers in keys are big-endian so that sled's byte order is numeric order; strings are
//! length-prefixed so that one label's entries never run into another's. Values, all but the
//! empty ones of `L` and `D`, are framed with a CRC-32 of their payload, checked on every read.

use crate::store::StoreError;

pub(crate) const META: u8 = b'M';
pub(crate) const SERIES: u8 = b'S';
pub(crate) const SERIES_BY_KEY: u8 = b'K';
pub(crate) const LABEL: u8 = b'L';
pub(crate) const TREE: u8 = b'T';
pub(crate) const TOTAL: u8 = b'N';
pub(crate) const DIRTY: u8 = b'D';
pub(crate) const RULE: u8 = b'R';
pub(crate) const BATCH: u8 = b'B';
pub(crate) const BATCH_BY_TIME: u8 = b'b';

/// A series' id: assigned once, in creation order, never reused.
pub(crate) type SeriesId = u64;

pub(crate) fn meta(name: &str) -> Vec<u8> {
    let mut key = vec![META];
    key.extend_from_slice(name.as_bytes());
    key
}

pub(crate) fn series(id: SeriesId) -> [u8; 9] {
    let mut key = [SERIES; 9];
    key[1..].copy_from_slice(&id.to_be_bytes());
    key
}

pub(crate) fn series_by_key(normalized: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + normalized.len());
    key.push(SERIES_BY_KEY);
    key.extend_from_slice(normalized.as_bytes());
    key
}

pub(crate) fn rule(name: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + name.len());
    key.push(RULE);
    key.extend_from_slice(name.as_bytes());
    key
}

/// The prefix of every index entry of label `name`, or of `name=value` when a value is given.
pub(crate) fn label_prefix(name: &str, value: Option<&str>) -> Vec<u8> {
    let mut key = vec![LABEL];
    put_str(&mut key, name);
    if let Some(value) = value {
        put_str(&mut key, value);
    }
    key
}

pub(crate) fn label(name: &str, value: &str, id: SeriesId) -> Vec<u8> {
    let mut key = label_prefix(name, Some(value));
    key.extend_from_slice(&id.to_be_bytes());
    key
}

/// Splits an index key into its value and series id.
pub(crate) fn parse_label(key: &[u8]) -> Result<(&str, &str, SeriesId), StoreError> {
    let corrupt = || StoreError::Corrupt {
        key: printable(key),
        reason: "malformed label key",
    };
    let rest = key.get(1..).ok_or_else(corrupt)?;
    let (name, rest) = take_str(rest).ok_or_else(corrupt)?;
    let (value, rest) = take_str(rest).ok_or_else(corrupt)?;
    let id = rest
        .try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| corrupt())?;
    Ok((name, value, id))
}

/// A bucket key of kind `TREE`, `TOTAL` or `DIRTY`.
pub(crate) fn bucket(kind: u8, level: usize, id: SeriesId, start: u64) -> [u8; 18] {
    let mut key = [0; 18];
    key[0] = kind;
    key[1] = level as u8;
    key[2..10].copy_from_slice(&id.to_be_bytes());
    key[10..].copy_from_slice(&start.to_be_bytes());
    key
}

/// The prefix of every bucket of one series at one level.
pub(crate) fn bucket_prefix(kind: u8, level: usize, id: SeriesId) -> [u8; 10] {
    let mut key = [0; 10];
    key[..10].copy_from_slice(&bucket(kind, level, id, 0)[..10]);
    key
}

/// The dedupe marker of batch `sequence` of agent `agent`.
pub(crate) fn batch(agent: &str, sequence: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(13 + agent.len());
    key.push(BATCH);
    put_str(&mut key, agent);
    key.extend_from_slice(&sequence.to_be_bytes());
    key
}

/// The same marker indexed by its window's end (Unix seconds), so that retention finds the old
/// ones with one range scan.
pub(crate) fn batch_by_time(end: u64, agent: &str, sequence: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(21 + agent.len());
    key.push(BATCH_BY_TIME);
    key.extend_from_slice(&end.to_be_bytes());
    put_str(&mut key, agent);
    key.extend_from_slice(&sequence.to_be_bytes());
    key
}

/// The agent id and sequence of a [`batch_by_time`] key.
pub(crate) fn parse_batch_by_time(key: &[u8]) -> Result<(&str, u64), StoreError> {
    key.get(9..)
        .and_then(take_str)
        .and_then(|(agent, rest)| Some((agent, u64::from_be_bytes(rest.try_into().ok()?))))
        .ok_or_else(|| StoreError::Corrupt {
            key: printable(key),
            reason: "malformed batch marker key",
        })
}

/// The bucket start of a bucket key.
pub(crate) fn bucket_start(key: &[u8]) -> Result<u64, StoreError> {
    key.get(10..18)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| StoreError::Corrupt {
            key: printable(key),
            reason: "short bucket key",
        })
}

fn put_str(key: &mut Vec<u8>, s: &str) {
    // Label names and values are capped far below 4 GiB at ingest.
    key.extend_from_slice(&(s.len() as u32).to_be_bytes());
    key.extend_from_slice(s.as_bytes());
}

fn take_str(bytes: &[u8]) -> Option<(&str, &[u8])> {
    let len = u32::from_be_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let s = std::str::from_utf8(bytes.get(4..4 + len)?).ok()?;
    Some((s, &bytes[4 + len..]))
}

/// Frames a value with the CRC-32 of its payload.
pub(crate) fn seal(payload: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(4 + payload.len());
    value.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    value.extend_from_slice(payload);
    value
}

/// Checks a framed value and returns its payload.
///
/// # Errors
///
/// [`StoreError::Corrupt`] naming `key` when the checksum does not match.
pub(crate) fn open<'v>(key: &[u8], value: &'v [u8]) -> Result<&'v [u8], StoreError> {
    let corrupt = |reason| StoreError::Corrupt {
        key: printable(key),
        reason,
    };
    let (crc, payload) = value
        .split_at_checked(4)
        .ok_or_else(|| corrupt("value too short"))?;
    let expected = u32::from_le_bytes(crc.try_into().expect("split at 4"));
    if crc32fast::hash(payload) != expected {
        return Err(corrupt("checksum mismatch"));
    }
    Ok(payload)
}

/// A key as an operator can read it in a log: printable ASCII kept, other bytes as `\xNN`.
pub(crate) fn printable(key: &[u8]) -> String {
    key.escape_ascii().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys_round_trip_and_sort_by_value() {
        let key = label("env", "prod", 7);
        assert_eq!(parse_label(&key).unwrap(), ("env", "prod", 7));
        assert!(key.starts_with(&label_prefix("env", None)));
        assert!(key.starts_with(&label_prefix("env", Some("prod"))));
        assert!(!label("env", "prod2", 1).starts_with(&label_prefix("env", Some("prod"))));
    }

    #[test]
    fn bucket_keys_sort_by_time() {
        let a = bucket(TREE, 0, 3, 100);
        let b = bucket(TREE, 0, 3, 1_000);
        assert!(a < b);
        assert!(a.starts_with(&bucket_prefix(TREE, 0, 3)));
        assert_eq!(bucket_start(&b).unwrap(), 1_000);
    }

    #[test]
    fn batch_markers_round_trip_and_sort_by_time() {
        let early = batch_by_time(100, "agent-b", 7);
        let late = batch_by_time(200, "agent-a", 1);
        assert!(early < late);
        assert_eq!(parse_batch_by_time(&early).unwrap(), ("agent-b", 7));
        assert_ne!(batch("a", 1), batch("a", 2));
    }

    #[test]
    fn sealed_values_detect_damage() {
        let mut value = seal(b"payload");
        assert_eq!(open(b"k", &value).unwrap(), b"payload");
        value[5] ^= 1;
        let err = open(b"T\x00", &value).unwrap_err();
        assert_eq!(
            err.to_string(),
            r"corrupt record at key T\x00: checksum mismatch"
        );
    }
}
