//! App deletions in blocks: a cut and a merge leave out a deleted app's buckets before the
//! deletion's horizon, spans included, keep the rest and every batch's marker, and list the
//! deletion for readers.

use smolder_block::{
    BlockBuilder, Contribution, Deletion, Fetched, Footer, Limits, Marker, MergeInput,
    MergeOptions, Merger, Tail, verify,
};
use smolder_common::{ProfileMeta, SpanId, SpanTrees, Tree};

use crate::util::{START, read, read_spans, series};

/// A one-stack tree of `value`.
fn stack(value: u64) -> Tree {
    let mut tree = Tree::new();
    tree.insert_names(["main", "work"], value);
    tree
}

fn marker(sequence: u64) -> Marker {
    Marker {
        agent_id: "agent".into(),
        sequence,
    }
}

/// A 1000 s block from `start` with, for series 0 (app `app.cpu`) and 2 (`other.alloc_space`),
/// a tree of `value` (with span 1) at each of `offsets`, one batch per tree, under `deletions`.
fn cut(start: u64, offsets: &[u64], value: u64, deletions: Vec<Deletion>) -> Vec<u8> {
    cut_batches(start, start, offsets, value, deletions)
}

/// As [`cut`], the batches' sequences counted from `sequences` (so that two blocks of one
/// range hold different batches).
fn cut_batches(
    start: u64,
    sequences: u64,
    offsets: &[u64],
    value: u64,
    deletions: Vec<Deletion>,
) -> Vec<u8> {
    let mut builder = BlockBuilder::new("anonymous", start, 1_000, 10).expect("levels");
    builder.set_deletions(deletions);
    let span = SpanId::from_bytes([1; 8]).expect("not zero");
    for (i, offset) in offsets.iter().enumerate() {
        for s in [0, 2] {
            let mut spans = SpanTrees::new();
            spans.add(span, &stack(value));
            builder
                .add_with_spans(
                    &series(s),
                    &ProfileMeta::default(),
                    start + offset,
                    &stack(value),
                    &spans,
                    Contribution::batch(marker(sequences + i as u64 * 10 + s as u64), 1),
                )
                .expect("in range");
        }
    }
    builder.finish().expect("writes").0
}

fn footer(block: &[u8]) -> (Footer, Vec<Deletion>) {
    let fetched = Fetched::whole(block);
    let tail = Tail::decode(block.len() as u64, &fetched).expect("tail");
    let footer = Footer::decode(&tail, &fetched).expect("footer");
    let deletions = footer
        .deletions(&fetched, &Limits::default())
        .expect("deletions");
    (footer, deletions)
}

/// `blocks` merged into `options`' range and resolution under `deletions`, trees then spans,
/// one series at a time, as a store's compaction does; the output verified.
fn merge(blocks: &[&[u8]], options: MergeOptions, deletions: Vec<Deletion>) -> Vec<u8> {
    let limits = Limits::default();
    let inputs = blocks
        .iter()
        .map(|b| MergeInput::decode(b.len() as u64, &Fetched::whole(b), &limits).expect("input"))
        .collect();
    let mut merger = Merger::new(inputs, options, limits).expect("plans");
    merger.set_deletions(deletions);
    let mut merged = Vec::new();
    for pass in 0..2 {
        for s in 0..merger.series_count() {
            let ranges = match pass {
                0 => merger.chunk_ranges(s),
                _ => merger.span_ranges(s),
            };
            let fetched: Vec<Fetched<'_>> = ranges
                .iter()
                .map(|(input, _)| Fetched::whole(blocks[*input]))
                .collect();
            match pass {
                0 => merger.merge_series(s, &fetched).expect("merges"),
                _ => merger.merge_spans(s, &fetched).expect("merges spans"),
            }
            merged.extend(merger.take_output());
        }
    }
    merged.extend(merger.finish().expect("finishes").0);
    verify(&merged, &limits).expect("verifies");
    merged
}

fn spans_total(block: &[u8], s: usize, from: u64, until: u64) -> u64 {
    let span = SpanId::from_bytes([1; 8]).expect("not zero");
    read_spans(block, s, (from, until), &[span]).total()
}

#[test]
fn a_cut_leaves_out_the_buckets_before_the_horizon_and_lists_the_deletion() {
    let horizon = START + 500;
    let deletions = vec![
        Deletion {
            app: "app.cpu".into(),
            horizon: START + 300,
        },
        // The later horizon of the same app wins.
        Deletion {
            app: "app.cpu".into(),
            horizon,
        },
    ];
    let block = cut(START, &[100, 490, 500, 900], 3, deletions);
    let report = verify(&block, &Limits::default()).expect("verifies");
    assert_eq!(report.deletions, 1);
    // Every batch is still known as stored.
    assert_eq!(report.markers, 8);
    let (footer, listed) = footer(&block);
    assert!(footer.deletions_range().is_some());
    assert_eq!(
        listed,
        [Deletion {
            app: "app.cpu".into(),
            horizon
        }]
    );
    assert!(listed[0].removes("app.cpu", horizon - 10));
    assert!(!listed[0].removes("app.cpu", horizon));
    assert!(!listed[0].removes("other.alloc_space", START));
    let end = START + 1_000;
    assert_eq!(read(&block, 0, START, end).total(), 6, "500 and 900 stay");
    assert_eq!(read(&block, 0, START, horizon).total(), 0);
    assert_eq!(
        read(&block, 2, START, end).total(),
        12,
        "another app stays whole"
    );
    assert_eq!(spans_total(&block, 0, START, end), 6);
    assert_eq!(spans_total(&block, 2, START, end), 12);

    // Without deletions, no section: what readers of any version read alike.
    let plain = cut(START, &[100], 3, Vec::new());
    let (footer, listed) = self::footer(&plain);
    assert!(footer.deletions_range().is_none());
    assert!(listed.is_empty());
}

#[test]
fn a_merge_applies_its_deletions_to_every_input_and_lists_them() {
    let horizon = START + 1_500;
    // One input cut before the deletion, one after it (listing it).
    let before = cut(START, &[100, 600], 2, Vec::new());
    let after = cut(
        START + 1_000,
        &[400, 500, 700],
        5,
        vec![Deletion {
            app: "app.cpu".into(),
            horizon,
        }],
    );
    let options = MergeOptions {
        start: START,
        span: 10_000,
        finest: None,
    };
    let deletions = vec![Deletion {
        app: "app.cpu".into(),
        horizon,
    }];
    let merged = merge(&[&before, &after], options, deletions);
    let limits = Limits::default();
    let report = verify(&merged, &limits).expect("verifies");
    assert_eq!(report.deletions, 1);
    assert_eq!(report.markers, 10, "the deleted batches are still known");
    let end = START + 10_000;
    assert_eq!(
        read(&merged, 0, START, end).total(),
        10,
        "only 1500 and 1700"
    );
    assert_eq!(read(&merged, 2, START, end).total(), 2 * 2 + 3 * 5);
    assert_eq!(spans_total(&merged, 0, START, end), 10);
    assert_eq!(spans_total(&merged, 2, START, end), 19);
    let (_, listed) = footer(&merged);
    assert_eq!(listed[0].horizon, horizon);
}

/// A block built with a deletion and downsampled has a bucket straddling the horizon that holds
/// only data stamped after it (the app went on pushing): merged again (late data, the 100 s to
/// 1000 s step) that data stays. A block built before the deletion and downsampled cannot tell
/// its data before the horizon from the rest in that bucket: it goes whole.
#[test]
fn a_downsampled_bucket_straddling_the_horizon_keeps_what_its_block_kept() {
    let horizon = START + 550;
    let deletion = |horizon| {
        vec![Deletion {
            app: "app.cpu".into(),
            horizon,
        }]
    };
    let thousand = |finest| MergeOptions {
        start: START,
        span: 1_000,
        finest,
    };
    let end = START + 1_000;
    // Cut with the deletion: 100 and 540 are gone, 560, 590 and 700 stay.
    let cut_with = cut(START, &[100, 540, 560, 590, 700], 3, deletion(horizon));
    assert_eq!(read(&cut_with, 0, START, end).total(), 9);
    // Downsampled to 100 s: the bucket from 500 holds 560 and 590, and starts before 550.
    let down = merge(&[&cut_with], thousand(Some(100)), deletion(horizon));
    assert_eq!(footer(&down).1, deletion(horizon), "lists the deletion");
    assert_eq!(read(&down, 0, START, end).total(), 9);
    assert_eq!(read(&down, 0, START + 500, START + 600).total(), 6);
    // Merged again with late data (cut with the deletion too), and downsampled to 1000 s.
    let late = cut_batches(START, START + 100, &[800], 4, deletion(horizon));
    let again = merge(&[&down, &late], thousand(None), deletion(horizon));
    assert_eq!(read(&again, 0, START, end).total(), 13);
    assert_eq!(spans_total(&again, 0, START, end), 13);
    assert_eq!(read(&again, 2, START, end).total(), 5 * 3 + 4);
    let coarse = merge(&[&again], thousand(Some(1_000)), deletion(horizon));
    assert_eq!(read(&coarse, 0, START, end).total(), 13);
    assert_eq!(spans_total(&coarse, 0, START, end), 13);
    // A later deletion still removes the straddling bucket of a block built with this one.
    let later = merge(&[&down], thousand(None), deletion(START + 600));
    assert_eq!(read(&later, 0, START, end).total(), 3, "only 700");

    // Built before the deletion and downsampled: the bucket from 500 holds 540 too, which
    // must not show, so it goes whole; the bucket from 700 and the other app stay.
    let cut_before = cut(START, &[540, 560, 700], 2, Vec::new());
    let down_before = merge(&[&cut_before], thousand(Some(100)), Vec::new());
    assert_eq!(read(&down_before, 0, START, end).total(), 6);
    let merged = merge(&[&down_before], thousand(None), deletion(horizon));
    assert_eq!(read(&merged, 0, START, end).total(), 2);
    assert_eq!(spans_total(&merged, 0, START, end), 2);
    assert_eq!(read(&merged, 2, START, end).total(), 6);
}
