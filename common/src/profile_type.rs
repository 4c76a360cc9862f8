//! Profile types: Pyroscope's ids, `name:sample_type:sample_unit:period_type:period_unit`, and
//! the Smolder series they stand for.
//!
//! A Smolder series names its profile type with the last dot segment of its app name
//! (`checkout.cpu`); Grafana and Pyroscope's API name it with an id such as
//! `process_cpu:cpu:nanoseconds:cpu:nanoseconds`. This module is the one table between the
//! two, shared by every source of series (the agent's eBPF types, pulled and pushed pprof,
//! JFR, OTLP) and by the query path, which answers `ProfileTypes`, selects series by id, and
//! converts values to the units the id promises.
//!
//! | series suffix | profile type id |
//! |---|---|
//! | `cpu`, `itimer` | `process_cpu:cpu:nanoseconds:cpu:nanoseconds` |
//! | `wall` | `wall:wall:nanoseconds:wall:nanoseconds` |
//! | `off_cpu` | `off_cpu:off_cpu:nanoseconds:off_cpu:nanoseconds` |
//! | `run_queue` | `run_queue:run_queue:nanoseconds:run_queue:nanoseconds` |
//! | `memory_growth` | `memory_growth:memory_growth:bytes:memory_growth:bytes` |
//! | `alloc_objects`, `alloc_space`, `inuse_objects`, `inuse_space` | `memory:<suffix>:<count or bytes>:space:bytes` |
//! | `goroutines` | `goroutine:goroutine:count:goroutine:count` |
//! | `mutex_count`, `mutex_duration` | `mutex:contentions:count:contentions:count`, `mutex:delay:nanoseconds:contentions:count` |
//! | `block_count`, `block_duration` | `block:contentions:count:contentions:count`, `block:delay:nanoseconds:contentions:count` |
//! | `alloc_in_new_tlab_objects`, `…_bytes`, `alloc_outside_tlab_objects`, `…_bytes` (JFR) | `memory:<suffix>:<count or bytes>:space:bytes` |
//! | `lock_count`, `lock_duration` (JFR) | `mutex:contentions:count:mutex:count`, `mutex:delay:nanoseconds:mutex:count` |
//! | `alloc_samples`, `alloc_size`, `lock_time`, `exception` (.NET) | `process_cpu:<suffix>:<count, bytes or nanoseconds>:cpu:nanoseconds` |
//!
//! These are the ids Pyroscope gives the same data when its Go, Java and .NET SDKs push it
//! (`.cpu` from `/ingest` gets the same id there too). Any other suffix gets
//! `<suffix>:<suffix>:<unit>::`, its unit read from the series' units ([`unit_of`]).
//!
//! Values: Smolder stores CPU-like series as sample counts with a sample rate (`units:
//! samples`), and Pyroscope answers in nanoseconds; [`ValueScale::of`] gives the factor,
//! 10^9 / rate, so 40 samples at 100 Hz are 4×10^8 ns. Every other unit is answered as stored.
//!
//! Selecting by id ([`ProfileTypeId::selects`]) compares name, sample type and sample unit, and
//! ignores the period: Pyroscope's legacy ingest writes `memory:alloc_space:bytes::` for what
//! its SDKs write as `memory:alloc_space:bytes:space:bytes`, and a dashboard built on either
//! should find the data.

use std::fmt;
use std::str::FromStr;

use crate::ProfileMeta;

/// A Pyroscope profile type id: `name:sample_type:sample_unit:period_type:period_unit`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProfileTypeId {
    /// The profile's name, the series' `__name__` label in Pyroscope: `process_cpu`, `memory`.
    pub name: String,
    /// What each value is: `cpu`, `alloc_space`, `contentions`.
    pub sample_type: String,
    /// The values' unit: `nanoseconds`, `bytes`, `count`.
    pub sample_unit: String,
    /// The kind of event between samples: `cpu`, `space`; may be empty.
    pub period_type: String,
    /// The unit of the period; may be empty.
    pub period_unit: String,
}

/// A string that is not a profile type id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid profile type id {id:?}: expected <name>:<sample_type>:<sample_unit>:<period_type>:<period_unit> with a name, sample type and sample unit"
)]
pub struct BadProfileTypeId {
    /// The string given.
    pub id: String,
}

impl FromStr for ProfileTypeId {
    type Err = BadProfileTypeId;

    /// Five `:`-separated parts, the first three not empty. A sixth part (Pyroscope's optional
    /// `:delta`) is accepted and ignored, as Pyroscope ignores it.
    fn from_str(id: &str) -> Result<Self, Self::Err> {
        let bad = || BadProfileTypeId { id: id.to_owned() };
        let parts: Vec<&str> = id.split(':').collect();
        if !(5..=6).contains(&parts.len()) || parts[..3].iter().any(|p| p.is_empty()) {
            return Err(bad());
        }
        Ok(ProfileTypeId {
            name: parts[0].to_owned(),
            sample_type: parts[1].to_owned(),
            sample_unit: parts[2].to_owned(),
            period_type: parts[3].to_owned(),
            period_unit: parts[4].to_owned(),
        })
    }
}

impl fmt::Display for ProfileTypeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}:{}",
            self.name, self.sample_type, self.sample_unit, self.period_type, self.period_unit
        )
    }
}

/// One row of the table: a series suffix and its id's five parts.
type Row = (&'static str, [&'static str; 5]);

/// The table of the [module documentation](self).
const TABLE: &[Row] = &[
    (
        "cpu",
        ["process_cpu", "cpu", "nanoseconds", "cpu", "nanoseconds"],
    ),
    (
        "itimer",
        ["process_cpu", "cpu", "nanoseconds", "cpu", "nanoseconds"],
    ),
    (
        "wall",
        ["wall", "wall", "nanoseconds", "wall", "nanoseconds"],
    ),
    (
        "off_cpu",
        [
            "off_cpu",
            "off_cpu",
            "nanoseconds",
            "off_cpu",
            "nanoseconds",
        ],
    ),
    (
        "run_queue",
        [
            "run_queue",
            "run_queue",
            "nanoseconds",
            "run_queue",
            "nanoseconds",
        ],
    ),
    (
        "memory_growth",
        [
            "memory_growth",
            "memory_growth",
            "bytes",
            "memory_growth",
            "bytes",
        ],
    ),
    (
        "alloc_objects",
        ["memory", "alloc_objects", "count", "space", "bytes"],
    ),
    (
        "alloc_space",
        ["memory", "alloc_space", "bytes", "space", "bytes"],
    ),
    (
        "inuse_objects",
        ["memory", "inuse_objects", "count", "space", "bytes"],
    ),
    (
        "inuse_space",
        ["memory", "inuse_space", "bytes", "space", "bytes"],
    ),
    (
        "goroutines",
        ["goroutine", "goroutine", "count", "goroutine", "count"],
    ),
    (
        "mutex_count",
        ["mutex", "contentions", "count", "contentions", "count"],
    ),
    (
        "mutex_duration",
        ["mutex", "delay", "nanoseconds", "contentions", "count"],
    ),
    (
        "block_count",
        ["block", "contentions", "count", "contentions", "count"],
    ),
    (
        "block_duration",
        ["block", "delay", "nanoseconds", "contentions", "count"],
    ),
    (
        "alloc_in_new_tlab_objects",
        [
            "memory",
            "alloc_in_new_tlab_objects",
            "count",
            "space",
            "bytes",
        ],
    ),
    (
        "alloc_in_new_tlab_bytes",
        [
            "memory",
            "alloc_in_new_tlab_bytes",
            "bytes",
            "space",
            "bytes",
        ],
    ),
    (
        "alloc_outside_tlab_objects",
        [
            "memory",
            "alloc_outside_tlab_objects",
            "count",
            "space",
            "bytes",
        ],
    ),
    (
        "alloc_outside_tlab_bytes",
        [
            "memory",
            "alloc_outside_tlab_bytes",
            "bytes",
            "space",
            "bytes",
        ],
    ),
    (
        "lock_count",
        ["mutex", "contentions", "count", "mutex", "count"],
    ),
    (
        "lock_duration",
        ["mutex", "delay", "nanoseconds", "mutex", "count"],
    ),
    (
        "alloc_samples",
        [
            "process_cpu",
            "alloc_samples",
            "count",
            "cpu",
            "nanoseconds",
        ],
    ),
    (
        "alloc_size",
        ["process_cpu", "alloc_size", "bytes", "cpu", "nanoseconds"],
    ),
    (
        "lock_time",
        [
            "process_cpu",
            "lock_time",
            "nanoseconds",
            "cpu",
            "nanoseconds",
        ],
    ),
    (
        "exception",
        ["process_cpu", "exception", "count", "cpu", "nanoseconds"],
    ),
];

impl ProfileTypeId {
    fn from_row(parts: &[&str; 5]) -> Self {
        ProfileTypeId {
            name: parts[0].to_owned(),
            sample_type: parts[1].to_owned(),
            sample_unit: parts[2].to_owned(),
            period_type: parts[3].to_owned(),
            period_unit: parts[4].to_owned(),
        }
    }

    /// The id of a series whose app name ends in `.suffix` and whose values are in `units`
    /// (Smolder's units: `samples`, `bytes`, `objects`, ...): its row in the table, else
    /// `<suffix>:<suffix>:<unit>::`.
    pub fn for_series(suffix: &str, units: &str) -> ProfileTypeId {
        match TABLE.iter().find(|(s, _)| *s == suffix) {
            Some((_, parts)) => ProfileTypeId::from_row(parts),
            None => ProfileTypeId {
                name: suffix.to_owned(),
                sample_type: suffix.to_owned(),
                sample_unit: unit_of(units).to_owned(),
                period_type: String::new(),
                period_unit: String::new(),
            },
        }
    }

    /// Whether this id selects a series with that suffix and units: name, sample type and
    /// sample unit agree (the period is ignored; see the [module documentation](self)).
    pub fn selects(&self, suffix: &str, units: &str) -> bool {
        let theirs = ProfileTypeId::for_series(suffix, units);
        self.name == theirs.name
            && self.sample_type == theirs.sample_type
            && self.sample_unit == theirs.sample_unit
    }

    /// The series suffixes of the table that this id selects; a suffix outside the table is
    /// selected when it equals the id's sample type (see [`selects`](Self::selects)).
    pub fn known_suffixes(&self) -> impl Iterator<Item = &'static str> + '_ {
        TABLE
            .iter()
            .filter(|(_, parts)| {
                parts[0] == self.name
                    && parts[1] == self.sample_type
                    && parts[2] == self.sample_unit
            })
            .map(|(suffix, _)| *suffix)
    }
}

/// Pyroscope's unit for Smolder's `units`: sample counts become `nanoseconds` (they are
/// answered as time, see [`ValueScale`]); `objects`, `goroutines` and `lock_samples` are
/// `count`; `lock_nanoseconds` is `nanoseconds`; anything else is itself.
pub fn unit_of(units: &str) -> &str {
    match units {
        "samples" | "lock_nanoseconds" => "nanoseconds",
        "objects" | "goroutines" | "lock_samples" => "count",
        other => other,
    }
}

/// The factor that turns a series' stored values into the values Pyroscope answers with:
/// `value × numerator / denominator`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueScale {
    /// Multiplied by first.
    pub numerator: u64,
    /// Then divided by; never zero.
    pub denominator: u64,
}

impl ValueScale {
    /// Values unchanged.
    pub const IDENTITY: ValueScale = ValueScale {
        numerator: 1,
        denominator: 1,
    };

    /// The scale for a series described by `meta`: sample counts (`units: samples`) with a
    /// sample rate become nanoseconds (× 10^9 / rate); everything else stays as stored.
    pub fn of(meta: &ProfileMeta) -> ValueScale {
        if meta.units == "samples" && meta.sample_rate > 0 {
            ValueScale {
                numerator: 1_000_000_000,
                denominator: u64::from(meta.sample_rate),
            }
        } else {
            ValueScale::IDENTITY
        }
    }

    /// Whether values are unchanged.
    pub fn is_identity(self) -> bool {
        self.numerator == self.denominator
    }

    /// One value scaled, rounding down and saturating.
    pub fn apply(self, value: u64) -> u64 {
        let scaled = u128::from(value) * u128::from(self.numerator) / u128::from(self.denominator);
        u64::try_from(scaled).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_and_print() {
        let id: ProfileTypeId = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
            .parse()
            .unwrap();
        assert_eq!(id, ProfileTypeId::for_series("cpu", "samples"));
        assert_eq!(
            id.to_string(),
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
        );
        let legacy: ProfileTypeId = "memory:alloc_space:bytes::".parse().unwrap();
        assert_eq!(legacy.period_type, "");
        let delta: ProfileTypeId = "memory:alloc_space:bytes:space:bytes:delta"
            .parse()
            .unwrap();
        assert_eq!(delta.to_string(), "memory:alloc_space:bytes:space:bytes");
        for bad in [
            "",
            "cpu",
            "a:b:c:d",
            "a:b:c:d:e:f:g",
            ":cpu:nanoseconds::",
            "a::c::",
        ] {
            assert_eq!(
                bad.parse::<ProfileTypeId>(),
                Err(BadProfileTypeId { id: bad.into() }),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_design_table_holds() {
        for (suffix, units, id) in [
            (
                "cpu",
                "samples",
                "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            ),
            (
                "off_cpu",
                "nanoseconds",
                "off_cpu:off_cpu:nanoseconds:off_cpu:nanoseconds",
            ),
            (
                "memory_growth",
                "bytes",
                "memory_growth:memory_growth:bytes:memory_growth:bytes",
            ),
            (
                "alloc_space",
                "bytes",
                "memory:alloc_space:bytes:space:bytes",
            ),
            (
                "inuse_objects",
                "objects",
                "memory:inuse_objects:count:space:bytes",
            ),
            (
                "goroutines",
                "goroutines",
                "goroutine:goroutine:count:goroutine:count",
            ),
            (
                "block_duration",
                "lock_nanoseconds",
                "block:delay:nanoseconds:contentions:count",
            ),
            ("custom", "bytes", "custom:custom:bytes::"),
            (
                "exceptions",
                "samples",
                "exceptions:exceptions:nanoseconds::",
            ),
        ] {
            assert_eq!(
                ProfileTypeId::for_series(suffix, units).to_string(),
                id,
                "{suffix}"
            );
            let parsed: ProfileTypeId = id.parse().unwrap();
            assert!(parsed.selects(suffix, units), "{id} selects {suffix}");
        }
    }

    #[test]
    fn selection_ignores_the_period_and_merges_aliases() {
        let legacy: ProfileTypeId = "memory:alloc_space:bytes::".parse().unwrap();
        assert!(legacy.selects("alloc_space", "bytes"));
        assert!(!legacy.selects("inuse_space", "bytes"));
        let cpu: ProfileTypeId = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
            .parse()
            .unwrap();
        assert_eq!(cpu.known_suffixes().collect::<Vec<_>>(), ["cpu", "itimer"]);
        assert!(!cpu.selects("wall", "samples"));
    }

    #[test]
    fn cpu_samples_become_nanoseconds() {
        let meta = ProfileMeta::default();
        let scale = ValueScale::of(&meta);
        assert_eq!(scale.apply(40), 400_000_000, "40 samples at 100 Hz");
        let bytes = ProfileMeta {
            units: "bytes".into(),
            ..ProfileMeta::default()
        };
        assert!(ValueScale::of(&bytes).is_identity());
        let unrated = ProfileMeta {
            sample_rate: 0,
            ..ProfileMeta::default()
        };
        assert!(ValueScale::of(&unrated).is_identity());
        assert_eq!(scale.apply(u64::MAX), u64::MAX);
    }
}
