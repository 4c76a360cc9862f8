//! How a pprof sample type becomes a Pyroscope series: its name suffix, units, aggregation,
//! whether it is cumulative and whether it carries a sample rate.
//!
//! [`SampleTypes::default`] is Pyroscope's built-in table (`DefaultSampleTypeMapping`,
//! `v0.37:pkg/storage/tree/pprof.go`):
//!
//! | pprof type | suffix | units | aggregation | cumulative | sampled |
//! |---|---|---|---|---|---|
//! | `samples` | `cpu` | `samples` | sum | no | yes |
//! | `inuse_objects` | `inuse_objects` | `objects` | average | no | no |
//! | `inuse_space` | `inuse_space` | `bytes` | average | no | no |
//! | `alloc_objects` | `alloc_objects` | `objects` | sum | yes | no |
//! | `alloc_space` | `alloc_space` | `bytes` | sum | yes | no |
//! | `goroutine` | `goroutines` | `goroutines` | average | no | no |
//! | `contentions` | `mutex_count` | `lock_samples` | sum | yes | no |
//! | `delay` | `mutex_duration` | `lock_nanoseconds` | sum | yes | no |
//!
//! Go's block and mutex profiles share the `contentions`/`delay` types, so the defaults cannot
//! tell them apart; the Go SDK says which one it sends in a `sample_type_config` form field
//! (`block_count`/`block_duration` for block profiles, and `cumulative: false` everywhere since
//! it sends deltas). [`SampleTypes::from_json`] reads that field. As in Pyroscope, a config sent
//! with a profile *replaces* the defaults rather than adding to them, and sample types absent
//! from the table in use are not converted.

use std::collections::HashMap;

use serde::Deserialize;

use super::PprofError;
use crate::profile::Aggregation;

/// The conversion settings of one pprof sample type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SampleTypeConfig {
    /// The units of the series; empty means the pprof unit of the sample type.
    pub units: String,
    /// The series name suffix; empty means the pprof sample type itself.
    pub display_name: String,
    /// How the series is aggregated over time.
    pub aggregation: Aggregation,
    /// Whether the values count since process start, so that the ingest path must subtract the
    /// previous profile (`prev_profile`) to get the window's share.
    pub cumulative: bool,
    /// Whether the values are sample counts that need the sample rate, taken from the profile's
    /// period, to become time.
    pub sampled: bool,
}

impl SampleTypeConfig {
    fn new(display_name: &str, units: &str, aggregation: Aggregation, cumulative: bool) -> Self {
        SampleTypeConfig {
            units: units.to_string(),
            display_name: display_name.to_string(),
            aggregation,
            cumulative,
            sampled: false,
        }
    }
}

/// The sample-type table used to turn a profile into series: pprof sample type → settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleTypes {
    types: HashMap<String, SampleTypeConfig>,
}

impl Default for SampleTypes {
    /// Pyroscope's built-in table; see the [module documentation](self).
    fn default() -> Self {
        use Aggregation::{Average, Sum};
        let mut cpu = SampleTypeConfig::new("cpu", "samples", Sum, false);
        cpu.sampled = true;
        let types = [
            ("samples", cpu),
            (
                "inuse_objects",
                SampleTypeConfig::new("", "objects", Average, false),
            ),
            (
                "inuse_space",
                SampleTypeConfig::new("", "bytes", Average, false),
            ),
            (
                "alloc_objects",
                SampleTypeConfig::new("", "objects", Sum, true),
            ),
            ("alloc_space", SampleTypeConfig::new("", "bytes", Sum, true)),
            (
                "goroutine",
                SampleTypeConfig::new("goroutines", "goroutines", Average, false),
            ),
            (
                "contentions",
                SampleTypeConfig::new("mutex_count", "lock_samples", Sum, true),
            ),
            (
                "delay",
                SampleTypeConfig::new("mutex_duration", "lock_nanoseconds", Sum, true),
            ),
        ];
        SampleTypes {
            types: types
                .into_iter()
                .map(|(name, config)| (name.to_string(), config))
                .collect(),
        }
    }
}

/// One entry of the `sample_type_config` JSON, spelled as the Go SDK writes it.
#[derive(Deserialize)]
struct JsonEntry {
    #[serde(default)]
    units: String,
    #[serde(default, rename = "display-name")]
    display_name: String,
    #[serde(default)]
    aggregation: String,
    #[serde(default)]
    cumulative: bool,
    #[serde(default)]
    sampled: bool,
}

impl SampleTypes {
    /// An empty table: no sample type is converted until [`insert`](Self::insert)ed.
    pub fn empty() -> Self {
        SampleTypes {
            types: HashMap::new(),
        }
    }

    /// Parses the `sample_type_config` field of the Go SDK's multipart form:
    /// `{"<type>": {"units", "display-name", "aggregation", "cumulative", "sampled"}}`, every
    /// key optional. The result replaces the defaults for that profile, as in Pyroscope.
    ///
    /// Unknown keys are ignored, as Go's decoder does. `aggregation` is `sum`, `average`, `avg`
    /// or empty (sum); a `null` entry is an entry with every key absent.
    ///
    /// # Errors
    ///
    /// [`PprofError::SampleTypeConfig`] when the body is not a JSON object of such entries, and
    /// [`PprofError::UnknownAggregation`] for any other aggregation name.
    pub fn from_json(json: &[u8]) -> Result<Self, PprofError> {
        let raw: HashMap<String, Option<JsonEntry>> = serde_json::from_slice(json)
            .map_err(|source| PprofError::SampleTypeConfig { source })?;
        let mut types = HashMap::with_capacity(raw.len());
        for (name, entry) in raw {
            let Some(entry) = entry else {
                types.insert(name, SampleTypeConfig::default());
                continue;
            };
            let aggregation = match entry.aggregation.as_str() {
                "" | "sum" => Aggregation::Sum,
                "average" | "avg" => Aggregation::Average,
                _ => {
                    return Err(PprofError::UnknownAggregation {
                        sample_type: name,
                        aggregation: entry.aggregation,
                    });
                }
            };
            let config = SampleTypeConfig {
                units: entry.units,
                display_name: entry.display_name,
                aggregation,
                cumulative: entry.cumulative,
                sampled: entry.sampled,
            };
            types.insert(name, config);
        }
        Ok(SampleTypes { types })
    }

    /// The settings of `sample_type`, if it is converted.
    pub fn get(&self, sample_type: &str) -> Option<&SampleTypeConfig> {
        self.types.get(sample_type)
    }

    /// Sets the settings of `sample_type`, replacing any it had.
    pub fn insert(&mut self, sample_type: impl Into<String>, config: SampleTypeConfig) {
        self.types.insert(sample_type.into(), config);
    }

    /// The number of sample types in the table.
    pub fn len(&self) -> usize {
        self.types.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_pyroscope() {
        let types = SampleTypes::default();
        assert_eq!(types.len(), 8);
        let cpu = types.get("samples").unwrap();
        assert_eq!(
            (cpu.display_name.as_str(), cpu.units.as_str()),
            ("cpu", "samples")
        );
        assert!(cpu.sampled && !cpu.cumulative);
        let inuse = types.get("inuse_space").unwrap();
        assert_eq!(inuse.aggregation, Aggregation::Average);
        assert!(types.get("alloc_objects").unwrap().cumulative);
        assert_eq!(types.get("goroutine").unwrap().display_name, "goroutines");
        assert_eq!(types.get("delay").unwrap().units, "lock_nanoseconds");
        assert!(types.get("cpu").is_none());
    }

    #[test]
    fn go_sdk_block_config_parses() {
        let json = br#"{"contentions":{"display-name":"block_count","units":"lock_samples"},
            "delay":{"display-name":"block_duration","units":"lock_nanoseconds","aggregation":"avg"},
            "goroutine":null, "x": {"unknown-key": 1}}"#;
        let types = SampleTypes::from_json(json).unwrap();
        assert_eq!(types.len(), 4);
        let count = types.get("contentions").unwrap();
        assert_eq!(count.display_name, "block_count");
        assert!(!count.cumulative);
        assert_eq!(
            types.get("delay").unwrap().aggregation,
            Aggregation::Average
        );
        assert_eq!(
            types.get("goroutine").unwrap(),
            &SampleTypeConfig::default()
        );
        assert!(
            types.get("samples").is_none(),
            "a config replaces the defaults"
        );
    }

    #[test]
    fn bad_json_is_rejected_with_context() {
        for bad in [
            &b"{"[..],
            b"[]",
            br#"{"a": 3}"#,
            br#"{"a": {"cumulative": "yes"}}"#,
        ] {
            let err = SampleTypes::from_json(bad).unwrap_err();
            assert!(matches!(err, PprofError::SampleTypeConfig { .. }), "{err}");
            assert!(
                err.to_string()
                    .starts_with("invalid sample_type_config json")
            );
        }
        let err = SampleTypes::from_json(br#"{"delay": {"aggregation": "max"}}"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown aggregation \"max\" for sample type delay in sample_type_config"
        );
    }
}
