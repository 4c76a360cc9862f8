//! Targets: discovered label sets → relabelled, validated (target, profile) pairs to scrape.
//!
//! Input: the [`TargetGroup`]s of every discovery source of a job. Output: [`Targets`], the
//! [`Target`]s to scrape and the label sets that were dropped, each with why. Caller: the job's
//! pool ([`super::pool`]), on every discovery update. Pure: no I/O, no clock.
//!
//! A discovered target starts as its group's labels plus `__address__`, `__name__` (the
//! group's `application`) and `__spy_name__`. As in Pyroscope, `job`, `__scheme__`,
//! `__scrape_interval__` and `__scrape_timeout__` are set when absent, then `relabel-configs`
//! run. A target that survives needs `__address__` (a missing port becomes 80 or 443) and
//! `__name__`; `instance` defaults to the address and `__meta_*` labels go. Then each enabled
//! profile makes one [`Target`]:
//!
//! - `__profile_<name>_enabled` (`true`/`false`) overrides `enabled-profiles`;
//! - `__profile_<name>_path` overrides the profile's path;
//! - `__profile_<name>_param_<key>` sets query parameter `<key>` (Pyroscope keeps the `_`
//!   before `<key>` in the parameter name, a bug not copied here).
//!
//! The series labels are the labels not starting with `__`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use smolder_common::Labels;
use smolder_common::pprof::SampleTypes;

use super::config::{ScrapeConfig, TargetGroup};
use super::go_duration;
use super::profiles::{ProfileEndpoint, duration_seconds};
use crate::relabel::{LabelSet, Relabeler};

/// `host:port` to scrape.
pub const ADDRESS: &str = "__address__";
/// The application name.
pub const NAME: &str = "__name__";
/// `http` or `https`.
pub const SCHEME: &str = "__scheme__";
/// The profiler name stored with the profiles.
pub const SPY_NAME: &str = "__spy_name__";
/// A per-target scrape interval.
pub const INTERVAL: &str = "__scrape_interval__";
/// A per-target scrape timeout.
pub const TIMEOUT: &str = "__scrape_timeout__";
/// Labels that discovery mechanisms add and relabelling may read; removed afterwards.
pub const META_PREFIX: &str = "__meta_";

/// The spy name of targets that do not set one, as in Pyroscope.
const DEFAULT_SPY: &str = "scrape";

/// One profile of one target: what a scrape loop fetches.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// The job's name.
    pub job: String,
    /// The profile's name (`cpu`, `mem`, ...).
    pub profile: String,
    /// The full URL, query included.
    pub url: reqwest::Url,
    /// The application name; series are `<app>.<sample type suffix>`.
    pub app: String,
    /// The profiler name stored with the profiles.
    pub spy_name: String,
    /// The series labels: `job`, `instance` and the other labels not starting with `__`.
    pub labels: Labels,
    /// The labels as discovered, before relabelling.
    pub discovered: LabelSet,
    /// How often to scrape.
    pub interval: Duration,
    /// How long one scrape may take.
    pub timeout: Duration,
    /// For duration profiles, how long the target profiles for (the `seconds` parameter).
    pub seconds: Option<u64>,
    /// The profile's sample-type table.
    pub sample_types: SampleTypes,
    /// Whether types missing from the table are converted too.
    pub all_sample_types: bool,
}

impl Target {
    /// What identifies the target across discovery updates: its job, profile, URL and labels.
    /// A target whose key is unchanged keeps its scrape loop (and its delta state).
    pub fn key(&self) -> String {
        let mut key = format!("{}/{}/{}/{}", self.job, self.profile, self.url, self.app);
        let _ = write!(key, "{}", self.labels);
        let _ = write!(key, "/{:?}/{:?}", self.interval, self.timeout);
        key
    }
}

/// A discovered label set that is not scraped, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// The labels as discovered.
    pub discovered: LabelSet,
    /// Why: `dropped by relabel-configs`, `no app name (__name__)`, ...
    pub reason: String,
}

/// The outcome of building a job's targets.
#[derive(Debug, Default)]
pub struct Targets {
    /// What to scrape.
    pub active: Vec<Target>,
    /// What was discovered but is not scraped.
    pub dropped: Vec<Dropped>,
}

/// A job's settings for turning label sets into targets.
pub struct Builder {
    job: String,
    scheme: String,
    interval: Duration,
    timeout: Duration,
    enabled: Vec<String>,
    profiles: BTreeMap<String, ProfileEndpoint>,
    relabeler: Relabeler,
}

impl Builder {
    /// The builder of `config`'s targets. `config` must have passed
    /// [`ScrapeConfig::validate`].
    ///
    /// # Errors
    ///
    /// What [`ScrapeConfig::validate`] reports.
    pub fn new(config: &ScrapeConfig) -> Result<Builder, super::ScrapeConfigError> {
        config.validate()?;
        let relabeler = Relabeler::new(&config.relabel_configs).map_err(|source| {
            super::ScrapeConfigError::Relabel {
                job: config.job_name.clone(),
                source,
            }
        })?;
        Ok(Builder {
            job: config.job_name.clone(),
            scheme: config.scheme.clone(),
            interval: config.scrape_interval,
            timeout: config.scrape_timeout,
            enabled: config.enabled_profiles.clone(),
            profiles: config.resolved_profiles()?,
            relabeler,
        })
    }

    /// The targets of `groups`, in order, with duplicates (same key) removed.
    pub fn build<'g>(&self, groups: impl IntoIterator<Item = &'g TargetGroup>) -> Targets {
        let mut out = Targets::default();
        let mut seen = std::collections::HashSet::new();
        for group in groups {
            for address in &group.targets {
                let mut labels: LabelSet = group.labels.clone();
                labels.insert(ADDRESS.to_owned(), address.clone());
                if !group.application.is_empty() {
                    labels.insert(NAME.to_owned(), group.application.clone());
                }
                if !group.spy_name.is_empty() {
                    labels.insert(SPY_NAME.to_owned(), group.spy_name.clone());
                }
                match self.targets_of(labels.clone()) {
                    Ok(targets) => {
                        for target in targets {
                            if seen.insert(target.key()) {
                                out.active.push(target);
                            }
                        }
                    }
                    Err(reason) => out.dropped.push(Dropped {
                        discovered: labels,
                        reason,
                    }),
                }
            }
        }
        out
    }

    /// The targets of one discovered label set, one per enabled profile.
    fn targets_of(&self, discovered: LabelSet) -> Result<Vec<Target>, String> {
        let mut labels = discovered.clone();
        let defaults = [
            ("job", self.job.clone()),
            (SCHEME, self.scheme.clone()),
            (INTERVAL, go_duration::format(self.interval)),
            (TIMEOUT, go_duration::format(self.timeout)),
        ];
        for (name, value) in defaults {
            labels.entry(name.to_owned()).or_insert(value);
        }
        if !self.relabeler.apply(&mut labels) {
            return Err("dropped by relabel-configs".to_owned());
        }
        let address = labels.get(ADDRESS).cloned().unwrap_or_default();
        if address.is_empty() {
            return Err("no address (__address__)".to_owned());
        }
        let app = labels.get(NAME).cloned().unwrap_or_default();
        if app.is_empty() {
            return Err(
                "no app name (__name__): set application in the target group or a relabel rule"
                    .to_owned(),
            );
        }
        let scheme = labels.get(SCHEME).cloned().unwrap_or_default();
        let address = with_port(&address, &scheme)?;
        labels.insert(ADDRESS.to_owned(), address.clone());
        let interval = duration_label(&labels, INTERVAL)?;
        let timeout = duration_label(&labels, TIMEOUT)?;
        labels.retain(|name, _| !name.starts_with(META_PREFIX));
        labels
            .entry("instance".to_owned())
            .or_insert_with(|| address.clone());
        let mut public = Labels::new();
        for (name, value) in labels.iter().filter(|(n, _)| !n.starts_with("__")) {
            public
                .insert(name.clone(), value.clone())
                .map_err(|err| format!("label {name:?}: {err}"))?;
        }
        let spy_name = labels
            .get(SPY_NAME)
            .filter(|s| !s.is_empty())
            .map_or(DEFAULT_SPY, String::as_str)
            .to_owned();

        let mut targets = Vec::new();
        for (name, profile) in &self.profiles {
            let switch = labels.get(&format!("__profile_{name}_enabled"));
            let enabled = match switch.map(String::as_str) {
                Some("true") => true,
                Some("false") => false,
                Some(other) => {
                    return Err(format!(
                        "__profile_{name}_enabled is {other:?}, expected true or false"
                    ));
                }
                None => self.enabled.contains(name),
            };
            if !enabled {
                continue;
            }
            let path = labels
                .get(&format!("__profile_{name}_path"))
                .filter(|p| !p.is_empty())
                .unwrap_or(&profile.path);
            let mut params = profile.params.clone();
            let param_prefix = format!("__profile_{name}_param_");
            for (label, value) in &labels {
                if let Some(key) = label.strip_prefix(&param_prefix)
                    && !key.is_empty()
                {
                    params.insert(key.to_owned(), vec![value.clone()]);
                }
            }
            let resolved = ProfileEndpoint {
                path: path.clone(),
                params,
                sample_types: profile.sample_types.clone(),
                all_sample_types: profile.all_sample_types,
            };
            let seconds = duration_seconds(&resolved, interval);
            let mut params = resolved.params;
            if let Some(seconds) = seconds {
                params.insert("seconds".to_owned(), vec![seconds.to_string()]);
                if Duration::from_secs(seconds) >= timeout {
                    return Err(format!(
                        "scrape timeout {} leaves no room for profile {name}, which takes {seconds}s",
                        go_duration::format(timeout)
                    ));
                }
            }
            let mut url = reqwest::Url::parse(&format!("{scheme}://{address}"))
                .map_err(|err| format!("address {address:?}: {err}"))?;
            url.set_path(&resolved.path);
            if !params.is_empty() {
                let mut query = url.query_pairs_mut();
                for (key, values) in &params {
                    for value in values {
                        query.append_pair(key, value);
                    }
                }
            }
            targets.push(Target {
                job: self.job.clone(),
                profile: name.clone(),
                url,
                app: app.clone(),
                spy_name: spy_name.clone(),
                labels: public.clone(),
                discovered: discovered.clone(),
                interval,
                timeout,
                seconds,
                sample_types: resolved.sample_types,
                all_sample_types: resolved.all_sample_types,
            });
        }
        if targets.is_empty() {
            return Err("no profile enabled".to_owned());
        }
        Ok(targets)
    }
}

/// `address` with the scheme's default port when it has none.
fn with_port(address: &str, scheme: &str) -> Result<String, String> {
    if address.contains('/') {
        return Err(format!("address {address:?} is not host:port"));
    }
    let default_port = match scheme {
        "http" | "" => 80,
        "https" => 443,
        other => return Err(format!("scheme {other:?} is neither http nor https")),
    };
    let has_port = if let Some(rest) = address.strip_prefix('[') {
        // An IPv6 literal: a port follows the closing bracket.
        rest.split_once(']')
            .is_some_and(|(_, after)| after.starts_with(':'))
    } else {
        address.contains(':')
    };
    if has_port {
        Ok(address.to_owned())
    } else {
        Ok(format!("{address}:{default_port}"))
    }
}

fn duration_label(labels: &LabelSet, name: &str) -> Result<Duration, String> {
    let text = labels.get(name).map_or("", String::as_str);
    let value = go_duration::parse(text).map_err(|err| format!("{name}: {err}"))?;
    if value.is_zero() {
        return Err(format!("{name} must be positive"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builder(yaml: &str) -> Builder {
        Builder::new(&serde_norway::from_str(yaml).unwrap()).unwrap()
    }

    fn group(app: &str, targets: &[&str], labels: &[(&str, &str)]) -> TargetGroup {
        TargetGroup {
            application: app.to_owned(),
            spy_name: String::new(),
            targets: targets.iter().map(|t| (*t).to_owned()).collect(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn each_enabled_profile_is_a_target_with_pyroscope_labels() {
        let b = builder("job-name: j\nenabled-profiles: [cpu, mem]\n");
        let out = b.build(&[group("app", &["h:6060", "g"], &[("env", "dev")])]);
        assert!(out.dropped.is_empty(), "{:?}", out.dropped);
        assert_eq!(out.active.len(), 4);
        let cpu = &out.active[0];
        assert_eq!(cpu.profile, "cpu");
        assert_eq!(
            cpu.url.as_str(),
            "http://h:6060/debug/pprof/profile?seconds=10"
        );
        assert_eq!(cpu.labels.to_string(), "{env=dev,instance=h:6060,job=j}");
        assert_eq!(cpu.spy_name, "scrape");
        assert_eq!(cpu.seconds, Some(10));
        let mem = &out.active[3];
        // The URL leaves the default port implicit; the instance label spells it out.
        assert_eq!(mem.url.as_str(), "http://g/debug/pprof/heap");
        assert_eq!(mem.labels.get("instance"), Some("g:80"));
        assert_eq!(mem.seconds, None);
    }

    #[test]
    fn profile_labels_switch_paths_and_params() {
        let b = builder(
            "job-name: j\nenabled-profiles: [cpu]\nscrape-interval: 20s\nscrape-timeout: 30s\n",
        );
        let out = b.build(&[group(
            "app",
            &["h:1"],
            &[
                ("__profile_cpu_param_seconds", "5"),
                ("__profile_cpu_param_debug", "1"),
                ("__profile_goroutines_enabled", "true"),
                ("__profile_goroutines_path", "/custom/goroutine"),
            ],
        )]);
        assert_eq!(out.active.len(), 2, "{:?}", out.dropped);
        assert_eq!(
            out.active[0].url.as_str(),
            "http://h:1/debug/pprof/profile?debug=1&seconds=5"
        );
        assert_eq!(out.active[1].url.as_str(), "http://h:1/custom/goroutine");
        let off = b.build(&[group(
            "app",
            &["h:1"],
            &[("__profile_cpu_enabled", "false")],
        )]);
        assert!(off.active.is_empty());
        assert_eq!(off.dropped[0].reason, "no profile enabled");
    }

    #[test]
    fn relabelling_sees_discovery_labels_and_can_drop() {
        let b = builder(
            "job-name: j\nenabled-profiles: [mem]\nrelabel-configs:\n\
             - {source_labels: [__meta_team], target_label: team}\n\
             - {source_labels: [env], regex: staging, action: drop}\n\
             - {source_labels: [__meta_app], target_label: __name__}\n",
        );
        let out = b.build(&[
            group(
                "",
                &["a:1"],
                &[("__meta_team", "core"), ("__meta_app", "api")],
            ),
            group("x", &["b:1"], &[("env", "staging")]),
            group("", &["c:1"], &[]),
        ]);
        assert_eq!(out.active.len(), 1);
        assert_eq!(out.active[0].app, "api");
        assert_eq!(
            out.active[0].labels.to_string(),
            "{instance=a:1,job=j,team=core}"
        );
        assert_eq!(out.dropped[0].reason, "dropped by relabel-configs");
        assert!(out.dropped[1].reason.starts_with("no app name"));
    }

    #[test]
    fn duration_profiles_are_capped_at_the_interval_and_need_time() {
        let b = builder("job-name: j\nenabled-profiles: [cpu]\n");
        let out = b.build(&[group(
            "a",
            &["h:1"],
            &[("__scrape_interval__", "5s"), ("__scrape_timeout__", "4s")],
        )]);
        assert!(
            out.dropped[0].reason.contains("leaves no room"),
            "{:?}",
            out.dropped
        );
        let out = b.build(&[group("a", &["h:1"], &[("__scrape_interval__", "5s")])]);
        assert_eq!(out.active[0].seconds, Some(5));
        assert_eq!(out.active[0].interval, Duration::from_secs(5));
    }

    #[test]
    fn addresses_get_default_ports() {
        assert_eq!(with_port("h", "https").unwrap(), "h:443");
        assert_eq!(with_port("[::1]", "http").unwrap(), "[::1]:80");
        assert_eq!(with_port("[::1]:9", "http").unwrap(), "[::1]:9");
        assert!(with_port("h/x", "http").is_err());
        assert!(with_port("h", "ftp").is_err());
    }
}
