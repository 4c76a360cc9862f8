//! Java Flight Recorder recordings, as the Pyroscope Java agent (async-profiler) pushes them,
//! converted to one [`Tree`] per profile type the way Pyroscope converts them.
//!
//! [`parse`] reads a recording (already gunzipped): one or more chunks, each a header (magic
//! `FLR\0`, version, size, offsets of the last constant pool and of the metadata, times,
//! ticks per second, features), a metadata event describing every class, checkpoint events
//! holding constant pools, and events laid out field by field as the metadata says, with
//! LEB128-style integers when the header's feature bit 0 is set.
//!
//! Events become series as in Pyroscope's JFR ingestion (`grafana/jfr-parser` `pprof/`, and
//! the names of Pyroscope 0.37's `<app>.<suffix>` series):
//!
//! | JFR event | suffix | units | value |
//! |---|---|---|---|
//! | `jdk.ExecutionSample` | `cpu` (or async-profiler's `event` setting: `itimer`, `wall`) | `samples` | 1 per sample |
//! | `jdk.ObjectAllocationInNewTLAB` | `alloc_in_new_tlab_objects`, `alloc_in_new_tlab_bytes` | `objects`, `bytes` | 1, `tlabSize` |
//! | `jdk.ObjectAllocationOutsideTLAB` | `alloc_outside_tlab_objects`, `alloc_outside_tlab_bytes` | `objects`, `bytes` | 1, `allocationSize` |
//! | `jdk.JavaMonitorEnter`, `jdk.ThreadPark` | `lock_count`, `lock_duration` | `lock_samples`, `lock_nanoseconds` | 1, `duration` |
//!
//! Execution samples of threads in `STATE_SLEEPING` are left out of a `cpu`/`itimer` series
//! (they are not on CPU), as Pyroscope does; a `wall` recording keeps them. Durations are
//! converted from ticks to nanoseconds with the chunk's ticks per second. Frames are named
//! `package.Class.method` (the binary class name with dots), root first; frames whose method
//! or class is not in the pools are left out, and events whose stack trace is missing are
//! dropped, both as Pyroscope does. Every other event is ignored.
//!
//! Input is untrusted: every count, size and offset is checked against the bytes that remain
//! before anything is allocated for it, the metadata tree and nested values have depth caps,
//! and the number of values decoded is capped at a fixed multiple of the input's size, so no
//! input panics, recurses without end or takes more than linear work.

mod chunk;
mod metadata;
mod reader;
mod value;

use crate::{Aggregation, Tree};

use self::reader::Reader;

/// Values decoded per input byte before a recording counts as hostile. Real recordings decode
/// about one value per byte or less (every value but an empty object takes a byte).
const VALUES_PER_BYTE: u64 = 16;

/// Values any recording may decode, however small: room for a minimal recording's metadata.
const MIN_VALUES: u64 = 1 << 16;

/// Why a recording was rejected. Offsets count from the start of the (gunzipped) recording.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JfrError {
    /// A chunk does not start with `FLR\0`.
    #[error("not a JFR recording: no FLR magic at offset {offset}")]
    BadMagic {
        /// Where the chunk starts.
        offset: usize,
    },
    /// A chunk's major version is not 1 or 2.
    #[error("unsupported JFR version {major}.{minor} at offset {offset}")]
    UnsupportedVersion {
        /// Where the chunk starts.
        offset: usize,
        /// The major version.
        major: u64,
        /// The minor version.
        minor: u64,
    },
    /// The input ends inside a value.
    #[error("truncated recording: {needed} more bytes needed at offset {offset}")]
    Truncated {
        /// Where the value starts.
        offset: usize,
        /// How many bytes it needs.
        needed: usize,
    },
    /// A size, count, offset, index or tag is out of range.
    #[error("invalid {what} {value} at offset {offset}")]
    Invalid {
        /// What the value is.
        what: &'static str,
        /// Where it is.
        offset: usize,
        /// The value.
        value: u64,
    },
    /// A value or field refers to a type the metadata does not describe.
    #[error("unknown type id {type_id} at offset {offset}")]
    UnknownType {
        /// Where the value is.
        offset: usize,
        /// The type id.
        type_id: u64,
    },
    /// The metadata tree or a value nests deeper than the parser allows.
    #[error("nesting deeper than {limit} at offset {offset}")]
    TooDeep {
        /// Where the limit was reached.
        offset: usize,
        /// The depth limit.
        limit: usize,
    },
    /// The recording decodes to more values than its size allows.
    #[error("recording decodes to more than {limit} values (at offset {offset})")]
    TooMuchWork {
        /// Where the limit was reached.
        offset: usize,
        /// The limit for this input's size.
        limit: u64,
    },
}

/// One converted profile type.
#[derive(Clone, Debug, PartialEq)]
pub struct JfrSeries {
    /// The app-name suffix: `cpu`, `alloc_in_new_tlab_bytes`, `lock_duration`, ...
    pub name_suffix: &'static str,
    /// What the values count: `samples`, `objects`, `bytes`, `lock_samples`,
    /// `lock_nanoseconds`.
    pub units: &'static str,
    /// How values over time combine: always a sum for these types.
    pub aggregation: Aggregation,
    /// The stacks, root first.
    pub tree: Tree,
}

/// The JFR events that become profiles, and the setting that names the CPU series.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// `jdk.ExecutionSample`.
    Execution,
    /// `jdk.ObjectAllocationInNewTLAB`.
    InNewTlab,
    /// `jdk.ObjectAllocationOutsideTLAB`.
    OutsideTlab,
    /// `jdk.JavaMonitorEnter` and `jdk.ThreadPark`.
    Lock,
    /// `jdk.ActiveSetting`: async-profiler records its `event` (cpu, itimer, wall) here.
    Setting,
}

impl Kind {
    /// The kind of the event class named `name`.
    fn of_event(name: &str) -> Option<Kind> {
        match name {
            "jdk.ExecutionSample" => Some(Kind::Execution),
            "jdk.ObjectAllocationInNewTLAB" => Some(Kind::InNewTlab),
            "jdk.ObjectAllocationOutsideTLAB" => Some(Kind::OutsideTlab),
            "jdk.JavaMonitorEnter" | "jdk.ThreadPark" => Some(Kind::Lock),
            "jdk.ActiveSetting" => Some(Kind::Setting),
            _ => None,
        }
    }
}

/// What the chunks add up to.
#[derive(Default)]
pub(crate) struct Counts {
    /// Execution samples of threads not sleeping.
    running: Tree,
    /// All execution samples.
    all: Tree,
    in_tlab_objects: Tree,
    in_tlab_bytes: Tree,
    outside_objects: Tree,
    outside_bytes: Tree,
    lock_count: Tree,
    lock_duration: Tree,
    /// async-profiler's `event` setting, if recorded.
    pub(crate) event: Option<String>,
    /// Events dropped because their stack trace is not in the pools.
    pub(crate) unresolved: u64,
}

impl Counts {
    /// Adds `events` events of `kind` on `stack` (root first), `amount` bytes or nanoseconds.
    pub(crate) fn add(
        &mut self,
        kind: Kind,
        stack: &[String],
        events: u64,
        amount: u64,
        sleeping: bool,
    ) {
        let (count, sum) = match kind {
            Kind::Execution => {
                self.all.insert_names(stack, events);
                if !sleeping {
                    self.running.insert_names(stack, events);
                }
                return;
            }
            Kind::InNewTlab => (&mut self.in_tlab_objects, &mut self.in_tlab_bytes),
            Kind::OutsideTlab => (&mut self.outside_objects, &mut self.outside_bytes),
            Kind::Lock => (&mut self.lock_count, &mut self.lock_duration),
            Kind::Setting => return,
        };
        count.insert_names(stack, events);
        sum.insert_names(stack, amount);
    }
}

/// Converts a recording (plain bytes: the caller gunzips) to one series per profile type that
/// has samples, in a fixed order.
///
/// # Errors
///
/// A [`JfrError`] naming the offset at fault when any chunk is malformed or the recording is
/// over the work limit; nothing is returned from a recording that does not parse whole.
pub fn parse(bytes: &[u8]) -> Result<Vec<JfrSeries>, JfrError> {
    let limit = (bytes.len() as u64)
        .saturating_mul(VALUES_PER_BYTE)
        .saturating_add(MIN_VALUES);
    let mut budget = limit;
    let mut counts = Counts::default();
    let mut offset = 0;
    if bytes.is_empty() {
        return Err(JfrError::BadMagic { offset: 0 });
    }
    while offset < bytes.len() {
        let rest = Reader::new(&bytes[offset..], offset, true);
        offset += chunk::read(&rest, &mut budget, limit, &mut counts)?;
    }
    Ok(into_series(counts))
}

/// The non-empty trees of `counts`, named.
fn into_series(counts: Counts) -> Vec<JfrSeries> {
    let (cpu_suffix, cpu) = match counts.event.as_deref() {
        Some("wall") => ("wall", counts.all),
        Some("itimer") => ("itimer", counts.running),
        _ => ("cpu", counts.running),
    };
    [
        (cpu_suffix, "samples", cpu),
        (
            "alloc_in_new_tlab_objects",
            "objects",
            counts.in_tlab_objects,
        ),
        ("alloc_in_new_tlab_bytes", "bytes", counts.in_tlab_bytes),
        (
            "alloc_outside_tlab_objects",
            "objects",
            counts.outside_objects,
        ),
        ("alloc_outside_tlab_bytes", "bytes", counts.outside_bytes),
        ("lock_count", "lock_samples", counts.lock_count),
        ("lock_duration", "lock_nanoseconds", counts.lock_duration),
    ]
    .into_iter()
    .filter(|(_, _, tree)| !tree.is_empty())
    .map(|(name_suffix, units, tree)| JfrSeries {
        name_suffix,
        units,
        aggregation: Aggregation::Sum,
        tree,
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_is_not_jfr() {
        assert_eq!(parse(b""), Err(JfrError::BadMagic { offset: 0 }));
        assert_eq!(
            parse(b"not jfr at all"),
            Err(JfrError::BadMagic { offset: 0 })
        );
        assert!(matches!(parse(b"FLR\0"), Err(JfrError::Truncated { .. })));
    }
}
