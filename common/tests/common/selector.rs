//! Properties of FlameQL selectors: display round trips, a parser that never panics, and matching.

use proptest::prelude::*;
use smolder_common::{MatchOp, Matcher, Selector};

use crate::series::{app_name, label_name, series};

fn op() -> impl Strategy<Value = MatchOp> {
    prop_oneof![
        Just(MatchOp::Equal),
        Just(MatchOp::NotEqual),
        Just(MatchOp::Regex),
        Just(MatchOp::NotRegex),
    ]
}

/// A value for `op`: any string for equality, a valid regex for the regex operators.
fn value_for(op: MatchOp) -> BoxedStrategy<String> {
    if op.is_regex() {
        prop_oneof![
            any::<String>().prop_map(|s| regex::escape(&s)),
            Just(r"1\..*".to_owned()),
            Just("prod|stage".to_owned()),
            Just(r#"[a-z]+"\d*"#.to_owned()),
        ]
        .boxed()
    } else {
        prop_oneof![r#"[a-z0-9 ,{}="\\\n\t]{0,12}"#, any::<String>()].boxed()
    }
}

fn matcher() -> impl Strategy<Value = Matcher> {
    (label_name(), op())
        .prop_flat_map(|(name, op)| (Just(name), Just(op), value_for(op)))
        .prop_map(|(name, op, value)| {
            Matcher::new(name, op, value).expect("generated matchers are valid")
        })
}

fn selector() -> impl Strategy<Value = Selector> {
    (app_name(), prop::collection::vec(matcher(), 0..5)).prop_map(|(app, matchers)| {
        Selector::new(app, matchers).expect("generated app names are valid")
    })
}

proptest! {
    #[test]
    fn display_round_trips(selector in selector()) {
        let text = selector.to_string();
        prop_assert_eq!(Selector::parse(&text), Ok(selector), "{}", text);
    }

    #[test]
    fn parse_never_panics(input in any::<String>()) {
        let _ = Selector::parse(&input);
    }

    #[test]
    fn parse_never_panics_on_query_like_input(
        input in r#"[a-z.]{0,4}[{}=!~, "\\a-z_.()*|é]{0,24}"#
    ) {
        if let Err(err) = Selector::parse(&input) {
            prop_assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn own_labels_select_the_series(series in series(), keep in any::<u64>()) {
        // Any subset of the series' labels, as `=` matchers, selects it.
        let matchers = series
            .labels()
            .iter()
            .enumerate()
            .filter(|(i, _)| keep >> (i % 64) & 1 == 1)
            .map(|(_, (name, value))| {
                Matcher::new(name, MatchOp::Equal, value).expect("series labels are valid")
            })
            .collect();
        let selector = Selector::new(series.app(), matchers).expect("series apps are valid");
        prop_assert!(selector.matches(&series), "{} vs {}", selector, series);
        let reparsed = Selector::parse(&selector.to_string()).expect("display parses");
        prop_assert!(reparsed.matches(&series));
    }

    #[test]
    fn negated_matchers_are_complements(series in series(), m in matcher()) {
        let negated = match m.op() {
            MatchOp::Equal => MatchOp::NotEqual,
            MatchOp::NotEqual => MatchOp::Equal,
            MatchOp::Regex => MatchOp::NotRegex,
            MatchOp::NotRegex => MatchOp::Regex,
        };
        let n = Matcher::new(m.name(), negated, m.value()).expect("same name and value");
        let a = Selector::new(series.app(), vec![m]).expect("valid app");
        let b = Selector::new(series.app(), vec![n]).expect("valid app");
        prop_assert_ne!(a.matches(&series), b.matches(&series));
    }
}
