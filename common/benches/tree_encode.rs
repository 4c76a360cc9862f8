//! Encoding and decoding trees: bytes/s and nodes/s, and the encoded size per node.
//!
//! The size is printed once per tree, with and without the frame-name table (names are paid
//! once per distinct frame; the per-node part is what grows with the tree).

use std::collections::HashSet;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use smolder_common::{Corpus, CorpusConfig, FrameId, Tree};

/// Bytes the encoding spends on the frame table: each used name and its varint length.
fn table_bytes(tree: &Tree) -> usize {
    let mut used = HashSet::new();
    let mut pending = vec![tree.root()];
    while let Some(node) = pending.pop() {
        used.extend(node.frame());
        pending.extend(node.children());
    }
    used.iter()
        .map(|&id: &FrameId| {
            let len = tree.frames().name(id).len();
            len + varint_len(len as u64)
        })
        .sum::<usize>()
        + varint_len(used.len() as u64)
}

fn varint_len(value: u64) -> usize {
    (64 - value.leading_zeros() as usize).max(1).div_ceil(7)
}

fn encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("tree_encode");
    let corpus = Corpus::generate(&CorpusConfig::default());
    let large = Corpus::generate(&CorpusConfig {
        unique_stacks: 100_000,
        min_depth: 10,
        max_depth: 40,
        ..CorpusConfig::default()
    });
    let cases = [
        ("sampled", corpus.tree(100_000, 0)),
        ("full", corpus.full_tree()),
        ("large_sampled", large.tree(1_000_000, 0)),
    ];
    for (name, tree) in &cases {
        let bytes = tree.encode();
        let nodes = tree.len();
        let table = table_bytes(tree);
        eprintln!(
            "tree_encode/{name}: {nodes} nodes, {} bytes: {:.2} bytes/node, {:.2} without the \
             {table}-byte frame table",
            bytes.len(),
            bytes.len() as f64 / nodes as f64,
            (bytes.len() - table) as f64 / nodes as f64,
        );
        group.throughput(Throughput::ElementsAndBytes {
            elements: nodes as u64,
            bytes: bytes.len() as u64,
        });
        group.bench_function(format!("encode/{name}"), |b| {
            let mut out = Vec::with_capacity(bytes.len());
            b.iter(|| {
                out.clear();
                tree.encode_into(&mut out);
                out.len()
            })
        });
        group.bench_function(format!("decode/{name}"), |b| {
            b.iter(|| Tree::decode(&bytes).expect("own encoding decodes"))
        });
    }
    group.finish();
}

criterion_group!(benches, encode);
criterion_main!(benches);
