//! The aggregator's configuration file: one section per stage, every field with its default.
//!
//! Runtime details (data directory, log level and format) are command-line flags; the file holds
//! the shape of the pipeline. `smolder-aggregator print-default-config` prints this file's
//! defaults as YAML, so the documentation cannot drift from the code.

use std::collections::BTreeMap;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use smolder_daemon::{DaemonConfig, RenamedKey};

pub use crate::admission::AdmissionConfig;
pub use crate::auth::{AuthConfig, CredentialSpec, Scope, Secret};
pub use crate::http::HttpConfig;
pub use crate::ingest::IngestConfig;
pub use crate::query::QueryConfig;
pub use crate::rules::RulesConfig;
pub use crate::store::{Compactor, LocalConfig, ObjectStoreConfig, S3Config, StoreConfig};
use crate::tenant::Tenant;
pub use crate::tenant::{TenantConfig, TenantLimits};
pub use smolder_common::rules::RuleSpec;

/// The whole configuration file.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct Config {
    /// The HTTP listener: API, UI and `/metrics`.
    pub http: HttpConfig,
    /// Credentials of the HTTP API and of agents, and what needs none.
    pub auth: AuthConfig,
    /// How much work is taken on at once: the in-flight budget, tenants' ingest rates.
    pub admission: AdmissionConfig,
    /// Where profiles are kept and for how long.
    pub store: StoreConfig,
    /// Multitenancy: whether requests name their tenant (`X-Scope-OrgID`).
    pub tenant: TenantConfig,
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

impl DaemonConfig for Config {
    const RENAMED: &'static [RenamedKey] = &[RenamedKey {
        section: &["ingest", "quic"],
        old: "max-concurrent-streams",
        new: "max-batches-in-flight",
    }];

    fn validate(&self) -> anyhow::Result<()> {
        crate::rules::check_config(&self.metrics_export_rules, &self.rules)?;
        self.check_tenants()?;
        self.store.check()?;
        self.auth.check(
            &self.ingest.quic.token_tenants()?,
            self.tenant.multitenancy_enabled,
            false,
        )?;
        self.admission.check(
            (self.ingest.max_body_bytes as u64)
                .saturating_add(self.ingest.max_decompressed_bytes as u64),
            2 * u64::from(self.ingest.quic.max_batch_bytes),
        )
    }

    fn check_files(&self) -> anyhow::Result<()> {
        self.http.check_files()?;
        self.ingest.quic.check_files()?;
        self.auth
            .check(
                &self.ingest.quic.token_tenants()?,
                self.tenant.multitenancy_enabled,
                true,
            )
            .context("checking auth.credential-files")
    }
}

impl Config {
    /// Checks the agents' tokens and that they name tenants only with multitenancy: a token's
    /// tenant would otherwise be silently ignored and its data mixed with everyone's.
    ///
    /// # Errors
    ///
    /// An invalid or repeated token, `ingest.quic.tenant-tokens` without
    /// `tenant.multitenancy-enabled`, or an invalid `tenant.limits`.
    pub(crate) fn check_tenants(&self) -> anyhow::Result<()> {
        self.tenant.limits()?;
        let tokens = self.ingest.quic.token_tenants()?;
        let anonymous = Tenant::anonymous();
        if !self.tenant.multitenancy_enabled
            && let Some((_, tenant)) = tokens.iter().find(|(_, tenant)| *tenant != anonymous)
        {
            anyhow::bail!(
                "ingest.quic.tenant-tokens names tenant {tenant:?}, but tenant.multitenancy-enabled is false; enable it, or move the tokens to ingest.quic.tokens"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_limits_name_valid_tenants_that_requests_can_be() {
        let check = |yaml: &str| {
            smolder_daemon::parse::<Config>(yaml)
                .map(|_| ())
                .map_err(|err| format!("{err:#}"))
        };
        let limits = "  limits:\n    team-a:\n      max-active-series: 5\n";
        assert!(check(&format!("tenant:\n  multitenancy-enabled: true\n{limits}")).is_ok());
        let err = check(&format!("tenant:\n{limits}")).unwrap_err();
        assert!(err.contains("multitenancy-enabled is false"), "{err}");
        assert!(check("tenant:\n  limits:\n    anonymous:\n      max-active-series: 5\n").is_ok());
        let err = check("tenant:\n  multitenancy-enabled: true\n  limits:\n    \"a/b\": {}\n")
            .unwrap_err();
        assert!(err.contains("tenant.limits: key \"a/b\""), "{err}");
    }

    #[test]
    fn check_config_refuses_missing_tls_files_and_a_rule_given_twice() {
        let config: Config = smolder_daemon::parse(
            "ingest:\n  quic:\n    cert: /nonexistent/cert.pem\n    key: /nonexistent/key.pem\n",
        )
        .unwrap();
        let err = format!("{:#}", config.check_files().unwrap_err());
        assert!(err.contains("/nonexistent/cert.pem"), "{err}");
        assert!(Config::default().check_files().is_ok());
        let err = smolder_daemon::parse::<Config>(
            "metrics-export-rules:\n  a_total:\n    expr: x.cpu\n  a_total:\n    expr: y.cpu\n",
        )
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("duplicate entry with key \"a_total\""),
            "{err:#}"
        );
    }

    #[test]
    fn renamed_keys_read_as_their_new_name() {
        for renamed in Config::RENAMED {
            let yaml = |key: &str| {
                let mut text = String::new();
                for (depth, section) in renamed.section.iter().enumerate() {
                    text.push_str(&format!("{:1$}{section}:\n", "", depth * 2));
                }
                text + &format!("{:1$}{key}: 7\n", "", renamed.section.len() * 2)
            };
            let old: Config = smolder_daemon::parse(&yaml(renamed.old)).unwrap();
            let new: Config = smolder_daemon::parse(&yaml(renamed.new)).unwrap();
            assert_eq!(old, new, "{renamed:?}");
            assert_ne!(new, Config::default(), "{renamed:?}");
        }
    }

    #[test]
    fn defaults_read_back() {
        let yaml = smolder_daemon::default_yaml::<Config>();
        let parsed: Config = smolder_daemon::parse(&yaml).unwrap();
        assert_eq!(parsed, Config::default());
    }
}
