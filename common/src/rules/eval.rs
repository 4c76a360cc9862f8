//! Evaluating a rule set over one profile: one walk of the tree, one regex-set match per stack.

use std::sync::Arc;

use regex::RegexSet;
use regex_automata::hybrid::LazyStateID;

use super::automaton::{Automaton, GaveUp, Outcome, Scratch};
use super::counters::Increment;
use super::{Increments, RuleSet};
use crate::tree::{FrameId, NodeRef};
use crate::{Profile, Tree};

/// For each frame that some rule's `function` names, its slot in the walk's frame counts:
/// indexed by frame, since the walk asks for every node.
#[derive(Default)]
struct FunctionSlots {
    /// By [`FrameId::index`]; `u32::MAX` for frames no rule names. Empty without functions.
    slot_of: Vec<u32>,
    slots: usize,
}

impl FunctionSlots {
    /// The slot of `frame`, adding one if it has none.
    fn add(&mut self, frame: FrameId, frames: usize) -> usize {
        if self.slot_of.is_empty() {
            self.slot_of = vec![u32::MAX; frames];
        }
        let slot = &mut self.slot_of[frame.index()];
        if *slot == u32::MAX {
            *slot = u32::try_from(self.slots).expect("fewer than 2^32 rules");
            self.slots += 1;
        }
        *slot as usize
    }

    fn get(&self, frame: FrameId) -> Option<usize> {
        self.slot_of
            .get(frame.index())
            .filter(|&&slot| slot != u32::MAX)
            .map(|&slot| slot as usize)
    }

    fn len(&self) -> usize {
        self.slots
    }
}

/// A rule that looks at stacks one by one (it has a node regex or a function), by its position
/// among the rules that select the profile.
struct PerStack {
    /// Index into the sums.
    sum: usize,
    /// Index of its regex in the rule set's [`regex::RegexSet`].
    node: Option<usize>,
    /// Index of its function in the walk's frame counts.
    function: Option<usize>,
}

impl RuleSet {
    /// What `profile` adds to the counters of the rules that select its series.
    ///
    /// Every selecting rule yields an increment, zero if no stack matched, so that its labelled
    /// counter exists from the first profile on (Prometheus' `rate()` needs a first sample).
    pub fn evaluate(&self, profile: &Profile) -> Increments {
        let mut out = Increments::default();
        self.evaluate_into(profile, &mut out);
        out
    }

    /// [`RuleSet::evaluate`], adding to `out`.
    pub fn evaluate_into(&self, profile: &Profile, out: &mut Increments) {
        let selecting: Vec<usize> = (0..self.rules.len())
            .filter(|&i| self.rules[i].selects(&profile.series))
            .collect();
        if selecting.is_empty() {
            return;
        }
        let tree = &profile.tree;
        let mut sums = vec![0u64; selecting.len()];
        let mut per_stack = Vec::new();
        let mut functions = FunctionSlots::default();
        for (sum, &i) in selecting.iter().enumerate() {
            let function = &self.rules[i].spec.function;
            let function = if function.is_empty() {
                None
            } else {
                match tree.frames().get(function) {
                    Some(frame) => Some(functions.add(frame, tree.frames().len())),
                    // No frame of that name: no stack can count.
                    None => continue,
                }
            };
            let node = self.node_index[i];
            if node.is_none() && function.is_none() {
                sums[sum] = tree.total();
            } else {
                per_stack.push(PerStack {
                    sum,
                    node,
                    function,
                });
            }
        }
        if !per_stack.is_empty() {
            self.walk(tree, &per_stack, &functions, &mut sums);
        }
        let meta = &profile.meta;
        // CPU samples with a rate become seconds, as Pyroscope exports them; so do nanoseconds
        // (off-CPU time); other units are exported as they are.
        let per_second = if meta.units == "samples" && meta.sample_rate > 0 {
            Some(f64::from(meta.sample_rate))
        } else if meta.units == "nanoseconds" {
            Some(1e9)
        } else {
            None
        };
        for (sum, &i) in selecting.iter().enumerate() {
            let rule = &self.rules[i];
            let labels = rule
                .group_by()
                .iter()
                .map(|name| profile.series.labels().get(name).unwrap_or("").to_owned())
                .collect();
            let value = match per_second {
                Some(per_second) => sums[sum] as f64 / per_second,
                None => sums[sum] as f64,
            };
            out.push(Increment {
                rule: Arc::clone(rule),
                labels,
                value,
            });
        }
    }

    /// Adds every stack's self value to the sums of the per-stack rules it satisfies: with the
    /// lazy DFA fed frame by frame when it can, else with the regex set on each stack's text.
    fn walk(
        &self,
        tree: &Tree,
        per_stack: &[PerStack],
        functions: &FunctionSlots,
        sums: &mut [u64],
    ) {
        let needs_regex = per_stack.iter().any(|r| r.node.is_some());
        if needs_regex && let Some(automaton) = &self.automaton {
            let mut scratch = automaton.take();
            let walked = DfaMatcher::new(automaton, &mut scratch, tree.frames().len())
                .and_then(|mut matcher| walk(tree, &mut matcher, per_stack, functions, sums));
            automaton.put_back(scratch);
            if walked.is_ok() {
                return;
            }
            for rule in per_stack {
                sums[rule.sum] = 0;
            }
        }
        let mut matcher = SetMatcher {
            set: needs_regex.then_some(&self.nodes),
            path: String::new(),
            ends: Vec::new(),
        };
        walk(tree, &mut matcher, per_stack, functions, sums)
            .expect("matching with a regex set never gives up");
    }
}

/// What a tree walk asks of a node-regex matcher: follow the stack as frames are pushed and
/// popped, and say which patterns match the current stack.
trait StackMatcher {
    /// Frame `frame`, named `name`, was pushed onto the stack.
    fn push(&mut self, frame: FrameId, name: &str) -> Result<(), GaveUp>;
    /// The top frame was popped.
    fn pop(&mut self);
    /// Sets in `hits` the bits of the patterns that match the current stack.
    fn matches(&mut self, hits: &mut Vec<u64>) -> Result<(), GaveUp>;
}

/// Matches each stack's `;`-joined text against the regex set.
struct SetMatcher<'s> {
    set: Option<&'s RegexSet>,
    path: String,
    /// Where `path` ended before each frame was pushed.
    ends: Vec<usize>,
}

impl StackMatcher for SetMatcher<'_> {
    fn push(&mut self, _frame: FrameId, name: &str) -> Result<(), GaveUp> {
        let end = self.path.len();
        if !self.ends.is_empty() {
            self.path.push(';');
        }
        self.ends.push(end);
        self.path.push_str(name);
        Ok(())
    }

    fn pop(&mut self) {
        if let Some(end) = self.ends.pop() {
            self.path.truncate(end);
        }
    }

    fn matches(&mut self, hits: &mut Vec<u64>) -> Result<(), GaveUp> {
        hits.clear();
        if let Some(set) = self.set {
            hits.resize(set.len().div_ceil(64), 0);
            for pattern in set.matches(&self.path).iter() {
                hits[pattern / 64] |= 1 << (pattern % 64);
            }
        }
        Ok(())
    }
}

/// Feeds the lazy DFA one frame per push, keeping its state and the patterns matched so far per
/// depth (see [`automaton`](super::automaton)). A frame pushed onto the same DFA state always
/// gives the same outcome; within a walk, outcomes are found by frame id, across walks by name
/// ([`Automaton::frame`]).
struct DfaMatcher<'a> {
    automaton: &'a Automaton,
    scratch: &'a mut Scratch,
    /// The state after each depth's frame; `[0]` is the start.
    states: Vec<LazyStateID>,
    /// Patterns matched before the end of the stack, `words` per depth.
    hits: Vec<u64>,
    /// By [`FrameId::index`]: the last state after a `;` the frame was fed from, and its
    /// outcome. Most frames are only ever reached from one such state, so an array beats a
    /// map keyed by (state, frame). Root frames, which have no `;`, skip it.
    by_frame: Vec<Option<(LazyStateID, Outcome)>>,
}

impl<'a> DfaMatcher<'a> {
    fn new(
        automaton: &'a Automaton,
        scratch: &'a mut Scratch,
        frames: usize,
    ) -> Result<DfaMatcher<'a>, GaveUp> {
        let start = automaton.start(&mut scratch.cache)?;
        Ok(DfaMatcher {
            automaton,
            scratch,
            states: vec![start],
            hits: vec![0; automaton.words()],
            by_frame: vec![None; frames],
        })
    }
}

impl StackMatcher for DfaMatcher<'_> {
    fn push(&mut self, frame: FrameId, name: &str) -> Result<(), GaveUp> {
        let words = self.automaton.words();
        let depth = self.states.len() - 1;
        let mut sid = *self.states.last().expect("the start state is never popped");
        self.hits
            .extend_from_within(depth * words..(depth + 1) * words);
        let hits = &mut self.hits[(depth + 1) * words..];
        // The separator is fed first: after it, the DFA is in one of few states whatever the
        // frame before, which is what makes (state, frame) pairs repeat.
        if depth > 0 {
            sid = self
                .automaton
                .feed(&mut self.scratch.cache, sid, b";", hits)?;
        }
        let outcome = if depth == 0 {
            self.automaton.frame(self.scratch, sid, true, name)?
        } else {
            match self.by_frame[frame.index()] {
                Some((from, outcome)) if from == sid => outcome,
                _ => {
                    let outcome = self.automaton.frame(self.scratch, sid, false, name)?;
                    self.by_frame[frame.index()] = Some((sid, outcome));
                    outcome
                }
            }
        };
        if let Some(found) = self.automaton.found(self.scratch, outcome) {
            for (hit, new) in hits.iter_mut().zip(found) {
                *hit |= new;
            }
        }
        self.states.push(outcome.state);
        Ok(())
    }

    fn pop(&mut self) {
        if self.states.len() > 1 {
            self.states.pop();
            self.hits
                .truncate(self.states.len() * self.automaton.words());
        }
    }

    fn matches(&mut self, hits: &mut Vec<u64>) -> Result<(), GaveUp> {
        let words = self.automaton.words();
        let depth = self.states.len() - 1;
        hits.clear();
        hits.extend_from_slice(&self.hits[depth * words..]);
        let sid = *self.states.last().expect("the start state is never popped");
        self.automaton.finish(&mut self.scratch.cache, sid, hits)
    }
}

/// Walks `tree` depth first, telling `matcher` each push and pop, and adds each stack's self
/// value to the sums of the per-stack rules it satisfies.
fn walk(
    tree: &Tree,
    matcher: &mut impl StackMatcher,
    per_stack: &[PerStack],
    functions: &FunctionSlots,
    sums: &mut [u64],
) -> Result<(), GaveUp> {
    enum Step<'t> {
        Enter(NodeRef<'t>),
        Exit(NodeRef<'t>),
    }
    let needs_regex = per_stack.iter().any(|r| r.node.is_some());
    // Rules with a node regex and no function, by pattern: a stack then costs one step per
    // pattern it matches (few) rather than one per rule.
    let mut by_pattern: Vec<Vec<usize>> = Vec::new();
    let mut checked: Vec<&PerStack> = Vec::new();
    for rule in per_stack {
        match (rule.node, rule.function) {
            (Some(pattern), None) => {
                if by_pattern.len() <= pattern {
                    by_pattern.resize_with(pattern + 1, Vec::new);
                }
                by_pattern[pattern].push(rule.sum);
            }
            _ => checked.push(rule),
        }
    }
    // How many frames of each rule function are on the current stack.
    let mut on_stack = vec![0u32; functions.len()];
    let mut hits = Vec::new();
    let mut pending = vec![Step::Enter(tree.root())];
    while let Some(step) = pending.pop() {
        let node = match step {
            Step::Exit(node) => {
                if let Some(slot) = node.frame().and_then(|f| functions.get(f)) {
                    on_stack[slot] -= 1;
                }
                matcher.pop();
                continue;
            }
            Step::Enter(node) => node,
        };
        if let Some(frame) = node.frame() {
            matcher.push(frame, node.name())?;
            if let Some(slot) = functions.get(frame) {
                on_stack[slot] += 1;
            }
            pending.push(Step::Exit(node));
        }
        let value = node.self_value();
        if value > 0 {
            if needs_regex {
                matcher.matches(&mut hits)?;
            }
            for (word, &bits) in hits.iter().enumerate() {
                let mut bits = bits;
                while bits != 0 {
                    let pattern = word * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    for &sum in by_pattern.get(pattern).into_iter().flatten() {
                        sums[sum] = sums[sum].saturating_add(value);
                    }
                }
            }
            for rule in &checked {
                let node_ok = rule
                    .node
                    .is_none_or(|j| hits.get(j / 64).is_some_and(|w| w & (1 << (j % 64)) != 0));
                let function_ok = rule.function.is_none_or(|slot| on_stack[slot] > 0);
                if node_ok && function_ok {
                    sums[rule.sum] = sums[rule.sum].saturating_add(value);
                }
            }
        }
        pending.extend(node.children().map(Step::Enter));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;
    use crate::ProfileMeta;
    use crate::rules::{Counters, Rule, RuleSpec};

    fn rule(name: &str, expr: &str, node: &str, function: &str, group_by: &[&str]) -> Arc<Rule> {
        let spec = RuleSpec {
            expr: expr.to_owned(),
            node: node.to_owned(),
            function: function.to_owned(),
            group_by: group_by.iter().map(|s| s.to_string()).collect(),
        };
        Arc::new(Rule::new(name, spec).unwrap())
    }

    fn profile(series: &str, rate: u32, units: &str, stacks: &[(&str, u64)]) -> Profile {
        let mut tree = Tree::new();
        for (stack, value) in stacks {
            tree.insert_names(stack.split(';'), *value);
        }
        Profile {
            series: series.parse().unwrap(),
            meta: ProfileMeta {
                sample_rate: rate,
                units: units.to_owned(),
                ..ProfileMeta::default()
            },
            from: UNIX_EPOCH,
            until: UNIX_EPOCH,
            tree,
        }
    }

    const STACKS: &[(&str, u64)] = &[
        ("main;slowFunction;work", 300),
        ("main;slowFunction", 100),
        ("main;fastFunction;work", 50),
        ("main;handler;slowFunction;slowFunction", 7),
        ("other;mainly", 3),
    ];

    #[test]
    fn node_regexes_are_unanchored_and_count_each_stack_once() {
        let set = RuleSet::new([
            rule("all", "", "total", "", &[]),
            rule("slow", "", "slowFunction", "", &[]),
            rule("call", "", "main;slowFunction", "", &[]),
            rule("anchored", "", "^main;slowFunction$", "", &[]),
            rule("leaf_work", "", "work$", "", &[]),
        ])
        .unwrap();
        let inc = set.evaluate(&profile("app.cpu{}", 100, "samples", STACKS));
        assert_eq!(inc.total("all"), 4.6);
        assert_eq!(inc.total("slow"), 4.07);
        assert_eq!(inc.total("call"), 4.0);
        assert_eq!(inc.total("anchored"), 1.0);
        assert_eq!(inc.total("leaf_work"), 3.5);
    }

    #[test]
    fn unicode_word_boundaries_next_to_non_ascii_fall_back_to_the_regex_set() {
        let set = RuleSet::new([
            rule("word", "", r"\bb\b", "", &[]),
            rule("end", "", "b$", "", &[]),
        ])
        .unwrap();
        assert!(set.automaton.is_some());
        let p = profile(
            "app.cpu{}",
            0,
            "objects",
            &[("ä;b", 1), ("äb;c", 2), ("a;b", 4), ("b;x", 8)],
        );
        let inc = set.evaluate(&p);
        assert_eq!(inc.total("word"), 13.0);
        assert_eq!(inc.total("end"), 5.0);
    }

    #[test]
    fn functions_match_exact_frames_once_per_stack() {
        let set = RuleSet::new([
            rule("slow", "", "", "slowFunction", &[]),
            rule("slow_in_handler", "", "handler", "slowFunction", &[]),
            rule("missing", "", "", "nowhere", &[]),
            rule("prefix_is_not_enough", "", "", "main", &[]),
        ])
        .unwrap();
        let inc = set.evaluate(&profile("app.alloc_space{}", 0, "bytes", STACKS));
        assert_eq!(
            inc.total("slow"),
            407.0,
            "raw bytes, the recursive stack once"
        );
        assert_eq!(inc.total("slow_in_handler"), 7.0);
        assert_eq!(inc.total("missing"), 0.0);
        assert_eq!(
            inc.total("prefix_is_not_enough"),
            457.0,
            "mainly is not main"
        );
    }

    #[test]
    fn selectors_pick_series_and_group_by_keeps_labels() {
        let set = RuleSet::new([
            rule("prod", "app.cpu{env=\"prod\"}", "slowFunction", "", &[]),
            rule("by_env", "app.cpu", "slowFunction", "", &["env", "region"]),
        ])
        .unwrap();
        let mut counters = Counters::new(&set);
        for series in [
            "app.cpu{env=prod}",
            "app.cpu{env=staging}",
            "other.cpu{env=prod}",
        ] {
            counters.apply(set.evaluate(&profile(series, 100, "samples", STACKS)));
        }
        assert_eq!(counters.get("prod", &[]), Some(4.07));
        assert_eq!(counters.get("by_env", &["prod", ""]), Some(4.07));
        assert_eq!(counters.get("by_env", &["staging", ""]), Some(4.07));
        assert_eq!(
            counters.render(),
            "# HELP by_env Recorded from profiles: expr app.cpu, node slowFunction\n\
             # TYPE by_env counter\n\
             by_env{env=\"prod\"} 4.07\n\
             by_env{env=\"staging\"} 4.07\n\
             # HELP prod Recorded from profiles: expr app.cpu{env=\"prod\"}, node slowFunction\n\
             # TYPE prod counter\n\
             prod 4.07\n"
        );
    }

    #[test]
    fn extra_labels_come_first_and_rename_a_group_by_label_of_their_name() {
        let set = RuleSet::new([rule("t", "app.cpu", "", "", &["tenant", "env"])]).unwrap();
        let mut counters = Counters::new(&set);
        counters.apply(set.evaluate(&profile(
            "app.cpu{tenant=forged,env=prod}",
            100,
            "samples",
            &[("f", 1)],
        )));
        let text = counters.render_with(&[("tenant", "team-a")]);
        assert!(
            text.contains("\nt{tenant=\"team-a\",exported_tenant=\"forged\",env=\"prod\"} 0.01\n"),
            "{text}"
        );
        assert!(
            counters
                .render()
                .contains("\nt{tenant=\"forged\",env=\"prod\"} 0.01\n")
        );
    }

    #[test]
    fn off_cpu_nanoseconds_export_as_seconds_and_bytes_as_bytes() {
        let set = RuleSet::new([
            rule("waits", "app.off_cpu", "", "", &[]),
            rule("growth", "app.memory_growth", "", "", &[]),
        ])
        .unwrap();
        let mut counters = Counters::new(&set);
        counters.apply(set.evaluate(&profile(
            "app.off_cpu",
            0,
            "nanoseconds",
            &[
                ("main;nap;nanosleep", 1_500_000_000),
                ("main;poll", 500_000_000),
            ],
        )));
        counters.apply(set.evaluate(&profile(
            "app.memory_growth",
            0,
            "bytes",
            &[("main;touch", 4096)],
        )));
        assert_eq!(counters.get("waits", &[]), Some(2.0));
        assert_eq!(counters.get("growth", &[]), Some(4096.0));
    }

    #[test]
    fn changed_rules_restart_and_stale_increments_are_dropped() {
        let old = RuleSet::new([rule("a", "", "", "", &[]), rule("b", "", "", "", &[])]).unwrap();
        let mut counters = Counters::new(&old);
        let p = profile("app.cpu{}", 100, "samples", STACKS);
        counters.apply(old.evaluate(&p));
        let pending = old.evaluate(&p);
        let kept = old.get("a").unwrap().clone();
        let new = RuleSet::new([kept, rule("b", "", "slow", "", &[])]).unwrap();
        counters.sync(&new);
        assert_eq!(counters.get("b", &[]), Some(0.0));
        let applied = counters.apply(pending);
        assert_eq!((applied.added, applied.stale), (1, 1));
        assert_eq!(counters.get("a", &[]), Some(9.2));
    }

    #[test]
    fn label_values_are_escaped_and_series_are_capped() {
        let set = RuleSet::new([rule("a", "", "", "", &["v"])]).unwrap();
        let mut counters = Counters::new(&set);
        counters.apply(set.evaluate(&profile(
            "app.cpu{v=\"x\\\"y\\\\z\"}",
            0,
            "objects",
            &[("f", 2)],
        )));
        assert!(
            counters.render().contains("a{v=\"x\\\"y\\\\z\"} 2\n"),
            "{}",
            counters.render()
        );
        for i in 0..crate::rules::MAX_SERIES_PER_RULE + 5 {
            let applied = counters.apply(set.evaluate(&profile(
                &format!("app.cpu{{v=n{i}}}"),
                0,
                "objects",
                &[("f", 1)],
            )));
            assert_eq!(
                applied.over_limit,
                usize::from(i + 1 >= crate::rules::MAX_SERIES_PER_RULE)
            );
        }
        assert_eq!(counters.series(), crate::rules::MAX_SERIES_PER_RULE);
    }
}
