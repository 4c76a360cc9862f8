//! Inserting pre-interned stacks into a tree: ns per frame, in cache and out of it.
//!
//! The tree already holds every unique stack, as an aggregate does in steady state, so the
//! measurement is the child lookups and value updates of ingest, not node allocation (the
//! `build` case measures that). Samples are Zipf-drawn corpus stacks; the `uniform` case draws
//! every stack equally, the worst case for a tree larger than the caches.
//!
//! Sizes: the in-cache tree is about 10 k nodes (320 KiB at 32 B/node, inside the 2 MiB L2);
//! the large one is over 2 M nodes (about 80 MiB, over the 32 MiB L3 of the build machines).

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use smolder_common::{Corpus, CorpusConfig, FrameId, Tree};

struct Case {
    tree: Tree,
    stacks: Vec<Vec<FrameId>>,
    draws: Vec<usize>,
    frames: u64,
}

fn case(config: CorpusConfig, samples: usize, zipf: bool) -> Case {
    let corpus = Corpus::generate(&config);
    let mut tree = Tree::new();
    let stacks = corpus.intern(&mut tree);
    for stack in &stacks {
        tree.insert(stack, 1);
    }
    let draws: Vec<usize> = if zipf {
        corpus.sampler(0).take(samples).collect()
    } else {
        (0..samples).map(|i| (i * 7919) % stacks.len()).collect()
    };
    let frames = draws.iter().map(|&i| stacks[i].len() as u64).sum();
    eprintln!(
        "tree_insert: {} unique stacks, {} nodes, {samples} samples, {frames} frames",
        stacks.len(),
        tree.len()
    );
    Case {
        tree,
        stacks,
        draws,
        frames,
    }
}

fn insert(c: &mut Criterion) {
    let mut group = c.benchmark_group("tree_insert");

    let small = CorpusConfig {
        unique_stacks: 1_600,
        min_depth: 10,
        max_depth: 30,
        ..CorpusConfig::default()
    };
    let Case {
        mut tree,
        stacks,
        draws,
        frames,
    } = case(small, 100_000, true);
    group.throughput(Throughput::Elements(frames));
    group.bench_function("in_cache_zipf", |b| {
        b.iter(|| {
            for &i in &draws {
                tree.insert(&stacks[i], 1);
            }
        })
    });

    // From an empty tree (frames interned, no nodes): node creation included.
    let mut empty = Tree::new();
    let fresh = {
        let corpus = Corpus::generate(&CorpusConfig {
            unique_stacks: 1_600,
            min_depth: 10,
            max_depth: 30,
            ..CorpusConfig::default()
        });
        corpus.intern(&mut empty)
    };
    group.bench_function("in_cache_build", |b| {
        b.iter_batched_ref(
            || empty.clone(),
            |tree| {
                for &i in &draws {
                    tree.insert(&fresh[i], 1);
                }
            },
            BatchSize::SmallInput,
        )
    });

    let large = CorpusConfig {
        unique_stacks: 300_000,
        min_depth: 10,
        max_depth: 40,
        ..CorpusConfig::default()
    };
    for (name, zipf) in [("large_zipf", true), ("large_uniform", false)] {
        let Case {
            mut tree,
            stacks,
            draws,
            frames,
        } = case(large.clone(), 200_000, zipf);
        group.throughput(Throughput::Elements(frames));
        group.sample_size(20);
        group.bench_function(name, |b| {
            b.iter(|| {
                for &i in &draws {
                    tree.insert(&stacks[i], 1);
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, insert);
criterion_main!(benches);
