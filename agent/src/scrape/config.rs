//! `scrape-configs`: one [`ScrapeConfig`] per job, in Pyroscope's format: its targets
//! (static groups, file and HTTP discovery), its schedule and limits; its profiles are in
//! `profiles.rs`, the HTTP client keys it shares with HTTP discovery in `http_client.rs`.
//!
//! Pyroscope's server config (`v0.37:pkg/scrape/config`) writes its own keys in kebab-case
//! (`job-name`, `enabled-profiles`, `static-configs`) and the HTTP client keys it copied from
//! Prometheus in snake_case (`basic_auth`, `tls_config`). Both spellings are read for every key,
//! so a section pasted from either keeps working; unknown keys are an error.
//!
//! [`ScrapeConfig::validate`] checks everything that can be checked before a target exists:
//! durations, the scheme, relabel rules, that every enabled profile is defined, and that the
//! auth settings do not contradict each other. The agent runs it when the config loads, so
//! `smolder-agent check-config` catches these mistakes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::relabel::{RelabelConfig, Relabeler};

use super::ScrapeConfigError;
use super::discovery::MAX_DOCUMENT_BYTES;
use super::fetch::ClientSettings;
use super::go_duration;
use super::http_client::{self, Authorization, BasicAuth, TlsConfig};
use super::profiles::{ProfileConfig, duration_seconds};

/// One scrape job: which targets, which profiles, how often and how.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ScrapeConfig {
    /// The `job` label of every target of this job. Required, unique across jobs.
    #[serde(alias = "job_name")]
    pub job_name: String,
    /// The profiles scraped from every target, by name: `cpu`, `mem`, `goroutines`, `mutex`,
    /// `block`, `pyroscope_mem`, `pyroscope_mutex`, `pyroscope_block` or a name defined under
    /// `profiles`. A target's `__profile_<name>_enabled` label overrides it. Default
    /// `[cpu, mem]`.
    #[serde(default = "default_enabled_profiles", alias = "enabled_profiles")]
    pub enabled_profiles: Vec<String>,
    /// How often each target is scraped; targets are spread over it. Default `10s`.
    #[serde(
        default = "default_interval",
        with = "go_duration",
        alias = "scrape_interval"
    )]
    pub scrape_interval: Duration,
    /// How long one scrape may take, connection to last byte. It must exceed the `seconds` of
    /// duration profiles such as `cpu`. Default `15s`, as in Pyroscope.
    #[serde(
        default = "default_timeout",
        with = "go_duration",
        alias = "scrape_timeout"
    )]
    pub scrape_timeout: Duration,
    /// `http` or `https`; a target's `__scheme__` label overrides it. Default `http`.
    #[serde(default = "default_scheme")]
    pub scheme: String,
    /// The largest response body read, as sent (possibly gzipped), in bytes. Default 16 MiB.
    #[serde(default = "default_body_limit", alias = "body_size_limit")]
    pub body_size_limit: u64,
    /// The largest profile accepted once gunzipped, in bytes; this is what bounds a gzip bomb.
    /// Default 64 MiB.
    #[serde(
        default = "default_decompressed_limit",
        alias = "decompressed_size_limit"
    )]
    pub decompressed_size_limit: u64,
    /// Scrape the godeltaprof endpoints (`/debug/pprof/delta_heap`, `delta_mutex`,
    /// `delta_block`) for `mem`, `mutex` and `block`; they already serve deltas, so nothing is
    /// subtracted. Default false.
    #[serde(default, alias = "use_delta_profiles")]
    pub use_delta_profiles: bool,
    /// Prometheus relabelling applied to each discovered target before it is scraped.
    #[serde(default, alias = "relabel_configs")]
    pub relabel_configs: Vec<RelabelConfig>,
    /// Targets written in the config.
    #[serde(default, alias = "static_configs")]
    pub static_configs: Vec<TargetGroup>,
    /// Targets read from JSON or YAML files, reread when they change.
    #[serde(default, alias = "file_sd_configs")]
    pub file_sd_configs: Vec<FileSdConfig>,
    /// Targets fetched from HTTP endpoints, refreshed on an interval.
    #[serde(default, alias = "http_sd_configs")]
    pub http_sd_configs: Vec<HttpSdConfig>,
    /// Profile definitions: overrides of the built-in ones (by name) and custom profiles.
    #[serde(default)]
    pub profiles: BTreeMap<String, ProfileConfig>,
    /// HTTP basic authentication for every target.
    #[serde(default, alias = "basic_auth")]
    pub basic_auth: Option<BasicAuth>,
    /// An `Authorization` header for every target (type `Bearer` unless set).
    #[serde(default)]
    pub authorization: Option<Authorization>,
    /// A bearer token (Prometheus' older spelling of `authorization`).
    #[serde(default, alias = "bearer_token")]
    pub bearer_token: Option<String>,
    /// A file holding the bearer token, read at every scrape so that rotation needs no restart.
    #[serde(default, alias = "bearer_token_file")]
    pub bearer_token_file: Option<PathBuf>,
    /// TLS settings for `https` targets.
    #[serde(default, alias = "tls_config")]
    pub tls_config: TlsConfig,
    /// Whether 3xx responses are followed (at most 10 hops). Default true.
    #[serde(default = "yes", alias = "follow_redirects")]
    pub follow_redirects: bool,
}

/// A group of targets sharing labels, as in a static config or a discovery document.
///
/// Prometheus' `{targets, labels}` and Pyroscope's `application` and `spy-name` are read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TargetGroup {
    /// The application name (the `__name__` label) of every target in the group.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub application: String,
    /// The profiler name stored with the profiles (the `__spy_name__` label). Default `scrape`.
    #[serde(
        rename = "spy-name",
        alias = "spy_name",
        skip_serializing_if = "String::is_empty"
    )]
    pub spy_name: String,
    /// `host:port` addresses (the `__address__` label).
    pub targets: Vec<String>,
    /// Labels every target of the group gets.
    pub labels: BTreeMap<String, String>,
}

/// File-based discovery: JSON (`.json`) or YAML (`.yml`, `.yaml`) lists of target groups.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileSdConfig {
    /// Paths; the last component may hold `*` and `?` wildcards, as in `targets/*.json`.
    pub files: Vec<String>,
    /// Every file is reread at least this often even when it looks unchanged. Changes are
    /// noticed within a second either way. Default `5m`.
    #[serde(
        default = "default_file_refresh",
        with = "go_duration",
        alias = "refresh_interval"
    )]
    pub refresh_interval: Duration,
}

/// HTTP-based discovery: a URL answering a JSON list of target groups, as Prometheus defines it.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct HttpSdConfig {
    /// The `http` or `https` URL to fetch.
    pub url: String,
    /// How often it is fetched; also the timeout of one fetch. Default `1m`.
    #[serde(
        default = "default_http_refresh",
        with = "go_duration",
        alias = "refresh_interval"
    )]
    pub refresh_interval: Duration,
    /// HTTP basic authentication.
    #[serde(default, alias = "basic_auth")]
    pub basic_auth: Option<BasicAuth>,
    /// An `Authorization` header.
    #[serde(default)]
    pub authorization: Option<Authorization>,
    /// A bearer token.
    #[serde(default, alias = "bearer_token")]
    pub bearer_token: Option<String>,
    /// A file holding the bearer token.
    #[serde(default, alias = "bearer_token_file")]
    pub bearer_token_file: Option<PathBuf>,
    /// TLS settings for an `https` URL.
    #[serde(default, alias = "tls_config")]
    pub tls_config: TlsConfig,
    /// Whether 3xx responses are followed. Default true.
    #[serde(default = "yes", alias = "follow_redirects")]
    pub follow_redirects: bool,
}

fn yes() -> bool {
    true
}
fn default_enabled_profiles() -> Vec<String> {
    vec!["cpu".to_owned(), "mem".to_owned()]
}
fn default_interval() -> Duration {
    Duration::from_secs(10)
}
fn default_timeout() -> Duration {
    Duration::from_secs(15)
}
fn default_scheme() -> String {
    "http".to_owned()
}
fn default_body_limit() -> u64 {
    16 << 20
}
fn default_decompressed_limit() -> u64 {
    64 << 20
}
fn default_file_refresh() -> Duration {
    Duration::from_secs(300)
}
fn default_http_refresh() -> Duration {
    Duration::from_secs(60)
}

impl ScrapeConfig {
    /// The settings of the client that scrapes this job's targets.
    pub fn client_settings(&self) -> ClientSettings<'_> {
        ClientSettings {
            basic_auth: &self.basic_auth,
            authorization: &self.authorization,
            bearer_token: &self.bearer_token,
            bearer_token_file: &self.bearer_token_file,
            tls: &self.tls_config,
            follow_redirects: self.follow_redirects,
            body_limit: self.body_size_limit,
        }
    }
}

impl HttpSdConfig {
    /// The settings of the client that fetches this discovery document.
    pub fn client_settings(&self) -> ClientSettings<'_> {
        ClientSettings {
            basic_auth: &self.basic_auth,
            authorization: &self.authorization,
            bearer_token: &self.bearer_token,
            bearer_token_file: &self.bearer_token_file,
            tls: &self.tls_config,
            follow_redirects: self.follow_redirects,
            body_limit: MAX_DOCUMENT_BYTES,
        }
    }
}

impl ScrapeConfig {
    /// Checks what can be checked before any target exists; see the [module docs](self).
    ///
    /// # Errors
    ///
    /// The first [`ScrapeConfigError`] found.
    pub fn validate(&self) -> Result<(), ScrapeConfigError> {
        let job = || self.job_name.clone();
        let invalid = |key: &'static str, reason: String| ScrapeConfigError::Invalid {
            job: job(),
            key,
            reason,
        };
        if self.job_name.is_empty() {
            return Err(invalid("job-name", "must not be empty".to_owned()));
        }
        if self.scrape_interval.is_zero() {
            return Err(invalid("scrape-interval", "must be positive".to_owned()));
        }
        if self.scrape_timeout.is_zero() {
            return Err(invalid("scrape-timeout", "must be positive".to_owned()));
        }
        if !matches!(self.scheme.as_str(), "http" | "https") {
            return Err(invalid(
                "scheme",
                format!("{:?} is neither http nor https", self.scheme),
            ));
        }
        if self.body_size_limit == 0 {
            return Err(invalid("body-size-limit", "must be positive".to_owned()));
        }
        if self.decompressed_size_limit == 0 {
            return Err(invalid(
                "decompressed-size-limit",
                "must be positive".to_owned(),
            ));
        }
        Relabeler::new(&self.relabel_configs)
            .map_err(|source| ScrapeConfigError::Relabel { job: job(), source })?;
        let profiles = self.resolved_profiles()?;
        for name in &self.enabled_profiles {
            let Some(profile) = profiles.get(name) else {
                return Err(invalid(
                    "enabled-profiles",
                    format!("{name:?} is neither a built-in profile nor defined under profiles"),
                ));
            };
            if let Some(seconds) = duration_seconds(profile, self.scrape_interval)
                && Duration::from_secs(seconds) >= self.scrape_timeout
            {
                return Err(invalid(
                    "scrape-timeout",
                    format!(
                        "{:?} does not leave room for profile {name:?}, which takes {seconds}s",
                        self.scrape_timeout
                    ),
                ));
            }
        }
        for group in &self.static_configs {
            for target in &group.targets {
                if target.contains('/') {
                    return Err(invalid(
                        "static-configs",
                        format!("target {target:?} is not host:port (no scheme, no path)"),
                    ));
                }
            }
        }
        for file_sd in &self.file_sd_configs {
            if file_sd.files.is_empty() {
                return Err(invalid(
                    "file-sd-configs",
                    "an entry must list at least one file".to_owned(),
                ));
            }
            for file in &file_sd.files {
                let lower = file.to_ascii_lowercase();
                if ![".json", ".yml", ".yaml"]
                    .iter()
                    .any(|e| lower.ends_with(e))
                {
                    return Err(invalid(
                        "file-sd-configs",
                        format!("{file:?} must end in .json, .yml or .yaml"),
                    ));
                }
                let dir = file.rsplit_once('/').map_or("", |(dir, _)| dir);
                if dir.contains(['*', '?']) {
                    return Err(invalid(
                        "file-sd-configs",
                        format!("{file:?}: wildcards are read in the file name only"),
                    ));
                }
            }
            if file_sd.refresh_interval.is_zero() {
                return Err(invalid(
                    "file-sd-configs",
                    "refresh-interval must be positive".to_owned(),
                ));
            }
        }
        for http_sd in &self.http_sd_configs {
            let url = reqwest::Url::parse(&http_sd.url).map_err(|err| {
                invalid("http-sd-configs", format!("url {:?}: {err}", http_sd.url))
            })?;
            if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                return Err(invalid(
                    "http-sd-configs",
                    format!(
                        "url {:?} must be http:// or https:// with a host",
                        http_sd.url
                    ),
                ));
            }
            if http_sd.refresh_interval.is_zero() {
                return Err(invalid(
                    "http-sd-configs",
                    "refresh-interval must be positive".to_owned(),
                ));
            }
            http_client::check(&http_sd.client_settings())
                .map_err(|reason| invalid("http-sd-configs", reason))?;
        }
        http_client::check(&self.client_settings())
            .map_err(|reason| invalid("authorization", reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> ScrapeConfig {
        serde_norway::from_str(yaml).unwrap()
    }

    #[test]
    fn pyroscope_example_parses_with_defaults() {
        let config = parse(
            "job-name: testing\nenabled-profiles: [cpu, mem, goroutines, mutex, block]\n\
             static-configs:\n  - application: hotrod\n    spy-name: gospy\n    \
             targets: [hotrod:6060]\n    labels: {env: dev}\n",
        );
        config.validate().unwrap();
        assert_eq!(config.scrape_interval, Duration::from_secs(10));
        assert_eq!(config.scrape_timeout, Duration::from_secs(15));
        assert_eq!(config.static_configs[0].spy_name, "gospy");
        let profiles = config.resolved_profiles().unwrap();
        assert_eq!(profiles["cpu"].params["seconds"], vec!["10".to_owned()]);
        assert!(
            profiles["mem"]
                .sample_types
                .get("alloc_space")
                .unwrap()
                .cumulative
        );
        let block = profiles["block"].sample_types.get("delay").unwrap();
        assert_eq!(block.display_name, "block_duration");
        assert!(block.cumulative);
    }

    #[test]
    fn snake_case_keys_from_prometheus_are_read() {
        let config = parse(
            "job_name: j\nscrape_interval: 1m\nscrape_timeout: 500ms\nenabled-profiles: [mem]\n\
             basic_auth: {username: u, password_file: /p}\ntls_config: {insecure_skip_verify: true}\n\
             file_sd_configs: [{files: [/t/*.json], refresh_interval: 30s}]\n",
        );
        config.validate().unwrap();
        assert_eq!(config.scrape_timeout, Duration::from_millis(500));
        assert!(config.tls_config.insecure_skip_verify);
        assert_eq!(
            config.file_sd_configs[0].refresh_interval,
            Duration::from_secs(30)
        );
    }

    #[test]
    fn mistakes_are_reported_with_the_job_and_key() {
        let cases = [
            (
                "job-name: j\nenabled-profiles: [heap]\n",
                "enabled-profiles",
            ),
            ("job-name: j\nscheme: ftp\n", "ftp"),
            ("job-name: j\nscrape-timeout: 5s\n", "scrape-timeout"),
            (
                "job-name: j\nstatic-configs: [{targets: [\"http://a:1/x\"]}]\n",
                "host:port",
            ),
            (
                "job-name: j\nbasic-auth: {username: u}\nbearer-token: t\n",
                "at most one",
            ),
            (
                "job-name: j\nprofiles: {x: {params: {a: b}}}\n",
                "needs a path",
            ),
            (
                "job-name: j\nrelabel-configs: [{action: hashmod, target_label: x}]\n",
                "relabel",
            ),
            (
                "job-name: j\nfile-sd-configs: [{files: [/a/*/t.json]}]\n",
                "file name only",
            ),
        ];
        for (yaml, expected) in cases {
            let err = parse(yaml).validate().unwrap_err().to_string();
            assert!(err.contains(expected), "{yaml}: {err}");
            assert!(err.contains("job \"j\""), "{err}");
        }
        let unknown = serde_norway::from_str::<ScrapeConfig>("job-name: j\nscrape-intervl: 1s\n");
        assert!(unknown.unwrap_err().to_string().contains("scrape-intervl"));
    }
}
