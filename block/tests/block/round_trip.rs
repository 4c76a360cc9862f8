//! A built block reads back, over any range, as the sum of the trees put in, each batch once.

use proptest::prelude::*;
use smolder_block::{BlockBuilder, Fetched, Footer, Index, Limits, Tail, verify};
use smolder_common::{ProfileMeta, Series, Tree};

use crate::util::{
    Batch, Mode, START, batches, bucket, build, expected, expected_range, frame, read, series,
    span_of,
};

/// A caller's own shape of one series' trees, as the aggregator's head keeps one: nodes
/// numbered in the order stacks first reach them, not the block's order.
#[derive(Default)]
struct HeadShape {
    parents: Vec<u32>,
    names: Vec<String>,
    children: std::collections::HashMap<(u32, String), u32>,
}

impl HeadShape {
    /// The node at the end of `stack`, added as needed.
    fn node(&mut self, stack: &[u8]) -> u32 {
        if self.parents.is_empty() {
            self.parents.push(0);
            self.names.push(String::new());
        }
        let mut at = 0;
        for &f in stack {
            let name = frame(f);
            let next = self.parents.len() as u32;
            at = *self.children.entry((at, name.clone())).or_insert_with(|| {
                self.parents.push(at);
                self.names.push(name);
                next
            });
        }
        at
    }

    /// `stacks` (those `wanted` keeps, by index) as self values over its nodes, summed.
    fn values(
        &mut self,
        stacks: &[(Vec<u8>, u64)],
        wanted: impl Fn(usize) -> bool,
    ) -> Vec<(u32, u64)> {
        let mut values: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
        for (index, (stack, value)) in stacks.iter().enumerate() {
            if wanted(index) {
                *values.entry(self.node(stack)).or_default() += value;
            }
        }
        values.into_iter().collect()
    }
}

impl smolder_block::ShapeSource for HeadShape {
    fn parent(&self, node: u32) -> u32 {
        self.parents[node as usize]
    }

    fn name(&self, node: u32) -> &str {
        &self.names[node as usize]
    }
}

/// [`build`], with every tree and span tree given to [`BlockBuilder::add_values`] as values over
/// a shape per series.
fn build_from_values(batches: &[Batch]) -> Vec<u8> {
    let mut builder = BlockBuilder::new("anonymous", START, 1_000, 10).expect("valid levels");
    let mut shapes: std::collections::BTreeMap<usize, (HeadShape, smolder_block::NodeMap)> =
        std::collections::BTreeMap::new();
    for batch in batches {
        if batch.mode != Mode::Unmarked {
            builder.add_marker(batch.marker());
        }
        for (&(s, b), stacks) in &batch.trees {
            let (shape, map) = shapes.entry(s).or_default();
            let values = shape.values(stacks, |_| true);
            let mut spans: std::collections::BTreeMap<smolder_common::SpanId, ()> =
                std::collections::BTreeMap::new();
            for index in 0..stacks.len() {
                if let Some(span) = span_of(batch.sequence, index) {
                    spans.insert(span, ());
                }
            }
            let spans: Vec<_> = spans
                .into_keys()
                .map(|span| {
                    let values =
                        shape.values(stacks, |index| span_of(batch.sequence, index) == Some(span));
                    (span, values)
                })
                .collect();
            let copies = if batch.mode == Mode::Twice { 2 } else { 1 };
            for _ in 0..copies {
                let contribution = match batch.mode {
                    Mode::Separable | Mode::Twice => {
                        smolder_block::Contribution::batch(batch.marker(), 1)
                    }
                    Mode::Merged => smolder_block::Contribution::merged(vec![batch.marker()], 1),
                    Mode::Unmarked => smolder_block::Contribution::merged(Vec::new(), 1),
                };
                builder
                    .add_values(
                        &series(s),
                        &ProfileMeta::default(),
                        bucket(b),
                        shape,
                        map,
                        &values,
                        &spans,
                        contribution,
                    )
                    .expect("bucket inside the block");
            }
        }
    }
    builder.finish().expect("no batch summed twice").0
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_range_reads_back_as_the_sum_of_its_buckets(
        batches in batches(100, 12),
        ranges in prop::collection::vec((0u64..1_000, 0u64..1_000), 4),
    ) {
        let all: Vec<_> = batches.iter().collect();
        let block = build(&all, START, 1_000);
        let report = verify(&block, &Limits::default()).expect("a built block verifies");
        let sums = expected(&batches);
        prop_assert_eq!(report.series as usize, (0..3).filter(|s| sums.keys().any(|k| k.0 == *s)).count());
        for s in 0..3 {
            prop_assert_eq!(read(&block, s, START, START + 1_000), expected_range(&sums, s, START, START + 1_000, 10));
            for &(a, b) in &ranges {
                let (from, until) = (START + a.min(b), START + a.max(b) + 1);
                prop_assert_eq!(
                    read(&block, s, from, until),
                    expected_range(&sums, s, from, until, 10),
                    "series {} range {}..{}", s, from, until
                );
            }
        }
    }

    /// The aggregator's head gives its writes as values over its own shape of each series:
    /// the same block, to the byte, as the trees themselves.
    #[test]
    fn trees_given_as_values_over_a_shape_make_the_same_block(batches in batches(100, 8)) {
        let all: Vec<_> = batches.iter().collect();
        prop_assert_eq!(build_from_values(&batches), build(&all, START, 1_000));
    }

    #[test]
    fn the_same_data_gives_the_same_bytes_in_any_order(batches in batches(100, 8)) {
        let forward: Vec<_> = batches.iter().collect();
        let backward: Vec<_> = batches.iter().rev().collect();
        prop_assert_eq!(build(&forward, START, 1_000), build(&backward, START, 1_000));
    }
}

#[test]
fn markers_and_metadata_are_indexed() {
    let mut builder = BlockBuilder::new("tenant-a", START, 1_000, 10).unwrap();
    let series = Series::parse("app.cpu{env=prod,region=eu}").unwrap();
    let mut tree = Tree::new();
    tree.insert_names(["main", "work"], 5);
    let old = ProfileMeta::default();
    let new = ProfileMeta {
        spy_name: "ebpfspy".into(),
        ..ProfileMeta::default()
    };
    let marker = |sequence| smolder_block::Marker {
        agent_id: "host-1".into(),
        sequence,
    };
    builder
        .add(
            &series,
            &new,
            START + 500,
            &tree,
            smolder_block::Contribution::batch(marker(2), 1),
        )
        .unwrap();
    builder
        .add(
            &series,
            &old,
            START + 20,
            &tree,
            smolder_block::Contribution::batch(marker(1), 1),
        )
        .unwrap();
    builder.add_marker(marker(9));
    let (block, report) = builder.finish().unwrap();
    assert_eq!(report.bytes, block.len() as u64);
    let fetched = Fetched::whole(&block);
    let tail = Tail::decode(block.len() as u64, &fetched).unwrap();
    let footer = Footer::decode(&tail, &fetched).unwrap();
    let index = Index::decode(&footer, &fetched, &Limits::default()).unwrap();
    assert_eq!(index.meta().tenant, "tenant-a");
    assert_eq!(index.meta().levels, [10, 100, 1_000]);
    assert_eq!(
        index.meta().nodes,
        4,
        "two 2-node trees at the finest level"
    );
    assert!(
        index.contains_marker(&marker(9)),
        "a batch without trees is still stored"
    );
    assert_eq!(index.markers().len(), 3);
    let entry = &index.series()[0];
    assert_eq!(
        entry.meta.spy_name, "ebpfspy",
        "the newest bucket's metadata wins"
    );
    assert_eq!(
        (entry.first_bucket, entry.last_bucket),
        (START + 20, START + 500)
    );
    assert_eq!(index.postings("region", "eu"), [0]);
    assert_eq!(index.postings("__name__", "app.cpu"), [0]);
    assert!(index.postings("region", "us").is_empty());
}

#[test]
fn buckets_outside_the_block_are_refused() {
    let mut builder = BlockBuilder::new("anonymous", START, 1_000, 10).unwrap();
    let err = builder
        .add(
            &Series::parse("app.cpu").unwrap(),
            &ProfileMeta::default(),
            START + 1_000,
            &Tree::new(),
            smolder_block::Contribution::merged(Vec::new(), 1),
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("outside the block's range"),
        "{err}"
    );
    assert!(BlockBuilder::new("anonymous", START + 10, 1_000, 10).is_err());
}

#[test]
fn a_query_reads_only_the_trees_it_needs() {
    let batches = (0..100u64)
        .map(|b| crate::util::Batch {
            sequence: b + 1,
            mode: crate::util::Mode::Separable,
            trees: [((0, b), vec![(vec![1, 2], 1)])].into_iter().collect(),
        })
        .collect::<Vec<_>>();
    let all: Vec<_> = batches.iter().collect();
    let block = build(&all, START, 1_000);
    let fetched = Fetched::whole(&block);
    let limits = Limits::default();
    let tail = Tail::decode(block.len() as u64, &fetched).unwrap();
    let footer = Footer::decode(&tail, &fetched).unwrap();
    let index = Index::decode(&footer, &fetched, &limits).unwrap();
    let chunk = smolder_block::SeriesChunk::decode(&index, 0, &fetched, &limits).unwrap();
    // 100 finest trees, 10 of 100 s, 1 of 1000 s.
    assert_eq!(chunk.entries().len(), 111);
    assert_eq!(chunk.plan(START, START + 1_000).len(), 1);
    // 90..1000: 90 at 10 s, 100..1000 at 100 s.
    assert_eq!(chunk.plan(START + 90, START + 1_000).len(), 10);
    // A range past the block reads nothing; one inside a bucket reads that bucket.
    assert!(chunk.plan(START + 1_000, START + 5_000).is_empty());
    assert_eq!(chunk.plan(START + 15, START + 16).len(), 1);
}
