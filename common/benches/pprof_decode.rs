//! pprof decode + merge throughput, in samples per second, on a synthetic Go heap profile.
//!
//! The input has the shape of the heap profile measured in `storage-and-performance.md` §3.2:
//! about 12k samples over 5.5k distinct stacks (Go repeats a stack once per allocation size,
//! with a numeric `bytes` label), stacks about 17 frames deep, about 17k distinct tree nodes,
//! four sample types, a tenth of the locations with an inlined line. It is built here by a
//! small seeded generator so that the bench needs no fixture file.
//!
//! `cargo bench -p smolder-common --bench pprof_decode -- --warm-up-time 1 --measurement-time 5`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use prost::Message;
use smolder_common::pprof::proto::{Function, Label, Line, Location, Profile, Sample, ValueType};
use smolder_common::pprof::{self, Limits, SampleTypes};

/// xorshift64*: deterministic, dependency-free, good enough for shaping test data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Strings(Vec<Vec<u8>>);

impl Strings {
    fn add(&mut self, s: &str) -> i64 {
        self.0.push(s.as_bytes().to_vec());
        self.0.len() as i64 - 1
    }
}

/// The synthetic heap profile and its sample count.
fn go_heap_profile() -> (Profile, usize) {
    const UNIQUE_STACKS: usize = 5_500;
    const FUNCTIONS: u64 = 4_000;
    const LOCATIONS: u64 = 8_000;
    let mut rng = Rng(0x5eed_cafe_f00d_0001);
    let mut strings = Strings(vec![Vec::new()]);
    let sample_type = [
        "alloc_objects",
        "alloc_space",
        "inuse_objects",
        "inuse_space",
    ]
    .iter()
    .zip(["count", "bytes", "count", "bytes"])
    .map(|(ty, unit)| ValueType {
        r#type: strings.add(ty),
        unit: strings.add(unit),
    })
    .collect();
    let period_type = Some(ValueType {
        r#type: strings.add("space"),
        unit: strings.add("bytes"),
    });
    let bytes_key = strings.add("bytes");
    let function: Vec<Function> = (1..=FUNCTIONS)
        .map(|id| {
            let name = strings.add(&format!(
                "github.com/acme/svc{}/pkg{}.(*Type{}).Method{}",
                id % 7,
                id % 97,
                id % 13,
                id
            ));
            let filename = strings.add(&format!("/src/acme/pkg{}/file{}.go", id % 97, id % 5));
            Function {
                id,
                name,
                system_name: name,
                filename,
                start_line: (id % 400) as i64,
            }
        })
        .collect();
    let location: Vec<Location> = (1..=LOCATIONS)
        .map(|id| {
            let mut line = vec![Line {
                function_id: 1 + rng.below(FUNCTIONS),
                line: (rng.below(2000)) as i64,
                column: 0,
            }];
            if rng.below(10) == 0 {
                line.insert(
                    0,
                    Line {
                        function_id: 1 + rng.below(FUNCTIONS),
                        line: (rng.below(2000)) as i64,
                        column: 0,
                    },
                );
            }
            Location {
                id,
                mapping_id: 0,
                address: 0x40_0000 + id * 16,
                line,
                is_folded: false,
            }
        })
        .collect();
    // Each new stack shares a prefix with an earlier one and adds about three new frames.
    let mut stacks: Vec<Vec<u64>> = Vec::with_capacity(UNIQUE_STACKS);
    while stacks.len() < UNIQUE_STACKS {
        let mut stack: Vec<u64> = match stacks.len() {
            0 => Vec::new(),
            n => stacks[rng.below(n as u64) as usize].clone(),
        };
        let depth = (stack.len() + rng.below(3) as usize).clamp(14, 21);
        stack.truncate(
            stack
                .len()
                .saturating_sub(1 + rng.below(4) as usize)
                .min(depth - 1),
        );
        while stack.len() < depth {
            stack.push(1 + rng.below(LOCATIONS));
        }
        stacks.push(stack);
    }
    let mut sample = Vec::new();
    for root_first in &stacks {
        let location_id: Vec<u64> = root_first.iter().rev().copied().collect();
        for _ in 0..1 + rng.below(3) + u64::from(rng.below(5) == 0) {
            let size = 16 << rng.below(8);
            let objects = 1 + rng.below(50) as i64;
            let inuse = if rng.below(2) == 0 {
                0
            } else {
                1 + rng.below(objects as u64) as i64
            };
            sample.push(Sample {
                location_id: location_id.clone(),
                value: vec![objects, objects * size, inuse, inuse * size],
                label: vec![Label {
                    key: bytes_key,
                    num: size,
                    ..Label::default()
                }],
            });
        }
    }
    let samples = sample.len();
    let profile = Profile {
        sample_type,
        sample,
        location,
        function,
        string_table: strings.0,
        period_type,
        period: 512 * 1024,
        ..Profile::default()
    };
    (profile, samples)
}

fn bench(c: &mut Criterion) {
    let (profile, samples) = go_heap_profile();
    let plain = profile.encode_to_vec();
    let gzipped = profile.to_bytes(true);
    let types = SampleTypes::default();
    let limits = Limits::default();
    let series = pprof::parse(&plain, &types, &limits).expect("synthetic profile parses");
    let nodes: Vec<usize> = series.iter().map(|s| s.tree.len()).collect();
    eprintln!(
        "pprof_decode input: {samples} samples, {} B plain, {} B gzipped, tree nodes per series {nodes:?}",
        plain.len(),
        gzipped.len()
    );

    let mut group = c.benchmark_group("pprof_decode");
    group.throughput(Throughput::Elements(samples as u64));
    group.bench_function("go_heap/plain", |b| {
        b.iter(|| pprof::parse(&plain, &types, &limits).expect("parses"))
    });
    group.bench_function("go_heap/gzip", |b| {
        b.iter(|| pprof::parse(&gzipped, &types, &limits).expect("parses"))
    });
    group.bench_function("go_heap/protobuf_only", |b| {
        b.iter(|| pprof::decode(&plain, &limits).expect("decodes"))
    });
    group.bench_function("go_heap/to_series_only", |b| {
        b.iter(|| pprof::to_series(&profile, &types, &limits).expect("converts"))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
