//! Prometheus-style relabelling of label sets: what is profiled or scraped, and how it is named.
//!
//! Input: a label set such as an eBPF process's `__meta_process_*` labels or a scrape target's
//! `__address__` and discovery labels, and the [`RelabelConfig`]s of the agent config. Output:
//! the rewritten label set, or `None` when a rule dropped it. Callers: the eBPF sampler's
//! process labeller and the pprof scraper's target builder.
//!
//! The semantics are Prometheus' `relabel_configs`: regexes are anchored at both ends, source
//! label values are joined with `separator` (a missing label is empty), `replacement` expands
//! `$1`, `${name}`; a replace whose result is empty deletes the target label. Keys are written
//! the Prometheus way (`source_labels`, `target_label`); the kebab-case spellings of the rest of
//! the agent config (`source-labels`, `target-label`) are accepted too. Actions: `replace`,
//! `keep`, `drop`, `keepequal`, `dropequal`, `labelmap`, `labeldrop`, `labelkeep`, `lowercase`,
//! `uppercase`. `hashmod` is not supported (it needs MD5 to agree with Prometheus' sharding and
//! the agent does not shard); it is rejected when the config loads.
//!
//! ```
//! use std::collections::BTreeMap;
//! use smolder_agent::relabel::{RelabelConfig, Relabeler};
//!
//! let rules: Vec<RelabelConfig> = serde_norway::from_str(r#"
//! - source_labels: [__meta_process_comm]
//!   regex: "sshd|systemd"
//!   action: drop
//! - source_labels: [__meta_process_systemd_unit]
//!   regex: "(.+)\\.service"
//!   target_label: service_name
//! "#)?;
//! let relabeler = Relabeler::new(&rules)?;
//! let mut labels = BTreeMap::from([
//!     ("__meta_process_comm".to_owned(), "nginx".to_owned()),
//!     ("__meta_process_systemd_unit".to_owned(), "nginx.service".to_owned()),
//! ]);
//! assert!(relabeler.apply(&mut labels));
//! assert_eq!(labels["service_name"], "nginx");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// A label set being relabelled: names to values, sorted by name.
pub type LabelSet = BTreeMap<String, String>;

/// One relabelling rule, as written in the config.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelabelConfig {
    /// Labels whose values, joined with `separator`, are matched against `regex`.
    #[serde(alias = "source-labels")]
    pub source_labels: Vec<String>,
    /// Joins the source values. Default `;`.
    pub separator: String,
    /// Anchored regular expression. Default `(.*)`.
    pub regex: String,
    /// The label a `replace`, `lowercase`, `uppercase`, `keepequal` or `dropequal` writes or
    /// compares; `$1`-style references expand for `replace`.
    #[serde(alias = "target-label")]
    pub target_label: String,
    /// What `replace` and `labelmap` write. Default `$1`.
    pub replacement: String,
    /// What the rule does. Default `replace`.
    pub action: Action,
}

impl Default for RelabelConfig {
    fn default() -> Self {
        RelabelConfig {
            source_labels: Vec::new(),
            separator: ";".to_owned(),
            regex: "(.*)".to_owned(),
            target_label: String::new(),
            replacement: "$1".to_owned(),
            action: Action::Replace,
        }
    }
}

/// What a rule does. Written in lowercase in the config; as in Prometheus, any case is read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub enum Action {
    /// Write `replacement` (expanded) to `target_label` when the joined value matches.
    #[default]
    Replace,
    /// Drop the set unless the joined value matches.
    Keep,
    /// Drop the set when the joined value matches.
    Drop,
    /// Drop the set unless the joined value equals `target_label`'s value.
    KeepEqual,
    /// Drop the set when the joined value equals `target_label`'s value.
    DropEqual,
    /// Copy every label whose name matches to the name `replacement` makes of it.
    LabelMap,
    /// Remove every label whose name matches.
    LabelDrop,
    /// Remove every label whose name does not match.
    LabelKeep,
    /// Write the joined value, lowercased, to `target_label`.
    Lowercase,
    /// Write the joined value, uppercased, to `target_label`.
    Uppercase,
    /// Prometheus' sharding action; rejected by [`Relabeler::new`].
    HashMod,
}

impl Action {
    const ALL: [Action; 11] = [
        Action::Replace,
        Action::Keep,
        Action::Drop,
        Action::KeepEqual,
        Action::DropEqual,
        Action::LabelMap,
        Action::LabelDrop,
        Action::LabelKeep,
        Action::Lowercase,
        Action::Uppercase,
        Action::HashMod,
    ];

    /// The name as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Replace => "replace",
            Action::Keep => "keep",
            Action::Drop => "drop",
            Action::KeepEqual => "keepequal",
            Action::DropEqual => "dropequal",
            Action::LabelMap => "labelmap",
            Action::LabelDrop => "labeldrop",
            Action::LabelKeep => "labelkeep",
            Action::Lowercase => "lowercase",
            Action::Uppercase => "uppercase",
            Action::HashMod => "hashmod",
        }
    }
}

impl TryFrom<String> for Action {
    type Error = String;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        let lower = name.to_ascii_lowercase();
        Action::ALL
            .into_iter()
            .find(|action| action.as_str() == lower)
            .ok_or_else(|| {
                let known: Vec<&str> = Action::ALL.iter().map(|a| a.as_str()).collect();
                format!(
                    "unknown relabel action {name:?}; expected one of {}",
                    known.join(", ")
                )
            })
    }
}

impl From<Action> for String {
    fn from(action: Action) -> String {
        action.as_str().to_owned()
    }
}

/// A rule that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RelabelError {
    /// `regex` does not compile.
    #[error("relabel rule {index}: invalid regex {regex:?}: {source}")]
    Regex {
        /// Position of the rule in its list, from 0.
        index: usize,
        /// The regex as written.
        regex: String,
        /// Why it does not compile.
        source: regex::Error,
    },
    /// The action needs a `target_label` and the rule has none.
    #[error("relabel rule {index}: action {} needs a target_label", action.as_str())]
    MissingTarget {
        /// Position of the rule in its list, from 0.
        index: usize,
        /// The action.
        action: Action,
    },
    /// `hashmod` is not supported.
    #[error("relabel rule {index}: action hashmod is not supported by the agent")]
    HashMod {
        /// Position of the rule in its list, from 0.
        index: usize,
    },
}

/// Compiled rules, applied in order.
#[derive(Clone, Debug, Default)]
pub struct Relabeler {
    rules: Vec<(RelabelConfig, Regex)>,
}

/// Longest regex source accepted, compiled size capped by `regex`'s defaults beyond that.
const MAX_REGEX_LEN: usize = 4096;

impl Relabeler {
    /// Compiles and checks `rules`.
    ///
    /// # Errors
    ///
    /// A [`RelabelError`] naming the first unusable rule.
    pub fn new(rules: &[RelabelConfig]) -> Result<Relabeler, RelabelError> {
        let mut compiled = Vec::with_capacity(rules.len());
        for (index, rule) in rules.iter().enumerate() {
            let needs_target = matches!(
                rule.action,
                Action::Replace
                    | Action::KeepEqual
                    | Action::DropEqual
                    | Action::Lowercase
                    | Action::Uppercase
            );
            if needs_target && rule.target_label.is_empty() {
                return Err(RelabelError::MissingTarget {
                    index,
                    action: rule.action,
                });
            }
            if rule.action == Action::HashMod {
                return Err(RelabelError::HashMod { index });
            }
            let anchored = format!("^(?:{})$", rule.regex);
            let regex = regex::RegexBuilder::new(&anchored)
                .size_limit(1 << 20)
                .build()
                .map_err(|source| RelabelError::Regex {
                    index,
                    regex: rule.regex.chars().take(MAX_REGEX_LEN).collect(),
                    source,
                })?;
            compiled.push((rule.clone(), regex));
        }
        Ok(Relabeler { rules: compiled })
    }

    /// Whether there are no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Applies every rule to `labels` in order. Returns `false` when a rule dropped the set
    /// (the labels are then left as they were at that point).
    pub fn apply(&self, labels: &mut LabelSet) -> bool {
        self.rules
            .iter()
            .all(|(rule, regex)| apply_one(rule, regex, labels))
    }
}

fn apply_one(rule: &RelabelConfig, regex: &Regex, labels: &mut LabelSet) -> bool {
    let joined = || {
        rule.source_labels
            .iter()
            .map(|name| labels.get(name).map_or("", String::as_str))
            .collect::<Vec<_>>()
            .join(&rule.separator)
    };
    match rule.action {
        Action::Replace => {
            let value = joined();
            if let Some(captures) = regex.captures(&value) {
                let mut target = String::new();
                captures.expand(&rule.target_label, &mut target);
                let mut replaced = String::new();
                captures.expand(&rule.replacement, &mut replaced);
                if smolder_common::prometheus::is_label_name(&target) {
                    if replaced.is_empty() {
                        labels.remove(&target);
                    } else {
                        labels.insert(target, replaced);
                    }
                }
            }
            true
        }
        Action::Keep => regex.is_match(&joined()),
        Action::Drop => !regex.is_match(&joined()),
        Action::KeepEqual => labels.get(&rule.target_label).map_or("", String::as_str) == joined(),
        Action::DropEqual => labels.get(&rule.target_label).map_or("", String::as_str) != joined(),
        Action::LabelMap => {
            let mapped: Vec<(String, String)> = labels
                .iter()
                .filter_map(|(name, value)| {
                    let captures = regex.captures(name)?;
                    let mut target = String::new();
                    captures.expand(&rule.replacement, &mut target);
                    smolder_common::prometheus::is_label_name(&target)
                        .then(|| (target, value.clone()))
                })
                .collect();
            labels.extend(mapped);
            true
        }
        Action::LabelDrop => {
            labels.retain(|name, _| !regex.is_match(name));
            true
        }
        Action::LabelKeep => {
            labels.retain(|name, _| regex.is_match(name));
            true
        }
        Action::Lowercase => {
            let value = joined().to_lowercase();
            labels.insert(rule.target_label.clone(), value);
            true
        }
        Action::Uppercase => {
            let value = joined().to_uppercase();
            labels.insert(rule.target_label.clone(), value);
            true
        }
        Action::HashMod => unreachable!("hashmod is rejected by Relabeler::new"),
    }
}

/// Removes the labels relabelling may use but series must not carry: those starting with `__`.
pub fn drop_internal(labels: &mut LabelSet) {
    labels.retain(|name, _| !name.starts_with("__"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> LabelSet {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn relabeler(yaml: &str) -> Relabeler {
        let rules: Vec<RelabelConfig> = serde_norway::from_str(yaml).unwrap();
        Relabeler::new(&rules).unwrap()
    }

    #[test]
    fn replace_expands_groups_and_anchors_the_regex() {
        let r = relabeler(
            r#"
- source_labels: [a, b]
  regex: "x;(.*)"
  target_label: joined
  replacement: "got-$1"
- source_labels: [a]
  regex: "x"
  target_label: "${0}_name"
  replacement: "$0"
- source_labels: [b]
  regex: "y"
  target_label: unanchored
"#,
        );
        let mut set = labels(&[("a", "x"), ("b", "yz")]);
        assert!(r.apply(&mut set));
        assert_eq!(set["joined"], "got-yz");
        assert_eq!(set["x_name"], "x");
        assert!(!set.contains_key("unanchored"), "regexes are anchored");
    }

    #[test]
    fn replace_with_an_empty_result_deletes_the_target() {
        let r = relabeler("- {source_labels: [missing], target_label: env}");
        let mut set = labels(&[("env", "prod")]);
        assert!(r.apply(&mut set));
        assert!(!set.contains_key("env"));
    }

    #[test]
    fn keep_and_drop() {
        let keep = relabeler("- {source_labels: [comm], regex: 'nginx|envoy', action: keep}");
        assert!(keep.apply(&mut labels(&[("comm", "nginx")])));
        assert!(!keep.apply(&mut labels(&[("comm", "sshd")])));
        let drop = relabeler("- {source-labels: [comm], regex: 'ssh.*', action: DROP}");
        assert!(!drop.apply(&mut labels(&[("comm", "sshd")])));
        assert!(drop.apply(&mut labels(&[("comm", "nginx")])));
    }

    #[test]
    fn keepequal_and_dropequal() {
        let r = relabeler("- {source_labels: [a], target_label: b, action: keepequal}");
        assert!(r.apply(&mut labels(&[("a", "1"), ("b", "1")])));
        assert!(!r.apply(&mut labels(&[("a", "1"), ("b", "2")])));
        let r = relabeler("- {source_labels: [a], target_label: b, action: dropequal}");
        assert!(!r.apply(&mut labels(&[("a", "1"), ("b", "1")])));
    }

    #[test]
    fn labelmap_labeldrop_labelkeep() {
        let r = relabeler(
            r#"
- {regex: "__meta_process_(.+)", action: labelmap}
- {regex: "pid", action: labeldrop}
"#,
        );
        let mut set = labels(&[
            ("__meta_process_comm", "nginx"),
            ("__meta_process_pid", "7"),
        ]);
        assert!(r.apply(&mut set));
        assert_eq!(set["comm"], "nginx");
        assert!(!set.contains_key("pid"));
        let keep = relabeler("- {regex: 'comm|__.*', action: labelkeep}");
        assert!(keep.apply(&mut set));
        assert_eq!(set.len(), 3);
    }

    #[test]
    fn case_actions() {
        let r = relabeler("- {source_labels: [a], target_label: b, action: uppercase}");
        let mut set = labels(&[("a", "MiXed")]);
        assert!(r.apply(&mut set));
        assert_eq!(set["b"], "MIXED");
    }

    #[test]
    fn bad_rules_are_named() {
        let rules: Vec<RelabelConfig> =
            serde_norway::from_str("- {regex: ok, action: keep}\n- {regex: '(', target_label: x}")
                .unwrap();
        let err = Relabeler::new(&rules).unwrap_err().to_string();
        assert!(
            err.starts_with("relabel rule 1: invalid regex \"(\""),
            "{err}"
        );
        let rules: Vec<RelabelConfig> = serde_norway::from_str("- {action: replace}").unwrap();
        let err = Relabeler::new(&rules).unwrap_err().to_string();
        assert_eq!(err, "relabel rule 0: action replace needs a target_label");
        let rules: Vec<RelabelConfig> =
            serde_norway::from_str("- {action: hashmod, target_label: x}").unwrap();
        assert!(Relabeler::new(&rules).is_err());
        let unknown = serde_norway::from_str::<Vec<RelabelConfig>>("- {action: explode}");
        let err = unknown.unwrap_err().to_string();
        assert!(err.contains("unknown relabel action \"explode\""), "{err}");
    }

    #[test]
    fn internal_labels_are_removed() {
        let mut set = labels(&[("__address__", "x"), ("job", "j")]);
        drop_internal(&mut set);
        assert_eq!(set, labels(&[("job", "j")]));
    }
}
