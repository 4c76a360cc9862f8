//! The counters of a rule set: what evaluations add up to, and their Prometheus exposition.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use super::{Rule, RuleSet};

/// The most label combinations one rule's counter may have: a `group_by` over a label with
/// unbounded values (a pod name, a version per build) must not grow a tier's memory and its
/// `/exported-metrics` without end. Increments for new combinations past it are dropped and
/// reported by [`Counters::apply`].
pub const MAX_SERIES_PER_RULE: usize = 10_000;

/// One rule's addition for one combination of its `group_by` label values.
#[derive(Clone, Debug)]
pub(super) struct Increment {
    pub(super) rule: Arc<Rule>,
    pub(super) labels: Vec<String>,
    pub(super) value: f64,
}

/// What evaluating profiles adds to [`Counters`]: computed first (it is the costly part), and
/// applied once the profiles are accepted, so that rejected data counts nowhere.
#[derive(Clone, Debug, Default)]
pub struct Increments {
    entries: Vec<Increment>,
}

impl Increments {
    pub(super) fn push(&mut self, increment: Increment) {
        self.entries.push(increment);
    }

    /// Adds `other`'s entries to these.
    pub fn extend(&mut self, other: Increments) {
        self.entries.extend(other.entries);
    }

    /// The number of (rule, labels) entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The sum of the values added to rule `name`, over all its labels: for tests and logs.
    pub fn total(&self, name: &str) -> f64 {
        self.entries
            .iter()
            .filter(|e| e.rule.name() == name)
            .map(|e| e.value)
            .sum()
    }
}

/// What [`Counters::apply`] did with a set of increments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Entries added to a counter.
    pub added: usize,
    /// Entries of a rule that was changed or deleted since they were evaluated.
    pub stale: usize,
    /// Entries for a new label combination past [`MAX_SERIES_PER_RULE`].
    pub over_limit: usize,
}

/// One counter value, for a remote write.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample<'a> {
    /// The metric name.
    pub name: &'a str,
    /// `group_by` labels with a value, in `group_by` order.
    pub labels: Vec<(&'a str, &'a str)>,
    /// The counter's value.
    pub value: f64,
}

/// One rule's counter: a value per combination of label values.
#[derive(Clone, Debug)]
struct Family {
    rule: Arc<Rule>,
    values: BTreeMap<Vec<String>, f64>,
}

impl Family {
    fn new(rule: &Arc<Rule>) -> Family {
        let mut values = BTreeMap::new();
        if rule.group_by().is_empty() {
            // A counter without labels exists from the start, at zero, as client libraries do.
            values.insert(Vec::new(), 0.0);
        }
        Family {
            rule: Arc::clone(rule),
            values,
        }
    }
}

/// The counters of every rule of a [`RuleSet`], cumulative since they were created.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// By metric name.
    families: BTreeMap<String, Family>,
}

impl Counters {
    /// Zeroed counters for every rule of `rules`.
    pub fn new(rules: &RuleSet) -> Counters {
        let mut counters = Counters::default();
        counters.sync(rules);
        counters
    }

    /// Follows a change of rule set: counters of rules that are still there, unchanged, keep
    /// their values; those of changed rules restart at zero (Prometheus reads it as a counter
    /// reset); those of removed rules go.
    pub fn sync(&mut self, rules: &RuleSet) {
        let mut families = BTreeMap::new();
        for rule in rules.rules() {
            let family = match self.families.remove(rule.name()) {
                Some(family) if Arc::ptr_eq(&family.rule, rule) => family,
                _ => Family::new(rule),
            };
            families.insert(rule.name().to_owned(), family);
        }
        self.families = families;
    }

    /// Adds `increments` to the counters of their rules.
    pub fn apply(&mut self, increments: Increments) -> Applied {
        let mut applied = Applied::default();
        for Increment {
            rule,
            labels,
            value,
        } in increments.entries
        {
            let Some(family) = self
                .families
                .get_mut(rule.name())
                .filter(|f| Arc::ptr_eq(&f.rule, &rule))
            else {
                applied.stale += 1;
                continue;
            };
            let len = family.values.len();
            match family.values.get_mut(&labels) {
                Some(counter) => *counter += value,
                None if len >= MAX_SERIES_PER_RULE => {
                    applied.over_limit += 1;
                    continue;
                }
                None => {
                    family.values.insert(labels, value);
                }
            }
            applied.added += 1;
        }
        applied
    }

    /// The value of rule `name`'s counter for `labels` (its `group_by` values, in order).
    pub fn get(&self, name: &str, labels: &[&str]) -> Option<f64> {
        let family = self.families.get(name)?;
        family
            .values
            .iter()
            .find(|(key, _)| key.iter().map(String::as_str).eq(labels.iter().copied()))
            .map(|(_, value)| *value)
    }

    /// The number of counter values (series) over all rules.
    pub fn series(&self) -> usize {
        self.families.values().map(|f| f.values.len()).sum()
    }

    /// Every counter value, by rule name and then labels.
    pub fn samples(&self) -> impl Iterator<Item = Sample<'_>> {
        self.families.values().flat_map(|family| {
            family.values.iter().map(move |(values, value)| Sample {
                name: family.rule.name(),
                labels: family
                    .rule
                    .group_by()
                    .iter()
                    .zip(values)
                    .filter(|(_, v)| !v.is_empty())
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect(),
                value: *value,
            })
        })
    }

    /// The counters in Prometheus' text exposition format (version 0.0.4), as
    /// `/exported-metrics` serves them: a `HELP` and `TYPE counter` per rule, then its values.
    /// Labels with an empty value are left out, which Prometheus reads the same way.
    pub fn render(&self) -> String {
        self.render_with(&[])
    }

    /// [`Counters::render`] with `extra` labels first on every series (an aggregator's
    /// `tenant`). A `group_by` label of the same name is renamed `exported_<name>`, as
    /// Prometheus renames a scraped label that clashes with a target label, so that `extra`
    /// cannot be forged by the profiles' own labels.
    pub fn render_with(&self, extra: &[(&str, &str)]) -> String {
        let mut text = String::new();
        for family in self.families.values() {
            let rule = &family.rule;
            let spec = rule.spec();
            let expr = if spec.expr.is_empty() {
                "(every series)"
            } else {
                &spec.expr
            };
            let node = if spec.node.is_empty() {
                "total"
            } else {
                &spec.node
            };
            let mut help = format!("Recorded from profiles: expr {expr}, node {node}");
            if !spec.function.is_empty() {
                let _ = write!(help, ", function {}", spec.function);
            }
            let _ = writeln!(text, "# HELP {} {}", rule.name(), escape_help(&help));
            let _ = writeln!(text, "# TYPE {} counter", rule.name());
            for sample in family.values.iter().map(|(values, value)| (values, *value)) {
                text.push_str(rule.name());
                let labels: Vec<(String, &str)> = extra
                    .iter()
                    .map(|(name, value)| ((*name).to_owned(), *value))
                    .chain(
                        rule.group_by()
                            .iter()
                            .zip(sample.0)
                            .filter(|(_, v)| !v.is_empty())
                            .map(|(name, value)| {
                                let name = if extra.iter().any(|(e, _)| e == name) {
                                    format!("exported_{name}")
                                } else {
                                    name.clone()
                                };
                                (name, value.as_str())
                            }),
                    )
                    .collect();
                if !labels.is_empty() {
                    text.push('{');
                    for (i, (name, value)) in labels.into_iter().enumerate() {
                        if i > 0 {
                            text.push(',');
                        }
                        let _ = write!(text, "{name}=\"{}\"", escape_value(value));
                    }
                    text.push('}');
                }
                let _ = writeln!(text, " {}", sample.1);
            }
        }
        text
    }
}

/// Escapes a `HELP` text: backslash and line feed.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Escapes a label value: backslash, double quote and line feed.
fn escape_value(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
