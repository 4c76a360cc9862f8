//! The aggregator's configuration file: one section per stage, every field with its default.
//!
//! Runtime details (data directory, log level and format) are command-line flags; the file holds
//! the shape of the pipeline. `smolder-aggregator print-default-config` prints this file's
//! defaults as YAML, so the documentation cannot drift from the code.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

pub use crate::http::HttpConfig;
pub use crate::ingest::IngestConfig;
pub use crate::query::QueryConfig;
pub use crate::rules::RulesConfig;
pub use crate::store::StoreConfig;
pub use smolder_common::rules::RuleSpec;

/// The whole configuration file.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct Config {
    /// The HTTP listener: API, UI and `/metrics`.
    pub http: HttpConfig,
    /// Where profiles are kept and for how long.
    pub store: StoreConfig,
    /// Limits on what clients may send.
    pub ingest: IngestConfig,
    /// Limits and defaults of the query API.
    pub query: QueryConfig,
    /// Where the counters of the rules go besides `/exported-metrics` (remote write).
    pub rules: RulesConfig,
    /// Pyroscope's metrics-export rules, keyed by metric name: counters of the stored
    /// profiles' values, served on `/exported-metrics`; listed by the recording-rules API as
    /// provisioned. Default none.
    pub metrics_export_rules: BTreeMap<String, RuleSpec>,
}

impl Config {
    /// Reads a YAML configuration file; keys it does not know are an error.
    ///
    /// # Errors
    ///
    /// When the file cannot be read or is not a valid configuration.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        let config: Config = serde_norway::from_str(&text)
            .with_context(|| format!("parsing config file {}", path.display()))?;
        crate::rules::check_config(&config.metrics_export_rules, &config.rules)
            .with_context(|| format!("checking config file {}", path.display()))?;
        Ok(config)
    }

    /// The defaults, as YAML.
    pub fn default_yaml() -> String {
        serde_norway::to_string(&Config::default()).expect("the default config serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_round_trip_through_yaml() {
        let yaml = Config::default_yaml();
        let parsed: Config = serde_norway::from_str(&yaml).unwrap();
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = serde_norway::from_str::<Config>("http:\n  listne: 1.2.3.4:5\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `listne`"), "{err}");
    }
}
