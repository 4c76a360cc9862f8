//! The block reader on untrusted bytes: `verify`, the ranged reader (trees and span profiles)
//! and a merge never panic, and a block that verifies reads back the same after being merged
//! with nothing else.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smolder_block::{
    Fetched, Footer, Index, Limits, MergeOptions, Names, SeriesChunk, SpanChunk, SpanIndex, Tail,
    merge, verify,
};
use smolder_common::{SpanId, Tree};

/// Small enough that a fuzzer's inputs cannot make it allocate much.
const LIMITS: Limits = Limits {
    max_section_bytes: 1 << 20,
};

/// Every series' whole range through the ranged reader, then every span of every series, or
/// the first error.
fn read(block: &[u8]) -> Option<Vec<u64>> {
    let fetched = Fetched::whole(block);
    let tail = Tail::decode(block.len() as u64, &fetched).ok()?;
    let footer = Footer::decode(&tail, &fetched).ok()?;
    let index = Index::decode(&footer, &fetched, &LIMITS).ok()?;
    let names = Names::decode(&footer, &fetched, &LIMITS).ok()?;
    let meta = index.meta();
    let mut totals = Vec::new();
    for series in 0..index.series().len() {
        let chunk = SeriesChunk::decode(&index, series, &fetched, &LIMITS).ok()?;
        let mut tree = Tree::new();
        chunk
            .read_range(meta.start, meta.end(), &fetched, &names, &mut tree)
            .ok()?;
        totals.push(tree.total());
    }
    let spans = SpanIndex::decode(&footer, &index, &fetched, &LIMITS).ok()?;
    for series in spans.series() {
        let chunk = SpanChunk::decode(&index, &spans, series, &fetched, &LIMITS).ok()?;
        let mut every: Vec<SpanId> = Vec::new();
        for entry in 0..chunk.entries().len() {
            every.extend(chunk.read_entry(entry, &fetched).ok()?.into_iter().map(|(s, _)| s));
        }
        every.sort();
        every.dedup();
        let mut tree = Tree::new();
        chunk
            .read_range(meta.start, meta.end(), &every, &fetched, &names, &mut tree)
            .ok()?;
        totals.push(tree.total());
    }
    Some(totals)
}

fuzz_target!(|data: &[u8]| {
    let totals = read(data);
    if verify(data, &LIMITS).is_ok() {
        let totals = totals.expect("a verified block reads");
        let fetched = Fetched::whole(data);
        let tail = Tail::decode(data.len() as u64, &fetched).expect("verified");
        let footer = Footer::decode(&tail, &fetched).expect("verified");
        let meta = Index::decode(&footer, &fetched, &LIMITS)
            .expect("verified")
            .meta()
            .clone();
        let options = MergeOptions {
            start: meta.start,
            span: meta.span(),
            finest: None,
        };
        // Merged alone, a block keeps every total (its separable copies of a batch were
        // already dropped when it was written).
        if let Ok((merged, _)) = merge(&[data], options, &LIMITS) {
            verify(&merged, &LIMITS).expect("a merged block verifies");
            assert_eq!(read(&merged).expect("reads"), totals);
        }
    }
});
