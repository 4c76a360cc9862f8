//! The agent's configuration file: one section per stage, every field with its default.
//!
//! Keys are kebab-case, as in Pyroscope's agent config, so that its sections (`scrape-configs`,
//! `metrics-export-rules`) paste in unchanged. `smolder-agent print-default-config` prints the
//! defaults as YAML.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

pub use crate::ebpf::EbpfConfig;
pub use crate::ebpf::symbolize::SymbolizeConfig;
pub use crate::scrape::ScrapeConfig;
pub use crate::ship::ShipConfig;
pub use crate::spool::SpoolConfig;
pub use crate::window::WindowConfig;
pub use smolder_common::rules::RuleSpec;

/// The whole configuration file.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct Config {
    /// The `hostname` label of every series; empty means the host's own name.
    pub hostname: String,
    /// The agent's HTTP port.
    pub http: HttpConfig,
    /// How stacks are grouped in time.
    pub window: WindowConfig,
    /// The eBPF source: sampling every process in the kernel.
    pub ebpf: EbpfConfig,
    /// How the eBPF source's addresses become function names.
    pub symbolize: SymbolizeConfig,
    /// Pyroscope's metrics-export rules, keyed by metric name: counters of every window's
    /// values, served on `/exported-metrics`. Default none.
    pub metrics_export_rules: BTreeMap<String, RuleSpec>,
    /// Bounds of the on-disk spool of batches not yet acknowledged.
    pub spool: SpoolConfig,
    /// Where and how batches are shipped.
    pub ship: ShipConfig,
    /// Pull mode: pprof targets to scrape, in Pyroscope's `scrape-configs` format.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scrape_configs: Vec<ScrapeConfig>,
}

/// The agent's HTTP listener.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct HttpConfig {
    /// Address and port for `/metrics` and `/healthz`. Default `127.0.0.1:4042`: the agent's
    /// port is for the local Prometheus, not the world.
    pub listen: SocketAddr,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 4042)),
        }
    }
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
        crate::scrape::validate(&config.scrape_configs)
            .with_context(|| format!("checking config file {}", path.display()))?;
        crate::rules::compile(&config.metrics_export_rules)
            .with_context(|| format!("checking config file {}", path.display()))?;
        config.ebpf.warn_deprecated();
        Ok(config)
    }

    /// The defaults, as YAML.
    pub fn default_yaml() -> String {
        serde_norway::to_string(&Config::default()).expect("the default config serializes")
    }

    /// The `hostname` label: the configured one, else the kernel's.
    ///
    /// # Errors
    ///
    /// When none is configured and `/proc/sys/kernel/hostname` cannot be read.
    pub fn hostname(&self) -> anyhow::Result<String> {
        if !self.hostname.is_empty() {
            return Ok(self.hostname.clone());
        }
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("reading /proc/sys/kernel/hostname")?;
        Ok(name.trim().to_owned())
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
    fn deprecated_ebpf_keys_are_still_read_and_named() {
        let config: Config =
            serde_norway::from_str("ebpf:\n  counts-map-entries: 100\n  stack-map-entries: 200\n")
                .unwrap();
        assert_eq!(
            config.ebpf.deprecated_keys(),
            ["ebpf.counts-map-entries", "ebpf.stack-map-entries"]
        );
        assert!(Config::default().ebpf.deprecated_keys().is_empty());
        let yaml = Config::default_yaml();
        assert!(!yaml.contains("counts-map-entries") && yaml.contains("max-frames: 128"));
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = serde_norway::from_str::<Config>("http:\n  listne: 1.2.3.4:5\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `listne`"), "{err}");
    }
}
