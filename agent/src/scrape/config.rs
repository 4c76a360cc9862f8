//! `scrape-configs`: one [`ScrapeConfig`] per job, in Pyroscope's format.
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
use smolder_common::pprof::{SampleTypeConfig, SampleTypes};
use smolder_common::profile::Aggregation;

use crate::relabel::{RelabelConfig, Relabeler};

use super::ScrapeConfigError;

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

/// HTTP basic authentication.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct BasicAuth {
    /// The user name.
    pub username: String,
    /// The password.
    #[serde(default)]
    pub password: Option<String>,
    /// A file holding the password, read at every request.
    #[serde(default, alias = "password_file")]
    pub password_file: Option<PathBuf>,
}

/// An `Authorization: <type> <credentials>` header.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Authorization {
    /// The scheme. Default `Bearer`.
    #[serde(default = "default_auth_type", rename = "type")]
    pub kind: String,
    /// The credentials.
    #[serde(default)]
    pub credentials: Option<String>,
    /// A file holding the credentials, read at every request.
    #[serde(default, alias = "credentials_file")]
    pub credentials_file: Option<PathBuf>,
}

/// TLS settings for `https` targets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct TlsConfig {
    /// PEM file of the CAs that sign the targets' certificates, instead of the system's.
    #[serde(alias = "ca_file", skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain), for targets that require one.
    #[serde(alias = "cert_file", skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the client certificate.
    #[serde(alias = "key_file", skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// Accept any certificate, for targets with self-signed ones. Default false.
    #[serde(alias = "insecure_skip_verify")]
    pub insecure_skip_verify: bool,
}

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
fn default_auth_type() -> String {
    "Bearer".to_owned()
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
            check_auth(
                &http_sd.basic_auth,
                &http_sd.authorization,
                &http_sd.bearer_token,
                &http_sd.bearer_token_file,
                &http_sd.tls_config,
            )
            .map_err(|reason| invalid("http-sd-configs", reason))?;
        }
        check_auth(
            &self.basic_auth,
            &self.authorization,
            &self.bearer_token,
            &self.bearer_token_file,
            &self.tls_config,
        )
        .map_err(|reason| invalid("authorization", reason))
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

fn check_auth(
    basic: &Option<BasicAuth>,
    authorization: &Option<Authorization>,
    bearer: &Option<String>,
    bearer_file: &Option<PathBuf>,
    tls: &TlsConfig,
) -> Result<(), String> {
    let set = [
        basic.is_some(),
        authorization.is_some(),
        bearer.is_some() || bearer_file.is_some(),
    ];
    if set.iter().filter(|s| **s).count() > 1 {
        return Err(
            "at most one of basic-auth, authorization and bearer-token(-file) may be set"
                .to_owned(),
        );
    }
    if bearer.is_some() && bearer_file.is_some() {
        return Err("at most one of bearer-token and bearer-token-file may be set".to_owned());
    }
    if let Some(basic) = basic
        && basic.password.is_some()
        && basic.password_file.is_some()
    {
        return Err("basic-auth: at most one of password and password-file".to_owned());
    }
    if let Some(auth) = authorization {
        if auth.credentials.is_some() && auth.credentials_file.is_some() {
            return Err(
                "authorization: at most one of credentials and credentials-file".to_owned(),
            );
        }
        if auth.kind.eq_ignore_ascii_case("basic") {
            return Err("authorization: type basic is written as basic-auth".to_owned());
        }
    }
    if tls.cert_file.is_some() != tls.key_file.is_some() {
        return Err("tls-config: cert-file and key-file go together".to_owned());
    }
    Ok(())
}

/// Durations as Go and Prometheus write them: a sequence of `<integer><unit>` with units `ms`,
/// `s`, `m`, `h`, `d` and `w`, such as `10s`, `1m30s` or `500ms`.
pub mod go_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    /// Writes whole seconds as the largest whole unit (`5m`, `15s`), else milliseconds.
    pub fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(*value))
    }

    /// Reads a duration; see the [module docs](self).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        parse(&text).map_err(D::Error::custom)
    }

    /// Writes `value` the way [`parse`] reads it.
    pub fn format(value: Duration) -> String {
        let ms = value.as_millis();
        if !ms.is_multiple_of(1000) || ms == 0 {
            return format!("{ms}ms");
        }
        let secs = ms / 1000;
        [(604_800, "w"), (86_400, "d"), (3_600, "h"), (60, "m")]
            .iter()
            .find(|(unit, _)| secs.is_multiple_of(*unit))
            .map_or_else(
                || format!("{secs}s"),
                |(unit, name)| format!("{}{name}", secs / unit),
            )
    }

    /// Parses a duration such as `1m30s`.
    ///
    /// # Errors
    ///
    /// A message naming what is wrong with `text`.
    pub fn parse(text: &str) -> Result<Duration, String> {
        let mut rest = text.trim();
        if rest.is_empty() {
            return Err("empty duration".to_owned());
        }
        let mut total = Duration::ZERO;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if digits == 0 {
                return Err(format!("invalid duration {text:?}: expected a number"));
            }
            let number: u64 = rest[..digits]
                .parse()
                .map_err(|_| format!("invalid duration {text:?}: number out of range"))?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let millis_per = match &rest[..unit_len] {
                "ms" => 1,
                "s" => 1_000,
                "m" => 60_000,
                "h" => 3_600_000,
                "d" => 86_400_000,
                "w" => 604_800_000,
                "" => return Err(format!("invalid duration {text:?}: missing unit")),
                unit => {
                    return Err(format!(
                        "invalid duration {text:?}: unknown unit {unit:?} (ms, s, m, h, d, w)"
                    ));
                }
            };
            let part = number
                .checked_mul(millis_per)
                .ok_or_else(|| format!("invalid duration {text:?}: out of range"))?;
            total = total
                .checked_add(Duration::from_millis(part))
                .ok_or_else(|| format!("invalid duration {text:?}: out of range"))?;
            rest = &rest[unit_len..];
        }
        Ok(total)
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

    #[test]
    fn durations_read_and_write_like_go() {
        for (text, ms) in [
            ("10s", 10_000),
            ("1m30s", 90_000),
            ("500ms", 500),
            ("1h", 3_600_000),
        ] {
            assert_eq!(go_duration::parse(text), Ok(Duration::from_millis(ms)));
        }
        for bad in ["", "10", "s", "1.5s", "10x"] {
            assert!(go_duration::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(go_duration::format(Duration::from_secs(300)), "5m");
        assert_eq!(go_duration::format(Duration::from_secs(15)), "15s");
        assert_eq!(go_duration::format(Duration::from_millis(1500)), "1500ms");
    }
}
