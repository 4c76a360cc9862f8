//! Merging trees: nodes of the merged-in tree per second.
//!
//! The aggregate side of ingest and of query-time merges: a window tree from one source merged
//! into an aggregate that already holds most of its stacks (`into_aggregate`), into an empty tree
//! (`into_empty`, which copies and interns every frame), and a tree larger than the caches merged
//! into another (`large`).

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use smolder_common::{Corpus, CorpusConfig, Tree};

fn merge(c: &mut Criterion) {
    let mut group = c.benchmark_group("tree_merge");

    let corpus = Corpus::generate(&CorpusConfig::default());
    let aggregate = corpus.tree(1_000_000, 0);
    let window = corpus.tree(100_000, 1);
    eprintln!(
        "tree_merge: aggregate {} nodes, window {} nodes",
        aggregate.len(),
        window.len()
    );
    group.throughput(Throughput::Elements(window.len() as u64));
    group.bench_function("into_aggregate", |b| {
        b.iter_batched_ref(
            || aggregate.clone(),
            |tree| tree.merge(&window),
            BatchSize::LargeInput,
        )
    });
    group.bench_function("into_empty", |b| {
        b.iter_batched_ref(Tree::new, |tree| tree.merge(&window), BatchSize::SmallInput)
    });

    let large = Corpus::generate(&CorpusConfig {
        unique_stacks: 300_000,
        min_depth: 10,
        max_depth: 40,
        ..CorpusConfig::default()
    });
    let big = large.full_tree();
    let other = large.tree(2_000_000, 1);
    eprintln!(
        "tree_merge: large {} nodes into {} nodes",
        big.len(),
        other.len()
    );
    group.throughput(Throughput::Elements(big.len() as u64));
    group.sample_size(10);
    group.bench_function("large", |b| {
        b.iter_batched_ref(
            || other.clone(),
            |tree| tree.merge(&big),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, merge);
criterion_main!(benches);
