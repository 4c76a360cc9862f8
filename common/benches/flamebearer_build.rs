//! Building flame graphs for `/render` and `/render-diff`: µs per build and input nodes per
//! second.
//!
//! The input is a sampled corpus tree of about 16k nodes, the size of the Go heap profile in
//! `storage-and-performance.md` §3.2 (16,895 nodes) and of one pre-merged query bucket (§3.3).
//! `from_tree/unlimited` lays out every node (`max_nodes` 0), `from_tree/8192` truncates to
//! Pyroscope's default budget first; `diff/8192` combines two such trees drawn from different
//! sampler streams and lays out the diff, and `diff_layout_only/8192` is the layout without the
//! combine. `json/*` serialises the results with `serde_json::to_vec`, as the HTTP handler does.
//! Throughput is in nodes of the input tree (of the combined tree for the diff).
//!
//! `cargo bench -p smolder-common --bench flamebearer_build -- --warm-up-time 1 --measurement-time 5`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use smolder_common::flamebearer::Flamebearer;
use smolder_common::{Corpus, CorpusConfig, Tree};

/// Pyroscope's default `max-nodes` for `/render`.
const MAX_NODES: usize = 8192;
/// Draws per tree: enough that most of the corpus' stacks appear, with Zipf-skewed totals so
/// that truncation has small nodes to fold.
const SAMPLES: usize = 100_000;

/// Bars in a laid-out flame graph (`width` integers per bar).
fn bars(fb: &Flamebearer, width: usize) -> usize {
    fb.levels.iter().map(|level| level.len() / width).sum()
}

fn build(c: &mut Criterion) {
    let corpus = Corpus::generate(&CorpusConfig {
        unique_stacks: 2_600,
        min_depth: 10,
        max_depth: 30,
        ..CorpusConfig::default()
    });
    let a = corpus.tree(SAMPLES, 0);
    let b = corpus.tree(SAMPLES, 1);
    let combined = Tree::combine(&a, &b);
    let full = Flamebearer::from_tree(&a, 0);
    let truncated = Flamebearer::from_tree(&a, MAX_NODES);
    let diff = Flamebearer::from_combined(&combined, MAX_NODES);
    let json_len = |fb: &Flamebearer| serde_json::to_vec(fb).expect("serialises").len();
    eprintln!(
        "flamebearer_build: tree a {} nodes, tree b {} nodes, combined {} nodes; bars: \
         unlimited {}, 8192 {}, diff 8192 {}; JSON bytes: unlimited {}, 8192 {}, diff 8192 {}",
        a.len(),
        b.len(),
        combined.len(),
        bars(&full, 4),
        bars(&truncated, 4),
        bars(&diff, 7),
        json_len(&full),
        json_len(&truncated),
        json_len(&diff),
    );

    let mut group = c.benchmark_group("flamebearer_build");
    group.throughput(Throughput::Elements(a.len() as u64));
    group.bench_function("from_tree/unlimited", |bench| {
        bench.iter(|| Flamebearer::from_tree(&a, 0))
    });
    group.bench_function("from_tree/8192", |bench| {
        bench.iter(|| Flamebearer::from_tree(&a, MAX_NODES))
    });
    group.bench_function("json/unlimited", |bench| {
        bench.iter(|| serde_json::to_vec(&full).expect("serialises"))
    });
    group.bench_function("json/8192", |bench| {
        bench.iter(|| serde_json::to_vec(&truncated).expect("serialises"))
    });

    group.throughput(Throughput::Elements(combined.len() as u64));
    group.bench_function("diff/8192", |bench| {
        bench.iter(|| Flamebearer::from_combined(&Tree::combine(&a, &b), MAX_NODES))
    });
    group.bench_function("diff_layout_only/8192", |bench| {
        bench.iter(|| Flamebearer::from_combined(&combined, MAX_NODES))
    });
    group.bench_function("json/diff_8192", |bench| {
        bench.iter(|| serde_json::to_vec(&diff).expect("serialises"))
    });
    group.finish();
}

criterion_group!(benches, build);
criterion_main!(benches);
