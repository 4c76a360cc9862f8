//! Rules: Prometheus counters derived from profiles, the same on the agent and the aggregator.
//!
//! Input: [`RuleSpec`]s, from Pyroscope's `metrics-export-rules` map in a config file or from the
//! aggregator's recording-rules API, and then every [`Profile`](crate::Profile) a tier ingests.
//! Output: [`Counters`], one counter per rule and value of its `group_by` labels, written out in
//! Prometheus' text format for `/exported-metrics`. Callers: the agent's window sink and the
//! aggregator's ingest path; this module owns no task, clock or file (it is sans-IO, so that
//! both tiers and the tests drive it alike).
//!
//! # A rule
//!
//! ```yaml
//! metrics-export-rules:
//!   app_slow_function_env_cpu_seconds_total:   # the metric name
//!     expr: simple.golang.app.cpu{env="prod"}  # a FlameQL selector; empty: every series
//!     node: slowFunction                       # a regex over the stack; total or empty: all
//!     function: ""                             # an exact frame name the stack must contain
//!     group_by: [env]                          # series labels kept as metric labels (or labels:)
//! ```
//!
//! - **`node`** is searched for, unanchored, in the root-first `;`-joined stack, as Pyroscope
//!   v0 documents it: `node: "main;slowFunction"` counts every stack that includes that call, as
//!   a leaf or not, and each stack counts once. `total` or empty counts the whole profile.
//! - **`function`**, if set, counts a stack when any of its frames is exactly that name (once
//!   per stack, however often it recurses), as Pyroscope v2's recording rules do. With `node`
//!   also set, a stack must satisfy both.
//! - **Values**: CPU samples (units `samples` with a sample rate) become seconds by dividing by
//!   the sample rate; other units (bytes, objects, nanoseconds) stay as they are.
//! - **Labels**: a `group_by` label the series lacks is the empty value, which Prometheus shows
//!   as no label.
//!
//! Unlike Pyroscope v0, every body format counts (pprof and JFR too), and the selector's regex
//! matchers are anchored, as everywhere in Smolder (see [`selector`](crate::selector)).
//!
//! # Cost
//!
//! [`RuleSet::evaluate`] walks a tree once and feeds every node regex of the set, compiled into
//! one lazy DFA, one frame per node: a child resumes from its parent's state, so each node's
//! name is read once and each unique stack (a node with a self value) costs one end-of-input
//! transition. The cost follows the tree's size, not its sample count or depth. When the DFA
//! cannot decide (its cache overflows, or a Unicode word boundary meets non-ASCII text), that
//! profile's stacks are matched as text with a [`RegexSet`] instead, with the same result.
//!
//! ```
//! use smolder_common::rules::{Counters, RuleSet, RuleSpec};
//! use smolder_common::{Profile, ProfileMeta, Tree};
//! use std::time::UNIX_EPOCH;
//!
//! let rules = RuleSet::from_map_json(
//!     r#"{"app_slow_seconds_total": {"node": "slowFunction", "group_by": ["env"]}}"#,
//! )?;
//! let mut tree = Tree::new();
//! tree.insert_names(["main", "slowFunction"], 300);
//! tree.insert_names(["main", "fastFunction"], 100);
//! let profile = Profile {
//!     series: "app.cpu{env=prod}".parse()?,
//!     meta: ProfileMeta { sample_rate: 100, ..ProfileMeta::default() },
//!     from: UNIX_EPOCH,
//!     until: UNIX_EPOCH,
//!     tree,
//! };
//! let mut counters = Counters::new(&rules);
//! counters.apply(rules.evaluate(&profile));
//! assert!(counters.render().contains("app_slow_seconds_total{env=\"prod\"} 3\n"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod automaton;
mod counters;
mod eval;

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;

use regex::{Regex, RegexBuilder, RegexSet, RegexSetBuilder};
use serde::{Deserialize, Serialize};

use crate::prometheus;
use crate::selector::REGEX_SIZE_LIMIT;
use crate::{Selector, SelectorError};

pub use counters::{Applied, Counters, Increments, MAX_SERIES_PER_RULE, Sample};

/// The most rules one rule set may hold: each one is a regex in the set every stack is matched
/// against and a family of series in `/exported-metrics`.
pub const MAX_RULES: usize = 1_000;

/// A rule as written in a config file or sent to the API, before it is checked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuleSpec {
    /// A FlameQL selector of the series the rule reads; empty: every series.
    pub expr: String,
    /// `total` or empty: the whole profile; otherwise a regex searched for in each stack.
    pub node: String,
    /// If not empty, only stacks with a frame of exactly this name count.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub function: String,
    /// Series labels kept as the metric's labels (Pyroscope also calls them `labels`).
    #[serde(alias = "labels")]
    pub group_by: Vec<String>,
}

/// Why a rule was refused. Every message starts with the rule's name.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RuleError {
    /// The name is not a Prometheus metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
    #[error(
        "rule {rule:?}: invalid metric name, expected a letter, '_' or ':' then letters, digits, '_' or ':'"
    )]
    InvalidName {
        /// The rule's name.
        rule: String,
    },
    /// `expr` is not a FlameQL selector.
    #[error("rule {rule:?}: invalid expr {expr:?}: {source}")]
    InvalidExpr {
        /// The rule's name.
        rule: String,
        /// The selector as given.
        expr: String,
        /// What is wrong with it (boxed: selector errors are large and rare).
        source: Box<SelectorError>,
    },
    /// `node` is not a valid regex, or compiles past [`REGEX_SIZE_LIMIT`].
    #[error("rule {rule:?}: invalid node regex {node:?}: {source}")]
    InvalidNode {
        /// The rule's name.
        rule: String,
        /// The regex as given.
        node: String,
        /// What the regex compiler said.
        source: regex::Error,
    },
    /// A `group_by` entry is not a Prometheus label name, or is reserved (`__` prefix).
    #[error(
        "rule {rule:?}: invalid group_by label {label:?}, expected a letter or '_' then letters, digits or '_', not starting with '__'"
    )]
    InvalidLabel {
        /// The rule's name.
        rule: String,
        /// The label as given.
        label: String,
    },
    /// A `group_by` label is listed twice.
    #[error("rule {rule:?}: group_by label {label:?} is listed twice")]
    DuplicateLabel {
        /// The rule's name.
        rule: String,
        /// The label.
        label: String,
    },
    /// Two rules have the same name.
    #[error("rule {rule:?}: a rule with this name already exists")]
    DuplicateName {
        /// The rule's name.
        rule: String,
    },
    /// More than [`MAX_RULES`] rules.
    #[error("rule {rule:?}: too many rules, at most {limit}")]
    TooMany {
        /// The first rule past the limit.
        rule: String,
        /// [`MAX_RULES`].
        limit: usize,
    },
    /// The node regexes of a rule set do not compile together within the size limit.
    #[error("rule {rule:?}: the node regexes of all rules together are too large: {source}")]
    SetTooLarge {
        /// The last rule of the set.
        rule: String,
        /// What the regex compiler said.
        source: regex::Error,
    },
    /// A rules map in YAML does not parse.
    #[error("invalid rules: {reason}")]
    Syntax {
        /// What the YAML parser said, with the position.
        reason: String,
    },
}

impl RuleError {
    /// The name of the rule at fault (empty for [`RuleError::Syntax`]).
    pub fn rule(&self) -> &str {
        match self {
            RuleError::InvalidName { rule }
            | RuleError::InvalidExpr { rule, .. }
            | RuleError::InvalidNode { rule, .. }
            | RuleError::InvalidLabel { rule, .. }
            | RuleError::DuplicateLabel { rule, .. }
            | RuleError::DuplicateName { rule }
            | RuleError::TooMany { rule, .. }
            | RuleError::SetTooLarge { rule, .. } => rule,
            RuleError::Syntax { .. } => "",
        }
    }
}

/// How a rule picks stacks.
#[derive(Clone, Debug)]
enum NodeFilter {
    /// Every stack.
    Total,
    /// Stacks whose text the regex finds a match in.
    Regex(Regex),
}

/// A checked rule, ready to evaluate.
#[derive(Clone, Debug)]
pub struct Rule {
    name: String,
    spec: RuleSpec,
    selector: Option<Selector>,
    node: NodeFilter,
}

impl Rule {
    /// Checks `spec` and compiles it as rule `name`.
    ///
    /// # Errors
    ///
    /// A [`RuleError`] naming the rule and what is wrong with it: the name, the selector, the
    /// node regex or a `group_by` label.
    pub fn new(name: impl Into<String>, spec: RuleSpec) -> Result<Rule, RuleError> {
        let name = name.into();
        if !prometheus::is_metric_name(&name) {
            return Err(RuleError::InvalidName { rule: name });
        }
        let selector = match spec.expr.trim() {
            "" => None,
            expr => Some(
                Selector::parse(expr).map_err(|source| RuleError::InvalidExpr {
                    rule: name.clone(),
                    expr: spec.expr.clone(),
                    source: Box::new(source),
                })?,
            ),
        };
        let node = match spec.node.as_str() {
            "" | "total" => NodeFilter::Total,
            pattern => NodeFilter::Regex(
                RegexBuilder::new(pattern)
                    .size_limit(REGEX_SIZE_LIMIT)
                    .dfa_size_limit(REGEX_SIZE_LIMIT)
                    .build()
                    .map_err(|source| RuleError::InvalidNode {
                        rule: name.clone(),
                        node: spec.node.clone(),
                        source,
                    })?,
            ),
        };
        let mut seen = HashSet::new();
        for label in &spec.group_by {
            if !prometheus::is_user_label_name(label) {
                return Err(RuleError::InvalidLabel {
                    rule: name,
                    label: label.clone(),
                });
            }
            if !seen.insert(label.as_str()) {
                return Err(RuleError::DuplicateLabel {
                    rule: name,
                    label: label.clone(),
                });
            }
        }
        Ok(Rule {
            name,
            spec,
            selector,
            node,
        })
    }

    /// The metric name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rule as it was written.
    pub fn spec(&self) -> &RuleSpec {
        &self.spec
    }

    /// The metric's label names, in `group_by` order.
    pub fn group_by(&self) -> &[String] {
        &self.spec.group_by
    }

    /// Whether the rule reads series `series`.
    pub fn selects(&self, series: &crate::Series) -> bool {
        self.selector.as_ref().is_none_or(|s| s.matches(series))
    }
}

impl fmt::Display for Rule {
    /// `name: expr node=… function=… group_by=[…]`, for logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {:?} node={:?} function={:?} group_by={:?}",
            self.name, self.spec.expr, self.spec.node, self.spec.function, self.spec.group_by
        )
    }
}

/// A set of rules with unique names, compiled for evaluation together.
#[derive(Clone, Debug)]
pub struct RuleSet {
    /// In name order, so that output is deterministic.
    rules: Vec<Arc<Rule>>,
    /// Every rule's node regex, matched against each stack in one pass.
    nodes: RegexSet,
    /// For each rule, its index in `nodes`, if it has a node regex.
    node_index: Vec<Option<usize>>,
    /// The same regexes as one lazy DFA, fed frame by frame; `None` without node regexes or
    /// when they do not build as a DFA.
    automaton: Option<Arc<automaton::Automaton>>,
}

impl Default for RuleSet {
    fn default() -> Self {
        RuleSet {
            rules: Vec::new(),
            nodes: RegexSet::empty(),
            node_index: Vec::new(),
            automaton: None,
        }
    }
}

impl RuleSet {
    /// Compiles `rules` into a set.
    ///
    /// # Errors
    ///
    /// [`RuleError::DuplicateName`] when two rules share a name, [`RuleError::TooMany`] past
    /// [`MAX_RULES`], [`RuleError::SetTooLarge`] when their node regexes together compile past
    /// the size limit.
    pub fn new(rules: impl IntoIterator<Item = Arc<Rule>>) -> Result<RuleSet, RuleError> {
        let mut by_name = BTreeMap::new();
        for rule in rules {
            if by_name.len() == MAX_RULES {
                return Err(RuleError::TooMany {
                    rule: rule.name.clone(),
                    limit: MAX_RULES,
                });
            }
            if by_name.contains_key(&rule.name) {
                return Err(RuleError::DuplicateName {
                    rule: rule.name.clone(),
                });
            }
            by_name.insert(rule.name.clone(), rule);
        }
        let rules: Vec<Arc<Rule>> = by_name.into_values().collect();
        let mut patterns = Vec::new();
        let node_index = rules
            .iter()
            .map(|rule| match &rule.node {
                NodeFilter::Total => None,
                NodeFilter::Regex(regex) => {
                    patterns.push(regex.as_str().to_owned());
                    Some(patterns.len() - 1)
                }
            })
            .collect();
        let nodes = RegexSetBuilder::new(&patterns)
            .size_limit(REGEX_SIZE_LIMIT.saturating_mul(patterns.len().max(1)))
            .dfa_size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|source| RuleError::SetTooLarge {
                rule: rules.last().map(|r| r.name.clone()).unwrap_or_default(),
                source,
            })?;
        let automaton = automaton::Automaton::build(&patterns).map(Arc::new);
        Ok(RuleSet {
            rules,
            nodes,
            node_index,
            automaton,
        })
    }

    /// Checks and compiles specs given as (name, spec) pairs, such as a config file's
    /// `metrics-export-rules` map.
    ///
    /// # Errors
    ///
    /// The first [`RuleError`] of any rule, or of the set as a whole (see [`RuleSet::new`]).
    pub fn from_specs<'a>(
        specs: impl IntoIterator<Item = (&'a String, &'a RuleSpec)>,
    ) -> Result<RuleSet, RuleError> {
        let rules = specs
            .into_iter()
            .map(|(name, spec)| Rule::new(name.clone(), spec.clone()).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        RuleSet::new(rules)
    }

    /// Parses a `metrics-export-rules` map written as JSON (the tiers read the YAML form
    /// through their config files, into the same [`RuleSpec`]s).
    ///
    /// # Errors
    ///
    /// [`RuleError::Syntax`] when the text is not a map of rules, else as [`RuleSet::from_specs`].
    pub fn from_map_json(text: &str) -> Result<RuleSet, RuleError> {
        let specs: BTreeMap<String, RuleSpec> =
            serde_json::from_str(text).map_err(|err| RuleError::Syntax {
                reason: err.to_string(),
            })?;
        RuleSet::from_specs(&specs)
    }

    /// The rules, in name order.
    pub fn rules(&self) -> &[Arc<Rule>] {
        &self.rules
    }

    /// The rule named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Rule>> {
        self.rules
            .binary_search_by(|r| r.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.rules[i])
    }

    /// The number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether there are no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(expr: &str, node: &str, group_by: &[&str]) -> RuleSpec {
        RuleSpec {
            expr: expr.to_owned(),
            node: node.to_owned(),
            function: String::new(),
            group_by: group_by.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn err(name: &str, spec: RuleSpec) -> String {
        Rule::new(name, spec).unwrap_err().to_string()
    }

    #[test]
    fn each_invalid_part_is_named_with_the_rule() {
        assert_eq!(
            err("9lives", spec("", "", &[])),
            "rule \"9lives\": invalid metric name, expected a letter, '_' or ':' then letters, digits, '_' or ':'"
        );
        assert!(err("a", spec("app.cpu{env=prod}", "", &[])).starts_with(
            "rule \"a\": invalid expr \"app.cpu{env=prod}\": label values must be double-quoted"
        ));
        assert!(
            err("a", spec("", "slow(", &[]))
                .starts_with("rule \"a\": invalid node regex \"slow(\"")
        );
        assert!(
            err("a", spec("", "", &["env-name"]))
                .starts_with("rule \"a\": invalid group_by label \"env-name\"")
        );
        assert!(err("a", spec("", "", &["__name__"])).contains("not starting with '__'"));
        assert_eq!(
            err("a", spec("", "", &["env", "env"])),
            "rule \"a\": group_by label \"env\" is listed twice"
        );
        let rule = Arc::new(Rule::new("a", spec("", "", &[])).unwrap());
        let dup = RuleSet::new([rule.clone(), rule]).unwrap_err();
        assert_eq!(
            dup.to_string(),
            "rule \"a\": a rule with this name already exists"
        );
        assert_eq!(dup.rule(), "a");
    }

    #[test]
    fn pyroscope_rule_maps_load_with_labels_as_an_alias() {
        let set = RuleSet::from_map_json(
            r#"{
                "a_simple_app_total": {"expr": "simple.golang.app.cpu", "node": "total"},
                "a_simple_app_slow_env_prod": {"expr": "simple.golang.app.cpu{env=\"prod\"}", "node": "slowFunction"},
                "a_simple_app_slow_env": {"expr": "simple.golang.app.cpu", "node": "slowFunction", "labels": ["env"]}
            }"#,
        )
        .unwrap();
        let names: Vec<&str> = set.rules().iter().map(|r| r.name()).collect();
        assert_eq!(
            names,
            [
                "a_simple_app_slow_env",
                "a_simple_app_slow_env_prod",
                "a_simple_app_total"
            ]
        );
        assert_eq!(
            set.get("a_simple_app_slow_env").unwrap().group_by(),
            ["env"]
        );
        let unknown = RuleSet::from_map_json(r#"{"a": {"nodes": "x"}}"#).unwrap_err();
        assert!(
            unknown.to_string().contains("unknown field `nodes`"),
            "{unknown}"
        );
    }
}
