//! Unwind-table build time per MiB of ELF file, on Debian's libc and python3.11 (the files the
//! agent builds tables for first on most hosts), with the cache round trip beside it as the
//! same-run baseline: loading a cached table must be much cheaper than building it.
//!
//! `cargo bench -p smolder-unwind --bench unwind_table_build -- --warm-up-time 1 --measurement-time 5`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use smolder_unwind::{Elf, Limits, cache};

const FILES: [(&str, &str); 2] = [
    ("libc", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
    ("python3.11", "/usr/bin/python3.11"),
];

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("unwind_table_build");
    for (name, path) in FILES {
        let bytes = std::fs::read(path).unwrap_or_else(|err| panic!("{path}: {err}"));
        let elf = Elf::parse(&bytes).expect("an ELF file");
        let table = smolder_unwind::build(&elf, None, &Limits::default()).expect("a table");
        let encoded = cache::encode(&table);
        eprintln!(
            "{name}: {} bytes of ELF, {} FDEs, {} rows, table {} bytes, cache file {} bytes",
            bytes.len(),
            table.stats().fdes,
            table.n_rows(),
            table.size_bytes(),
            encoded.len()
        );
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_function(format!("build/{name}"), |b| {
            b.iter(|| {
                let elf = Elf::parse(&bytes).expect("an ELF file");
                smolder_unwind::build(&elf, None, &Limits::default()).expect("a table")
            })
        });
        group.bench_function(format!("cache_decode/{name}"), |b| {
            b.iter(|| cache::decode(&encoded, &Limits::default()).expect("a table"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
