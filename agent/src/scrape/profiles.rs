//! A job's profiles: the built-in ones as Pyroscope v0.37 defines them, a job's overrides and
//! custom profiles (`profiles:`), and how they resolve into the [`ProfileEndpoint`]s a target
//! scrapes.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use smolder_common::pprof::{SampleTypeConfig, SampleTypes};
use smolder_common::profile::Aggregation;

use super::ScrapeConfigError;
use super::config::ScrapeConfig;

/// One profile: what to fetch and how its sample types become series.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct ProfileConfig {
    /// The URL path, such as `/debug/pprof/heap`. Empty keeps the built-in profile's.
    pub path: String,
    /// Query parameters, each a value or a list of values. A `seconds` parameter makes this a
    /// duration profile: the target profiles for that long (capped at the scrape interval), and
    /// the profile covers that span. Empty keeps the built-in profile's.
    pub params: BTreeMap<String, ParamValues>,
    /// How sample types become series; types not listed are skipped unless
    /// `all-sample-types`. Empty keeps the built-in profile's.
    #[serde(alias = "sample_types")]
    pub sample_types: BTreeMap<String, SampleTypeEntry>,
    /// Convert sample types missing from `sample-types` too, as plain sums named after the
    /// type. Default false.
    #[serde(alias = "all_sample_types")]
    pub all_sample_types: bool,
}

/// A query parameter's values: one string or a list, as Go's `url.Values` is written.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum ParamValues {
    /// `seconds: 10` or `seconds: "10"`.
    One(ScalarValue),
    /// `seconds: ["10"]`.
    Many(Vec<ScalarValue>),
}

/// A parameter value written as a string, a number or a boolean.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum ScalarValue {
    /// A string.
    Text(String),
    /// A whole number.
    Number(i64),
    /// A boolean.
    Flag(bool),
}

impl ScalarValue {
    fn text(&self) -> String {
        match self {
            ScalarValue::Text(text) => text.clone(),
            ScalarValue::Number(n) => n.to_string(),
            ScalarValue::Flag(b) => b.to_string(),
        }
    }
}

impl ParamValues {
    /// The values as strings.
    pub fn values(&self) -> Vec<String> {
        match self {
            ParamValues::One(one) => vec![one.text()],
            ParamValues::Many(many) => many.iter().map(ScalarValue::text).collect(),
        }
    }
}

/// How one sample type becomes a series, as Pyroscope's `sample-types` entries are written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct SampleTypeEntry {
    /// The series name suffix; empty means the sample type's own name.
    #[serde(alias = "display_name")]
    pub display_name: String,
    /// The units: `samples`, `objects`, `bytes`, `goroutines`, `lock_samples`,
    /// `lock_nanoseconds`...; empty means the pprof unit.
    pub units: String,
    /// `sum` (default) or `average`.
    pub aggregation: String,
    /// Values count since process start; the agent subtracts the previous scrape.
    pub cumulative: bool,
    /// Values are samples taken at the profile's period (CPU).
    pub sampled: bool,
}

/// One pprof endpoint of a target, ready to scrape: its path, its query parameters and how its
/// sample types become series ([`ProfileConfig`] merged over the built-in one and resolved).
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileEndpoint {
    /// The URL path.
    pub path: String,
    /// Query parameters, sorted by name.
    pub params: BTreeMap<String, Vec<String>>,
    /// The sample-type table.
    pub sample_types: SampleTypes,
    /// Whether types missing from the table are converted too.
    pub all_sample_types: bool,
}

/// The built-in profiles, as Pyroscope v0.37 defines them (`DefaultConfig`).
fn builtin(name: &str, use_delta_profiles: bool) -> Option<ProfileEndpoint> {
    use Aggregation::{Average, Sum};
    let entry = |display: &str, units: &str, aggregation, cumulative| SampleTypeConfig {
        units: units.to_owned(),
        display_name: display.to_owned(),
        aggregation,
        cumulative,
        sampled: false,
    };
    let table = |types: Vec<(&str, SampleTypeConfig)>| {
        let mut table = SampleTypes::empty();
        for (name, config) in types {
            table.insert(name, config);
        }
        table
    };
    let memory = |cumulative| {
        table(vec![
            ("inuse_objects", entry("", "objects", Average, false)),
            ("inuse_space", entry("", "bytes", Average, false)),
            ("alloc_objects", entry("", "objects", Sum, cumulative)),
            ("alloc_space", entry("", "bytes", Sum, cumulative)),
        ])
    };
    let locks = |prefix: &str, cumulative| {
        table(vec![
            (
                "contentions",
                entry(&format!("{prefix}_count"), "lock_samples", Sum, cumulative),
            ),
            (
                "delay",
                entry(
                    &format!("{prefix}_duration"),
                    "lock_nanoseconds",
                    Sum,
                    cumulative,
                ),
            ),
        ])
    };
    let delta = use_delta_profiles;
    let (path, params, sample_types) = match name {
        "cpu" => {
            let mut cpu = entry("cpu", "samples", Sum, false);
            cpu.sampled = true;
            (
                "/debug/pprof/profile",
                vec![("seconds", "10")],
                table(vec![("samples", cpu)]),
            )
        }
        "mem" if delta => ("/debug/pprof/delta_heap", vec![], memory(false)),
        "mem" => ("/debug/pprof/heap", vec![], memory(true)),
        "pyroscope_mem" => ("/debug/pprof/pyroscope_heap", vec![], memory(false)),
        "goroutines" => (
            "/debug/pprof/goroutine",
            vec![],
            table(vec![(
                "goroutine",
                entry("goroutines", "goroutines", Average, false),
            )]),
        ),
        "mutex" if delta => ("/debug/pprof/delta_mutex", vec![], locks("mutex", false)),
        "mutex" => ("/debug/pprof/mutex", vec![], locks("mutex", true)),
        "pyroscope_mutex" => (
            "/debug/pprof/pyroscope_mutex",
            vec![],
            locks("mutex", false),
        ),
        "block" if delta => ("/debug/pprof/delta_block", vec![], locks("block", false)),
        "block" => ("/debug/pprof/block", vec![], locks("block", true)),
        "pyroscope_block" => (
            "/debug/pprof/pyroscope_block",
            vec![],
            locks("block", false),
        ),
        _ => return None,
    };
    Some(ProfileEndpoint {
        path: path.to_owned(),
        params: params
            .into_iter()
            .map(|(k, v)| (k.to_owned(), vec![v.to_owned()]))
            .collect(),
        sample_types,
        all_sample_types: false,
    })
}

/// The names of the built-in profiles.
pub const BUILTIN_PROFILES: [&str; 8] = [
    "cpu",
    "mem",
    "goroutines",
    "mutex",
    "block",
    "pyroscope_mem",
    "pyroscope_mutex",
    "pyroscope_block",
];

impl ScrapeConfig {
    /// Every profile this job can scrape (built-in ones, with this job's overrides, and custom
    /// ones), by name.
    ///
    /// # Errors
    ///
    /// [`ScrapeConfigError::Profile`] when a custom profile has no path or a sample type an
    /// unknown aggregation.
    pub fn resolved_profiles(
        &self,
    ) -> Result<BTreeMap<String, ProfileEndpoint>, ScrapeConfigError> {
        let mut out = BTreeMap::new();
        for name in BUILTIN_PROFILES {
            if let Some(profile) = builtin(name, self.use_delta_profiles) {
                out.insert(name.to_owned(), profile);
            }
        }
        for (name, custom) in &self.profiles {
            let base = out.remove(name);
            let error = |reason: String| ScrapeConfigError::Profile {
                job: self.job_name.clone(),
                profile: name.clone(),
                reason,
            };
            let path = match (&base, custom.path.is_empty()) {
                (_, false) => custom.path.clone(),
                (Some(base), true) => base.path.clone(),
                (None, true) => return Err(error("a custom profile needs a path".to_owned())),
            };
            if !path.starts_with('/') {
                return Err(error(format!("path {path:?} does not start with '/'")));
            }
            let params = if custom.params.is_empty() {
                base.as_ref().map(|b| b.params.clone()).unwrap_or_default()
            } else {
                custom
                    .params
                    .iter()
                    .map(|(k, v)| (k.clone(), v.values()))
                    .collect()
            };
            let sample_types = if custom.sample_types.is_empty() {
                base.as_ref()
                    .map(|b| b.sample_types.clone())
                    .unwrap_or_else(SampleTypes::empty)
            } else {
                let mut table = SampleTypes::empty();
                for (sample_type, entry) in &custom.sample_types {
                    let aggregation = match entry.aggregation.as_str() {
                        "" => Aggregation::Sum,
                        other => other.parse().map_err(|_| {
                            error(format!(
                                "sample type {sample_type}: unknown aggregation {other:?}, \
                                 expected sum or average"
                            ))
                        })?,
                    };
                    table.insert(
                        sample_type.clone(),
                        SampleTypeConfig {
                            units: entry.units.clone(),
                            display_name: entry.display_name.clone(),
                            aggregation,
                            cumulative: entry.cumulative,
                            sampled: entry.sampled,
                        },
                    );
                }
                table
            };
            let all_sample_types = custom.all_sample_types;
            if sample_types.is_empty() && !all_sample_types {
                return Err(error(
                    "no sample-types and all-sample-types is false, so nothing would be kept"
                        .to_owned(),
                ));
            }
            out.insert(
                name.clone(),
                ProfileEndpoint {
                    path,
                    params,
                    sample_types,
                    all_sample_types,
                },
            );
        }
        Ok(out)
    }
}

/// The `seconds` a duration profile runs for at `interval`: its `seconds` parameter capped at
/// the interval (Pyroscope's rule), or `None` for instant profiles.
pub fn duration_seconds(profile: &ProfileEndpoint, interval: Duration) -> Option<u64> {
    let values = profile.params.get("seconds")?;
    let cap = interval.as_secs().max(1);
    let asked = values
        .first()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .unwrap_or(cap);
    Some(asked.min(cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> ScrapeConfig {
        serde_norway::from_str(yaml).unwrap()
    }

    #[test]
    fn custom_profiles_and_overrides_merge_over_the_builtins() {
        let config = parse(
            "job-name: j\nenabled-profiles: [cpu, fgprof]\nprofiles:\n  cpu: {params: {seconds: 5}}\n  \
             fgprof:\n    path: /debug/fgprof\n    params: {seconds: [\"10\"]}\n    \
             sample-types: {samples: {display-name: wall, units: samples, sampled: true}}\n",
        );
        config.validate().unwrap();
        let profiles = config.resolved_profiles().unwrap();
        assert_eq!(profiles["cpu"].path, "/debug/pprof/profile");
        assert_eq!(profiles["cpu"].params["seconds"], vec!["5".to_owned()]);
        assert_eq!(
            profiles["fgprof"]
                .sample_types
                .get("samples")
                .unwrap()
                .display_name,
            "wall"
        );
        assert_eq!(
            duration_seconds(&profiles["fgprof"], Duration::from_secs(10)),
            Some(10)
        );
        assert_eq!(
            duration_seconds(&profiles["mem"], Duration::from_secs(10)),
            None
        );
    }
}
