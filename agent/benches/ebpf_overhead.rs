//! What the eBPF sampler costs, measured against baselines in the same run (BENCHMARKS.md).
//!
//! `slowdown`: a CPU-bound workload (built here with gcc, frame pointers on) runs a fixed amount
//! of work with no profiler, with the release `smolder-agent` daemon sampling at 99 Hz, and
//! under `perf record -F 99 -a -g`, interleaved round by round. The workload's own CPU time
//! (user + system, from `wait4`) is the measure: interrupt and BPF time are charged to the task
//! they interrupt, and CPU time is less disturbed than wall time by other load on the machine.
//! The agent starts afresh each round and the workload waits for its first drain (which
//! symbolizes every binary on the host once), so rounds measure the steady state. With
//! `kernel.bpf_stats_enabled`, the run time per invocation of the `on_sample` program is read
//! from the kernel in the same rounds.
//!
//! `footprint`: the daemon runs with 200 processes (ten distinct binaries, each process waking
//! every 100 ms for a short burst); the agent's CPU time over a minute and its RSS are read from
//! `/proc`, next to the CPU time of the 200 processes themselves.
//!
//! ```sh
//! cargo bench -p smolder-agent --bench ebpf_overhead -- slowdown footprint
//! ```
//! `SMOLDER_BENCH_ROUNDS` (default 15) sets the slowdown rounds, `SMOLDER_BENCH_SECONDS`
//! (default 60) the footprint's measuring time. Needs root (or the agent's capabilities), gcc
//! and perf.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use smolder_test_support::net::{LOOPBACK_ANY_PORT, silent_udp};
use smolder_test_support::process::{Process, daemon};
use smolder_test_support::prometheus::Metrics;

const AGENT: &str = env!("CARGO_BIN_EXE_smolder-agent");

const WORKLOAD: &str = r#"
#include <stdlib.h>
volatile unsigned long sink;
__attribute__((noinline)) void leaf(unsigned long n) { for (unsigned long i = 0; i < n; i++) sink += i; }
__attribute__((noinline)) void middle(unsigned long n) { leaf(n); leaf(n / 2); }
int main(int argc, char **argv) {
    unsigned long rounds = strtoul(argv[1], 0, 10);
    for (unsigned long r = 0; r < rounds; r++) middle(1000000UL);
    return 0;
}
"#;

/// Sleeps most of the time; every 100 ms spins briefly a few calls deep.
const IDLE: &str = r#"
#include <time.h>
volatile unsigned long sink;
__attribute__((noinline)) void burst(void) { for (unsigned long i = 0; i < 100000UL; i++) sink += i; }
__attribute__((noinline)) void tick(void) { burst(); }
int main(void) {
    struct timespec pause = { 0, 100 * 1000 * 1000 };
    for (;;) { tick(); nanosleep(&pause, 0); }
}
"#;

fn build(dir: &Path, name: &str, source: &str) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).expect("writing the workload");
    let exe = dir.join(name);
    let ok = Command::new("gcc")
        .args(["-O0", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&c)
        .status()
        .expect("gcc runs")
        .success();
    assert!(ok, "gcc failed");
    exe
}

fn bench_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("smolder-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating the bench directory");
    dir
}

/// Starts the release agent daemon on port 0, its state in `dir` and its batches shipped to a
/// socket that never answers; returns it and its HTTP address.
fn start_agent(dir: &Path) -> (Process, SocketAddr) {
    let config = dir.join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "http:\n  listen: {LOOPBACK_ANY_PORT}\nship:\n  aggregator: {}\n",
            silent_udp()
        ),
    )
    .unwrap();
    let mut command = daemon(Path::new(AGENT), "warn");
    command
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.join("agent-data"));
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

fn stop(mut child: Child, sig: i32) {
    signal(&child, sig);
    let _ = child.wait();
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
    let pid = i32::try_from(child.id()).expect("a pid fits i32");
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child with valid pointers to locals.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid, "wait4 failed");
    let wall = started.elapsed().as_secs_f64();
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(usage.ru_utime) + secs(usage.ru_stime), wall)
}

/// (run time, run count) of the loaded programs called `on_sample`.
fn on_sample_stats() -> (Duration, u64) {
    let mut total = (Duration::ZERO, 0);
    for info in aya::programs::loaded_programs().flatten() {
        if info.name_as_str() == Some("on_sample") {
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

fn slowdown() {
    let rounds: usize = std::env::var("SMOLDER_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    let dir = bench_dir();
    let exe = build(&dir, "smolder-bench-cpu", WORKLOAD);
    let stats = "/proc/sys/kernel/bpf_stats_enabled";
    let stats_before = std::fs::read_to_string(stats).unwrap_or_else(|_| "0".into());
    std::fs::write(stats, "1").expect("enabling kernel.bpf_stats_enabled (needs root)");
    // Calibrate to about 1.5 s of CPU: short rounds, many of them, for a steadier median.
    let (cpu, _) = run_workload(&exe, 100);
    let work = ((1.5 / cpu) * 100.0).max(100.0) as u64;
    eprintln!("workload: {work} rounds of middle(1e6) (calibrated: 100 rounds = {cpu:.3} s)");

    let mut none = Vec::new();
    let mut agent = Vec::new();
    let mut perf = Vec::new();
    let mut agent_ratio = Vec::new();
    let mut perf_ratio = Vec::new();
    let mut bpf = (Duration::ZERO, 0u64);
    for round in 0..rounds {
        let base = run_workload(&exe, work);

        // Steady state: after the first drain, which symbolizes every binary on the host once.
        let (daemon, addr) = start_agent(&dir);
        let warm = Instant::now();
        while scrape(addr).value("smolder_agent_ebpf_drains_total", &[]) < 1.0
            && warm.elapsed() < Duration::from_secs(30)
        {
            sleep(Duration::from_millis(200));
        }
        let before = on_sample_stats();
        let sampled = run_workload(&exe, work);
        let after = on_sample_stats();
        bpf.0 += after.0.saturating_sub(before.0);
        bpf.1 += after.1.saturating_sub(before.1);
        stop_agent(daemon);

        let recorder = Command::new("perf")
            .args(["record", "-F", "99", "-a", "-g", "-q", "-o"])
            .arg(dir.join("perf.data"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("perf starts");
        sleep(Duration::from_secs(3));
        let perfed = run_workload(&exe, work);
        stop(recorder, libc::SIGINT);

        eprintln!(
            "round {round}: cpu none {:.3} s, agent {:.3} s, perf {:.3} s; wall {:.3} / {:.3} / {:.3} s",
            base.0, sampled.0, perfed.0, base.1, sampled.1, perfed.1
        );
        agent_ratio.push(sampled.0 / base.0);
        perf_ratio.push(perfed.0 / base.0);
        none.push(base.0);
        agent.push(sampled.0);
        perf.push(perfed.0);
    }
    std::fs::write(stats, stats_before.trim()).ok();
    let range = |v: &[f64]| {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(0.0, f64::max);
        (min, max)
    };
    let mean_err = |v: &[f64]| {
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
        (mean, (var / n).sqrt())
    };
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
    if bpf.1 > 0 {
        println!(
            "  on_sample: {} invocations, {:.0} ns per invocation",
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

/// The agent's `/metrics`, over plain HTTP/1.0.
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

fn footprint() {
    let seconds: u64 = std::env::var("SMOLDER_BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let dir = bench_dir();
    let binaries: Vec<PathBuf> = (0..10)
        .map(|i| build(&dir, &format!("smolder-idle-{i}"), IDLE))
        .collect();
    let mut processes: Vec<Child> = (0..200)
        .map(|i| {
            Command::new(&binaries[i % binaries.len()])
                .spawn()
                .expect("a workload process starts")
        })
        .collect();
    let (daemon, addr) = start_agent(&dir);
    let pid = daemon.id();
    // Two windows to learn every process and parse every binary once.
    sleep(Duration::from_secs(25));
    let agent_before = cpu_seconds(pid);
    let load_before: f64 = processes.iter().map(|p| cpu_seconds(p.id())).sum();
    let started = Instant::now();
    sleep(Duration::from_secs(seconds));
    let elapsed = started.elapsed().as_secs_f64();
    let agent_cpu = cpu_seconds(pid) - agent_before;
    let load_cpu: f64 = processes.iter().map(|p| cpu_seconds(p.id())).sum::<f64>() - load_before;
    let rss = status_kib(pid, "VmRSS:");
    let hwm = status_kib(pid, "VmHWM:");
    let anon = status_kib(pid, "RssAnon:");
    let file = status_kib(pid, "RssFile:");
    let metrics = scrape(addr);
    stop_agent(daemon);
    for process in &mut processes {
        let _ = process.kill();
        let _ = process.wait();
    }
    println!("footprint (200 processes, 10 binaries, {elapsed:.0} s after a 25 s warm-up)");
    println!(
        "  agent CPU {:.3} s = {:.2} % of one core; the 200 processes: {:.2} % of one core (agent/processes {:.3})",
        agent_cpu,
        100.0 * agent_cpu / elapsed,
        100.0 * load_cpu / elapsed,
        agent_cpu / load_cpu.max(f64::EPSILON)
    );
    println!(
        "  agent RSS {:.1} MiB (peak {:.1} MiB): anonymous {:.1} MiB, file-backed {:.1} MiB (mapped binaries, shared with the page cache)",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        anon as f64 / 1024.0,
        file as f64 / 1024.0
    );
    println!(
        "  samples {:.0}, drains {:.0}, processes tracked {:.0}, open files {:.0}, cached frames {:.0}, truncated stacks {:.0}",
        metrics.value("smolder_agent_ebpf_samples_total", &[]),
        metrics.value("smolder_agent_ebpf_drains_total", &[]),
        metrics.value("smolder_agent_ebpf_processes", &[]),
        metrics.value("smolder_agent_symbolize_open_files", &[]),
        metrics.value("smolder_agent_symbolize_cached_frames", &[]),
        metrics.value("smolder_agent_symbolize_truncated_stacks_total", &[]),
    );
    std::fs::remove_dir_all(&dir).ok();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let wants = |name: &str| {
        let named: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
        named.is_empty() || named.iter().any(|a| *a == name)
    };
    if wants("slowdown") {
        slowdown();
    }
    if wants("footprint") {
        footprint();
    }
}
