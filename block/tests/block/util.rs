//! Random batches of trees, the blocks built from them, and the sums they must read back as.

use std::collections::BTreeMap;

use proptest::prelude::*;
use smolder_block::{
    BlockBuilder, Contribution, Fetched, Footer, Index, Limits, Marker, Names, SeriesChunk,
    SpanChunk, SpanIndex, Tail,
};
use smolder_common::{ProfileMeta, Selector, Series, SpanId, SpanTrees, Tree};

/// Start of every test block: a multiple of 10,000 s.
pub(crate) const START: u64 = 1_700_000_000 / 10_000 * 10_000;

/// The series tests write to.
pub(crate) fn series(index: usize) -> Series {
    let names = [
        "app.cpu{env=prod}",
        "app.cpu{env=dev}",
        "other.alloc_space{}",
    ];
    Series::parse(names[index]).expect("valid")
}

/// How a batch reaches the builder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Its trees kept apart, once.
    Separable,
    /// Its trees kept apart, added twice (a retry): counted once.
    Twice,
    /// Its trees already summed under its marker.
    Merged,
    /// Data without a marker (an HTTP push).
    Unmarked,
}

/// Stacks (frame indexes, root first) with their values.
pub(crate) type Stacks = Vec<(Vec<u8>, u64)>;

/// One agent batch: a tree per (series, bucket index).
#[derive(Clone, Debug)]
pub(crate) struct Batch {
    pub(crate) sequence: u64,
    pub(crate) mode: Mode,
    pub(crate) trees: BTreeMap<(usize, u64), Stacks>,
}

impl Batch {
    pub(crate) fn marker(&self) -> Marker {
        Marker {
            agent_id: format!("agent-{}", self.sequence % 3),
            sequence: self.sequence,
        }
    }
}

/// A frame name: short ones and a long one, so that name order and id order differ.
pub(crate) fn frame(index: u8) -> String {
    match index % 4 {
        0 => format!("runtime.f{index}"),
        1 => format!("github.com/acme/svc/handler.(*Server).Serve{index}"),
        2 => format!("z{index}"),
        _ => format!("a{index}"),
    }
}

pub(crate) fn tree(stacks: &[(Vec<u8>, u64)]) -> Tree {
    let mut tree = Tree::new();
    for (stack, value) in stacks {
        tree.insert_names(stack.iter().map(|&f| frame(f)), *value);
    }
    tree
}

fn stacks() -> impl Strategy<Value = Vec<(Vec<u8>, u64)>> {
    prop::collection::vec(
        (
            prop::collection::vec(0u8..12, 0..6),
            prop_oneof![1u64..5, Just(10_101_010u64), 1u64..u64::MAX / 1_000_000],
        ),
        1..6,
    )
}

/// Batches with distinct sequences over buckets `0..buckets` (10 s each from [`START`]).
pub(crate) fn batches(buckets: u64, max: usize) -> impl Strategy<Value = Vec<Batch>> {
    let batch = (
        prop_oneof![
            Just(Mode::Separable),
            Just(Mode::Twice),
            Just(Mode::Merged),
            Just(Mode::Unmarked)
        ],
        prop::collection::btree_map((0usize..3, 0..buckets), stacks(), 1..4),
    );
    prop::collection::vec(batch, 1..max).prop_map(|list| {
        list.into_iter()
            .enumerate()
            .map(|(i, (mode, trees))| Batch {
                sequence: i as u64 * 7 + 1,
                mode,
                trees,
            })
            .collect()
    })
}

pub(crate) fn bucket(index: u64) -> u64 {
    START + index * 10
}

/// The span the `index`th stack of a batch of `sequence` ran in: one of four, shared across
/// batches, or none.
pub(crate) fn span_of(sequence: u64, index: usize) -> Option<SpanId> {
    let id = (index % 3) as u64 + (sequence % 2) * 2;
    (index % 3 != 2).then(|| SpanId::from_bytes((id + 1).to_be_bytes()).expect("not zero"))
}

/// Every span [`span_of`] gives.
pub(crate) fn all_spans() -> Vec<SpanId> {
    (1..=4u64)
        .map(|id| SpanId::from_bytes(id.to_be_bytes()).expect("not zero"))
        .collect()
}

/// The span trees of a batch's tree of `stacks`.
pub(crate) fn span_trees(sequence: u64, stacks: &[(Vec<u8>, u64)]) -> SpanTrees {
    let mut spans = SpanTrees::new();
    for (index, (stack, value)) in stacks.iter().enumerate() {
        if let Some(span) = span_of(sequence, index) {
            spans
                .tree_mut(span)
                .insert_names(stack.iter().map(|&f| frame(f)), *value);
        }
    }
    spans
}

/// Adds the trees of `batch` that fall in the builder's `[start, end)`, with their spans.
pub(crate) fn add(builder: &mut BlockBuilder, batch: &Batch, start: u64, end: u64) {
    let meta = ProfileMeta::default();
    for (&(s, b), stacks) in &batch.trees {
        let at = bucket(b);
        if at < start || at >= end {
            continue;
        }
        let tree = tree(stacks);
        let spans = span_trees(batch.sequence, stacks);
        let copies = if batch.mode == Mode::Twice { 2 } else { 1 };
        for _ in 0..copies {
            let contribution = match batch.mode {
                Mode::Separable | Mode::Twice => Contribution::batch(batch.marker(), 1),
                Mode::Merged => Contribution::merged(vec![batch.marker()], 1),
                Mode::Unmarked => Contribution::merged(Vec::new(), 1),
            };
            builder
                .add_with_spans(&series(s), &meta, at, &tree, &spans, contribution)
                .expect("bucket inside the block");
        }
    }
}

/// A block over `[start, start + span)` at 10 s of every batch's trees in it.
pub(crate) fn build(batches: &[&Batch], start: u64, span: u64) -> Vec<u8> {
    let mut builder = BlockBuilder::new("anonymous", start, span, 10).expect("valid levels");
    for batch in batches {
        if batch.mode != Mode::Unmarked {
            builder.add_marker(batch.marker());
        }
        add(&mut builder, batch, start, start + span);
    }
    builder.finish().expect("no batch summed twice").0
}

/// The reference: each batch's spans once, per (series, bucket index) and span.
pub(crate) fn expected_spans(batches: &[Batch]) -> BTreeMap<(usize, u64), SpanTrees> {
    let mut sums: BTreeMap<(usize, u64), SpanTrees> = BTreeMap::new();
    for batch in batches {
        for (&key, stacks) in &batch.trees {
            sums.entry(key)
                .or_default()
                .merge(&span_trees(batch.sequence, stacks));
        }
    }
    sums
}

/// The reference tree of `wanted` spans of series `s` over `[from, until)`, widened to whole
/// buckets of `finest`.
pub(crate) fn expected_span_range(
    sums: &BTreeMap<(usize, u64), SpanTrees>,
    s: usize,
    (from, until): (u64, u64),
    finest: u64,
    wanted: &[SpanId],
) -> Tree {
    let (from, until) = (from / finest * finest, until.div_ceil(finest) * finest);
    let mut out = Tree::new();
    for (&(series, b), spans) in sums {
        if series == s && (from..until).contains(&bucket(b)) {
            out.merge(&spans.select(wanted));
        }
    }
    out
}

/// The `wanted` spans (sorted) of series `s` over `[from, until)`, as the reader reads them
/// from a whole block.
pub(crate) fn read_spans(
    block: &[u8],
    s: usize,
    (from, until): (u64, u64),
    wanted: &[SpanId],
) -> Tree {
    let fetched = Fetched::whole(block);
    let limits = Limits::default();
    let tail = Tail::decode(block.len() as u64, &fetched).expect("tail");
    let footer = Footer::decode(&tail, &fetched).expect("footer");
    let index = Index::decode(&footer, &fetched, &limits).expect("index");
    let names = Names::decode(&footer, &fetched, &limits).expect("names");
    let spans = SpanIndex::decode(&footer, &index, &fetched, &limits).expect("span index");
    let mut tree = Tree::new();
    for position in spans.series() {
        if index.series()[position].series != series(s) {
            continue;
        }
        let chunk =
            SpanChunk::decode(&index, &spans, position, &fetched, &limits).expect("span chunk");
        chunk
            .read_range(from, until, wanted, &fetched, &names, &mut tree)
            .expect("span entries");
    }
    tree
}

/// The reference: each batch's trees once, per (series, bucket index).
pub(crate) fn expected(batches: &[Batch]) -> BTreeMap<(usize, u64), Tree> {
    let mut sums: BTreeMap<(usize, u64), Tree> = BTreeMap::new();
    for batch in batches {
        for (&key, stacks) in &batch.trees {
            sums.entry(key).or_default().merge(&tree(stacks));
        }
    }
    sums
}

/// The reference sum of series `s` over `[from, until)`, widened to whole buckets of `finest`.
pub(crate) fn expected_range(
    sums: &BTreeMap<(usize, u64), Tree>,
    s: usize,
    from: u64,
    until: u64,
    finest: u64,
) -> Tree {
    let (from, until) = (from / finest * finest, until.div_ceil(finest) * finest);
    let mut out = Tree::new();
    for (&(series, b), tree) in sums {
        if series == s && (from..until).contains(&bucket(b)) {
            out.merge(tree);
        }
    }
    out
}

/// Series `s` over `[from, until)` as the reader reads it from a whole block.
pub(crate) fn read(block: &[u8], s: usize, from: u64, until: u64) -> Tree {
    let fetched = Fetched::whole(block);
    let limits = Limits::default();
    let tail = Tail::decode(block.len() as u64, &fetched).expect("tail");
    let footer = Footer::decode(&tail, &fetched).expect("footer");
    let index = Index::decode(&footer, &fetched, &limits).expect("index");
    let names = Names::decode(&footer, &fetched, &limits).expect("names");
    let selector = Selector::parse(series(s).app()).expect("selector");
    let mut tree = Tree::new();
    for position in index.select(&selector, from, until) {
        if index.series()[position].series != series(s) {
            continue;
        }
        let chunk = SeriesChunk::decode(&index, position, &fetched, &limits).expect("chunk");
        chunk
            .read_range(from, until, &fetched, &names, &mut tree)
            .expect("trees");
    }
    tree
}
