//! Properties of series names: display round trips and a parser that never panics.

use proptest::prelude::*;
use smolder_common::{Labels, Series};

/// Any valid app name.
pub(crate) fn app_name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_.-]{1,24}"
}

/// Any valid label name except the reserved `__name__`.
pub(crate) fn label_name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_.]{1,16}".prop_filter("__name__ is the app name", |n| n != "__name__")
}

/// Label values: mostly plain, sometimes with the characters that force quoting.
fn label_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9._/-]{0,12}",
        r#"[ a-z,}{="\\\n\t]{0,12}"#,
        any::<String>(),
    ]
}

/// Any valid series.
pub(crate) fn series() -> impl Strategy<Value = Series> {
    (
        app_name(),
        prop::collection::btree_map(label_name(), label_value(), 0..6),
    )
        .prop_map(|(app, pairs)| {
            let labels = Labels::from_pairs(pairs).expect("generated names are valid and unique");
            Series::new(app, labels).expect("generated app names are valid")
        })
}

proptest! {
    #[test]
    fn display_round_trips(series in series()) {
        let text = series.to_string();
        prop_assert_eq!(Series::parse(&text), Ok(series), "{}", text);
    }

    #[test]
    fn parse_never_panics(input in any::<String>()) {
        let _ = Series::parse(&input);
    }

    #[test]
    fn parse_never_panics_on_name_like_input(input in r#"[a-z.]{0,4}[{}=, "\\a-z_.!é]{0,24}"#) {
        if let Err(err) = Series::parse(&input) {
            // Every error renders to a message.
            prop_assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn labels_stay_sorted(pairs in prop::collection::vec((label_name(), label_value()), 0..8)) {
        let mut labels = Labels::new();
        for (name, value) in pairs {
            labels.insert(name, value).expect("generated names are valid");
        }
        let names: Vec<&str> = labels.iter().map(|(n, _)| n).collect();
        prop_assert!(names.windows(2).all(|w| w[0] < w[1]));
        prop_assert!(labels.iter().all(|(_, v)| !v.is_empty()));
    }
}
