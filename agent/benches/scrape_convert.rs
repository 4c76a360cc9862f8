//! Scrape throughput: pprof bodies as Go serves them → window profiles, with deltas.
//!
//! Inputs, captured from real Go programs (`benches/testdata/`): `go_compile_cpu.pb.gz`, a 10 s
//! CPU profile of the Go compiler building `net/http`, and two heap profiles of the scrape
//! tests' Go program taken a few seconds apart (`go_heap_1`, `go_heap_2`; `MemProfileRate = 1`,
//! so every allocation site is there). Cases:
//!
//! - `decode_only/*`: `smolder_common::pprof::parse`, the baseline: what any reader pays.
//! - `convert/cpu`: decode, map and name the series of the CPU profile.
//! - `convert/heap_pair`: a fresh target's two heap scrapes: the first primes the deltas, the
//!   second is subtracted from it. Two profiles per iteration.
//! - `fetch_convert/heap_pair`: the same over loopback HTTP, with the scraper's client.
//!
//! Throughput is reported in profiles (criterion's elements); samples per profile are printed
//! to stderr so samples/s can be derived.

use std::time::{Duration, SystemTime};

use axum::Router;
use axum::routing::get;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use smolder_agent::scrape::ScrapeConfig;
use smolder_agent::scrape::config::TargetGroup;
use smolder_agent::scrape::convert::{Span, convert};
use smolder_agent::scrape::delta::Deltas;
use smolder_agent::scrape::fetch::{ClientSettings, Fetcher};
use smolder_agent::scrape::target::{Builder, Target};
use smolder_common::pprof::{self, Limits, SampleTypes};

const CPU: &[u8] = include_bytes!("testdata/go_compile_cpu.pb.gz");
const HEAP_1: &[u8] = include_bytes!("testdata/go_heap_1.pb.gz");
const HEAP_2: &[u8] = include_bytes!("testdata/go_heap_2.pb.gz");

fn targets(addr: &str) -> Vec<Target> {
    let config: ScrapeConfig =
        serde_norway::from_str("job-name: bench\nenabled-profiles: [cpu, mem]\n").unwrap();
    let group = TargetGroup {
        application: "bench".to_owned(),
        targets: vec![addr.to_owned()],
        ..TargetGroup::default()
    };
    Builder::new(&config).unwrap().build([&group]).active
}

fn span() -> Span {
    let now = SystemTime::now();
    Span {
        from: now - Duration::from_secs(10),
        until: now,
        delta_from: now - Duration::from_secs(10),
    }
}

fn samples(body: &[u8]) -> usize {
    pprof::decode(body, &Limits::default())
        .unwrap()
        .sample
        .len()
}

fn bench(c: &mut Criterion) {
    let limits = Limits::default();
    eprintln!(
        "samples per profile: cpu {}, heap_1 {}, heap_2 {}; bytes: cpu {}, heap_1 {}, heap_2 {}",
        samples(CPU),
        samples(HEAP_1),
        samples(HEAP_2),
        CPU.len(),
        HEAP_1.len(),
        HEAP_2.len()
    );
    let offline = targets("127.0.0.1:1");
    let (cpu, mem) = (&offline[0], &offline[1]);

    let mut group = c.benchmark_group("decode_only");
    group.throughput(Throughput::Elements(1));
    group.bench_function("cpu", |b| {
        b.iter(|| pprof::parse(CPU, &SampleTypes::default(), &limits).unwrap())
    });
    group.throughput(Throughput::Elements(2));
    group.bench_function("heap_pair", |b| {
        b.iter(|| {
            pprof::parse(HEAP_1, &SampleTypes::default(), &limits).unwrap();
            pprof::parse(HEAP_2, &SampleTypes::default(), &limits).unwrap()
        })
    });
    group.finish();

    let mut group = c.benchmark_group("convert");
    group.throughput(Throughput::Elements(1));
    group.bench_function("cpu", |b| {
        b.iter(|| {
            let mut deltas = Deltas::new();
            convert(CPU, false, "", cpu, span(), &mut deltas, &limits).unwrap()
        })
    });
    group.throughput(Throughput::Elements(2));
    group.bench_function("heap_pair", |b| {
        b.iter(|| {
            let mut deltas = Deltas::new();
            convert(HEAP_1, false, "", mem, span(), &mut deltas, &limits).unwrap();
            let second = convert(HEAP_2, false, "", mem, span(), &mut deltas, &limits).unwrap();
            assert!(!second.profiles.is_empty());
            second
        })
    });
    group.finish();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let addr = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new()
            .route("/1", get(|| async { HEAP_1 }))
            .route("/2", get(|| async { HEAP_2 }));
        tokio::spawn(async move { axum::serve(listener, router).await });
        addr
    });
    let online = targets(&addr.to_string());
    let mem = online[1].clone();
    let fetcher = Fetcher::new(&ClientSettings {
        basic_auth: &None,
        authorization: &None,
        bearer_token: &None,
        bearer_token_file: &None,
        tls: &Default::default(),
        follow_redirects: true,
        body_limit: 16 << 20,
    })
    .unwrap();
    let urls = [
        reqwest::Url::parse(&format!("http://{addr}/1")).unwrap(),
        reqwest::Url::parse(&format!("http://{addr}/2")).unwrap(),
    ];
    let mut group = c.benchmark_group("fetch_convert");
    group.throughput(Throughput::Elements(2));
    group.bench_function("heap_pair", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let mut deltas = Deltas::new();
                for url in &urls {
                    let body = fetcher
                        .get(url, "*/*", Duration::from_secs(5))
                        .await
                        .unwrap();
                    convert(
                        &body.bytes,
                        body.gzip,
                        "",
                        &mem,
                        span(),
                        &mut deltas,
                        &limits,
                    )
                    .unwrap();
                }
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
