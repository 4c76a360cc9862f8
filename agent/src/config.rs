//! The agent's configuration file: one section per stage, every field with its default.
//!
//! Keys are kebab-case, as in Pyroscope's agent config, so that its sections (`scrape-configs`,
//! `metrics-export-rules`) paste in unchanged. `smolder-agent print-default-config` prints the
//! defaults as YAML.

use std::collections::BTreeMap;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use smolder_daemon::{DaemonConfig, RenamedKey};

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
    /// Pull mode: pprof targets to scrape, in Pyroscope's `scrape-configs` format. Default
    /// none.
    pub scrape_configs: Vec<ScrapeConfig>,
}

/// The agent's HTTP listener (`/metrics`, `/exported-metrics`, `/targets`, `/healthz`), by
/// default on `127.0.0.1:4042`: the agent's port is for the local Prometheus, not the world.
pub type HttpConfig = smolder_daemon::HttpConfig<true, 4042>;

impl DaemonConfig for Config {
    const RENAMED: &'static [RenamedKey] = &[RenamedKey {
        section: &["ship"],
        old: "max-in-flight",
        new: "max-batches-in-flight",
    }];

    fn validate(&self) -> anyhow::Result<()> {
        crate::scrape::validate(&self.scrape_configs)?;
        crate::rules::compile(&self.metrics_export_rules)?;
        // Keys that mean nothing any more (not renamed, so not in RENAMED) are read and named
        // here, where every load passes.
        self.ebpf.warn_deprecated();
        self.ebpf.validate()?;
        self.ship.validate().map_err(anyhow::Error::msg)?;
        Ok(())
    }

    fn check_files(&self) -> anyhow::Result<()> {
        self.http.check_files()?;
        crate::scrape::check_files(&self.scrape_configs)
            .context("checking the files the scrape-configs name")?;
        self.ship
            .check_files()
            .context("checking the files the ship section names")
    }
}

impl Config {
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

impl<'a> TryFrom<&'a Config> for crate::ebpf::SourceConfig<'a> {
    type Error = anyhow::Error;

    /// What the eBPF source reads of the file, with the hostname resolved ([`Config::hostname`]).
    fn try_from(config: &'a Config) -> anyhow::Result<Self> {
        Ok(crate::ebpf::SourceConfig {
            ebpf: &config.ebpf,
            symbolize: &config.symbolize,
            hostname: config.hostname()?,
            window_length: config.window.length,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_frames_out_of_range_is_refused_by_check_config() {
        for (text, ok) in [
            ("ebpf:\n  max-frames: 0\n", false),
            ("ebpf:\n  max-frames: 1000\n", false),
            ("ebpf:\n  frequency: 0\n", false),
            ("ebpf:\n  max-frames: 256\n", true),
        ] {
            let parsed = smolder_daemon::parse::<Config>(text);
            assert_eq!(parsed.is_ok(), ok, "{text}");
            if let Err(err) = parsed {
                assert!(format!("{err:#}").contains("ebpf."), "{err:#}");
            }
        }
    }

    #[test]
    fn one_aggregator_and_a_list_of_them_is_refused_naming_both_keys() {
        let err = smolder_daemon::parse::<Config>(
            "ship:\n  aggregator: a.example:4041\n  aggregators: [b.example:4041]\n",
        )
        .unwrap_err();
        let err = format!("{err:#}");
        assert!(
            err.contains("ship.aggregator (a.example:4041) and ship.aggregators"),
            "{err}"
        );
        let config = smolder_daemon::parse::<Config>(
            "ship:\n  aggregators: [b.example:4041, c.example:4041]\n",
        )
        .unwrap();
        assert_eq!(
            config.ship.addresses(),
            ["b.example:4041", "c.example:4041"]
        );
    }

    #[test]
    fn check_config_refuses_missing_tls_files() {
        let config: Config =
            smolder_daemon::parse("ship:\n  ca: /nonexistent/ca.pem\n  token: t\n").unwrap();
        let err = format!("{:#}", config.check_files().unwrap_err());
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
        for (yaml, file) in [
            (
                "http:\n  cert: /nonexistent/http.pem\n  key: /nonexistent/http.key\n",
                "/nonexistent/http.pem",
            ),
            (
                "scrape-configs:\n- job-name: j\n  tls-config: {ca-file: /nonexistent/job-ca.pem}\n",
                "/nonexistent/job-ca.pem",
            ),
            (
                "scrape-configs:\n- job-name: j\n  http-sd-configs:\n  - url: https://sd.example\n    \
                 tls-config: {cert-file: /nonexistent/sd.pem, key-file: /nonexistent/sd.key}\n",
                "/nonexistent/sd.pem",
            ),
        ] {
            let config: Config = smolder_daemon::parse(yaml).unwrap();
            let err = format!("{:#}", config.check_files().unwrap_err());
            assert!(err.contains(file), "{yaml}: {err}");
        }
    }

    #[test]
    fn defaults_print_every_section_and_read_back() {
        let yaml = smolder_daemon::default_yaml::<Config>();
        assert!(yaml.contains("\nscrape-configs: []\n"), "{yaml}");
        let parsed: Config = smolder_daemon::parse(&yaml).unwrap();
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn deprecated_ebpf_keys_are_still_read_and_named() {
        let config: Config =
            smolder_daemon::parse("ebpf:\n  counts-map-entries: 100\n  stack-map-entries: 200\n")
                .unwrap();
        assert_eq!(
            config.ebpf.deprecated_keys(),
            ["ebpf.counts-map-entries", "ebpf.stack-map-entries"]
        );
        assert!(Config::default().ebpf.deprecated_keys().is_empty());
        let yaml = smolder_daemon::default_yaml::<Config>();
        assert!(!yaml.contains("counts-map-entries") && yaml.contains("max-frames: 128"));
    }

    #[test]
    fn renamed_keys_read_as_their_new_name() {
        for renamed in Config::RENAMED {
            let [section] = renamed.section else {
                panic!("a top-level section")
            };
            let old: Config =
                smolder_daemon::parse(&format!("{section}:\n  {}: 7\n", renamed.old)).unwrap();
            let new: Config =
                smolder_daemon::parse(&format!("{section}:\n  {}: 7\n", renamed.new)).unwrap();
            assert_eq!(old, new, "{renamed:?}");
            assert_ne!(new, Config::default(), "{renamed:?}");
        }
    }
}
