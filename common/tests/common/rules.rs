//! Rule evaluation agrees with a naive reading of the rules' definition: join each stack, run
//! each regex on it, look for the function among its frames.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use proptest::prelude::*;
use regex::Regex;
use smolder_common::rules::{Counters, Rule, RuleSet, RuleSpec};
use smolder_common::{Profile, ProfileMeta, Tree};

use crate::util::{ALPHABET, any_tree};

/// Node filters over the alphabet: literals, anchors at either end, alternations, a frame
/// boundary, and patterns that match the empty stack.
const NODES: [&str; 12] = [
    "",
    "total",
    "main",
    "a;b",
    "^main",
    "gc$",
    "ab|x y",
    ";;",
    "^$",
    "(?:^|;)a(?:;|$)",
    "b",
    ".*",
];

fn spec() -> impl Strategy<Value = RuleSpec> {
    (
        prop::sample::select(&NODES[..]),
        prop_oneof![Just(""), prop::sample::select(&ALPHABET[..])],
    )
        .prop_map(|(node, function)| RuleSpec {
            expr: String::new(),
            node: node.to_owned(),
            function: function.to_owned(),
            group_by: Vec::new(),
        })
}

/// What a rule adds for `tree`, the slow way.
fn naive(spec: &RuleSpec, tree: &Tree) -> u64 {
    let regex = match spec.node.as_str() {
        "" | "total" => None,
        node => Some(Regex::new(node).unwrap()),
    };
    let mut sum = 0u64;
    tree.for_each_stack(|stack, value| {
        let names: Vec<&str> = stack.iter().map(|&f| tree.frames().name(f)).collect();
        let node_ok = regex.as_ref().is_none_or(|r| r.is_match(&names.join(";")));
        let function_ok = spec.function.is_empty() || names.contains(&spec.function.as_str());
        if node_ok && function_ok {
            sum = sum.saturating_add(value);
        }
    });
    sum
}

proptest! {
    /// Several trees through one rule set, as a tier evaluates profile after profile: what the
    /// set remembers from earlier trees (frame outcomes by name) must not change later answers.
    #[test]
    fn evaluation_matches_the_naive_definition(
        specs in prop::collection::vec(spec(), 1..8),
        trees in prop::collection::vec(any_tree(), 1..4),
    ) {
        let rules: Vec<Arc<Rule>> = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| Arc::new(Rule::new(format!("r{i}"), spec.clone()).unwrap()))
            .collect();
        let set = RuleSet::new(rules).unwrap();
        for tree in trees {
            let profile = Profile {
                series: "app.alloc_objects{}".parse().unwrap(),
                meta: ProfileMeta { units: "objects".to_owned(), sample_rate: 0, ..ProfileMeta::default() },
                from: UNIX_EPOCH,
                until: UNIX_EPOCH,
                tree: tree.clone(),
            };
            let mut counters = Counters::new(&set);
            counters.apply(set.evaluate(&profile));
            for (i, spec) in specs.iter().enumerate() {
                let got = counters.get(&format!("r{i}"), &[]).unwrap();
                prop_assert_eq!(got, naive(spec, &tree) as f64, "rule {:?}", spec);
            }
        }
    }

    #[test]
    fn arbitrary_rule_maps_never_panic(text in "\\PC{0,200}") {
        let _ = RuleSet::from_map_json(&text);
        let _ = Rule::new(text.clone(), RuleSpec { node: text.clone(), expr: text.clone(), ..RuleSpec::default() });
    }
}
