//! Properties of the folded and lines text formats: stable round trips, exact totals, and no
//! panics whatever the body.

use proptest::prelude::*;
use smolder_common::folded::{to_lines, write_folded};
use smolder_common::{
    FoldedFormat, FoldedLimits, Tree, parse_folded, parse_folded_into, to_folded,
};

use crate::util::{alphabet_tree, any_tree, stacks, tree_from};

fn folded(body: &[u8]) -> Result<Tree, smolder_common::FoldedError> {
    parse_folded(body, FoldedFormat::Folded, &FoldedLimits::default())
}

fn lines(body: &[u8]) -> Result<Tree, smolder_common::FoldedError> {
    parse_folded(body, FoldedFormat::Lines, &FoldedLimits::default())
}

/// A valid folded line: frames that may be empty or hold spaces and `\r`, an optional trailing
/// `;`, a count, an optional `\r`.
fn folded_line() -> impl Strategy<Value = (String, u64)> {
    let frame = prop_oneof![
        Just(String::new()),
        "[a-c]{1,3}",
        "[a-c ]{1,4}",
        "[a\\r]{1,2}",
        "[é漢]{1,2}",
    ];
    (
        prop::collection::vec(frame, 1..6),
        any::<bool>(),
        prop_oneof![0u64..100, Just(u64::MAX / 8)],
        any::<bool>(),
    )
        .prop_map(|(frames, trailing, count, cr)| {
            let mut line = frames.join(";");
            if trailing || line.is_empty() {
                line.push(';');
            }
            let cr = if cr { "\r" } else { "" };
            (format!("{line} {count}{cr}\n"), count)
        })
}

/// Bodies that are mostly valid folded text with awkward frames (spaces, `\r`, empty frames,
/// trailing `;`) and now and then a line that is not.
fn near_folded_body() -> impl Strategy<Value = String> {
    let line = prop_oneof![
        9 => "[a-c; \\r]{0,12} [0-9]{1,3}\\r?",
        1 => "[a-c; 0-9-]{0,8}",
    ];
    prop::collection::vec(line, 0..12).prop_map(|lines| lines.join("\n"))
}

/// Bytes that are mostly the characters the format cares about.
fn hostile_bytes() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        4 => prop::sample::select(&b"ab;; \n\r0123456789-+"[..]),
        1 => any::<u8>(),
        1 => prop::sample::select(&[0xc3u8, 0xa9, 0xff, 0x80][..]),
    ];
    prop::collection::vec(byte, 0..300)
}

proptest! {
    #[test]
    fn parse_emit_parse_is_stable(body in near_folded_body()) {
        if let Ok(tree) = folded(body.as_bytes()) {
            let text = to_folded(&tree);
            let again = folded(text.as_bytes()).expect("emitted text parses");
            prop_assert_eq!(&again, &tree);
            prop_assert_eq!(to_folded(&again), text);
        }
    }

    #[test]
    fn generated_lines_parse_and_sum(lines_and_counts in prop::collection::vec(folded_line(), 0..30)) {
        let body: String = lines_and_counts.iter().map(|(line, _)| line.as_str()).collect();
        let tree = folded(body.as_bytes()).expect("generated lines are valid");
        let sum = lines_and_counts.iter().fold(0u64, |sum, (_, count)| sum.saturating_add(*count));
        prop_assert_eq!(tree.total(), sum);
        let again = folded(to_folded(&tree).as_bytes()).expect("emitted text parses");
        prop_assert_eq!(again, tree);
    }

    #[test]
    fn emit_parse_emit_is_stable(tree in any_tree()) {
        let text = to_folded(&tree);
        let parsed = folded(text.as_bytes()).expect("emitted text parses");
        prop_assert_eq!(to_folded(&parsed), text);
    }

    #[test]
    fn trees_without_root_self_round_trip(stacks in stacks(1)) {
        let tree = tree_from(&stacks);
        let mut bytes = Vec::new();
        write_folded(&tree, &mut bytes).expect("writing to a Vec");
        prop_assert_eq!(folded(&bytes).expect("emitted text parses"), tree);
    }

    #[test]
    fn lines_round_trip_small_trees(stacks in stacks(1)) {
        let small: Vec<_> = stacks.into_iter().map(|(s, v)| (s, v % 4)).collect();
        let tree = tree_from(&small);
        prop_assert_eq!(lines(to_lines(&tree).as_bytes()).expect("emitted lines parse"), tree);
    }

    #[test]
    fn lines_count_equals_non_empty_lines(body in "[a-c; \\r\\n]{0,200}") {
        let tree = lines(body.as_bytes()).expect("any short UTF-8 is a valid lines body");
        let expected = body
            .split('\n')
            .filter(|line| !line.strip_suffix('\r').unwrap_or(line).is_empty())
            .count() as u64;
        prop_assert_eq!(tree.total(), expected);
    }

    #[test]
    fn parsing_never_panics(body in hostile_bytes()) {
        let _ = folded(&body);
        let _ = lines(&body);
        let tight = FoldedLimits { max_line_bytes: 8 };
        let _ = parse_folded(&body, FoldedFormat::Folded, &tight);
    }

    #[test]
    fn parsing_arbitrary_bytes_never_panics(body in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = folded(&body);
        let _ = lines(&body);
    }

    #[test]
    fn parse_into_merges_bodies_or_changes_nothing(
        start in alphabet_tree(),
        first in "[a-c; \\n0-9]{0,60}",
        second in "[a-c; \\n0-9]{0,60}",
    ) {
        let mut tree = start.clone();
        let format = FoldedFormat::Folded;
        let limits = FoldedLimits::default();
        match parse_folded_into(&mut tree, first.as_bytes(), format, &limits) {
            Ok(()) => {
                let mut expected = start.clone();
                expected.merge(&folded(first.as_bytes()).expect("parsed into a tree"));
                prop_assert_eq!(&tree, &expected);
            }
            Err(e) => {
                prop_assert_eq!(folded(first.as_bytes()).unwrap_err(), e);
                prop_assert_eq!(&tree, &start);
            }
        }
        let before = tree.clone();
        let joined = format!("{first}\n{second}");
        if parse_folded_into(&mut tree, second.as_bytes(), format, &limits).is_ok()
            && folded(first.as_bytes()).is_ok()
        {
            let mut expected = start;
            expected.merge(&folded(joined.as_bytes()).expect("both halves parse"));
            prop_assert_eq!(tree, expected);
        } else if folded(second.as_bytes()).is_err() {
            prop_assert_eq!(tree, before);
        }
    }
}
