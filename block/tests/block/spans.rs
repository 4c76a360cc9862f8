//! Span profiles in blocks: each span's tree reads back as the sum of what its samples put in,
//! each batch once, through cuts, merges and downsampling.

use proptest::prelude::*;
use smolder_block::{
    BlockBuilder, Contribution, Limits, Marker, MergeOptions, downsample, merge, verify,
};
use smolder_common::{ProfileMeta, SpanId, SpanTrees, Tree};

use crate::util::{
    Batch, START, all_spans, batches, build, expected_span_range, expected_spans, read, read_spans,
    series,
};

const SPAN: u64 = 10_000;

/// One span, and every span.
fn selections() -> Vec<Vec<SpanId>> {
    let all = all_spans();
    vec![vec![all[0]], vec![all[1], all[3]], all]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A cut block: every selection of spans over any range reads as its spans' samples, each
    /// batch once (a retried batch's copy is dropped with its spans).
    #[test]
    fn span_trees_read_back_from_a_cut(
        batches in batches(100, 12),
        range in (0u64..1_000, 0u64..1_000),
    ) {
        let all: Vec<&Batch> = batches.iter().collect();
        let block = build(&all, START, 1_000);
        let report = verify(&block, &Limits::default()).expect("verifies");
        let sums = expected_spans(&batches);
        let (from, until) = (START + range.0.min(range.1), START + range.0.max(range.1) + 1);
        for s in 0..3 {
            for wanted in selections() {
                prop_assert_eq!(
                    read_spans(&block, s, (START, START + 1_000), &wanted),
                    expected_span_range(&sums, s, (START, START + 1_000), 10, &wanted)
                );
                prop_assert_eq!(
                    read_spans(&block, s, (from, until), &wanted),
                    expected_span_range(&sums, s, (from, until), 10, &wanted)
                );
            }
        }
        let any = sums.values().any(|spans| !spans.is_empty());
        prop_assert_eq!(report.spans > 0, any);
    }

    /// Merged from overlapping cuts (some batches in both) and downsampled: the spans are those
    /// of the trees kept, at the output's resolution.
    #[test]
    fn span_trees_survive_merges_and_downsampling(
        batches in batches(1_000, 12),
        placement in prop::collection::vec(0u8..3, 12),
        finest in prop_oneof![Just(10u64), Just(100), Just(1_000)],
    ) {
        let place = |i: usize, b: &Batch| match placement[i % placement.len()] {
            2 if matches!(b.mode, crate::util::Mode::Separable | crate::util::Mode::Twice) => 2,
            2 => 0,
            p => p,
        };
        let first: Vec<&Batch> = batches.iter().enumerate().filter(|(i, b)| place(*i, b) != 1).map(|(_, b)| b).collect();
        let second: Vec<&Batch> = batches.iter().enumerate().filter(|(i, b)| place(*i, b) >= 1).map(|(_, b)| b).collect();
        let mut blocks = Vec::new();
        for batches in [&first, &second] {
            for start in (0..10).map(|i| START + i * 1_000) {
                blocks.push(build(batches, start, 1_000));
            }
        }
        let inputs: Vec<&[u8]> = blocks.iter().map(Vec::as_slice).collect();
        let options = MergeOptions { start: START, span: SPAN, finest: Some(finest) };
        let (merged, _) = merge(&inputs, options, &Limits::default()).expect("merges");
        verify(&merged, &Limits::default()).expect("verifies");
        let (small, _) = downsample(&merged, 1_000, &Limits::default()).expect("downsamples");
        verify(&small, &Limits::default()).expect("verifies");
        let sums = expected_spans(&batches);
        for s in 0..3 {
            for wanted in selections() {
                for (from, until) in [(START, START + SPAN), (START + 250, START + 4_321)] {
                    prop_assert_eq!(
                        read_spans(&merged, s, (from, until), &wanted),
                        expected_span_range(&sums, s, (from, until), finest, &wanted)
                    );
                    prop_assert_eq!(
                        read_spans(&small, s, (from, until), &wanted),
                        expected_span_range(&sums, s, (from, until), 1_000, &wanted)
                    );
                }
            }
        }
    }
}

/// A span's samples are part of its series' tree: reading the span gives that part only, and
/// the series' tree is the same as without span profiles.
#[test]
fn a_span_reads_its_own_stacks_and_trees_are_unchanged() {
    let limits = Limits::default();
    let mut tree = Tree::new();
    tree.insert_names(["main", "alpha_work"], 30);
    tree.insert_names(["main", "beta_work"], 20);
    tree.insert_names(["main", "idle"], 5);
    let (alpha, beta) = (
        SpanId::from_label("c0e0b0dbd40cdf14").unwrap(),
        SpanId::from_label("5a561accaab40cf2").unwrap(),
    );
    let mut spans = SpanTrees::new();
    spans
        .tree_mut(alpha)
        .insert_names(["main", "alpha_work"], 30);
    spans.tree_mut(beta).insert_names(["main", "beta_work"], 20);
    let marker = Marker {
        agent_id: "aggregator".into(),
        sequence: 1,
    };
    let build = |spans: &SpanTrees| {
        let mut builder = BlockBuilder::new("anonymous", START, 1_000, 10).unwrap();
        builder
            .add_with_spans(
                &series(0),
                &ProfileMeta::default(),
                START + 20,
                &tree,
                spans,
                Contribution::batch(marker.clone(), 1),
            )
            .unwrap();
        builder.finish().unwrap()
    };
    let (with, report) = build(&spans);
    let (without, _) = build(&SpanTrees::new());
    assert_eq!(report.spans, 2);
    assert_eq!(verify(&with, &limits).unwrap().spans, 2);
    assert_eq!(verify(&without, &limits).unwrap().spans, 0);
    let range = (START, START + 1_000);
    let folded = |tree: &Tree| smolder_common::to_folded(tree);
    assert_eq!(
        folded(&read_spans(&with, 0, range, &[alpha])),
        "main;alpha_work 30\n"
    );
    assert_eq!(
        folded(&read_spans(&with, 0, range, &[beta])),
        "main;beta_work 20\n"
    );
    assert_eq!(
        read_spans(&with, 0, (START + 30, START + 1_000), &[alpha]),
        Tree::new()
    );
    assert_eq!(read(&with, 0, START, START + 1_000), tree);
    assert_eq!(read(&without, 0, START, START + 1_000), tree);
    assert_eq!(read_spans(&without, 0, range, &[alpha]), Tree::new());
}

/// What span trees cost in a block, the figure OPERATIONS.md sizes with: 100 buckets of 1000
/// CPU samples over 200 stacks 20 frames deep, and per bucket `spans` spans of 1 to 3 samples
/// each (seeded, so the bytes are the same every run). Each span tree adds about 19 bytes,
/// mostly its random 8-byte id.
#[test]
fn a_span_tree_costs_about_twenty_bytes() {
    let start = START;
    let block = |spans_per_bucket: u64| {
        let mut builder = BlockBuilder::new("anonymous", start, 1_000, 10).unwrap();
        let mut state = 12_345u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let stack = |leaf: u64| -> Vec<String> {
            (0..20)
                .map(|depth| {
                    format!(
                        "frame_{depth}_{}",
                        if depth < 15 { leaf % 10 } else { leaf }
                    )
                })
                .collect()
        };
        for bucket in 0..100u64 {
            let mut tree = Tree::new();
            for _ in 0..1_000 {
                tree.insert_names(stack(next() % 200), 10_000_000);
            }
            let mut spans = SpanTrees::new();
            for s in 0..spans_per_bucket {
                let id = SpanId::from_bytes((next() | 1).to_be_bytes()).unwrap();
                for _ in 0..=s % 3 {
                    spans
                        .tree_mut(id)
                        .insert_names(stack(next() % 200), 10_000_000);
                }
            }
            let marker = Marker {
                agent_id: "aggregator".into(),
                sequence: bucket,
            };
            builder
                .add_with_spans(
                    &series(0),
                    &ProfileMeta::default(),
                    start + bucket * 10,
                    &tree,
                    &spans,
                    Contribution::batch(marker, 1),
                )
                .unwrap();
        }
        builder.finish().unwrap()
    };
    let (without, _) = block(0);
    for spans in [100, 1_000] {
        let (with, report) = block(spans);
        assert_eq!(report.spans, spans * 100);
        let per_span = (with.len() - without.len()) as f64 / report.spans as f64;
        assert!(
            (15.0..25.0).contains(&per_span),
            "{per_span} bytes per span tree"
        );
    }
}
