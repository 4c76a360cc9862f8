//! What the eBPF source costs, measured against baselines in the same run (BENCHMARKS.md).
//!
//! `bpf`: the BPF run time of the unwinder per sample, by stack depth, from the kernel's own
//! accounting (`kernel.bpf_stats_enabled`: run time and run count of the program). The walk
//! runs in `on_uprobe` at `burn` of `agent-ebpf/tests/data/victim.c` (`gcc -O2
//! -fomit-frame-pointer`), so every sample is the victim's and its depth is exact: recursion 5
//! gives ~19 frames, recursion 112 ~126, and the "flat" victim's chain of 112 distinct functions
//! as many frames with no return address repeated within a stack. The victim's stack is the same
//! at every sample, so every scenario measures the walk with its row cache warm (a cold frame
//! costs more: BENCHMARKS.md). The same-run baseline is the same probe without tables
//! (frame-pointer fallback, which stops after a frame or two): the fixed cost of a sample (the
//! probe's context, header, ring-buffer output). `on_cpu` adds only `bpf_get_stack` and the
//! register fetch to the same walk.
//!
//! `slowdown`: a CPU-bound workload built with `gcc -O2` and no frame pointers (recursion, then
//! libc's qsort with a comparator that does the work, ~20 frames deep) runs a fixed amount of
//! work with no profiler, with the release `smolder-agent` daemon sampling at 99 Hz (whole
//! stacks through its unwind tables), and under `perf record -F 99 -a --call-graph dwarf`,
//! interleaved round by round. Two measures: the workload's own CPU time (user + system, from
//! `wait4`: interrupt and BPF time are charged to the task they interrupt, and CPU time is less
//! disturbed than wall time by other load on the machine), and that plus the profiler's own CPU
//! time over the same work (the agent's from just before the workload starts until its next
//! drain after it ends, which symbolizes the samples; perf's from just before the workload
//! starts until it exits after the workload ends, which writes and post-processes them), so
//! that a profiler that moves its cost into a process of its own is charged for it. Each round
//! starts the agent afresh and waits for its first drain and for the tables of the host's
//! processes (`load-at-start`) to be in. With `kernel.bpf_stats_enabled`, the
//! run time per invocation of `on_cpu` is read from the kernel over the agent's rounds.
//!
//! `footprint`: the daemon profiles 200 processes of 30 distinct executables (gcc -O2, no frame
//! pointers; each wakes every 100 ms and spins briefly a few calls deep through libc); a keep
//! rule limits it to them, so that other load on the host does not count. After a warm-up of
//! two windows, the agent's CPU time over a minute, its RSS (anonymous and file-backed apart)
//! and its BPF map memory (the `memlock` of every map it holds, from `/proc/PID/fdinfo`, and of
//! the unwind tables, which only the kernel's outer map holds, from the agent's own gauge, read
//! from their `fdinfo` when created) are reported on their own.
//!
//! `startup`: 300 processes, each of its own executable (the footprint's program: a burst every
//! 100 ms); the agent starts with an empty data directory, then again with the one the first run filled (a
//! restart). The processes run before the agent starts, so `ebpf.unwind.load-at-start` loads
//! them right away. One second after the agent starts, while it preloads them, 5 new processes
//! of 5 new executables start (a burst every 10 ms): their tables load at their first sample,
//! ahead of the preloading. Reported: second by second (1 s windows), the share of their samples
//! whose walk was complete; the time until every one of them has its tables loaded; and the time
//! each one's load took (`smolder_agent_ebpf_unwind_process_ready_seconds`), from the agent's
//! start for those preloaded (`trigger="start"`) and from its first sample for the others
//! (`trigger="sample"`: the new processes, and any of the 300 sampled before its turn).
//!
//! ```sh
//! cargo bench -p smolder-agent --bench ebpf_overhead -- bpf slowdown footprint startup
//! ```
//! `SMOLDER_BENCH_ROUNDS` (default 15) sets the slowdown rounds, `SMOLDER_BENCH_SECONDS`
//! (default 60) the footprint's measuring time, `SMOLDER_BENCH_BPF_SECONDS` (default 3) each
//! BPF scenario's. Needs root (or the agent's capabilities), gcc and perf.

#[path = "../../agent-ebpf/tests/agent_ebpf/util.rs"]
#[allow(
    dead_code,
    reason = "the unwinder tests' fixtures, of which the bench uses a part"
)]
mod victim;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use aya::EbpfLoader;
use aya::maps::RingBuf;
use aya::programs::UProbe;
use aya::programs::uprobe::UProbeScope;
use aya::sys::{Stats, enable_stats};
use smolder_agent_ebpf::unwind::{MAP_SAMPLES, Status, parse_sample};
use smolder_agent_ebpf::{OBJECT, PROGRAM_UPROBE};

use smolder_test_support::net::{LOOPBACK_ANY_PORT, silent_udp};
use smolder_test_support::process::{Process, daemon};
use smolder_test_support::prometheus::Metrics;

const AGENT: &str = env!("CARGO_BIN_EXE_smolder-agent");

/// Recursion 8 deep, then `rounds` sorts through libc's qsort; the comparator does the work.
const WORKLOAD: &str = r#"
#include <stdint.h>
#include <stdlib.h>
volatile uint64_t sink;
static unsigned long rounds;
__attribute__((noipa)) uint64_t burn(uint64_t x) {
    for (int i = 0; i < 100; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    sink = x;
    return x;
}
__attribute__((noipa)) int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    burn(x ^ y);
    return (x > y) - (x < y);
}
__attribute__((noipa)) void sort_it(void) {
    uint64_t values[256];
    for (int i = 0; i < 256; i++) values[i] = (uint64_t)(i * 7919 % 256);
    qsort(values, 256, sizeof(values[0]), cmp);
    sink += values[0];
}
__attribute__((noipa)) uint64_t recurse(int d) {
    if (d == 0) {
        for (unsigned long r = 0; r < rounds; r++) sort_it();
        return sink;
    }
    uint64_t r = recurse(d - 1);
    sink = r;
    return r + d;
}
int main(int argc, char **argv) {
    rounds = strtoul(argv[1], 0, 10);
    return (int)(recurse(8) & 1);
}
"#;

/// Sleeps most of the time; every `PAUSE_MS` (100 unless defined) sorts a little through libc.
/// `VARIANT` makes each build a distinct executable (its own build id).
const IDLE: &str = r#"
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
volatile uint64_t sink;
__attribute__((noipa)) int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b, z = x;
    for (int i = 0; i < 20; i++) z = z * 6364136223846793005ULL + VARIANT;
    sink = z;
    return (x > y) - (x < y);
}
__attribute__((noipa)) void burst(void) {
    uint64_t values[512];
    for (int i = 0; i < 512; i++) values[i] = (uint64_t)(i * 7919 % 512);
    qsort(values, 512, sizeof(values[0]), cmp);
}
__attribute__((noipa)) void tick(void) { burst(); sink += VARIANT; }
#ifndef PAUSE_MS
#define PAUSE_MS 100
#endif
int main(void) {
    struct timespec pause = { 0, PAUSE_MS * 1000 * 1000 };
    for (;;) { tick(); nanosleep(&pause, 0); }
}
"#;

fn build(dir: &Path, name: &str, source: &str, variant: usize) -> PathBuf {
    build_with(dir, name, source, variant, &[])
}

fn build_with(dir: &Path, name: &str, source: &str, variant: usize, defines: &[&str]) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).expect("writing the workload");
    let exe = dir.join(name);
    let ok = Command::new("gcc")
        .args([
            "-O2",
            "-fomit-frame-pointer",
            &format!("-DVARIANT={variant}ULL"),
        ])
        .args(defines)
        .arg("-o")
        .arg(&exe)
        .arg(&c)
        .status()
        .expect("gcc runs")
        .success();
    assert!(ok, "gcc failed");
    exe
}

fn bench_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("smolder-bench-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating the bench directory");
    dir
}

/// Starts the release agent daemon with `extra` config on port 0, its state in `data` and its
/// batches shipped to a socket that never answers (the spool keeps the windows); returns it and
/// its HTTP address.
fn start_agent(dir: &Path, data: &Path, extra: &str) -> (Process, SocketAddr) {
    let config = dir.join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "http:\n  listen: {LOOPBACK_ANY_PORT}\nship:\n  aggregator: {}\n{extra}",
            silent_udp()
        ),
    )
    .unwrap();
    let mut command = daemon(Path::new(AGENT), "warn");
    command
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(data);
    let process = Process::spawn(command);
    let addr = process.listening("http");
    (process, addr)
}

/// Stops the agent as systemd would.
fn stop_agent(mut agent: Process) {
    agent.terminate();
    agent.wait();
}

fn signal(child: &Child, signal: i32) {
    let pid = i32::try_from(child.id()).expect("a pid fits i32");
    // SAFETY: kill(2) on a child we started and have not reaped; no memory is involved.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Runs the workload and returns (CPU seconds, wall seconds).
#[expect(
    clippy::zombie_processes,
    reason = "the child is reaped by wait4, which also returns its resource usage"
)]
fn run_workload(exe: &Path, rounds: u64) -> (f64, f64) {
    let started = Instant::now();
    // At the highest priority, so that other load on the machine preempts it less.
    let child = Command::new("nice")
        .args(["-n", "-19"])
        .arg(exe)
        .arg(rounds.to_string())
        .spawn()
        .expect("the workload starts");
    let cpu = reap(&child);
    (cpu, started.elapsed().as_secs_f64())
}

/// Waits for `child` to exit; returns the CPU time (user + system) it and its threads used.
fn reap(child: &Child) -> f64 {
    let pid = i32::try_from(child.id()).expect("a pid fits i32");
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child with valid pointers to locals.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid, "wait4 failed");
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// (run time, run count) of the loaded programs called `on_cpu`.
fn on_cpu_stats() -> (Duration, u64) {
    let mut total = (Duration::ZERO, 0);
    for info in aya::programs::loaded_programs().flatten() {
        if info.name_as_str() == Some("on_cpu") {
            total.0 += info.run_time();
            total.1 += info.run_count();
        }
    }
    total
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn mean_err(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, (var / n).sqrt())
}

fn range(v: &[f64]) -> (f64, f64) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    (min, max)
}

/// One BPF scenario: the victim recursing `depth` deep (or, in `mode` "flat", through its chain of
/// 112 distinct functions), its tables loaded or not, walked at each call of `burn` for
/// `seconds`; returns (ns per sample, frames per sample, samples, share complete).
fn bpf_scenario(depth: u32, mode: &str, tables: bool, seconds: u64) -> (f64, f64, u64, f64) {
    let mut ebpf = EbpfLoader::new()
        // The off-CPU task storage, which aya creates but has no type for.
        .allow_unsupported_maps()
        .load(OBJECT)
        .expect("load the unwinder (as root)");
    let mut victim = victim::Victim::start(depth, mode);
    victim::Process::load(victim.pid, tables.then_some(&mut ebpf));
    let program: &mut UProbe = ebpf
        .program_mut(PROGRAM_UPROBE)
        .expect("the uprobe program")
        .try_into()
        .expect("a uprobe");
    program.load().expect("the verifier accepts on_uprobe");
    let pid = NonZeroU32::new(victim.pid).expect("a pid");
    program
        .attach("burn", &victim.binary, UProbeScope::OneProcess(pid))
        .expect("attach at burn");
    victim.go();
    let _stats = enable_stats(Stats::RunTime).expect("enable BPF run-time stats");
    let before = program.info().expect("the program's info");
    let (mut samples, mut frames, mut complete) = (0u64, 0u64, 0u64);
    let mut ring = RingBuf::try_from(ebpf.map_mut(MAP_SAMPLES).expect("the samples ring"))
        .expect("a ring buffer");
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        while let Some(item) = ring.next() {
            let header = parse_sample(&item).expect("a whole sample").header;
            samples += 1;
            frames += u64::from(header.len);
            complete += u64::from(header.status == Status::Complete as u16);
        }
        sleep(Duration::from_millis(5));
    }
    drop(ring);
    let program: &mut UProbe = ebpf
        .program_mut(PROGRAM_UPROBE)
        .expect("the uprobe program")
        .try_into()
        .expect("a uprobe");
    let after = program.info().expect("the program's info");
    let runs = after.run_count() - before.run_count();
    let time = after.run_time() - before.run_time();
    drop(victim);
    (
        time.as_nanos() as f64 / runs.max(1) as f64,
        frames as f64 / samples.max(1) as f64,
        runs,
        complete as f64 / samples.max(1) as f64,
    )
}

fn bpf() {
    let seconds: u64 = std::env::var("SMOLDER_BENCH_BPF_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    println!("bpf (on_uprobe at burn, {seconds} s per scenario)");
    println!("  scenario                      ns/sample  frames/sample  runs      complete");
    for (name, depth, mode, tables) in [
        ("no tables (baseline)", 5, "plain", false),
        ("tables, recursion 5", 5, "plain", true),
        ("tables, recursion 112", 112, "plain", true),
        ("tables, 112 distinct calls", 0, "flat", true),
    ] {
        let (ns, frames, runs, complete) = bpf_scenario(depth, mode, tables, seconds);
        println!(
            "  {name:<29} {ns:>9.0}  {frames:>13.1}  {runs:>8}  {:>7.1}%",
            complete * 100.0
        );
    }
}

#[expect(
    clippy::zombie_processes,
    reason = "perf is reaped by wait4 (`reap`), which also returns its resource usage"
)]
fn slowdown() {
    let rounds: usize = std::env::var("SMOLDER_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    let dir = bench_dir("slowdown");
    let exe = build(&dir, "smolder-bench-cpu", WORKLOAD, 0);
    let stats = "/proc/sys/kernel/bpf_stats_enabled";
    let stats_before = std::fs::read_to_string(stats).unwrap_or_else(|_| "0".into());
    std::fs::write(stats, "1").expect("enabling kernel.bpf_stats_enabled (needs root)");
    // Calibrate to about 1.5 s of CPU: short rounds, many of them, for a steadier median.
    let (cpu, _) = run_workload(&exe, 200);
    let work = ((1.5 / cpu) * 200.0).max(200.0) as u64;
    eprintln!("workload: {work} sorts (calibrated: 200 sorts = {cpu:.3} s)");

    let (mut none, mut agent, mut perf) = (Vec::new(), Vec::new(), Vec::new());
    let (mut agent_ratio, mut perf_ratio) = (Vec::new(), Vec::new());
    // Workload and profiler together, over the workload alone without a profiler.
    let (mut agent_total, mut perf_total) = (Vec::new(), Vec::new());
    let (mut agent_own, mut perf_own) = (Vec::new(), Vec::new());
    let mut bpf = (Duration::ZERO, 0u64);
    let data = dir.join("data");
    let drains = |addr| scrape(addr).value("smolder_agent_ebpf_drains_total", &[]);
    for round in 0..rounds {
        let base = run_workload(&exe, work);

        // Steady state: after the first drain, which symbolizes every binary on the host once,
        // and once the tables of every process on the host are in (`load-at-start`).
        let (daemon, addr) = start_agent(&dir, &data, "");
        let warm = Instant::now();
        while drains(addr) < 1.0 && warm.elapsed() < Duration::from_secs(30) {
            sleep(Duration::from_millis(200));
        }
        let loaded = |addr| {
            let metrics = scrape(addr);
            (
                metrics.value("smolder_agent_ebpf_unwind_tables_loaded_total", &[]),
                metrics.value("smolder_agent_ebpf_unwind_tables_queued", &[]),
            )
        };
        let mut last = loaded(addr);
        while warm.elapsed() < Duration::from_secs(90) {
            sleep(Duration::from_secs(1));
            let now = loaded(addr);
            if now == last && now.1 == 0.0 {
                break;
            }
            last = now;
        }
        let before = on_cpu_stats();
        let agent_before = cpu_seconds(daemon.id());
        let sampled = run_workload(&exe, work);
        let after = on_cpu_stats();
        // Its samples of the workload are symbolized at the next drain (window.length, 10 s).
        let drained = drains(addr);
        let wait = Instant::now();
        while drains(addr) <= drained && wait.elapsed() < Duration::from_secs(30) {
            sleep(Duration::from_millis(100));
        }
        let agent_cpu = cpu_seconds(daemon.id()) - agent_before;
        bpf.0 += after.0.saturating_sub(before.0);
        bpf.1 += after.1.saturating_sub(before.1);
        stop_agent(daemon);

        let recorder = Command::new("perf")
            .args([
                "record",
                "-F",
                "99",
                "-a",
                "--call-graph",
                "dwarf",
                "-q",
                "-o",
            ])
            .arg(dir.join("perf.data"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("perf starts");
        sleep(Duration::from_secs(3));
        let perf_before = cpu_seconds(recorder.id());
        let perfed = run_workload(&exe, work);
        // perf writes the samples as it goes and post-processes them (build ids) as it exits.
        signal(&recorder, libc::SIGINT);
        let perf_cpu = reap(&recorder) - perf_before;

        eprintln!(
            "round {round}: cpu none {:.3} s, agent {:.3} s (+ {agent_cpu:.3} s its own), perf {:.3} s (+ {perf_cpu:.3} s its own); wall {:.3} / {:.3} / {:.3} s",
            base.0, sampled.0, perfed.0, base.1, sampled.1, perfed.1
        );
        agent_ratio.push(sampled.0 / base.0);
        perf_ratio.push(perfed.0 / base.0);
        agent_total.push((sampled.0 + agent_cpu) / base.0);
        perf_total.push((perfed.0 + perf_cpu) / base.0);
        agent_own.push(agent_cpu);
        perf_own.push(perf_cpu);
        none.push(base.0);
        agent.push(sampled.0);
        perf.push(perfed.0);
    }
    std::fs::write(stats, stats_before.trim()).ok();
    let (amean, aerr) = mean_err(&agent_ratio);
    let (pmean, perr) = mean_err(&perf_ratio);
    let (amin, amax) = range(&agent_ratio);
    let (pmin, pmax) = range(&perf_ratio);
    println!("slowdown ({rounds} rounds, workload CPU seconds, median)");
    println!("  none   {:.3}", median(&mut none));
    println!(
        "  agent  {:.3}   ratio to none: median {:.4}, mean {amean:.4} ± {aerr:.4}, range {amin:.4}..{amax:.4}",
        median(&mut agent),
        median(&mut agent_ratio)
    );
    println!(
        "  perf   {:.3}   ratio to none: median {:.4}, mean {pmean:.4} ± {perr:.4}, range {pmin:.4}..{pmax:.4}",
        median(&mut perf),
        median(&mut perf_ratio)
    );
    println!("  with the profiler's own CPU (workload + profiler, over none)");
    for (name, totals, own) in [
        ("agent", &mut agent_total, &mut agent_own),
        ("perf ", &mut perf_total, &mut perf_own),
    ] {
        let (mean, err) = mean_err(totals);
        let (min, max) = range(totals);
        println!(
            "  {name}  its own {:.3} s   ratio to none: median {:.4}, mean {mean:.4} ± {err:.4}, range {min:.4}..{max:.4}",
            median(own),
            median(totals)
        );
    }
    if bpf.1 > 0 {
        println!(
            "  on_cpu: {} invocations, {:.0} ns per invocation",
            bpf.1,
            bpf.0.as_nanos() as f64 / bpf.1 as f64
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised comm; utime and stime are the 14th and 15th overall.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The `memlock` of every BPF map `pid` holds a descriptor of, by map type.
fn map_memory(pid: u32) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = Vec::new();
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return out;
    };
    for entry in entries.flatten() {
        let info = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
        };
        let (Some(kind), Some(memlock)) = (field("map_type:"), field("memlock:")) else {
            continue;
        };
        let bytes: u64 = memlock.parse().unwrap_or(0);
        match out.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, total)) => *total += bytes,
            None => out.push((kind, bytes)),
        }
    }
    out.sort_by_key(|(_, bytes)| std::cmp::Reverse(*bytes));
    out
}

fn scrape(addr: SocketAddr) -> Metrics {
    let mut stream = TcpStream::connect(addr).expect("the agent's port answers");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("sending the request");
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .expect("reading the answer");
    let (_, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    Metrics::parse(body).expect("Prometheus text")
}

/// The keep rule that limits the agent to the bench's processes.
fn keep(prefix: &str) -> String {
    format!(
        "ebpf:\n  relabel-configs:\n    - {{source_labels: [__meta_process_exe], regex: '.*/{prefix}.*', action: keep}}\n"
    )
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

fn footprint() {
    let seconds: u64 = std::env::var("SMOLDER_BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let dir = bench_dir("footprint");
    let binaries: Vec<PathBuf> = (0..30)
        .map(|i| build(&dir, &format!("smolder-idle-{i}"), IDLE, i + 1))
        .collect();
    let mut processes: Vec<Child> = (0..200)
        .map(|i| {
            Command::new(&binaries[i % binaries.len()])
                .spawn()
                .expect("a workload process starts")
        })
        .collect();
    let (daemon, addr) = start_agent(&dir, &dir.join("data"), &keep("smolder-idle-"));
    let pid = daemon.id();
    // Two windows to learn every process and load and name every binary once.
    sleep(Duration::from_secs(25));
    let agent_before = cpu_seconds(pid);
    let load_before: f64 = processes.iter().map(|p| cpu_seconds(p.id())).sum();
    let started = Instant::now();
    sleep(Duration::from_secs(seconds));
    let elapsed = started.elapsed().as_secs_f64();
    let agent_cpu = cpu_seconds(pid) - agent_before;
    let load_cpu: f64 = processes.iter().map(|p| cpu_seconds(p.id())).sum::<f64>() - load_before;
    let (rss, hwm) = (status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"));
    let (anon, file) = (status_kib(pid, "RssAnon:"), status_kib(pid, "RssFile:"));
    let maps = map_memory(pid);
    let metrics = scrape(addr);
    stop_agent(daemon);
    for process in &mut processes {
        let _ = process.kill();
        let _ = process.wait();
    }
    let own: u64 = maps.iter().map(|(_, b)| b).sum();
    let tables = metrics.value("smolder_agent_ebpf_unwind_table_bytes", &[]);
    println!("footprint (200 processes, 30 executables, {elapsed:.0} s after a 25 s warm-up)");
    println!(
        "  agent CPU {:.3} s = {:.2} % of one core; the 200 processes: {:.2} % of one core (agent/processes {:.3})",
        agent_cpu,
        100.0 * agent_cpu / elapsed,
        100.0 * load_cpu / elapsed,
        agent_cpu / load_cpu.max(f64::EPSILON)
    );
    println!(
        "  agent RSS {:.1} MiB (peak {:.1} MiB): anonymous {:.1} MiB, file-backed {:.1} MiB",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        anon as f64 / 1024.0,
        file as f64 / 1024.0
    );
    println!(
        "  BPF maps {:.2} MiB: the agent's own {:.2} MiB ({}), unwind tables {:.2} MiB ({:.0} tables)",
        mib(own as f64 + tables),
        mib(own as f64),
        maps.iter()
            .map(|(kind, bytes)| format!("type {kind}: {:.2}", mib(*bytes as f64)))
            .collect::<Vec<_>>()
            .join(", "),
        mib(tables),
        metrics.value("smolder_agent_ebpf_unwind_tables", &[]),
    );
    println!(
        "  samples {:.0} on the host, {:.0} of the 200 processes ({:.0} complete), drains {:.0}, processes tracked {:.0}, open files {:.0}, cached frames {:.0}, LPM entries {:.0}",
        metrics.value("smolder_agent_ebpf_samples_total", &[]),
        metrics.value("smolder_agent_ebpf_unwind_samples_total", &[]),
        metrics.value(
            "smolder_agent_ebpf_unwind_samples_total",
            &[("outcome", "complete")]
        ),
        metrics.value("smolder_agent_ebpf_drains_total", &[]),
        metrics.value("smolder_agent_ebpf_processes", &[]),
        metrics.value("smolder_agent_symbolize_open_files", &[]),
        metrics.value("smolder_agent_symbolize_cached_frames", &[]),
        metrics.value("smolder_agent_ebpf_unwind_mappings", &[]),
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// From `data`'s state: starts the agent (1 s windows), starts `late` (new processes) a second
/// later, and follows the share of the profiled processes' samples whose walk is complete,
/// window by window, until `count` processes (`late` included) have their tables loaded.
/// Returns (seconds until then, the per-window timeline, the agent's
/// `_process_ready_seconds` histograms by trigger).
fn until_ready(
    dir: &Path,
    data: &Path,
    count: usize,
    late: &[PathBuf],
) -> (f64, Vec<String>, Vec<String>) {
    let started = Instant::now();
    let config = format!("window:\n  length: 1s\n{}", keep("smolder-busy-"));
    let (daemon, addr) = start_agent(dir, data, &config);
    let ready = "smolder_agent_ebpf_unwind_process_ready_seconds_count";
    let (mut metrics, mut timeline) = (Metrics::default(), Vec::new());
    let (mut last_total, mut last_complete) = (0.0, 0.0);
    let mut next = Duration::from_secs(1);
    let mut all_loaded: Option<f64> = None;
    let mut started_late: Vec<Child> = Vec::new();
    // Until every process is loaded, and five windows more.
    while started.elapsed() < Duration::from_secs(120)
        && all_loaded.is_none_or(|at| started.elapsed().as_secs_f64() < at + 5.0)
    {
        if started_late.is_empty() && started.elapsed() >= Duration::from_secs(1) {
            started_late = late
                .iter()
                .map(|exe| Command::new(exe).spawn().expect("a process starts"))
                .collect();
        }
        metrics = scrape(addr);
        // The outcomes appear at their first sample.
        let samples = |labels: &[(&str, &str)]| {
            metrics
                .find("smolder_agent_ebpf_unwind_samples_total", labels)
                .unwrap_or(0.0)
        };
        if started.elapsed() >= next {
            next += Duration::from_secs(1);
            let (total, complete) = (samples(&[]), samples(&[("outcome", "complete")]));
            let (window, whole) = (total - last_total, complete - last_complete);
            (last_total, last_complete) = (total, complete);
            timeline.push(format!(
                "{:.0}s: {:.0} loaded, {:.0}% of {window:.0} whole",
                started.elapsed().as_secs_f64(),
                metrics.value(ready, &[]),
                100.0 * whole / window.max(1.0)
            ));
        }
        if all_loaded.is_none() && metrics.value(ready, &[]) >= count as f64 {
            all_loaded = Some(started.elapsed().as_secs_f64());
        }
        sleep(Duration::from_millis(100));
    }
    let took = all_loaded.unwrap_or(f64::INFINITY);
    stop_agent(daemon);
    for mut process in started_late {
        let _ = process.kill();
        let _ = process.wait();
    }
    let name = "smolder_agent_ebpf_unwind_process_ready_seconds";
    let histograms = ["start", "sample"]
        .iter()
        .map(|trigger| {
            let mut buckets: Vec<String> = metrics
                .samples_of(&format!("{name}_bucket"))
                .filter(|bucket| bucket.labels.get("trigger").map(String::as_str) == Some(trigger))
                .map(|bucket| {
                    let le = bucket.labels.get("le").map_or("?", String::as_str);
                    format!("le {le}: {:.0}", bucket.value)
                })
                .collect();
            let labels = [("trigger", *trigger)];
            buckets.push(format!(
                "sum {:.2} s, count {:.0}",
                metrics.value(&format!("{name}_sum"), &labels),
                metrics.value(&format!("{name}_count"), &labels)
            ));
            format!("trigger=\"{trigger}\": {}", buckets.join(", "))
        })
        .collect();
    (took, timeline, histograms)
}

fn startup() {
    let dir = bench_dir("startup");
    let binaries: Vec<PathBuf> = (0..300)
        .map(|i| build(&dir, &format!("smolder-busy-{i}"), IDLE, i + 1))
        .collect();
    // Started while the agent preloads the 300: a burst every 10 ms, so sampled at once.
    let late: Vec<PathBuf> = (0..5)
        .map(|i| {
            build_with(
                &dir,
                &format!("smolder-busy-new-{i}"),
                IDLE,
                1000 + i,
                &["-DPAUSE_MS=10"],
            )
        })
        .collect();
    let mut processes: Vec<Child> = binaries
        .iter()
        .map(|exe| Command::new(exe).spawn().expect("a process starts"))
        .collect();
    let data = dir.join("data");
    let count = processes.len() + late.len();
    let runs = [
        (
            "cold data directory",
            until_ready(&dir, &data, count, &late),
        ),
        (
            "warm (a restart: tables from the disk cache)",
            until_ready(&dir, &data, count, &late),
        ),
    ];
    for process in &mut processes {
        let _ = process.kill();
        let _ = process.wait();
    }
    println!(
        "startup (300 processes of 300 executables, then 5 new ones 1 s after the agent's start)"
    );
    for (name, (took, timeline, histograms)) in runs {
        println!("  {name}: all 305 processes' tables loaded {took:.1} s after the agent started");
        println!("    per window: {}", timeline.join("; "));
        println!(
            "    tables loaded after the agent's start (preloaded) or a process's first sample:"
        );
        for histogram in histograms {
            println!("      {histogram}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let wants = |name: &str| {
        let named: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
        named.is_empty() || named.iter().any(|a| *a == name)
    };
    if wants("bpf") {
        bpf();
    }
    if wants("slowdown") {
        slowdown();
    }
    if wants("footprint") {
        footprint();
    }
    if wants("startup") {
        startup();
    }
}
