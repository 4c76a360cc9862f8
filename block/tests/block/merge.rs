//! Merged and downsampled blocks read as the sum of their inputs, each batch counted once.

use proptest::prelude::*;
use smolder_block::{
    BlockBuilder, Contribution, Fetched, Footer, Index, Limits, Marker, MergeError, MergeOptions,
    Tail, WriteError, downsample, merge, verify,
};
use smolder_common::{ProfileMeta, Tree};

use crate::util::{Batch, Mode, START, batches, build, expected, expected_range, read};

const SPAN: u64 = 10_000;

fn whole(finest: Option<u64>) -> MergeOptions {
    MergeOptions {
        start: START,
        span: SPAN,
        finest,
    }
}

/// One block per 1000 s range that holds data of `batches`.
fn cut(batches: &[&Batch]) -> Vec<Vec<u8>> {
    (0..10)
        .map(|i| START + i * 1_000)
        .filter(|start| {
            batches.iter().any(|b| {
                b.trees
                    .keys()
                    .any(|&(_, k)| (*start..start + 1_000).contains(&crate::util::bucket(k)))
            })
        })
        .map(|start| build(batches, start, 1_000))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Two aggregators' cuts, some batches stored by both (a retry after a lost ack), merged
    /// into one block: each batch once.
    #[test]
    fn merged_blocks_count_every_batch_once(
        batches in batches(1_000, 16),
        placement in prop::collection::vec(0u8..3, 16),
        range in (0u64..SPAN, 0u64..SPAN),
    ) {
        // 0: the first aggregator, 1: the second, 2: both (separable batches only).
        let place = |i: usize, b: &Batch| match placement[i % placement.len()] {
            2 if matches!(b.mode, Mode::Separable | Mode::Twice) => 2,
            2 => 0,
            p => p,
        };
        let first: Vec<&Batch> = batches.iter().enumerate().filter(|(i, b)| place(*i, b) != 1).map(|(_, b)| b).collect();
        let second: Vec<&Batch> = batches.iter().enumerate().filter(|(i, b)| place(*i, b) >= 1).map(|(_, b)| b).collect();
        let mut blocks = cut(&first);
        blocks.extend(cut(&second));
        let inputs: Vec<&[u8]> = blocks.iter().map(Vec::as_slice).collect();
        let (merged, _) = merge(&inputs, whole(None), &Limits::default()).expect("merges");
        verify(&merged, &Limits::default()).expect("the merged block verifies");
        let sums = expected(&batches);
        let (from, until) = (START + range.0.min(range.1), START + range.0.max(range.1) + 1);
        for s in 0..3 {
            prop_assert_eq!(read(&merged, s, START, START + SPAN), expected_range(&sums, s, START, START + SPAN, 10));
            prop_assert_eq!(read(&merged, s, from, until), expected_range(&sums, s, from, until, 10));
        }
    }

    /// Merging in two steps (each aggregator's cuts, then the results) equals merging at once.
    #[test]
    fn merging_in_steps_equals_merging_at_once(batches in batches(1_000, 12), split in 0usize..12) {
        let a: Vec<&Batch> = batches.iter().take(split).collect();
        let b: Vec<&Batch> = batches.iter().skip(split).collect();
        let limits = Limits::default();
        let step = |batches: &[&Batch]| {
            let blocks = cut(batches);
            let inputs: Vec<&[u8]> = blocks.iter().map(Vec::as_slice).collect();
            (!inputs.is_empty()).then(|| merge(&inputs, whole(None), &limits).expect("merges").0)
        };
        let parts: Vec<Vec<u8>> = [step(&a), step(&b)].into_iter().flatten().collect();
        let inputs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let (twice, _) = merge(&inputs, whole(None), &limits).expect("merges");
        let all: Vec<&Batch> = batches.iter().collect();
        let once = step(&all).expect("some data");
        for s in 0..3 {
            prop_assert_eq!(read(&twice, s, START, START + SPAN), read(&once, s, START, START + SPAN));
        }
        let index = |block: &[u8]| {
            let fetched = Fetched::whole(block);
            let tail = Tail::decode(block.len() as u64, &fetched).unwrap();
            let footer = Footer::decode(&tail, &fetched).unwrap();
            Index::decode(&footer, &fetched, &limits).unwrap()
        };
        let (twice, once) = (index(&twice), index(&once));
        prop_assert_eq!(twice.meta().compactions, 2);
        prop_assert_eq!(twice.markers(), once.markers());
    }

    /// Downsampled blocks read as the sum at their coarser resolution.
    #[test]
    fn downsampling_keeps_the_sums(batches in batches(1_000, 12), finest in prop_oneof![Just(100u64), Just(1_000)]) {
        let all: Vec<&Batch> = batches.iter().collect();
        let block = build(&all, START, SPAN);
        let (small, _) = downsample(&block, finest, &Limits::default()).expect("downsamples");
        verify(&small, &Limits::default()).expect("verifies");
        let sums = expected(&batches);
        for s in 0..3 {
            for (from, until) in [(START, START + SPAN), (START + 250, START + 4_321)] {
                prop_assert_eq!(read(&small, s, from, until), expected_range(&sums, s, from, until, finest));
            }
        }
    }
}

fn batch_block(start: u64, sequence: u64, separable: bool, value: u64) -> Vec<u8> {
    let mut builder = BlockBuilder::new("anonymous", start, 1_000, 10).unwrap();
    let mut tree = Tree::new();
    tree.insert_names(["main", "work"], value);
    let marker = Marker {
        agent_id: "host-1".into(),
        sequence,
    };
    let contribution = match separable {
        true => Contribution::batch(marker, 1),
        false => Contribution::merged(vec![marker], 1),
    };
    builder
        .add(
            &crate::util::series(0),
            &ProfileMeta::default(),
            start + 10,
            &tree,
            contribution,
        )
        .unwrap();
    builder.finish().unwrap().0
}

#[test]
fn a_late_copy_of_a_compacted_batch_is_dropped() {
    let limits = Limits::default();
    let cut = batch_block(START, 1, true, 5);
    let (compacted, _) = merge(&[&cut], whole(None), &limits).unwrap();
    // The same batch again, hours later, from another aggregator or a repeated cut.
    let late = batch_block(START, 1, true, 5);
    let (again, report) = merge(&[&compacted, &late], whole(None), &limits).unwrap();
    assert_eq!(report.duplicates, 1);
    assert_eq!(read(&again, 0, START, START + SPAN).total(), 5);
    // A new batch in the same bucket is added.
    let other = batch_block(START, 2, true, 3);
    let (more, report) = merge(&[&again, &other], whole(None), &limits).unwrap();
    assert_eq!(report.duplicates, 0);
    assert_eq!(read(&more, 0, START, START + SPAN).total(), 8);
}

#[test]
fn a_batch_summed_into_two_blocks_is_refused_not_counted_twice() {
    let limits = Limits::default();
    let a = batch_block(START, 1, false, 5);
    let b = batch_block(START, 1, false, 5);
    let err = merge(&[&a, &b], whole(None), &limits).unwrap_err();
    assert!(matches!(
        err,
        MergeError::Write(WriteError::InseparableDuplicate { sequence: 1, .. })
    ));
    assert!(
        err.to_string().contains("writing the merged block"),
        "{err}"
    );
    // In different buckets the same batch is data split at a range boundary, not a copy.
    let c = batch_block(START + 1_000, 1, false, 5);
    let (merged, _) = merge(&[&a, &c], whole(None), &limits).unwrap();
    assert_eq!(read(&merged, 0, START, START + SPAN).total(), 10);
}

#[test]
fn merges_refuse_inputs_that_do_not_fit() {
    let limits = Limits::default();
    let a = batch_block(START, 1, true, 5);
    let outside = MergeOptions {
        start: START + SPAN,
        span: SPAN,
        finest: None,
    };
    assert!(matches!(
        merge(&[&a], outside, &limits),
        Err(MergeError::DoesNotFit {
            reason: "range",
            ..
        })
    ));
    assert!(matches!(
        merge(&[], whole(None), &limits),
        Err(MergeError::NoInputs)
    ));
    let mut other = BlockBuilder::new("tenant-b", START, 1_000, 10).unwrap();
    other.add_marker(Marker {
        agent_id: "x".into(),
        sequence: 1,
    });
    let other = other.finish().unwrap().0;
    assert!(matches!(
        merge(&[&a, &other], whole(None), &limits),
        Err(MergeError::TenantMismatch { input: 1, .. })
    ));
    assert!(matches!(
        merge(&[&a], whole(Some(30)), &limits),
        Err(MergeError::Write(WriteError::BadLevels { .. }))
    ));
}

#[test]
fn a_coarser_input_sets_the_output_resolution() {
    let limits = Limits::default();
    let fine = batch_block(START, 1, true, 5);
    let (coarse, _) = downsample(&batch_block(START, 2, true, 3), 100, &limits).unwrap();
    let (merged, _) = merge(&[&fine, &coarse], whole(None), &limits).unwrap();
    let fetched = Fetched::whole(&merged);
    let tail = Tail::decode(merged.len() as u64, &fetched).unwrap();
    let footer = Footer::decode(&tail, &fetched).unwrap();
    let index = Index::decode(&footer, &fetched, &limits).unwrap();
    assert_eq!(index.meta().levels, [100, 1_000, 10_000]);
    assert_eq!(read(&merged, 0, START, START + 100).total(), 8);
}

/// A merged block names the blocks it replaces, and leaves out the series it is told to drop.
#[test]
fn a_merged_block_lists_its_sources_and_drops_deleted_series() {
    let limits = Limits::default();
    let mut tree = Tree::new();
    tree.insert_names(["main", "work"], 5);
    let mut blocks = Vec::new();
    for (i, app) in ["keep.cpu", "gone.cpu"].into_iter().enumerate() {
        let mut builder =
            BlockBuilder::new("anonymous", START + i as u64 * 1_000, 1_000, 10).unwrap();
        let series = smolder_common::Series::parse(app).unwrap();
        let marker = Marker {
            agent_id: "a".into(),
            sequence: i as u64,
        };
        builder
            .add(
                &series,
                &ProfileMeta::default(),
                START + i as u64 * 1_000,
                &tree,
                Contribution::batch(marker, 1),
            )
            .unwrap();
        blocks.push(builder.finish().unwrap().0);
    }
    let inputs: Vec<smolder_block::MergeInput> = blocks
        .iter()
        .map(|b| {
            smolder_block::MergeInput::decode(b.len() as u64, &Fetched::whole(b), &limits).unwrap()
        })
        .collect();
    let mut merger = smolder_block::Merger::new(inputs, whole(None), limits).unwrap();
    merger.set_sources(vec!["b2".into(), "b1".into(), "b1".into()]);
    merger.drop_series(|input, series| input == 1 && series.app() == "gone.cpu");
    assert_eq!(merger.series_count(), 1);
    let mut out = Vec::new();
    let chunks: Vec<Fetched<'_>> = merger
        .chunk_ranges(0)
        .into_iter()
        .map(|(i, _)| Fetched::whole(&blocks[i]))
        .collect();
    merger.merge_series(0, &chunks).unwrap();
    out.extend(merger.take_output());
    out.extend(merger.finish().unwrap().0);
    let report = verify(&out, &limits).unwrap();
    assert_eq!((report.series, report.sources), (1, 2));
    let fetched = Fetched::whole(&out);
    let tail = Tail::decode(out.len() as u64, &fetched).unwrap();
    let footer = Footer::decode(&tail, &fetched).unwrap();
    assert_eq!(footer.sources(&fetched, &limits).unwrap(), ["b1", "b2"]);
    let index = Index::decode(&footer, &fetched, &limits).unwrap();
    assert_eq!(index.series()[0].series.app(), "keep.cpu");
    // A block without sources has no such section.
    let tail = Tail::decode(blocks[0].len() as u64, &Fetched::whole(&blocks[0])).unwrap();
    let footer = Footer::decode(&tail, &Fetched::whole(&blocks[0])).unwrap();
    assert!(footer.sources_range().is_none());
}
