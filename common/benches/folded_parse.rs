//! Parsing folded text: MiB/s of body.
//!
//! Bodies are corpus trees written as folded text: `sorted` is the writer's order (what SDKs
//! that aggregate first send: neighbouring lines share prefixes), `shuffled` the same lines in a
//! seeded random order (what SDKs that dump a hash map send). `folded_parse_into` compares the
//! two ways of adding a body to an existing tree without leaving it half-updated on error:
//! validate then insert (what `parse_folded_into` does) against parse into a temporary tree then
//! merge. `folded_write` measures the writer.

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use smolder_common::{
    Corpus, CorpusConfig, FoldedFormat, FoldedLimits, parse_folded, parse_folded_into, to_folded,
};

fn parse(c: &mut Criterion) {
    let corpus = Corpus::generate(&CorpusConfig::default());
    let sorted = corpus.folded(100_000, 0);
    let mut lines: Vec<&str> = sorted.lines().collect();
    lines.shuffle(&mut StdRng::seed_from_u64(7));
    let shuffled = lines.join("\n");
    eprintln!(
        "folded_parse: {} lines, {} bytes",
        lines.len(),
        sorted.len()
    );
    let limits = FoldedLimits::default();
    let format = FoldedFormat::Folded;

    let mut group = c.benchmark_group("folded_parse");
    group.throughput(Throughput::Bytes(sorted.len() as u64));
    for (name, body) in [("sorted", &sorted), ("shuffled", &shuffled)] {
        group.bench_function(name, |b| {
            b.iter(|| parse_folded(body.as_bytes(), format, &limits).expect("valid body"))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("folded_parse_into");
    group.throughput(Throughput::Bytes(sorted.len() as u64));
    let existing = corpus.tree(1_000_000, 1);
    group.bench_function("validate_then_insert", |b| {
        b.iter_batched_ref(
            || existing.clone(),
            |tree| parse_folded_into(tree, sorted.as_bytes(), format, &limits).expect("valid"),
            BatchSize::LargeInput,
        )
    });
    // The validation pass alone: a body whose last line is bad is read to the end, then
    // rejected before anything is inserted.
    let invalid = format!("{sorted}bad line\n");
    group.bench_function("validate_only", |b| {
        b.iter_batched_ref(
            || existing.clone(),
            |tree| parse_folded_into(tree, invalid.as_bytes(), format, &limits).expect_err("bad"),
            BatchSize::LargeInput,
        )
    });
    group.bench_function("temporary_then_merge", |b| {
        b.iter_batched_ref(
            || existing.clone(),
            |tree| {
                let body = parse_folded(sorted.as_bytes(), format, &limits).expect("valid");
                tree.merge(&body);
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();

    let mut group = c.benchmark_group("folded_write");
    let tree = parse_folded(sorted.as_bytes(), format, &limits).expect("valid body");
    group.throughput(Throughput::Bytes(sorted.len() as u64));
    group.bench_function("to_folded", |b| b.iter(|| to_folded(&tree)));
    group.finish();
}

criterion_group!(benches, parse);
criterion_main!(benches);
