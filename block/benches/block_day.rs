//! A simulated day of one series through the block store's pure steps: cut into 1000 s blocks,
//! compacted to 10 000 s and then 100 000 s blocks, downsampled, and read back for 1 h and 24 h
//! flame graphs. Prints bytes per stored node at each step against the same run's baseline (the
//! tree encoding of `smolder-common`, one encoded tree per bucket), and the time each step took.
//!
//! ```sh
//! cargo bench -p smolder-block --bench block_day
//! SMOLDER_BENCH_BUCKETS=1000 cargo bench -p smolder-block --bench block_day
//! ```
//!
//! Two days: the one `aggregator/benches/ingest_http_to_query.rs` sends (8,640 buckets of 6,000
//! Zipf draws from a 12,000-stack corpus, cycling 48 bodies, which flatters any compression
//! that can see across buckets) and one whose every bucket is drawn afresh. A scenario, not a
//! micro-benchmark: its table goes to BENCHMARKS.md.

use std::time::{Duration, Instant};

use smolder_block::{
    BlockBuilder, Contribution, Fetched, Footer, Index, Limits, Marker, MergeOptions, Names,
    SeriesChunk, Tail, downsample, merge,
};
use smolder_common::{Corpus, CorpusConfig, ProfileMeta, Selector, Series, Tree};

/// Distinct bucket bodies of the cycled day, as in `ingest_http_to_query`.
const BODIES: u64 = 48;
/// Samples per 10 s bucket, as in `ingest_http_to_query`.
const SAMPLES: usize = 6_000;
/// The end of the day: a multiple of 10 000 s but not of 100 000 s, so that the day spans two
/// of the largest blocks, as most days do.
const DAY_END: u64 = 1_700_050_000;
/// Query repetitions for the latency figures.
const QUERIES: usize = 20;

fn main() {
    let buckets: u64 = std::env::var("SMOLDER_BENCH_BUCKETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8_640);
    let corpus = Corpus::generate(&CorpusConfig {
        seed: 7,
        unique_stacks: 12_000,
        min_depth: 6,
        max_depth: 24,
        functions: 4_000,
        ..CorpusConfig::default()
    });
    println!("# block_day: {buckets} buckets of 10 s, {SAMPLES} samples each, one series");
    for fresh in [false, true] {
        day(&corpus, buckets, fresh);
    }
}

fn day(corpus: &Corpus, buckets: u64, fresh: bool) {
    let name = if fresh {
        "every bucket drawn afresh"
    } else {
        "48 bodies cycled"
    };
    println!("\n## {name}");
    let series = Series::parse("bench.cpu{env=prod}").expect("valid");
    let meta = ProfileMeta {
        spy_name: "ebpfspy".into(),
        ..ProfileMeta::default()
    };
    let limits = Limits::default();
    let day_start = DAY_END - buckets * 10;
    let cycled: Vec<Tree> = match fresh {
        true => Vec::new(),
        false => (0..BODIES).map(|i| corpus.tree(SAMPLES, i)).collect(),
    };

    // 1. Cut: one block per 1000 s range, each bucket one agent batch kept separable.
    let (mut nodes, mut baseline, mut names) = (0u64, 0u64, 0u64);
    let mut cuts: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut cut_time = Duration::ZERO;
    let mut range = day_start / 1_000 * 1_000;
    while range < DAY_END {
        let trees: Vec<(u64, Tree)> = (0..100)
            .map(|i| range + i * 10)
            .filter(|&at| at >= day_start && at < DAY_END)
            .map(|at| {
                let index = (at - day_start) / 10;
                let tree = match fresh {
                    true => corpus.tree(SAMPLES, index),
                    false => cycled[(index % BODIES) as usize].clone(),
                };
                (at, tree)
            })
            .collect();
        let started = Instant::now();
        let mut builder = BlockBuilder::new("anonymous", range, 1_000, 10).expect("levels");
        for (at, tree) in &trees {
            let marker = Marker {
                agent_id: "bench-agent".into(),
                sequence: (at - day_start) / 10,
            };
            builder
                .add(&series, &meta, *at, tree, Contribution::batch(marker, 1))
                .expect("inside the block");
        }
        let (block, _) = builder.finish().expect("writes");
        cut_time += started.elapsed();
        for (_, tree) in &trees {
            nodes += tree.len() as u64;
            baseline += tree.encode().len() as u64;
            names += name_table_bytes(tree);
        }
        cuts.push((range, block));
        range += 1_000;
    }
    let per_node = |bytes: u64| bytes as f64 / nodes as f64;
    println!(
        "stored nodes: {nodes} in {buckets} buckets ({:.0} per bucket)",
        nodes as f64 / buckets as f64
    );
    println!("| step | blocks | bytes | B/node | ratio to baseline | time |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| baseline: `Tree::encode` per bucket (names in every tree) | — | {baseline} | {:.2} | 1 | — |",
        per_node(baseline)
    );
    println!(
        "| `Tree::encode` without its name table (the tree encoding alone) | — | {} | {:.2} | {:.3} | — |",
        baseline - names,
        per_node(baseline - names),
        (baseline - names) as f64 / baseline as f64
    );
    let row = |step: &str, blocks: &[(u64, Vec<u8>)], time: Duration| {
        let bytes: u64 = blocks.iter().map(|(_, b)| b.len() as u64).sum();
        println!(
            "| {step} | {} | {bytes} | {:.3} | {:.3} | {:.2} s ({:.2} M nodes/s) |",
            blocks.len(),
            per_node(bytes),
            bytes as f64 / baseline as f64,
            time.as_secs_f64(),
            nodes as f64 / time.as_secs_f64() / 1e6
        );
    };
    row("cut: 1000 s blocks, rollups to 1000 s", &cuts, cut_time);

    // Reading blocks held in memory: `open` decodes what a cache would keep (tail, directory,
    // index, names, the series' chunk headers), `query` reads the trees a range needs.
    let selector = Selector::parse("bench.cpu").expect("valid");
    let query = |from: u64, until: u64, warm: &[Opened]| -> (Tree, u64) {
        let mut tree = Tree::new();
        let mut read = 0u64;
        for opened in warm {
            let fetched = Fetched::whole(&opened.block);
            for chunk in &opened.chunks {
                for entry in chunk.plan(from, until) {
                    read += chunk.tree_range(entry).end - chunk.tree_range(entry).start;
                }
                chunk
                    .read_range(from, until, &fetched, &opened.names, &mut tree)
                    .expect("reads");
            }
        }
        (tree, read)
    };
    let open = |block: &[u8]| -> Opened {
        let fetched = Fetched::whole(block);
        let tail = Tail::decode(block.len() as u64, &fetched).expect("tail");
        let footer = Footer::decode(&tail, &fetched).expect("footer");
        let index = Index::decode(&footer, &fetched, &limits).expect("index");
        let names = Names::decode(&footer, &fetched, &limits).expect("names");
        let chunks = index
            .select(&selector, 0, u64::MAX)
            .into_iter()
            .map(|p| SeriesChunk::decode(&index, p, &fetched, &limits).expect("chunk"))
            .collect();
        Opened {
            block: block.to_vec(),
            names,
            chunks,
        }
    };
    // 2. Compaction: 10 x 1000 s -> 10 000 s, then 10 x 10 000 s -> 100 000 s.
    let compact = |inputs: &[(u64, Vec<u8>)], span: u64| {
        let started = Instant::now();
        let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
        for group in inputs.chunk_by(|a, b| a.0 / span == b.0 / span) {
            let start = group[0].0 / span * span;
            let blocks: Vec<&[u8]> = group.iter().map(|(_, b)| b.as_slice()).collect();
            let options = MergeOptions {
                start,
                span,
                finest: None,
            };
            out.push((start, merge(&blocks, options, &limits).expect("merges").0));
        }
        (out, started.elapsed())
    };
    let (tens, time) = compact(&cuts, 10_000);
    row("compacted: 10 000 s blocks", &tens, time);
    let (days, time) = compact(&tens, 100_000);
    row(
        "compacted: 100 000 s blocks, rollups to 100 000 s",
        &days,
        time,
    );
    // The alternative to the tree encoding's own varints: lz4 over each stored tree.
    let (mut raw, mut packed) = (0u64, 0u64);
    for (_, block) in &days {
        let opened = open(block);
        for chunk in &opened.chunks {
            for entry in 0..chunk.entries().len() {
                let range = chunk.tree_range(entry);
                let bytes = &block[range.start as usize..range.end as usize];
                raw += bytes.len() as u64;
                packed += lz4_flex::block::compress(bytes).len() as u64;
            }
        }
    }
    println!(
        "| (alternative) the compacted day's trees with lz4 per tree | — | {packed} of {raw} | {:.3} of {:.3} | — | — |",
        per_node(packed),
        per_node(raw)
    );
    for finest in [100, 1_000] {
        let started = Instant::now();
        let small: Vec<(u64, Vec<u8>)> = days
            .iter()
            .map(|(start, b)| {
                (
                    *start,
                    downsample(b, finest, &limits).expect("downsamples").0,
                )
            })
            .collect();
        row(
            &format!("downsampled to {finest} s"),
            &small,
            started.elapsed(),
        );
    }

    // 3. Reads of the compacted day: the whole path from the tail (cold), and with the
    // footer, index, names and chunk header already decoded (warm).
    for (label, from) in [("1 h", DAY_END - 3_600), ("24 h", DAY_END - 86_400)] {
        let from = from.max(day_start);
        let mut cold = Vec::new();
        let mut warm = Vec::new();
        let mut result = (Tree::new(), 0);
        let opened: Vec<Opened> = days.iter().map(|(_, b)| open(b)).collect();
        for _ in 0..QUERIES {
            let started = Instant::now();
            let fresh_open: Vec<Opened> = days.iter().map(|(_, b)| open(b)).collect();
            query(from, DAY_END, &fresh_open);
            cold.push(started.elapsed());
            let started = Instant::now();
            result = query(from, DAY_END, &opened);
            warm.push(started.elapsed());
        }
        let samples = (DAY_END - from) / 10 * SAMPLES as u64;
        assert_eq!(result.0.total(), samples, "every sample read back once");
        cold.sort();
        warm.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "read {label}: warm p50 {:.2} ms, p99 {:.2} ms; from the tail p50 {:.2} ms; {} nodes, total {}, {} B of trees read",
            ms(warm[QUERIES / 2]),
            ms(warm[QUERIES - 1]),
            ms(cold[QUERIES / 2]),
            result.0.len(),
            result.0.total(),
            result.1
        );
    }
}

/// The bytes `Tree::encode` spends on `tree`'s name table: each used name and its length,
/// and their count.
fn name_table_bytes(tree: &Tree) -> u64 {
    let mut used = std::collections::HashSet::new();
    let mut pending = vec![tree.root()];
    while let Some(node) = pending.pop() {
        used.extend(node.frame());
        pending.extend(node.children());
    }
    let varint = |v: u64| u64::from((64 - v.leading_zeros()).max(1).div_ceil(7));
    used.iter()
        .map(|&id| {
            let len = tree.frames().name(id).len() as u64;
            len + varint(len)
        })
        .sum::<u64>()
        + varint(used.len() as u64)
}

/// A block with its names and the chunk headers of the queried series decoded.
struct Opened {
    block: Vec<u8>,
    names: Names,
    chunks: Vec<SeriesChunk>,
}
